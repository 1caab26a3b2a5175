"""prefixcache.impl.prefix_caching_block: the prefix-caching allocator, its
Block, BlockTracker, ComputedBlocksTracker and LastAccessBlocksTracker.

Every id, hash, evictor entry, tracker field and metric below is worked out
from vLLM 0.8.5's documented behaviour (SPEC.md; its stricter rules where
prefixcache is stricter); rejected calls are checked with the shared snapshot helper."""

from __future__ import annotations

from typing import List, Optional, Tuple
from unittest.mock import MagicMock

import pytest
from helpers.impl_snapshot import (
    check_still_works,
    expect_rejected,
    freed_or_unchanged,
    next_id,
    snapshot,
)
from helpers.recursion import recursion_limit
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixcache.impl import errors as err
from prefixcache.impl import prefix_caching_block as pcb
from prefixcache.impl.common import CacheMetricData
from prefixcache.impl.cpu_gpu_block_allocator import CpuGpuBlockAllocator
from prefixcache.impl.evictor import EvictionPolicy, LRUEvictor
from prefixcache.impl.hashing import builtin_hash, sha256_hash
from prefixcache.impl.interfaces import Block, BlockAllocator, Device
from prefixcache.impl.naive_block import NaiveBlock, NaiveBlockAllocator
from prefixcache.impl.prefix_caching_block import (
    _DEFAULT_LAST_ACCESSED_TIME,
    BlockTracker,
    ComputedBlocksTracker,
    LastAccessBlocksTracker,
    PrefixCachingBlock,
    PrefixCachingBlockAllocator,
    assert_prefix_caching_block_or_none,
)
from prefixcache.spec.contracts import common_computed_prefix

H = PrefixCachingBlock.hash_block_tokens
NONE_HASH = hash("None")
NoFree = BlockAllocator.NoFreeBlocksError


def make(num_blocks: int = 4, block_size: int = 2, **kwargs: object) -> PrefixCachingBlockAllocator:
    return PrefixCachingBlockAllocator(num_blocks=num_blocks, block_size=block_size,
                                       **kwargs)  # type: ignore[arg-type]


def tracker_of(a: PrefixCachingBlockAllocator, block_id: int) -> tuple:
    t = a._block_tracker[block_id]
    return (t.active, t.last_accessed, t.computed)


IDLE = (False, -1, False)


def metric(a: PrefixCachingBlockAllocator) -> tuple:
    m = a.metric_data
    return (m.num_incompleted_block_queries, m.num_incompleted_block_hit)


def evictor_entries(a: PrefixCachingBlockAllocator) -> list:
    return snapshot(a)["evictor_free_table"]


# --------------------------------------------------------------------------
# BlockTracker


def test_block_tracker_life_cycle() -> None:
    t = BlockTracker()
    assert (t.active, t.last_accessed, t.computed, t.held) == (False, -1, False, None)
    assert _DEFAULT_LAST_ACCESSED_TIME == -1
    t.enable()
    assert (t.active, t.last_accessed, t.computed, t.held) == (True, -1, False, None)
    t.last_accessed, t.computed = 5.0, True
    with pytest.raises(err.InvalidArgumentError):
        t.enable()
    assert (t.active, t.last_accessed, t.computed) == (True, 5.0, True)
    t.reset()
    assert (t.active, t.last_accessed, t.computed) == (True, -1, False)
    t.last_accessed, t.computed, t.held = 6.0, True, 7
    t.disable()
    assert (t.active, t.last_accessed, t.computed, t.held) == (False, -1, False, None)
    with pytest.raises(err.InvalidArgumentError):
        t.disable()
    with pytest.raises(AssertionError):
        t.disable()
    assert t.active is False
    with pytest.raises(AttributeError):
        t.other = 1  # type: ignore[attr-defined]


# --------------------------------------------------------------------------
# construction


def test_construction_state() -> None:
    a = make(3, 2)
    s = snapshot(a)
    assert s["free"] == [0, 1, 2]
    assert s["refcounts"] == {0: 0, 1: 0, 2: 0}
    assert s["cached"] == [] and s["touched"] == set()
    assert s["trackers"] == {0: IDLE, 1: IDLE, 2: IDLE}
    assert s["evictor_free_table"] == [] and s["cows"] == []
    assert s["metric"] == {"num_completed_blocks": 0, "completed_block_cache_hit_rate": 0.0,
                           "num_incompleted_block_queries": 0, "num_incompleted_block_hit": 0,
                           "block_size": 1000}
    assert a.eviction_policy is EvictionPolicy.LRU
    assert isinstance(a.evictor, LRUEvictor)
    assert isinstance(a._hashless_allocator, NaiveBlockAllocator)
    assert a._hashless_allocator._block_pool is a._block_pool
    assert a._refcounter is a._hashless_allocator.refcounter
    assert a._block_pool.pool_size == 12
    assert PrefixCachingBlockAllocator._none_hash == NONE_HASH
    assert a.content_hash_function is builtin_hash
    assert a.get_num_total_blocks() == 3 and a.get_num_free_blocks() == 3
    assert a.all_block_ids == frozenset({0, 1, 2})
    assert a.get_prefix_cache_hit_rate() == 0.0


def test_construction_with_ids_and_hash_algo() -> None:
    a = make(3, 2, block_ids=[9, 4, 6], hash_algo="sha256")
    assert snapshot(a)["free"] == [9, 4, 6]
    assert list(a._block_tracker) == [9, 4, 6]  # one tracker per id, from the start
    with pytest.raises(KeyError):
        a._block_tracker[5]
    assert a.content_hash_function is sha256_hash
    assert a.allocate_mutable_block(None).block_id == 9


def test_every_id_has_its_own_idle_tracker_from_construction() -> None:
    """vLLM makes a BlockTracker per id up front, and its tests count them
    (``len(allocator._block_tracker.keys()) == num_blocks``): so do we.  The
    set of trackers never changes, and an id's tracker is the same object
    through its life (active while the id is in use)."""
    a = make(3, 2)
    trackers = dict(a._block_tracker)
    assert len(a._block_tracker.keys()) == 3 and set(trackers) == {0, 1, 2}
    assert len({id(tracker) for tracker in trackers.values()}) == 3
    assert [tracker_of(a, block_id) for block_id in range(3)] == [IDLE] * 3
    blocks = [a.allocate_immutable_block(None, [i, i]) for i in range(3)]
    assert [a._block_tracker[block_id].active for block_id in range(3)] == [True] * 3
    for block in blocks:
        a.free(block)
    a.allocate_mutable_block(None)  # evicts id 0
    assert a._block_tracker == trackers and len(a._block_tracker.keys()) == 3
    assert all(a._block_tracker[i] is trackers[i] for i in range(3))
    assert [tracker_of(a, block_id) for block_id in (1, 2)] == [IDLE] * 2
    assert a._block_tracker[0].active


@pytest.mark.parametrize("kwargs", [
    dict(num_blocks=3, block_size=2, block_ids=[0, 1, 1]),
    dict(num_blocks=3, block_size=2, block_ids=[0, 1]),
    dict(num_blocks=2, block_size=2, block_ids=[0, 1, 2]),
    dict(num_blocks=-2, block_size=2),
    dict(num_blocks=2, block_size=0),
    dict(num_blocks="2", block_size=2),
    dict(num_blocks=2, block_size=2, eviction_policy="LRU"),
    dict(num_blocks=2, block_size=2, hash_algo="md5"),
    dict(num_blocks=2, block_size=2, hash_algo=5),
])
def test_bad_constructor_arguments(kwargs: dict) -> None:
    with pytest.raises(err.InvalidArgumentError):
        PrefixCachingBlockAllocator(**kwargs)
    with pytest.raises(AssertionError):
        PrefixCachingBlockAllocator(**kwargs)


# --------------------------------------------------------------------------
# mutable allocation


def test_mutable_blocks_take_ids_in_order() -> None:
    a = make(3, 2)
    first = a.allocate_mutable_block(None)
    second = a.allocate_mutable_block(first, extra_hash=7)
    assert isinstance(first, PrefixCachingBlock)
    assert (first.block_id, second.block_id) == (0, 1)
    assert second.prev_block is first and second.extra_hash == 7
    assert first.computed is False and first.content_hash is None and first.token_ids == []
    assert tracker_of(a, 0) == (True, -1, False)
    assert snapshot(a)["refcounts"] == {0: 1, 1: 1, 2: 0}
    assert a.get_num_free_blocks() == 1
    assert a._cached_blocks == {}


def test_mutable_allocation_with_nothing_free_or_evictable() -> None:
    a = make(2, 2)
    blocks = [a.allocate_mutable_block(None) for _ in range(2)]
    expect_rejected(a, NoFree, lambda: a.allocate_mutable_block(None), blocks=blocks)
    expect_rejected(a, ValueError, lambda: a.allocate_mutable_block(blocks[1]), blocks=blocks)


def test_mutable_allocation_evicts_when_no_id_is_free() -> None:
    a = make(2, 2)
    x = a.allocate_immutable_block(None, [1, 2])
    y = a.allocate_immutable_block(x, [3, 4])
    hx, hy = x.content_hash, y.content_hash
    a.free(y)
    a.free(x)
    # both at -1: the deeper block (4 hashed tokens) goes first
    assert snapshot(a)["evictor_evict_order"] == [1, 0]
    b = a.allocate_mutable_block(None)
    assert b.block_id == 1
    assert a._cached_blocks == {hx: 0}
    assert hy not in a._cached_blocks
    assert a._touched_blocks == {0}  # 1 left the touched set with its content
    assert tracker_of(a, 1) == (True, -1, False)
    assert snapshot(a)["refcounts"] == {0: 0, 1: 1}
    assert a.get_num_free_blocks() == 1


@pytest.mark.parametrize("call", [
    lambda a: a.allocate_mutable_block(None, device=Device.GPU),
    lambda a: a.allocate_immutable_block(None, [1, 2], device=Device.CPU),
    lambda a: a.allocate_immutable_blocks(None, [[1, 2]], device=Device.GPU),
    lambda a: a.get_num_free_blocks(device=Device.GPU),
])
def test_device_must_be_none(call) -> None:  # type: ignore[no-untyped-def]
    a = make(3, 2)
    a.allocate_immutable_block(None, [5, 6])
    expect_rejected(a, err.InvalidArgumentError, lambda: call(a))


