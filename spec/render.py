"""SPEC.md, rendered from spec/ itself.

:func:`render_spec` returns the whole document: prose written once, here,
for an engineer who will not read the code, and sections generated from the
spec's own objects -- the abstract state (:mod:`~prefixcache.spec.state`),
the invariants (:data:`~prefixcache.spec.invariants.INVARIANTS` and
``OWNERSHIP``), every operation's pre- and postcondition
(:mod:`~prefixcache.spec.contracts` docstrings), the error table
(:data:`~prefixcache.spec.error_table.ERROR_TABLE`) and the life-cycle
pictures (:mod:`~prefixcache.spec.transitions`).  Each generated section sits
between ``<!-- generated: NAME -->`` and ``<!-- end generated -->``, so
:func:`stale_sections` can tell which ones no longer match spec/.

``python -m prefixcache.spec.render`` writes SPEC.md at the repository root
(or ``--output PATH``); with ``--check`` it writes nothing and exits 1 when a
generated section of that file differs from what spec/ renders now.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from . import contracts, error_table, invariants, state, transitions

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


def render_state() -> str:
    """The abstract state: the module's account of content keys, then each
    dataclass of spec/state.py with its docstring and its fields."""
    out = [_doc(state), ""]
    for name, doc in comment_docs(state).items():
        value = getattr(state, name)
        shown = repr(value).replace("typing.", "")
        out.append(f"- **`{name}`** = `{shown}`: {doc}")
    out.append("")
    for cls in (state.AbstractState, state.BlockState, state.EvictorEntry):
        out += [f"### `{cls.__name__}`", "", _doc(cls), "", "| field | type |", "|---|---|"]
        for f in dataclasses.fields(cls):
            out.append(f"| `{f.name}` | `{one_line(str(f.type))}` |")
        out.append("")
    return "\n".join(out)


def render_invariants() -> str:
    """Every invariant, in registry order: its name, category and meaning;
    the ownership invariant last."""
    out = [_doc(invariants).split("\n\n")[0], "",
           "| # | invariant | category | meaning |", "|---|---|---|---|"]
    rows: List[Tuple[str, str]] = [(i.name, i.meaning) for i in invariants.INVARIANTS]
    rows.append((invariants.OWNERSHIP.name, invariants.OWNERSHIP.meaning))
    for k, (name, meaning) in enumerate(rows, 1):
        out.append(f"| {k} | `{name}` | {invariants.category_of(name)} | {one_line(meaning)} |")
    return "\n".join(out) + "\n"


def _functions(prefix: str) -> Dict[str, Callable[..., object]]:
    """name without ``prefix`` -> function, for the contract functions of
    spec/contracts.py whose name starts with ``prefix``, in source order."""
    found = [(name[len(prefix):], fn) for name, fn in vars(contracts).items()
             if name.startswith(prefix) and inspect.isfunction(fn)]
    found.sort(key=lambda item: item[1].__code__.co_firstlineno)
    return dict(found)


def operations() -> List[str]:
    """Every operation spec/contracts.py has a contract for, in source
    order: each ``X`` of a ``pre_X`` or ``post_X``, and each ``X`` of a
    ``pre_naive_X`` or ``post_naive_X`` that the error table or the
    transition table names (not the shared helpers of the naive contracts)."""
    known = set(error_table.operations()) | {t.operation for t in transitions.TRANSITIONS}
    names: Dict[str, int] = {}
    for prefix in ("pre_", "post_"):
        for name, fn in _functions(prefix).items():
            op = name[len("naive_"):] if name.startswith("naive_") else name
            if op != name and op not in known and ("pre_" + op) not in vars(contracts) \
                    and ("post_" + op) not in vars(contracts):
                continue
            line = fn.__code__.co_firstlineno
            names[op] = min(names.get(op, line), line)
    return sorted(names, key=lambda op: names[op])


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
    for step in steps:
        out += [f"- **`{step.__name__}`**: {one_line(step.__doc__ or '')}"]
    out.append("")
    listed = set()
    for op in operations():
        p, q = pre.get(op), post.get(op)
        np_, nq = pre.get("naive_" + op), post.get("naive_" + op)
        listed |= {"naive_" + op}
        args = _arguments(q) or _arguments(p) or _arguments(nq) or _arguments(np_)
        out += [f"### `{op}`", ""]
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
    shared = [fn for name, fn in {**_functions("pre_"), **_functions("post_")}.items()
              if name.startswith("naive_") and name not in listed]
    if shared:
        out += ["### The allocator without a cache, elsewhere", ""]
        out += [f"- {_text(fn)}" for fn in shared]
        out.append("")
    return "\n".join(out)


def render_errors() -> str:
    """The error table: one row per caller mistake, grouped by operation."""
    rows = error_table.ERROR_TABLE
    out = [_doc(error_table), "", f"{len(rows)} rows.", "",
           "| operation | mistake | raises | allocators | tag |", "|---|---|---|---|---|"]
    for row in rows:
        out.append(f"| `{row.operation}` | {one_line(row.mistake)} | "
                   f"`{row.exception.__name__}` | {', '.join(row.applies_to)} | "
                   f"`{row.tag}` |")
    return "\n".join(out) + "\n"


def _edge_table(rows: Sequence[Tuple[str, str, str, str]]) -> List[str]:
    out = ["| from | to | operation | when |", "|---|---|---|---|"]
    for src, dst, op, condition in rows:
        out.append(f"| {src} | {dst} | `{op}` | {one_line(condition)} |")
    return out


def render_id_life() -> str:
    """The life cycle of a physical id: the Mermaid picture, the states, and
    every edge of the table with its condition."""
    T = transitions
    out = ["```mermaid", T.mermaid().rstrip("\n"), "```", "",
           "| state | meaning |", "|---|---|"]
    for life in T.Life:
        transient = " (transient)" if life in T.TRANSIENT else ""
        out.append(f"| {life.value}{transient} | {one_line(T.DESCRIPTIONS[life])} |")
    out += ["", *_edge_table([(t.source.value, t.target.value, t.operation, t.condition)
                              for t in T.TRANSITIONS])]
    return "\n".join(out) + "\n"


def render_block_life() -> str:
    """The life cycle of a Block object: the Mermaid picture, the states,
    and every edge of the table with its condition."""
    T = transitions
    out = ["```mermaid", T.block_mermaid().rstrip("\n"), "```", "",
           "| state | meaning |", "|---|---|"]
    for life in T.BlockLife:
        out.append(f"| {life.value} | {one_line(T.BLOCK_DESCRIPTIONS[life])} |")

    def name(life: Optional[transitions.BlockLife]) -> str:
        return "(none)" if life is None else life.value

    out += ["", *_edge_table([(name(t.source), name(t.target), t.operation, t.condition)
                              for t in T.BLOCK_TRANSITIONS])]
    return "\n".join(out) + "\n"


SECTIONS: Tuple[Tuple[str, Callable[[], str]], ...] = (
    ("state", render_state),
    ("invariants", render_invariants),
    ("operations", render_operations),
    ("errors", render_errors),
    ("id-life-cycle", render_id_life),
    ("block-life-cycle", render_block_life),
)
"""Each generated section's name and the function that renders it."""


