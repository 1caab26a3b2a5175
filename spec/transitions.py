"""The life cycle of one physical id: its states and the operations that move it.

An id is always in exactly one :class:`Life` state, read off the abstract
state by :func:`life_of`.  :data:`TRANSITIONS` lists every edge with the
operation that causes it; :func:`mermaid` draws the table as a Mermaid
``stateDiagram-v2`` for SPEC.md, so the picture is generated from the same
table the tests check (:func:`allowed` says whether an observed move of an id
between two states is an edge of the table).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from .state import AbstractState, BlockId


class Life(enum.Enum):
    """The four states of a physical id."""

    FREE = "free"
    """No reference, no content: in the free list."""
    MUTABLE = "mutable"
    """In use (refcount > 0), no content: being written."""
    IMMUTABLE = "immutable"
    """In use, cached under its content: shared read-only."""
    EVICTABLE = "evictable"
    """No reference, still cached, in the evictor: a hit revives it; when no
    id is free it is evicted (its content leaves the cache) and reused."""


def life_of(s: AbstractState, i: BlockId) -> Life:
    """Return the life-cycle state of id ``i`` in ``s``."""
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


F, M, IM, E = Life.FREE, Life.MUTABLE, Life.IMMUTABLE, Life.EVICTABLE

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
    Transition(E, IM, "allocate_immutable_block",
               "no id is free: evicted and reused for a miss's new content"),
    Transition(E, M, "allocate_mutable_block",
               "no id is free and it is first in eviction order: evicted and reused"),
    Transition(E, M, "cow_block_if_not_appendable", "evicted to be the copy's new id"),
    Transition(E, M, "append_token_ids", "evicted to be a copy-on-write's new id"),
    Transition(E, M, "swap_in", "evicted for a Block without content hash"),
    Transition(E, F, "reset_prefix_cache", "no id is in use: every evictable id is evicted"),
    Transition(E, F, "append_token_ids",
               "evicted for a copy-on-write, then released by a duplicate promotion"),
)
"""Every edge of an id's life cycle, with the operation that takes it."""


_DESCRIPTIONS = {
    F: "no reference, no content",
    M: "in use, no content",
    IM: "in use, cached content",
    E: "no reference, cached, in the evictor",
}


def edges() -> Dict[Tuple[Life, Life], List[str]]:
    """Return (source, target) -> the operations that take that edge, in
    table order, once each."""
    out: Dict[Tuple[Life, Life], List[str]] = {}
    for t in TRANSITIONS:
        ops = out.setdefault((t.source, t.target), [])
        if t.operation not in ops:
            ops.append(t.operation)
    return out


def allowed(source: Life, target: Life, operation: Optional[str] = None) -> bool:
    """Return whether an id may move from ``source`` to ``target`` (by
    ``operation`` when given); staying put is always allowed."""
    if source == target:
        return True
    ops = edges().get((source, target))
    return ops is not None and (operation is None or operation in ops)


def mermaid() -> str:
    """Return the transition table as Mermaid ``stateDiagram-v2`` text: one
    arrow per (source, target) pair, labelled with its operations."""
    names = {F: "Free", M: "Mutable", IM: "Immutable", E: "Evictable"}
    lines = ["stateDiagram-v2", "    [*] --> Free"]
    for life in Life:
        lines.append(f"    {names[life]} : {_DESCRIPTIONS[life]}")
    for (src, dst), ops in edges().items():
        if src == dst:
            continue
        lines.append(f"    {names[src]} --> {names[dst]} : {'<br/>'.join(ops)}")
    return "\n".join(lines) + "\n"


__all__ = ["TRANSITIONS", "Life", "Transition", "allowed", "edges", "life_of", "mermaid"]
