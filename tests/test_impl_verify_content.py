"""``verify_content``: with it, a hash collision costs a miss, never another
content's id.  Each test runs a degenerate hash (every block collides) with
the option on, and the same workload with it off where that shares ids, so
each test can fail."""

from __future__ import annotations

from typing import Any, List, Optional

import pytest

from prefixcache.impl import errors as err
from prefixcache.impl.cpu_gpu_block_allocator import CpuGpuBlockAllocator
from prefixcache.impl.interfaces import Block, Device
from prefixcache.impl.prefix_caching_block import (
    ComputedBlocksTracker,
    PrefixCachingBlockAllocator,
    same_content,
)
from prefixcache.spec.abstraction import ContentLedger, abstract_state, ownership
from prefixcache.spec.invariants import check_all


def zero(parent: Optional[int], tokens: Any, extra: Optional[int]) -> int:
    """Every block collides with every other."""
    return 0


def first_token(parent: Optional[int], tokens: Any, extra: Optional[int]) -> int:
    """Blocks collide when their first tokens are equal."""
    return int(tokens[0])


def make(verify: bool, num_blocks: int = 8, hash_algo: Any = zero) -> Any:
    return PrefixCachingBlockAllocator(num_blocks=num_blocks, block_size=2,
                                       hash_algo=hash_algo, verify_content=verify)


def ids(blocks: List[Block]) -> List[Optional[int]]:
    return [b.block_id for b in blocks]


def check_invariants(a: Any, live: List[Block]) -> None:
    state = abstract_state(a, ledger=ContentLedger(), live_blocks=live)
    assert check_all(state, ownership(live)) == []


def test_off_shares_colliding_contents() -> None:
    a = make(False)
    first = a.allocate_immutable_block(None, [1, 2])
    second = a.allocate_immutable_block(None, [3, 4])
    assert first.block_id == second.block_id  # the wrong KV a collision hands out


def test_on_gives_each_content_its_own_id() -> None:
    a = make(True)
    first = a.allocate_immutable_block(None, [1, 2])
    second = a.allocate_immutable_block(None, [3, 4])
    assert first.block_id != second.block_id
    assert first.content_hash == 0 and second.content_hash is None  # no hash: uncached
    assert a._cached_blocks == {0: first.block_id}
    assert not second.computed
    again = a.allocate_immutable_block(None, [1, 2])
    assert again.block_id == first.block_id and again.computed
    assert a.get_prefix_cache_hit_rate() == pytest.approx(1 / 3)
    assert a.is_block_cached(first) and a.is_block_cached(again)
    check_invariants(a, [first, second, again])
    a.free(second)
    assert second.block_id is None
    assert a.evictor.num_blocks == 0  # an uncached id is simply free
    assert a.get_num_free_blocks() == 7


def test_on_misses_a_block_whose_own_tokens_differ_in_a_chain() -> None:
    a = make(True)
    one = a.allocate_immutable_blocks(None, [[1, 2], [5, 6]])
    two = a.allocate_immutable_blocks(None, [[3, 4], [5, 6]])
    assert len(set(ids(one) + ids(two))) == 4
    assert [b.content_hash for b in one] == [0, None]  # [5, 6] collides with [1, 2]
    assert [b.content_hash for b in two] == [None, None]  # after a collision: no hash
    same = a.allocate_immutable_blocks(None, [[1, 2], [5, 6]])
    assert ids(same)[0] == ids(one)[0]
    assert ids(same)[1] not in ids(one) + ids(two)
    check_invariants(a, one + two + same)


def test_off_shares_a_block_after_another_prefix() -> None:
    a = make(False, hash_algo=lambda p, t, e: hash(tuple(t)))  # ignores the parent
    one = a.allocate_immutable_blocks(None, [[1, 2], [5, 6]])
    two = a.allocate_immutable_blocks(None, [[3, 4], [5, 6]])
    assert one[1].block_id == two[1].block_id


def test_on_a_block_after_another_prefix_misses() -> None:
    a = make(True, hash_algo=lambda p, t, e: hash(tuple(t)))  # ignores the parent
    one = a.allocate_immutable_blocks(None, [[1, 2], [5, 6]])
    two = a.allocate_immutable_blocks(None, [[3, 4], [5, 6]])
    assert one[1].block_id != two[1].block_id
    assert two[0].content_hash is not None and two[1].content_hash is None
    hit = a.allocate_immutable_blocks(None, [[3, 4]])
    assert hit[0].block_id == two[0].block_id
    check_invariants(a, one + two + hit)