def test_allocation_argument_errors_change_nothing() -> None:
    a = make(4, 2)
    full = a.allocate_immutable_block(None, [1, 2])
    part = a.allocate_mutable_block(full)
    part.append_token_ids([3])
    naive_block = NaiveBlock(None, [1, 2], 2, MagicMock(), block_id=0)
    cases = [
        (err.WrongTypeError, lambda: a.allocate_mutable_block(naive_block)),
        (err.WrongTypeError, lambda: a.allocate_mutable_block("prev")),
        (err.WrongTypeError, lambda: a.allocate_mutable_block(None, extra_hash="lora")),
        (err.WrongTypeError, lambda: a.allocate_immutable_block(None, [1, 2.0])),
        (err.WrongTypeError, lambda: a.allocate_immutable_block(None, (1, True))),
        (err.WrongTypeError, lambda: a.allocate_immutable_block(None, None)),
        (err.WrongTypeError, lambda: a.allocate_immutable_block(naive_block, [1, 2])),
        (err.WrongTypeError, lambda: a.allocate_immutable_block(None, [1, 2], extra_hash=1.5)),
        (err.BlockFullError, lambda: a.allocate_immutable_block(None, [1, 2, 3])),
        (err.UnhashableBlockError, lambda: a.allocate_immutable_block(None, [1])),
        (err.UnhashableBlockError, lambda: a.allocate_immutable_block(None, [])),
        (err.UnhashableBlockError, lambda: a.allocate_immutable_block(part, [4, 5])),
        (err.UnhashableBlockError, lambda: a.allocate_immutable_blocks(None, [[1, 2], [3]])),
        (err.UnhashableBlockError, lambda: a.allocate_immutable_blocks(part, [[1, 2]])),
        (err.BlockFullError, lambda: a.allocate_immutable_blocks(full, [[3, 4], [5, 6, 7]])),
        (err.WrongTypeError, lambda: a.allocate_immutable_blocks(full, [[3, 4], ["x", 6]])),
    ]
    for exc_type, call in cases:
        expect_rejected(a, exc_type, call, blocks=[full, part])
    assert metric(a) == (1, 0)


# --------------------------------------------------------------------------
# immutable allocation: hits and misses


def test_immutable_miss_then_hit_in_use() -> None:
    a = make(4, 2)
    first = a.allocate_immutable_block(None, [1, 2])
    h1 = H(True, None, [1, 2])
    assert (first.block_id, first.content_hash, first.computed) == (0, h1, False)
    assert a._cached_blocks == {h1: 0}
    assert a._touched_blocks == {0}
    assert tracker_of(a, 0) == (True, -1, False)
    assert metric(a) == (1, 0)
    again = a.allocate_immutable_block(None, [1, 2])
    assert again is not first
    assert (again.block_id, again.computed) == (0, True)
    assert snapshot(a)["refcounts"] == {0: 2, 1: 0, 2: 0, 3: 0}
    assert tracker_of(a, 0) == (True, -1, False)  # a hit in use leaves the tracker alone
    assert metric(a) == (2, 1)
    assert a.get_prefix_cache_hit_rate() == 0.5
    assert a.get_num_free_blocks() == 3


def test_immutable_chain_hashes_and_num_tokens_total() -> None:
    a = make(4, 2)
    chain = a.allocate_immutable_blocks(None, [[1, 2], [3, 4], [5, 6]], extra_hash=3)
    h1 = H(True, None, [1, 2], 3)
    h2 = H(False, h1, [3, 4], 3)
    h3 = H(False, h2, [5, 6], 3)
    assert [b.content_hash for b in chain] == [h1, h2, h3]
    assert [b.block_id for b in chain] == [0, 1, 2]
    assert [b.num_tokens_total for b in chain] == [2, 4, 6]
    assert chain[2].prev_block is chain[1] and chain[0].prev_block is None
    assert list(a._cached_blocks.items()) == [(h1, 0), (h2, 1), (h3, 2)]
    assert a._touched_blocks == {0, 1, 2}
    tail = a.allocate_immutable_block(chain[-1], [7, 8], extra_hash=3)
    assert tail.content_hash == H(False, h3, [7, 8], 3)
    assert tail.num_tokens_total == 8
    assert metric(a) == (4, 0)


def test_immutable_hit_on_an_evictable_id_revives_it() -> None:
    a = make(3, 2)
    b = a.allocate_immutable_block(None, [1, 2])
    a.mark_blocks_as_computed([])
    a.mark_blocks_as_accessed([0], 4.0)
    a.free(b)
    h = H(True, None, [1, 2])
    assert evictor_entries(a) == [(0, h, 2, 4.0)]
    assert tracker_of(a, 0) == IDLE
    assert a.get_num_free_blocks() == 3
    assert a.block_is_computed(0) is True
    hit = a.allocate_immutable_block(None, [1, 2])
    assert (hit.block_id, hit.computed) == (0, True)
    assert evictor_entries(a) == []
    assert tracker_of(a, 0) == (True, -1, True)  # last_accessed back to -1
    assert snapshot(a)["refcounts"] == {0: 1, 1: 0, 2: 0}
    assert a.get_num_free_blocks() == 2
    assert metric(a) == (2, 1)


def test_revived_touched_block_is_not_computed_until_marked() -> None:
    # promoted, freed before mark_blocks_as_computed, then hit again: its KV
    # is still not known to be computed (section 8: find_cached_blocks_prefix
    # counts only computed blocks)
    a = make(3, 2)
    b = a.allocate_immutable_block(None, [1, 2])
    h = b.content_hash
    a.free(b)
    assert a.block_is_computed(0) is False
    assert a.find_cached_blocks_prefix([h]) == []
    hit = a.allocate_immutable_block(None, [1, 2])
    assert hit.block_id == 0
    assert tracker_of(a, 0) == (True, -1, False)
    assert a.find_cached_blocks_prefix([h]) == []
    a.mark_blocks_as_computed([])
    assert tracker_of(a, 0) == (True, -1, True)
    assert a.find_cached_blocks_prefix([h]) == [h]


def test_immutable_miss_without_a_free_id() -> None:
    a = make(2, 2)
    cached = a.allocate_immutable_block(None, [1, 2])
    other = a.allocate_mutable_block(None)
    expect_rejected(a, NoFree, lambda: a.allocate_immutable_block(None, [3, 4]),
                    blocks=[cached, other])
    expect_rejected(a, NoFree, lambda: a.allocate_immutable_block(cached, [3, 4]))
    assert metric(a) == (1, 0)
    # a hit on an id in use needs no free id
    hit = a.allocate_immutable_block(None, [1, 2])
    assert hit.block_id == 0 and metric(a) == (2, 1)


def test_immutable_blocks_running_out_half_way_take_nothing() -> None:
    a = make(4, 2)
    chain = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]])
    lists = [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10]]
    expect_rejected(a, NoFree, lambda: a.allocate_immutable_blocks(None, lists), blocks=chain)
    assert metric(a) == (2, 0)
    got = a.allocate_immutable_blocks(None, lists[:4])
    assert [b.block_id for b in got] == [0, 1, 2, 3]
    assert [b.computed for b in got] == [True, True, False, False]
    assert metric(a) == (6, 2)
    assert snapshot(a)["refcounts"] == {0: 2, 1: 2, 2: 1, 3: 1}


def test_immutable_blocks_count_revived_hits_in_their_demand() -> None:
    a = make(3, 2)
    chain = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]])
    blocker = a.allocate_mutable_block(None)
    a.free(chain[1])
    a.free(chain[0])
    assert blocker.block_id == 2 and snapshot(a)["free"] == []
    # two hits that revive evictable ids and one miss: 3 ids needed, 2 evictable
    lists = [[1, 2], [3, 4], [5, 6]]
    expect_rejected(a, NoFree, lambda: a.allocate_immutable_blocks(None, lists),
                    blocks=[blocker])
    got = a.allocate_immutable_blocks(None, lists[:2])
    assert [b.block_id for b in got] == [0, 1]
    assert a.get_num_free_blocks() == 0


# --------------------------------------------------------------------------
# promotion


def test_append_to_full_promotes_new_content() -> None:
    a = make(4, 2)
    b = a.allocate_mutable_block(None)
    b.append_token_ids([1])
    assert b.content_hash is None and a._cached_blocks == {}
    b.append_token_ids([2])
    h = H(True, None, [1, 2])
    assert (b.block_id, b.content_hash, b.computed) == (0, h, False)
    assert a._cached_blocks == {h: 0} and a._touched_blocks == {0}
    assert metric(a) == (0, 0)  # a promotion is not a query


def test_promotion_of_duplicate_content_moves_to_the_cached_id() -> None:
    a = make(4, 2)
    original = a.allocate_immutable_block(None, [1, 2])
    dup = a.allocate_mutable_block(None)
    assert dup.block_id == 1
    dup.append_token_ids([1, 2])
    assert (dup.block_id, dup.computed) == (0, True)
    assert snapshot(a)["free"] == [1, 2, 3]  # the old id back on the left
    assert snapshot(a)["refcounts"] == {0: 2, 1: 0, 2: 0, 3: 0}
    assert tracker_of(a, 1) == IDLE
    assert metric(a) == (1, 0)
    assert original.block_id == 0


def test_promotion_of_duplicate_content_revives_an_evictable_id() -> None:
    a = make(3, 2)
    original = a.allocate_immutable_block(None, [1, 2])
    a.mark_blocks_as_computed([])
    a.free(original)
    dup = a.allocate_mutable_block(None)
    assert dup.block_id == 1
    dup.append_token_ids([1, 2])
    assert dup.block_id == 0
    assert evictor_entries(a) == []
    assert tracker_of(a, 0) == (True, -1, True)
    assert snapshot(a)["free"] == [1, 2]
    assert a.get_num_free_blocks() == 2


def test_promote_directly() -> None:
    a = make(4, 2)
    b = a.allocate_mutable_block(None)
    b._token_ids.extend([5, 6])  # filled behind the allocator's back, not promoted yet
    b._num_tokens_total = 2
    assert a.promote_to_immutable_block(b) == 0
    assert a._cached_blocks == {H(True, None, [5, 6]): 0}
    assert a._touched_blocks == {0}


def test_promote_directly_onto_cached_content_moves_the_block() -> None:
    a = make(4, 2)
    cached = a.allocate_immutable_block(None, [5, 6])
    b = a.allocate_mutable_block(None)
    b._token_ids.extend([5, 6])  # filled behind the allocator's back, not promoted yet
    b._num_tokens_total = 2
    assert a.promote_to_immutable_block(b) == cached.block_id == 0
    assert (b.block_id, b.computed) == (0, True)  # the Block itself moved, not only the answer
    state = snapshot(a)
    assert state["refcounts"][0] == 2 and state["free"] == [1, 2, 3]


