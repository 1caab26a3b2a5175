"""The spec's pure cores, with the contracts CrossHair checks.

Small functions over plain tuples and ints that state, once, four things the
spec relies on: how content keys chain (:func:`chain_key`,
:func:`chain_keys`), the prefix search
(:func:`longest_ready_prefix`), the eviction choice (:func:`eviction_rank`,
:func:`victim`) and the hit rate (:func:`hit_rate`,
:func:`bucketed_hit_rate`, :func:`fold_hit_rate`).  Each carries an icontract
postcondition that says what it computes independently of how (the prefix
search is also compared with a second, differently written linear scan);
``prefixcache verify`` runs CrossHair over them.  They are the spec's only
statement of these rules: the state's eviction order, the contracts' cached
prefix and hit rate, the abstraction's and the model's content keys all call
them.  This module imports nothing from the spec, so all of it can use it.

Bounds.  Symbolic search over unbounded tuples is slow, so the functions also
carry size preconditions (at most :data:`BOUND` elements) that are installed
only while exploring, that is when the environment variable
``PREFIXCACHE_EXPLORE`` is set (``prefixcache verify`` sets it).  In ordinary
use they do not exist, and the correctness contracts follow the spec's usual
switch: on unless ``PREFIXCACHE_CONTRACTS=0`` or Python runs with ``-O``.

Every function here is pure: no I/O, no state kept between calls, arguments
never mutated.  Conditions loop explicitly (:func:`every`) rather than call
``all`` on a generator: CrossHair 0.0.113's ``all`` keeps evaluating the
generator after a symbolic false item, which explores badly and can raise
where plain Python short-circuits.
"""

from __future__ import annotations

import inspect
import math
import os
from typing import Any, Callable, Container, List, Optional, Sequence, Tuple, TypeVar, cast

import icontract

K = TypeVar("K")
F = TypeVar("F", bound=Callable[..., Any])

Tokens = Tuple[int, ...]
#: One block's own content: its extra hash and its tokens.
Pair = Tuple[Optional[int], Tokens]
#: The exact content of a block and of every block before it: one pair per
#: block, first block first.
ChainKey = Tuple[Pair, ...]
#: One evictor entry as plain values: (last_accessed, num_hashed_tokens, block_id).
Entry = Tuple[float, int, int]

EXPLORING: bool = os.environ.get("PREFIXCACHE_EXPLORE", "").strip() not in ("", "0")
"""Whether the exploration bounds are installed (``prefixcache verify`` sets
``PREFIXCACHE_EXPLORE=1`` for CrossHair)."""


def contracts_enabled() -> bool:
    """Return whether contracts are on: Python without ``-O`` and the
    environment variable ``PREFIXCACHE_CONTRACTS`` not ``0``."""
    return __debug__ and os.environ.get("PREFIXCACHE_CONTRACTS", "1").strip() != "0"


ENABLED: bool = contracts_enabled()
"""Whether the contracts are installed (the spec's usual switch)."""

BOUND: int = 3
"""The largest size (tuple length, pool size, bucket size) explored."""

MAX_QUERIES: int = 2 ** 53
"""The most queries the hit rate is specified for (counts a float holds exactly)."""

TOLERANCE: float = 1e-9
"""Relative (and, near zero, absolute) tolerance of float comparisons."""


def ensure(condition: Callable[..., Any], description: str) -> Callable[[F], F]:
    """An icontract postcondition, installed when contracts are on."""
    return icontract.ensure(condition, description, enabled=ENABLED)


def require(condition: Callable[..., Any], description: str) -> Callable[[F], F]:
    """An icontract precondition, installed when contracts are on."""
    return icontract.require(condition, description, enabled=ENABLED)


def bound(condition: Callable[..., Any], description: str) -> Callable[[F], F]:
    """A precondition that keeps the symbolic search small, installed only
    while exploring."""
    return icontract.require(condition, description, enabled=ENABLED and EXPLORING)


def unchecked(function: F) -> F:
    """``function`` without its contracts: what the spec's hot paths call
    (content keys of every live Block at every reading, the model's keys),
    where the postcondition, proved by CrossHair and exercised by the tests,
    would cost thirty times the function itself on every call."""
    return cast(F, inspect.unwrap(function))


def small(n: int) -> bool:
    """``n`` is a size within the exploration bound."""
    return 0 <= n <= BOUND


def every(predicate: Callable[[Any], bool], items: Any) -> bool:
    """Whether ``predicate`` holds of every item of ``items``."""
    for item in items:
        if not predicate(item):
            return False
    return True


def close(a: float, b: float) -> bool:
    """Whether ``a`` and ``b`` agree within :data:`TOLERANCE`."""
    return abs(a - b) <= TOLERANCE * max(1.0, abs(a), abs(b))


# ==========================================================================
# content-key chaining


def small_pairs(pairs: Sequence[Pair]) -> bool:
    """A short chain of short blocks (the exploration bound)."""
    return small(len(pairs)) and every(lambda pair: small(len(pair[1])), pairs)


