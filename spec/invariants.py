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
from operator import attrgetter, methodcaller
from typing import Any, Callable, Iterable, List, Mapping, Optional, Tuple

from .state import AbstractState, BlockId

Ownership = Mapping[BlockId, int]
"""id -> number of distinct live Block objects whose ``block_id`` is that id."""


@dataclass(frozen=True)
class Invariant:
    """A named predicate over the abstract state, with its meaning in words.

    Each is stated once, at one element: ``holds(s, x)`` (the function
    ``<name>_at``) for each ``x`` of ``over(s)`` (the state's ids, cached
    keys, evictor entries, touched ids, copy-on-write records, positions of
    ``block_ids``, or the state itself for a rule about counts).
    ``check(s)`` (the module's ``<name>``) is the predicate at every element
    ``over`` gives: on a whole state every element; on a
    :class:`~prefixcache.spec.state.PartialState` the elements one call
    touched (the incremental check of spec/checked.py)."""

    name: str
    meaning: str
    holds: Callable[[AbstractState, Any], bool]
    over: Callable[[AbstractState], Iterable[Any]]
    check: Callable[[AbstractState], bool]


@dataclass(frozen=True)
class OwnershipInvariant:
    """A named predicate over the abstract state plus an ownership view."""

    name: str
    meaning: str
    check: Callable[[AbstractState, Ownership], bool]


# the elements of a state each kind of invariant is checked at (each a C-level
# call: they run at every check)
_ids: Callable[[AbstractState], Iterable[BlockId]] = methodcaller("scope_ids")
_keys: Callable[[AbstractState], Iterable[Any]] = methodcaller("scope_keys")
_entries: Callable[[AbstractState], Iterable[Any]] = methodcaller("scope_entries")
_touched: Callable[[AbstractState], Iterable[BlockId]] = methodcaller("scope_touched")
_cows: Callable[[AbstractState], Iterable[Any]] = attrgetter("copy_on_writes")
_positions: Callable[[AbstractState], Iterable[int]] = methodcaller("scope_positions")


def _whole(s: AbstractState) -> Iterable[AbstractState]:
    return (s,)


# --------------------------------------------------------------------------
# partition and counting


def ids_well_formed_at(s: AbstractState, k: int) -> bool:
    """The physical ids are listed once each, in increasing order."""
    return s.block_ids[k] < s.block_ids[k + 1]


def partition_at(s: AbstractState, i: BlockId) -> bool:
    """Every physical id is exactly one of free, in use or evictable."""
    return i in s.known_ids and s.free_counts.get(i, 0) + (i in s.blocks) == 1


def refcounts_non_negative_at(s: AbstractState, i: BlockId) -> bool:
    """No reference count is negative."""
    b = s.blocks.get(i)
    return b is None or b.refcount >= 0


def counting_at(s: AbstractState, _: Any) -> bool:
    """``get_num_free_blocks()`` equals the free ids plus the evictable ids."""
    return s.reported_free == s.count_free() + s.count_evictable()


# --------------------------------------------------------------------------
# content integrity


def cached_content_matches_at(s: AbstractState, key: Any) -> bool:
    """Each cached key maps to a known id that holds exactly that content."""
    i = s.cached.get(key)
    if i is None:
        return True
    b = s.blocks.get(i)
    return b is not None and b.content == key


def cached_ids_distinct_at(s: AbstractState, key: Any) -> bool:
    """No two cached keys share one id."""
    i = s.cached.get(key)
    return i is None or s.cached_id_counts[i] == 1


def content_is_cached_at(s: AbstractState, i: BlockId) -> bool:
    """Every block that holds content is cached under that content."""
    b = s.blocks.get(i)
    return b is None or b.content is None or s.cached.get(b.content) == i


def content_whole_blocks_at(s: AbstractState, i: BlockId) -> bool:
    """Every content key names one or more blocks, each holding exactly one
    block of tokens (skipped when the block size is not recorded)."""
    b = s.blocks.get(i)
    size = s.block_size
    if size <= 0 or b is None or b.content is None:
        return True
    return len(b.content) > 0 and all(len(tokens) == size for _, tokens in b.content)


# --------------------------------------------------------------------------
# cached map and evictor


def evictable_hold_content_at(s: AbstractState, i: BlockId) -> bool:
    """An id without references is tracked only while it holds cached content."""
    b = s.blocks.get(i)
    return b is None or b.refcount != 0 or b.content is not None


def evictor_is_evictable_at(s: AbstractState, i: BlockId) -> bool:
    """The evictor holds each id with refcount 0 once, and no other id."""
    b = s.blocks.get(i)
    return s.evictor_counts.get(i, 0) == (1 if b is not None and b.refcount == 0 else 0)


def evictor_entries_match_at(s: AbstractState, k: int) -> bool:
    """Each evictor entry names its block's content, its block's access time and
    the number of tokens that content covers."""
    e = s.evictor[k]
    b = s.blocks.get(e.block_id)
    if b is None or b.content != e.content or b.last_accessed != e.last_accessed:
        return False
    return e.num_hashed_tokens == sum(len(tokens) for _, tokens in e.content)


