"""Hand-worked scenarios for the abstract model: every id and result below was
worked out on paper from vLLM 0.8.5's documented behaviour (SPEC.md), not
read off the model."""

from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import Any, Callable

import pytest
from helpers.code_lines import code_lines
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixcache.impl import errors as err
from prefixcache.model import ChoiceNotAllowed, DeviceModel, Handle, Model, ModelInvariantError
from prefixcache.spec.invariants import check_all
from prefixcache.spec.state import AbstractState


def ids(handles: list[Handle]) -> list[int | None]:
    return [h.block_id for h in handles]


def evictor_ids(s: AbstractState) -> list[int]:
    return [e.block_id for e in s.evictor]


def unchanged(m: Model, call: Callable[[], object], exc: type[BaseException]) -> None:
    """``call`` raises ``exc`` and leaves the model's state exactly as it was."""
    before = m.state()
    with pytest.raises(exc):
        call()
    assert m.state() == before


# ------------------------------------------------------------ ids and sharing


def test_ids_are_handed_out_in_order_and_a_freed_id_comes_back_first() -> None:
    m = Model(num_blocks=4, block_size=2)
    a, b = m.allocate_mutable_block(None), m.allocate_mutable_block(None)
    assert (a.block_id, b.block_id) == (0, 1)
    m.free(a)
    assert m.state().free == (0, 2, 3)
    assert m.allocate_mutable_block(None).block_id == 0
    assert m.get_num_free_blocks() == 2


def test_custom_block_ids_keep_their_order_and_physical_ids_are_ranks() -> None:
    m = Model(3, 2, block_ids=[5, 3, 9])
    assert m.allocate_mutable_block(None).block_id == 5
    assert [m.get_physical_block_id(i) for i in (3, 5, 9)] == [0, 1, 2]
    assert m.all_block_ids == frozenset({3, 5, 9}) and m.get_num_total_blocks() == 3
    unchanged(m, lambda: m.get_physical_block_id(4), err.UnknownBlockIdError)


def test_same_content_shares_one_id_and_a_hit_is_computed() -> None:
    m = Model(4, 2)
    a = m.allocate_immutable_block(None, [1, 2])
    b = m.allocate_immutable_block(None, [1, 2])
    assert (a.block_id, b.block_id) == (0, 0)
    assert (a.computed, b.computed) == (False, True)
    s = m.state()
    assert s.blocks[0].refcount == 2 and not s.blocks[0].computed
    assert s.touched == {0} and (s.hits, s.misses) == (1, 1)
    assert m.ownership() == {0: 2}
    m.mark_blocks_as_computed([])  # the argument is ignored
    assert m.state().blocks[0].computed and m.state().touched == frozenset()


def test_chains_share_their_common_prefix_only() -> None:
    m = Model(4, 2)
    assert ids(m.allocate_immutable_blocks(None, [[1, 2], [3, 4]])) == [0, 1]
    assert ids(m.allocate_immutable_blocks(None, [[1, 2], [5, 6]])) == [0, 2]
    # the same tokens under another extra hash are other content
    assert ids(m.allocate_immutable_blocks(None, [[1, 2]], extra_hash=7)) == [3]
    assert m.state().cached[((None, (1, 2)), (None, (5, 6)))] == 2


# ----------------------------------------------------------------- eviction


def test_eviction_order_ties_deepest_block_first_then_smallest_id() -> None:
    m = Model(4, 2)
    a0, a1 = m.allocate_immutable_blocks(None, [[1, 2], [3, 4]])  # ids 0, 1
    b = m.allocate_immutable_block(None, [9, 9])  # id 2
    m.free(a0)
    m.free(b)
    m.free(a1)
    # all at -1: id 1 holds 4 tokens, ids 0 and 2 hold 2 each
    assert evictor_ids(m.state()) == [1, 0, 2]
    assert m.get_num_free_blocks() == 4
    assert m.allocate_mutable_block(None).block_id == 3  # a free id before any eviction
    assert m.allocate_mutable_block(None).block_id == 1
    assert ((None, (1, 2)), (None, (3, 4))) not in m.state().cached
    assert m.allocate_mutable_block(None).block_id == 0
    assert m.allocate_mutable_block(None).block_id == 2
    assert m.state().cached == {}
    unchanged(m, lambda: m.allocate_mutable_block(None), err.NoFreeBlocksError)


