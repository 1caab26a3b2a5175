"""The model's pure parts, under the contracts CrossHair checks.

``prefixcache verify`` runs CrossHair over this module as well as
:mod:`prefixcache.spec.pure`.  Each function here runs a piece of
:mod:`prefixcache.model` on small plain inputs and returns what it answers;
its postcondition says the answer agrees with the spec's pure cores (and
with the spec's abstraction where it reads keys).  The operations are
driven through a fresh :class:`~prefixcache.model.Model` and its public API
only, except the hit rate, whose 1000-query buckets are set
directly (``_hits``, ``_misses``, ``_buckets``) because reaching them by
queries is far beyond a symbolic search.

Not checked here: ``Model.get_common_computed_block_ids``.  Its condition
``all(len(r) > n and r[n] == rows[0][n] for r in rows)`` relies on ``all``
stopping at the first false item, and CrossHair 0.0.113's ``all`` keeps
evaluating the generator after a symbolic false, so it reports an
``IndexError`` that plain Python never raises.

It lives with the model, which may import the spec (the spec never imports
the model).  The exploration bounds and the on/off switch
are those of :mod:`prefixcache.spec.pure`.  Every function is pure as seen
from outside: each builds its own model and returns a value.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence, Tuple, TypeVar

import icontract

from ..spec import contracts as C
from ..spec import pure as P
from .model import Model

F = TypeVar("F", bound=Callable[..., Any])

#: Queries per bucket in the model (vLLM's ``CacheMetricData`` default).
MODEL_BUCKET = 1000


def _ensure(condition: Callable[..., Any], description: str) -> Callable[[F], F]:
    return icontract.ensure(condition, description, enabled=P.ENABLED)


def _require(condition: Callable[..., Any], description: str) -> Callable[[F], F]:
    return icontract.require(condition, description, enabled=P.ENABLED)


def _bound(condition: Callable[..., Any], description: str) -> Callable[[F], F]:
    return icontract.require(condition, description, enabled=P.ENABLED and P.EXPLORING)


# ==========================================================================
# content keys


def _model_chain(block_size: int, pairs: Sequence[P.Pair]) -> Tuple[Optional[object], ...]:
    """The content keys of a chain the model allocates block by block
    (``allocate_immutable_block`` after the previous one, each with its own
    extra hash), read from its handles, first block first."""
    model = Model(num_blocks=len(pairs), block_size=block_size)
    prev = None
    keys = []
    for extra, tokens in pairs:
        prev = model.allocate_immutable_block(prev, list(tokens), extra)
        keys.append(prev.content_key)
    return tuple(keys)


@_require(lambda block_size: block_size >= 1, "a block holds a token")
@_require(lambda pairs: len(pairs) > 0, "at least one block")
@_bound(lambda block_size, pairs: block_size <= 2 and P.small(len(pairs)), "a short chain")
@_require(lambda block_size, pairs: P.every(lambda pair: len(pair[1]) == block_size, pairs),
          "every block is full")
@_ensure(lambda pairs, result: result == P.chain_keys(pairs),
         "the model keys each block of a chain exactly as the spec does")
def model_keys_agree(block_size: int, pairs: Tuple[P.Pair, ...]) -> Tuple[Optional[object], ...]:
    """Return the content keys of the handles of a chain of full blocks
    that the model allocates from each block's own (extra hash, tokens)."""
    return _model_chain(block_size, pairs)


# ==========================================================================
# the prefix search


def _model_with_cached(cached: Sequence[int], touched: Sequence[int]) -> Model:
    """A model (block size 1) in which every token of ``cached`` and of
    ``touched`` is cached as a one-block sequence, the ``touched`` ones
    promoted after the last ``mark_blocks_as_computed`` (not computed)."""
    done = sorted(set(cached) - set(touched))
    late = sorted(set(touched))
    model = Model(num_blocks=len(done) + len(late), block_size=1)
    for token in done:
        model.allocate_immutable_block(None, [token])
    model.mark_blocks_as_computed([])
    for token in late:
        model.allocate_immutable_block(None, [token])
    return model


def _both_longest(tokens: Sequence[int], cached: Sequence[int], touched: Sequence[int],
                  result: Tuple[int, int]) -> bool:
    expected = P.longest_ready_prefix(tokens, frozenset(cached) - frozenset(touched))
    return result == (expected, expected)


@_bound(lambda tokens, cached, touched: P.small(len(tokens)) and P.small(len(cached))
        and P.small(len(touched)), "a few keys")
