"""prefixcache.impl.common: RefCounter, its read-only view, the CoW tracker,
BlockPool, BlockList, CacheMetricData, chain walking and the argument checks."""

from __future__ import annotations

from types import SimpleNamespace
from typing import List
from unittest.mock import MagicMock

import pytest
from helpers.impl_snapshot import expect_rejected, snapshot
from helpers.recursion import recursion_limit
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixcache.impl import errors as err
from prefixcache.impl.common import (
    BlockList,
    BlockPool,
    CacheMetricData,
    CopyOnWriteTracker,
    ReadOnlyRefCounter,
    RefCounter,
    check_block_ids,
    check_blocks,
    check_extra_hash,
    check_sizes,
    check_token_ids,
    get_all_blocks_recursively,
)
from prefixcache.impl.interfaces import Block
from prefixcache.impl.naive_block import NaiveBlock, NaiveBlockAllocator
from prefixcache.impl.prefix_caching_block import PrefixCachingBlockAllocator

# --------------------------------------------------------------------------
# RefCounter


def test_refcounter_drops_duplicates_and_starts_at_zero() -> None:
    counter = RefCounter([3, 1, 3, 2, 1])
    assert counter._refcounts == {3: 0, 1: 0, 2: 0}
    assert list(counter._refcounts) == [3, 1, 2]


def test_refcounter_incr_decr_get_return_the_new_count() -> None:
    counter = RefCounter(range(3))
    assert counter.incr(1) == 1
    assert counter.incr(1) == 2
    assert counter.incr(2) == 1
    assert counter.get(1) == 2
    assert counter.decr(1) == 1
    assert counter.decr(1) == 0
    assert counter.get(1) == 0
    assert counter._refcounts == {0: 0, 1: 0, 2: 1}


def test_refcounter_decr_below_zero_is_refused() -> None:
    counter = RefCounter([0, 1])
    counter.incr(0)
    expect_rejected(counter, err.RefCountError, lambda: counter.decr(1))
    # vLLM's test_common expects an AssertionError here
    expect_rejected(counter, AssertionError, lambda: counter.decr(1))
    assert counter.decr(0) == 0
    expect_rejected(counter, AssertionError, lambda: counter.decr(0))
    assert counter._refcounts == {0: 0, 1: 0}
    assert counter.incr(1) == 1


@pytest.mark.parametrize("method", ["incr", "decr", "get"])
def test_refcounter_unknown_id(method: str) -> None:
    counter = RefCounter([0, 1])
    counter.incr(0)
    exc = expect_rejected(counter, err.UnknownBlockIdError,
                          lambda: getattr(counter, method)(5))
    assert isinstance(exc, KeyError) and isinstance(exc, AssertionError)
    assert "5" in str(exc)
    assert counter.get(0) == 1


def test_readonly_view_reads_through_and_refuses_writes() -> None:
    counter = RefCounter([0, 1])
    view = counter.as_readonly()
    assert isinstance(view, ReadOnlyRefCounter)
    assert view.get(0) == 0
    counter.incr(0)
    assert view.get(0) == 1
    expect_rejected(counter, err.ReadOnlyError, lambda: view.incr(0), match="^Incr not allowed$")
    expect_rejected(counter, ValueError, lambda: view.decr(0), match="^Decr not allowed$")
    expect_rejected(counter, err.UnknownBlockIdError, lambda: view.get(7))
    assert counter._refcounts == {0: 1, 1: 0}


# --------------------------------------------------------------------------
# CopyOnWriteTracker


def _bare_block(block_id: object) -> NaiveBlock:
    return NaiveBlock(prev_block=None, token_ids=[], block_size=2, allocator=None,  # type: ignore[arg-type]
                      block_id=block_id)  # type: ignore[arg-type]


def test_cow_tracker_is_appendable() -> None:
    counter = RefCounter([0, 1, 2])
    counter.incr(1)
    counter.incr(2)
    counter.incr(2)
    tracker = CopyOnWriteTracker(counter.as_readonly())
    assert tracker.is_appendable(_bare_block(None)) is True
    assert tracker.is_appendable(_bare_block(0)) is True
    assert tracker.is_appendable(_bare_block(1)) is True
    assert tracker.is_appendable(_bare_block(2)) is False
    with pytest.raises(err.UnknownBlockIdError):
        tracker.is_appendable(_bare_block(9))


