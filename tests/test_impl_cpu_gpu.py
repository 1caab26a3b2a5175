"""prefixcache.impl.cpu_gpu_block_allocator: routing between the GPU and the
CPU allocator, swapping, the null block, and the all-or-nothing rules on
both devices at once."""

from __future__ import annotations

from typing import Any, List

import pytest
from helpers.impl_snapshot import expect_rejected, snapshot

from prefixcache.impl import errors as err
from prefixcache.impl.cpu_gpu_block_allocator import CpuGpuBlockAllocator, NullBlock
from prefixcache.impl.hashing import builtin_hash, sha256_hash
from prefixcache.impl.interfaces import Block, BlockAllocator, Device
from prefixcache.impl.naive_block import NaiveBlock, NaiveBlockAllocator
from prefixcache.impl.prefix_caching_block import PrefixCachingBlock, PrefixCachingBlockAllocator

GPU, CPU = Device.GPU, Device.CPU
KINDS = ["naive", "prefix_caching"]
NoFree = BlockAllocator.NoFreeBlocksError


def make(kind: str = "prefix_caching", gpu: int = 4, cpu: int = 3, block_size: int = 2,
         **kwargs: Any) -> CpuGpuBlockAllocator:
    allocator = CpuGpuBlockAllocator.create(kind, gpu, cpu, block_size, **kwargs)
    assert isinstance(allocator, CpuGpuBlockAllocator)
    return allocator


# --------------------------------------------------------------------------
# construction


@pytest.mark.parametrize("kind", KINDS)
def test_create_lays_out_gpu_ids_first(kind: str) -> None:
    a = make(kind, 4, 3)
    gpu, cpu = a._allocators[GPU], a._allocators[CPU]
    cls = NaiveBlockAllocator if kind == "naive" else PrefixCachingBlockAllocator
    assert type(gpu) is cls and type(cpu) is cls
    assert list(a._allocators) == [CPU, GPU]
    assert gpu.all_block_ids == frozenset(range(4))
    assert cpu.all_block_ids == frozenset(range(4, 7))
    assert a.all_block_ids == frozenset(range(7))
    assert (a.get_num_total_blocks(GPU), a.get_num_total_blocks(CPU)) == (4, 3)
    assert (a.get_num_free_blocks(GPU), a.get_num_free_blocks(CPU)) == (4, 3)
    assert a.allocate_mutable_block(None, GPU).block_id == 0
    assert a.allocate_mutable_block(None, CPU).block_id == 4
    assert (a.get_num_free_blocks(GPU), a.get_num_free_blocks(CPU)) == (3, 2)
    block_type = NaiveBlock if kind == "naive" else PrefixCachingBlock
    assert type(a.allocate_immutable_block(None, [1, 2], CPU)) is block_type


def test_create_with_zero_cpu_blocks() -> None:
    a = make("prefix_caching", 2, 0)
    assert a.get_num_total_blocks(CPU) == 0
    expect_rejected(a, NoFree, lambda: a.allocate_mutable_block(None, CPU))


@pytest.mark.parametrize("args", [
    ("lru", 2, 2, 2), ("", 2, 2, 2), ("naive", -1, 2, 2), ("naive", 2, -1, 2),
    ("prefix_caching", 2.0, 2, 2), ("prefix_caching", 2, "2", 2), ("naive", 2, 2, 0),
])
def test_create_rejects_bad_arguments(args: tuple) -> None:
    with pytest.raises(err.InvalidArgumentError):
        CpuGpuBlockAllocator.create(*args)
    with pytest.raises(ValueError):
        CpuGpuBlockAllocator.create(*args)