def test_access_times_reorder_the_evictor_and_a_hit_revives_with_minus_one() -> None:
    m = Model(3, 2)
    a0, a1 = m.allocate_immutable_blocks(None, [[1, 2], [3, 4]])
    m.mark_blocks_as_accessed([0], 5.0)  # in use: the tracker
    m.free(a1)
    m.free(a0)
    assert [(e.block_id, e.last_accessed) for e in m.state().evictor] == [(1, -1), (0, 5.0)]
    m.mark_blocks_as_accessed([1], 7.0)  # evictable: the entry, re-sorted
    assert [(e.block_id, e.last_accessed) for e in m.state().evictor] == [(0, 5.0), (1, 7.0)]
    m.mark_blocks_as_computed([])
    b = m.allocate_immutable_block(None, [1, 2])
    assert b.block_id == 0 and b.computed
    s = m.state()
    assert s.blocks[0].refcount == 1 and s.blocks[0].computed
    assert s.blocks[0].last_accessed == -1 and evictor_ids(s) == [1]
    unchanged(m, lambda: m.mark_blocks_as_accessed([2], 1.0), err.BlockNotOnDeviceError)
    unchanged(m, lambda: m.mark_blocks_as_accessed([0, 42], 1.0), err.UnknownBlockIdError)
    unchanged(m, lambda: m.mark_blocks_as_accessed([None], 1.0), err.UnknownBlockIdError)  # type: ignore[list-item]


def test_an_evicted_and_reused_id_is_not_computed_and_not_touched() -> None:
    m = Model(1, 2)
    m.free(m.allocate_immutable_block(None, [1, 2]))  # id 0: promoted, touched, evictable
    assert m.state().touched == {0}
    c = m.allocate_mutable_block(None)
    assert c.block_id == 0
    s = m.state()
    assert s.blocks[0].content is None and not s.blocks[0].computed and s.touched == frozenset()
    m.mark_blocks_as_computed([0])
    assert not m.state().blocks[0].computed


# ----------------------------------------------------- appending, copy-on-write


def test_copy_on_write_records_the_pair_and_the_copy_is_promoted() -> None:
    m = Model(4, 2)
    a = m.allocate_mutable_block(None)
    m.append_token_ids(a, [1])
    (b,) = m.fork(a)
    assert b.block_id == 0 and m.state().blocks[0].refcount == 2
    m.append_token_ids(b, [2])
    assert (a.block_id, b.block_id) == (0, 1)
    assert (a.token_ids, b.token_ids) == ([1], [1, 2])
    s = m.state()
    assert s.copy_on_writes == ((0, 1),)
    assert s.blocks[0].refcount == 1 and s.cached == {((None, (1, 2)),): 1} and s.touched == {1}
    assert m.clear_copy_on_writes() == [(0, 1)] and m.clear_copy_on_writes() == []
    m.append_token_ids(a, [3])  # not shared: no copy
    assert a.block_id == 0 and m.state().copy_on_writes == ()


def test_duplicate_promotion_returns_its_own_id_to_the_front() -> None:
    m = Model(4, 2)
    x = m.allocate_immutable_block(None, [1, 2])  # id 0
    y = m.allocate_mutable_block(None)  # id 1
    m.append_token_ids(y, [1])
    m.append_token_ids(y, [2])
    assert (x.block_id, y.block_id, y.computed) == (0, 0, True)
    s = m.state()
    assert s.free == (1, 2, 3) and s.blocks[0].refcount == 2
    assert (s.hits, s.misses) == (0, 1)  # a promotion is no query


def test_duplicate_promotion_revives_an_evictable_id() -> None:
    m = Model(3, 2)
    m.free(m.allocate_immutable_block(None, [1, 2]))  # id 0, evictable
    y = m.allocate_mutable_block(None)  # id 1
    m.append_token_ids(y, [1, 2])
    assert y.block_id == 0 and y.computed
    s = m.state()
    assert s.free == (1, 2) and s.evictor == () and s.blocks[0].refcount == 1
    # id 0 is still touched (promoted, never marked): not computed until marked
    assert s.touched == {0} and not s.blocks[0].computed
    m.mark_blocks_as_computed([])
    assert m.state().blocks[0].computed


