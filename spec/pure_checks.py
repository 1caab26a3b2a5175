"""The spec's own code, checked by CrossHair against the pure cores.

Each function here builds a small :class:`~prefixcache.spec.state.AbstractState`
(or a chain of Blocks) from plain inputs, runs the code the spec actually
uses on it -- the abstraction's key reading (``chain_keys``,
``content_key_of``), ``cached_prefix_length``, ``EvictorEntry.eviction_rank``,
``release`` and ``next_id``, ``hit_rate``, the named steps of
:mod:`prefixcache.spec.contracts` and
:func:`~prefixcache.spec.invariants.check_all` -- and the impl's
``CacheMetricData``, and returns the answer; its postcondition compares the
answer with the cores of :mod:`prefixcache.spec.pure`.  ``prefixcache
verify`` runs CrossHair over this module.  Keys are always spelled by the
spec's own ``content_key_of``, so the checks hold whatever that spelling is.

The exploration bounds and the on/off switch are those of
:mod:`prefixcache.spec.pure`.  Every function is pure: it builds its own
state and returns a value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import FrozenSet, Optional, Sequence, Tuple

from prefixcache.impl.common import CacheMetricData

from . import contracts as C
from .abstraction import chain_keys as abstraction_chain_keys
from .abstraction import content_key_of
from .invariants import check_all
from .pure import (
    BOUND,
    Entry,
    Pair,
    Tokens,
    bound,
    chain_keys,
    close,
    count_hits,
    distinct_ids,
    ensure,
    every,
    eviction_rank,
    flat_key,
    fold_hit_rate,
    longest_ready_prefix,
    require,
    small,
    small_pairs,
    victim,
)
from .state import NEVER_ACCESSED, AbstractState, BlockState, ContentKey, EvictorEntry

# ==========================================================================
# content keys


@dataclass(frozen=True)
class Block:
    """A stand-in Block: the three attributes the spec's abstraction reads."""

    prev_block: Optional[Block]
    token_ids: Tuple[int, ...]
    extra_hash: Optional[int]


def spec_key(extra: Optional[int], tokens: Tokens) -> ContentKey:
    """The spec's content key of a first block with these tokens and extra
    hash, spelled by the spec's own abstraction (``content_key_of``)."""
    return content_key_of(Block(None, tuple(tokens), extra))


def _spells_chain(pairs: Sequence[Pair], keys: Sequence[object]) -> bool:
    """One distinct key per block, each the block's chain key spelled exactly
    or as (extra hash, tokens)."""
    if len(keys) != len(pairs) or len(set(keys)) != len(keys):
        return False
    for key, found in zip(chain_keys(pairs), keys):
        if found not in (key, flat_key(key)):
            return False
    return True


@require(lambda pairs: len(pairs) > 0, "at least one block")
@require(lambda pairs: every(lambda pair: len(pair[1]) > 0, pairs), "no block is empty")
@bound(lambda pairs: small_pairs(pairs), "a small chain")
@ensure(lambda pairs, result: _spells_chain(pairs, result),
        "the spec keys each block of a chain by its chain key (parent's key plus the "
        "block's own pair), distinct along the chain")
def spec_chain_keys_agree(pairs: Sequence[Pair]) -> Tuple[ContentKey, ...]:
    """Build a chain of Blocks from each block's own (extra hash, tokens),
    read its keys with the spec's abstraction (``chain_keys``; the last one
    also with ``content_key_of``) and return them, first block first."""
    last: Optional[Block] = None
    for extra, tokens in pairs:
        last = Block(last, tuple(tokens), extra)
    keys = tuple(key for _, key in abstraction_chain_keys(last))
    if keys and content_key_of(last) != keys[-1]:
        return keys[:-1]  # the two readings disagree: breaks "one key per block"
    return keys


# ==========================================================================
# the prefix search


def token_key(token: int) -> ContentKey:
    """The spec's content key of a one-token first block without extra hash."""
    return spec_key(None, (token,))


