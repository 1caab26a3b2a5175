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


def test_a_fork_of_a_colliding_block_has_no_hash_either() -> None:
    a = make(True)
    first = a.allocate_immutable_block(None, [1, 2])
    second = a.allocate_immutable_block(None, [3, 4])  # collides: its own id, no hash
    (forked,) = a.fork(second)
    assert forked.block_id == second.block_id and forked.content_hash is None
    with pytest.raises(err.UnhashableBlockError):
        a.is_block_cached(forked)
    check_invariants(a, [first, second, forked])


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
    plain = a.allocate_immutable_block(None, [3, 4])  # collides; its id evicts [1, 2]
    assert plain.content_hash is None and a._cached_blocks == {} and a._contents == {}
    a.free(plain)
    other = a.allocate_immutable_block(None, [3, 4])  # hash 0 is free again
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


# -- sharper pins for each verify_content branch ---------------------------------------


def keyed(parent: Optional[int], tokens: Any, extra: Optional[int]) -> int:
    """Blocks collide when their parent hash, first token and extra agree."""
    return hash((parent, int(tokens[0]), extra))


H0 = keyed(None, [1], None)  # [1, x] as a first block
H1 = keyed(H0, [5], None)  # [5, x] after it
X = (None, (1, 2), None)


def test_same_content_of_different_lengths() -> None:
    assert not same_content((X, (3, 4), None), (None, (3, 4), None))
    assert not same_content((None, (3, 4), None), (X, (3, 4), None))
    assert same_content(X, X)
    assert not same_content((X, (3, 4), 1), (X, (3, 4), 2))
    assert not same_content((X, (3, 4), None), (X, (3, 5), None))
    assert same_content((X, (3, 4), None), (X, (3, 4), None))


def test_defaults_do_not_verify() -> None:
    plain: Any = PrefixCachingBlockAllocator(num_blocks=2, block_size=2, hash_algo=zero)
    assert plain._verify_content is False
    assert (plain.allocate_immutable_block(None, [1, 2]).block_id
            == plain.allocate_immutable_block(None, [3, 4]).block_id)
    pair: Any = CpuGpuBlockAllocator.create("prefix_caching", 2, 2, 2)
    assert [pair._allocators[d]._verify_content for d in (Device.GPU, Device.CPU)] == [False] * 2
    on: Any = CpuGpuBlockAllocator.create("prefix_caching", 2, 2, 2, hash_algo=zero,
                                          verify_content=True)
    assert [on._allocators[d]._verify_content for d in (Device.GPU, Device.CPU)] == [True] * 2
    assert on._allocators[Device.CPU]._hash_fn is zero


def test_verified_demand_table() -> None:
    a = make(True, num_blocks=4)
    r, s = X, (None, (3, 4), None)
    demand = a._verified_demand
    assert demand([], [], []) == 0
    assert demand([None], [None], [-1]) == 1
    assert demand([0], [r], [-1]) == 1
    assert demand([0, 0], [r, r], [-1, -1]) == 1  # the same new content twice: one id
    assert demand([0, 0], [r, s], [-1, -1]) == 2  # a collision inside the run
    assert demand([0, 0], [r, (r, (1, 2), None)], [-1, 0]) == 2
    assert demand([0, 0, 0], [r, s, r], [-1, -1, 1]) == 3  # after a plain block: plain
    assert demand([0, 0, 0], [r, s, r], [-1, -1, 0]) == 2
    assert demand([None, 0], [None, r], [-1, 0]) == 2
    held = a.allocate_immutable_block(None, [1, 2])
    assert demand([0], [r], [-1]) == 0  # a hit on an id in use
    assert demand([0], [s], [-1]) == 1
    assert demand([0, 0], [s, r], [-1, -1]) == 1
    assert demand([0, 0], [s, r], [-1, 0]) == 2
    assert demand([0, 0], [r, r], [-1, -1]) == 0
    a.free(held)
    assert demand([0], [r], [-1]) == 1  # a hit on an evictable id takes it
    assert demand([0, 0], [r, r], [-1, -1]) == 1
    assert demand([0], [s], [-1]) == 1
    assert a.get_num_free_blocks() == 4 and a._contents == {held_id(a): r}


