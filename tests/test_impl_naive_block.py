"""prefixcache.impl.naive_block: NaiveBlockAllocator and NaiveBlock, every
public method with exact ids, and every rejected call leaving the state
unchanged."""

from __future__ import annotations

import random
from typing import Callable, List
from unittest.mock import MagicMock

import pytest
from helpers.impl_snapshot import expect_rejected, freed_or_unchanged, snapshot
from helpers.recursion import recursion_limit

from prefixcache.impl import errors as err
from prefixcache.impl.interfaces import Block, BlockAllocator, Device
from prefixcache.impl.naive_block import (
    NaiveBlock,
    NaiveBlockAllocator,
    check_detached,
    check_no_device,
)
from prefixcache.impl.prefix_caching_block import PrefixCachingBlockAllocator


def make(num_blocks: int = 4, block_size: int = 4, block_ids: object = None) -> NaiveBlockAllocator:
    return NaiveBlockAllocator(create_block=NaiveBlock, num_blocks=num_blocks,
                               block_size=block_size, block_ids=block_ids)  # type: ignore[arg-type]


# --------------------------------------------------------------------------
# construction


def test_construction_defaults() -> None:
    a = make(3, 2)
    assert list(a._free_block_indices) == [0, 1, 2]
    assert a._refcounter._refcounts == {0: 0, 1: 0, 2: 0}
    assert a.refcounter is a._refcounter
    assert a.all_block_ids == frozenset({0, 1, 2})
    assert isinstance(a.all_block_ids, frozenset)
    assert a.get_num_total_blocks() == 3
    assert a.get_num_free_blocks() == 3
    assert a._block_pool.pool_size == 12
    assert a.clear_copy_on_writes() == []


def test_construction_with_given_ids_keeps_their_order() -> None:
    a = make(3, 2, block_ids=[7, 3, 5])
    assert list(a._free_block_indices) == [7, 3, 5]
    assert [a.allocate_mutable_block(None).block_id for _ in range(3)] == [7, 3, 5]


@pytest.mark.parametrize("kwargs", [
    dict(num_blocks=3, block_size=2, block_ids=[1, 2, 1]),      # duplicate ids
    dict(num_blocks=3, block_size=2, block_ids=[1, 2]),         # count mismatch
    dict(num_blocks=1, block_size=2, block_ids=[0, 1]),         # count mismatch
    dict(num_blocks=2, block_size=2, block_ids=[0, "1"]),       # not an int
    dict(num_blocks=-1, block_size=2),
    dict(num_blocks=2.0, block_size=2),
    dict(num_blocks=2, block_size=0),
    dict(num_blocks=2, block_size=None),
])
def test_bad_constructor_arguments(kwargs: dict) -> None:
    with pytest.raises(err.InvalidArgumentError):
        NaiveBlockAllocator(create_block=NaiveBlock, **kwargs)
    with pytest.raises(AssertionError):
        NaiveBlockAllocator(create_block=NaiveBlock, **kwargs)


def test_create_block_must_be_callable() -> None:
    for wrong in (None, "NaiveBlock"):
        with pytest.raises(err.WrongTypeError):
            NaiveBlockAllocator(create_block=wrong, num_blocks=2, block_size=2)  # type: ignore[arg-type]


def test_zero_blocks() -> None:
    a = make(0, 2)
    assert a.get_num_free_blocks() == 0 and a.get_num_total_blocks() == 0
    expect_rejected(a, BlockAllocator.NoFreeBlocksError, lambda: a.allocate_mutable_block(None))


# --------------------------------------------------------------------------
# allocation


def test_mutable_allocation_takes_the_leftmost_id_until_none_left() -> None:
    a = make(4, 4)
    blocks = [a.allocate_mutable_block(None) for _ in range(4)]
    assert [b.block_id for b in blocks] == [0, 1, 2, 3]
    assert all(isinstance(b, NaiveBlock) and b.token_ids == [] for b in blocks)
    assert a._refcounter._refcounts == {0: 1, 1: 1, 2: 1, 3: 1}
    assert a.get_num_free_blocks() == 0
    exc = expect_rejected(a, BlockAllocator.NoFreeBlocksError,
                          lambda: a.allocate_mutable_block(None), blocks=blocks)
    assert isinstance(exc, ValueError)