def _extends(parent: ChainKey, extra: Optional[int], tokens: Tokens, key: ChainKey) -> bool:
    return len(key) == len(parent) + 1 and key[:-1] == parent and key[-1] == (extra, tokens)


@bound(lambda parent, tokens: small_pairs(parent) and small(len(tokens)), "a small chain")
@ensure(lambda parent, extra, tokens, result: _extends(parent, extra, tokens, result),
        "the key is the parent's key followed by this block's own (extra, tokens)")
def chain_key(parent: ChainKey, extra: Optional[int], tokens: Tokens) -> ChainKey:
    """Return the key of a block whose parent (the previous block of its
    chain) has the key ``parent`` (``()`` for a first block): the parent's
    key followed by this block's own (extra hash, tokens)."""
    return parent + ((extra, tuple(tokens)),)


def _chained(pairs: Sequence[Pair], keys: Sequence[ChainKey]) -> bool:
    """One key per block; each the previous key plus the block's own pair;
    all distinct."""
    if len(keys) != len(pairs) or len(set(keys)) != len(keys):
        return False
    parent: ChainKey = ()
    for (extra, tokens), key in zip(pairs, keys):
        if not _extends(parent, extra, tokens, key):
            return False
        parent = key
    return True


@bound(lambda pairs: small_pairs(pairs), "a small chain")
@ensure(lambda pairs, result: _chained(pairs, result),
        "one distinct key per block, each its parent's key plus the block's own pair")
def chain_keys(pairs: Sequence[Pair]) -> Tuple[ChainKey, ...]:
    """Return the key of every block of a chain, first block first, given
    each block's own (extra hash, tokens)."""
    out: List[ChainKey] = []
    parent: ChainKey = ()
    for extra, tokens in pairs:
        parent = chain_key(parent, extra, tokens)
        out.append(parent)
    return tuple(out)


# ==========================================================================
# the prefix search


def _linear_reference(keys: Sequence[K], ready: Container[K]) -> int:
    """The index of the first key that is not ready, else the length."""
    return next((k for k, key in enumerate(keys) if key not in ready), len(keys))


def is_longest_ready_prefix(keys: Sequence[K], ready: Container[K], result: int) -> bool:
    """Whether ``result`` is the length of the longest prefix of ``keys``
    whose keys are all in ``ready`` (every key before it is ready, the key
    at it, if any, is not) and equals the linear reference scan."""
    return (0 <= result <= len(keys)
            and every(lambda key: key in ready, keys[:result])
            and (result == len(keys) or keys[result] not in ready)
            and result == _linear_reference(keys, ready))


def _few_keys(keys: Sequence[Any]) -> bool:
    """At most :data:`BOUND` keys (a named function: icontract reads a
    condition lambda only where a decorator states it)."""
    return small(len(keys))


def prefix_search_contract(function: F) -> F:
    """Decorate ``function(keys, ready) -> int`` with the contract of a
    prefix search: its result is the length of the longest prefix of ``keys``
    that are all in ``ready``, equal to the linear reference scan
    (:func:`is_longest_ready_prefix`; and, while exploring, at most
    :data:`BOUND` keys).  :func:`longest_ready_prefix` wears it; so can any
    variant meant to replace it."""
    checked = ensure(is_longest_ready_prefix,
                     "the longest prefix of ready keys, as the linear reference scan finds "
                     "it")(function)
    return bound(_few_keys, "at most BOUND keys")(checked)


@prefix_search_contract
def longest_ready_prefix(keys: Sequence[K], ready: Container[K]) -> int:
    """Return how many keys, from the first, are ready (cached on a computed
    id) before the first one that is not.  The ready keys need not form a
    prefix of ``keys``: a ready key after a missing one does not count."""
    n = 0
    for key in keys:
        if key not in ready:
            break
        n += 1
    return n


# ==========================================================================
# the eviction choice


def eviction_rank(last_accessed: float, num_hashed_tokens: int, block_id: int
                  ) -> Tuple[float, int, int]:
    """Return the key that orders evictable ids, the smallest evicted
    first: oldest access, then most hashed tokens, then smallest id."""
    return (last_accessed, -num_hashed_tokens, block_id)


def distinct_ids(entries: Sequence[Entry]) -> bool:
    """No two entries name the same id."""
    ids = [e[2] for e in entries]
    return len(set(ids)) == len(ids)


def _is_minimal(entries: Sequence[Entry], chosen: Entry) -> bool:
    """``chosen`` is an entry and no entry ranks before it."""
    rank = eviction_rank(*chosen)
    return chosen in entries and every(lambda e: rank <= eviction_rank(*e), entries)


@require(lambda entries: len(entries) > 0, "at least one evictable id")
@bound(lambda entries: small(len(entries)), "a few entries")
@require(lambda entries: every(lambda e: not math.isnan(e[0]), entries), "no NaN time")
@require(lambda entries: distinct_ids(entries), "each id once")
@ensure(lambda entries, result: _is_minimal(entries, result),
        "the victim is the entry minimal under (last_accessed, -num_hashed_tokens, block_id)")