def held_id(a: Any) -> int:
    (only,) = a._cached_blocks.values()
    return int(only)


def test_a_block_after_a_collision_never_hits() -> None:
    a = make(True, num_blocks=4, hash_algo=keyed)
    x, y = a.allocate_immutable_blocks(None, [[1, 2], [5, 6]])
    assert ids([x, y]) == [0, 1] and [x.content_hash, y.content_hash] == [H0, H1]
    assert a._touched_blocks == {0, 1} and not x.computed and not y.computed
    fillers = [a.allocate_mutable_block(None) for _ in range(2)]
    assert ids(fillers) == [2, 3]
    a.free(x)
    a.free(a.allocate_mutable_block(None))  # evicts [1, 2]: H0 is free again
    assert a._cached_blocks == {H1: 1} and list(a._contents) == [1]
    other = a.allocate_immutable_block(None, [1, 3])  # takes H0
    assert other.block_id == 0 and other.content_hash == H0
    assert a._cached_blocks == {H0: 0, H1: 1}
    assert a._contents[0] == (None, (1, 3), None) and a._contents[1] == (X, (5, 6), None)
    rx, ry = X, (X, (5, 6), None)
    assert a._verified_demand([H0, H1], [rx, ry], [-1, 0]) == 2
    assert a._verified_demand([H0, H1], [rx, ry], [-1, -1]) == 1  # y's id is in use
    a.free(fillers[0])
    refcounts = dict(a._refcounts)
    with pytest.raises(err.NoFreeBlocksError):
        a.allocate_immutable_blocks(None, [[1, 2], [5, 6]])  # two plain blocks, one id
    assert a.get_num_free_blocks() == 1 and dict(a._refcounts) == refcounts
    assert a.metric_data.num_incompleted_block_queries == 3
    assert a.metric_data.num_incompleted_block_hit == 0
    a.free(fillers[1])
    again = a.allocate_immutable_blocks(None, [[1, 2], [5, 6]])
    assert ids(again) == [3, 2]
    assert [b.content_hash for b in again] == [None, None]
    assert [b.computed for b in again] == [False, False]
    assert again[1].prev_block is again[0]
    assert a._cached_blocks == {H0: 0, H1: 1} and a._refcounts[1] == 1
    assert a.get_prefix_cache_hit_rate() == 0.0 and a.get_num_free_blocks() == 0
    assert a._touched_blocks == {0, 1}


def test_allocation_after_a_cached_prev_block_hits_and_interns() -> None:
    a = make(True, hash_algo=keyed)
    x, y = a.allocate_immutable_blocks(None, [[1, 2], [5, 6]])
    assert a._content_of(y) is a._contents[y.block_id]
    assert a._content_of(None) is None
    hit = a.allocate_immutable_blocks(x, [[5, 6]])
    assert ids(hit) == [y.block_id] and hit[0].computed and hit[0].content_hash == H1
    assert hit[0].prev_block is x
    other = a.allocate_immutable_blocks(x, [[7, 8]])
    assert other[0].block_id == 2 and not other[0].computed
    assert a._contents[2][0] is a._contents[x.block_id]  # the parent record is shared
    collide = a.allocate_immutable_blocks(x, [[5, 9]])  # H1 names [5, 6]
    assert collide[0].block_id == 3 and collide[0].content_hash is None
    same = a.allocate_immutable_blocks(None, [[1, 2], [7, 8]])
    assert ids(same) == [0, 2] and [b.computed for b in same] == [True, True]
    assert a.get_prefix_cache_hit_rate() == pytest.approx(3 / 7)
    assert a._touched_blocks == {0, 1, 2}