def test_a_block_after_a_non_full_block_has_no_content() -> None:
    m = Model(4, 2)
    a = m.allocate_mutable_block(None)
    m.append_token_ids(a, [1])
    b = m.allocate_mutable_block(a)
    m.append_token_ids(b, [7, 8])
    assert b.is_full and b.content_key is None and m.state().cached == {}
    m.append_token_ids(a, [2])  # a fills and is promoted; b still has no content
    assert a.content_key == ((None, (1, 2)),) and b.content_key is None
    unchanged(m, lambda: m.allocate_immutable_block(b, [5, 6]), err.UnhashableBlockError)
    m.append_token_ids(b, [])  # nothing to append: allowed
    unchanged(m, lambda: m.append_token_ids(b, [9]), err.BlockFullError)


def test_mixed_extra_hash_chains_are_distinct_content() -> None:
    # vLLM hashes each block with its own extra hash, so these two chains end
    # in different content; the spec's ContentKey keeps every block's extra
    # hash, so the model (invariants checked after every call) keeps them apart.
    m = Model(4, 2)
    a = m.allocate_immutable_block(None, [0, 1])
    b = m.allocate_immutable_block(a, [0, 0], extra_hash=1)
    c = m.allocate_immutable_block(None, [0, 1], extra_hash=1)
    d = m.allocate_immutable_block(c, [0, 0], extra_hash=1)
    assert ids([a, b, c, d]) == [0, 1, 2, 3] and m.state().hits == 0
    assert b.content_key == b.key == ((None, (0, 1)), (1, (0, 0)))
    assert d.content_key == d.key == ((1, (0, 1)), (1, (0, 0)))


def test_chains_differing_only_in_a_first_extra_hash_get_different_keys() -> None:
    # [1,2]/extra 1 then [3,4]/extra 2 vs [1,2]/extra 2 then [3,4]/extra 2:
    # the same tokens and the same last extra hash, yet different content.
    m = Model(4, 2)
    x = m.allocate_immutable_blocks(m.allocate_immutable_block(None, [1, 2], 1), [[3, 4]], 2)[0]
    y = m.allocate_immutable_blocks(None, [[1, 2], [3, 4]], extra_hash=2)[-1]
    kx, ky = x.content_key, y.content_key
    assert kx == ((1, (1, 2)), (2, (3, 4))) and ky == ((2, (1, 2)), (2, (3, 4)))
    assert kx != ky and x.block_id != y.block_id and m.state().hits == 0
    s = m.state()
    assert s.cached[kx] == x.block_id and s.cached[ky] == y.block_id and len(s.cached) == 4
    assert check_all(s, m.ownership()) == []
    m.mark_blocks_as_computed([])
    other = ((2, (1, 2)), (1, (3, 4)))  # same tokens, never cached
    assert m.find_cached_blocks_prefix([kx[:1], kx, ky, other, ky]) == [kx[:1], kx, ky]


# ------------------------------------------------------------------ queries


def test_find_cached_blocks_prefix_needs_cached_and_computed() -> None:
    m = Model(3, 2)
    keys = [
        ((None, (1, 2)),),
        ((None, (1, 2)), (None, (3, 4))),
        ((None, (1, 2)), (None, (3, 4)), (None, (5, 6))),
    ]
    a0, a1 = m.allocate_immutable_blocks(None, [[1, 2], [3, 4]])
    assert m.find_cached_blocks_prefix(keys) == []  # promoted, not computed yet
    m.mark_blocks_as_computed([])
    assert m.find_cached_blocks_prefix(keys) == keys[:2]
    m.free(a1)
    m.free(a0)
    assert m.find_cached_blocks_prefix(keys) == keys[:2]  # evictable counts as computed
    m.mark_blocks_as_accessed([1], 3.0)  # now id 0 is the first victim
    m.allocate_mutable_block(None)  # takes the free id 2
    m.allocate_mutable_block(None)  # evicts id 0: the first block
    assert m.find_cached_blocks_prefix(keys) == []  # even though id 1 is still cached