def test_extra_hash_is_part_of_the_content() -> None:
    a = make(True)
    plain = a.allocate_immutable_block(None, [1, 2])
    tenant = a.allocate_immutable_block(None, [1, 2], extra_hash=7)
    assert plain.block_id != tenant.block_id
    off = make(False)
    assert (off.allocate_immutable_block(None, [1, 2]).block_id
            == off.allocate_immutable_block(None, [1, 2], extra_hash=7).block_id)


def test_a_chain_after_a_collision_has_no_hash() -> None:
    a = make(True, hash_algo=first_token)
    a.allocate_immutable_block(None, [1, 2])
    chain = a.allocate_immutable_blocks(None, [[1, 3], [4, 5], [6, 7]])
    assert [b.content_hash for b in chain] == [None, None, None]
    assert sorted(a._cached_blocks) == [1]
    with pytest.raises(err.UnhashableBlockError):
        a.allocate_immutable_block(chain[-1], [8, 9])
    tail = a.allocate_mutable_block(chain[-1])
    tail.append_token_ids([8, 9])
    assert tail.content_hash is None


def test_same_content_in_one_call_is_shared_within_it() -> None:
    a = make(True, hash_algo=lambda p, t, e: hash((p, *t)))
    chain = a.allocate_immutable_blocks(None, [[1, 2], [1, 2]])
    assert chain[0].block_id != chain[1].block_id
    twice = a.allocate_immutable_blocks(None, [[1, 2], [1, 2]])
    assert ids(twice) == ids(chain)


def test_demand_is_exact_with_collisions() -> None:
    a = make(True, num_blocks=3)
    kept = a.allocate_immutable_block(None, [1, 2])
    with pytest.raises(err.NoFreeBlocksError):
        a.allocate_immutable_blocks(None, [[3, 4], [5, 6], [7, 8]])  # three misses, two ids
    assert a.get_num_free_blocks() == 2 and a._cached_blocks == {0: kept.block_id}
    both = a.allocate_immutable_blocks(None, [[3, 4], [5, 6]])
    assert a.get_num_free_blocks() == 0 and len(set(ids(both) + [kept.block_id])) == 3


def test_demand_counts_a_hit_on_an_evictable_id_once() -> None:
    a = make(True, num_blocks=2, hash_algo=lambda p, t, e: hash((p, *t)))
    a.free(a.allocate_immutable_block(None, [1, 2]))
    assert a.get_num_free_blocks() == 2
    pair = a.allocate_immutable_blocks(None, [[3, 4]])
    first = a.allocate_immutable_blocks(None, [[1, 2]])
    assert len(set(ids(pair) + ids(first))) == 2
    a.free(first[0])
    again = a.allocate_immutable_blocks(None, [[1, 2]])  # wakes the evictable id: takes one
    assert ids(again) == ids(first) and a.get_num_free_blocks() == 0


def test_promotion_onto_other_content_keeps_its_id() -> None:
    a = make(True)
    cached = a.allocate_immutable_block(None, [1, 2])
    block = a.allocate_mutable_block(None)
    own = block.block_id
    block.append_token_ids([3, 4])
    assert block.block_id == own != cached.block_id
    assert block.content_hash is None and not block.computed
    assert a._cached_blocks == {0: cached.block_id}
    with pytest.raises(err.CallerError):
        block.append_token_ids([5])
    check_invariants(a, [cached, block])
    same = a.allocate_mutable_block(None)
    same.append_token_ids([1, 2])
    assert same.block_id == cached.block_id  # the same content still shares
    off = make(False)
    off_cached = off.allocate_immutable_block(None, [1, 2])
    off_block = off.allocate_mutable_block(None)
    off_block.append_token_ids([3, 4])
    assert off_block.block_id == off_cached.block_id