def test_freed_ids_are_reused_most_recent_first() -> None:
    a = make(4, 4)
    blocks = [a.allocate_mutable_block(None) for _ in range(4)]
    a.free(blocks[2])
    a.free(blocks[0])
    assert list(a._free_block_indices) == [0, 2]
    assert a.get_num_free_blocks() == 2
    assert a.allocate_mutable_block(None).block_id == 0
    assert a.allocate_mutable_block(None).block_id == 2


def test_mutable_block_with_prev_block() -> None:
    a = make(4, 4)
    first = a.allocate_mutable_block(None)
    second = a.allocate_mutable_block(first, extra_hash=5)
    assert second.prev_block is first
    assert second.extra_hash is None  # a naive block has no extra hash


def test_immutable_block_holds_its_tokens_and_ignores_extra_hash() -> None:
    a = make(4, 4)
    full = a.allocate_immutable_block(None, [1, 2, 3, 4], extra_hash=9)
    part = a.allocate_immutable_block(full, [5, 6])
    assert (full.block_id, full.token_ids, full.is_full) == (0, [1, 2, 3, 4], True)
    assert (part.block_id, part.token_ids, part.is_full) == (1, [5, 6], False)
    assert part.prev_block is full
    assert full.content_hash is None and full.extra_hash is None
    assert a._refcounter._refcounts == {0: 1, 1: 1, 2: 0, 3: 0}


def test_immutable_blocks_build_a_chain_on_ids_in_order() -> None:
    a = make(5, 2)
    head = a.allocate_mutable_block(None)
    chain = a.allocate_immutable_blocks(head, [[1, 2], [3, 4], [5]])
    assert [b.block_id for b in chain] == [1, 2, 3]
    assert [b.token_ids for b in chain] == [[1, 2], [3, 4], [5]]
    assert chain[0].prev_block is head
    assert chain[1].prev_block is chain[0] and chain[2].prev_block is chain[1]
    assert a.allocate_immutable_blocks(None, []) == []
    assert a.get_num_free_blocks() == 1


def test_immutable_blocks_running_out_half_way_take_nothing() -> None:
    a = make(4, 2)
    keep = a.allocate_mutable_block(None)
    a.allocate_mutable_block(None)
    a.free(keep)
    assert list(a._free_block_indices) == [0, 2, 3]
    expect_rejected(a, BlockAllocator.NoFreeBlocksError,
                    lambda: a.allocate_immutable_blocks(None, [[1, 2], [3, 4], [5, 6], [7]]))
    assert [b.block_id for b in a.allocate_immutable_blocks(None, [[1], [2], [3]])] == [0, 2, 3]


@pytest.mark.parametrize("method", ["allocate_mutable_block", "allocate_immutable_block",
                                    "allocate_immutable_blocks"])
def test_device_must_be_none(method: str) -> None:
    a = make(2, 2)
    args = {"allocate_mutable_block": (None,),
            "allocate_immutable_block": (None, [1, 2]),
            "allocate_immutable_blocks": (None, [[1, 2]])}[method]
    for device in (Device.GPU, Device.CPU):
        expect_rejected(a, err.InvalidArgumentError,
                        lambda d=device: getattr(a, method)(*args, device=d))
    assert getattr(a, method)(*args, device=None) is not None


def test_allocation_argument_errors_change_nothing() -> None:
    a = make(3, 2)
    b = a.allocate_mutable_block(None)
    cases = [
        (err.WrongTypeError, lambda: a.allocate_mutable_block("not a block")),
        (err.WrongTypeError, lambda: a.allocate_immutable_block(None, [1, "2"])),
        (err.WrongTypeError, lambda: a.allocate_immutable_block(None, "12")),
        (err.WrongTypeError, lambda: a.allocate_immutable_block(42, [1])),
        (err.BlockFullError, lambda: a.allocate_immutable_block(None, [1, 2, 3])),
        (err.BlockFullError, lambda: a.allocate_immutable_blocks(b, [[1, 2], [1, 2, 3]])),
        (err.WrongTypeError, lambda: a.allocate_immutable_blocks(None, [[1, 2], [None]])),
        (err.WrongTypeError, lambda: a.allocate_immutable_blocks(object(), [[1]])),
    ]
    for exc_type, call in cases:
        expect_rejected(a, exc_type, call, blocks=[b])