def test_content_of_another_allocators_block_is_spelled() -> None:
    mine, theirs = make(True), make(True)
    cached = mine.allocate_immutable_block(None, [3, 4])
    foreign = theirs.allocate_immutable_block(None, [1, 2])
    assert cached.block_id == foreign.block_id == 0
    assert not mine.is_block_cached(foreign)
    assert mine._content_of(foreign) == X
    assert mine.get_num_full_blocks_touched([foreign]) == 1
    assert theirs.is_block_cached(foreign)


def test_is_block_cached_on_an_uncached_hash() -> None:
    a = make(True, hash_algo=keyed)
    other = make(True, hash_algo=keyed)
    block = other.allocate_immutable_block(None, [1, 2])
    assert a.is_block_cached(block) is False
    a.allocate_immutable_block(None, [1, 2])
    assert a.is_block_cached(block) is True


def test_full_blocks_touched_counts_evictable_and_repeats() -> None:
    a = make(True, hash_algo=keyed)
    kept = a.allocate_immutable_block(None, [1, 2])
    gone = a.allocate_immutable_block(None, [3, 4])
    a.free(gone, keep_block_object=True)
    gone._block_id = None  # type: ignore[attr-defined]
    assert a.get_num_full_blocks_touched([kept]) == 0
    assert a.get_num_full_blocks_touched([gone]) == 1  # evictable: takes an id
    assert a.get_num_full_blocks_touched([kept, gone, gone]) == 2
    partial = a.allocate_mutable_block(None)
    partial.append_token_ids([7])
    assert a.get_num_full_blocks_touched([partial, kept]) == 0


def test_swap_in_plan() -> None:
    gpu = make(True, hash_algo=keyed)
    cpu = make(True, hash_algo=keyed)
    chain = gpu.allocate_immutable_blocks(None, [[1, 2], [5, 6]])
    tail = gpu.allocate_mutable_block(chain[-1])
    tail.append_token_ids([7])
    gpu.swap_out([*chain, tail])
    hashes, records, parents = cpu._swap_in_plan([*chain, tail])
    assert hashes == [H0, H1, None] and parents == [-1, 0, 1]
    assert records[0] == X and records[1] == (X, (5, 6), None) and records[2] is None
    assert records[1][0] is records[0]
    hashes, records, parents = cpu._swap_in_plan([chain[1], chain[0]])
    assert hashes == [H1, H0] and parents == [-1, -1]
    assert records == [(X, (5, 6), None), X]
    assert cpu._swap_in_plan([]) == ([], [], [])


def test_swap_in_same_content_twice_takes_one_id() -> None:
    gpu = make(True, hash_algo=keyed)
    cpu = make(True, num_blocks=1, hash_algo=keyed)
    one = gpu.allocate_immutable_block(None, [1, 2])
    two = gpu.allocate_immutable_block(None, [1, 2])
    gpu.swap_out([one, two])
    assert cpu.swap_in_demand([one, two]) == 1
    cpu.swap_in([one, two])
    assert ids([one, two]) == [0, 0] and cpu._refcounts[0] == 2
    assert [one.content_hash, two.content_hash] == [H0, H0]
    assert cpu._cached_blocks == {H0: 0} and cpu._contents == {0: X}
    assert cpu.get_prefix_cache_hit_rate() == 0.5
    assert cpu.get_num_free_blocks() == 0


def test_swap_in_refuses_one_id_short_and_changes_nothing() -> None:
    gpu = make(True, hash_algo=keyed)
    chain = gpu.allocate_immutable_blocks(None, [[1, 2], [5, 6]])
    gpu.swap_out(chain)
    short = make(True, num_blocks=2, hash_algo=keyed)
    short.allocate_immutable_block(None, [1, 9])  # H0 names other content
    assert short.swap_in_demand(chain) == 2
    with pytest.raises(err.NoFreeBlocksError):
        short.swap_in(chain)
    assert ids(chain) == [None, None] and [b.content_hash for b in chain] == [H0, H1]
    assert short.get_num_free_blocks() == 1 and list(short._cached_blocks) == [H0]
    assert short.get_prefix_cache_hit_rate() == 0.0
    exact = make(True, num_blocks=3, hash_algo=keyed)
    exact.allocate_immutable_block(None, [1, 9])
    exact.swap_in(chain)
    assert ids(chain) == [1, 2] and [b.content_hash for b in chain] == [None, None]
    assert list(exact._cached_blocks) == [H0] and exact.get_num_free_blocks() == 0


