"""The caller-mistake catalogue in the oracle: every row of the error table
has a provoker (oracle/mistakes.py), each row is provoked on prefixcache.impl
through the driver (the exception class, the state unchanged, and the same
allocator still serving valid calls afterwards), the ``ci`` campaign reaches
every row, and allocators that mishandle a row are caught.

The whole suite also runs under ``python -O`` (.ci/run): the checks here are
the driver's own comparisons, not ``assert`` statements in the code under test.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import pytest
from helpers.broken_allocators import MISHANDLED, hunt
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test

from prefixcache.oracle.machine import Stats, make_machine
from prefixcache.oracle.mistakes import PROVOKERS, TABLE_KIND, provoke, rows_for
from prefixcache.oracle.profiles import profile_settings
from prefixcache.oracle.targets import resolve_target
from prefixcache.spec.error_table import ERROR_TABLE, ErrorCase

TARGETS = {
    "prefix": "prefixcache.impl.prefix_caching_block:PrefixCachingBlockAllocator",
    "naive": "prefixcache.impl.naive_block:NaiveBlockAllocator",
    "cpu_gpu": "prefixcache.impl.cpu_gpu_block_allocator:CpuGpuBlockAllocator",
}


def test_every_row_has_a_provoker() -> None:
    keys = [row.key for row in ERROR_TABLE]
    assert len(set(keys)) == len(keys)
    assert [k for k in keys if k not in PROVOKERS] == []
    assert sorted(set(PROVOKERS) - set(keys)) == []  # no provoker for a row that is gone
    for kind in TABLE_KIND:
        assert rows_for(kind) == [r for r in ERROR_TABLE if TABLE_KIND[kind] in r.applies_to]
    print(f"\nthe error table has {len(ERROR_TABLE)} rows: "
          + ", ".join(f"{kind} {len(rows_for(kind))}" for kind in TABLE_KIND))


# ----------------------------------------------------------------------------
# each row, directed: provoked on a populated allocator, then the allocator works


def _cases() -> List[Any]:
    return [pytest.param(kind, row, id=f"{kind}-{row.key}")
            for kind in TABLE_KIND for row in rows_for(kind)]


def _still_works(m: Any) -> None:
    """Valid calls, judged by the driver: end every sequence, take every id
    of the pool (GPU) with new blocks, give them back."""
    for seq in list(m.seqs):
        m.seqs.remove(seq)
        for name in seq.names:
            m.run("free", block=name)
            assert m.ok()
    taken = []
    device = {"device": "GPU"} if m.d.kind == "cpu_gpu" else {}
    label = "GPU" if m.d.kind == "cpu_gpu" else ""
    while m.d.model_states()[label].reported_free > 0:
        taken += m.run("allocate_mutable_block", prev_block=None, extra_hash=None, **device).out
        assert m.ok()
    assert taken
    for name in taken:
        m.run("free", block=name)
        assert m.ok()


@pytest.mark.parametrize(("kind", "row"), _cases())
def test_row_raises_changes_nothing_and_the_allocator_still_works(kind: str,
                                                                   row: ErrorCase) -> None:
    machine = make_machine(resolve_target(TARGETS[kind]))
    reached: List[str] = []

    @settings(max_examples=4, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(data=st.data(), num_blocks=st.integers(3, 5), block_size=st.integers(1, 3))
    def run(data: st.DataObject, num_blocks: int, block_size: int) -> None:
        m = machine()
        m.setup(num_blocks=num_blocks, block_size=block_size)
        for _ in range(data.draw(st.integers(1, 3), label="sequences")):
            m.new_sequence(data)
        if kind != "cpu_gpu" and m.seqs and data.draw(st.booleans(), label="swap one out"):
            m.swap(data)
        if not PROVOKERS[row.key].possible(m):
            return
        label = provoke(m, row, data)
        if label is None:  # a set-up step could not be made in this state
            return
        assert label == f"mistake:{row.key}", label
        reached.append(label)
        _still_works(m)

    run()
    assert reached, f"{row.key} was never provoked"


# ----------------------------------------------------------------------------
# the ci campaign reaches every row


def _ci_campaign(kind: str) -> Stats:
    stats = Stats()
    machine = make_machine(resolve_target(TARGETS[kind]), stats=stats)
    run_state_machine_as_test(machine, settings=profile_settings("ci"))
    return stats


@pytest.mark.parametrize("kind", sorted(TABLE_KIND))
def test_the_ci_campaign_reaches_every_row(kind: str) -> None:
    stats = _ci_campaign(kind)
    counts: Dict[str, int] = {row.key: stats.coverage[f"mistake:{row.key}"]
                              for row in rows_for(kind)}
    missing = [key for key, n in counts.items() if n == 0]
    assert missing == [], f"the ci profile never provokes {missing}"
    mismatched = [label for label in stats.coverage if label.startswith("mistake-mismatch:")]
    assert mismatched == []
    fewest: Tuple[int, str] = min((n, key) for key, n in counts.items())
    print(f"\n{kind}: {len(counts)} rows reached in {stats.steps} steps; "
          f"{sum(counts.values())} mistakes; fewest: {fewest}")


# ----------------------------------------------------------------------------
# allocators that mishandle one row are caught


@pytest.mark.parametrize("target", MISHANDLED, ids=[c.__name__ for c in MISHANDLED])
def test_a_mishandled_mistake_is_caught(target: type) -> None:
    row = next(r for r in ERROR_TABLE if r.key == target.ROW)  # type: ignore[attr-defined]
    kill = hunt(target, profile="ci", quiet=True)
    assert kill.error is None, kill.error
    assert kill.caught, f"{target.__name__} was not caught in {kill.total_steps} steps"
    assert kill.category == "robustness", kill.message
    assert row.operation.split(".")[-1].split("/")[0] in (kill.message or ""), kill.message
