"""The oracle proves itself: the CI profile catches every broken allocator of
tests/helpers/broken_allocators.py, and passes prefixcache.impl's own allocator.

Each broken allocator is fuzzed with the ``ci`` profile (derandomized, so
the examples and the step counts are the same on every run) through
``make_machine`` + ``run_state_machine_as_test``; the run stops at the first
Violation (no shrinking: it would not change the steps to the catch, only
cost time).  The steps taken until the first Violation (``Stats.steps`` at
that moment, every earlier example included), its category and the
invariants broken at that moment are written to ``oracle_kills.json`` in
pytest's base temp directory, and printed as a table (visible with ``-s``).
bench/oracle_kill_table.py produces the same table as bench/ORACLE_KILLS.md.

The faults the CI profile does not catch yet (``MISSED``) are shown to be
real by directed examples here; their oracle runs are in the bench script.
prefixcache.impl's own allocators raise no false alarm: the prefix-caching
and naive ones under the whole profile, the CPU/GPU pair under 50 examples.
"""

from __future__ import annotations

import json
import logging
import statistics
from typing import Any, Dict, Iterator

import pytest
from helpers.broken_allocators import (
    BROKEN,
    CATEGORY_COVERAGE,
    INVARIANT_COVERAGE,
    MISSED,
    BisectFindCachedPrefix,
    Kill,
    MarkAccessedNotAtomic,
    SwapNotAtomic,
    hunt,
)

from prefixcache.impl import errors as err
from prefixcache.impl.cpu_gpu_block_allocator import CpuGpuBlockAllocator
from prefixcache.impl.interfaces import Device
from prefixcache.impl.naive_block import NaiveBlockAllocator
from prefixcache.impl.prefix_caching_block import PrefixCachingBlockAllocator
from prefixcache.spec.invariants import INVARIANTS, OWNERSHIP

PROFILE = "ci"
_KILLS: Dict[str, Kill] = {}


@pytest.fixture(autouse=True)
def _quiet_refused_resets() -> Iterator[None]:
    """reset_prefix_cache logs a warning each time it refuses (thousands)."""
    logger = logging.getLogger("prefixcache")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


@pytest.fixture(scope="module")
def kills(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, Kill]]:
    """Collects every run; at the end writes the JSON file and prints the table."""
    yield _KILLS
    if not _KILLS:
        return
    path = tmp_path_factory.getbasetemp() / "oracle_kills.json"
    caught = [k for k in _KILLS.values() if k.caught and k.name in _BROKEN_NAMES]
    summary: Dict[str, Any] = {
        "profile": PROFILE,
        "median_steps_to_catch": statistics.median(k.steps for k in caught) if caught else None,
        "kills": [k.to_json() for k in _KILLS.values()],
    }
    path.write_text(json.dumps(summary, indent=1) + "\n")
    print(f"\n\noracle kill table (profile {PROFILE}), written to {path}")
    print(f"{'allocator':36} {'caught':6} {'steps':>6} {'ex':>4}  {'category':11} "
          f"invariants broken at the catch")
    for k in _KILLS.values():
        print(f"{k.name:36} {str(k.caught):6} {k.steps if k.steps is not None else '-':>6} "
              f"{k.examples if k.examples is not None else '-':>4}  "
              f"{k.category or '-':11} {', '.join(k.invariants_at_catch) or '-'}")
    if caught:
        print(f"median steps to catch: {summary['median_steps_to_catch']} "
              f"over {len(caught)} broken allocators")


_BROKEN_NAMES = {cls.__name__ for cls, _ in BROKEN}


@pytest.mark.parametrize(("target", "expected"), BROKEN, ids=[c.__name__ for c, _ in BROKEN])
def test_ci_profile_catches(target: type, expected: frozenset, kills: Dict[str, Kill]) -> None:
    kill = hunt(target, profile=PROFILE)
    kills[kill.name] = kill
    assert kill.error is None, f"the oracle failed without a Violation: {kill.error}"
    assert kill.caught, (f"{target.__name__} ({target.FAULT}) was not caught in "  # type: ignore[attr-defined]
                         f"{kill.total_examples} examples / {kill.total_steps} steps")
    assert kill.category in expected, (
        f"caught as {kill.category!r}, expected one of {sorted(expected)}: {kill.message}")
    assert kill.final_categories, "Hypothesis did not end with the Violation"
    # the table's diagnostic column (bench/ORACLE_KILLS.md) could be read
    assert not any(name.startswith("<") for name in kill.invariants_at_catch), (
        kill.invariants_at_catch)
    designed = set(target.INVARIANTS)  # type: ignore[attr-defined]
    if kill.category == "invariant":
        # the invariant the fault is designed to break is the reason given
        assert any(name in kill.message for name in designed), (
            f"the catch names other invariants than {sorted(designed)}: {kill.message}")