# --------------------------------------------------------------------------
# free, free_block_id


def test_free_detaches_and_returns_the_object_to_the_pool() -> None:
    a = make(2, 2)
    b = a.allocate_immutable_block(None, [1, 2])
    a.free(b)
    assert b.block_id is None
    assert a._refcounter._refcounts == {0: 0, 1: 0}
    assert list(a._free_block_indices) == [0, 1]
    # the same object is handed out next (LIFO pool)
    assert a.allocate_mutable_block(None) is b
    assert b.block_id == 0 and b.token_ids == []


def test_free_keep_block_object() -> None:
    a = make(2, 2)
    b = a.allocate_immutable_block(None, [1, 2])
    pool_before = list(a._block_pool._free_ids)
    a.free(b, keep_block_object=True)
    assert b.block_id is None and b.token_ids == [1, 2]
    assert list(a._block_pool._free_ids) == pool_before
    assert a.allocate_mutable_block(None) is not b


def test_free_of_a_shared_id_only_drops_one_reference() -> None:
    a = make(3, 2)
    b = a.allocate_immutable_block(None, [1, 2])
    (f,) = a.fork(b)
    a.free(b)
    assert a._refcounter._refcounts[0] == 1
    assert list(a._free_block_indices) == [1, 2]
    assert f.block_id == 0
    a.free(f)
    assert list(a._free_block_indices) == [0, 1, 2]


def test_free_block_id() -> None:
    a = make(3, 2)
    b = a.allocate_mutable_block(None)
    a.fork(b)
    a.free_block_id(0)
    assert a._refcounter._refcounts[0] == 1 and list(a._free_block_indices) == [1, 2]
    a.free_block_id(0)
    assert list(a._free_block_indices) == [0, 1, 2]
    expect_rejected(a, err.RefCountError, lambda: a.free_block_id(0))
    expect_rejected(a, err.UnknownBlockIdError, lambda: a.free_block_id(17))


def test_double_free_is_refused() -> None:
    a = make(3, 2)
    b = a.allocate_mutable_block(None)
    other = a.allocate_mutable_block(None)
    a.free(b, keep_block_object=True)
    expect_rejected(a, err.DetachedBlockError, lambda: a.free(b), blocks=[b, other])
    # a Block that claims an id whose reference is already gone
    b.block_id = 0
    expect_rejected(a, err.RefCountError, lambda: a.free(b), blocks=[b, other])
    b.block_id = None
    assert other.block_id == 1


def test_free_rejects_foreign_unknown_and_non_blocks() -> None:
    a, other = make(3, 2), make(3, 2)
    mine = a.allocate_mutable_block(None)
    theirs = other.allocate_mutable_block(None)
    prefix = PrefixCachingBlockAllocator(num_blocks=3, block_size=2)
    prefix_block = prefix.allocate_mutable_block(None)
    expect_rejected(a, err.ForeignBlockError, lambda: a.free(theirs), blocks=[mine, theirs])
    expect_rejected(a, err.ForeignBlockError, lambda: a.free(prefix_block))
    assert snapshot(other)["refcounts"] == {0: 1, 1: 0, 2: 0}
    forged = NaiveBlock(None, [], 2, a, block_id=99)
    expect_rejected(a, err.UnknownBlockIdError, lambda: a.free(forged))
    expect_rejected(a, err.WrongTypeError, lambda: a.free("block"))  # type: ignore[arg-type]
    a.free(mine)
    assert a.get_num_free_blocks() == 3


# --------------------------------------------------------------------------
# fork