def victim(entries: Sequence[Entry]) -> Entry:
    """Return the entry evicted next: the minimal one under
    (last_accessed, -num_hashed_tokens, block_id)."""
    best = entries[0]
    for e in entries[1:]:
        if eviction_rank(*e) < eviction_rank(*best):
            best = e
    return best


# ==========================================================================
# the hit rate


def _is_rate(hits: int, misses: int, rate: float) -> bool:
    """A ratio in [0, 1]: 0.0 before the first query, else hits / queries."""
    if not 0.0 <= rate <= 1.0:
        return False
    if hits + misses == 0:
        return rate == 0.0
    return close(rate * (hits + misses), hits)


@require(lambda hits, misses: hits >= 0 and misses >= 0, "counts are not negative")
@require(lambda hits, misses: hits + misses <= MAX_QUERIES, "counts a float holds exactly")
@ensure(lambda hits, misses, result: _is_rate(hits, misses, result),
        "hits over queries, 0.0 before the first query")
def hit_rate(hits: int, misses: int) -> float:
    """Return hits / (hits + misses), 0.0 before the first query."""
    total = hits + misses
    return hits / total if total else 0.0


def _bucket_rate_ok(bucket_hits: Sequence[int], open_hits: int, open_queries: int,
                    bucket_size: int, result: float) -> bool:
    hits = open_hits
    for h in bucket_hits:
        hits += h
    queries = len(bucket_hits) * bucket_size + open_queries
    return close(result, hit_rate(hits, queries - hits))


@require(lambda bucket_size: bucket_size >= 1, "a bucket holds at least one query")
@require(lambda bucket_hits, bucket_size: every(lambda h: 0 <= h <= bucket_size, bucket_hits),
         "each completed bucket counts at most a bucket of hits")
@require(lambda open_hits, open_queries, bucket_size:
         0 <= open_hits <= open_queries < bucket_size, "the open bucket is not full")
@bound(lambda bucket_hits: small(len(bucket_hits)), "a few buckets")
@ensure(lambda bucket_hits, open_hits, open_queries, bucket_size, result:
        _bucket_rate_ok(bucket_hits, open_hits, open_queries, bucket_size, result),
        "the bucketed rate equals hits over queries")
def bucketed_hit_rate(bucket_hits: Sequence[int], open_hits: int, open_queries: int,
                      bucket_size: int) -> float:
    """Return vLLM's bucketed hit rate (``CacheMetricData``): completed
    buckets of ``bucket_size`` queries with ``bucket_hits`` hits each, folded
    one by one into a running mean of their ratios, then an open bucket of
    ``open_queries`` queries (``open_hits`` hits) weighted by how full it is;
    0.0 before the first query."""
    rate = 0.0
    for done, hits in enumerate(bucket_hits):
        rate = (rate * done + hits / bucket_size) / (done + 1)
    done = len(bucket_hits)
    fraction = open_queries / bucket_size
    weight = done + fraction
    if weight == 0:
        return 0.0
    completed = rate * done if done > 0 else 0.0
    partial = open_hits / open_queries * fraction if open_queries > 0 else 0.0
    return (completed + partial) / weight


def rate_of(outcomes: Sequence[bool]) -> float:
    """hits / queries of the query outcomes (True for a hit), 0.0 with none."""
    hits = 0
    for hit in outcomes:
        if hit:
            hits += 1
    return hit_rate(hits, len(outcomes) - hits)


@require(lambda bucket_size: bucket_size >= 1, "a bucket holds at least one query")
@bound(lambda bucket_size, outcomes: small(bucket_size) and len(outcomes) <= 2 * BOUND + 1,
       "a few queries, small buckets")
@ensure(lambda outcomes, result: close(result, rate_of(outcomes)),
        "the bucketed rate of a sequence of queries equals hits over queries")
def fold_hit_rate(bucket_size: int, outcomes: Sequence[bool]) -> float:
    """Return :func:`bucketed_hit_rate` after the queries ``outcomes`` (True
    for a hit), cut into buckets of ``bucket_size`` queries."""
    bucket_hits: List[int] = []
    open_queries = open_hits = 0
    for hit in outcomes:
        open_queries += 1
        open_hits += 1 if hit else 0
        if open_queries == bucket_size:
            bucket_hits.append(open_hits)
            open_queries = open_hits = 0
    return bucketed_hit_rate(bucket_hits, open_hits, open_queries, bucket_size)


__all__ = [
    "BOUND",
    "ChainKey",
    "ENABLED",
    "EXPLORING",
    "Entry",
    "MAX_QUERIES",
    "Pair",
    "TOLERANCE",
    "bound",
    "bucketed_hit_rate",
    "chain_key",
    "chain_keys",
    "contracts_enabled",
    "close",
    "distinct_ids",
    "ensure",
    "every",
    "eviction_rank",
    "fold_hit_rate",
    "hit_rate",
    "is_longest_ready_prefix",
    "longest_ready_prefix",
    "prefix_search_contract",
    "rate_of",
    "require",
    "small",
    "small_pairs",
    "victim",
]