def generated_sections() -> Dict[str, str]:
    """Return name -> body of every generated section, rendered now."""
    return {name: fn() for name, fn in SECTIONS}


def _wrap(name: str, body: str) -> str:
    return f"{BEGIN.format(name=name)}\n{body}{END}"


# ==========================================================================
# the prose, written once

_INTRO = """\
# prefixcache: the specification

<!-- This file is generated by `python -m prefixcache.spec.render` from spec/.
     The prose lives in spec/render.py; each generated section comes from the
     spec's own code and is checked by tests/test_spec_doc.py. Edit those, not this. -->

This is the specification of a **prefix-caching KV-cache block allocator**, the
design of vLLM 0.8.5's `PrefixCachingBlockAllocator`. It says what the allocator
holds (the abstract state), what must always be true of it (the invariants), what
each operation requires and does (pre- and postconditions), what each caller mistake
raises (the error table), and how a slot of cache moves through its life. Everything
below the prose is generated from the Python package `prefixcache.spec`, which is the
single source of truth: the model (`prefixcache.model`) follows it, the implementation
(`prefixcache.impl`) is checked against it on every call in tests, and `prefixcache
fuzz` checks any allocator with this API against it.

Contents: [blocks and ids](#blocks-and-ids) ·
[how content is keyed](#how-content-is-keyed) ·
[the abstract state](#the-abstract-state) · [invariants](#invariants) ·
[operations](#operations) · [errors](#errors) · [life cycles](#life-cycles)
"""

_BLOCKS = """\
## Blocks and ids

The allocator manages a fixed pool of **physical ids**, one per slot of KV cache that
holds `block_size` tokens. The caller never holds an id directly: it holds **Blocks**,
small objects that each carry some tokens, a link to the previous Block of the same
sequence (`prev_block`), an optional `extra_hash` (for example a LoRA or multimodal
hash) and the id they currently sit on (`block_id`, `None` when detached).

Several Blocks can sit on the same id. The **reference count** of an id is the number
of live Blocks on it; the allocator must count exactly (the *ownership* invariant),
because an id is reused as soon as its count drops to zero.

- A **mutable** block has room for more tokens, or cannot be hashed yet; `append_token_ids`
  writes into it. If its id is shared, the write first *copies on write*: the Block moves
  to a fresh id and the pair (old id, new id) is recorded so that the engine can copy the
  cache contents.
- A block becomes **immutable** when it is full and every earlier block of its sequence
  is immutable too. Its content is then *cached*: a later request for the same content
  gets the same id (a *hit*) instead of a new one, which is how common prompt prefixes are
  computed once and shared.
- When the last Block on a cached id goes away, the id is not wiped: it becomes
  **evictable**, still cached, waiting in the *evictor*. A later hit revives it. Only when
  no id is free does the allocator **evict** one (the oldest access first, then the deepest
  block, then the smallest id) and reuse it for new content.
- A block is **computed** when its cache contents are known to be filled in. A freshly
  cached id is *touched* and not computed until the engine calls `mark_blocks_as_computed`.
"""

