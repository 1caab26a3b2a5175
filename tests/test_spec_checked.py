"""The checked allocators: silent on a correct impl, loud on a broken one,
and absent when contracts are off."""

from __future__ import annotations

import logging
import os
import random
import subprocess
import sys
from typing import Any, Callable, List

import icontract
import pytest
from helpers.broken_allocators import BROKEN, hunt

from prefixcache.impl.errors import NoFreeBlocksError, PrefixCacheError
from prefixcache.impl.interfaces import Device
from prefixcache.impl.naive_block import NaiveBlock, NaiveBlockAllocator
from prefixcache.impl.prefix_caching_block import PrefixCachingBlockAllocator
from prefixcache.spec.abstraction import ownership
from prefixcache.spec.checked import (
    CONTRACTS_ENABLED,
    FULL,
    INCREMENTAL,
    MODES,
    CheckedCpuGpuBlockAllocator,
    CheckedNaiveBlockAllocator,
    CheckedPrefixCachingBlockAllocator,
    checked_class,
    checker_of,
)
from prefixcache.spec.invariants import check_all
from prefixcache.spec.state import AbstractState
from prefixcache.spec.transitions import allowed, life_of

pytestmark = pytest.mark.skipif(not CONTRACTS_ENABLED, reason="contracts are off")


def test_checked_classes_are_subclasses_with_a_checker() -> None:
    a = CheckedPrefixCachingBlockAllocator(num_blocks=2, block_size=2)
    assert isinstance(a, PrefixCachingBlockAllocator)
    assert checker_of(a) is not None
    assert checker_of(PrefixCachingBlockAllocator(num_blocks=2, block_size=2)) is None
    n = CheckedNaiveBlockAllocator(create_block=NaiveBlock, num_blocks=2, block_size=2)
    assert isinstance(n, NaiveBlockAllocator)


# --------------------------------------------------------------------------
# deliberately broken subclasses


class _MiscountsFree(PrefixCachingBlockAllocator):
    def get_num_free_blocks(self, device: Any = None) -> int:
        return super().get_num_free_blocks(device) + 1


class _LeaksFreedIds(PrefixCachingBlockAllocator):
    def free(self, block: Any, keep_block_object: bool = False) -> None:
        super().free(block, keep_block_object)
        free_ids = self._hashless_allocator._free_block_indices
        if free_ids:
            free_ids.popleft()               # ... and the freed id is lost


class _HandsOutTheSecondId(PrefixCachingBlockAllocator):
    def allocate_mutable_block(self, prev_block: Any, extra_hash: Any = None,
                               device: Any = None) -> Any:
        first = super().allocate_mutable_block(prev_block, extra_hash, device)
        second = super().allocate_mutable_block(prev_block, extra_hash, device)
        super().free(first)
        return second


class _NotAtomic(PrefixCachingBlockAllocator):
    def allocate_immutable_blocks(self, prev_block: Any, block_token_ids: Any,
                                  extra_hash: Any = None, device: Any = None) -> Any:
        super().allocate_immutable_blocks(prev_block, block_token_ids[:1], extra_hash)
        raise NoFreeBlocksError("gave up half-way")


class _PadsShortBlocks(PrefixCachingBlockAllocator):
    def allocate_immutable_block(self, prev_block: Any, token_ids: Any,
                                 extra_hash: Any = None, device: Any = None) -> Any:
        padded = list(token_ids) + [0] * (self._block_size - len(token_ids))
        return super().allocate_immutable_block(prev_block, padded, extra_hash, device)


class _NaiveOvercounts(NaiveBlockAllocator):
    def allocate_mutable_block(self, prev_block: Any, extra_hash: Any = None,
                               device: Any = None) -> Any:
        block: Any = super().allocate_mutable_block(prev_block, extra_hash, device)
        self._refcounter._refcounts[block.block_id] += 1
        return block


def test_checked_class_refuses_other_classes() -> None:
    with pytest.raises(TypeError):
        checked_class(dict)