def test_cow_tracker_records_in_order_and_clears() -> None:
    tracker = CopyOnWriteTracker(RefCounter([0, 1, 2]))
    tracker.record_cow(0, 1)
    tracker.record_cow(2, 0)
    tracker.record_cow(0, 1)
    assert tracker.clear_cows() == [(0, 1), (2, 0), (0, 1)]
    assert tracker.clear_cows() == []


@pytest.mark.parametrize("pair", [(None, 1), (1, None), (None, None)])
def test_cow_tracker_refuses_a_missing_id(pair: tuple) -> None:
    tracker = CopyOnWriteTracker(RefCounter([0, 1]))
    tracker.record_cow(0, 1)
    with pytest.raises(err.InvalidArgumentError):
        tracker.record_cow(*pair)
    with pytest.raises(AssertionError):
        tracker.record_cow(*pair)
    assert tracker.clear_cows() == [(0, 1)]


# --------------------------------------------------------------------------
# BlockPool


def _pool(size: int) -> tuple:
    allocator = MagicMock(name="allocator")
    return BlockPool(4, NaiveBlock, allocator, size), allocator


def test_pool_hands_out_slots_in_order_and_doubles() -> None:
    pool, allocator = _pool(2)
    assert pool.pool_size == 2
    blocks = [pool.init_block(None, [i], 4, physical_block_id=10 + i) for i in range(3)]
    assert [b.pool_id for b in blocks] == [0, 1, 2]  # type: ignore[attr-defined]
    assert [b.block_id for b in blocks] == [10, 11, 12]
    assert [b.token_ids for b in blocks] == [[0], [1], [2]]
    assert all(b._allocator is allocator for b in blocks)  # type: ignore[attr-defined]
    assert pool.pool_size == 4
    for i in range(3, 5):
        pool.init_block(None, [], 4, physical_block_id=i)
    assert pool.pool_size == 8


def test_pool_is_lifo_and_reuses_the_same_objects() -> None:
    pool, allocator = _pool(4)
    a = pool.init_block(None, [1], 4, physical_block_id=0)
    b = pool.init_block(a, [2], 4, physical_block_id=1)
    pool.free_block(a)
    pool.free_block(b)
    again_b = pool.init_block(None, [7, 8], 4, physical_block_id=5)
    again_a = pool.init_block(again_b, [9], 4, physical_block_id=6)
    assert again_b is b and again_a is a
    # re-initialised in place with the new arguments and the object's allocator
    assert (b.block_id, b.token_ids, b.prev_block) == (5, [7, 8], None)
    assert (a.block_id, a.token_ids, a.prev_block) == (6, [9], b)
    assert a._allocator is allocator  # type: ignore[attr-defined]
    assert pool.init_block(None, [], 4, physical_block_id=7).pool_id == 2  # type: ignore[attr-defined]


def test_pool_increase_pool_doubles() -> None:
    pool, _ = _pool(3)
    pool.increase_pool()
    assert pool.pool_size == 6
    empty, _ = _pool(0)
    empty.increase_pool()
    assert empty.pool_size == 1


def test_pool_of_size_zero_grows_when_used() -> None:
    pool, _ = _pool(0)
    block = pool.init_block(None, [1], 4, physical_block_id=3)
    assert block.pool_id == 0  # type: ignore[attr-defined]
    assert pool.pool_size == 1


def test_pool_refuses_a_negative_size() -> None:
    with pytest.raises(err.InvalidArgumentError):
        BlockPool(4, NaiveBlock, MagicMock(), -1)