def test_free_of_a_block_the_pool_does_not_hold() -> None:
    """A Block the caller built on an id in use is this allocator's (its
    allocator and id say so): free drops the reference it stands for and
    leaves the pool alone, whatever ``pool_id`` it carries."""
    a = make(4, 2)
    held = [a.allocate_mutable_block(None) for _ in range(3)]
    pool_before = snapshot(a)["pool"]
    for pool_id in (None, len(a._block_pool._pool), 0):
        stranger = PrefixCachingBlock(None, [], 2, a, block_id=held[0].block_id)
        if pool_id is not None:
            stranger.pool_id = pool_id  # another pool's slot, or a slot of another object
        a._refcounts[held[0].block_id] += 1  # the reference the stranger stands for
        a.free(stranger)
        assert stranger.block_id is None
        assert snapshot(a)["pool"] == pool_before
        assert a._refcounts[held[0].block_id] == 1
    a.free(held[0])
    assert snapshot(a)["free"] == [0, 3]


def test_a_reused_block_object_starts_afresh() -> None:
    a = make(4, 2)
    b = a.allocate_mutable_block(None)
    b.append_token_ids([1])
    b.last_accessed, b.computed = 7.0, True
    a.free(b)
    again = a.allocate_mutable_block(None)
    assert again is b  # the pool's object, re-initialised in place
    assert (again.last_accessed, again.computed, again.token_ids) == (-1, False, [])


def test_promote_errors_change_nothing() -> None:
    a, other = make(4, 2), make(4, 2)
    full = a.allocate_immutable_block(None, [1, 2])
    part = a.allocate_mutable_block(None)
    part.append_token_ids([3])
    loose = a.allocate_mutable_block(None)
    a.free(loose, keep_block_object=True)
    theirs = other.allocate_mutable_block(None)
    blocks = [full, part]
    expect_rejected(a, err.ImmutableBlockError, lambda: a.promote_to_immutable_block(full),
                    blocks=blocks)
    expect_rejected(a, err.UnhashableBlockError, lambda: a.promote_to_immutable_block(part),
                    blocks=blocks)
    expect_rejected(a, err.DetachedBlockError, lambda: a.promote_to_immutable_block(loose),
                    blocks=blocks)
    expect_rejected(a, err.ForeignBlockError, lambda: a.promote_to_immutable_block(theirs),
                    blocks=blocks)
    expect_rejected(a, err.WrongTypeError, lambda: a.promote_to_immutable_block("b"),
                    blocks=blocks)


# --------------------------------------------------------------------------
# copy-on-write


def test_cow_of_a_forked_mutable_block() -> None:
    a = make(4, 4)
    b = a.allocate_mutable_block(None)
    b.append_token_ids([1])
    (f,) = a.fork(b)
    assert a.cow_block_if_not_appendable(b) == 1
    assert (b.block_id, f.block_id) == (1, 0)
    assert snapshot(a)["refcounts"] == {0: 1, 1: 1, 2: 0, 3: 0}
    assert tracker_of(a, 0) == (True, -1, False) and tracker_of(a, 1) == (True, -1, False)
    assert a.cow_block_if_not_appendable(f) == 0  # now unshared
    f.append_token_ids([2])
    (g,) = a.fork(f)
    g.append_token_ids([3])
    assert (f.token_ids, g.token_ids, g.block_id) == ([1, 2], [1, 2, 3], 2)
    assert a.clear_copy_on_writes() == [(0, 1), (0, 2)]
    assert a.clear_copy_on_writes() == []


def test_cow_can_evict() -> None:
    a = make(2, 2)
    cached = a.allocate_immutable_block(None, [7, 8])
    a.free(cached)
    b = a.allocate_mutable_block(None)
    b.append_token_ids([1])
    (f,) = a.fork(b)
    assert snapshot(a)["free"] == [] and a.get_num_free_blocks() == 1
    f.append_token_ids([2])
    assert f.block_id == 0 and b.block_id == 1
    assert a._cached_blocks == {H(True, None, [1, 2]): 0}
    assert a.clear_copy_on_writes() == [(1, 0)]


def test_cow_without_a_free_id_changes_nothing() -> None:
    a = make(2, 2)
    b = a.allocate_mutable_block(None)
    b.append_token_ids([1])
    (f,) = a.fork(b)
    a.allocate_mutable_block(None)
    expect_rejected(a, NoFree, lambda: a.cow_block_if_not_appendable(f), blocks=[b, f])
    expect_rejected(a, NoFree, lambda: f.append_token_ids([2]), blocks=[b, f])
    assert (f.block_id, f.token_ids, f.num_tokens_total) == (0, [1], 1)


def test_cow_errors_change_nothing() -> None:
    a = make(4, 2)
    full = a.allocate_immutable_block(None, [1, 2])
    (shared,) = a.fork(full)
    expect_rejected(a, err.ImmutableBlockError, lambda: a.cow_block_if_not_appendable(full),
                    blocks=[full, shared])
    loose = a.allocate_mutable_block(None)
    a.free(loose, keep_block_object=True)
    expect_rejected(a, err.DetachedBlockError, lambda: a.cow_block_if_not_appendable(loose))
    a.free(shared)
    assert a.cow_block_if_not_appendable(full) == 0  # sole reference: no copy needed


def test_copy_on_write_of_a_block_of_another_allocator_on_a_sole_id_is_refused() -> None:
    a, other = make(3, 2), make(3, 2)
    mine = a.allocate_mutable_block(None)
    theirs = other.allocate_mutable_block(None)
    assert theirs.block_id == mine.block_id  # the id holds one reference in ``a``
    expect_rejected(a, err.ForeignBlockError, lambda: a.cow_block_if_not_appendable(theirs),
                    blocks=[mine])


# --------------------------------------------------------------------------
# free


def test_free_of_a_hashed_block_makes_it_evictable_and_keeps_it_cached() -> None:
    a = make(3, 2)
    chain = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]])
    h1, h2 = chain[0].content_hash, chain[1].content_hash
    (f0, f1) = a.fork(chain[1])
    a.free(chain[1])
    assert snapshot(a)["refcounts"] == {0: 2, 1: 1, 2: 0}
    assert evictor_entries(a) == [] and chain[1].block_id is None
    a.mark_blocks_as_accessed([1], 3.0)
    a.free(f1)
    assert evictor_entries(a) == [(1, h2, 4, 3.0)]
    assert tracker_of(a, 1) == IDLE
    assert list(a._cached_blocks.items()) == [(h1, 0), (h2, 1)]
    assert a.get_num_free_blocks() == 2
    assert snapshot(a)["free"] == [2]


def test_free_of_a_mutable_block_returns_the_id_on_the_left() -> None:
    a = make(3, 2)
    x = a.allocate_mutable_block(None)
    y = a.allocate_mutable_block(None)
    x.append_token_ids([1])
    a.free(y)
    a.free(x)
    assert snapshot(a)["free"] == [0, 1, 2]
    assert tracker_of(a, 0) == IDLE
    assert a.allocate_mutable_block(None) is x  # the pool is LIFO too


def test_free_keep_block_object() -> None:
    a = make(2, 2)
    b = a.allocate_immutable_block(None, [1, 2])
    pool_before = snapshot(a)["pool"]
    a.free(b, keep_block_object=True)
    assert b.block_id is None and b.token_ids == [1, 2]
    assert snapshot(a)["pool"] == pool_before


def test_free_errors_change_nothing() -> None:
    a, other = make(3, 2), make(3, 2)
    b = a.allocate_immutable_block(None, [1, 2])
    m = a.allocate_mutable_block(None)
    theirs = other.allocate_immutable_block(None, [1, 2])
    a.free(m, keep_block_object=True)
    blocks = [b, m]
    expect_rejected(a, err.DetachedBlockError, lambda: a.free(m), blocks=blocks)
    m.block_id = 1  # a Block claiming an id it no longer references
    expect_rejected(a, err.RefCountError, lambda: a.free(m), blocks=blocks)
    m.block_id = 42
    expect_rejected(a, err.UnknownBlockIdError, lambda: a.free(m), blocks=blocks)
    m.block_id = None
    expect_rejected(a, err.ForeignBlockError, lambda: a.free(theirs), blocks=blocks)
    naive = NaiveBlockAllocator(NaiveBlock, 3, 2)
    expect_rejected(a, err.WrongTypeError, lambda: a.free(naive.allocate_mutable_block(None)))
    expect_rejected(a, err.WrongTypeError, lambda: a.free(None))  # type: ignore[arg-type]
    assert snapshot(other)["refcounts"] == {0: 1, 1: 0, 2: 0}


# --------------------------------------------------------------------------
# fork


def test_fork_shares_ids_and_copies_extra_hash() -> None:
    a = make(4, 2)
    chain = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]], extra_hash=5)
    tail = a.allocate_mutable_block(chain[-1], extra_hash=5)
    tail.append_token_ids([9])
    a.mark_blocks_as_computed([])
    forked = a.fork(tail)
    assert [b.block_id for b in forked] == [0, 1, 2]
    assert [b.token_ids for b in forked] == [[1, 2], [3, 4], [9]]
    assert [b.extra_hash for b in forked] == [5, 5, 5]
    assert [b.computed for b in forked] == [False, False, False]
    assert [b.content_hash for b in forked] == [chain[0].content_hash, chain[1].content_hash,
                                                None]
    assert [b.num_tokens_total for b in forked] == [2, 4, 5]
    assert forked[1].prev_block is forked[0] and forked[2].prev_block is forked[1]
    assert forked[2].token_ids is not tail.token_ids
    assert snapshot(a)["refcounts"] == {0: 2, 1: 2, 2: 2, 3: 0}
    forked[2].append_token_ids([10])  # CoW, then promotion of the new content
    assert forked[2].block_id == 3
    assert a.clear_copy_on_writes() == [(2, 3)]
    assert a._cached_blocks[forked[2].content_hash] == 3


def test_fork_errors_change_nothing() -> None:
    a = make(4, 2)
    chain = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]])
    a.free(chain[0], keep_block_object=True)
    expect_rejected(a, err.DetachedBlockError, lambda: a.fork(chain[1]), blocks=chain)
    other = make(4, 2)
    theirs = other.allocate_mutable_block(None)
    expect_rejected(a, err.ForeignBlockError, lambda: a.fork(theirs))
    naive = NaiveBlockAllocator(NaiveBlock, 2, 2)
    expect_rejected(a, err.WrongTypeError, lambda: a.fork(naive.allocate_mutable_block(None)))


def test_fork_of_a_100k_chain_at_recursion_limit_1000() -> None:
    n = 100_000
    a = make(n, 1)
    last: Optional[Block] = None
    chain: List[Block] = []
    for _ in range(n):  # mutable blocks: no hashing needed to build the chain
        last = a.allocate_mutable_block(last)
        chain.append(last)
    with recursion_limit(1000):
        forked = a.fork(chain[-1])
        assert chain[-1].content_hash is None
    assert len(forked) == n
    assert forked[-1].block_id == n - 1 and forked[-1].prev_block is forked[-2]
    assert a._refcounts[0] == 2 and a._refcounts[n - 1] == 2