@pytest.mark.parametrize("mode", MODES)
def test_broken_count_violates_an_invariant(mode: str) -> None:
    with pytest.raises(icontract.ViolationError, match="counting"):
        checked_class(_MiscountsFree, mode)(num_blocks=2, block_size=2)


@pytest.mark.parametrize("mode", MODES)
def test_leaked_id_breaks_the_free_postcondition(mode: str) -> None:
    a = checked_class(_LeaksFreedIds, mode)(num_blocks=2, block_size=2)
    b = a.allocate_mutable_block(None)
    with pytest.raises(icontract.ViolationError, match="free broke its postcondition"):
        a.free(b)


@pytest.mark.parametrize(("mode", "caught_by"), [
    (FULL, "partition"),
    # the call touches no id: the free list's size, read every call, differs
    (INCREMENTAL, "get_num_total_blocks broke its postcondition.*outside_free: 1 -> 2")])
def test_corrupted_state_is_caught_on_the_next_call(mode: str, caught_by: str) -> None:
    a: Any = checked_class(PrefixCachingBlockAllocator, mode)(num_blocks=2, block_size=2)
    b = a.allocate_mutable_block(None)
    a._hashless_allocator._free_block_indices.append(b.block_id)   # in use and free
    with pytest.raises(icontract.ViolationError, match=caught_by):
        a.get_num_total_blocks()


def test_a_fault_outside_the_touched_elements_is_caught_by_the_audit() -> None:
    """A corruption that no count shows (an evictable id's access time),
    at an id the next calls do not touch: the incremental checks pass it by,
    the full audit finds it."""
    a: Any = CheckedPrefixCachingBlockAllocator(num_blocks=4, block_size=2)
    blocks = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]])
    a.mark_blocks_as_computed([])
    a.free(blocks[1])
    a.evictor.update(blocks[1].block_id if blocks[1].block_id is not None else 1, 5.0)
    a.get_num_free_blocks()
    a.allocate_mutable_block(None)          # takes a free id, touches no evictable one
    with pytest.raises(icontract.ViolationError, match="audit: .*evictor"):
        a.audit()


def test_the_audit_passes_on_a_correct_allocator_and_can_run_every_n_calls(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFIXCACHE_AUDIT_EVERY", "1")
    a: Any = CheckedPrefixCachingBlockAllocator(num_blocks=4, block_size=2)
    blocks = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]])
    a.free(blocks[1])
    a.audit()
    a._hashless_allocator._free_block_indices.rotate(1)   # same ids, another order
    with pytest.raises(icontract.ViolationError, match="audit: .*free"):
        a.get_num_total_blocks()


def test_wrong_modes_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="check must be one of"):
        checked_class(PrefixCachingBlockAllocator, "sometimes")
    monkeypatch.setenv("PREFIXCACHE_CHECK", "sometimes")
    with pytest.raises(ValueError, match="PREFIXCACHE_CHECK"):
        checked_class(PrefixCachingBlockAllocator)
    monkeypatch.setenv("PREFIXCACHE_AUDIT_EVERY", "-1")
    with pytest.raises(ValueError, match="PREFIXCACHE_AUDIT_EVERY"):
        CheckedPrefixCachingBlockAllocator(num_blocks=1, block_size=1)


@pytest.mark.parametrize("mode", MODES)
def test_wrong_id_order_breaks_a_postcondition(mode: str) -> None:
    a = checked_class(_HandsOutTheSecondId, mode)(num_blocks=3, block_size=2)
    with pytest.raises(icontract.ViolationError, match="allocate_mutable_block"):
        a.allocate_mutable_block(None)


@pytest.mark.parametrize("mode", MODES)
def test_half_done_call_breaks_the_error_promise(mode: str) -> None:
    a = checked_class(_NotAtomic, mode)(num_blocks=2, block_size=2)
    with pytest.raises(icontract.ViolationError, match="raised NoFreeBlocksError"):
        a.allocate_immutable_blocks(None, [[1, 2], [3, 4], [5, 6]])