def test_fork_shares_every_id_of_the_chain() -> None:
    a = make(4, 2)
    chain = a.allocate_immutable_blocks(None, [[1, 2], [3, 4], [5]])
    forked = a.fork(chain[-1])
    assert [b.block_id for b in forked] == [0, 1, 2]
    assert [b.token_ids for b in forked] == [[1, 2], [3, 4], [5]]
    assert all(x is not y for x, y in zip(forked, chain))
    assert all(x.token_ids is not y.token_ids for x, y in zip(forked, chain))
    assert forked[0].prev_block is None
    assert forked[1].prev_block is forked[0] and forked[2].prev_block is forked[1]
    assert a._refcounter._refcounts == {0: 2, 1: 2, 2: 2, 3: 0}
    assert a.get_num_free_blocks() == 1


def test_fork_of_a_freed_chain_is_refused() -> None:
    a = make(4, 2)
    chain = a.allocate_immutable_blocks(None, [[1, 2], [3, 4], [5]])
    a.free(chain[0], keep_block_object=True)
    expect_rejected(a, err.DetachedBlockError, lambda: a.fork(chain[-1]), blocks=chain)
    last = chain[-1]
    a.free(last, keep_block_object=True)
    expect_rejected(a, err.DetachedBlockError, lambda: a.fork(last))


@pytest.mark.parametrize("not_a_block", ["x", 7, None])
@pytest.mark.parametrize("make_allocator", [make, PrefixCachingBlockAllocator],
                         ids=["naive", "prefix-caching"])
def test_fork_of_a_non_block_is_refused(make_allocator: Callable[[int, int], BlockAllocator],
                                        not_a_block: object) -> None:
    a = make_allocator(4, 2)
    b = a.allocate_immutable_block(None, [1, 2])
    expect_rejected(a, err.WrongTypeError, lambda: a.fork(not_a_block), blocks=[b])  # type: ignore[arg-type]


def test_fork_of_a_100k_chain_at_recursion_limit_1000() -> None:
    n = 100_000
    a = make(n, 1)
    chain = a.allocate_immutable_blocks(None, [[i] for i in range(n)])
    with recursion_limit(1000):
        forked = a.fork(chain[-1])
    assert len(forked) == n
    assert forked[0].block_id == 0 and forked[-1].block_id == n - 1
    assert forked[-1].prev_block is forked[-2]
    assert a._refcounter._refcounts[n - 1] == 2 and a._refcounter._refcounts[0] == 2


# --------------------------------------------------------------------------
# copy-on-write


def test_cow_of_an_unshared_block_keeps_its_id() -> None:
    a = make(3, 4)
    b = a.allocate_mutable_block(None)
    assert a.cow_block_if_not_appendable(b) == 0
    assert a.clear_copy_on_writes() == []


def test_cow_moves_a_shared_block_to_a_new_id() -> None:
    a = make(3, 4)
    b = a.allocate_immutable_block(None, [1])
    (f,) = a.fork(b)
    assert a.cow_block_if_not_appendable(f) == 1
    assert f.block_id == 1 and b.block_id == 0
    assert a._refcounter._refcounts == {0: 1, 1: 1, 2: 0}
    assert a.clear_copy_on_writes() == [(0, 1)]
    assert a.clear_copy_on_writes() == []


def test_append_to_a_shared_block_copies_on_write() -> None:
    a = make(4, 4)
    b = a.allocate_immutable_block(None, [1, 2])
    (f1,) = a.fork(b)
    (f2,) = a.fork(b)
    f1.append_token_ids([3])
    f2.append_token_ids([4, 5])
    b.append_token_ids([6])  # last reference: no copy
    assert (b.block_id, f1.block_id, f2.block_id) == (0, 1, 2)
    assert (b.token_ids, f1.token_ids, f2.token_ids) == ([1, 2, 6], [1, 2, 3], [1, 2, 4, 5])
    assert a.clear_copy_on_writes() == [(0, 1), (0, 2)]


def test_cow_takes_the_last_free_id() -> None:
    a = make(2, 4)
    b = a.allocate_immutable_block(None, [1])
    (f,) = a.fork(b)
    assert a.get_num_free_blocks() == 1
    assert a.cow_block_if_not_appendable(f) == 1
    assert (b.block_id, f.block_id, a.get_num_free_blocks()) == (0, 1, 0)
    assert a.clear_copy_on_writes() == [(0, 1)]