def _prefix_state(cached: FrozenSet[int], touched: FrozenSet[int]) -> AbstractState:
    """A state with block size 1 in which each token ``t`` of ``cached`` is
    cached on id ``t``, in use, computed unless ``t`` is in ``touched``."""
    ids = tuple(sorted(set(cached) | {0}))
    blocks = {t: BlockState(1, token_key(t), t not in touched, NEVER_ACCESSED)
              for t in sorted(cached)}
    return AbstractState(
        block_ids=ids,
        free=tuple(i for i in ids if i not in cached),
        blocks=blocks,
        cached={token_key(t): t for t in sorted(cached)},
        evictor=(),
        touched=frozenset(touched & cached),
        copy_on_writes=(),
        hits=0,
        misses=0,
        reported_free=len(ids) - len(cached),
        block_size=1,
    )


@require(lambda cached: every(lambda t: t >= 0, cached), "ids are not negative")
@bound(lambda tokens, cached, touched: small(len(tokens)) and small(len(cached))
       and small(len(touched)), "a few keys")
@ensure(lambda tokens, cached, touched, result:
        result == longest_ready_prefix(tokens, cached - touched),
        "the spec's cached_prefix_length is the longest prefix of cached, computed keys")
def spec_prefix_search_agrees(tokens: Tuple[int, ...], cached: FrozenSet[int],
                              touched: FrozenSet[int]) -> int:
    """Return the spec's ``cached_prefix_length`` of the one-token keys
    ``tokens``, on a state where each token of ``cached`` is cached (on the
    id of that number) and computed unless it is in ``touched``."""
    return C.cached_prefix_length(_prefix_state(cached, touched),
                                  [token_key(t) for t in tokens])


# ==========================================================================
# the eviction choice


@require(lambda last_accessed: not math.isnan(last_accessed), "a time that is not NaN")
@ensure(lambda last_accessed, num_hashed_tokens, block_id, result:
        result == eviction_rank(last_accessed, num_hashed_tokens, block_id),
        "the spec's EvictorEntry ranks as eviction_rank does")
def spec_eviction_rank_agrees(last_accessed: float, num_hashed_tokens: int, block_id: int
                              ) -> Tuple[float, int, int]:
    """Return the spec's ``EvictorEntry.eviction_rank`` of an entry with
    these fields."""
    return EvictorEntry(last_accessed, num_hashed_tokens, block_id, ()).eviction_rank()


def _released_in_order(entries: Sequence[Entry]) -> AbstractState:
    """A state with no free id in which every id of ``entries`` was in use,
    cached (a first block: extra hash = the id, ``num_hashed_tokens``
    tokens; no block size recorded) and accessed at its time, then released
    one by one in the order given, by the spec's ``release``."""
    keys = {e[2]: spec_key(e[2], (0,) * e[1]) for e in entries}
    ids = tuple(sorted(keys))
    state = AbstractState(
        block_ids=ids,
        free=(),
        blocks={e[2]: BlockState(1, keys[e[2]], True, e[0]) for e in entries},
        cached={keys[i]: i for i in ids},
        evictor=(),
        touched=frozenset(),
        copy_on_writes=(),
        hits=0,
        misses=0,
        reported_free=0,
    )
    for e in entries:
        state, _, _ = C.release(state, e[2])
    return state


@require(lambda entries: len(entries) > 0, "at least one evictable id")
@bound(lambda entries: small(len(entries)), "a few entries")
@require(lambda entries: every(lambda e: not math.isnan(e[0]) and 1 <= e[1] <= 4, entries),
         "no NaN time; each content covers one to four tokens")
@require(lambda entries: distinct_ids(entries), "each id once")
@ensure(lambda entries, result: result == victim(entries)[2],
        "the spec evicts the minimal entry first, whatever order the ids were released in")
def spec_next_victim_agrees(entries: Sequence[Entry]) -> Optional[int]:
    """Return the id the spec's ``next_id`` takes when no id is free and the
    ids of ``entries`` became evictable (by the spec's ``release``) in the
    order given."""
    return C.next_id(_released_in_order(entries))


# ==========================================================================
# the hit rate


def _counted(outcomes: Sequence[bool]) -> AbstractState:
    """An empty one-id state whose hit and miss counts are those of ``outcomes``."""
    hits = count_hits(outcomes)
    return replace(initial_state(1), hits=hits, misses=len(outcomes) - hits)


@require(lambda bucket_size: bucket_size >= 1, "a bucket holds at least one query")
@bound(lambda bucket_size, outcomes: small(bucket_size) and len(outcomes) <= 2 * BOUND + 1,
       "a few queries, small buckets")