def test_content_hash_of_a_100k_chain_at_recursion_limit_1000() -> None:
    n = 100_000
    a = make(4, 1)
    last: Optional[PrefixCachingBlock] = None
    for i in range(n):  # detached blocks: the hash is computed lazily, at the end
        last = PrefixCachingBlock(last, [i], 1, a)
    assert last is not None
    with recursion_limit(1000):
        value = last.content_hash
    expected: Optional[int] = None
    for i in range(n):
        expected = builtin_hash(expected, [i], None)
    assert value == expected
    assert last.num_tokens_total == n


# --------------------------------------------------------------------------
# counts and lookups


def test_get_physical_block_id_on_shuffled_ids() -> None:
    ids = [31, 7, 19, 2, 44, 11]
    a = make(6, 2, block_ids=ids)
    assert [a.get_physical_block_id(i) for i in ids] == [4, 1, 3, 0, 5, 2]
    for unknown in (0, 45, None):
        expect_rejected(a, err.UnknownBlockIdError, lambda u=unknown: a.get_physical_block_id(u))


def test_free_count_is_exact_after_anything() -> None:
    a = make(5, 2)
    x = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]])
    y = a.allocate_mutable_block(None)
    a.fork(x[-1])
    a.free(x[1])
    a.free(y)
    a.free(x[0])
    a.mark_blocks_as_accessed([0], 2.0)
    n = a.get_num_free_blocks()
    assert n == 3  # 0 is still referenced by the fork; 1 is shared; 2,3,4 free or evictable
    for _ in range(n):
        a.allocate_mutable_block(None)
    expect_rejected(a, NoFree, lambda: a.allocate_mutable_block(None))


def test_is_block_cached_and_block_is_computed() -> None:
    a = make(4, 2)
    b = a.allocate_immutable_block(None, [1, 2])
    m = a.allocate_mutable_block(None)
    m.append_token_ids([5])
    detached_twin = PrefixCachingBlock(None, [1, 2], 2, a)
    stranger = PrefixCachingBlock(None, [8, 9], 2, a)
    assert a.is_block_cached(b) is True
    assert a.is_block_cached(detached_twin) is True
    assert a.is_block_cached(stranger) is False
    expect_rejected(a, err.UnhashableBlockError, lambda: a.is_block_cached(m))
    assert a.block_is_computed(0) is False  # promoted, not marked yet
    assert a.block_is_computed(1) is False  # mutable
    assert a.block_is_computed(2) is False  # free
    a.mark_blocks_as_computed([])
    assert a.block_is_computed(0) is True
    a.free(b)
    assert a.block_is_computed(0) is True  # evictable and computed
    expect_rejected(a, err.UnknownBlockIdError, lambda: a.block_is_computed(9))


def test_num_full_blocks_touched() -> None:
    a = make(4, 2)
    in_use = a.allocate_immutable_block(None, [1, 2])
    evictable = a.allocate_immutable_block(None, [3, 4])
    twin = PrefixCachingBlock(None, [3, 4], 2, a)
    a.free(evictable)
    new = PrefixCachingBlock(None, [5, 6], 2, a)
    part = PrefixCachingBlock(None, [7], 2, a)
    after_part = PrefixCachingBlock(part, [8, 9], 2, a)  # full, but no hash
    assert a.get_num_full_blocks_touched([]) == 0
    assert a.get_num_full_blocks_touched([in_use]) == 0
    assert a.get_num_full_blocks_touched([twin]) == 1
    assert a.get_num_full_blocks_touched([new, new]) == 2  # no deduplication
    assert a.get_num_full_blocks_touched([part]) == 0
    assert a.get_num_full_blocks_touched([after_part]) == 1
    assert a.get_num_full_blocks_touched([in_use, twin, new, part, after_part]) == 3


def test_find_cached_blocks_prefix() -> None:
    a = make(6, 2)
    chain = a.allocate_immutable_blocks(None, [[1, 2], [3, 4], [5, 6], [7, 8]])
    hashes = [b.content_hash for b in chain]
    assert a.find_cached_blocks_prefix(hashes) == []  # promoted, not computed
    a.mark_blocks_as_computed([])
    assert a.find_cached_blocks_prefix(hashes) == hashes
    assert a.find_cached_blocks_prefix(hashes[:2] + [123]) == hashes[:2]
    assert a.find_cached_blocks_prefix([]) == []
    assert a.find_cached_blocks_prefix([123] + hashes) == []


def test_find_cached_blocks_prefix_of_a_list_rewritten_in_place() -> None:
    """One list object asked about again after the caller rewrote it (longer
    with another start, as long, shorter): each answer is by its content."""
    a = make(6, 2)
    chain = a.allocate_immutable_blocks(None, [[1, 2], [3, 4], [5, 6]])
    a.mark_blocks_as_computed([])
    hashes = [b.content_hash for b in chain]
    query = list(hashes)
    assert a.find_cached_blocks_prefix(query) == hashes
    query[:] = [123] + hashes
    assert a.find_cached_blocks_prefix(query) == []
    query[:] = hashes
    assert a.find_cached_blocks_prefix(query) == hashes
    query[:] = hashes[:2] + [123]
    assert a.find_cached_blocks_prefix(query) == hashes[:2]
    query[:] = [456]
    assert a.find_cached_blocks_prefix(query) == []


def test_find_cached_blocks_prefix_is_exact_when_a_middle_block_was_evicted() -> None:
    # cached+computed pattern [yes, no, yes, yes]: the answer is the first
    # hash only (a binary search would have returned all four)
    a = make(4, 2)
    chain = a.allocate_immutable_blocks(None, [[1, 2], [3, 4], [5, 6], [7, 8]])
    hashes = [b.content_hash for b in chain]
    a.mark_blocks_as_computed([])
    for b in reversed(chain):
        a.free(b)
    a.mark_blocks_as_accessed([0, 2, 3], 5.0)
    assert snapshot(a)["evictor_evict_order"] == [1, 3, 2, 0]
    victim = a.allocate_mutable_block(None)
    assert victim.block_id == 1
    assert a.find_cached_blocks_prefix(hashes) == hashes[:1]


def test_mark_blocks_as_accessed() -> None:
    a = make(4, 2)
    x = a.allocate_immutable_block(None, [1, 2])
    y = a.allocate_immutable_block(None, [3, 4])
    a.mark_blocks_as_accessed([0], 1.5)
    assert tracker_of(a, 0) == (True, 1.5, False)
    a.free(x)
    a.free(y)
    hx, hy = H(True, None, [1, 2]), H(True, None, [3, 4])
    assert evictor_entries(a) == [(0, hx, 2, 1.5), (1, hy, 2, -1)]
    assert snapshot(a)["evictor_evict_order"] == [1, 0]
    a.mark_blocks_as_accessed([1], 7)
    assert evictor_entries(a) == [(0, hx, 2, 1.5), (1, hy, 2, 7)]
    assert snapshot(a)["evictor_evict_order"] == [0, 1]
    a.mark_blocks_as_accessed([], 9.0)
    assert a.allocate_mutable_block(None).block_id == 2


def test_mark_blocks_as_accessed_errors_are_all_or_nothing() -> None:
    a = make(4, 2)
    x = a.allocate_immutable_block(None, [1, 2])
    exc = expect_rejected(a, err.BlockNotOnDeviceError,
                          lambda: a.mark_blocks_as_accessed([0, 3], 2.0), blocks=[x],
                          match="^Mark block as accessed which is not belonged to GPU$")
    assert isinstance(exc, ValueError)
    assert tracker_of(a, 0) == (True, -1, False)
    exc = expect_rejected(a, err.UnknownBlockIdError,
                          lambda: a.mark_blocks_as_accessed([0, 17], 2.0))
    assert isinstance(exc, KeyError)
    expect_rejected(a, KeyError, lambda: a.mark_blocks_as_accessed([None], 2.0))
    expect_rejected(a, err.WrongTypeError, lambda: a.mark_blocks_as_accessed([0], "now"))
    expect_rejected(a, err.WrongTypeError, lambda: a.mark_blocks_as_accessed([0], None))


def test_mark_blocks_as_accessed_takes_any_equal_int_and_refuses_lookalikes() -> None:
    # An id equal to a held one but another int object, a tuple of ids, an int
    # time: all accepted (the fast path's identity test only picks the path).
    a = make(600, 2, block_ids=range(300, 900))
    x = a.allocate_immutable_block(None, [1, 2])
    y = a.allocate_immutable_block(None, [3, 4])
    assert (x.block_id, y.block_id) == (300, 301)
    a.mark_blocks_as_accessed([int("300"), y.block_id], 2.5)
    assert tracker_of(a, 300) == (True, 2.5, False) and tracker_of(a, 301) == (True, 2.5, False)
    a.mark_blocks_as_accessed((300, 301), 4)
    assert tracker_of(a, 300) == (True, 4, False)
    # Lookalikes of held ids after a held one: refused, nothing changed.
    for ids, error in (([300, 301.0], err.UnknownBlockIdError),
                       ([300, True], err.UnknownBlockIdError),
                       ([300, [301]], err.UnknownBlockIdError),
                       ([300, 302], err.BlockNotOnDeviceError)):
        expect_rejected(a, error, lambda ids=ids: a.mark_blocks_as_accessed(ids, 5.0),
                        blocks=[x, y])
        assert tracker_of(a, 300) == (True, 4, False)
    expect_rejected(a, err.InvalidArgumentError,
                    lambda: a.mark_blocks_as_accessed([300], float("nan")), blocks=[x, y])
    expect_rejected(a, err.WrongTypeError,
                    lambda: a.mark_blocks_as_accessed([300], True), blocks=[x, y])
    expect_rejected(a, err.WrongTypeError,
                    lambda: a.mark_blocks_as_accessed(iter([300]), 5.0), blocks=[x, y])
    assert tracker_of(a, 300) == (True, 4, False)
    # Freed, then held again: the fast path follows the id in and out of use.
    held = {i: t.held for i, t in a._block_tracker.items() if t.held is not None}
    assert held == {300: 300, 301: 301} and held[301] is y.block_id
    a.free(y)
    assert a._block_tracker[301].held is None
    a.mark_blocks_as_accessed([301], 6.0)
    assert evictor_entries(a)[0][3] == 6.0
    assert a.allocate_immutable_block(None, [3, 4]).block_id == 301
    a.mark_blocks_as_accessed([300, 301], 7.0)
    assert tracker_of(a, 301)[:2] == (True, 7.0)
    assert a._block_tracker[301].held == 301
    mutable = a.allocate_mutable_block(None)
    mutable_id = mutable.block_id
    assert a._block_tracker[mutable_id].held is mutable_id
    a.free(mutable)
    assert a._block_tracker[mutable_id].held is None
    cached = a.allocate_immutable_block(None, [5, 6])
    filling = a.allocate_mutable_block(None)
    own_id = filling.block_id
    filling.append_token_ids([5, 6])  # promoted onto the cached id: its own id is let go
    assert filling.block_id == cached.block_id != own_id
    assert a._block_tracker[own_id].held is None
    a.free(x)  # evictable: no longer held
    assert a._block_tracker[300].held is None
    a.allocate_immutable_blocks(None, [[1, 2]])  # a hit revives it: held again
    assert a._block_tracker[300].held == 300


