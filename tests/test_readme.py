"""The README's examples run as written, and print what their comments say."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def python_block_after(heading: str) -> str:
    start = README.index(heading)
    match = re.search(r"```python\n(.*?)```", README[start:], re.S)
    assert match is not None, heading
    return match.group(1)


def test_the_drop_in_example_runs() -> None:
    exec(python_block_after("## prefixcache.impl in place of vllm.core.block"), {})


def test_the_model_example_prints_what_its_comments_say() -> None:
    code = python_block_after("## Ask the model")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {})
    printed = out.getvalue().splitlines()
    expected = [line.split("# ", 1)[1].split(" (")[0].strip()
                for line in code.splitlines() if line.startswith("print(") and "# " in line]
    assert len(printed) >= len(expected)
    for line, want in zip(printed, expected):
        assert line.startswith(want), (line, want)