def test_pool_adopt_leaves_a_fresh_free_object_in_the_old_slot() -> None:
    """A Block swapped to another pool leaves its old slot free, holding a new
    object of the old pool's allocator; swapping back and forth does not grow
    either pool."""
    old, old_allocator = _pool(2)
    new, _ = _pool(2)
    old_allocator._block_pool = old
    block = old.init_block(None, [1], 4, physical_block_id=0)
    old.init_block(None, [2], 4, physical_block_id=1)
    new.adopt(block)
    assert new.holds(block) and not old.holds(block)
    fresh = old._pool[0]
    assert fresh is not block
    assert list(old._free_ids) == [0]
    again = old.init_block(None, [3], 4, physical_block_id=2)
    assert again is fresh and again._allocator is old_allocator  # type: ignore[attr-defined]
    for _ in range(3):
        new.free_block(block)
        block = new.init_block(None, [4], 4, physical_block_id=3)
    assert (len(old._pool), len(new._pool)) == (2, 1)


def test_pool_adopt_of_its_own_or_of_a_poolless_block() -> None:
    """Adopting a Block the pool already holds changes nothing (a swap out and
    back in on one device must not grow the pool); a Block whose allocator
    has no pool (or that has no allocator) is simply taken in."""
    pool, allocator = _pool(2)
    allocator._block_pool = pool
    own = pool.init_block(None, [1], 4, physical_block_id=0)
    pool.adopt(own)
    assert pool._pool == [own] and own.pool_id == 0  # type: ignore[attr-defined]
    stranger = NaiveBlock(prev_block=None, token_ids=[], block_size=4,
                          allocator=object(), block_id=None)  # type: ignore[arg-type]
    pool.adopt(stranger)
    bare = SimpleNamespace(block_id=None)
    pool.adopt(bare)  # type: ignore[arg-type]
    assert pool._pool == [own, stranger, bare] and list(pool._free_ids) == []


def test_pool_init_block_passes_the_extra_hash_on_a_reused_slot() -> None:
    allocator = PrefixCachingBlockAllocator(num_blocks=4, block_size=4)
    pool = BlockPool(4, allocator._create_block, allocator, 1)
    first = pool.init_block(None, [1], 4, physical_block_id=0, extra_hash=7)
    pool.free_block(first)
    again = pool.init_block(None, [2], 4, physical_block_id=1, extra_hash=9)
    assert again is first and (again.extra_hash, again.token_ids) == (9, [2])


def test_pool_init_block_with_too_many_tokens_leaves_the_pool_as_it_was() -> None:
    pool, _ = _pool(1)
    first = pool.init_block(None, [1], 4, physical_block_id=0)
    pool.free_block(first)
    before = (pool.pool_size, len(pool._pool), list(pool._free_ids))
    with pytest.raises(err.BlockFullError):
        pool.init_block(None, [1, 2, 3, 4, 5], 4, physical_block_id=1)
    assert (pool.pool_size, len(pool._pool), list(pool._free_ids)) == before
    assert pool.init_block(None, [], 4, physical_block_id=2) is first


# --------------------------------------------------------------------------
# BlockList


def _naive(num_blocks: int = 6, block_size: int = 2) -> NaiveBlockAllocator:
    return NaiveBlockAllocator(create_block=NaiveBlock, num_blocks=num_blocks,
                               block_size=block_size)


def test_block_list_keeps_the_list_and_its_ids() -> None:
    a = _naive()
    blocks = a.allocate_immutable_blocks(None, [[1, 2], [3]])
    bl = BlockList(blocks)
    assert bl.ids() == [0, 1]
    assert bl.list() is blocks
    assert len(bl) == 2
    assert bl[1] is blocks[1]
    extra = a.allocate_mutable_block(blocks[1])
    bl.append(extra)
    assert bl.ids() == [0, 1, 2] and len(bl) == 3
    assert blocks[-1] is extra  # the held list itself grew
    replacement = a.allocate_mutable_block(None)
    bl[0] = replacement
    assert bl.ids() == [3, 1, 2] and bl[0] is replacement
    new_list = [blocks[1]]
    bl.update(new_list)
    assert bl.list() is new_list and bl.ids() == [1]
    bl.reset()
    assert len(bl) == 0 and bl.ids() == [] and bl.list() == []


def test_block_list_append_token_ids_refreshes_the_id_after_cow() -> None:
    a = _naive()
    blocks = a.allocate_immutable_blocks(None, [[1, 2], [3]])
    a.fork(blocks[-1])
    bl = BlockList(blocks)
    bl.append_token_ids(1, [4])
    assert bl.ids() == [0, 2]
    assert blocks[1].block_id == 2 and blocks[1].token_ids == [3, 4]
    assert a.clear_copy_on_writes() == [(1, 2)]
    bl.append_token_ids(0, [])
    assert bl.ids() == [0, 2]


