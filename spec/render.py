"""SPEC.md's generated sections, rendered from spec/ itself.

SPEC.md holds the prose, written there once for an engineer who will not
read the code; :func:`render_spec` fills in the sections generated from the
spec's own objects -- the abstract state (:mod:`~prefixcache.spec.state`),
the invariants (:data:`~prefixcache.spec.invariants.INVARIANTS` and
``OWNERSHIP``), every operation's pre- and postcondition
(:mod:`~prefixcache.spec.contracts` docstrings), the error table
(:data:`~prefixcache.spec.error_table.ERROR_TABLE`), the semantic options
(:data:`~prefixcache.spec.semantics.OPTIONS`) and the life-cycle pictures
(:mod:`~prefixcache.spec.transitions`).  Each generated section sits
between ``<!-- generated: NAME -->`` and ``<!-- end generated -->``, so
:func:`stale_sections` can tell which ones no longer match spec/.

``python -m prefixcache.spec.render`` fills SPEC.md at the repository root
(or ``--output PATH``) in place; with ``--check`` it writes nothing and exits 1 when a
generated section of that file differs from what spec/ renders now.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from . import (
    contracts,
    error_table,
    invariants,
    semantics,
    state,
    transitions,
    v1_error_table,
    v1_invariants,
    v1_operations,
    v1_semantics,
    v1_state,
)
from . import operations as ops_table

BEGIN = "<!-- generated: {name} -->"
END = "<!-- end generated -->"
_SECTION = re.compile(
    r"<!-- generated: (?P<name>[a-z_-]+) -->\n(?P<body>.*?)<!-- end generated -->", re.DOTALL)

# ==========================================================================
# from docstrings to Markdown

_ROLE = re.compile(r":(?:class|func|data|mod|meth|attr|exc|obj):`(?P<tilde>~?)(?P<target>[^`]+)`")


def markdown(text: str) -> str:
    """Return a docstring as Markdown: indentation cleaned, ````code````
    as ```code```, Sphinx roles as their (short) target in backticks."""
    text = inspect.cleandoc(text)

    def role(m: re.Match[str]) -> str:
        target = m.group("target")
        return f"`{target.rsplit('.', 1)[-1] if m.group('tilde') else target}`"

    text = _ROLE.sub(role, text)
    return text.replace("``", "`")


def one_line(text: str) -> str:
    """Return ``text`` as Markdown on one line, fit for a table cell."""
    return " ".join(markdown(text).split()).replace("|", "\\|")


def _doc(obj: object) -> str:
    return markdown(inspect.getdoc(obj) or "")


_ASSIGNMENT = re.compile(r"^(?P<name>[A-Za-z_]\w*)\s*(?::[^=]*)?=")


def comment_docs(module: object) -> Dict[str, str]:
    """Return name -> documentation of the module-level names that a
    ``#:`` comment block documents (the Sphinx convention), in source order."""
    docs: Dict[str, str] = {}
    block: List[str] = []
    for line in inspect.getsource(module).splitlines():  # type: ignore[arg-type]
        if line.startswith("#:"):
            block.append(line[2:].strip())
            continue
        m = _ASSIGNMENT.match(line)
        if m is not None and block:
            docs[m.group("name")] = markdown(" ".join(block))
        block = []
    return docs


# ==========================================================================
# the generated sections


def _constants(module: object) -> List[str]:
    """The module-level names a ``#:`` comment documents, with their values."""
    return [f"- **`{name}`** = `{repr(getattr(module, name)).replace('typing.', '')}`: {doc}"
            for name, doc in comment_docs(module).items()]


def _fields(cls: type) -> List[str]:
    """A dataclass's heading, its docstring and the table of its fields."""
    return [f"### `{cls.__name__}`", "", _doc(cls), "", "| field | type |", "|---|---|",
            *(f"| `{f.name}` | `{one_line(str(f.type))}` |" for f in dataclasses.fields(cls))]


