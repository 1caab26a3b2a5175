"""The abstraction function and the content ledger, on real allocators."""

from __future__ import annotations

from typing import Any, List

import pytest

from prefixcache.impl.common import CacheMetricData
from prefixcache.impl.cpu_gpu_block_allocator import CpuGpuBlockAllocator
from prefixcache.impl.interfaces import Device
from prefixcache.impl.naive_block import NaiveBlock, NaiveBlockAllocator
from prefixcache.impl.prefix_caching_block import PrefixCachingBlockAllocator
from prefixcache.spec.abstraction import (
    AbstractionError,
    ContentLedger,
    abstract_device_states,
    abstract_state,
    chain_keys,
    content_key_of,
    contents_of,
    hits_and_misses,
    ownership,
    ownership_matches_live,
)
from prefixcache.spec.invariants import check_all
from prefixcache.spec.state import AbstractState, BlockState, EvictorEntry, HashedKey

K12 = ((None, (1, 2)),)
K1234 = ((None, (1, 2)), (None, (3, 4)))
K78 = ((None, (7, 8)),)


def _scenario() -> tuple[Any, List[Any], ContentLedger]:
    a: Any = PrefixCachingBlockAllocator(num_blocks=4, block_size=2)
    ledger = ContentLedger()
    chain = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]])   # ids 0, 1: two misses
    a.mark_blocks_as_computed([])
    m = a.allocate_mutable_block(chain[1])                         # id 2
    m.append_token_ids([5])
    g = a.allocate_immutable_block(None, [1, 2])                   # a hit on id 0
    x = a.allocate_immutable_block(None, [7, 8])                   # a miss: id 3, touched
    ledger.observe_block(x)
    a.mark_blocks_as_accessed([x.block_id], 2.0)
    a.free(x)                                                      # evictable, still touched
    return a, [*chain, m, g], ledger


def test_abstraction_after_operations() -> None:
    a, live, ledger = _scenario()
    s = abstract_state(a, ledger=ledger, live_blocks=live)
    assert s == AbstractState(
        block_ids=(0, 1, 2, 3),
        free=(),
        blocks={
            0: BlockState(2, K12, True, -1.0),
            1: BlockState(1, K1234, True, -1.0),
            2: BlockState(1, None, False, -1.0),
            3: BlockState(0, K78, False, 2.0),
        },
        cached={K12: 0, K1234: 1, K78: 3},
        evictor=(EvictorEntry(2.0, 2, 3, K78),),
        touched=frozenset({3}),
        copy_on_writes=(),
        hits=1,
        misses=3,
        reported_free=1,
        block_size=2,
    )
    assert check_all(s, ownership(live)) == []
    assert ownership_matches_live(s, live)


def test_abstraction_does_not_change_the_allocator() -> None:
    a, live, ledger = _scenario()
    before = abstract_state(a, ledger=ledger, live_blocks=live)
    again = abstract_state(a, ledger=ledger, live_blocks=live)
    assert before == again
    assert a.get_num_free_blocks() == 1


def test_evictable_ids_are_named_by_the_ledger_alone() -> None:
    a, live, ledger = _scenario()
    ledger.observe_blocks(live)
    s = abstract_state(a, ledger=ledger)     # no live Blocks: cache + ledger only
    assert s.blocks[3].content == K78
    assert s.blocks[2].content is None


def test_unnamed_hash_raises() -> None:
    a = PrefixCachingBlockAllocator(num_blocks=2, block_size=2)
    b = a.allocate_immutable_block(None, [1, 2])
    a.free(b)
    with pytest.raises(AbstractionError):
        abstract_state(a)


def test_contents_can_name_a_hash() -> None:
    a = PrefixCachingBlockAllocator(num_blocks=2, block_size=2)
    b: Any = a.allocate_immutable_block(None, [1, 2])
    s = abstract_state(a, {b.block_id: K12})
    assert s.cached == {K12: b.block_id}


def test_live_block_disagreeing_with_the_cache_breaks_integrity() -> None:
    a = PrefixCachingBlockAllocator(num_blocks=2, block_size=2)
    b: Any = a.allocate_immutable_block(None, [1, 2])
    ledger = ContentLedger()
    ledger.observe_block(b)
    s = abstract_state(a, {b.block_id: None}, ledger=ledger)
    assert "cached_content_matches" in check_all(s)


def test_content_key_walks_the_chain() -> None:
    a = PrefixCachingBlockAllocator(num_blocks=4, block_size=2)
    chain = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]], extra_hash=7)
    m = a.allocate_mutable_block(chain[-1], extra_hash=7)
    m.append_token_ids([5])
    assert content_key_of(m) == ((7, (1, 2)), (7, (3, 4)), (7, (5,)))
    assert [k for _, k in chain_keys(m)] == [
        ((7, (1, 2)),),
        ((7, (1, 2)), (7, (3, 4))),
        ((7, (1, 2)), (7, (3, 4)), (7, (5,))),
    ]
    assert [b for b, _ in chain_keys(m)] == [*chain, m]