def test_flat_tables_lists_or_dicts_and_ids_that_index_them_wrongly() -> None:
    # Ids from 0 to about twice the pool's size: the access times and held ids
    # in lists indexed by id (unused slots where no id is managed); negative
    # or far ids: dicts.  The trackers read and write their slots.
    near = make(4, 2, block_ids=range(6, 10))
    assert near._times == [-1] * 10 and near._held == [None] * 10
    assert make(4, 2)._times == [-1] * 4 and make(4, 2)._held == [None] * 4
    edge = make(4, 2, block_ids=[0, 1, 2, 2 * 4 + 1024 - 1])  # the largest id a list takes
    assert edge._held == [None] * (2 * 4 + 1024)
    for ids in ([-3, 0, 5, 1], [0, 1, 2, 10**9], [0, 1, 2, 2 * 4 + 1024]):
        far = make(4, 2, block_ids=ids)
        assert far._times == dict.fromkeys(ids, -1) and far._held == dict.fromkeys(ids)
        x = far.allocate_immutable_block(None, [1, 2])
        assert x.block_id == ids[0] and far._held[ids[0]] is x.block_id
        far.mark_blocks_as_accessed([ids[0]], 2.0)
        assert tracker_of(far, ids[0]) == (True, 2.0, False) and far._times[ids[0]] == 2.0
        far._block_tracker[ids[0]].last_accessed = 3.0
        assert far._times[ids[0]] == 3.0
    # Ids that a list would answer for another id (negative ones count from
    # its end), for none (an unmanaged one in range, past its end): refused.
    x = near.allocate_immutable_block(None, [1, 2])
    y = near.allocate_immutable_block(None, [3, 4])
    near.mark_blocks_as_accessed([6, 7], 3.0)
    assert near._times[6:8] == [3.0, 3.0] and near._held[6:8] == [6, 7]
    for bad in (-4, -3, -1, 0, 5, 10, 10**30):
        expect_rejected(near, err.UnknownBlockIdError,
                        lambda bad=bad: near.mark_blocks_as_accessed([6, bad], 5.0),
                        blocks=[x, y])
    assert tracker_of(near, 6)[:2] == tracker_of(near, 7)[:2] == (True, 3.0)


def test_common_cases_skip_the_checked_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    # Held ids with a float or int time, and one list of ids, are answered
    # without the one-by-one checks (the cost of strictness on the hot path).
    a = make(8, 2)
    x = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]])
    ids = [b.block_id for b in x]

    def refuse(*args: object) -> None:
        raise AssertionError("the checked path ran")

    monkeypatch.setattr(a, "_mark_accessed_checked", refuse)
    monkeypatch.setattr(pcb, "check_list_of_lists", refuse)
    a.mark_blocks_as_accessed(ids, 3.5)
    a.mark_blocks_as_accessed(ids, 4)
    a.mark_blocks_as_accessed([], 5.0)
    assert [tracker_of(a, i)[1] for i in ids] == [4, 4]
    assert a.get_common_computed_block_ids([ids]) is ids
    with pytest.raises(AssertionError, match="checked path"):
        a.mark_blocks_as_accessed((ids[0],), 6.0)  # a tuple: checked
    with pytest.raises(AssertionError, match="checked path"):
        a.mark_blocks_as_accessed(ids, True)  # a bool time: checked
    with pytest.raises(AssertionError, match="checked path"):
        a.mark_blocks_as_accessed(ids, float("nan"))
    with pytest.raises(AssertionError, match="checked path"):
        a.mark_blocks_as_accessed([ids[0], 7], 6.0)  # a free id: checked
    with pytest.raises(AssertionError, match="checked path"):
        a.get_common_computed_block_ids((ids,))  # a tuple: checked
    with pytest.raises(AssertionError, match="checked path"):
        a.get_common_computed_block_ids([tuple(ids)])
    assert [tracker_of(a, i)[1] for i in ids] == [4, 4]


def test_mark_blocks_as_computed_ignores_its_argument() -> None:
    a = make(4, 2)
    x = a.allocate_immutable_block(None, [1, 2])
    y = a.allocate_immutable_block(None, [3, 4])
    m = a.allocate_mutable_block(None)
    a.free(y)
    assert a._touched_blocks == {0, 1}
    a.mark_blocks_as_computed([2])
    assert a._touched_blocks == set()
    assert tracker_of(a, 0) == (True, -1, True)
    assert tracker_of(a, 2) == (True, -1, False)  # mutable: never computed
    assert tracker_of(a, 1) == IDLE and a.block_is_computed(1) is True
    assert x.block_id == 0 and m.block_id == 2


def test_get_common_computed_block_ids() -> None:
    a = make(2, 2)
    single = [4, 5, 6]
    assert a.get_common_computed_block_ids([single]) is single
    assert a.get_common_computed_block_ids((single,)) is single  # a tuple of lists too

    class IdList(List[int]):
        pass

    own = IdList([4, 5])
    assert a.get_common_computed_block_ids([own]) is own  # a list subclass: itself, as in vLLM
    assert a.get_common_computed_block_ids([[1, 2, 3], [1, 2, 4], [1, 2]]) == [1, 2]
    assert a.get_common_computed_block_ids([[1, 2, 3], [], [1, 2, 3]]) == [1, 2, 3]
    assert a.get_common_computed_block_ids([[5], [6]]) == []
    assert a.get_common_computed_block_ids([[], []]) == []
    assert a.get_common_computed_block_ids([]) == []
    result = a.get_common_computed_block_ids([[1, 2], [1, 2]])
    assert isinstance(result, list) and result == [1, 2]
    assert a.get_common_computed_block_ids([[1, 2, 3, 4], [1, 9, 3, 5]]) == [1]  # parting early
    assert a.get_common_computed_block_ids([[7, 8, 9], [7, 1, 9], [7, 8, 2]]) == [7]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=50),
       st.lists(st.tuples(st.integers(0, 50), st.lists(st.integers(0, 3), max_size=4),
                          st.booleans()), min_size=1, max_size=4))
def test_get_common_computed_block_ids_is_the_common_prefix(
        stem: List[int], rows: List[Tuple[int, List[int], bool]]) -> None:
    """Of lists or tuples (mixed) that share parts of a stem and part at
    their tails: the spec's common prefix, as a list."""
    a = make(2, 2)
    given_lists = [tuple(stem[:keep] + tail) if as_tuple else stem[:keep] + tail
                   for keep, tail, as_tuple in rows]
    result = a.get_common_computed_block_ids(given_lists)
    assert type(result) is list and result == common_computed_prefix(given_lists)


@pytest.mark.parametrize("extra", [0, 1, 17])
@pytest.mark.parametrize("part", [0, 1, 15, 16, 17, 31, 32, 33, 47, 48, 60])
def test_get_common_computed_block_ids_parts_anywhere(part: int, extra: int) -> None:
    """Long lists parting at every place the search by 16 ids can get wrong
    (a chunk's first, last, next id), of equal and unequal lengths."""
    a = make(2, 2)
    first = list(range(64))
    other = first[:part] + [-1] + first[part + 1:] + list(range(100, 100 + extra))
    for lists in ([first, other], [other, first], [first, first[:], other]):
        result = a.get_common_computed_block_ids(lists)
        assert result == common_computed_prefix(lists) == first[:part]


def test_get_common_computed_block_ids_compares_ids_with_eq_only() -> None:
    """Ids of any type are compared with ``==`` (never ordered), as the spec
    says: the query always succeeds."""
    a = make(2, 2)
    assert a.get_common_computed_block_ids([(4, 5)]) == [4, 5]
    assert a.get_common_computed_block_ids([[1, 2], (1, 2)]) == [1, 2]
    assert a.get_common_computed_block_ids([[1, "a"], [1, 2]]) == [1]
    assert a.get_common_computed_block_ids([[1, None], [1, 2.5], [1]]) == [1]
    long = list(range(100))
    assert a.get_common_computed_block_ids([long, long[:70] + [-1] + long[71:]]) == long[:70]


# --------------------------------------------------------------------------
# swapping


def test_swap_out_and_back_in_hits_the_cache() -> None:
    a = make(4, 2)
    chain = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]])
    tail = a.allocate_mutable_block(chain[-1])
    tail.append_token_ids([5])
    blocks = chain + [tail]
    a.swap_out(blocks)
    assert [b.block_id for b in blocks] == [None, None, None]
    assert snapshot(a)["evictor_evict_order"] == [1, 0]
    assert snapshot(a)["free"] == [2, 3]
    assert a.swap_in_demand(blocks) == 3
    a.swap_in(blocks)
    assert [b.block_id for b in blocks] == [0, 1, 2]
    assert evictor_entries(a) == []
    assert metric(a) == (4, 2)  # two misses at allocation, two hits at swap-in
    assert [b.token_ids for b in blocks] == [[1, 2], [3, 4], [5]]
    assert all(b._allocator is a for b in blocks)


def test_swap_in_demand_counts_hits_in_use_as_free() -> None:
    a = make(4, 2)
    x = a.allocate_immutable_block(None, [1, 2])
    twin = PrefixCachingBlock(None, [1, 2], 2, a)
    loose = PrefixCachingBlock(None, [9], 2, a)
    assert a.swap_in_demand([twin, loose]) == 1
    a.swap_in([twin, loose])
    assert (twin.block_id, loose.block_id) == (0, 1)
    assert x.block_id == 0 and snapshot(a)["refcounts"][0] == 2


def test_swap_in_demand_of_several_chains() -> None:
    """A block without a hash takes an id wherever it is listed, and content
    listed twice takes one id: two sequences swapped in at once, each with a
    partial tail, the second a fork of the first."""
    a = make(3, 2)
    first = a.allocate_immutable_block(None, [1, 2])
    tail = a.allocate_mutable_block(first)
    tail.append_token_ids([3])
    fork = a.fork(tail)
    blocks = [first, tail] + fork
    a.swap_out(blocks)
    assert a.swap_in_demand(blocks) == 3  # [1, 2] once, each partial tail
    a.swap_in(blocks)
    assert [b.block_id for b in blocks] == [0, 1, 0, 2]
    assert a.get_num_free_blocks() == 0