def _table(intro: Sequence[str], header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """The lines ``intro``, then a Markdown table of ``header`` and ``rows``."""
    out = [*intro, "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(out + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def render_state() -> str:
    """The abstract state: the module's account of content keys, then each
    dataclass of spec/state.py with its docstring and its fields."""
    out = [_doc(state), "", *_constants(state), ""]
    for cls in (state.AbstractState, state.BlockState, state.EvictorEntry):
        out += [*_fields(cls), ""]
    return "\n".join(out)


def render_invariants() -> str:
    """Every invariant, in registry order: its name, category and meaning;
    the ownership invariant last."""
    rows = [(i.name, i.meaning) for i in invariants.INVARIANTS]
    rows.append((invariants.OWNERSHIP.name, invariants.OWNERSHIP.meaning))
    return _table([_doc(invariants).split("\n\n")[0], ""], ("#", "invariant", "group", "meaning"),
                  [(str(k), f"`{name}`", invariants.group_of(name), one_line(meaning))
                   for k, (name, meaning) in enumerate(rows, 1)])


def _functions(prefix: str) -> Dict[str, Callable[..., object]]:
    """name without ``prefix`` -> function, for the contract functions of
    spec/contracts.py whose name starts with ``prefix``, in source order."""
    found = [(name[len(prefix):], fn) for name, fn in vars(contracts).items()
             if name.startswith(prefix) and inspect.isfunction(fn)]
    found.sort(key=lambda item: item[1].__code__.co_firstlineno)
    return dict(found)


def operations() -> List[str]:
    """Every operation, in the table's order (:data:`.operations.OPERATIONS`)."""
    return [op.name for op in ops_table.OPERATIONS]


def _signature(op: ops_table.Operation) -> str:
    """One line: the API's arguments with their kinds, the result and the
    allocators that have the operation."""
    args = ", ".join(f"`{a.name}` ({a.kind}" + (f", {'/'.join(a.allocators)} only"
                                                  if set(a.allocators) < set(op.allocators)
                                                  else "") + ")" for a in op.args)
    where = "" if op.allocators == error_table.ALL else f"; only {', '.join(op.allocators)}"
    what = "property" if op.attribute else f"method of the {op.owner}"
    return f"API: {what}, arguments {args or 'none'}; returns {op.result}{where}."


_STATE_PARAMETERS = frozenset({"s", "old", "new", "result", "src", "dst", "old_src", "new_src",
                               "old_dst", "new_dst"})


def _arguments(fn: Optional[Callable[..., object]]) -> List[str]:
    """The abstract arguments of a contract function: its parameters other
    than the states and the result."""
    if fn is None:
        return []
    return [p for p in inspect.signature(fn).parameters if p not in _STATE_PARAMETERS]


def _text(fn: Optional[Callable[..., object]]) -> str:
    return one_line(fn.__doc__ or "") if fn is not None else ""


def render_operations() -> str:
    """Every operation: its abstract arguments, precondition and
    postcondition in words (prefix-caching allocator, then the allocator
    without a cache where it differs), after the named steps they use."""
    pre, post = _functions("pre_"), _functions("post_")
    out = [_doc(contracts), "", "### The named steps", ""]
    steps = (contracts.next_id, contracts.in_use, contracts.is_mutable, contracts.take,
             contracts.release, contracts.share, contracts.promote, contracts.query,
             contracts.lookup, contracts.copy_on_write, contracts.demand, contracts.agrees)
    out += [f"- **`{step.__name__}`**: {one_line(step.__doc__ or '')}" for step in steps] + [""]
    listed = set()
    for op in operations():
        p, q = pre.get(op), post.get(op)
        np_, nq = pre.get("naive_" + op), post.get("naive_" + op)
        listed |= {"naive_" + op}
        args = _arguments(q) or _arguments(p) or _arguments(nq) or _arguments(np_)
        out += [f"### `{op}`", "", _signature(ops_table.operation(op)), ""]
        if args:
            out += ["Abstract arguments: " + ", ".join(f"`{a}`" for a in args) + ".", ""]
        if p is not None or q is not None:
            out.append("- **Precondition.** " + (_text(p) or "None: it always succeeds."))
        if q is not None:
            out.append("- **Postcondition.** " + _text(q))
        for fn in (np_, nq):
            if fn is not None:
                out.append("- **Naive allocator.** " + _text(fn))
        out.append("")
    shared = [fn for name, fn in {**pre, **post}.items()
              if name.startswith("naive_") and name not in listed]
    if shared:
        out += ["### The allocator without a cache, elsewhere", ""]
        out += [f"- {_text(fn)}" for fn in shared]
        out.append("")
    return "\n".join(out)


def render_errors() -> str:
    """The error table: one row per caller mistake, grouped by operation."""
    rows = error_table.ERROR_TABLE
    return _table([_doc(error_table), "", f"{len(rows)} rows.", ""],
                  ("operation", "mistake", "raises", "allocators", "tag"),
                  [(f"`{row.operation}`", one_line(row.mistake), f"`{row.exception.__name__}`",
                    ", ".join(row.applies_to), f"`{row.tag}`") for row in rows])


def _life(mermaid: str, states: Sequence[Tuple[str, str]],
          edges: Sequence[Tuple[str, str, str, str]]) -> str:
    """A life cycle: the Mermaid picture, the states (name, meaning), and
    every edge (from, to, operation, condition)."""
    return _table(["```mermaid", mermaid.rstrip("\n"), "```", ""], ("state", "meaning"),
                  [(name, one_line(meaning)) for name, meaning in states]) + _table(
        [""], ("from", "to", "operation", "when"),
        [(src, dst, f"`{op}`", one_line(condition)) for src, dst, op, condition in edges])


def render_id_life() -> str:
    """The life cycle of a physical id: the Mermaid picture, the states, and
    every edge of the table with its condition."""
    T = transitions
    return _life(T.mermaid(), [(life.value + (" (transient)" if life in T.TRANSIENT else ""),
                                T.DESCRIPTIONS[life]) for life in T.Life],
                 [(t.source.value, t.target.value, t.operation, t.condition)
                  for t in T.TRANSITIONS])


def render_block_life() -> str:
    """The life cycle of a Block object: the Mermaid picture, the states,
    and every edge of the table with its condition."""
    T = transitions

    def name(life: Optional[transitions.BlockLife]) -> str:
        return "(none)" if life is None else life.value

    return _life(T.block_mermaid(), [(life.value, T.BLOCK_DESCRIPTIONS[life])
                                     for life in T.BlockLife],
                 [(name(t.source), name(t.target), t.operation, t.condition)
                  for t in T.BLOCK_TRANSITIONS])


def render_options() -> str:
    """The table of semantic options (both rules and why ours) and the presets."""
    rows = _table([], ("option", "what it decides", "`prefixcache` (ours)", "`vllm-0.8.5`",
                       "why ours"),
                  [(f"`{o.name}`", one_line(o.decides), one_line(o.prefixcache),
                    one_line(o.vllm), one_line(o.why)) for o in semantics.OPTIONS])
    presets = [f"- `{name}`: " + (", ".join(f"`{o.name}`" for o in semantics.OPTIONS
                                            if preset.value(o)) or "prefixcache's rule for "
                                  "every option") + (" take vLLM 0.8.5's rule" if any(
                                      preset.value(o) for o in semantics.OPTIONS) else "")
               for name, preset in semantics.PRESETS.items()]
    return rows + "\n".join(["", "Presets:", "", *presets]) + "\n"


def render_pool_state() -> str:
    """vLLM v1's pool state: the module's account, its named types, and the
    fields of :class:`~prefixcache.spec.v1_state.V1State`."""
    out = [_doc(v1_state), "", *_constants(v1_state), "", *_fields(v1_state.V1State)]
    return "\n".join(out) + "\n"


def render_pool_invariants() -> str:
    """Every invariant of the v1 state, in registry order, with its meaning."""
    return _table([_doc(v1_invariants).split("\n\n")[0], ""], ("#", "invariant", "meaning"),
                  [(str(k), f"`{i.name}`", one_line(i.meaning))
                   for k, i in enumerate(v1_invariants.V1_INVARIANTS, 1)])


def render_pool_operations() -> str:
    """Every v1 operation: its arguments, result and effect on the state."""
    return _table([_doc(v1_operations), ""], ("operation", "result", "effect on the state"),
                  [(f"`{op.name}({', '.join(op.arguments)})`", op.result, one_line(op.effect))
                   for op in v1_operations.V1_OPERATIONS])


def render_pool_errors() -> str:
    """The v1 error table: one row per caller mistake."""
    rows = v1_error_table.V1_ERROR_TABLE
    return _table([_doc(v1_error_table), "", f"{len(rows)} rows.", ""],
                  ("operation", "tag", "mistake", "spec: raises", "0.34.0 raises", "0.34.0 does"),
                  [(f"`{row.operation}`", f"`{row.tag}`", one_line(row.mistake),
                    f"`{row.expected.__name__}`",
                    row.pinned_raises.__name__ if row.pinned_raises else "nothing (silent)",
                    one_line(row.pinned)) for row in rows])


def render_pool_semantics() -> str:
    """The v1 profile's semantic presets: the option each takes over."""
    option = next(o for o in semantics.OPTIONS if o.field == "any_mistake_exception")
    return _table([_doc(v1_semantics), ""], ("preset", "`any-mistake-exception`"),
                  [(f"`{name}`", f"vLLM 0.34.0's: {one_line(option.vllm)}" if preset.value(option)
                    else "prefixcache's: the row's class, `ValueError` for every v1 row")
                   for name, preset in v1_semantics.V1_PRESETS.items()])


SECTIONS: Tuple[Tuple[str, Callable[[], str]], ...] = (
    ("state", render_state),
    ("invariants", render_invariants),
    ("operations", render_operations),
    ("errors", render_errors),
    ("options", render_options),
    ("id-life-cycle", render_id_life),
    ("block-life-cycle", render_block_life),
    ("pool-state", render_pool_state),
    ("pool-invariants", render_pool_invariants),
    ("pool-operations", render_pool_operations),
    ("pool-errors", render_pool_errors),
    ("pool-semantics", render_pool_semantics),
)
"""Each generated section's name and the function that renders it."""


def generated_sections() -> Dict[str, str]:
    """Return name -> body of every generated section, rendered now."""
    return {name: fn() for name, fn in SECTIONS}


def _wrap(name: str, body: str) -> str:
    return f"{BEGIN.format(name=name)}\n{body}{END}"


# ==========================================================================
# filling the document


def fill_sections(text: str, sections: Dict[str, str], document: str = "SPEC.md") -> str:
    """Return ``text`` with the body of each generated section named in
    ``sections`` (name -> body) replaced by that body; the rest of ``text``
    (its prose) is kept as it is.  ValueError naming ``document`` when a
    section's marker is missing from ``text`` or appears twice.  Also used
    for other documents that mix prose and rendered sections (bench reports)."""
    for name in sections:
        if text.count(BEGIN.format(name=name)) != 1:
            raise ValueError(f"{document} must hold the marker {BEGIN.format(name=name)} once")

    def fill(m: re.Match[str]) -> str:
        name = m.group("name")
        return _wrap(name, sections[name]) if name in sections else m.group(0)

    return _SECTION.sub(fill, text)


def render_spec(text: str) -> str:
    """Return ``text`` (SPEC.md: its prose, written there) with the body of
    every generated section replaced by what spec/ renders now.  ValueError
    when a section is missing from ``text`` or appears twice."""
    return fill_sections(text, generated_sections())


# ==========================================================================
# checking and writing


def sections_of(text: str) -> Dict[str, str]:
    """Return name -> body of every generated section found in ``text``."""
    return {m.group("name"): m.group("body") for m in _SECTION.finditer(text)}


def stale_sections(text: str) -> List[str]:
    """Return the names of the generated sections that are missing from
    ``text`` or differ from what spec/ renders now (empty when all match)."""
    found = sections_of(text)
    return [name for name, body in generated_sections().items() if found.get(name) != body]


def default_path() -> Path:
    """SPEC.md at the repository root (the directory above spec/), or in
    the current directory when the package is installed elsewhere."""
    root = Path(__file__).resolve().parent.parent
    return root / "SPEC.md" if (root / "pyproject.toml").exists() else Path.cwd() / "SPEC.md"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Write SPEC.md (or check it with ``--check``); return the exit code:
    0 written or up to date, 1 stale, 2 usage error."""
    parser = argparse.ArgumentParser(prog="python -m prefixcache.spec.render",
                                     description="Render SPEC.md from prefixcache.spec.")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a generated section is stale")
    parser.add_argument("--output", type=Path, default=None, metavar="PATH",
                        help="the file to write or check (default: SPEC.md at the repo root)")
    args = parser.parse_args(argv)
    path: Path = args.output or default_path()
    if args.check:
        if not path.exists():
            print(f"{path}: missing; run python -m prefixcache.spec.render", file=sys.stderr)
            return 1
        stale = stale_sections(path.read_text(encoding="utf-8"))
        if stale:
            print(f"{path}: generated sections out of date: {', '.join(stale)}; "
                  "run python -m prefixcache.spec.render", file=sys.stderr)
            return 1
        print(f"{path}: up to date")
        return 0
    if not path.exists():
        print(f"{path}: missing; it holds the prose the sections are filled into",
              file=sys.stderr)
        return 2
    try:
        path.write_text(render_spec(path.read_text(encoding="utf-8")), encoding="utf-8")
    except ValueError as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


__all__ = [
    "SECTIONS",
    "default_path",
    "generated_sections",
    "main",
    "markdown",
    "one_line",
    "operations",
    "render_spec",
    "sections_of",
    "stale_sections",
]

if __name__ == "__main__":
    sys.exit(main())
