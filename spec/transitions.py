"""The life cycles: of a physical id, and of a Block object.

Two different things have a life cycle, and SPEC.md draws both.

* A **physical id** (a slot of KV cache) is always in exactly one
  :class:`Life` state between two calls, read off the abstract state by
  :func:`life_of`: free, mutable, immutable (in use, cached) or evictable.
  Within one call an evictable id may also pass through the transient state
  *evicted*: chosen as the victim, its content leaves the cache and the same
  call reuses the id (or ``reset_prefix_cache`` puts it back on the free
  list).  :data:`TRANSITIONS` lists every edge with the operation that
  causes it; :func:`allowed` says whether an observed move of an id between
  two calls is a path of the table (through the transient state if need
  be).
* A **Block** (the caller's handle: tokens, a link to the previous block, and
  the id it is on) is :class:`BlockLife` mutable or immutable while attached
  to an id, *swapped out* after ``swap_out`` (detached, keeping its tokens
  and content, until ``swap_in`` attaches it to an id again, maybe another
  one, maybe on another device), or *freed*.  :data:`BLOCK_TRANSITIONS`
  lists its edges.  Swapping is a state of the Block, never of the id: to
  the id, ``swap_out`` is a ``free`` and ``swap_in`` an allocation.

:func:`mermaid` and :func:`block_mermaid` draw the two tables as Mermaid
``stateDiagram-v2`` text for SPEC.md, so the pictures are generated from the
same tables the tests check.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .state import AbstractState, BlockId


class Life(enum.Enum):
    """The states of a physical id: four between calls, one transient."""

    FREE = "free"
    """No reference, no content: in the free list."""
    MUTABLE = "mutable"
    """In use (refcount > 0), no content: being written."""
    IMMUTABLE = "immutable"
    """In use, cached under its content: shared read-only."""
    EVICTABLE = "evictable"
    """No reference, still cached, in the evictor: a hit revives it; when no
    id is free it is evicted (its content leaves the cache) and reused."""
    EVICTED = "evicted"
    """Transient, within one call: an evictable id chosen as the victim (the
    first in eviction order when no id is free, or every evictable id on
    ``reset_prefix_cache``).  Its content leaves the cache and the evictor;
    the same call reuses the id or frees it.  Never seen between calls:
    :func:`life_of` does not return it."""


TRANSIENT: frozenset[Life] = frozenset({Life.EVICTED})
"""States an id passes through only within a call."""


def life_of(s: AbstractState, i: BlockId) -> Life:
    """Return the life-cycle state of id ``i`` in ``s`` (never a transient
    one)."""
    b = s.blocks.get(i)
    if b is None:
        return Life.FREE
    if b.refcount == 0:
        return Life.EVICTABLE
    return Life.MUTABLE if b.content is None else Life.IMMUTABLE


@dataclass(frozen=True)
class Transition:
    """One edge: ``operation`` moves an id from ``source`` to ``target``
    when ``condition`` holds."""

    source: Life
    target: Life
    operation: str
    condition: str


F, M, IM, E, EV = Life.FREE, Life.MUTABLE, Life.IMMUTABLE, Life.EVICTABLE, Life.EVICTED

TRANSITIONS: Tuple[Transition, ...] = (
    # free ->
    Transition(F, M, "allocate_mutable_block", "it is the first free id"),
    Transition(F, M, "cow_block_if_not_appendable", "it is the copy's new id"),
    Transition(F, M, "append_token_ids", "it is the new id of a copy-on-write"),
    Transition(F, M, "swap_in", "a Block without content hash takes it"),
    Transition(F, IM, "allocate_immutable_block", "a miss caches the content on it"),
    Transition(F, IM, "allocate_immutable_blocks", "a miss caches the content on it"),
    Transition(F, IM, "swap_in", "a miss for a hashed Block"),
    Transition(F, IM, "append_token_ids",
               "it is the new id of a copy-on-write and the append fills it with new content"),
    # mutable ->
    Transition(M, M, "append_token_ids", "the block does not become full and hashable"),
    Transition(M, M, "fork", "each forked Block adds a reference"),
    Transition(M, M, "free", "a reference remains"),
    Transition(M, M, "cow_block_if_not_appendable", "the source loses one reference"),
    Transition(M, IM, "append_token_ids", "the append fills the block with new content"),
    Transition(M, IM, "promote_to_immutable_block", "its content is not cached yet"),
    Transition(M, F, "free", "the last reference is dropped"),
    Transition(M, F, "swap_out", "the last reference is dropped"),
    Transition(M, F, "append_token_ids",
               "the append fills the block with content cached on another id (a duplicate)"),
    Transition(M, F, "promote_to_immutable_block",
               "its content is already cached on another id (a duplicate)"),
    # immutable ->
    Transition(IM, IM, "allocate_immutable_block", "a hit adds a reference"),
    Transition(IM, IM, "fork", "each forked Block adds a reference"),
    Transition(IM, IM, "free", "a reference remains"),
    Transition(IM, IM, "mark_blocks_as_computed", "a touched id becomes computed"),
    Transition(IM, IM, "mark_blocks_as_accessed", "its access time changes"),
    Transition(IM, E, "free", "the last reference is dropped: it stays cached"),
    Transition(IM, E, "swap_out", "the last reference is dropped: it stays cached"),
    # evictable ->
    Transition(E, E, "mark_blocks_as_accessed", "its access time changes its eviction rank"),
    Transition(E, IM, "allocate_immutable_block", "a hit revives it"),
    Transition(E, IM, "allocate_immutable_blocks", "a hit revives it"),
    Transition(E, IM, "swap_in", "a hit revives it"),
    Transition(E, IM, "append_token_ids", "a duplicate promotion revives it"),
    Transition(E, IM, "promote_to_immutable_block", "a duplicate promotion revives it"),
    Transition(E, EV, "allocate_mutable_block",
               "no id is free and it is first in eviction order"),
    Transition(E, EV, "allocate_immutable_block", "a miss, no id is free, it is first"),
    Transition(E, EV, "allocate_immutable_blocks", "a miss, no id is free, it is first"),
    Transition(E, EV, "cow_block_if_not_appendable", "no id is free for the copy, it is first"),
    Transition(E, EV, "append_token_ids",
               "no id is free for a copy-on-write, it is first"),
    Transition(E, EV, "swap_in", "no id is free for a Block, it is first"),
    Transition(E, EV, "reset_prefix_cache", "no id is in use: every evictable id is evicted"),
    # evicted (transient) ->
    Transition(EV, M, "allocate_mutable_block", "reused as the new mutable block"),
    Transition(EV, M, "cow_block_if_not_appendable", "reused as the copy's new id"),
    Transition(EV, M, "append_token_ids", "reused as a copy-on-write's new id"),
    Transition(EV, M, "swap_in", "reused for a Block without content hash"),
    Transition(EV, IM, "allocate_immutable_block", "reused for the miss's new content"),
    Transition(EV, IM, "allocate_immutable_blocks", "reused for a miss's new content"),
    Transition(EV, IM, "swap_in", "reused for a hashed Block that misses"),
    Transition(EV, IM, "append_token_ids",
               "reused for a copy-on-write that the append fills with new content"),
    Transition(EV, F, "reset_prefix_cache", "put back on the free list"),
    Transition(EV, F, "append_token_ids",
               "reused for a copy-on-write, then released by a duplicate promotion"),
)
"""Every edge of an id's life cycle, with the operation that takes it."""