def test_init_rejects_overlapping_ids() -> None:
    gpu = NaiveBlockAllocator(NaiveBlock, 3, 2, block_ids=[0, 1, 2])
    cpu = NaiveBlockAllocator(NaiveBlock, 2, 2, block_ids=[2, 3])
    with pytest.raises(err.InvalidArgumentError):
        CpuGpuBlockAllocator(cpu_block_allocator=cpu, gpu_block_allocator=gpu)
    with pytest.raises(AssertionError):
        CpuGpuBlockAllocator(cpu_block_allocator=cpu, gpu_block_allocator=gpu)
    cpu_ok = NaiveBlockAllocator(NaiveBlock, 2, 2, block_ids=[3, 4])
    a = CpuGpuBlockAllocator(cpu_block_allocator=cpu_ok, gpu_block_allocator=gpu)
    assert a._allocators[GPU] is gpu and a._allocators[CPU] is cpu_ok


def test_hash_algo_applies_to_both_devices() -> None:
    a = make("prefix_caching", hash_algo="sha256")
    assert a.content_hash_function is sha256_hash
    assert a._allocators[CPU].content_hash_function is sha256_hash
    assert make("prefix_caching").content_hash_function is builtin_hash
    assert make("naive").content_hash_function is None


def test_unknown_device_is_refused() -> None:
    a = make()
    for call in (lambda: a.allocate_mutable_block(None, "GPU"),
                 lambda: a.get_num_free_blocks(None),
                 lambda: a.allocate_immutable_blocks(None, [[1, 2]], 0),
                 lambda: a.get_prefix_cache_hit_rate("CPU")):
        expect_rejected(a, err.InvalidArgumentError, call)


# --------------------------------------------------------------------------
# routing


@pytest.mark.parametrize("kind", KINDS)
def test_allocate_routes_by_device(kind: str) -> None:
    a = make(kind, 3, 3)
    gpu_chain = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]], GPU)
    cpu_chain = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]], CPU, extra_hash=None)
    tail = a.allocate_immutable_block(cpu_chain[-1], [5, 6], CPU)
    assert [b.block_id for b in gpu_chain] == [0, 1]
    assert [b.block_id for b in cpu_chain + [tail]] == [3, 4, 5]
    assert (a.get_num_free_blocks(GPU), a.get_num_free_blocks(CPU)) == (1, 0)
    expect_rejected(a, NoFree, lambda: a.allocate_mutable_block(None, CPU))


@pytest.mark.parametrize("kind", KINDS)
def test_free_and_fork_route_by_block_id(kind: str) -> None:
    a = make(kind, 3, 3)
    g = a.allocate_immutable_block(None, [1, 2], GPU)
    c = a.allocate_immutable_block(None, [1, 2], CPU)
    (fc,) = a.fork(c)
    assert fc.block_id == 3
    assert snapshot(a)["cpu"]["refcounts"][3] == 2
    a.free(c)
    a.free(fc)
    assert a.get_num_free_blocks(CPU) == 3
    assert snapshot(a)["gpu"]["refcounts"][0] == 1
    a.free(g)
    assert a.get_num_free_blocks(GPU) == 3


class _SubclassedBlock(PrefixCachingBlock):
    """A Block of a class the pair has no fast type test for."""

    __slots__ = ()


class _SubclassingAllocator(PrefixCachingBlockAllocator):
    def _create_block(self, prev_block: Any, token_ids: List[int], block_size: int,
                      allocator: Any, block_id: Any = None, extra_hash: Any = None) -> Block:
        return _SubclassedBlock(prev_block, token_ids, block_size, allocator,
                                block_id=block_id, extra_hash=extra_hash)


def test_free_and_fork_take_a_block_of_any_block_class() -> None:
    gpu = _SubclassingAllocator(num_blocks=2, block_size=2, block_ids=range(2))
    cpu = PrefixCachingBlockAllocator(num_blocks=2, block_size=2, block_ids=range(2, 4))
    a = CpuGpuBlockAllocator(cpu_block_allocator=cpu, gpu_block_allocator=gpu)
    block = a.allocate_mutable_block(None, GPU)
    assert type(block) is _SubclassedBlock
    (forked,) = a.fork(block)
    a.free(forked)
    a.free(block)
    assert a.get_num_free_blocks(GPU) == 2