@_ensure(lambda tokens, cached, touched, result: _both_longest(tokens, cached, touched, result),
         "the model's find_cached_blocks_prefix, and the spec's cached_prefix_length of the "
         "model's state, are the longest prefix of cached, computed keys")
def model_prefix_search_agrees(tokens: Tuple[int, ...], cached: Tuple[int, ...],
                               touched: Tuple[int, ...]) -> Tuple[int, int]:
    """Return how many of the one-token keys ``tokens`` the model's
    ``find_cached_blocks_prefix`` returns, and the spec's
    ``cached_prefix_length`` of them on the model's ``state()``, on a model
    where the tokens of ``cached`` are cached and computed and those of
    ``touched`` cached but not computed."""
    model = _model_with_cached(cached, touched)
    keys = [((None, (t,)),) for t in tokens]
    return (len(model.find_cached_blocks_prefix(keys)),
            C.cached_prefix_length(model.state(), keys))


# ==========================================================================
# the eviction choice


def _is_permutation(order: Sequence[int], n: int) -> bool:
    return len(order) == n and sorted(order) == list(range(n))


@_require(lambda times: len(times) > 0, "at least one id")
@_bound(lambda times: P.small(len(times)), "a few ids")
@_require(lambda times: P.every(lambda t: not math.isnan(t), times), "no NaN time")
@_require(lambda times, order: _is_permutation(order, len(times)),
          "each id is freed once")
@_ensure(lambda times, result: result == P.victim([(t, 1, i) for i, t in enumerate(times)])[2],
         "with no free id the model evicts the minimal entry, whatever the order of freeing")
def model_eviction_agrees(times: Tuple[float, ...], order: Tuple[int, ...]) -> int:
    """Return the id a model of ``len(times)`` ids (block size 1) hands out
    to a mutable allocation after caching one one-token block on each id
    ``i``, marking it accessed at ``times[i]``, and freeing the blocks in
    ``order`` (so no id is free, all are evictable)."""
    model = Model(num_blocks=len(times), block_size=1)
    blocks = [model.allocate_immutable_block(None, [i]) for i in range(len(times))]
    # a new model hands out ids 0, 1, ... in order: block i is on id i
    for i, t in enumerate(times):
        model.mark_blocks_as_accessed([i], t)
    for i in order:
        model.free(blocks[i])
    taken = model.allocate_mutable_block(None).block_id
    return -1 if taken is None else taken


# ==========================================================================
# the hit rate


def _model_rate(bucket_hits: Sequence[int], open_hits: int, open_queries: int) -> float:
    model = Model(num_blocks=0, block_size=1)
    hits = sum(bucket_hits) + open_hits
    model._hits = hits
    model._misses = len(bucket_hits) * MODEL_BUCKET + open_queries - hits
    model._buckets = list(bucket_hits)
    return model.get_prefix_cache_hit_rate()


def _rate_agrees(bucket_hits: Sequence[int], open_hits: int, open_queries: int,
                 result: float) -> bool:
    hits = sum(bucket_hits) + open_hits
    misses = len(bucket_hits) * MODEL_BUCKET + open_queries - hits
    return (P.close(result, P.hit_rate(hits, misses))
            and result == P.bucketed_hit_rate(bucket_hits, open_hits, open_queries,
                                              MODEL_BUCKET))


@_require(lambda bucket_hits: P.every(lambda h: 0 <= h <= MODEL_BUCKET, bucket_hits),
          "each completed bucket counts at most a bucket of hits")
@_require(lambda open_hits, open_queries: 0 <= open_hits <= open_queries < MODEL_BUCKET,
          "the open bucket is not full")
@_bound(lambda bucket_hits: P.small(len(bucket_hits)), "a few buckets")
@_ensure(lambda bucket_hits, open_hits, open_queries, result:
         _rate_agrees(bucket_hits, open_hits, open_queries, result),
         "the model's bucketed hit rate equals hits over queries, and bucketed_hit_rate "
         "bit for bit")
def model_hit_rate_agrees(bucket_hits: Tuple[int, ...], open_hits: int,
                          open_queries: int) -> float:
    """Return the model's ``get_prefix_cache_hit_rate`` after completed
    buckets of 1000 queries with ``bucket_hits`` hits each, then
    ``open_queries`` queries of which ``open_hits`` hit."""
    return _model_rate(bucket_hits, open_hits, open_queries)


__all__ = [
    "MODEL_BUCKET",
    "model_eviction_agrees",
    "model_hit_rate_agrees",
    "model_keys_agree",
    "model_prefix_search_agrees",
]
