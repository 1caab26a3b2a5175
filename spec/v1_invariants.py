"""The invariants of the v1 pool: what holds of every
:class:`~prefixcache.spec.v1_state.V1State` between two calls.

Each invariant is a small, pure predicate over the state with one sentence of
meaning, collected in :data:`V1_INVARIANTS` in the order SPEC.md lists them;
:func:`check_all_v1` names the violated ones.  Same conventions as
:mod:`prefixcache.spec.invariants`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Tuple

from .v1_state import V1State


@dataclass(frozen=True)
class V1Invariant:
    """A named predicate over the v1 state, with its meaning in words."""

    name: str
    meaning: str
    check: Callable[[V1State], bool]


def ids_well_formed(s: V1State) -> bool:
    """There is a reference count for every id, and the null block is one of the ids."""
    return len(s.ref_cnt) == s.num_blocks and 0 <= s.null_block < s.num_blocks


def free_count_is_queue_length(s: V1State) -> bool:
    """``get_num_free_blocks()`` equals the length of the free queue."""
    return s.reported_free == len(s.free_queue)


def queue_well_formed(s: V1State) -> bool:
    """The free queue lists known ids, each once."""
    q = s.free_queue
    return len(set(q)) == len(q) and all(0 <= i < s.num_blocks for i in q)


def queue_links_agree(s: V1State) -> bool:
    """The free queue lists the same ids in the same order read front to back
    as read back to front."""
    return s.queue_backward == s.free_queue


def refcounts_non_negative(s: V1State) -> bool:
    """No reference count is below zero."""
    return all(n >= 0 for n in s.ref_cnt)


def referenced_not_queued(s: V1State) -> bool:
    """No id is both referenced and in the free queue."""
    return all(s.ref_cnt[i] == 0 for i in s.free_queue if 0 <= i < len(s.ref_cnt))


def unreferenced_queued(s: V1State) -> bool:
    """Every id other than the null block that holds no reference is in the
    free queue (none is lost)."""
    queued = set(s.free_queue)
    return all(i in queued for i, n in enumerate(s.ref_cnt) if n == 0 and i != s.null_block)


def null_block_apart(s: V1State) -> bool:
    """The null block is never queued, never cached and holds no key."""
    n = s.null_block
    return (n not in s.free_queue and not s.keys_of(n)
            and all(n not in ids for ids in s.cached.values()))


def no_stale_map_entry(s: V1State) -> bool:
    """Each key lists distinct ids, at least one, each of which is cached
    under that key; and every key an id holds lists that id."""
    for key, ids in s.cached.items():
        if not ids or len(set(ids)) != len(ids):
            return False
        if any(key not in s.keys_of(i) for i in ids):
            return False
    for i in set(s.block_keys) | set(s.secondary):
        if any(i not in s.cached.get(key, ()) for key in s.keys_of(i)):
            return False
    return True


def lookup_is_first(s: V1State) -> bool:
    """A lookup of a key returns the first id cached under it (the earliest
    cached of those still cached), and finds exactly the cached keys."""
    return set(s.lookup) == set(s.cached) and all(
        s.lookup[key] == ids[0] for key, ids in s.cached.items())


def salts_and_groups_apart(s: V1State) -> bool:
    """Blocks under different salts or groups are never shared: all the keys
    an id is cached under name one group and (where the content of their hashes
    is recorded) one salt."""
    for i in set(s.block_keys) | set(s.secondary):
        keys = s.keys_of(i)
        if len({group for _, group in keys}) > 1:
            return False
        salts = {s.contents[h][0] for h, _ in keys if h in s.contents}
        if len(salts) > 1:
            return False
    return True


def keys_cover_whole_blocks(s: V1State) -> bool:
    """A primary key covers a positive whole number of blocks of tokens
    (skipped when the block size is not recorded)."""
    size = s.block_size
    return size <= 0 or all(n > 0 and n % size == 0 for _, n in s.block_keys.values())


_CHECKS = (ids_well_formed, free_count_is_queue_length, queue_well_formed, queue_links_agree,
           refcounts_non_negative, referenced_not_queued, unreferenced_queued,
           null_block_apart, no_stale_map_entry, lookup_is_first, salts_and_groups_apart,
           keys_cover_whole_blocks)

V1_INVARIANTS: Tuple[V1Invariant, ...] = tuple(
    V1Invariant(name=f.__name__, meaning=" ".join((f.__doc__ or "").split()), check=f)
    for f in _CHECKS)
"""Every invariant of the v1 state, in the order SPEC.md presents them."""


def check_all_v1(s: V1State) -> List[str]:
    """Return the names of the invariants that ``s`` violates, in registry
    order (empty when all hold)."""
    return [inv.name for inv in V1_INVARIANTS if not inv.check(s)]