def test_block_list_append_token_ids_error_changes_nothing() -> None:
    a = _naive()
    blocks = a.allocate_immutable_blocks(None, [[1, 2], [3]])
    bl = BlockList(blocks)
    expect_rejected(a, err.BlockFullError, lambda: bl.append_token_ids(1, [4, 5]),
                    blocks=blocks)
    assert bl.ids() == [0, 1]


def test_block_list_refuses_detached_blocks() -> None:
    a = _naive()
    blocks = a.allocate_immutable_blocks(None, [[1, 2], [3]])
    loose = a.allocate_mutable_block(None)
    a.free(loose, keep_block_object=True)
    with pytest.raises(err.DetachedBlockError):
        BlockList([blocks[0], loose])
    bl = BlockList(blocks)
    for call in (lambda: bl.append(loose), lambda: bl.update([loose]),
                 lambda: bl.__setitem__(0, loose)):
        with pytest.raises(err.DetachedBlockError):
            call()
        assert bl.ids() == [0, 1] and bl.list() is blocks and len(blocks) == 2
        assert blocks[0].block_id == 0


# --------------------------------------------------------------------------
# CacheMetricData


def test_metric_defaults_and_no_queries() -> None:
    m = CacheMetricData()
    assert (m.num_completed_blocks, m.completed_block_cache_hit_rate,
            m.num_incompleted_block_queries, m.num_incompleted_block_hit,
            m.block_size) == (0, 0.0, 0, 0, 1000)
    assert m.get_hit_rate() == 0.0


def test_metric_partial_bucket() -> None:
    m = CacheMetricData()
    for hit in (True, False, True):
        m.query(hit)
    assert (m.num_incompleted_block_queries, m.num_incompleted_block_hit) == (3, 2)
    assert m.num_completed_blocks == 0
    fill = 3 / 1000
    assert m.get_hit_rate() == (2 / 3) * fill / fill
    assert m.get_hit_rate() == pytest.approx(2 / 3)


def test_metric_folds_every_1000_queries() -> None:
    m = CacheMetricData()
    for i in range(1000):
        m.query(i % 4 == 0)  # 250 hits
    assert m.num_completed_blocks == 1
    assert m.completed_block_cache_hit_rate == 0.25
    assert (m.num_incompleted_block_queries, m.num_incompleted_block_hit) == (0, 0)
    assert m.get_hit_rate() == 0.25
    for _ in range(500):
        m.query(True)
    # one full bucket at 0.25 and half a bucket at 1.0
    assert m.get_hit_rate() == (0.25 * 1 + 1.0 * 0.5) / 1.5 == 0.5
    for _ in range(500):
        m.query(False)
    assert m.num_completed_blocks == 2
    assert m.completed_block_cache_hit_rate == (0.25 * 1 + 0.5) / 2 == 0.375
    assert m.get_hit_rate() == 0.375
    m.query(True)
    assert m.get_hit_rate() == (0.375 * 2 + 1.0 * (1 / 1000)) / (2 + 1 / 1000)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.booleans(), max_size=9), max_size=8), st.integers(1, 5))
def test_metric_query_all_is_query_in_order(runs: List[List[bool]], bucket: int) -> None:
    """Recording runs at once equals recording each query in order, buckets
    closing inside a run included."""
    at_once, one_by_one = CacheMetricData(block_size=bucket), CacheMetricData(block_size=bucket)
    for run in runs:
        at_once.query_all(list(run))
        for hit in run:
            one_by_one.query(hit)
        assert vars(at_once) == vars(one_by_one)
        assert at_once.get_hit_rate() == one_by_one.get_hit_rate()


def test_metric_weights_buckets_not_queries() -> None:
    # block_size is a bucket of queries: here 4 per bucket
    m = CacheMetricData(block_size=4)
    for hit in (True, True, True, True, False, False, False, False, True):
        m.query(hit)
    assert m.num_completed_blocks == 2
    assert m.completed_block_cache_hit_rate == 0.5
    assert (m.num_incompleted_block_queries, m.num_incompleted_block_hit) == (1, 1)
    assert m.get_hit_rate() == (0.5 * 2 + 1.0 * 0.25) / 2.25 == 5 / 9