def test_swap_in_a_child_without_its_parent_listed_is_hashed() -> None:
    gpu = make(True, hash_algo=keyed)
    chain = gpu.allocate_immutable_blocks(None, [[1, 2], [5, 6]])
    gpu.swap_out(chain)
    cpu = make(True, num_blocks=4, hash_algo=keyed)
    cpu.allocate_immutable_block(None, [1, 9])
    assert cpu.swap_in_demand([chain[1]]) == 1
    cpu.swap_in([chain[1]])
    assert chain[1].block_id == 1 and chain[1].content_hash == H1
    assert cpu._cached_blocks == {H0: 0, H1: 1}
    assert cpu._contents[1] == (X, (5, 6), None)
    assert cpu._touched_blocks == {0, 1}


def test_swap_in_hit_on_an_evictable_id() -> None:
    gpu = make(True, hash_algo=keyed)
    chain = gpu.allocate_immutable_blocks(None, [[1, 2]])
    gpu.swap_out(chain)
    cpu = make(True, num_blocks=1, hash_algo=keyed)
    cpu.free(cpu.allocate_immutable_block(None, [1, 2]))
    assert cpu.swap_in_demand(chain) == 1
    cpu.swap_in(chain)
    assert chain[0].block_id == 0 and cpu._refcounts[0] == 1 and cpu.evictor.num_blocks == 0
    assert cpu.get_prefix_cache_hit_rate() == 0.5


def test_find_verified_checks_parent_and_extra() -> None:
    a = make(True, hash_algo=lambda p, t, e: hash((tuple(t), e)))  # ignores the parent
    a.allocate_immutable_blocks(None, [[1, 2], [3, 4]])
    alone = a.allocate_immutable_blocks(None, [[5, 6]])
    tenant = a.allocate_immutable_blocks(None, [[7, 8], [9, 9]], extra_hash=7)
    a.mark_blocks_as_computed([])
    hashes = [alone[0].content_hash, hash(((3, 4), None))]
    assert a.find_cached_blocks_prefix(hashes) == hashes
    assert a.find_verified_blocks_prefix(hashes, [5, 6, 3, 4]) == hashes[:1]
    t_hashes = [b.content_hash for b in tenant]
    assert a.find_verified_blocks_prefix(t_hashes, [7, 8, 9, 9], 7) == t_hashes
    assert a.find_verified_blocks_prefix(t_hashes, [7, 8, 9, 9]) == []
    assert a.find_verified_blocks_prefix(t_hashes, [7, 8, 9, 9], 8) == []
    assert a.find_verified_blocks_prefix([], []) == []


def test_cpu_gpu_find_verified_passes_everything_through() -> None:
    pair: Any = CpuGpuBlockAllocator.create("prefix_caching", 2, 2, 2, hash_algo=zero,
                                            verify_content=True)
    cpu = pair._allocators[Device.CPU]
    cpu.allocate_immutable_blocks(None, [[1, 2]], extra_hash=3)
    cpu.mark_blocks_as_computed([])
    assert pair.find_verified_blocks_prefix([0], [1, 2], 3, Device.CPU) == [0]
    assert pair.find_verified_blocks_prefix([0], [1, 2], None, Device.CPU) == []
    assert pair.find_verified_blocks_prefix([0], [1, 2], 3) == []  # nothing on the GPU
    assert pair.find_verified_blocks_prefix([0], [1, 2], 3, device=Device.CPU) == [0]