def eviction_order_at(s: AbstractState, k: int) -> bool:
    """The evictor lists its ids in the documented order: oldest access first,
    then most hashed tokens, then smallest id."""
    return k + 1 >= len(s.evictor) or \
        s.evictor[k].eviction_rank() < s.evictor[k + 1].eviction_rank()


# --------------------------------------------------------------------------
# computed / touched life cycle


def mutable_not_computed_at(s: AbstractState, i: BlockId) -> bool:
    """A block without content (mutable) is never computed."""
    b = s.blocks.get(i)
    return b is None or b.content is not None or not b.computed


def touched_hold_content_at(s: AbstractState, i: BlockId) -> bool:
    """A touched id (promoted since the last ``mark_blocks_as_computed``) is
    in use or evictable and holds content."""
    b = s.blocks.get(i)
    return b is not None and b.content is not None


def touched_not_computed_at(s: AbstractState, i: BlockId) -> bool:
    """A touched id is not computed yet, in use or evictable."""
    b = s.blocks.get(i)
    return b is None or not b.computed


def untouched_content_computed_at(s: AbstractState, i: BlockId) -> bool:
    """A block that holds content and is not touched is computed (in use or
    evictable)."""
    b = s.blocks.get(i)
    return b is None or b.content is None or i in s.touched or b.computed


# --------------------------------------------------------------------------
# copy-on-write records and metrics


def copy_on_writes_well_formed_at(s: AbstractState, pair: Tuple[BlockId, BlockId]) -> bool:
    """Each recorded copy-on-write names two different known ids."""
    src, dst = pair
    return src != dst and src in s.known_ids and dst in s.known_ids


def hit_counts_non_negative_at(s: AbstractState, _: Any) -> bool:
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


#: the elements each invariant is stated at
_OVER: Mapping[Callable[..., bool], Callable[[AbstractState], Iterable[Any]]] = {
    ids_well_formed_at: _positions, counting_at: _whole, hit_counts_non_negative_at: _whole,
    cached_content_matches_at: _keys, cached_ids_distinct_at: _keys,
    evictor_entries_match_at: _entries, eviction_order_at: _entries,
    touched_hold_content_at: _touched, touched_not_computed_at: _touched,
    copy_on_writes_well_formed_at: _cows,
}


def _inv(holds: Callable[[AbstractState, Any], bool]) -> Invariant:
    name = holds.__name__.removesuffix("_at")
    over = _OVER.get(holds, _ids)

    def check(s: AbstractState) -> bool:
        for x in over(s):
            if not holds(s, x):
                return False
        return True

    check.__name__ = check.__qualname__ = name
    check.__doc__ = holds.__doc__
    doc = (holds.__doc__ or "").strip()
    return Invariant(name=name, meaning=" ".join(doc.split()), holds=holds, over=over,
                     check=check)


OWNERSHIP: OwnershipInvariant = OwnershipInvariant(
    name=ownership_matches.__name__,
    meaning=" ".join((ownership_matches.__doc__ or "").split()),
    check=ownership_matches,
)
"""The invariant that needs the live Blocks as well as the state."""

_GROUPED: Tuple[Tuple[str, Tuple[Any, ...]], ...] = (
    ("partition", (ids_well_formed_at, partition_at, refcounts_non_negative_at)),
    ("counting", (counting_at,)),
    ("ownership", (ownership_matches,)),
    ("integrity", (cached_content_matches_at, cached_ids_distinct_at, content_is_cached_at,
                   content_whole_blocks_at)),
    ("evictor", (evictable_hold_content_at, evictor_is_evictable_at, evictor_entries_match_at,
                 eviction_order_at)),
    ("computed", (mutable_not_computed_at, touched_hold_content_at, touched_not_computed_at,
                  untouched_content_computed_at)),
    ("bookkeeping", (copy_on_writes_well_formed_at, hit_counts_non_negative_at)),
)
"""Every invariant, once, in groups of one concern each, in SPEC.md's order."""

INVARIANTS: Tuple[Invariant, ...] = tuple(
    _inv(f) for _, checks in _GROUPED for f in checks if f is not ownership_matches)
"""Every state-only invariant, in the order SPEC.md presents them."""

globals().update({inv.name: inv.check for inv in INVARIANTS})  # partition(s), counting(s), ...

GROUPS: Mapping[str, Tuple[str, ...]] = {
    group: tuple(f.__name__.removesuffix("_at") for f in checks) for group, checks in _GROUPED}
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
    failed: List[str] = []
    for over, invariants in _BY_DOMAIN:    # each kind of element read once
        elements = over(s)
        if type(elements) not in _REREAD:
            elements = list(elements)
        if not elements:
            continue
        for inv in invariants:
            holds = inv.holds
            for x in elements:
                if not holds(s, x):
                    failed.append(inv.name)
                    break
    violated = [inv.name for inv in INVARIANTS if inv.name in failed] if failed else failed
    if ownership is not None and not OWNERSHIP.check(s, ownership):
        violated.append(OWNERSHIP.name)
    return violated


_BY_DOMAIN = tuple((over, tuple(inv for inv in INVARIANTS if inv.over is over))
                   for over in dict.fromkeys(inv.over for inv in INVARIANTS))
"""The invariants grouped by the kind of element they are stated at."""
_REREAD = (list, tuple, range, set, frozenset)   # elements that can be gone through again