def test_free_and_fork_errors() -> None:
    a = make()
    g = a.allocate_mutable_block(None, GPU)
    loose = a.allocate_mutable_block(None, GPU)
    a.free(loose)
    expect_rejected(a, err.DetachedBlockError, lambda: a.free(loose), blocks=[g])
    expect_rejected(a, err.DetachedBlockError, lambda: a.fork(loose), blocks=[g])
    expect_rejected(a, err.WrongTypeError, lambda: a.free("block"), blocks=[g])
    expect_rejected(a, err.WrongTypeError, lambda: a.fork(3), blocks=[g])
    other = make()
    stranger = other.allocate_mutable_block(None, GPU)  # id 0 on another pair
    expect_rejected(a, err.ForeignBlockError, lambda: a.free(stranger), blocks=[g])
    forged = PrefixCachingBlock(None, [], 2, a._allocators[GPU], block_id=50)
    expect_rejected(a, err.UnknownBlockIdError, lambda: a.free(forged), blocks=[g])


def test_counts_and_physical_ids_route_by_device() -> None:
    a = make("prefix_caching", 4, 3)
    assert [a.get_physical_block_id(CPU, i) for i in (4, 5, 6)] == [0, 1, 2]
    assert [a.get_physical_block_id(GPU, i) for i in (0, 3)] == [0, 3]
    expect_rejected(a, err.UnknownBlockIdError, lambda: a.get_physical_block_id(GPU, 4))
    expect_rejected(a, err.UnknownBlockIdError, lambda: a.get_physical_block_id(CPU, 0))
    g = a.allocate_immutable_block(None, [1, 2], GPU)
    c = PrefixCachingBlock(None, [1, 2], 2, a._allocators[CPU])
    assert a.get_num_full_blocks_touched([g, c], GPU) == 0
    assert a.get_num_full_blocks_touched([g, c], CPU) == 2


def test_naive_num_full_blocks_touched_routes_too() -> None:
    a = make("naive", 3, 3)
    g = a.allocate_immutable_block(None, [1, 2], GPU)
    assert a.get_num_full_blocks_touched([g, g], GPU) == 1
    assert a.get_num_full_blocks_touched([g, g], CPU) == 1


def test_gpu_only_calls_go_to_the_gpu() -> None:
    a = make("prefix_caching", 4, 4, block_size=4)
    gpu, cpu = a._allocators[GPU], a._allocators[CPU]
    g = a.allocate_mutable_block(None, GPU)
    g.append_token_ids([1])
    c = a.allocate_mutable_block(None, CPU)
    c.append_token_ids([1])
    (fg,) = a.fork(g)
    (fc,) = a.fork(c)
    fg.append_token_ids([2])
    fc.append_token_ids([2])
    assert a.clear_copy_on_writes() == [(0, 1)]
    assert snapshot(cpu)["cows"] == [(4, 5)]
    assert a.clear_copy_on_writes() == []
    gi = a.allocate_immutable_block(None, [1, 2, 3, 4], GPU)
    ci = a.allocate_immutable_block(None, [1, 2, 3, 4], CPU)
    assert gpu._touched_blocks == {gi.block_id} and cpu._touched_blocks == {ci.block_id}
    a.mark_blocks_as_computed([ci.block_id])
    assert gpu._touched_blocks == set() and cpu._touched_blocks == {6}
    a.mark_blocks_as_accessed([gi.block_id], 3.0)
    assert gpu._block_tracker[2].last_accessed == 3.0
    expect_rejected(a, err.UnknownBlockIdError, lambda: a.mark_blocks_as_accessed([6], 4.0),
                    blocks=[gi, ci])
    assert a.get_common_computed_block_ids([[0, 1, 2], [0, 1, 3]]) == [0, 1]
    single = [4, 5]
    assert a.get_common_computed_block_ids([single]) is single
    naive = make("naive")
    assert naive.get_common_computed_block_ids([[0, 1], [0, 1]]) == []