def test_num_full_blocks_touched() -> None:
    m = Model(4, 2)
    a0, a1 = m.allocate_immutable_blocks(None, [[1, 2], [3, 4]])
    t = m.allocate_mutable_block(a1)
    m.append_token_ids(t, [5])
    assert m.get_num_full_blocks_touched([a0, a1, t]) == 0  # cached, in use; t not full
    (f0, f1, ft) = m.fork(t)
    m.swap_out([f1, ft])
    m.free(a1)  # f1 was swapped out, so id 1 loses its last reference
    assert m.state().evictor[0].block_id == 1
    assert m.get_num_full_blocks_touched([f0, f1, ft]) == 1  # f1's id is evictable


def test_get_common_computed_block_ids() -> None:
    m = Model(2, 2)
    one = [4, 5]
    assert m.get_common_computed_block_ids([one]) is one
    assert m.get_common_computed_block_ids([[1, 2, 3], [1, 2, 4], []]) == [1, 2]
    assert m.get_common_computed_block_ids([[], []]) == []
    assert m.get_common_computed_block_ids([]) == []


def test_hit_rate_uses_vllms_buckets_of_a_thousand_queries() -> None:
    m = Model(1, 1, check_invariants=False)
    assert m.get_prefix_cache_hit_rate() == 0.0
    m.free(m.allocate_immutable_block(None, [7]))  # one miss
    for _ in range(3):
        m.free(m.allocate_immutable_block(None, [7]))
    assert m.get_prefix_cache_hit_rate() == (3 / 4 * (4 / 1000)) / (0 + 4 / 1000)
    assert m.get_prefix_cache_hit_rate() == pytest.approx(0.75)
    for _ in range(1496):  # 1 miss + 1499 hits: one whole bucket, half a bucket
        m.free(m.allocate_immutable_block(None, [7]))
    assert (m.state().hits, m.state().misses) == (1499, 1)
    assert m.get_prefix_cache_hit_rate() == (0.999 * 1 + 500 / 500 * 0.5) / 1.5


# -------------------------------------------------------------- reset, swap


def test_reset_is_refused_while_anything_is_in_use() -> None:
    m = Model(4, 2)
    a0, a1 = m.allocate_immutable_blocks(None, [[1, 2], [3, 4]])
    before = m.state()
    assert m.reset_prefix_cache() is False and m.state() == before
    m.mark_blocks_as_accessed([1], 1.0)
    m.free(a1)
    m.free(a0)
    assert evictor_ids(m.state()) == [0, 1]
    assert m.reset_prefix_cache() is True
    s = m.state()
    # each evicted id went to the front, in eviction order
    assert s.free == (1, 0, 2, 3) and s.cached == {} and s.blocks == {}
    assert (s.hits, s.misses, m.get_prefix_cache_hit_rate()) == (0, 0, 0.0)


def test_swap_out_and_in_hits_the_cache_for_content_and_takes_fresh_ids_else() -> None:
    m = Model(4, 2)
    a = m.allocate_immutable_block(None, [1, 2])  # id 0, miss
    t = m.allocate_mutable_block(a)  # id 1
    m.append_token_ids(t, [3])
    m.swap_out([a, t])
    assert ids([a, t]) == [None, None] and evictor_ids(m.state()) == [0]
    assert m.state().free == (1, 2, 3)
    m.swap_in([a, t])
    assert ids([a, t]) == [0, 1] and not a.computed  # the handle's own flag is untouched
    s = m.state()
    assert (s.hits, s.misses) == (1, 1) and s.evictor == ()


# ------------------------------------------------------------ all or nothing


def test_allocate_immutable_blocks_that_runs_out_changes_nothing() -> None:
    m = Model(2, 2)
    unchanged(
        m,
        lambda: m.allocate_immutable_blocks(None, [[1, 2], [3, 4], [5, 6]]),
        err.NoFreeBlocksError,
    )
    assert m.state().misses == 0 and m.get_num_free_blocks() == 2


def test_copy_on_write_without_a_free_id_changes_nothing() -> None:
    m = Model(2, 2)
    a = m.allocate_mutable_block(None)
    m.append_token_ids(a, [1])
    (b,) = m.fork(a)
    m.allocate_mutable_block(None)
    unchanged(m, lambda: m.append_token_ids(b, [2]), err.NoFreeBlocksError)
    assert (b.block_id, b.token_ids) == (0, [1])
    unchanged(m, lambda: m.cow_block_if_not_appendable(b), err.NoFreeBlocksError)
    assert b.block_id == 0


