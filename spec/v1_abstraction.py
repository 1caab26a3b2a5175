"""The abstraction function of the v1 pool: a :class:`~.v1_state.V1State`
read out of a real vLLM v1 ``BlockPool`` (the internals of the pinned
releases, 0.28.0 to 0.34.0).

It reads, and never changes: ``pool.blocks`` (each ``KVCacheBlock``'s
``ref_cnt``, ``block_hash``, ``block_hash_num_tokens``; the null block's
count reads as 0: the pool does not maintain it, and before 0.33.0 it counts
touches and frees of the null block that nothing reads), the free queue's
linked list from its fake head, ``free_block_queue.num_free_blocks``, the
hash map's ``_cache``, ``cached_block_hashes_by_block`` and ``null_block``.
The hash map has two shapes: 0.34.0's ``_cache`` maps a key to the id a
lookup returns and ``_dup_ids`` holds the ordered ids of keys cached more
than once; before, ``_cache`` maps a key to its one block, or to a dict of
its blocks by id in insertion order, whose first a lookup returns.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

from .v1_state import BlockHash, BlockId, CacheKey, HashedContent, V1State, unpack_key


def free_queue_ids(queue: Any, limit: int, backward: bool = False) -> Tuple[BlockId, ...]:
    """The ids of the free queue ``queue``, front first, read by following
    ``next_free_block`` from its fake head to its fake tail (``backward``:
    ``prev_free_block`` from its fake tail to its fake head, then reversed);
    at most ``limit`` + 1 of them (a corrupted, cyclic list then shows a
    repeated id)."""
    start, stop = queue.fake_free_list_head, queue.fake_free_list_tail
    if backward:
        start, stop = stop, start
    link = "prev_free_block" if backward else "next_free_block"
    out: List[BlockId] = []
    block = getattr(start, link)
    while block is not None and block is not stop and len(out) <= limit:
        out.append(block.block_id)
        block = getattr(block, link)
    return tuple(reversed(out)) if backward else tuple(out)


def cached_ids(hash_map: Any) -> Tuple[Dict[CacheKey, Tuple[BlockId, ...]],
                                        Dict[CacheKey, BlockId]]:
    """(key -> the ids cached under it, in order; key -> the id a lookup
    returns) of the pool's hash map ``hash_map``, of either shape."""
    if not hasattr(hash_map, "_dup_ids"):  # before 0.34.0: a block, or a dict of blocks by id
        cached: Dict[CacheKey, Tuple[BlockId, ...]] = {}
        lookup: Dict[CacheKey, BlockId] = {}
        for packed, value in hash_map._cache.items():
            key = unpack_key(packed)
            if isinstance(value, dict):
                cached[key] = tuple(value)
                lookup[key] = next(iter(value.values())).block_id
            else:
                cached[key], lookup[key] = (value.block_id,), value.block_id
        return cached, lookup
    dups: Dict[CacheKey, Tuple[BlockId, ...]] = {
        unpack_key(packed): tuple(ids) for packed, ids in hash_map._dup_ids.items()}
    lookup = {unpack_key(packed): i for packed, i in hash_map._cache.items()}
    cached = {key: dups.get(key, (i,)) for key, i in lookup.items()}
    for key, ids in dups.items():
        cached.setdefault(key, ids)
    return cached, lookup


def abstract_v1(pool: Any, contents: Optional[Mapping[BlockHash, HashedContent]] = None,
                block_size: int = 0) -> V1State:
    """The abstract state of the v1 ``BlockPool`` ``pool``; ``contents`` (block
    hash -> what it was computed from) and ``block_size`` as the caller knows
    them.  Reads only."""
    blocks = pool.blocks
    null = pool.null_block.block_id
    cached, lookup = cached_ids(pool.cached_block_hash_to_block)
    return V1State(
        num_blocks=len(blocks),
        null_block=null,
        ref_cnt=tuple(0 if i == null else b.ref_cnt for i, b in enumerate(blocks)),
        free_queue=free_queue_ids(pool.free_block_queue, len(blocks)),
        queue_backward=free_queue_ids(pool.free_block_queue, len(blocks), backward=True),
        reported_free=pool.get_num_free_blocks(),
        cached=cached,
        lookup=lookup,
        block_keys={b.block_id: (unpack_key(b.block_hash), b.block_hash_num_tokens)
                    for b in blocks if b.block_hash is not None},
        secondary={i: frozenset(unpack_key(k) for k in keys)
                   for i, keys in pool.cached_block_hashes_by_block.items() if keys},
        contents=dict(contents or {}),
        block_size=block_size,
    )