def test_promotion_records_the_chain_and_moves_onto_the_same_content() -> None:
    a = make(True, num_blocks=4, hash_algo=keyed)
    first = a.allocate_immutable_block(None, [1, 2])
    block = a.allocate_mutable_block(first)
    block.append_token_ids([5, 6])
    assert block.block_id == 1 and block.content_hash == H1
    assert a._contents[1] == (X, (5, 6), None) and a._contents[1][0] is a._contents[0]
    assert a._touched_blocks == {0, 1} and a._cached_blocks == {H0: 0, H1: 1}
    twin = a.allocate_mutable_block(first)
    assert twin.block_id == 2
    twin.append_token_ids([5, 6])
    assert twin.block_id == 1 and twin.computed and a._refcounts[1] == 2
    assert a.get_num_free_blocks() == 2 and a._refcounts[2] == 0
    clash = a.allocate_mutable_block(first)
    clash.append_token_ids([5, 7])  # H1 names [5, 6]
    assert clash.block_id == 2 and clash.content_hash is None and not clash.computed
    assert a._cached_blocks == {H0: 0, H1: 1} and sorted(a._contents) == [0, 1]
    assert a.get_prefix_cache_hit_rate() == 0.0  # promotion is not a query


def test_records_of_one_content_are_one_object() -> None:
    a = make(True, hash_algo=keyed)
    (x,) = a.allocate_immutable_blocks(None, [[1, 2]])
    x_then_z = a.allocate_immutable_blocks(None, [[1, 2], [7, 8]])
    assert ids(x_then_z) == [0, 1]
    assert a._contents[1] == (X, (7, 8), None) and a._contents[1][0] is a._contents[0]
    gpu = make(True, hash_algo=keyed)
    moved = gpu.allocate_immutable_blocks(None, [[1, 2], [7, 8]])
    gpu.swap_out(moved)
    hashes, records, parents = a._swap_in_plan(moved)
    assert records[0] is a._contents[0] and records[1] is a._contents[1]
    assert hashes == [H0, keyed(H0, [7], None)] and parents == [-1, 0]


def test_an_evicted_id_taken_as_mutable_forgets_its_content() -> None:
    a = make(True, num_blocks=1)
    a.free(a.allocate_immutable_block(None, [1, 2]))
    assert a._contents == {0: X}
    mutable = a.allocate_mutable_block(None)
    assert mutable.block_id == 0 and a._contents == {} and a._cached_blocks == {}
    off = make(False, num_blocks=1)
    off.free(off.allocate_immutable_block(None, [1, 2]))
    assert off.allocate_immutable_block(None, [3, 4]).block_id == 0  # evicts: no contents
    assert off._contents == {}


def test_swap_back_in_after_the_content_was_evicted() -> None:
    a = make(True, num_blocks=2, hash_algo=keyed)
    chain = a.allocate_immutable_blocks(None, [[1, 2], [5, 6]])
    a.swap_out(chain)
    a.allocate_mutable_block(None)
    a.allocate_mutable_block(None)  # both evicted
    assert a._cached_blocks == {} and a._contents == {}
    hashes, records, parents = a._swap_in_plan(chain)
    assert hashes == [H0, H1] and records == [X, (X, (5, 6), None)] and parents == [-1, 0]


def test_verified_blocks_keep_their_extra_hash_and_hash_once() -> None:
    calls: List[Any] = []

    def counting(parent: Optional[int], tokens: Any, extra: Optional[int]) -> int:
        calls.append(tuple(tokens))
        return keyed(parent, tokens, extra)

    a = make(True, hash_algo=counting)
    chain = a.allocate_immutable_blocks(None, [[1, 2], [5, 6]], extra_hash=7)
    assert [b.extra_hash for b in chain] == [7, 7]
    assert len(calls) == 2
    assert [b.content_hash for b in chain] == [keyed(None, [1], 7),
                                               keyed(keyed(None, [1], 7), [5], 7)]
    assert len(calls) == 2  # the hashes were kept, not computed again
    assert a._contents[chain[1].block_id] == ((None, (1, 2), 7), (5, 6), 7)