@pytest.mark.parametrize("mode", MODES)
def test_accepting_a_mistake_breaks_the_precondition(mode: str) -> None:
    a = checked_class(_PadsShortBlocks, mode)(num_blocks=2, block_size=2)
    with pytest.raises(icontract.ViolationError, match="precondition"):
        a.allocate_immutable_block(None, [1])


@pytest.mark.parametrize("mode", MODES)
def test_naive_broken_refcount_is_caught(mode: str) -> None:
    a = checked_class(_NaiveOvercounts, mode)(create_block=NaiveBlock, num_blocks=2,
                                              block_size=2)
    with pytest.raises(icontract.ViolationError):
        a.allocate_mutable_block(None)


def test_hash_collision_is_an_integrity_violation() -> None:
    a = CheckedPrefixCachingBlockAllocator(num_blocks=4, block_size=2,
                                           hash_algo=lambda p, t, e: sum(t))
    a.allocate_immutable_block(None, [1, 2])
    with pytest.raises(icontract.ViolationError):
        a.allocate_immutable_block(None, [2, 1])


def test_caller_mistakes_still_raise_the_impl_exception() -> None:
    a = CheckedPrefixCachingBlockAllocator(num_blocks=1, block_size=2)
    b = a.allocate_mutable_block(None)
    with pytest.raises(PrefixCacheError):
        a.allocate_mutable_block(None)
    a.free(b)
    with pytest.raises(PrefixCacheError):
        a.free(b)


# --------------------------------------------------------------------------
# contracts off