def test_cow_without_a_free_id_changes_nothing() -> None:
    a = make(2, 4)
    b = a.allocate_immutable_block(None, [1])
    a.allocate_mutable_block(None)
    (f,) = a.fork(b)
    expect_rejected(a, BlockAllocator.NoFreeBlocksError,
                    lambda: a.cow_block_if_not_appendable(f), blocks=[b, f])
    expect_rejected(a, BlockAllocator.NoFreeBlocksError, lambda: f.append_token_ids([2]),
                    blocks=[b, f])
    assert f.block_id == 0 and f.token_ids == [1]


def test_cow_of_a_detached_or_foreign_block_is_refused() -> None:
    a, other = make(2, 4), make(2, 4)
    b = a.allocate_mutable_block(None)
    a.free(b, keep_block_object=True)
    expect_rejected(a, err.DetachedBlockError, lambda: a.cow_block_if_not_appendable(b))
    theirs = other.allocate_mutable_block(None)
    expect_rejected(a, err.ForeignBlockError, lambda: a.cow_block_if_not_appendable(theirs))


# --------------------------------------------------------------------------
# counts, lookups, inert prefix-caching hooks


def test_get_physical_block_id_on_shuffled_ids() -> None:
    ids = list(range(100, 164))
    random.Random(7).shuffle(ids)
    a = make(64, 2, block_ids=ids)
    assert list(a._free_block_indices) == ids
    for block_id in ids:
        assert a.get_physical_block_id(block_id) == block_id - 100
    b = make(4, 2, block_ids=[40, 10, 30, 20])
    assert [b.get_physical_block_id(i) for i in (40, 10, 30, 20)] == [3, 0, 2, 1]
    for unknown in (0, 41, None, "10"):
        expect_rejected(b, err.UnknownBlockIdError,
                        lambda u=unknown: b.get_physical_block_id(u))


def test_num_full_blocks_touched_counts_distinct_full_objects() -> None:
    a = make(4, 2)
    full = a.allocate_immutable_block(None, [1, 2])
    (fork_of_full,) = a.fork(full)
    part = a.allocate_immutable_block(None, [3])
    assert a.get_num_full_blocks_touched([]) == 0
    assert a.get_num_full_blocks_touched([full, full, part]) == 1
    assert a.get_num_full_blocks_touched([full, fork_of_full, part, full]) == 2


def test_prefix_caching_hooks_are_inert() -> None:
    a = make(3, 2)
    b = a.allocate_immutable_block(None, [1, 2])
    before = snapshot(a, [b])
    assert a.mark_blocks_as_accessed([0, 1], 5.0) is None
    assert a.mark_blocks_as_computed([0]) is None
    assert a.get_common_computed_block_ids([[0, 1], [0, 1]]) == []
    assert a.get_common_computed_block_ids([[0]]) == []
    assert a.get_prefix_cache_hit_rate() == -1
    assert a.reset_prefix_cache() is True
    assert a.find_cached_blocks_prefix([123, 456]) == []
    with pytest.raises(NotImplementedError):
        a.promote_to_immutable_block(b)
    assert snapshot(a, [b]) == before


# --------------------------------------------------------------------------
# swapping


def test_swap_out_frees_and_keeps_the_objects() -> None:
    a = make(4, 2)
    chain = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]])
    (shared,) = a.fork(chain[0])
    a.swap_out(chain)
    assert [b.block_id for b in chain] == [None, None]
    assert [b.token_ids for b in chain] == [[1, 2], [3, 4]]
    assert a._refcounter._refcounts == {0: 1, 1: 0, 2: 0, 3: 0}
    assert list(a._free_block_indices) == [1, 2, 3]
    assert shared.block_id == 0
    assert a.swap_in_demand(chain) == 2
    a.swap_in(chain)
    assert [b.block_id for b in chain] == [1, 2]
    assert chain[1].prev_block is chain[0]
    assert a._refcounter._refcounts == {0: 1, 1: 1, 2: 1, 3: 0}
    a.swap_in([])
    a.swap_out([])