def test_content_key_keeps_each_blocks_extra_hash() -> None:
    # [1,2]/extra 1 then [3,4]/extra 2 vs [1,2]/extra 2 then [3,4]/extra 2: the
    # same tokens and the same last extra hash, but vLLM chains each block's
    # own extra hash, so the allocator caches them apart; the keys differ too.
    a: Any = PrefixCachingBlockAllocator(num_blocks=4, block_size=2)
    first = a.allocate_immutable_block(None, [1, 2], extra_hash=1)
    x = a.allocate_immutable_block(first, [3, 4], extra_hash=2)
    y = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]], extra_hash=2)[-1]
    kx, ky = content_key_of(x), content_key_of(y)
    assert kx == ((1, (1, 2)), (2, (3, 4)))
    assert ky == ((2, (1, 2)), (2, (3, 4)))
    assert kx != ky and x.block_id != y.block_id
    live = [first, x, y.prev_block, y]
    ledger = ContentLedger()
    s = abstract_state(a, ledger=ledger, live_blocks=live)
    assert s.cached[kx] == x.block_id and s.cached[ky] == y.block_id
    assert len(s.cached) == 4 and not ledger.collisions and not ledger.conflicts
    assert check_all(s, ownership(live)) == []
    for b in live:                       # evictable: named by the ledger alone
        a.free(b)
    s = abstract_state(a, ledger=ledger)
    assert {e.content for e in s.evictor} >= {kx, ky}
    assert check_all(s, ownership([])) == []


def test_a_hashed_key_is_its_tuple_hashed_once() -> None:
    """A HashedKey equals, and hashes like, the tuple of its pairs (so either
    finds the other in a dict); one with an unhashable part raises
    TypeError when hashed, as the tuple would."""
    pairs = ((None, (1, 2)), (7, (3, 4)))
    key = HashedKey(pairs)
    assert key == pairs and hash(key) == hash(pairs) and {pairs: 1}[key] == 1
    odd = HashedKey([(None, ([1], 2))])
    with pytest.raises(TypeError):
        hash(odd)


def test_ledger_names_and_flags_collisions() -> None:
    ledger = ContentLedger()
    assert ledger.observe(10, K12)
    assert ledger.observe(10, K12)
    assert 10 in ledger and len(ledger) == 1
    assert ledger.name(10) == K12
    assert ledger.hash_of(K12) == 10
    assert not ledger.observe(10, ((None, (3, 4)),))
    assert ledger.name(10) == K12                      # the first name stays
    assert len(ledger.collisions) == 1
    assert "names two contents" in ledger.anomalies()[0]
    ledger.observe(11, K12)
    assert len(ledger.aliases) == 1


def test_ledger_sees_a_colliding_hash_from_blocks() -> None:
    a = PrefixCachingBlockAllocator(num_blocks=4, block_size=2,
                                    hash_algo=lambda p, t, e: sum(t))
    ledger = ContentLedger()
    b1 = a.allocate_immutable_block(None, [1, 2])
    b2 = a.allocate_immutable_block(None, [2, 1])   # same hash: the impl shares id
    ledger.observe_blocks([b1, b2])
    assert ledger.collisions and b1.block_id == b2.block_id


def test_contents_of_records_shared_id_conflicts() -> None:
    class FakeBlock:
        def __init__(self, block_id: int, tokens: List[int], h: Any) -> None:
            self.block_id, self.token_ids, self.content_hash = block_id, tokens, h
            self.prev_block = None
            self.extra_hash = None

    ledger = ContentLedger()
    out = contents_of([FakeBlock(0, [1, 2], 5), FakeBlock(0, [1], None)], ledger)
    assert out == {0: K12}
    assert len(ledger.conflicts) == 1
    assert ledger.anomalies()


def test_ownership_counts_distinct_attached_blocks() -> None:
    a = PrefixCachingBlockAllocator(num_blocks=2, block_size=2)
    b = a.allocate_immutable_block(None, [1, 2])
    f = a.fork(b)[0]
    d = a.allocate_mutable_block(None)
    a.free(d, keep_block_object=True)
    assert ownership([b, b, f, d]) == {b.block_id: 2}


def test_hits_and_misses_across_completed_buckets() -> None:
    m = CacheMetricData()
    hits = 0
    for q in range(2503):
        hit = q % 3 == 0
        hits += hit
        m.query(hit)
    assert hits_and_misses(m) == (hits, 2503 - hits)
    assert hits_and_misses(None) == (0, 0)


def test_naive_allocator_reader() -> None:
    a = NaiveBlockAllocator(create_block=NaiveBlock, num_blocks=3, block_size=2)
    b = a.allocate_immutable_block(None, [1, 2])
    f = a.fork(b)[0]
    s = abstract_state(a)
    assert s.free == (1, 2)
    assert s.blocks == {0: BlockState(2, None, False, -1.0)}
    assert s.cached == {} and s.evictor == () and s.reported_free == 2
    assert check_all(s, ownership([b, f])) == []


def test_cpu_gpu_reader_gives_one_state_per_device() -> None:
    g = CpuGpuBlockAllocator.create("prefix_caching", 3, 2, 2)
    chain = g.allocate_immutable_blocks(None, [[1, 2], [3, 4]], Device.GPU)
    ledger = ContentLedger()
    g.swap(chain, Device.GPU, Device.CPU)
    states = abstract_device_states(g, ledger=ledger, live_blocks=chain)
    assert set(states) == {"GPU", "CPU"}
    assert states["CPU"].block_ids == (3, 4)
    assert states["CPU"].cached == {K12: 3, K1234: 4}
    assert [e.block_id for e in states["GPU"].evictor] == [1, 0]   # deepest first
    owners = ownership(chain)
    for s in states.values():
        assert check_all(s, {i: n for i, n in owners.items() if i in s.block_ids}) == []


def test_ownership_survives_a_swap_then_free() -> None:
    g = CpuGpuBlockAllocator.create("prefix_caching", 2, 2, 2)
    cpu_live = g.allocate_mutable_block(None, Device.CPU)
    moved = g.allocate_mutable_block(None, Device.GPU)
    g.swap([moved], Device.GPU, Device.CPU)
    g.free(moved)
    fresh = g.allocate_mutable_block(None, Device.CPU)
    assert fresh is not cpu_live
    states = abstract_device_states(g, live_blocks=[cpu_live, fresh])
    assert check_all(states["CPU"], ownership([cpu_live, fresh])) == []