DESCRIPTIONS: Dict[Life, str] = {
    F: "no reference, no content: in the free list",
    M: "in use, no content: being written",
    IM: "in use, cached content: shared read-only",
    E: "no reference, still cached: in the evictor",
    EV: "transient, within one call: its content leaves the cache",
}
"""One line per id state, as the pictures show it."""

_NAMES = {F: "Free", M: "Mutable", IM: "Immutable", E: "Evictable", EV: "Evicted"}


def _edges(table: Sequence[Any]) -> Dict[Tuple[Any, Any], List[str]]:
    """(source, target) -> the operations that take that edge of ``table``,
    in table order, once each."""
    out: Dict[Tuple[Any, Any], List[str]] = {}
    for t in table:
        ops = out.setdefault((t.source, t.target), [])
        if t.operation not in ops:
            ops.append(t.operation)
    return out


def edges() -> Dict[Tuple[Life, Life], List[str]]:
    """Return (source, target) -> the operations that take that edge, in
    table order, once each."""
    return _edges(TRANSITIONS)


def allowed(source: Life, target: Life, operation: Optional[str] = None) -> bool:
    """Return whether one call may move an id from ``source`` to ``target``
    (by ``operation`` when given): an edge of the table, or two edges
    through a transient state taken by the same operation.  Staying put is
    always allowed."""
    if source == target:
        return True
    table = edges()

    def step(a: Life, b: Life) -> bool:
        ops = table.get((a, b))
        return ops is not None and (operation is None or operation in ops)

    return step(source, target) or any(
        step(source, mid) and step(mid, target) for mid in TRANSIENT)


def _mermaid(names: Dict[Any, str], descriptions: Dict[Any, str],
             table: Dict[Tuple[Any, Any], List[str]], *start: str) -> List[str]:
    """The lines of a ``stateDiagram-v2``: ``start``, one state per key of
    ``names`` with its description, one arrow per edge of ``table`` between
    two states (``[*]`` for None) labelled with its operations."""
    lines = ["stateDiagram-v2", "    direction LR", *start]
    lines += [f"    {name} : {name}<br/>{descriptions[life]}" for life, name in names.items()]
    lines += [f"    {names.get(src, '[*]')} --> {names.get(dst, '[*]')} : {'<br/>'.join(ops)}"
              for (src, dst), ops in table.items() if src != dst]
    return lines