@ensure(lambda bucket_size, outcomes, result:
        close(result, fold_hit_rate(bucket_size, outcomes))
        and close(result, C.hit_rate(_counted(outcomes))),
        "the impl's CacheMetricData folds as bucketed_hit_rate does, and agrees with the "
        "spec's hit_rate of the counts")
def spec_hit_rate_agrees(bucket_size: int, outcomes: Sequence[bool]) -> float:
    """Return the hit rate the impl's ``CacheMetricData`` (buckets of
    ``bucket_size`` queries) reports after the queries ``outcomes``."""
    metric = CacheMetricData(block_size=bucket_size)
    for hit in outcomes:
        metric.query(bool(hit))
    return metric.get_hit_rate()


# ==========================================================================
# invariants of small states


def initial_state(num_blocks: int, block_size: int = 1) -> AbstractState:
    """Return the state of a new allocator: ids ``0 .. num_blocks-1`` all
    free, in order; nothing cached; no query."""
    ids = tuple(range(num_blocks))
    return AbstractState(block_ids=ids, free=ids, blocks={}, cached={}, evictor=(),
                         touched=frozenset(), copy_on_writes=(), hits=0, misses=0,
                         reported_free=num_blocks, block_size=block_size)


Op = Tuple[int, int]
"""One step of :func:`spec_steps_keep_invariants`: (kind, argument)."""


def apply_step(s: AbstractState, op: Op) -> AbstractState:
    """Return ``s`` after one of the spec's named steps, applied only where
    its precondition holds (else ``s`` itself).  ``op = (kind, argument)``,
    kind taken mod 5: 0 take a mutable id; 1 allocate the one-token content
    ``argument`` (a hit or a miss); 2 release the ``argument``-th id in use;
    3 promote the first mutable id to the one-token content ``argument``;
    4 fork the ``argument``-th id in use (one more reference) and copy it
    on write."""
    kind, arg = op[0] % 5, op[1]
    if kind == 0:
        return C.take(s)[0] if C.pre_allocate_mutable_block(s) else s
    if kind == 1:
        key = token_key(arg)
        return C.lookup(s, key)[0] if C.pre_allocate_immutable_block(s, key) else s
    used = sorted(s.in_use())
    if not used:
        return s
    i = used[arg % len(used)]
    if kind == 2:
        return C.release(s, i)[0]
    if kind == 3:
        key = token_key(arg)
        mutable = [j for j in used if C.pre_promote_to_immutable_block(s, j, key)]
        return C.promote(s, mutable[0], key)[0] if mutable else s
    blocks = dict(s.blocks)
    blocks[i] = replace(s.blocks[i], refcount=s.blocks[i].refcount + 1)
    shared = replace(s, blocks=blocks)
    if not C.pre_cow_block_if_not_appendable(shared, i):
        return s
    return C.copy_on_write(shared, i)[0]


def _sound(s: AbstractState) -> bool:
    """Every invariant holds, the free count is the ids not in use, and an
    id can be taken exactly when that count is positive."""
    return (check_all(s) == []
            and s.reported_free == len(s.block_ids) - len(s.in_use())
            and (C.next_id(s) is None) == (s.reported_free == 0))


@require(lambda num_blocks: num_blocks >= 0, "a pool size")
@bound(lambda num_blocks, ops: small(num_blocks) and small(len(ops)), "a few steps, few ids")
@ensure(lambda result: _sound(result),
        "every invariant holds on the states the spec's own steps build; the free count "
        "is the ids not in use; an id can be taken exactly when it is positive")
def spec_steps_keep_invariants(num_blocks: int, ops: Sequence[Op]) -> AbstractState:
    """Return the state reached from a new allocator of ``num_blocks`` ids
    (block size 1) by the spec's own steps (take, lookup, release, promote,
    copy-on-write) as ``ops`` name them (see :func:`apply_step`)."""
    s = initial_state(num_blocks)
    for op in ops:
        s = apply_step(s, op)
    return s


__all__ = [
    "Block",
    "Op",
    "apply_step",
    "initial_state",
    "spec_chain_keys_agree",
    "spec_eviction_rank_agrees",
    "spec_hit_rate_agrees",
    "spec_key",
    "spec_next_victim_agrees",
    "spec_prefix_search_agrees",
    "spec_steps_keep_invariants",
    "token_key",
]