_KEYS = """\
## How content is keyed

An implementation names content by a hash: the hash of the previous block's hash, the
block's tokens and its extra hash. The specification never does. It names the content
of a full block by its **content key**: the exact tokens of the block and of every block
before it in the sequence, each with its block's extra hash, as a tuple. Two different contents
therefore can never look equal in the spec, even where their hashes collide, and a
*collision* in an implementation shows up as a violation of content integrity (a cached
id whose content is not what its key names).

Keys are chained: the key of a block is its parent's key extended by this block's own
content, so a block after a block without content (not full, or unhashable) has no
content either, and the longest cached prefix of a sequence is found by walking its keys
from the first block. The exact spelling of a key is given in the next section.

An implementation can close the gap itself: prefixcache.impl's allocator option
`verify_content=True` keeps, for every cached id, the block's tokens and extra hash
chained to its parent's record (the content key, in effect) and compares it on every
hit, promotion, swap-in and prefix query. A block whose hash is cached for other content
is a miss: it gets an id of its own and no content, like a block after an unhashable
one, so the cached map still holds one id per hash and every invariant holds under
collisions. Off (the default), the implementation trusts the hash, as vLLM does.
"""

_STATE = """\
## The abstract state

Everything the specification says is said about one immutable value, the abstract
state of an allocator. The model keeps one; the *abstraction function* reads one out of
any allocator with vLLM-shaped internals (vLLM 0.8.5 itself included).
"""

_INVARIANTS = """\
## Invariants

Each invariant is a named predicate over the abstract state with one sentence of
meaning. All of them hold before and after every call. The category is what a violation
report names.
"""

_OPERATIONS = """\
## Operations

For each operation: the abstract arguments (a Block is named by its id, content by its
key), when it succeeds, and what it does when it does. When the precondition is false
the call raises the exception the error table names and changes nothing at all.
"""

_ERRORS = """\
## Errors
"""

_LIFE = """\
## Life cycles

Two different things have a life cycle, and it is worth keeping them apart.

**An id** is the slot of cache. Between two calls it is exactly one of *free* (no
reference, no content), *mutable* (in use, no content yet), *immutable* (in use, its
content cached) or *evictable* (no reference, content still cached). *Evicted* is not a
resting state: within the one call that needs an id when none is free, the first
evictable id in eviction order is evicted (its content leaves the cache and the evictor)
and immediately reused, as a mutable block or for new content; `reset_prefix_cache`
evicts every evictable id back to the free list. The picture is drawn from the spec's
transition table, which the tests check against every call a checked allocator makes.
"""

_BLOCK_LIFE = """\
**A Block** is the caller's handle. While attached it is mutable or immutable, like its
id. `free` detaches it for good: its reference is dropped (its id may stay cached as
evictable) and the object must not be used again, since the allocator's pool may hand
the same object out later. `swap_out` also drops its reference, but the Block keeps its
tokens, its link to the previous block and its content: it is *swapped out*, and
`swap_in` (on this device, or on the other one through `CpuGpuBlockAllocator.swap`)
attaches it to an id again: a fresh id for a Block without content, the cached id for a
hit, a fresh id that now caches its content for a miss. Swapping is a state of the
Block, never of an id: to the id, `swap_out` is a `free` and `swap_in` an allocation.
"""

_OUTRO = """\
## Keeping this document true

The generated sections above are rendered from `prefixcache.spec` by
`python -m prefixcache.spec.render`; `python -m prefixcache.spec.render --check` exits
1 when one of them no longer matches the code, and the test suite runs that check.
`prefixcache verify` runs CrossHair over the spec's pure functions
(`prefixcache.spec.pure`, `prefixcache.spec.pure_checks`) and the model's
(`prefixcache.oracle.pure_model`); `prefixcache fuzz` checks an allocator against the
model and these invariants.
"""


def render_spec() -> str:
    """Return the whole of SPEC.md: the prose above with every generated
    section rendered from spec/ now."""
    g = generated_sections()
    parts = [
        _INTRO, _BLOCKS, _KEYS,
        _STATE, _wrap("state", g["state"]),
        _INVARIANTS, _wrap("invariants", g["invariants"]),
        _OPERATIONS, _wrap("operations", g["operations"]),
        _ERRORS, _wrap("errors", g["errors"]),
        _LIFE, "### The life of an id\n", _wrap("id-life-cycle", g["id-life-cycle"]),
        "### The life of a Block\n", _BLOCK_LIFE, _wrap("block-life-cycle", g["block-life-cycle"]),
        _OUTRO,
    ]
    return "\n".join(part.rstrip("\n") + "\n" for part in parts)


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
    path.write_text(render_spec(), encoding="utf-8")
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