def test_swap_in_that_cannot_fit_changes_nothing() -> None:
    a = make(3, 2)
    chain = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]])
    a.swap_out(chain)
    a.allocate_mutable_block(None)
    a.allocate_mutable_block(None)
    expect_rejected(a, BlockAllocator.NoFreeBlocksError, lambda: a.swap_in(chain), blocks=chain)
    assert [b.block_id for b in chain] == [None, None]
    a.swap_in(chain[:1])
    assert chain[0].block_id == 2


def test_swap_in_takes_a_block_of_another_kind_as_vllm_does() -> None:
    """vLLM's swap_in only gives each Block an id; a Block that cannot be
    rebound (not a NaiveBlock) keeps its own allocator."""
    other = PrefixCachingBlockAllocator(num_blocks=2, block_size=2)
    block = other.allocate_mutable_block(None)
    block.append_token_ids([1])
    other.swap_out([block])
    a = make(3, 2)
    a.allocate_mutable_block(None)
    a.swap_in([block])
    assert block.block_id == 1 and block._allocator is other  # type: ignore[attr-defined]


def test_swap_in_of_an_attached_block_is_refused() -> None:
    a = make(3, 2)
    b = a.allocate_mutable_block(None)
    loose = a.allocate_mutable_block(None)
    a.swap_out([loose])
    expect_rejected(a, err.InvalidArgumentError, lambda: a.swap_in([loose, b]),
                    blocks=[loose, b])


def test_swap_in_of_the_same_block_twice_is_refused() -> None:
    a = make(4, 2)
    b = a.allocate_mutable_block(None)
    a.swap_out([b])
    expect_rejected(a, err.CallerError, lambda: a.swap_in([b, b]), blocks=[b])


def test_swap_out_more_often_than_referenced_is_refused() -> None:
    a = make(3, 2)
    b = a.allocate_mutable_block(None)
    c = a.allocate_mutable_block(None)
    expect_rejected(a, err.CallerError, lambda: a.swap_out([c, b, b]), blocks=[b, c])
    # two Block objects claiming the one reference id 0 has
    forged = NaiveBlock(None, [], 2, a, block_id=0)
    expect_rejected(a, err.RefCountError, lambda: a.swap_out([b, forged]), blocks=[b, c])
    (f,) = a.fork(c)
    a.swap_out([c, f])
    assert (c.block_id, f.block_id) == (None, None)
    assert list(a._free_block_indices) == [1, 2]


def test_swap_out_of_one_block_object_twice_is_refused_even_when_its_id_is_shared() -> None:
    # the id has two references, but this Block object holds only one of them
    a = make(3, 2)
    b = a.allocate_mutable_block(None)
    (f,) = a.fork(b)
    expect_rejected(a, err.CallerError, lambda: a.swap_out([b, b]), blocks=[b, f])
    a.swap_out([b, f])
    assert list(a._free_block_indices) == [0, 1, 2]


def test_swap_out_of_detached_or_foreign_blocks_is_refused() -> None:
    a, other = make(3, 2), make(3, 2)
    b = a.allocate_mutable_block(None)
    theirs = other.allocate_mutable_block(None)
    expect_rejected(a, err.ForeignBlockError, lambda: a.swap_out([b, theirs]), blocks=[b])
    a.swap_out([b])
    expect_rejected(a, err.DetachedBlockError, lambda: a.swap_out([b]))


# --------------------------------------------------------------------------
# module helpers


def test_check_no_device_and_check_detached() -> None:
    check_no_device(None)
    with pytest.raises(err.InvalidArgumentError):
        check_no_device(Device.GPU)
    a = make(2, 2)
    b = a.allocate_mutable_block(None)
    loose = NaiveBlock(None, [], 2, a)
    check_detached([loose])
    check_detached([])
    with pytest.raises(err.InvalidArgumentError):
        check_detached([loose, b])


# --------------------------------------------------------------------------
# NaiveBlock