def test_swap_in_that_cannot_fit_changes_nothing() -> None:
    m = Model(2, 2)
    a, b = m.allocate_mutable_block(None), m.allocate_mutable_block(None)
    m.swap_out([a, b])
    m.allocate_mutable_block(None)
    unchanged(m, lambda: m.swap_in([a, b]), err.NoFreeBlocksError)
    assert ids([a, b]) == [None, None]


def test_caller_mistakes_raise_and_change_nothing() -> None:
    m = Model(4, 2)
    other = Model(4, 2)
    a = m.allocate_immutable_block(None, [1, 2])
    t = m.allocate_mutable_block(a)
    gone = m.allocate_mutable_block(None)
    m.free(gone)
    unchanged(m, lambda: m.free(gone), err.DetachedBlockError)
    unchanged(m, lambda: m.fork(gone), err.DetachedBlockError)
    unchanged(m, lambda: m.swap_out([t, t]), err.InvalidArgumentError)  # one Block twice
    t2 = m.fork(t)[-1]  # a second Block on t's id, which then holds two references
    m.free(t2)
    t2.block_id = t.block_id  # a stale Block on an id that holds one reference
    unchanged(m, lambda: m.swap_out([t, t2]), err.RefCountError)
    t2.block_id = 3  # a free id: it holds no reference
    unchanged(m, lambda: m.free(t2), err.RefCountError)
    t2.block_id = 99
    unchanged(m, lambda: m.free(t2), err.UnknownBlockIdError)
    unchanged(m, lambda: m.append_token_ids(t, [1, 2, 3]), err.BlockFullError)
    unchanged(m, lambda: m.append_token_ids(a, [5]), err.ImmutableBlockError)
    unchanged(m, lambda: m.append_token_ids(a, []), err.ImmutableBlockError)
    unchanged(m, lambda: m.allocate_immutable_block(None, [1]), err.UnhashableBlockError)
    unchanged(m, lambda: m.allocate_immutable_block(None, [1, 2, 3]), err.BlockFullError)
    unchanged(m, lambda: m.allocate_immutable_block(t, [1, 2]), err.UnhashableBlockError)
    unchanged(m, lambda: m.allocate_immutable_blocks(None, [[3, 4], [5]]), err.UnhashableBlockError)
    unchanged(m, lambda: m.allocate_mutable_block(None, "x"), err.WrongTypeError)  # type: ignore[arg-type]
    unchanged(m, lambda: m.append_token_ids(t, ["x"]), err.WrongTypeError)  # type: ignore[list-item]
    unchanged(m, lambda: m.free(other.allocate_mutable_block(None)), err.ForeignBlockError)
    unchanged(m, lambda: m.swap_in([t]), err.InvalidArgumentError)
    unchanged(m, lambda: m.promote_to_immutable_block(a), err.ImmutableBlockError)
    unchanged(m, lambda: m.promote_to_immutable_block(t), err.UnhashableBlockError)
    (a2,) = m.fork(a)
    unchanged(m, lambda: m.cow_block_if_not_appendable(a2), err.ImmutableBlockError)
    with pytest.raises(err.InvalidArgumentError):
        Model(2, 2, block_ids=[1, 1])
    with pytest.raises(err.InvalidArgumentError):
        Model(2, 0)
    with pytest.raises(err.InvalidArgumentError):
        Model("2", 2)  # type: ignore[arg-type]
    unchanged(m, lambda: m.allocate_mutable_block(None, device="gpu"), err.InvalidArgumentError)  # type: ignore[arg-type]
    unchanged(m, lambda: m.mark_blocks_as_accessed([0], float("nan")), err.InvalidArgumentError)


# ------------------------------------------------------------- relaxed mode


def recording(
    pick: Callable[[frozenset[int]], int],
) -> tuple[Callable[[frozenset[int]], int], list[frozenset[int]]]:
    """A chooser that answers ``pick`` of the ids it is offered, and the list
    it records each offer in."""
    asked: list[frozenset[int]] = []

    def chooser(allowed: frozenset[int]) -> int:
        asked.append(allowed)
        return pick(allowed)

    return chooser, asked