def test_promotion_of_new_content_records_it() -> None:
    a = make(True)
    block = a.allocate_mutable_block(None)
    block.append_token_ids([1, 2])
    assert a._cached_blocks == {0: block.block_id}
    assert a.allocate_immutable_block(None, [1, 2]).block_id == block.block_id
    assert a.allocate_immutable_block(None, [2, 1]).block_id != block.block_id


def test_an_evicted_content_is_forgotten() -> None:
    a = make(True, num_blocks=1)
    a.free(a.allocate_immutable_block(None, [1, 2]))
    other = a.allocate_immutable_block(None, [3, 4])  # evicts [1, 2]: hash 0 is free again
    assert other.content_hash == 0 and a._cached_blocks == {0: other.block_id}
    assert list(a._contents) == [other.block_id]
    a.free(other)
    assert a.allocate_immutable_block(None, [3, 4]).computed


def test_reset_forgets_contents() -> None:
    a = make(True)
    a.free(a.allocate_immutable_block(None, [1, 2]))
    assert a.reset_prefix_cache()
    assert a._contents == {}
    fresh = a.allocate_immutable_block(None, [3, 4])
    assert fresh.content_hash == 0


def test_full_blocks_touched_and_is_block_cached_check_content() -> None:
    on, off = make(True), make(False)
    for a in (on, off):
        a.allocate_immutable_block(None, [1, 2])
    on_other = on.allocate_mutable_block(None)
    on_other.append_token_ids([3, 4])  # no hash: counted as touched
    assert on.get_num_full_blocks_touched([on_other]) == 1
    # a detached Block spelling other content under a cached hash
    probe_on = on.allocate_immutable_block(None, [1, 2])
    on.free(probe_on, keep_block_object=True)
    probe_on._token_ids = [3, 4]
    assert on.get_num_full_blocks_touched([probe_on]) == 1
    assert not on.is_block_cached(probe_on)
    probe_off = off.allocate_immutable_block(None, [1, 2])
    off.free(probe_off, keep_block_object=True)
    probe_off._token_ids = [3, 4]
    assert off.get_num_full_blocks_touched([probe_off]) == 0
    assert off.is_block_cached(probe_off)
    probe_on._token_ids = [1, 2]
    assert on.get_num_full_blocks_touched([probe_on]) == 0
    assert on.is_block_cached(probe_on)


class Seq:
    def __init__(self, seq_id: int, tokens: List[int], extra: Optional[int] = None) -> None:
        self.seq_id, self.tokens, self.extra = seq_id, tokens, extra

    def get_token_ids(self) -> List[int]:
        return self.tokens

    def extra_hash(self) -> Optional[int]:
        return self.extra

    def is_prefill(self) -> bool:
        return False


@pytest.mark.parametrize("verify", [True, False])
def test_computed_blocks_tracker_checks_content(verify: bool) -> None:
    pair = CpuGpuBlockAllocator.create("prefix_caching", 8, 4, 2, hash_algo=zero,
                                       verify_content=verify)
    pair.allocate_immutable_blocks(None, [[1, 2]], Device.GPU)
    pair.mark_blocks_as_computed([])
    tracker = ComputedBlocksTracker(pair, 2, True)
    assert tracker.get_num_cached_tokens(Seq(1, [1, 2, 9])) == 2
    assert tracker.get_num_cached_tokens(Seq(2, [3, 4, 9])) == (0 if verify else 2)
    assert tracker.get_num_cached_tokens(Seq(3, [1, 2], extra=5)) == (0 if verify else 2)


def test_find_verified_blocks_prefix() -> None:
    a = make(True, hash_algo=lambda p, t, e: hash((p, t[0])))
    chain = a.allocate_immutable_blocks(None, [[1, 2], [3, 4], [5, 6]])
    a.mark_blocks_as_computed([])
    hashes = [b.content_hash for b in chain]
    assert a.find_verified_blocks_prefix(hashes, [1, 2, 3, 4, 5, 6]) == hashes
    assert a.find_verified_blocks_prefix(hashes, [1, 2, 3, 4, 5, 7]) == hashes[:2]
    assert a.find_verified_blocks_prefix(hashes, [1, 2, 3, 9, 5, 6]) == hashes[:1]
    assert a.find_verified_blocks_prefix(hashes, [1, 2, 3, 4]) == hashes[:2]
    assert a.find_verified_blocks_prefix(hashes, [1, 2, 3, 4, 5, 6], 1) == []
    assert a.find_verified_blocks_prefix(hashes[1:], [3, 4, 5, 6]) == []  # not a first block
    with pytest.raises(err.WrongTypeError):
        a.find_verified_blocks_prefix(hashes, "123456")  # type: ignore[arg-type]
    with pytest.raises(err.WrongTypeError):
        a.find_verified_blocks_prefix(hashes, [1, 2], "x")  # type: ignore[arg-type]
    off = make(False, hash_algo=lambda p, t, e: hash((p, t[0])))
    off_chain = off.allocate_immutable_blocks(None, [[1, 2], [3, 4]])
    off.mark_blocks_as_computed([])
    off_hashes = [b.content_hash for b in off_chain]
    assert off.find_verified_blocks_prefix(off_hashes, [1, 9, 3, 9]) == off_hashes