def mermaid() -> str:
    """Return the id table as Mermaid ``stateDiagram-v2`` text: one state
    per :class:`Life` with its description, one arrow per (source, target)
    pair labelled with its operations; the transient state drawn dashed."""
    lines = _mermaid(_NAMES, DESCRIPTIONS, edges(), "    [*] --> Free")
    lines.append("    classDef transient stroke-dasharray: 5 5")
    lines += [f"    class {_NAMES[life]} transient"
              for life in sorted(TRANSIENT, key=lambda x: x.value)]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# the life of a Block object


class BlockLife(enum.Enum):
    """The states of a Block object (the caller's handle)."""

    MUTABLE = "mutable"
    """Attached to an id, no content yet: takes appended tokens."""
    IMMUTABLE = "immutable"
    """Attached to an id, full and hashed: its content is cached on that id."""
    SWAPPED_OUT = "swapped out"
    """Detached by ``swap_out``: holds no id (its reference was dropped) but
    keeps its tokens, its link to the previous block and its content, until
    ``swap_in`` (of this allocator or, through ``CpuGpuBlockAllocator.swap``,
    of the other device's) attaches it to an id again."""
    FREED = "freed"
    """Detached by ``free``: holds no id; the caller must drop it (the
    allocator's pool may hand the same object out again)."""


@dataclass(frozen=True)
class BlockTransition:
    """One edge of a Block's life: ``operation`` moves a Block from
    ``source`` to ``target`` (None: the Block does not exist yet, or any
    more) when ``condition`` holds."""

    source: Optional[BlockLife]
    target: Optional[BlockLife]
    operation: str
    condition: str


BM, BI, BS, BF = BlockLife.MUTABLE, BlockLife.IMMUTABLE, BlockLife.SWAPPED_OUT, BlockLife.FREED

BLOCK_TRANSITIONS: Tuple[BlockTransition, ...] = (
    BlockTransition(None, BM, "allocate_mutable_block", "a new empty Block on a fresh id"),
    BlockTransition(None, BM, "fork", "the copy of a mutable Block, on the same id"),
    BlockTransition(None, BI, "allocate_immutable_block",
                    "a new full Block: on the cached id (a hit) or a fresh one (a miss)"),
    BlockTransition(None, BI, "allocate_immutable_blocks", "the same, per token list"),
    BlockTransition(None, BI, "fork", "the copy of an immutable Block, on the same id"),
    BlockTransition(BM, BM, "append_token_ids",
                    "it does not become full and hashable (a shared id is copied first)"),
    BlockTransition(BM, BM, "cow_block_if_not_appendable",
                    "its id is shared: it moves to a new id"),
    BlockTransition(BM, BI, "append_token_ids",
                    "it becomes full and hashable: its id is promoted, or it moves to the "
                    "id that already caches that content"),
    BlockTransition(BM, BI, "promote_to_immutable_block", "it is full and hashable"),
    BlockTransition(BM, BS, "swap_out", "its reference is dropped; it keeps its tokens"),
    BlockTransition(BI, BS, "swap_out", "its reference is dropped; it keeps its content"),
    BlockTransition(BM, BF, "free", "its reference is dropped"),
    BlockTransition(BI, BF, "free", "its reference is dropped: the id may stay cached"),
    BlockTransition(BS, BS, "append_token_ids", "its tokens grow; no id is touched"),
    BlockTransition(BS, BM, "swap_in", "without content hash: it takes a fresh id"),
    BlockTransition(BS, BI, "swap_in",
                    "with content hash: the cached id (a hit) or a fresh one (a miss)"),
    BlockTransition(BF, None, "(reused by the pool)",
                    "the allocator may hand the same object out again"),
)
"""Every edge of a Block's life cycle, with the operation that takes it."""

_BLOCK_NAMES = {BM: "Mutable", BI: "Immutable", BS: "SwappedOut", BF: "Freed"}
BLOCK_DESCRIPTIONS: Dict[BlockLife, str] = {
    BM: "attached to an id, no content",
    BI: "attached to an id, content cached",
    BS: "detached by swap_out, keeps its tokens and content",
    BF: "detached by free, not to be used again",
}
"""One line per Block state, as the pictures show it."""


def block_mermaid() -> str:
    """Return the Block table as Mermaid ``stateDiagram-v2`` text: one
    state per :class:`BlockLife`, ``[*]`` for "no Block", one arrow per
    (source, target) pair labelled with its operations."""
    return "\n".join(_mermaid(_BLOCK_NAMES, BLOCK_DESCRIPTIONS, _edges(BLOCK_TRANSITIONS))) + "\n"


__all__ = [
    "BLOCK_DESCRIPTIONS",
    "BLOCK_TRANSITIONS",
    "BlockLife",
    "BlockTransition",
    "DESCRIPTIONS",
    "TRANSIENT",
    "TRANSITIONS",
    "Life",
    "Transition",
    "allowed",
    "block_mermaid",
    "edges",
    "life_of",
    "mermaid",
]