def test_relaxed_mode_takes_the_choosers_free_id_and_checks_it() -> None:
    highest, asked = recording(max)
    m = Model(3, 2, strict=False, chooser=highest)
    x, y = m.allocate_immutable_blocks(None, [[1, 2], [3, 4]])
    assert ids([x, y]) == [2, 1] and asked == [frozenset({0, 1, 2}), frozenset({0, 1})]
    asked.clear()
    assert ids(m.allocate_immutable_blocks(None, [[1, 2], [5, 6]])) == [2, 0]
    assert asked == [frozenset({0})]  # the hit took no fresh id


def test_relaxed_mode_rejects_an_id_that_is_not_free() -> None:
    m = Model(3, 2, strict=False, chooser=lambda allowed: 0)
    assert m.allocate_mutable_block(None).block_id == 0
    before = m.state()
    with pytest.raises(ChoiceNotAllowed) as info:
        m.allocate_mutable_block(None)
    assert info.value.allowed == frozenset({1, 2}) and m.state() == before


def test_relaxed_mode_never_chooses_an_eviction() -> None:
    lowest, calls = recording(min)
    m = Model(1, 2, strict=False, chooser=lowest)
    m.free(m.allocate_immutable_block(None, [1, 2]))
    assert len(calls) == 1
    assert m.allocate_mutable_block(None).block_id == 0 and len(calls) == 1


# -------------------------------------------------------- self-checking model


def test_the_model_checks_the_invariants_on_its_own_state() -> None:
    m = Model(2, 2)
    m.allocate_mutable_block(None)
    m._ref[0] = 2  # corrupt the model: a reference without an owner
    with pytest.raises(ModelInvariantError) as info:
        m.mark_blocks_as_computed([])
    assert "ownership_matches" in info.value.names
    m.check_invariants = False
    m.mark_blocks_as_computed([])


# ------------------------------------------------------------ the device pair


def test_device_pair_ids_routing_and_null_block() -> None:
    d = DeviceModel(num_gpu_blocks=3, num_cpu_blocks=2, block_size=2)
    assert d.all_block_ids == frozenset(range(5))
    assert d.allocate_mutable_block(None, "cpu").block_id == 3
    assert d.get_physical_block_id("CPU", 4) == 1
    null = d.allocate_or_get_null_block()
    assert null.block_id == 0 and d.allocate_or_get_null_block() is null
    d.free(null)  # does nothing
    assert d.gpu.state().blocks[0].refcount == 1
    with pytest.raises(err.NullBlockWriteError):
        d.append_token_ids(null, [1])
    with pytest.raises(err.InvalidArgumentError):
        d.fork(null)
    with pytest.raises(err.InvalidArgumentError):
        d.device("tpu")


def test_device_pair_swap_moves_handles_and_records_pairs() -> None:
    d = DeviceModel(3, 2, 2)
    a = d.allocate_immutable_block(None, [1, 2], "gpu")  # id 0
    t = d.allocate_mutable_block(a, "gpu")  # id 1
    d.append_token_ids(t, [3])
    assert d.swap([a, t], "gpu", "cpu") == {0: 3, 1: 4}
    assert a.owner is d.cpu and d.get_num_free_blocks("cpu") == 0
    assert evictor_ids(d.gpu.state()) == [0] and d.gpu.state().free == (1, 2)
    assert d.swap([a, t], "cpu", "gpu") == {3: 0, 4: 1}  # a hits the GPU cache again
    assert d.get_and_reset_swaps() == [(0, 3), (1, 4), (3, 0), (4, 1)]
    assert d.get_and_reset_swaps() == []


def test_device_pair_swap_that_cannot_fit_changes_nothing_on_either_side() -> None:
    d = DeviceModel(3, 1, 2)
    a, b = d.allocate_mutable_block(None, "gpu"), d.allocate_mutable_block(None, "gpu")
    gpu, cpu = d.gpu.state(), d.cpu.state()
    with pytest.raises(err.NoFreeBlocksError):
        d.swap([a, b], "gpu", "cpu")
    assert (d.gpu.state(), d.cpu.state()) == (gpu, cpu)
    assert (a.owner, a.block_id, b.block_id) == (d.gpu, 0, 1)
    d.free(a)  # still an ordinary GPU block


