"""Contracts on hand-made states, the error table on the impl, the
transition table."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Dict, List, Tuple

import pytest

from prefixcache.impl.cpu_gpu_block_allocator import CpuGpuBlockAllocator, NullBlock
from prefixcache.impl.errors import NoFreeBlocksError, PrefixCacheError
from prefixcache.impl.interfaces import Device
from prefixcache.impl.naive_block import NaiveBlock, NaiveBlockAllocator
from prefixcache.impl.prefix_caching_block import PrefixCachingBlockAllocator
from prefixcache.spec import contracts as C
from prefixcache.spec.abstraction import ContentLedger, abstract_state
from prefixcache.spec.checked import (
    CheckedNaiveBlockAllocator,
    CheckedPrefixCachingBlockAllocator,
)
from prefixcache.spec.error_table import (
    CPU_GPU,
    ERROR_TABLE,
    NAIVE,
    PREFIX,
    errors_of,
    operations,
)
from prefixcache.spec.invariants import check_all
from prefixcache.spec.state import AbstractState, BlockState, EvictorEntry
from prefixcache.spec.transitions import TRANSITIONS, Life, allowed, edges, life_of, mermaid

K1 = ((None, (1, 2)),)
K2 = ((None, (1, 2)), (None, (3, 4)))
K9 = ((None, (9, 9)),)


def state() -> AbstractState:
    """Ids 0..3, block size 2: 0 immutable (K1), 1 evictable (K2), 2 mutable
    shared by two Blocks, 3 free."""
    return AbstractState(
        block_ids=(0, 1, 2, 3),
        free=(3,),
        blocks={
            0: BlockState(1, K1, True, -1.0),
            1: BlockState(0, K2, True, 5.0),
            2: BlockState(2, None, False, -1.0),
        },
        cached={K1: 0, K2: 1},
        evictor=(EvictorEntry(5.0, 4, 1, K2),),
        touched=frozenset(),
        copy_on_writes=(),
        hits=0,
        misses=2,
        reported_free=2,
        block_size=2,
    )


API_OPERATIONS = [
    "allocate_mutable_block", "allocate_immutable_block", "allocate_immutable_blocks",
    "free", "fork", "append_token_ids", "cow_block_if_not_appendable",
    "promote_to_immutable_block", "clear_copy_on_writes", "mark_blocks_as_accessed",
    "mark_blocks_as_computed", "get_common_computed_block_ids", "get_num_full_blocks_touched",
    "find_cached_blocks_prefix", "swap_out", "swap_in", "reset_prefix_cache",
    "get_prefix_cache_hit_rate", "get_num_free_blocks", "get_num_total_blocks",
    "get_physical_block_id", "all_block_ids", "swap",
]


@pytest.mark.parametrize("op", API_OPERATIONS)
def test_every_operation_has_a_documented_postcondition(op: str) -> None:
    post = getattr(C, f"post_{op}")
    assert post.__doc__ and len(post.__doc__.split()) >= 4


def test_the_hand_state_is_valid() -> None:
    assert check_all(state()) == []


# --------------------------------------------------------------------------
# contracts on hand-made transitions


def test_allocate_mutable_takes_the_first_free_id() -> None:
    old = state()
    new, i, _ = C.take(old)
    assert i == 3 and new.free == () and new.blocks[3] == C.FRESH
    assert C.pre_allocate_mutable_block(old)
    assert C.post_allocate_mutable_block(old, new, 3)
    assert not C.post_allocate_mutable_block(old, new, 1)
    assert check_all(new) == []


def test_allocate_mutable_evicts_when_nothing_is_free() -> None:
    old = C.take(state())[0]
    new, i, _ = C.take(old)
    assert i == 1 and K2 not in new.cached and new.evictor == ()
    assert new.reported_free == 0 and not C.pre_allocate_mutable_block(new)
    assert check_all(new) == []


def test_hit_on_an_evictable_id_revives_it() -> None:
    old = state()
    new, i, _ = C.lookup(old, K2)
    assert i == 1 and new.blocks[1] == BlockState(1, K2, True, -1.0)
    assert new.hits == 1 and new.reported_free == 1 and new.evictor == ()
    assert C.post_allocate_immutable_block(old, new, 1, K2)
    assert not C.post_allocate_immutable_block(old, replace(new, hits=0), 1, K2)


def test_miss_caches_and_touches() -> None:
    old = state()
    new, i, _ = C.lookup(old, K9)
    assert i == 3 and new.cached[K9] == 3 and new.touched == {3} and new.misses == 3
    assert check_all(new) == []


def test_free_of_last_reference_to_hashed_block_makes_it_evictable() -> None:
    old = state()
    new, _, rel = C.release(old, 0)
    assert rel == frozenset()
    assert new.blocks[0].refcount == 0 and new.cached[K1] == 0
    assert new.reported_free == 3
    assert [e.block_id for e in new.evictor] == [0, 1]   # -1.0 before 5.0
    assert C.post_free(old, new, None, 0)
    assert check_all(new) == []


def test_free_of_a_shared_mutable_id_only_decrements() -> None:
    old = state()
    new, _, _ = C.release(old, 2)
    assert new.blocks[2].refcount == 1 and new.free == old.free
    assert not C.post_free(old, old, None, 2)


def test_released_id_may_go_anywhere_in_the_free_list() -> None:
    old = C.release(state(), 2)[0]
    new, _, rel = C.release(old, 2)
    assert rel == {2} and new.free == (2, 3)
    assert C.post_free(old, replace(new, free=(3, 2)), None, 2)
    assert not C.post_free(old, replace(new, free=(3,)), None, 2)


def test_cow_of_a_shared_mutable_id() -> None:
    old = state()
    new, j, _ = C.copy_on_write(old, 2)
    assert j == 3 and new.blocks[2].refcount == 1 and new.copy_on_writes == ((2, 3),)
    assert C.pre_cow_block_if_not_appendable(old, 2)
    assert not C.pre_cow_block_if_not_appendable(old, None)
    assert C.post_cow_block_if_not_appendable(old, new, 3, 2)


def test_duplicate_promotion_frees_the_mutable_id() -> None:
    old = C.take(state())[0]       # id 3 mutable, nothing free
    new, j, rel = C.promote(old, 3, K2)
    assert j == 1 and rel == {3} and 3 in new.free and new.blocks[1].refcount == 1
    assert C.pre_promote_to_immutable_block(old, 3, K2)
    assert not C.pre_promote_to_immutable_block(old, 0, K1)     # already immutable
    assert check_all(new) == []


def test_append_filling_a_shared_block_cows_then_promotes() -> None:
    old = state()
    assert C.pre_append_token_ids(old, 2, False, 2, 2, K9)
    new, j, _ = C.promote(*C.copy_on_write(old, 2)[:2], K9)
    assert C.post_append_token_ids(old, new, j, 2, False, 2, 2, K9)
    assert not C.pre_append_token_ids(old, 2, True, 2, 2, K9)      # immutable
    assert not C.pre_append_token_ids(old, 2, False, 1, 2, K9)     # too many tokens
    assert C.pre_append_token_ids(old, None, False, 2, 1, None)     # detached


def test_demand_counts_revived_and_new_ids() -> None:
    s = state()
    assert C.demand(s, [K1, K2, K9, K9, None]) == 3
    assert C.pre_allocate_immutable_blocks(s, [K1, K2])
    assert not C.pre_allocate_immutable_blocks(s, [K9, ((None, (9, 9)), (None, (1, 1))), K2])
    assert not C.pre_allocate_immutable_blocks(s, [None])


def test_reset_refuses_while_in_use_and_empties_otherwise() -> None:
    s = state()
    assert C.post_reset_prefix_cache(s, s, False)
    idle = replace(
        s, free=(2, 3),
        blocks={0: BlockState(0, K1, True, -1.0), 1: BlockState(0, K2, True, 5.0)},
        evictor=(EvictorEntry(-1.0, 2, 0, K1), EvictorEntry(5.0, 4, 1, K2)), reported_free=4)
    assert check_all(idle) == [] and idle.in_use() == frozenset()
    done = replace(idle, free=(1, 0, 2, 3), blocks={}, cached={}, evictor=(), hits=0, misses=0)
    assert C.post_reset_prefix_cache(idle, done, True)
    assert not C.post_reset_prefix_cache(idle, replace(done, misses=2), True)


def test_queries_leave_the_state_alone() -> None:
    s = state()
    assert C.post_get_num_free_blocks(s, s, 2)
    assert C.post_get_num_total_blocks(s, s, 4)
    assert C.post_get_physical_block_id(s, s, 2, 2)
    assert C.post_all_block_ids(s, s, frozenset({0, 1, 2, 3}))
    assert C.post_get_prefix_cache_hit_rate(s, s, 0.0)
    assert C.post_find_cached_blocks_prefix(s, s, 2, [K1, K2, K9])
    assert C.post_get_num_full_blocks_touched(s, s, 2, [(True, K1), (True, K2), (True, None),
                                                        (False, None)])
    assert C.post_block_is_computed(s, s, True, 1)
    assert not C.post_get_num_free_blocks(s, replace(s, hits=1), 2)


def test_common_computed_prefix() -> None:
    assert C.common_computed_prefix([[1, 2, 3]]) == [1, 2, 3]
    assert C.common_computed_prefix([[1, 2, 3], [1, 2], []]) == [1, 2]
    assert C.common_computed_prefix([[], []]) == []
    assert C.common_computed_prefix([]) == []


def test_swap_between_devices() -> None:
    src = state()
    dst = replace(state(), block_ids=(10, 11), free=(10, 11), blocks={}, cached={},
                  evictor=(), misses=0, reported_free=2)
    new_src = C.release(src, 0)[0]
    new_dst, j, _ = C.lookup(dst, K1)
    assert C.pre_swap(src, dst, [0], [K1])
    assert C.post_swap(src, new_src, dst, new_dst, {0: j}, [0], [K1], [j])
    assert not C.post_swap(src, new_src, dst, new_dst, {0: 11}, [0], [K1], [j])


# --------------------------------------------------------------------------
# the error table, exercised on the impl


def test_error_table_rows_are_well_formed() -> None:
    assert len({(r.operation, r.mistake, r.applies_to) for r in ERROR_TABLE}) == len(ERROR_TABLE)
    for row in ERROR_TABLE:
        assert issubclass(row.exception, (PrefixCacheError, NotImplementedError))
        assert set(row.applies_to) <= {PREFIX, NAIVE, CPU_GPU}
    assert "free" in operations()


class Fixture:
    """A 4-id allocator: ``chain`` (ids 0, 1, immutable), ``m`` (id 2,
    mutable, shared with ``mf``), id 3 free; a foreign Block; a stale Block
    (its id holds no reference); a Block on an unknown id."""

    def __init__(self, cls: Any) -> None:
        self.a = cls(num_blocks=4, block_size=2)
        self.chain = self.a.allocate_immutable_blocks(None, [[1, 2], [3, 4]])
        self.m = self.a.allocate_mutable_block(self.chain[-1])
        self.m.append_token_ids([5])
        self.mf = self.a.fork(self.m)
        self.ledger = ContentLedger()
        self.ledger.observe_blocks([*self.chain, self.m])
        other = PrefixCachingBlockAllocator(num_blocks=2, block_size=2)
        self.foreign = other.allocate_mutable_block(None)
        self.stale = self.a.allocate_mutable_block(None)
        self.a.free(self.stale, keep_block_object=True)
        self.stale.block_id = 3
        self.unknown = self.a.allocate_mutable_block(None)
        self.a.free(self.unknown, keep_block_object=True)
        self.unknown.block_id = 99
        self.detached = self.a.allocate_mutable_block(None)
        self.a.free(self.detached, keep_block_object=True)

    single: Any
    forked: Any

    def fill(self) -> None:
        """Take the last free id (and nothing is evictable)."""
        self.a.allocate_mutable_block(None)

    def state(self) -> AbstractState:
        return abstract_state(self.a, ledger=self.ledger)


_BLOCK_ROWS: Dict[str, Callable[[Fixture], Any]] = {
    "the argument is not a Block of this allocator's kind": lambda f: "not a block",
    "the Block is detached (freed, swapped out, or never allocated)": lambda f: f.detached,
    "the Block belongs to another allocator": lambda f: f.foreign,
    "the Block's id is not managed by this allocator": lambda f: f.unknown,
    "the Block's id holds no reference (a stale Block: already freed)": lambda f: f.stale,
}

Scenario = Callable[[Fixture], None]
SCENARIOS: Dict[Tuple[str, str], Scenario] = {}
for _mistake, _pick in _BLOCK_ROWS.items():
    SCENARIOS[("free", _mistake)] = (lambda p: lambda f: f.a.free(p(f)))(_pick)
    SCENARIOS[("fork", f"a Block of the chain: {_mistake}")] = (
        lambda p: lambda f: f.a.fork(p(f)))(_pick)
    SCENARIOS[("cow_block_if_not_appendable", _mistake)] = (
        lambda p: lambda f: f.a.cow_block_if_not_appendable(p(f)))(_pick)
    SCENARIOS[("promote_to_immutable_block", _mistake)] = (
        lambda p: lambda f: f.a.promote_to_immutable_block(p(f)))(_pick)
    SCENARIOS[("swap_out", _mistake)] = (lambda p: lambda f: f.a.swap_out([p(f)]))(_pick)


PREPARE: Dict[Tuple[str, str], Callable[[Fixture], None]] = {}
"""Set-up steps run before the state is recorded (the mistake comes after)."""


def _fill_then(call: Scenario) -> Scenario:
    """Mark a scenario that needs the last free id taken first."""
    call.needs_fill = True  # type: ignore[attr-defined]
    return call


_NEW: Dict[str, Dict[str, Any]] = {
    "a device is passed to a single-device allocator": {"device": Device.GPU},
    "prev_block is not a Block of this allocator's kind": {"prev_block": "x"},
}
_ARGS: Tuple[Tuple[str, Dict[str, Any]], ...] = (
    ("allocate_mutable_block", {}),
    ("allocate_immutable_block", {"token_ids": [7, 7]}),
    ("allocate_immutable_blocks", {"block_token_ids": [[7, 7]]}),
)
for _op, _args in _ARGS:
    for _mistake, _extra in _NEW.items():
        SCENARIOS[(_op, _mistake)] = (
            lambda op, kw: lambda f: getattr(f.a, op)(**{"prev_block": None, **kw}))(
                _op, {**_args, **_extra})

SCENARIOS.update({
    ("allocate_mutable_block", "no id is free or evictable"):
        _fill_then(lambda f: f.a.allocate_mutable_block(None)),
    ("allocate_mutable_block", "extra_hash is neither None nor an int"):
        lambda f: f.a.allocate_mutable_block(None, extra_hash="x"),
    ("allocate_immutable_block", "token_ids is not a list of ints"):
        lambda f: f.a.allocate_immutable_block(None, [1, "2"]),
    ("allocate_immutable_block", "more tokens than a block holds"):
        lambda f: f.a.allocate_immutable_block(None, [1, 2, 3]),
    ("allocate_immutable_block", "no id is free (or evictable) for a miss"):
        _fill_then(lambda f: f.a.allocate_immutable_block(None, [8, 8])),
    ("allocate_immutable_block", "fewer tokens than a block holds"):
        lambda f: f.a.allocate_immutable_block(None, [1]),
    ("allocate_immutable_block",
     "prev_block has no content hash (not full, or after a block that is not)"):
        lambda f: f.a.allocate_immutable_block(f.m, [1, 2]),
    ("allocate_immutable_block", "extra_hash is neither None nor an int"):
        lambda f: f.a.allocate_immutable_block(None, [1, 2], extra_hash=1.5),
    ("allocate_immutable_blocks", "a token list is not a list of ints"):
        lambda f: f.a.allocate_immutable_blocks(None, [[1, 2], "ab"]),
    ("allocate_immutable_blocks", "a token list has more tokens than a block holds"):
        lambda f: f.a.allocate_immutable_blocks(None, [[1, 2], [1, 2, 3]]),
    ("allocate_immutable_blocks",
     "the misses need more ids than are free or evictable (nothing is taken)"):
        lambda f: f.a.allocate_immutable_blocks(None, [[1, 2], [8, 8], [9, 9]]),
    ("allocate_immutable_blocks", "a token list has fewer tokens than a block holds"):
        lambda f: f.a.allocate_immutable_blocks(None, [[8, 8], [1]]),
    ("allocate_immutable_blocks", "prev_block has no content hash"):
        lambda f: f.a.allocate_immutable_blocks(f.m, [[1, 2]]),
    ("allocate_immutable_blocks", "extra_hash is neither None nor an int"):
        lambda f: f.a.allocate_immutable_blocks(None, [[1, 2]], extra_hash="x"),
    ("append_token_ids", "token_ids is not a list of ints"):
        lambda f: f.m.append_token_ids(["a"]),
    ("append_token_ids", "more tokens than the block has empty slots"):
        lambda f: f.m.append_token_ids([1, 2]),
    ("append_token_ids",
     "the id is shared and no id is free or evictable for the copy-on-write"):
        _fill_then(lambda f: f.m.append_token_ids([6])),
    ("append_token_ids", "the block is immutable (full and hashed) or computed"):
        lambda f: f.chain[0].append_token_ids([1]),
    ("cow_block_if_not_appendable",
     "the id is shared and no id is free or evictable for the copy"):
        _fill_then(lambda f: f.a.cow_block_if_not_appendable(f.m)),
    ("cow_block_if_not_appendable",
     "the id is shared and immutable (cached): it is never written"):
        lambda f: f.a.cow_block_if_not_appendable(f.forked),
    ("promote_to_immutable_block", "the block is not full, or an earlier block is not hashed"):
        lambda f: f.a.promote_to_immutable_block(f.m),
    ("promote_to_immutable_block",
     "the block is already immutable (its id is cached under its hash)"):
        lambda f: f.a.promote_to_immutable_block(f.chain[0]),
    ("mark_blocks_as_accessed", "an id is not managed by this allocator (or is not an int)"):
        lambda f: f.a.mark_blocks_as_accessed([0, None], 1.0),
    ("mark_blocks_as_accessed", "an id is free: neither in use nor evictable here"):
        lambda f: f.a.mark_blocks_as_accessed([0, 3], 1.0),
    ("mark_blocks_as_accessed", "now is not a number"):
        lambda f: f.a.mark_blocks_as_accessed([0], "soon"),
    ("mark_blocks_as_accessed", "now is NaN"):
        lambda f: f.a.mark_blocks_as_accessed([0], float("nan")),
    ("swap_in", "one Block appears twice in the list"):
        lambda f: f.a.swap_in([f.mf[-1], f.mf[-1]]),
    ("get_physical_block_id", "the id is not managed by this allocator"):
        lambda f: f.a.get_physical_block_id(99),
    ("get_num_free_blocks", "a device is passed to a single-device allocator"):
        lambda f: f.a.get_num_free_blocks(Device.GPU),
    ("swap_out", "one id is released more often than it is referenced"):
        lambda f: f.a.swap_out([f.single, f.stale]),
    ("swap_out", "one Block appears twice in the list"):
        lambda f: f.a.swap_out([f.chain[0], f.chain[0]]),
    ("swap_in", "a Block still holds an id (it was not swapped out)"):
        lambda f: f.a.swap_in([f.m]),
    ("swap_in", "the Blocks need more ids than are free or evictable (nothing is taken)"):
        lambda f: f.a.swap_in([f.mf[-1]]),
    ("swap_in", "a Block is not a PrefixCachingBlock"):
        lambda f: f.a.swap_in(["x"]),
    ("is_block_cached", "the block has no content hash"):
        lambda f: f.a.is_block_cached(f.m),
    ("block_is_computed", "the id is not managed by this allocator"):
        lambda f: f.a.block_is_computed(99),
})


def _single(f: Fixture) -> None:
    f.single = f.a.allocate_immutable_block(None, [8, 8])   # id 3, as the stale Block
    f.ledger.observe_block(f.single)


def _swapped_then_full(f: Fixture) -> None:
    f.a.swap_out([f.mf[-1]])
    f.fill()


def _forked(f: Fixture) -> None:
    f.forked = f.a.fork(f.chain[0])[0]


def _swapped(f: Fixture) -> None:
    f.a.swap_out([f.mf[-1]])


PREPARE.update({
    ("swap_in", "one Block appears twice in the list"): _swapped,
    ("swap_out", "one id is released more often than it is referenced"): _single,
    ("swap_in", "the Blocks need more ids than are free or evictable (nothing is taken)"):
        _swapped_then_full,
    ("cow_block_if_not_appendable",
     "the id is shared and immutable (cached): it is never written"): _forked,
})

PREFIX_ROWS = [r for r in ERROR_TABLE if PREFIX in r.applies_to
               and r.operation not in ("__init__", "create") and "." not in r.operation
               and r.operation != "make_evictor"]


def test_every_prefix_row_has_a_scenario() -> None:
    missing = [(r.operation, r.mistake) for r in PREFIX_ROWS
               if (r.operation, r.mistake) not in SCENARIOS]
    assert missing == []


#: Rows the impl did not honour when this was written:
#: expected failures, to be removed once the impl is fixed (they then XPASS).
def _rows_with_marks() -> List[Any]:
    out = []
    for r in PREFIX_ROWS:
        out.append(pytest.param(r, id=f"{r.operation}: {r.mistake}"))
    return out


@pytest.mark.parametrize("cls", [PrefixCachingBlockAllocator, CheckedPrefixCachingBlockAllocator],
                         ids=["plain", "checked"])
@pytest.mark.parametrize("row", _rows_with_marks())
def test_prefix_mistake_raises_and_changes_nothing(row: Any, cls: Any) -> None:
    f = Fixture(cls)
    run = SCENARIOS[(row.operation, row.mistake)]
    prepare = PREPARE.get((row.operation, row.mistake))
    if prepare is not None:
        prepare(f)
    if getattr(run, "needs_fill", False):
        f.fill()
    before = f.state()
    with pytest.raises(row.exception):
        run(f)
    assert f.state() == before
    assert check_all(f.state()) == []
    _still_works(f)


def _still_works(f: Fixture) -> None:
    """After the refused call the allocator serves valid calls: a hit on
    the cached chain, every remaining id taken, all of it given back."""
    again = f.a.allocate_immutable_blocks(None, [[1, 2], [3, 4]])
    assert [b.block_id for b in again] == [b.block_id for b in f.chain]
    taken = [f.a.allocate_mutable_block(None) for _ in range(f.a.get_num_free_blocks())]
    assert f.a.get_num_free_blocks() == 0
    with pytest.raises(NoFreeBlocksError):
        f.a.allocate_mutable_block(None)
    for block in [*again, *taken]:
        f.a.free(block)
    assert f.a.get_num_free_blocks() == len(taken)
    assert check_all(f.state()) == []


def test_naive_rows_on_the_impl() -> None:
    for cls in (NaiveBlockAllocator, CheckedNaiveBlockAllocator):
        a = cls(create_block=NaiveBlock, num_blocks=2, block_size=2)
        b = a.allocate_immutable_block(None, [1])
        rows = errors_of("promote_to_immutable_block", NAIVE)
        with pytest.raises(tuple(rows.values())):
            a.promote_to_immutable_block(b)
        rows = errors_of("free_block_id", NAIVE)
        with pytest.raises(rows["the id holds no reference (a double free)"]):
            a.free_block_id(1)
        with pytest.raises(rows["the id is not managed by this allocator"]):
            a.free_block_id(7)
        a.allocate_mutable_block(None)
        no_free = errors_of("allocate_mutable_block", NAIVE)["no id is free or evictable"]
        with pytest.raises(no_free):
            a.allocate_mutable_block(None)
        assert check_all(abstract_state(a)) == []


def test_cpu_gpu_rows_on_the_impl() -> None:
    g = CpuGpuBlockAllocator.create("prefix_caching", 2, 1, 2)
    rows = errors_of("fork", CPU_GPU)
    null = g.allocate_or_get_null_block()
    assert isinstance(null, NullBlock)
    with pytest.raises(rows["the Block is the null block"]):
        g.fork(null)
    with pytest.raises(errors_of("append_token_ids", CPU_GPU)["the block is the null block"]):
        null.append_token_ids([1])
    chain = g.allocate_immutable_blocks(None, [[1, 2]], Device.GPU)
    held = chain[0].block_id
    g.allocate_mutable_block(None, Device.CPU)
    with pytest.raises(errors_of("swap", CPU_GPU)[
            "the destination cannot take every Block (nothing moves)"]):
        g.swap(chain, Device.GPU, Device.CPU)
    assert chain[0].block_id == held
    with pytest.raises(errors_of("create", CPU_GPU)[
            "allocator_type is neither 'naive' nor 'prefix_caching'"]):
        CpuGpuBlockAllocator.create("other", 1, 1, 2)


# --------------------------------------------------------------------------
# the transition table


def test_life_of_reads_the_four_states() -> None:
    s = state()
    assert [life_of(s, i) for i in s.block_ids] == [
        Life.IMMUTABLE, Life.EVICTABLE, Life.MUTABLE, Life.FREE]


def test_transition_table_is_connected_and_rendered() -> None:
    pairs = edges()
    for life in Life:
        assert any(src == life for src, _ in pairs)
        assert any(dst == life for _, dst in pairs)
    text = mermaid()
    assert text.startswith("stateDiagram-v2\n")
    for t in TRANSITIONS:
        if t.source != t.target:
            assert t.operation in text
    assert allowed(Life.FREE, Life.MUTABLE, "allocate_mutable_block")
    assert not allowed(Life.FREE, Life.EVICTABLE)
    assert not allowed(Life.IMMUTABLE, Life.FREE, "free")
    assert allowed(Life.FREE, Life.FREE, "anything")


def test_every_transition_operation_has_a_contract() -> None:
    names: List[str] = sorted({t.operation for t in TRANSITIONS})
    for op in names:
        assert hasattr(C, f"post_{op}"), op