def test_naive_block_properties() -> None:
    tokens = [1, 2]
    prev = NaiveBlock(None, [9, 9, 9], 3, MagicMock())
    b = NaiveBlock(prev, tokens, 3, MagicMock(), block_id=4)
    tokens.append(3)
    assert b.token_ids == [1, 2]  # the constructor copied the list
    assert (b.block_id, b.block_size, b.num_empty_slots, b.is_full) == (4, 3, 1, False)
    assert b.prev_block is prev and prev.is_full and prev.num_empty_slots == 0
    assert b.extra_hash is None and b.content_hash is None
    b.block_id = 8
    assert b.block_id == 8
    for name in ("computed", "last_accessed", "num_tokens_total"):
        with pytest.raises(NotImplementedError):
            getattr(b, name)
    with pytest.raises(NotImplementedError):
        b.computed = True
    with pytest.raises(NotImplementedError):
        b.last_accessed = 1.0


def test_naive_block_constructor_checks_tokens() -> None:
    with pytest.raises(err.BlockFullError):
        NaiveBlock(None, [1, 2, 3], 2, MagicMock())
    with pytest.raises(err.WrongTypeError):
        NaiveBlock(None, [1.5], 2, MagicMock())


def test_naive_block_append_goes_through_cow_of_its_target() -> None:
    allocator = MagicMock(spec=NaiveBlockAllocator)
    allocator.cow_block_if_not_appendable.return_value = 9
    target = NaiveBlock(None, [], 4, allocator)
    b = NaiveBlock(None, [1], 4, allocator, block_id=3, _cow_target=target)
    b.append_token_ids([2, 3])
    allocator.cow_block_if_not_appendable.assert_called_once_with(target)
    assert (b.block_id, b.token_ids) == (9, [1, 2, 3])
    plain = NaiveBlock(None, [], 4, allocator, block_id=1)
    allocator.cow_block_if_not_appendable.return_value = 1
    plain.append_token_ids([5])
    allocator.cow_block_if_not_appendable.assert_called_with(plain)


def test_naive_block_append_without_id_and_empty_append() -> None:
    allocator = MagicMock(spec=NaiveBlockAllocator)
    b = NaiveBlock(None, [1], 2, allocator)
    b.append_token_ids([2])
    assert b.token_ids == [1, 2] and b.block_id is None
    b.append_token_ids([])
    assert b.token_ids == [1, 2]
    allocator.cow_block_if_not_appendable.assert_not_called()


def test_naive_block_append_errors_change_nothing() -> None:
    a = make(3, 2)
    b = a.allocate_immutable_block(None, [1])
    full = a.allocate_immutable_block(None, [1, 2])
    expect_rejected(a, err.BlockFullError, lambda: b.append_token_ids([2, 3]), blocks=[b])
    expect_rejected(a, err.BlockFullError, lambda: full.append_token_ids([3]), blocks=[full])
    expect_rejected(a, err.WrongTypeError, lambda: b.append_token_ids(["x"]), blocks=[b])
    expect_rejected(a, err.WrongTypeError, lambda: b.append_token_ids(7), blocks=[b])
    full.append_token_ids([])
    b.append_token_ids([2])
    assert b.token_ids == [1, 2] and b.block_id == 0


def test_free_count_is_exact() -> None:
    a = make(5, 2)
    blocks: List[Block] = []
    for _ in range(3):
        blocks.append(a.allocate_mutable_block(None))
    a.fork(blocks[0])
    a.free(blocks[1])
    n = a.get_num_free_blocks()
    assert n == 3
    for _ in range(n):
        a.allocate_mutable_block(None)
    expect_rejected(a, BlockAllocator.NoFreeBlocksError, lambda: a.allocate_mutable_block(None))


def test_free_of_a_hand_made_swapped_in_block_is_all_or_nothing() -> None:
    # a Block built by its constructor (not taken from the pool) and given an
    # id by swap_in: freeing it either works or changes nothing
    a = make(3, 2)
    b = NaiveBlock(None, [1], 2, a)
    a.swap_in([b])
    assert b.block_id == 0
    if freed_or_unchanged(a, b):
        assert snapshot(a)["refcounts"] == {0: 0, 1: 0, 2: 0}
        assert snapshot(a)["free"] == [0, 1, 2]