def test_swap_in_that_cannot_fit_changes_nothing() -> None:
    a = make(3, 2)
    chain = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]])
    a.swap_out(chain)
    fill = [a.allocate_mutable_block(None) for _ in range(2)]  # evicts 1, takes 2
    assert [b.block_id for b in fill] == [2, 1]
    expect_rejected(a, NoFree, lambda: a.swap_in(chain), blocks=chain)
    assert metric(a) == (2, 0)
    a.swap_in(chain[:1])  # the first block is still cached and evictable: a hit
    assert chain[0].block_id == 0 and metric(a) == (3, 1)


def test_swap_errors_change_nothing() -> None:
    a = make(4, 2)
    b = a.allocate_immutable_block(None, [1, 2])
    loose = a.allocate_mutable_block(None)
    a.swap_out([loose])
    expect_rejected(a, err.InvalidArgumentError, lambda: a.swap_in([loose, b]),
                    blocks=[loose, b])
    naive_block = NaiveBlock(None, [1], 2, MagicMock())
    expect_rejected(a, err.WrongTypeError, lambda: a.swap_in([naive_block]))
    expect_rejected(a, err.CallerError, lambda: a.swap_out([b, b]), blocks=[b])
    forged = PrefixCachingBlock(None, [1, 2], 2, a, block_id=0)  # claims b's only reference
    expect_rejected(a, err.RefCountError, lambda: a.swap_out([b, forged]), blocks=[b])
    expect_rejected(a, err.DetachedBlockError, lambda: a.swap_out([loose]))


@pytest.mark.parametrize("tokens", [[1, 2], [3]], ids=["hashed", "mutable"])
def test_swap_in_of_the_same_block_twice_is_refused(tokens: List[int]) -> None:
    a = make(4, 2)
    b = a.allocate_mutable_block(None)
    b.append_token_ids(tokens)
    a.swap_out([b])
    expect_rejected(a, err.CallerError, lambda: a.swap_in([b, b]), blocks=[b])


def test_swap_out_of_one_block_object_twice_is_refused_even_when_its_id_is_shared() -> None:
    a = make(4, 2)
    b = a.allocate_immutable_block(None, [1, 2])
    (f,) = a.fork(b)
    expect_rejected(a, err.CallerError, lambda: a.swap_out([b, b]), blocks=[b, f])


# --------------------------------------------------------------------------
# reset and hit rate


def test_reset_refuses_while_an_id_is_in_use() -> None:
    a = make(3, 2)
    x = a.allocate_immutable_block(None, [1, 2])
    y = a.allocate_immutable_block(None, [3, 4])
    a.free(y)
    before = snapshot(a, [x])
    assert a.reset_prefix_cache() is False
    assert snapshot(a, [x]) == before


def test_a_refused_reset_logs_vllms_warning(caplog: pytest.LogCaptureFixture) -> None:
    """The same warning text as vLLM 0.8.5, for whoever watches the logs."""
    a = make(3, 2)
    a.allocate_immutable_block(None, [1, 2])
    with caplog.at_level("WARNING", logger="prefixcache"):
        assert a.reset_prefix_cache() is False
    assert [r.getMessage() for r in caplog.records] == [
        "Failed to reset prefix cache because some blocks (1) are not freed yet"]


def test_reset_frees_every_evictable_id() -> None:
    a = make(5, 2)
    chain = a.allocate_immutable_blocks(None, [[1, 2], [3, 4], [5, 6]])
    m = a.allocate_mutable_block(None)
    hit = a.allocate_immutable_block(None, [1, 2])
    a.free(m)
    a.mark_blocks_as_accessed([0], 9.0)
    old_evictor = a.evictor
    for b in chain:
        a.free(b)
    a.free(hit)
    assert metric(a) == (4, 1)
    assert snapshot(a)["free"] == [3, 4]
    # evict order: 2 (6 tokens), 1 (4 tokens), then 0 (accessed at 9.0)
    assert snapshot(a)["evictor_evict_order"] == [2, 1, 0]
    assert a.get_num_free_blocks() == 5
    assert a.reset_prefix_cache() is True
    s = snapshot(a)
    assert s["free"] == [0, 1, 2, 3, 4]  # each evicted id pushed on the left
    assert s["cached"] == [] and s["touched"] == set() and s["evictor_free_table"] == []
    assert a.evictor is not old_evictor and a.evictor is not None
    assert s["trackers"] == {i: IDLE for i in range(5)}
    assert s["metric"] == {"num_completed_blocks": 0, "completed_block_cache_hit_rate": 0.0,
                           "num_incompleted_block_queries": 0, "num_incompleted_block_hit": 0,
                           "block_size": 1000}
    assert a.get_prefix_cache_hit_rate() == 0.0
    again = a.allocate_immutable_block(None, [1, 2])
    assert (again.block_id, again.computed) == (0, False)
    assert metric(a) == (1, 0)


def test_hit_rate_over_the_1000_query_buckets() -> None:
    a = make(1, 1)
    a.free(a.allocate_immutable_block(None, [5]))  # 1 miss
    for _ in range(999):
        a.free(a.allocate_immutable_block(None, [5]))  # 999 hits, revived from the evictor
    m = a.metric_data
    assert (m.num_completed_blocks, m.completed_block_cache_hit_rate) == (1, 0.999)
    assert metric(a) == (0, 0)
    assert a.get_prefix_cache_hit_rate() == 0.999
    b = a.allocate_immutable_block(None, [5])
    assert a.get_prefix_cache_hit_rate() == (0.999 * 1 + 1.0 * (1 / 1000)) / (1 + 1 / 1000)
    a.free(b)
    a.allocate_mutable_block(None)  # evicts: not a query
    assert metric(a) == (1, 1)
    assert isinstance(a.metric_data, CacheMetricData)


def test_swap_in_counts_as_queries() -> None:
    a = make(3, 2)
    full = a.allocate_immutable_block(None, [1, 2])
    part = a.allocate_mutable_block(full)
    part.append_token_ids([3])
    a.swap_out([full, part])
    a.reset_prefix_cache()
    a.swap_in([full, part])  # the full block misses (the cache was reset); part is no query
    assert metric(a) == (1, 0)
    assert a.get_prefix_cache_hit_rate() == 0.0


# --------------------------------------------------------------------------
# tenant isolation through extra_hash


@pytest.mark.parametrize(("extra_hashes", "block_ids", "metrics", "hit_rate"), [
    ((101, 202, None), [0, 1, 2, 3, 4, 5], [(2, 0), (4, 0), (6, 0)], 0.0),
    ((101, 101), [0, 1, 0, 1], [(2, 0), (4, 2)], 0.5),
], ids=["different-extra-hash-shares-nothing", "same-extra-hash-shares-and-hits"])
def test_extra_hash_decides_what_is_shared(extra_hashes: Tuple[Optional[int], ...],
                                           block_ids: List[int],
                                           metrics: List[Tuple[int, int]],
                                           hit_rate: float) -> None:
    """The same two blocks requested under each extra hash in turn: the
    metrics after each request, then the ids of every Block and the hit rate."""
    a = make(8, 2)
    blocks: List[Block] = []
    for extra_hash, expected in zip(extra_hashes, metrics):
        blocks += a.allocate_immutable_blocks(None, [[1, 2], [3, 4]], extra_hash=extra_hash)
        assert metric(a) == expected
    assert [b.block_id for b in blocks] == block_ids
    assert a.get_prefix_cache_hit_rate() == hit_rate


def test_a_cache_hit_keeps_the_extra_hash_of_the_request() -> None:
    a = make(4, 2)
    first = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]], extra_hash=7)
    again = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]], extra_hash=7)
    assert [b.block_id for b in again] == [b.block_id for b in first]  # hits
    assert [b.extra_hash for b in again] == [7, 7]
    assert [b.content_hash for b in again] == [b.content_hash for b in first]


# --------------------------------------------------------------------------
# PrefixCachingBlock


def test_block_properties_and_setters() -> None:
    a = make(4, 3)
    prev = PrefixCachingBlock(None, [1, 2, 3], 3, a)
    tokens = [4]
    b = PrefixCachingBlock(prev, tokens, 3, a, block_id=2, computed=True, extra_hash=8)
    tokens.append(5)
    assert b.token_ids == [4]
    assert (b.block_id, b.block_size, b.num_empty_slots, b.is_full) == (2, 3, 2, False)
    assert (b.prev_block, b.extra_hash, b.computed) == (prev, 8, True)
    assert b.num_tokens_total == 4 and prev.num_tokens_total == 3
    assert b.last_accessed == -1
    b.last_accessed = 12.5
    b.computed = False
    b.block_id = 3
    assert (b.last_accessed, b.computed, b.block_id) == (12.5, False, 3)
    assert PrefixCachingBlock._none_hash == NONE_HASH


def test_block_constructor_checks() -> None:
    a = make(4, 2)
    with pytest.raises(err.WrongTypeError):
        PrefixCachingBlock(None, [], 2, NaiveBlockAllocator(NaiveBlock, 2, 2))
    with pytest.raises(err.WrongTypeError):
        PrefixCachingBlock(NaiveBlock(None, [], 2, a), [], 2, a)
    with pytest.raises(err.BlockFullError):
        PrefixCachingBlock(None, [1, 2, 3], 2, a)
    with pytest.raises(AssertionError):
        PrefixCachingBlock(None, [1, "2"], 2, a)


def test_hash_block_tokens() -> None:
    assert H(True, None, [1, 2]) == hash((True, NONE_HASH, 1, 2, None))
    assert H(True, None, [1, 2], 5) == hash((True, NONE_HASH, 1, 2, 5))
    assert H(False, 77, [3], None) == hash((False, 77, 3, None))
    assert H(True, 77, [3]) == hash((True, 77, 3, None))  # only None is replaced
    assert H(False, None, [3]) == hash((False, None, 3, None))


def test_content_hash_rules() -> None:
    a = make(8, 2)
    first = PrefixCachingBlock(None, [1, 2], 2, a, extra_hash=4)
    assert first.content_hash == H(True, None, [1, 2], 4) == builtin_hash(None, [1, 2], 4)
    second = PrefixCachingBlock(first, [3, 4], 2, a, extra_hash=4)
    assert second.content_hash == H(False, first.content_hash, [3, 4], 4)
    not_full = PrefixCachingBlock(None, [1], 2, a)
    assert not_full.content_hash is None
    after_not_full = PrefixCachingBlock(not_full, [5, 6], 2, a)
    assert after_not_full.is_full and after_not_full.content_hash is None
    after_that = PrefixCachingBlock(after_not_full, [7, 8], 2, a)
    assert after_that.content_hash is None