def test_hit_rate_and_find_cached_blocks_prefix_route_by_device() -> None:
    a = make("prefix_caching", 4, 4)
    g = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]], GPU)
    a.allocate_immutable_blocks(None, [[1, 2]], GPU)
    c = a.allocate_immutable_block(None, [1, 2], CPU)
    assert a.get_prefix_cache_hit_rate(GPU) == 1 / 3 * (3 / 1000) / (3 / 1000)
    assert a.get_prefix_cache_hit_rate(CPU) == 0.0
    hashes = [b.content_hash for b in g]
    a.mark_blocks_as_computed([])  # GPU only
    assert a.find_cached_blocks_prefix(hashes) == hashes
    assert a.find_cached_blocks_prefix(hashes, GPU) == hashes
    assert a.find_cached_blocks_prefix(hashes, CPU) == []  # CPU block not marked computed
    assert c.content_hash == hashes[0]
    assert make("naive").get_prefix_cache_hit_rate(GPU) == -1


# --------------------------------------------------------------------------
# reset_prefix_cache


def test_reset_one_device() -> None:
    a = make("prefix_caching", 3, 3)
    a.free(a.allocate_immutable_block(None, [1, 2], GPU))
    c = a.allocate_immutable_block(None, [1, 2], CPU)
    assert a.reset_prefix_cache(GPU) is True
    assert snapshot(a)["gpu"]["cached"] == []
    before = snapshot(a, [c])
    assert a.reset_prefix_cache(CPU) is False
    assert snapshot(a, [c]) == before


def test_reset_all_stops_at_a_refusing_cpu() -> None:
    a = make("prefix_caching", 3, 3)
    a.free(a.allocate_immutable_block(None, [1, 2], GPU))
    c = a.allocate_immutable_block(None, [1, 2], CPU)
    before = snapshot(a, [c])
    assert a.reset_prefix_cache() is False
    assert snapshot(a, [c]) == before  # the GPU was not attempted: still cached
    assert snapshot(a)["gpu"]["evictor_free_table"] != []


def test_reset_all_resets_the_cpu_even_when_the_gpu_refuses() -> None:
    a = make("prefix_caching", 3, 3)
    g = a.allocate_immutable_block(None, [1, 2], GPU)
    a.free(a.allocate_immutable_block(None, [1, 2], CPU))
    gpu_before = snapshot(a, [g])["gpu"]
    assert a.reset_prefix_cache(None) is False
    assert snapshot(a)["cpu"]["cached"] == [] and snapshot(a)["cpu"]["free"] == [3, 4, 5]
    assert snapshot(a)["gpu"] == gpu_before
    a.free(g)
    assert a.reset_prefix_cache() is True
    assert snapshot(a)["gpu"]["free"] == [0, 1, 2]


def test_naive_reset_is_always_true() -> None:
    a = make("naive")
    a.allocate_mutable_block(None, GPU)
    assert a.reset_prefix_cache() is True and a.reset_prefix_cache(CPU) is True


# --------------------------------------------------------------------------
# swap


@pytest.mark.parametrize("kind", KINDS)
def test_swap_out_to_cpu_and_back(kind: str) -> None:
    a = make(kind, 4, 3)
    chain = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]], GPU)
    tail = a.allocate_mutable_block(chain[-1], GPU)
    tail.append_token_ids([5])
    blocks: List[Block] = chain + [tail]
    assert a.swap(blocks, GPU, CPU) == {0: 4, 1: 5, 2: 6}
    assert [b.block_id for b in blocks] == [4, 5, 6]
    assert a.get_num_free_blocks(CPU) == 0 and a.get_num_free_blocks(GPU) == 4
    assert a.get_and_reset_swaps() == [(0, 4), (1, 5), (2, 6)]
    assert a.get_and_reset_swaps() == []
    back = a.swap(blocks, CPU, GPU)
    # the prefix GPU allocator still caches the two full blocks: they hit;
    # the naive one hands out the most recently freed ids first
    expected = {4: 0, 5: 1, 6: 2} if kind == "prefix_caching" else {4: 2, 5: 1, 6: 0}
    assert back == expected
    assert a.get_and_reset_swaps() == list(expected.items())
    assert a.get_num_free_blocks(CPU) == 3
    for b in reversed(blocks):
        a.free(b)
    assert a.get_num_free_blocks(GPU) == 4