# --------------------------------------------------------------------------
# get_all_blocks_recursively


def test_chain_walk_returns_first_block_first() -> None:
    a = _naive()
    blocks = a.allocate_immutable_blocks(None, [[1, 2], [3, 4], [5]])
    assert get_all_blocks_recursively(blocks[2]) == blocks
    assert get_all_blocks_recursively(blocks[0]) == [blocks[0]]


def test_chain_walk_of_100k_blocks_at_recursion_limit_1000() -> None:
    last: Block = _bare_block(0)
    chain: List[Block] = [last]
    for i in range(1, 100_000):
        last = NaiveBlock(prev_block=last, token_ids=[], block_size=1, allocator=None,  # type: ignore[arg-type]
                          block_id=i)
        chain.append(last)
    with recursion_limit(1000):
        walked = get_all_blocks_recursively(last)
    assert len(walked) == 100_000
    assert walked[0] is chain[0] and walked[-1] is last
    assert all(x is y for x, y in zip(walked, chain))


# --------------------------------------------------------------------------
# argument checks


def test_check_token_ids() -> None:
    check_token_ids([1, 2], 2)
    check_token_ids((1, 2), 3)
    check_token_ids([], 0)
    with pytest.raises(err.BlockFullError):
        check_token_ids([1, 2, 3], 2)
    for bad in ([1, 2.0], [True], ["1"], [None]):
        with pytest.raises(err.WrongTypeError):
            check_token_ids(bad, 4)
    for bad_container in ("12", {1, 2}, 12, None):
        with pytest.raises(err.WrongTypeError):
            check_token_ids(bad_container, 4)


def test_check_blocks_is_isinstance_of_block() -> None:
    allocator = NaiveBlockAllocator(create_block=NaiveBlock, num_blocks=2, block_size=2)
    block = allocator.allocate_mutable_block(None)
    posing = MagicMock(spec=Block)  # not a subclass, but isinstance(posing, Block) holds
    check_blocks([block, posing, block])
    check_blocks(())
    for bad, named in (([block, 3, "x"], "int"), ((posing, None), "NoneType")):
        with pytest.raises(err.WrongTypeError, match=f"got {named}$"):  # the first one
            check_blocks(bad)
    with pytest.raises(err.WrongTypeError):
        check_blocks(block)


def test_check_extra_hash() -> None:
    check_extra_hash(None)
    check_extra_hash(-5)
    for bad in ("1", 1.0, True):
        with pytest.raises(err.WrongTypeError):
            check_extra_hash(bad)


def test_check_sizes() -> None:
    check_sizes(0, 1)
    check_sizes(5, 16)
    for num_blocks, block_size in ((-1, 1), (1.0, 1), (True, 1), (1, 0), (1, -2), (1, 2.0),
                                   ("3", 1)):
        with pytest.raises(err.InvalidArgumentError):
            check_sizes(num_blocks, block_size)


def test_check_block_ids() -> None:
    assert check_block_ids(iter([5, 2, 9]), 3) == [5, 2, 9]
    assert check_block_ids(range(0), 0) == []
    assert check_block_ids(range(3, 6), 3) == [3, 4, 5]
    for wrong in (range(2), range(4)):
        with pytest.raises(err.InvalidArgumentError):
            check_block_ids(wrong, 3)
    with pytest.raises(err.InvalidArgumentError, match="duplicates"):
        check_block_ids([1, 2, 1], 3)
    with pytest.raises(err.InvalidArgumentError):
        check_block_ids([1, 2], 3)
    with pytest.raises(err.InvalidArgumentError):
        check_block_ids([1, "2"], 2)
    with pytest.raises(err.InvalidArgumentError):
        check_block_ids([1, True], 2)


def test_snapshot_sees_a_changed_refcount() -> None:
    # the helper every "unchanged" check relies on really detects changes
    counter = RefCounter([0])
    before = snapshot(counter)
    counter.incr(0)
    assert snapshot(counter) != before