def test_device_pair_reset_stops_at_the_first_device_that_refuses() -> None:
    d = DeviceModel(2, 2, 2)
    d.free(d.allocate_immutable_block(None, [1, 2], "gpu"))
    d.allocate_mutable_block(None, "cpu")
    assert d.reset_prefix_cache() is False
    assert d.gpu.state().cached == {((None, (1, 2)),): 0}  # the GPU was not attempted
    assert d.reset_prefix_cache("gpu") is True and d.gpu.state().cached == {}


# ------------------------------------------------------------- without a cache


def test_without_a_cache_nothing_is_shared_and_ids_come_back_first() -> None:
    m = Model(num_blocks=3, block_size=2, caching=False)
    a = m.allocate_immutable_block(None, [1, 2], extra_hash=7)
    b = m.allocate_immutable_block(None, [1, 2])
    c = m.allocate_immutable_block(b, [3])  # a partial immutable block is fine
    assert ids([a, b, c]) == [0, 1, 2] and a.extra_hash is None
    assert m.state().cached == {} and m.get_prefix_cache_hit_rate() == -1
    m.free(b)
    assert m.state().free == (1,) and m.get_num_free_blocks() == 1
    assert m.reset_prefix_cache() is True  # nothing to reset, even with ids in use
    unchanged(m, lambda: m.promote_to_immutable_block(a), NotImplementedError)
    m.mark_blocks_as_accessed([99], now=float("nan"))  # nothing to record, nothing checked
    assert m.get_common_computed_block_ids([[0, 2], [0, 2]]) == []
    assert m.find_cached_blocks_prefix([((None, (1, 2)),)]) == []
    assert m.get_num_full_blocks_touched([a, a, c]) == 1  # each handle once


def test_without_a_cache_fork_and_copy_on_write_still_work() -> None:
    m = Model(num_blocks=3, block_size=2, caching=False)
    a = m.allocate_mutable_block(None)
    m.append_token_ids(a, [5, 5])
    (f,) = m.fork(a)
    unchanged(m, lambda: m.append_token_ids(f, [1]), err.BlockFullError)
    g = m.allocate_mutable_block(f)
    (_, g2) = m.fork(g)
    m.append_token_ids(g2, [4])  # shared: copied first
    assert m.clear_copy_on_writes() == [(1, 2)] and ids([a, f, g, g2]) == [0, 0, 1, 2]
    unchanged(m, lambda: m.allocate_mutable_block(None), err.NoFreeBlocksError)


# ---------------------------------------------------------------- random walk

_EXPECTED = (err.CallerError, err.NoFreeBlocksError, ChoiceNotAllowed, NotImplementedError)
_Call = Callable[[Model, Any, list[Handle], random.Random], object]


def _toks(m: Model, rnd: random.Random) -> list[int]:
    """Mostly whole blocks over a two-token alphabet, so contents collide."""
    n = m.block_size if rnd.random() < 0.7 else rnd.randint(0, m.block_size + 1)
    return [rnd.randint(0, 1) for _ in range(n)]


def _extra(rnd: random.Random) -> int | None:
    """None or 1, chosen per call: chains mix extra hashes (see
    test_mixed_extra_hash_chains_...)."""
    return rnd.choice([None, 1])


