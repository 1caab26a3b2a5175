"""The invariants: what holds of every :class:`AbstractState` between two calls.

Each invariant is a small, pure predicate over an
:class:`~prefixcache.spec.state.AbstractState` with one sentence of meaning,
collected in :data:`INVARIANTS` in the order SPEC.md lists them.  Ownership is
the one invariant that needs more than the state (the live Blocks the caller
holds), so it takes an ownership view as a second argument and sits apart in
:data:`OWNERSHIP`.  :func:`check_all` runs them all and names the violated ones.

The predicates are plain Python over tuples, dicts and frozensets (no I/O, no
classes of prefixcache.impl) so that CrossHair can run symbolically over them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Mapping, Optional, Tuple

from .state import AbstractState, BlockId

Ownership = Mapping[BlockId, int]
"""id -> number of distinct live Block objects whose ``block_id`` is that id."""


@dataclass(frozen=True)
class Invariant:
    """A named predicate over the abstract state, with its meaning in words."""

    name: str
    meaning: str
    check: Callable[[AbstractState], bool]


@dataclass(frozen=True)
class OwnershipInvariant:
    """A named predicate over the abstract state plus an ownership view."""

    name: str
    meaning: str
    check: Callable[[AbstractState, Ownership], bool]


# --------------------------------------------------------------------------
# partition and counting


def ids_well_formed(s: AbstractState) -> bool:
    """The physical ids are listed once each, in increasing order."""
    ids = s.block_ids
    return all(ids[k] < ids[k + 1] for k in range(len(ids) - 1))


def partition(s: AbstractState) -> bool:
    """Every physical id is exactly one of free, in use or evictable."""
    free = set(s.free)
    if len(free) != len(s.free):
        return False
    if any(i in free for i in s.blocks):
        return False
    return free | set(s.blocks) == set(s.block_ids)


def refcounts_non_negative(s: AbstractState) -> bool:
    """No reference count is negative."""
    return all(b.refcount >= 0 for b in s.blocks.values())


def counting(s: AbstractState) -> bool:
    """``get_num_free_blocks()`` equals the free ids plus the evictable ids."""
    return s.reported_free == len(s.free) + len(s.evictor)


# --------------------------------------------------------------------------
# content integrity


def cached_content_matches(s: AbstractState) -> bool:
    """Each cached key maps to a known id that holds exactly that content."""
    for key, i in s.cached.items():
        b = s.blocks.get(i)
        if b is None or b.content != key:
            return False
    return True


def cached_ids_distinct(s: AbstractState) -> bool:
    """No two cached keys share one id."""
    return len(set(s.cached.values())) == len(s.cached)


def content_is_cached(s: AbstractState) -> bool:
    """Every block that holds content is cached under that content."""
    for i, b in s.blocks.items():
        if b.content is not None and s.cached.get(b.content) != i:
            return False
    return True


def content_whole_blocks(s: AbstractState) -> bool:
    """Every content key names one or more blocks, each holding exactly one
    block of tokens (skipped when the block size is not recorded)."""
    size = s.block_size
    if size <= 0:
        return True
    for b in s.blocks.values():
        if b.content is not None:
            if len(b.content) == 0:
                return False
            for _, tokens in b.content:
                if len(tokens) != size:
                    return False
    return True


# --------------------------------------------------------------------------
# cached map and evictor


def evictable_hold_content(s: AbstractState) -> bool:
    """An id without references is tracked only while it holds cached content."""
    return all(b.content is not None for b in s.blocks.values() if b.refcount == 0)


def evictor_is_evictable(s: AbstractState) -> bool:
    """The evictor holds each id with refcount 0 once, and no other id."""
    ids = [e.block_id for e in s.evictor]
    return len(set(ids)) == len(ids) and set(ids) == set(s.evictable())


def evictor_entries_match(s: AbstractState) -> bool:
    """Each evictor entry names its block's content, its block's access time and
    the number of tokens that content covers."""
    for e in s.evictor:
        b = s.blocks.get(e.block_id)
        if b is None or b.content != e.content or b.last_accessed != e.last_accessed:
            return False
        if e.num_hashed_tokens != sum(len(tokens) for _, tokens in e.content):
            return False
    return True


def eviction_order(s: AbstractState) -> bool:
    """The evictor lists its ids in the documented order: oldest access first,
    then most hashed tokens, then smallest id."""
    ranks = [e.eviction_rank() for e in s.evictor]
    return all(ranks[k] < ranks[k + 1] for k in range(len(ranks) - 1))


# --------------------------------------------------------------------------
# computed / touched life cycle


def mutable_not_computed(s: AbstractState) -> bool:
    """A block without content (mutable) is never computed."""
    return all(not b.computed for b in s.blocks.values() if b.content is None)


def touched_hold_content(s: AbstractState) -> bool:
    """A touched id (promoted since the last ``mark_blocks_as_computed``) is
    in use or evictable and holds content."""
    for i in s.touched:
        b = s.blocks.get(i)
        if b is None or b.content is None:
            return False
    return True


def touched_not_computed(s: AbstractState) -> bool:
    """A touched id is not computed yet, in use or evictable."""
    for i in s.touched:
        b = s.blocks.get(i)
        if b is not None and b.computed:
            return False
    return True


def untouched_content_computed(s: AbstractState) -> bool:
    """A block that holds content and is not touched is computed (in use or
    evictable)."""
    return all(b.computed for i, b in s.blocks.items()
               if b.content is not None and i not in s.touched)


# --------------------------------------------------------------------------
# copy-on-write records and metrics


def copy_on_writes_well_formed(s: AbstractState) -> bool:
    """Each recorded copy-on-write names two different known ids."""
    known = set(s.block_ids)
    return all(src != dst and src in known and dst in known for src, dst in s.copy_on_writes)


def hit_counts_non_negative(s: AbstractState) -> bool:
    """The hit and miss counts are never negative."""
    return s.hits >= 0 and s.misses >= 0


# --------------------------------------------------------------------------
# ownership


def ownership_matches(s: AbstractState, owners: Ownership) -> bool:
    """The refcount of every id equals the number of live Blocks that point at
    it: no id is owned by a Block the counter does not know, or counted
    without an owner."""
    known = set(s.block_ids)
    if any(i not in known or n < 0 for i, n in owners.items()):
        return False
    for i in s.block_ids:
        b = s.blocks.get(i)
        expected = b.refcount if b is not None else 0
        if owners.get(i, 0) != expected:
            return False
    return True


def _inv(check: Callable[[AbstractState], bool]) -> Invariant:
    doc = (check.__doc__ or "").strip()
    return Invariant(name=check.__name__, meaning=" ".join(doc.split()), check=check)


OWNERSHIP: OwnershipInvariant = OwnershipInvariant(
    name=ownership_matches.__name__,
    meaning=" ".join((ownership_matches.__doc__ or "").split()),
    check=ownership_matches,
)
"""The invariant that needs the live Blocks as well as the state."""

_GROUPED: Tuple[Tuple[str, Tuple[Any, ...]], ...] = (
    ("partition", (ids_well_formed, partition, refcounts_non_negative)),
    ("counting", (counting,)),
    ("ownership", (ownership_matches,)),
    ("integrity", (cached_content_matches, cached_ids_distinct, content_is_cached,
                   content_whole_blocks)),
    ("evictor", (evictable_hold_content, evictor_is_evictable, evictor_entries_match,
                 eviction_order)),
    ("computed", (mutable_not_computed, touched_hold_content, touched_not_computed,
                  untouched_content_computed)),
    ("bookkeeping", (copy_on_writes_well_formed, hit_counts_non_negative)),
)
"""Every invariant, once, in groups of one concern each, in SPEC.md's order."""

INVARIANTS: Tuple[Invariant, ...] = tuple(
    _inv(f) for _, checks in _GROUPED for f in checks if f is not ownership_matches)
"""Every state-only invariant, in the order SPEC.md presents them."""

GROUPS: Mapping[str, Tuple[str, ...]] = {
    group: tuple(f.__name__ for f in checks) for group, checks in _GROUPED}
"""Invariant names by group (SPEC.md's "group" column)."""


def group_of(name: str) -> str:
    """Return the group (a key of :data:`GROUPS`) of an invariant name,
    or ``"other"`` for a name no group lists."""
    for group, names in GROUPS.items():
        if name in names:
            return group
    return "other"


def check_all(s: AbstractState, ownership: Optional[Ownership] = None) -> List[str]:
    """Return the names of the invariants that ``s`` violates, in registry
    order (empty when all hold); ownership is checked only when a view is given."""
    violated = [inv.name for inv in INVARIANTS if not inv.check(s)]
    if ownership is not None and not OWNERSHIP.check(s, ownership):
        violated.append(OWNERSHIP.name)
    return violated