def test_swap_in_plan_spells_the_extra_hash() -> None:
    gpu = make(True, hash_algo=keyed)
    chain = gpu.allocate_immutable_blocks(None, [[1, 2], [5, 6]], extra_hash=7)
    gpu.swap_out(chain)
    cpu = make(True, hash_algo=keyed)
    _, records, _ = cpu._swap_in_plan(chain)
    assert records == [(None, (1, 2), 7), ((None, (1, 2), 7), (5, 6), 7)]


def test_swap_in_after_a_hashless_parent_is_plain() -> None:
    gpu = make(True, hash_algo=keyed)
    x, y = gpu.allocate_immutable_blocks(None, [[1, 2], [5, 6]])
    gpu.swap_out([x, y])
    cpu = make(True, hash_algo=keyed)
    cpu.allocate_immutable_block(None, [1, 9])  # H0 names other content
    cpu.swap_in([x])
    assert x.block_id == 1 and x.content_hash is None
    cpu.swap_out([x])
    assert y.content_hash == H1  # y kept the hash it had on the GPU
    assert cpu.swap_in_demand([x, y]) == 2
    cpu.swap_in([x, y])
    assert ids([x, y]) == [1, 2]
    assert x.content_hash is None and y.content_hash is None
    assert list(cpu._cached_blocks) == [H0] and sorted(cpu._contents) == [0]


def test_swap_in_demand_uses_the_listed_parents() -> None:
    gpu = make(True, hash_algo=keyed)
    (a_block,) = gpu.allocate_immutable_blocks(None, [[1, 2]])
    (b_block,) = gpu.allocate_immutable_blocks(None, [[3, 4]])
    gpu.swap_out([a_block, b_block])
    cpu = make(True, num_blocks=3, hash_algo=keyed)
    cpu.allocate_immutable_block(None, [1, 9])  # H0 names other content
    resident = cpu.allocate_immutable_block(None, [3, 4])
    assert cpu.swap_in_demand([a_block, b_block]) == 1  # b is no child of a
    cpu.swap_in([a_block, b_block])
    assert ids([a_block, b_block]) == [2, resident.block_id]
    assert a_block.content_hash is None and b_block.content_hash == resident.content_hash
    assert cpu._refcounts[resident.block_id] == 2 and cpu.get_num_free_blocks() == 0


def test_is_block_cached_argument_errors() -> None:
    a = make(True)
    with pytest.raises(err.WrongTypeError):
        a.is_block_cached("block")  # type: ignore[arg-type]
    with pytest.raises(err.UnhashableBlockError):
        a.is_block_cached(a.allocate_mutable_block(None))


def test_swap_in_is_atomic_when_a_collision_evicts_a_later_hit() -> None:
    cpu = make(True, num_blocks=3, hash_algo=keyed)
    c, child = cpu.allocate_immutable_blocks(None, [[1, 9], [5, 6]])
    d = cpu.allocate_immutable_block(None, [3, 4])
    cpu.mark_blocks_as_accessed([c.block_id], 1.0)  # c is the first victim
    cpu.mark_blocks_as_accessed([d.block_id], 2.0)
    cpu.free(c)
    cpu.free(d)
    one, two = make(True, hash_algo=keyed), make(True, hash_algo=keyed)
    x = one.allocate_immutable_block(None, [1, 2])  # collides with c
    c2, child2 = two.allocate_immutable_blocks(None, [[1, 9], [5, 6]])
    one.swap_out([x])
    two.swap_out([c2, child2])
    blocks = [x, c2, child2]
    assert cpu.swap_in_demand(blocks) == 2 == cpu.get_num_free_blocks()
    # x's id evicts c, yet x stays plain (its outcome was settled first), so c2
    # misses on a fresh id instead of colliding with x, and child2 still hits.
    cpu.swap_in(blocks)
    assert ids(blocks) == [0, 2, child.block_id] and cpu.get_num_free_blocks() == 0
    assert [b.content_hash for b in blocks] == [None, H0, keyed(H0, [5], None)]
    assert cpu._cached_blocks == {H0: 2, keyed(H0, [5], None): child.block_id}
