"""oracle/minimise.py: a finding's trace is cut to a 1-minimal one that breaks
the same rule, and a deadline stops it."""

from __future__ import annotations

import time

from helpers.oracle_faults import WrongHitRateAndCommonPrefix

from prefixcache.oracle.minimise import minimise
from prefixcache.oracle.replay import replay
from prefixcache.oracle.targets import resolve_target
from prefixcache.oracle.trace import Step, Trace
from prefixcache.oracle.violations import Violation
from prefixcache.spec.semantics import Semantics

SIGNATURE = "conformance/get_prefix_cache_hit_rate/result"


def _padded() -> Trace:
    """A hit, then the hit rate asked (the fault answers 0.0), with steps
    around it that have nothing to do with the fault."""
    steps = [
        Step("allocate_mutable_block", {"prev_block": None, "extra_hash": None}, ["b0"]),
        Step("get_num_free_blocks"),
        Step("allocate_immutable_block", {"prev_block": None, "token_ids": [1],
                                          "extra_hash": None}, ["b1"]),
        Step("clear_copy_on_writes"),
        Step("free", {"block": "b0"}),
        Step("allocate_immutable_block", {"prev_block": None, "token_ids": [1],
                                          "extra_hash": None}, ["b2"]),
        Step("get_num_total_blocks"),
        Step("mark_blocks_as_computed", {"block_ids": []}),
        Step("get_prefix_cache_hit_rate"),
    ]
    return Trace(num_blocks=4, block_size=1, steps=steps)


def _violation(trace: Trace) -> Violation:
    found = replay(trace, resolve_target(WrongHitRateAndCommonPrefix)).violation
    assert found is not None and found.signature == SIGNATURE
    return found


def test_a_padded_trace_is_cut_to_what_the_fault_needs() -> None:
    target = resolve_target(WrongHitRateAndCommonPrefix)
    shortest, minimal = minimise(_violation(_padded()), target, semantics=Semantics())
    assert minimal
    assert shortest.signature == SIGNATURE
    assert shortest.trace is not None
    assert [s.op for s in shortest.trace.steps] == [
        "allocate_immutable_block", "allocate_immutable_block", "get_prefix_cache_hit_rate"]
    assert shortest.trace.num_blocks == 1
    again = replay(shortest.trace, target).violation
    assert again is not None and again.signature == SIGNATURE


def test_a_past_deadline_keeps_the_finding_and_says_it_is_not_minimal() -> None:
    violation = _violation(_padded())
    shortest, minimal = minimise(violation, resolve_target(WrongHitRateAndCommonPrefix),
                                 semantics=Semantics(), deadline=time.monotonic() - 1)
    assert not minimal
    assert shortest is violation


def test_a_trace_that_does_not_fail_again_is_kept_and_not_called_minimal() -> None:
    """Replayed on a target without the fault (as a target that is not
    deterministic would), the finding is kept as it was found."""
    violation = _violation(_padded())
    shortest, minimal = minimise(violation, resolve_target(), semantics=Semantics())
    assert shortest is violation and not minimal