def test_cpu_gpu_find_verified_on_a_naive_pair() -> None:
    pair = CpuGpuBlockAllocator.create("naive", 4, 0, 2)
    assert pair.find_verified_blocks_prefix([1, 2], [1, 2, 3, 4]) == []


def test_swap_in_misses_on_other_content() -> None:
    pair: Any = CpuGpuBlockAllocator.create("prefix_caching", 4, 4, 2,
                                            hash_algo=first_token, verify_content=True)
    cpu = pair._allocators[Device.CPU]
    resident = cpu.allocate_immutable_blocks(None, [[1, 9]])  # hash 1 on the CPU
    chain = pair.allocate_immutable_blocks(None, [[1, 2], [3, 4]], Device.GPU)
    tail = pair.allocate_mutable_block(chain[-1], Device.GPU)
    tail.append_token_ids([5])
    blocks = [*chain, tail]
    mapping = pair.swap(blocks, Device.GPU, Device.CPU)
    assert len(set(mapping.values())) == 3 and resident[0].block_id not in mapping.values()
    assert [b.content_hash for b in chain] == [None, None]  # collided, and after it
    assert cpu._cached_blocks == {1: resident[0].block_id}
    check_invariants(cpu, [*resident, *blocks])
    back = pair.swap(blocks, Device.CPU, Device.GPU)
    assert len(back) == 3


def test_swap_in_hits_its_own_content() -> None:
    pair: Any = CpuGpuBlockAllocator.create("prefix_caching", 4, 4, 2,
                                            hash_algo=first_token, verify_content=True)
    cpu = pair._allocators[Device.CPU]
    resident = cpu.allocate_immutable_blocks(None, [[1, 2], [3, 4]])
    chain = pair.allocate_immutable_blocks(None, [[1, 2], [3, 4]], Device.GPU)
    mapping = pair.swap(chain, Device.GPU, Device.CPU)
    assert list(mapping.values()) == ids(resident)
    assert cpu.swap_in_demand([]) == 0
    assert cpu.get_prefix_cache_hit_rate() == 0.5  # two misses, then two hits


def test_swap_in_demand_counts_collisions() -> None:
    gpu = make(True, hash_algo=first_token)
    cpu = make(True, hash_algo=first_token)
    cpu.allocate_immutable_blocks(None, [[1, 9]])
    chain = gpu.allocate_immutable_blocks(None, [[1, 2], [3, 4]])
    gpu.swap_out(chain)
    assert cpu.swap_in_demand(chain) == 2
    off = make(False, hash_algo=first_token)
    off.allocate_immutable_blocks(None, [[1, 9]])
    assert off.swap_in_demand(chain) == 1


def test_verify_content_must_be_a_bool() -> None:
    with pytest.raises(err.InvalidArgumentError):
        PrefixCachingBlockAllocator(num_blocks=2, block_size=2, verify_content=1)  # type: ignore[arg-type]


def test_same_content() -> None:
    root = (None, (1, 2), None)
    assert same_content(None, None)
    assert same_content(root, (None, (1, 2), None))
    assert not same_content(root, None) and not same_content(None, root)
    assert not same_content(root, (None, (1, 3), None))
    assert not same_content(root, (None, (1, 2), 5))
    assert same_content((root, (3,), None), ((None, (1, 2), None), (3,), None))
    assert not same_content((root, (3,), None), ((None, (9, 2), None), (3,), None))
