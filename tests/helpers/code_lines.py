"""Lines of Python code, for the tests that keep a model small: no blank,
comment or docstring lines."""

from __future__ import annotations

import ast
import io
import tokenize
from typing import Optional, Tuple

_NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
             tokenize.DEDENT, tokenize.ENDMARKER}


def code_lines(source: str, span: Optional[Tuple[int, int]] = None) -> int:
    """The number of lines of ``source`` that hold code (not a docstring), only
    those within ``span`` (first, last line, 1-based) when given."""
    docs: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            docs.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    code = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in _NOT_CODE:
            code.update(range(tok.start[0], tok.end[0] + 1))
    lines = code - docs
    if span is not None:
        lines = {n for n in lines if span[0] <= n <= span[1]}
    return len(lines)