@pytest.mark.parametrize("how", [["-O"], []], ids=["python -O", "PREFIXCACHE_CONTRACTS=0"])
def test_contracts_off_exports_the_plain_classes(how: List[str]) -> None:
    code = (
        "from prefixcache.spec import checked as c\n"
        "from prefixcache.impl.prefix_caching_block import PrefixCachingBlockAllocator as P\n"
        "from prefixcache.impl.naive_block import NaiveBlockAllocator as N\n"
        "from prefixcache.impl.cpu_gpu_block_allocator import CpuGpuBlockAllocator as G\n"
        "assert not c.CONTRACTS_ENABLED\n"
        "assert c.CheckedPrefixCachingBlockAllocator is P\n"
        "assert c.CheckedNaiveBlockAllocator is N\n"
        "assert c.CheckedCpuGpuBlockAllocator is G\n"
        "print('plain')\n"
    )
    env = dict(os.environ)
    env["PREFIXCACHE_CONTRACTS"] = "1" if how else "0"
    out = subprocess.run([sys.executable, *how, "-c", code], env=env, capture_output=True,
                         text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "plain"


# --------------------------------------------------------------------------
# a random walk: no violation on the impl, ownership holds, and every move of
# an id is an edge of the transition table


class Walk:
    """Drives one checked allocator with random valid and invalid calls,
    keeping the live chains, and checks ownership and the life cycle."""

    def __init__(self, seed: int, naive: bool, mode: str = INCREMENTAL) -> None:
        self.rnd = random.Random(seed)
        self.naive = naive
        self.mode = mode
        self.size = self.rnd.choice([1, 2, 3])
        n = self.rnd.choice([1, 2, 3, 4, 6])
        self.a: Any = (checked_class(NaiveBlockAllocator, mode)(
                           create_block=NaiveBlock, num_blocks=n, block_size=self.size)
                       if naive else checked_class(PrefixCachingBlockAllocator, mode)(
                           num_blocks=n, block_size=self.size))
        self.chains: List[List[Any]] = []
        self.swapped: List[List[Any]] = []
        self.checker = checker_of(self.a)
        assert self.checker is not None

    def tokens(self, n: int) -> List[int]:
        return [self.rnd.randint(0, 2) for _ in range(n)]

    def state(self) -> AbstractState:
        return self.checker.state()  # type: ignore[union-attr]

    def step(self) -> None:
        rnd, a = self.rnd, self.a
        ops: List[tuple[str, Callable[[], None]]] = [
            ("allocate_mutable_block", self.new_mutable),
            ("allocate_immutable_blocks", self.new_immutables),
            ("append_token_ids", self.append),
            ("append_token_ids", self.append),
            ("free", self.free),
            ("fork", self.fork),
            ("swap_out", self.swap_out),
            ("swap_in", self.swap_in),
            ("mark_blocks_as_computed", lambda: a.mark_blocks_as_computed([])),
            ("mark_blocks_as_accessed", self.access),
            ("clear_copy_on_writes", a.clear_copy_on_writes),
            ("reset_prefix_cache", a.reset_prefix_cache),
            ("queries", self.queries),
            ("mistake", self.mistake),
        ]
        name, op = ops[rnd.randrange(len(ops))]
        old = self.state()
        try:
            op()
        except PrefixCacheError:
            pass
        new = self.state()
        live = [b for c in self.chains for b in c]
        assert check_all(new, ownership(live)) == []
        if self.mode == INCREMENTAL:
            self.a.audit()      # the mirror is the whole state, after every step
        if self.naive or name == "mistake":   # the table is the prefix allocator's
            return
        for i in new.block_ids:
            assert allowed(life_of(old, i), life_of(new, i), name), (name, i, old, new)

    def pick(self) -> List[Any]:
        return self.rnd.choice(self.chains)

    def new_mutable(self) -> None:
        chain = self.pick() if self.chains and self.rnd.random() < 0.5 else None
        b = self.a.allocate_mutable_block(chain[-1] if chain else None)
        if chain is None:
            self.chains.append([b])
        else:
            chain.append(b)

    def new_immutables(self) -> None:
        chain = self.pick() if self.chains and self.rnd.random() < 0.5 else None
        lists = [self.tokens(self.size if self.rnd.random() < 0.9 else self.size - 1)
                 for _ in range(self.rnd.randint(1, 3))]
        blocks = self.a.allocate_immutable_blocks(chain[-1] if chain else None, lists)
        if chain is None:
            self.chains.append(blocks)
        else:
            chain.extend(blocks)

    def append(self) -> None:
        if self.chains:
            b = self.pick()[-1]
            b.append_token_ids(self.tokens(self.rnd.randint(0, max(0, b.num_empty_slots))))

    def free(self) -> None:
        if self.chains:
            chain = self.chains.pop(self.rnd.randrange(len(self.chains)))
            for b in reversed(chain):
                self.a.free(b)

    def fork(self) -> None:
        if self.chains:
            self.chains.append(self.a.fork(self.pick()[-1]))

    def swap_out(self) -> None:
        if self.chains:
            chain = self.chains.pop(self.rnd.randrange(len(self.chains)))
            self.a.swap_out(chain)
            self.swapped.append(chain)

    def swap_in(self) -> None:
        if self.swapped:
            chain = self.swapped[-1]
            self.a.swap_in(chain)
            self.chains.append(self.swapped.pop())

    def access(self) -> None:
        if self.chains:
            self.a.mark_blocks_as_accessed([b.block_id for b in self.pick()],
                                           float(self.rnd.randint(0, 5)))

    def mistake(self) -> None:
        """A caller mistake: it must raise and change nothing (the checked
        allocator verifies both)."""
        a, rnd = self.a, self.rnd
        kept = a.allocate_mutable_block(None) if a.get_num_free_blocks() else None
        if kept is not None:
            a.free(kept, keep_block_object=True)
        choices: List[Callable[[], Any]] = [
            lambda: a.allocate_immutable_block(None, self.tokens(self.size + 1)),
            lambda: a.get_physical_block_id(-1),
        ]
        if not self.naive:      # the naive allocator ignores access times
            choices.append(lambda: a.mark_blocks_as_accessed([None], 1.0))
        if kept is not None:
            choices += [lambda: a.free(kept), lambda: a.fork(kept),
                        lambda: a.swap_out([kept])]
        if self.chains:
            chain = self.pick()
            choices += [
                lambda: chain[-1].append_token_ids(self.tokens(chain[-1].num_empty_slots + 1)),
                lambda: a.swap_in(chain),
            ]
        try:
            rnd.choice(choices)()
        except PrefixCacheError:
            return
        raise AssertionError("a caller mistake was accepted")

    def queries(self) -> None:
        a = self.a
        a.get_prefix_cache_hit_rate()
        a.get_num_free_blocks()
        if self.chains:
            chain = self.pick()
            a.find_cached_blocks_prefix([b.content_hash for b in chain
                                         if b.content_hash is not None])
            a.get_num_full_blocks_touched(chain)
            a.get_common_computed_block_ids([[b.block_id for b in chain], [chain[0].block_id]])


@pytest.mark.parametrize(("seed", "mode"), [(seed, INCREMENTAL) for seed in range(24)]
                         + [(seed, FULL) for seed in range(8)])
def test_random_walk_finds_no_violation(seed: int, mode: str) -> None:
    logging.getLogger("prefixcache").setLevel(logging.ERROR)
    w = Walk(seed, naive=seed % 4 == 3, mode=mode)
    for _ in range(120):
        w.step()


def test_cpu_gpu_swap_round_trip() -> None:
    g: Any = CheckedCpuGpuBlockAllocator.create("prefix_caching", 4, 4, 2)
    chain = g.allocate_immutable_blocks(None, [[1, 2], [3, 4]], Device.GPU)
    tail = g.allocate_mutable_block(chain[-1], Device.GPU)
    tail.append_token_ids([5])
    blocks = [*chain, tail]
    gpu_ids = [b.block_id for b in blocks]
    to_cpu = g.swap(blocks, Device.GPU, Device.CPU)
    assert list(to_cpu) == gpu_ids and all(b.block_id >= 4 for b in blocks)
    back = g.swap(blocks, Device.CPU, Device.GPU)
    assert sorted(back.values()) == sorted(b.block_id for b in blocks)
    for b in reversed(blocks):
        g.free(b)
    assert g.get_num_free_blocks(Device.GPU) == 4


def test_cpu_gpu_naive_create() -> None:
    g: Any = CheckedCpuGpuBlockAllocator.create("naive", 2, 2, 2)
    b = g.allocate_immutable_block(None, [1, 2], Device.GPU)
    assert g.swap([b], Device.GPU, Device.CPU) == {0: 2}


# --------------------------------------------------------------------------
# the oracle against the planted faults, each under the checked mode


_CHECKABLE = [(cls, expected) for cls, expected in BROKEN
              if issubclass(cls, (PrefixCachingBlockAllocator, NaiveBlockAllocator))]


@pytest.mark.parametrize(("target", "expected"), _CHECKABLE,
                         ids=[c.__name__ for c, _ in _CHECKABLE])
def test_the_oracle_catches_each_planted_fault_in_checked_mode(target: type,
                                                               expected: object) -> None:
    """The oracle (profile ci) against ``checked_class(fault)`` in the
    default, incremental mode: it catches every fault the oracle catches
    plain.  The checked mode's own ViolationError counts, also when it
    comes from a call the oracle makes to read the state (then the oracle
    reports it as an error, not as a Violation)."""
    kill = hunt(checked_class(target), profile="ci")
    by_checker = (kill.error or "").startswith("ViolationError: ")
    assert kill.error is None or by_checker, f"the oracle failed: {kill.error}"
    assert kill.caught or by_checker, f"{target.__name__} was not caught in checked mode"


def test_the_oracle_finds_nothing_on_the_checked_impl() -> None:
    kill = hunt(checked_class(PrefixCachingBlockAllocator), profile="ci")
    assert kill.error is None, kill.error
    assert not kill.caught, f"false alarm: [{kill.category}] {kill.message}\n{kill.final_program}"