def test_prefix_swap_in_hits_count_as_queries() -> None:
    a = make("prefix_caching", 4, 3)
    chain = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]], GPU)
    a.swap(chain, GPU, CPU)
    assert a._allocators[CPU].metric_data.num_incompleted_block_queries == 2
    assert a._allocators[CPU].metric_data.num_incompleted_block_hit == 0
    a.swap(chain, CPU, GPU)
    m = a._allocators[GPU].metric_data
    assert (m.num_incompleted_block_queries, m.num_incompleted_block_hit) == (4, 2)
    assert [b.content_hash for b in chain] == [builtin_hash(None, [1, 2], None),
                                              builtin_hash(chain[0].content_hash, [3, 4], None)]


@pytest.mark.parametrize("kind", KINDS)
def test_swap_that_cannot_fit_changes_nothing_on_either_device(kind: str) -> None:
    a = make(kind, 4, 2)
    chain = a.allocate_immutable_blocks(None, [[1, 2], [3, 4], [5, 6]], GPU)
    a.allocate_mutable_block(None, CPU)
    expect_rejected(a, NoFree, lambda: a.swap(chain, GPU, CPU), blocks=chain)
    expect_rejected(a, NoFree, lambda: a.swap(chain[:2], GPU, CPU), blocks=chain)
    assert a.swap(chain[2:], GPU, CPU) == {2: 5}


@pytest.mark.parametrize("kind", KINDS)
def test_swap_of_blocks_that_are_not_on_the_source_changes_nothing(kind: str) -> None:
    a = make(kind, 4, 4)
    g = a.allocate_immutable_block(None, [1, 2], GPU)
    c = a.allocate_immutable_block(None, [3, 4], CPU)
    expect_rejected(a, err.ForeignBlockError, lambda: a.swap([g, c], GPU, CPU), blocks=[g, c])
    expect_rejected(a, err.CallerError, lambda: a.swap([g, g], GPU, CPU), blocks=[g])
    a.free(c)
    expect_rejected(a, err.DetachedBlockError, lambda: a.swap([g, c], GPU, CPU), blocks=[g])
    expect_rejected(a, err.InvalidArgumentError, lambda: a.swap([g], GPU, "CPU"), blocks=[g])


@pytest.mark.parametrize("kind", KINDS)
def test_swap_refuses_a_block_off_the_source_before_counting_the_destination(kind: str) -> None:
    """A swap that is a caller mistake and would not fit either: the mistake is
    reported (the source's check comes before the destination's count)."""
    a = make(kind, 2, 1)
    a.allocate_mutable_block(None, CPU)  # the CPU is full
    g = a.allocate_immutable_block(None, [1, 2], GPU)
    gone = a.allocate_immutable_block(None, [3, 4], GPU)
    a.free(gone)
    expect_rejected(a, err.DetachedBlockError, lambda: a.swap([g, gone], GPU, CPU),
                    blocks=[g, gone])
    expect_rejected(a, err.CallerError, lambda: a.swap([g, g], GPU, CPU), blocks=[g])


@pytest.mark.parametrize("kind", KINDS)
def test_swapped_then_freed_block_does_not_recycle_a_block_in_use(kind: str) -> None:
    # b comes from the GPU's object pool; once swapped to the CPU and freed
    # there, allocating on the CPU must not hand out an object still in use
    a = make(kind, 2, 3)
    b = a.allocate_mutable_block(None, GPU)
    assert a.swap([b], GPU, CPU) == {0: 2}
    c = a.allocate_mutable_block(None, CPU)
    assert c.block_id == 3
    a.free(b)
    d = a.allocate_mutable_block(None, CPU)
    assert d is not c
    assert c.block_id == 3 and d.block_id == 2