_OPS: dict[str, _Call] = {
    "mutable": lambda m, h, hs, r: m.allocate_mutable_block(h, _extra(r)),
    "immutable": lambda m, h, hs, r: m.allocate_immutable_block(h, _toks(m, r), _extra(r)),
    "immutables": lambda m, h, hs, r: m.allocate_immutable_blocks(
        h, [_toks(m, r) for _ in range(r.randint(0, 3))], _extra(r)
    ),
    "append": lambda m, h, hs, r: m.append_token_ids(h, _toks(m, r)[: r.randint(0, 2)]),
    "free": lambda m, h, hs, r: m.free(h),
    "fork": lambda m, h, hs, r: m.fork(h),
    "cow": lambda m, h, hs, r: m.cow_block_if_not_appendable(h),
    "promote": lambda m, h, hs, r: m.promote_to_immutable_block(h),
    "swap_out": lambda m, h, hs, r: m.swap_out(hs),
    "swap_in": lambda m, h, hs, r: m.swap_in(hs),
    "accessed": lambda m, h, hs, r: m.mark_blocks_as_accessed(
        [r.randint(-1, 6) for _ in range(r.randint(0, 3))], r.randint(0, 9)
    ),
    "computed": lambda m, h, hs, r: m.mark_blocks_as_computed([]),
    "cows": lambda m, h, hs, r: m.clear_copy_on_writes(),
    "reset": lambda m, h, hs, r: m.reset_prefix_cache(),
    "touched": lambda m, h, hs, r: m.get_num_full_blocks_touched(hs),
    "find": lambda m, h, hs, r: m.find_cached_blocks_prefix(
        [tuple((_extra(r), tuple(_toks(m, r))) for _ in range(r.randint(1, 2)))]
    ),
}
_WEIGHTS = {"mutable": 3, "immutable": 4, "immutables": 2, "append": 4, "free": 4, "fork": 2}


def _random_call(m: Model, rnd: random.Random, handles: list[Handle]) -> object:
    """One call (mistakes included): its first argument is a recent handle
    more often than an old one, and sometimes None."""
    ops = [op for op in sorted(_OPS) for _ in range(_WEIGHTS.get(op, 1))]
    op = rnd.choice(ops if handles else ["mutable", "immutable", "immutables"])
    h = rnd.choice([None, None, None, *handles[-3:], *handles])
    hs = [rnd.choice(handles) for _ in range(rnd.randint(0, 3))] if handles else []
    return _OPS[op](m, h, hs, rnd)


@settings(max_examples=100, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(1, 2), st.integers(1, 5), st.booleans(),
       st.booleans())
def test_random_walks_keep_the_invariants_and_fail_without_effect(
    rnd: random.Random, size: int, num_blocks: int, strict: bool, caching: bool
) -> None:
    """Any sequence of calls, mistakes included, with a cache or without:
    the model's own invariant check never fires, a failed call changes
    nothing, and the free count is exact (that many allocations succeed on a
    copy, one more fails)."""
    m = Model(num_blocks, size, strict=strict, caching=caching)
    if not strict:
        m.chooser = lambda allowed: rnd.choice(sorted(allowed))
    handles: list[Handle] = []
    for _ in range(40):
        before = m.state()
        try:
            out = _random_call(m, rnd, handles)
        except _EXPECTED:
            assert m.state() == before
            continue
        if isinstance(out, Handle):
            handles.append(out)
        elif isinstance(out, list):
            handles += [x for x in out if isinstance(x, Handle)]
        twin = copy.deepcopy(m)
        twin.strict, twin.check_invariants = True, False
        for _ in range(m.get_num_free_blocks()):
            twin.allocate_mutable_block(None)
        with pytest.raises(err.NoFreeBlocksError):
            twin.allocate_mutable_block(None)


def test_all_or_nothing_also_for_keyword_arguments() -> None:
    m = Model(2, 2)
    a = m.allocate_immutable_block(None, [0, 0])
    t = m.allocate_mutable_block(a)
    m.swap_out(blocks=[a, t])
    m.allocate_mutable_block(prev_block=None)
    unchanged(m, lambda: m.swap_in(blocks=[a, t]), err.NoFreeBlocksError)
    assert ids([a, t]) == [None, None]




def _code_lines(folder: str) -> int:
    """Lines of Python code under ``folder``: no blank, comment or docstring
    lines (the v1 model, model/v1_*.py, is measured apart: tests/test_v1_model.py)."""
    return sum(code_lines(path.read_text())
               for path in (Path(__file__).parent.parent / folder).glob("*.py")
               if not path.name.startswith("v1_"))


def test_the_model_is_at_most_a_third_of_the_impl() -> None:
    """The model stays small enough to be read and trusted (README: the model)."""
    model, impl = _code_lines("model"), _code_lines("impl")
    assert impl > 1000 and model > 300  # the counter sees both folders
    assert 3 * model <= impl, f"model/ has {model} lines of code, impl/ {impl}"