def test_hashability_is_settled_as_a_block_fills() -> None:
    """A block that fills while its previous block is not full never gets a
    hash, even once that block fills; a block that fills after it does."""
    a = make(8, 2)
    head = a.allocate_mutable_block(None)
    head.append_token_ids([1])
    tail = a.allocate_mutable_block(head)
    tail.append_token_ids([2, 3])  # full while head is not
    head.append_token_ids([4])  # head fills: hashed and promoted
    assert head.content_hash == H(True, None, [1, 4]) and a._cached_blocks == {
        head.content_hash: head.block_id}
    assert tail.is_full and tail.content_hash is None
    expect_rejected(a, err.UnhashableBlockError,
                    lambda: a.allocate_immutable_block(tail, [5, 6]), blocks=[head, tail])
    expect_rejected(a, err.UnhashableBlockError, lambda: a.is_block_cached(tail),
                    blocks=[head, tail])
    # Blocks built by the constructor follow the same rule
    loose_head = PrefixCachingBlock(None, [1], 2, a)
    loose_tail = PrefixCachingBlock(loose_head, [2, 3], 2, a)  # built full after a non-full one
    loose_head.append_token_ids([4])
    assert loose_tail.content_hash is None
    later_head = PrefixCachingBlock(None, [1], 2, a)
    later_tail = PrefixCachingBlock(later_head, [2], 2, a)  # built non-full: not settled yet
    later_head.append_token_ids([4])
    later_tail.append_token_ids([3])
    assert later_tail.content_hash == H(False, H(True, None, [1, 4]), [2, 3])


def test_full_block_after_a_non_full_block_shares_with_nothing() -> None:
    a = make(8, 2)
    chains = []
    for _ in range(2):
        head = a.allocate_mutable_block(None)
        head.append_token_ids([1])
        tail = a.allocate_mutable_block(head)
        tail.append_token_ids([2, 3])
        chains.append((head, tail))
    assert [(h.block_id, t.block_id) for h, t in chains] == [(0, 1), (2, 3)]
    assert a._cached_blocks == {} and a._touched_blocks == set()
    head, tail = chains[0]
    expect_rejected(a, err.UnhashableBlockError,
                    lambda: a.allocate_immutable_block(head, [2, 3]), blocks=[head, tail])
    expect_rejected(a, err.BlockFullError, lambda: tail.append_token_ids([4]),
                    blocks=[head, tail])


def test_append_rules() -> None:
    a = make(4, 2)
    b = a.allocate_mutable_block(None)
    b.append_token_ids([])
    b.append_token_ids([1])
    assert (b.token_ids, b.num_tokens_total) == ([1], 1)
    expect_rejected(a, err.BlockFullError, lambda: b.append_token_ids([2, 3]), blocks=[b])
    expect_rejected(a, err.WrongTypeError, lambda: b.append_token_ids([None]), blocks=[b])
    b.append_token_ids([2])
    expect_rejected(a, err.ImmutableBlockError, lambda: b.append_token_ids([3]), blocks=[b])
    expect_rejected(a, err.ImmutableBlockError, lambda: b.append_token_ids([]), blocks=[b])
    computed = a.allocate_mutable_block(None)
    computed.computed = True
    expect_rejected(a, err.ImmutableBlockError, lambda: computed.append_token_ids([1]),
                    blocks=[computed])
    wide = make(2, 4)
    room = wide.allocate_mutable_block(None)
    for token in (None, "x", 1.0):  # one token into a block with room: the short path
        expect_rejected(wide, err.WrongTypeError,
                        lambda token=token: room.append_token_ids([token]), blocks=[room])


@pytest.mark.parametrize("token_ids", [{0: 5}, (5,)], ids=["mapping", "tuple"])
def test_one_token_that_is_not_in_a_list(token_ids: object) -> None:
    """A one-entry mapping indexes like a one-token list but is refused; a
    one-token tuple is a token sequence like any other."""
    a = make(2, 4)
    block = a.allocate_mutable_block(None)
    block.append_token_ids([1])
    if isinstance(token_ids, dict):
        expect_rejected(a, err.WrongTypeError, lambda: block.append_token_ids(token_ids),
                        blocks=[block])
    else:
        block.append_token_ids(token_ids)  # type: ignore[arg-type]
        assert block.token_ids == [1, 5]


def test_detached_block_append_does_not_touch_the_allocator() -> None:
    a = make(4, 2)
    before = snapshot(a)
    b = PrefixCachingBlock(None, [], 2, a)
    b.append_token_ids([1, 2])
    assert b.block_id is None and b.content_hash == H(True, None, [1, 2])
    assert snapshot(a) == before


def test_block_with_mocked_allocator_and_prev_block() -> None:
    allocator = MagicMock(spec=PrefixCachingBlockAllocator)
    first = PrefixCachingBlock(None, [1, 2, 3], 3, allocator)
    assert first.content_hash == H(True, None, [1, 2, 3])
    prev = MagicMock(spec=PrefixCachingBlock)
    prev.content_hash = 1234
    prev.num_tokens_total = 6
    nth = PrefixCachingBlock(prev, [4, 5, 6], 3, allocator, extra_hash=2)
    assert nth.content_hash == H(False, 1234, [4, 5, 6], 2)
    assert nth.num_tokens_total == 9
    sentinel_prev = MagicMock(spec=PrefixCachingBlock)
    sentinel_prev.content_hash = NONE_HASH
    sentinel_prev.num_tokens_total = 3
    assert PrefixCachingBlock(sentinel_prev, [4, 5, 6], 3, allocator).content_hash is None
    none_prev = MagicMock(spec=PrefixCachingBlock)
    none_prev.content_hash = None
    none_prev.num_tokens_total = 3
    assert PrefixCachingBlock(none_prev, [4, 5, 6], 3, allocator).content_hash is None
    # with an id, an append goes through the allocator's CoW, then promotion
    allocator.cow_block_if_not_appendable.return_value = 5
    allocator.promote_to_immutable_block.return_value = 9
    block = PrefixCachingBlock(prev, [4], 3, allocator, block_id=5)
    block.append_token_ids([5])
    allocator.cow_block_if_not_appendable.assert_called_once_with(block)
    allocator.promote_to_immutable_block.assert_not_called()
    block.append_token_ids([6])
    allocator.promote_to_immutable_block.assert_called_once_with(block)
    assert block.block_id == 9 and block.num_tokens_total == 9


def test_assert_prefix_caching_block_or_none() -> None:
    a = make(2, 2)
    assert_prefix_caching_block_or_none(None)
    assert_prefix_caching_block_or_none(PrefixCachingBlock(None, [], 2, a))
    assert_prefix_caching_block_or_none(MagicMock(spec=PrefixCachingBlock))
    with pytest.raises(err.WrongTypeError):
        assert_prefix_caching_block_or_none(NaiveBlock(None, [], 2, a))
    with pytest.raises(AssertionError):
        assert_prefix_caching_block_or_none("block")  # type: ignore[arg-type]


# --------------------------------------------------------------------------
# ComputedBlocksTracker and LastAccessBlocksTracker


class FakeSeq:
    """The three things the trackers read from a vLLM Sequence."""

    def __init__(self, seq_id: int, tokens: List[int], extra: Optional[int] = None,
                 prefill: bool = True) -> None:
        self.seq_id = seq_id
        self.tokens = tokens
        self.extra = extra
        self.prefill = prefill

    def get_token_ids(self) -> List[int]:
        return self.tokens

    def extra_hash(self) -> Optional[int]:
        return self.extra

    def is_prefill(self) -> bool:
        return self.prefill


def test_computed_blocks_tracker() -> None:
    allocator = CpuGpuBlockAllocator.create("prefix_caching", 8, 2, 2)
    tracker = ComputedBlocksTracker(allocator, 2, True)
    seq = FakeSeq(1, [1, 2, 3, 4, 5])
    h1, h2 = H(True, None, [1, 2]), H(False, H(True, None, [1, 2]), [3, 4])
    assert tracker.get_num_cached_tokens(seq) == 0
    assert tracker._seq_id_to_blocks_hashes[1] == [h1, h2]
    assert tracker._seq_id_to_num_tokens_computed[1] == 0
    allocator.allocate_immutable_blocks(None, [[1, 2], [3, 4]], Device.GPU)
    other = FakeSeq(2, [1, 2, 3, 4, 5, 6])
    assert tracker.get_num_cached_tokens(other) == 0  # promoted, not computed yet
    allocator.mark_blocks_as_computed([])
    other.prefill = False
    assert tracker.get_num_cached_tokens(other) == 4
    # sticky during prefill: seq 1 keeps its first answer
    assert tracker.get_num_cached_tokens(seq) == 0
    seq.prefill = False
    assert tracker.get_num_cached_tokens(seq) == 4
    seq.tokens = seq.tokens + [6, 7, 8]
    assert tracker.get_num_cached_tokens(seq) == 4
    assert len(tracker._seq_id_to_blocks_hashes[1]) == 4
    tenant = FakeSeq(3, [1, 2, 3, 4], extra=9, prefill=False)
    assert tracker.get_num_cached_tokens(tenant) == 0
    assert tracker._seq_id_to_blocks_hashes[3][0] == H(True, None, [1, 2], 9)
    tracker.remove_seq(1)
    assert 1 not in tracker._seq_id_to_blocks_hashes
    assert 1 not in tracker._seq_id_to_num_tokens_computed


def test_computed_blocks_tracker_extends_the_chain_as_the_sequence_grows() -> None:
    """Hashes recorded block by block, over several decode steps, are the
    chain of the whole sequence (each new block's parent is the last one)."""
    allocator = CpuGpuBlockAllocator.create("prefix_caching", 8, 2, 2)
    grown = ComputedBlocksTracker(allocator, 2, True)
    seq = FakeSeq(1, [], prefill=False)
    tokens = [5, 1, 5, 2, 5, 3, 5, 4, 5]
    for end in (1, 2, 3, 4, 6, 9):  # one, none, one, two more blocks at a time
        seq.tokens = tokens[:end]
        grown.get_num_cached_tokens(seq)
    at_once = ComputedBlocksTracker(allocator, 2, True)
    at_once.get_num_cached_tokens(FakeSeq(2, tokens, prefill=False))
    chain, parent = [], None
    for start in range(0, 8, 2):
        parent = H(parent is None, parent, tokens[start:start + 2])
        chain.append(parent)
    assert grown._seq_id_to_blocks_hashes[1] == at_once._seq_id_to_blocks_hashes[2] == chain