class _OnlyTheInterface:
    """An allocator that offers only the public API of vLLM's BlockAllocator
    (vLLM 0.8.5's own have no ``_check_releasable`` and no
    ``swap_in_demand``): the public calls of a prefixcache.impl allocator."""

    def __init__(self, inner: BlockAllocator) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "swap_in_demand":
            raise AttributeError(name)
        return getattr(self._inner, name)


@pytest.mark.parametrize("kind", KINDS)
def test_swap_between_allocators_with_only_the_public_api(kind: str) -> None:
    """swap uses the source's release check and the destination's demand
    when they have them, and swaps without them when they do not."""
    pair = make(kind, 3, 3)
    a = CpuGpuBlockAllocator(cpu_block_allocator=_OnlyTheInterface(  # type: ignore[arg-type]
        pair._allocators[CPU]), gpu_block_allocator=_OnlyTheInterface(  # type: ignore[arg-type]
        pair._allocators[GPU]))
    chain = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]], GPU)
    assert a.swap(chain, GPU, CPU) == {0: 3, 1: 4}
    assert a.swap(chain, CPU, GPU) == ({3: 0, 4: 1} if kind == "prefix_caching"
                                       else {3: 1, 4: 0})
    assert (a.get_num_free_blocks(GPU), a.get_num_free_blocks(CPU)) == (1, 3)


# --------------------------------------------------------------------------
# the null block


@pytest.mark.parametrize("kind", KINDS)
def test_null_block(kind: str) -> None:
    a = make(kind, 3, 2)
    null = a.allocate_or_get_null_block()
    assert isinstance(null, NullBlock)
    assert a.allocate_or_get_null_block() is null
    assert null.block_id == 0 and a.get_num_free_blocks(GPU) == 2
    assert (null.token_ids, null.num_empty_slots, null.is_full) == ([], 2, False)
    assert null.prev_block is None and null.extra_hash is None and null.content_hash is None
    with pytest.raises(NotImplementedError):
        null.num_tokens_total  # noqa: B018
    expect_rejected(a, err.NullBlockWriteError, lambda: null.append_token_ids([1]),
                    blocks=[null], match="^null block should not be modified$")
    expect_rejected(a, ValueError, lambda: setattr(null, "block_id", 5), blocks=[null])
    before = snapshot(a, [null])
    a.free(null)  # does nothing
    assert snapshot(a, [null]) == before
    expect_rejected(a, err.InvalidArgumentError, lambda: a.fork(null), blocks=[null])
    expect_rejected(a, AssertionError, lambda: a.fork(null), blocks=[null])


@pytest.mark.parametrize("kind", KINDS)
def test_the_gpu_allocator_refuses_the_null_block(kind: str) -> None:
    """The null block stands on a GPU id but is none of the GPU allocator's
    Blocks: freed or copied there directly, it is refused and its id stays."""
    a = make(kind, 3, 2)
    null = a.allocate_or_get_null_block()
    gpu = a._allocators[GPU]
    refused = err.ForeignBlockError if kind == "naive" else err.WrongTypeError
    expect_rejected(a, refused, lambda: gpu.free(null), blocks=[null])
    expect_rejected(a, refused, lambda: gpu.cow_block_if_not_appendable(null), blocks=[null])


def test_null_block_flags_pass_through_to_its_block() -> None:
    a = make("prefix_caching", 3, 2)
    null = a.allocate_or_get_null_block()
    proxy = null._proxy
    assert null.computed is False and null.last_accessed == -1
    null.computed = True
    null.last_accessed = 4.0
    assert (proxy.computed, proxy.last_accessed) == (True, 4.0)
    assert (null.computed, null.last_accessed) == (True, 4.0)
    naive_null = make("naive").allocate_or_get_null_block()
    with pytest.raises(NotImplementedError):
        naive_null.computed  # noqa: B018