def test_real_allocator_passes_ci_profile(kills: Dict[str, Kill]) -> None:
    kill = hunt(PrefixCachingBlockAllocator, profile=PROFILE)
    kills[kill.name] = kill
    assert kill.error is None, kill.error
    assert not kill.caught, (f"false alarm on prefixcache.impl: [{kill.category}] {kill.message}"
                             f"\n{kill.final_program}")
    assert kill.total_examples >= 300 and kill.total_steps > 0


def test_table_touches_every_invariant_and_category() -> None:
    assert len(BROKEN) >= 12
    names = [inv.name for inv in INVARIANTS] + [OWNERSHIP.name]
    assert sorted(INVARIANT_COVERAGE) == sorted(names)
    untouched = [name for name, allocators in INVARIANT_COVERAGE.items() if not allocators]
    assert not untouched, f"no broken allocator breaks {untouched}"
    empty = [category for category, allocators in CATEGORY_COVERAGE.items() if not allocators]
    assert not empty, f"no broken allocator is expected to trip {empty}"
    for cls, expected in BROKEN:
        assert cls.__doc__ and cls.FAULT and expected  # type: ignore[attr-defined]
        assert set(cls.INVARIANTS) <= set(names), cls  # type: ignore[attr-defined]
    assert not _BROKEN_NAMES & {cls.__name__ for cls, _ in MISSED}


# ----------------------------------------------------------------------------
# the faults the CI profile misses are real


def test_missed_bisection_is_wrong_after_a_middle_eviction() -> None:
    """vLLM 0.8.5's bisection reports a chain as cached although its first
    block was evicted (prefixcache.impl answers [])."""
    answers = []
    for cls in (PrefixCachingBlockAllocator, BisectFindCachedPrefix):
        a = cls(num_blocks=4, block_size=1)
        chain = a.allocate_immutable_blocks(None, [[0], [1], [2]])
        other = a.allocate_immutable_block(None, [0])  # shares the first block
        hashes = [b.content_hash for b in chain]
        a.mark_blocks_as_computed([])
        a.mark_blocks_as_accessed([b.block_id for b in chain], now=3)
        a.mark_blocks_as_accessed([other.block_id], now=0)  # the first block is older
        for b in [*chain, other]:
            a.free(b)
        a.allocate_mutable_block(None)  # the last free id
        a.allocate_mutable_block(None)  # evicts the first block of the chain
        answers.append(a.find_cached_blocks_prefix(hashes))
    assert answers[0] == []
    assert len(answers[1]) == 3


def test_swap_not_atomic_loses_blocks_when_the_destination_is_full() -> None:
    for cls, detached in ((CpuGpuBlockAllocator, False), (SwapNotAtomic, True)):
        a = cls.create("prefix_caching", 2, 1, 1)
        first = a.allocate_mutable_block(None, Device.GPU)
        second = a.allocate_mutable_block(first, Device.GPU)
        with pytest.raises(err.NoFreeBlocksError):
            a.swap([first, second], Device.GPU, Device.CPU)
        assert (first.block_id is None) is detached
        assert a.get_num_free_blocks(Device.GPU) == (2 if detached else 0)


def test_missed_mark_accessed_changes_state_before_raising() -> None:
    times = []
    for cls in (PrefixCachingBlockAllocator, MarkAccessedNotAtomic):
        a = cls(num_blocks=2, block_size=1)
        block = a.allocate_immutable_block(None, [0])
        with pytest.raises(err.BlockNotOnDeviceError):
            a.mark_blocks_as_accessed([block.block_id, 1], now=5)  # id 1 is free
        times.append(a._block_tracker[block.block_id].last_accessed)
    assert times == [-1, 5]


# ----------------------------------------------------------------------------
# the other two kinds of target


def test_real_cpu_gpu_allocator_passes_a_short_ci_run(kills: Dict[str, Kill]) -> None:
    """No false alarm on the device pair either (50 examples of the ci
    profile: a device pair runs about four times slower per step)."""
    kill = hunt(CpuGpuBlockAllocator, profile=PROFILE, max_examples=50)
    kills[kill.name] = kill
    assert kill.error is None, kill.error
    assert not kill.caught, f"[{kill.category}] {kill.message}"


def test_real_naive_allocator_passes_ci_profile(kills: Dict[str, Kill]) -> None:
    kill = hunt(NaiveBlockAllocator, profile=PROFILE)
    kills[kill.name] = kill
    assert kill.error is None, kill.error
    assert not kill.caught, f"[{kill.category}] {kill.message}\n{kill.final_program}"