def test_computed_blocks_tracker_over_an_allocator_with_only_vllms_api() -> None:
    """vLLM 0.8.5's allocators have neither ``content_hash_function`` nor
    ``find_verified_blocks_prefix``: the tracker hashes like vLLM and asks
    ``find_cached_blocks_prefix``."""

    class VllmShaped:
        def __init__(self) -> None:
            self.asked: List[List[int]] = []

        def find_cached_blocks_prefix(self, block_hashes: List[int]) -> List[int]:
            self.asked.append(list(block_hashes))
            return block_hashes[:1]

    allocator = VllmShaped()
    tracker = ComputedBlocksTracker(allocator, 2, True)
    assert tracker.get_num_cached_tokens(FakeSeq(1, [1, 2, 3, 4, 5], prefill=False)) == 2
    first = H(True, None, [1, 2])
    assert allocator.asked == [[first, H(False, first, [3, 4])]]


def test_computed_blocks_tracker_over_a_mock_allocator() -> None:
    """vLLM's own test drives the tracker over ``MagicMock(spec=
    PrefixCachingBlockAllocator)``: such a mock has every method, and its
    ``verify_content`` is no True, so the tracker asks
    ``find_cached_blocks_prefix`` (asking ``find_verified_blocks_prefix``, a
    mock's answer has length 0)."""
    allocator = MagicMock(spec=PrefixCachingBlockAllocator)
    tracker = ComputedBlocksTracker(allocator, 2, True)
    allocator.find_cached_blocks_prefix.return_value = [None, None]
    assert tracker.get_num_cached_tokens(FakeSeq(1, [1, 2, 3, 4, 5], prefill=False)) == 4
    allocator.find_cached_blocks_prefix.assert_called_once_with(
        tracker._seq_id_to_blocks_hashes[1])
    allocator.find_verified_blocks_prefix.assert_not_called()


def test_computed_blocks_tracker_verifies_only_when_the_allocator_does() -> None:
    """``find_verified_blocks_prefix`` is asked exactly when the allocator's
    ``verify_content`` is True; an allocator that has the method but does not
    say (a user's) is asked ``find_cached_blocks_prefix``."""

    class Recording:
        def __init__(self, verify: object) -> None:
            if verify is not None:
                self.verify_content = verify
            self.asked: List[str] = []

        def find_cached_blocks_prefix(self, block_hashes: List[int]) -> List[int]:
            self.asked.append("cached")
            return block_hashes[:1]

        def find_verified_blocks_prefix(self, block_hashes: List[int], token_ids: List[int],
                                        extra_hash: Optional[int] = None) -> List[int]:
            self.asked.append("verified")
            return []

    for verify, asked, tokens in [(None, "cached", 2), (False, "cached", 2), (1, "cached", 2),
                                  (True, "verified", 0)]:
        allocator = Recording(verify)
        tracker = ComputedBlocksTracker(allocator, 2, True)
        assert tracker.get_num_cached_tokens(FakeSeq(1, [1, 2, 3], prefill=False)) == tokens
        assert allocator.asked == [asked], verify
    for verify in (True, False):
        one = make(4, 2, verify_content=verify)
        pair = CpuGpuBlockAllocator.create("prefix_caching", 4, 2, 2, verify_content=verify)
        assert one.verify_content is pair.verify_content is verify
    assert CpuGpuBlockAllocator.create("naive", 4, 2, 2).verify_content is False


def test_computed_blocks_tracker_errors() -> None:
    allocator = CpuGpuBlockAllocator.create("prefix_caching", 4, 0, 2)
    tracker = ComputedBlocksTracker(allocator, 2, True)
    seq = FakeSeq(1, [1, 2, 3, 4])
    tracker.get_num_cached_tokens(seq)
    seq.tokens = [1, 2, 3]
    with pytest.raises(err.InvalidArgumentError):
        tracker.get_num_cached_tokens(seq)
    assert len(tracker._seq_id_to_blocks_hashes[1]) == 2
    with pytest.raises(err.UnknownBlockIdError):
        tracker.remove_seq(5)
    with pytest.raises(AssertionError):
        tracker.remove_seq(5)
    tracker.remove_seq(1)
    with pytest.raises(err.UnknownBlockIdError):
        tracker.remove_seq(1)


def test_computed_blocks_tracker_does_not_track_a_sequence_whose_query_failed() -> None:
    """A query that raised recorded the sequence's hashes but no answer: the
    sequence was not queried, so remove_seq refuses it and changes nothing."""

    class Failing:
        def find_cached_blocks_prefix(self, block_hashes: List[int]) -> List[int]:
            raise RuntimeError("the allocator failed")

    tracker = ComputedBlocksTracker(Failing(), 2, True)
    with pytest.raises(RuntimeError):
        tracker.get_num_cached_tokens(FakeSeq(1, [1, 2, 3]))
    assert tracker._seq_id_to_blocks_hashes == {1: [H(True, None, [1, 2])]}
    with pytest.raises(err.UnknownBlockIdError):
        tracker.remove_seq(1)
    assert tracker._seq_id_to_blocks_hashes == {1: [H(True, None, [1, 2])]}
    assert tracker._seq_id_to_num_tokens_computed == {}


def test_computed_blocks_tracker_disabled() -> None:
    allocator = CpuGpuBlockAllocator.create("naive", 4, 0, 2)
    tracker = ComputedBlocksTracker(allocator, 2, False)
    assert tracker.get_num_cached_tokens(FakeSeq(1, [1, 2, 3])) == 0
    tracker.remove_seq(1)
    assert tracker._seq_id_to_blocks_hashes == {}


def test_computed_blocks_tracker_with_a_naive_allocator_hashes_like_vllm() -> None:
    allocator = CpuGpuBlockAllocator.create("naive", 4, 0, 2)
    tracker = ComputedBlocksTracker(allocator, 2, True)
    assert tracker.get_num_cached_tokens(FakeSeq(1, [1, 2])) == 0
    assert tracker._seq_id_to_blocks_hashes[1] == [H(True, None, [1, 2])]


def test_last_access_blocks_tracker() -> None:
    allocator = MagicMock()
    tracker = LastAccessBlocksTracker(allocator)
    tracker.add_seq(1)
    tracker.update_seq_blocks_last_access(1, [0, 1])
    allocator.mark_blocks_as_accessed.assert_not_called()
    tracker.update_last_access(1, 5.0)
    tracker.update_seq_blocks_last_access(1, [0, 1])
    allocator.mark_blocks_as_accessed.assert_called_once_with([0, 1], 5.0)
    with pytest.raises(err.InvalidArgumentError):
        tracker.add_seq(1)
    tracker.remove_seq(1)
    for call in (lambda: tracker.remove_seq(1), lambda: tracker.update_last_access(1, 2.0),
                 lambda: tracker.update_seq_blocks_last_access(1, [0])):
        with pytest.raises(err.UnknownBlockIdError):
            call()
        with pytest.raises(AssertionError):
            call()
    tracker.add_seq(1)
    tracker.update_seq_blocks_last_access(1, [3])
    assert allocator.mark_blocks_as_accessed.call_count == 1


def test_last_access_blocks_tracker_feeds_the_evictor() -> None:
    allocator = CpuGpuBlockAllocator.create("prefix_caching", 4, 0, 2)
    gpu = allocator._allocators[Device.GPU]
    tracker = LastAccessBlocksTracker(allocator)
    tracker.add_seq(7)
    chain = allocator.allocate_immutable_blocks(None, [[1, 2], [3, 4]], Device.GPU)
    tracker.update_last_access(7, 11.0)
    tracker.update_seq_blocks_last_access(7, [b.block_id for b in chain])
    for b in chain:
        allocator.free(b)
    assert [e[3] for e in evictor_entries(gpu)] == [11.0, 11.0]
    assert snapshot(gpu)["evictor_evict_order"] == [1, 0]


# --------------------------------------------------------------------------
# property: whatever the sequence of calls, the free count is exact and the
# next id handed out is the first free id, else the first in eviction order

_steps = st.lists(
    st.one_of(
        st.tuples(st.just("imm"), st.integers(0, 3), st.integers(0, 1)),
        st.tuples(st.just("mut")),
        st.tuples(st.just("free"), st.integers(0, 20)),
        st.tuples(st.just("touch"), st.integers(0, 20), st.integers(0, 5)),
        st.tuples(st.just("computed")),
    ),
    max_size=40,
)


@settings(max_examples=120, deadline=None)
@given(_steps)
def test_next_id_and_free_count_stay_exact(steps: list) -> None:
    a = make(4, 1)
    live: List[Block] = []
    for step in steps:
        kind = step[0]
        predicted = next_id(a)
        if kind == "imm":
            tokens = [step[1]]
            prev = live[-1] if step[2] and live and live[-1].content_hash is not None else None
            parent = None if prev is None else prev.content_hash
            content_hash = a.content_hash_function(parent, tokens, None)
            cached_id = a._cached_blocks.get(content_hash)
            if cached_id is None and a.get_num_free_blocks() == 0:
                expect_rejected(a, NoFree,
                                lambda p=prev, t=tokens: a.allocate_immutable_block(p, t))
                continue
            block = a.allocate_immutable_block(prev, tokens)
            assert block.block_id == (predicted if cached_id is None else cached_id)
            assert block.computed is (cached_id is not None)
            live.append(block)
        elif kind == "mut":
            if a.get_num_free_blocks() == 0:
                expect_rejected(a, NoFree, lambda: a.allocate_mutable_block(None))
                continue
            block = a.allocate_mutable_block(None)
            assert block.block_id == predicted
            live.append(block)
        elif kind == "free" and live:
            a.free(live.pop(step[1] % len(live)))
        elif kind == "touch" and live:
            a.mark_blocks_as_accessed([live[step[1] % len(live)].block_id], float(step[2]))
        elif kind == "computed":
            a.mark_blocks_as_computed([])
        counts = {i: 0 for i in range(4)}
        for b in live:
            counts[b.block_id] += 1  # type: ignore[index]
        assert snapshot(a)["refcounts"] == counts
        assert a.get_num_free_blocks() == sum(1 for c in counts.values() if c == 0)
    check_still_works(a)


def test_free_of_a_hand_made_swapped_in_block_is_all_or_nothing() -> None:
    # a Block built by its constructor (not taken from the pool) and given an
    # id by swap_in: freeing it either works or changes nothing
    a = make(3, 2)
    b = PrefixCachingBlock(None, [1, 2], 2, a)
    a.swap_in([b])
    assert b.block_id == 0
    if freed_or_unchanged(a, b):
        assert evictor_entries(a) == [(0, H(True, None, [1, 2]), 2, -1)]
        assert snapshot(a)["refcounts"] == {0: 0, 1: 0, 2: 0}
