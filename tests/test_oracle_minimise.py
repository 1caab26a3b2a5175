"""oracle/minimise.py: a finding's trace is cut to a 1-minimal one that breaks
the same rule, and a deadline stops it; a black-box finding put on a refused
caller mistake is the trace's own when it stays without the refused steps."""

from __future__ import annotations

import time

from helpers.oracle_faults import WrongHitRateAndCommonPrefix

from prefixcache.oracle.findings import Findings
from prefixcache.oracle.machine import Stats
from prefixcache.oracle.minimise import minimise, without_refusals
from prefixcache.oracle.replay import replay
from prefixcache.oracle.search import SearchOptions, _own
from prefixcache.oracle.targets import resolve_target
from prefixcache.oracle.trace import Step, Trace
from prefixcache.oracle.violations import Violation
from prefixcache.spec.semantics import PRESETS, Semantics

PREFIXCACHE, VLLM = PRESETS["prefixcache"], PRESETS["vllm-0.8.5"]
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


def _put_on_a_refusal(target_name: str, step: Step,
                      semantics: Semantics = PREFIXCACHE) -> Violation:
    """The black-box finding of a refused fork of another allocator's Block,
    then ``step`` and a free of its Block, judged by ``semantics``: put on
    the refusal."""
    trace = Trace(num_blocks=2, block_size=1, steps=[
        Step("fork", {"last_block": "@foreign"}), step, Step("free", {"block": "b0"})])
    found = replay(trace, resolve_target(target_name), white_box=False,
                   semantics=semantics).violation
    assert found is not None
    assert found.signature == "robustness/free/after-refusal:free-count"
    return found


FREE_COUNT_FAULT = "tests.helpers.broken_allocators:FreeCountWithoutEvictable"
CACHED = Step("allocate_immutable_block", {"prev_block": None, "token_ids": [0],
                                           "extra_hash": None}, ["b0"])


def test_a_finding_put_on_a_harmless_refusal_is_the_targets_own() -> None:
    """The free count that forgets evictable ids shows after the refused fork
    (which changed nothing) and without it: a conformance finding."""
    put = _put_on_a_refusal(FREE_COUNT_FAULT, CACHED)
    own = without_refusals(put, resolve_target(FREE_COUNT_FAULT), semantics=PREFIXCACHE,
                           white_box=False)
    assert own.signature == "conformance/free/free-count" and own.step == 1
    assert own.trace is not None
    assert [step.op for step in own.trace.steps] == ["allocate_immutable_block", "free"]


def test_a_finding_the_refusal_caused_stays_on_it() -> None:
    """vLLM's fork of a foreign Block takes a reference before it raises:
    without that step the free count is right, so the finding stays put."""
    target = "prefixcache.bench.vllm_repaired:PrefixCachingBlockAllocator"
    mutable = Step("allocate_mutable_block", {"prev_block": None, "extra_hash": None}, ["b0"])
    put = _put_on_a_refusal(target, mutable, VLLM)
    assert without_refusals(put, resolve_target(target), semantics=VLLM,
                            white_box=False) is put
    assert without_refusals(put, resolve_target(target), semantics=VLLM,
                            white_box=True) is put   # white-box, nothing was refused unseen


def test_the_campaign_keeps_the_own_finding_and_knows_both_signatures() -> None:
    """A campaign records the finding in its own category; one its baseline
    knows is counted as met again, not found; either way the signature it
    was put under halts later examples."""
    put = _put_on_a_refusal(FREE_COUNT_FAULT, CACHED)
    options = SearchOptions(white_box=False)
    findings, stats = Findings(), Stats()
    [own] = _own([put], resolve_target(FREE_COUNT_FAULT), options, findings, stats)
    assert own.signature == "conformance/free/free-count"
    assert put.signature in findings.known
    baseline = Findings(known={own.signature})
    assert _own([put], resolve_target(FREE_COUNT_FAULT), options, baseline, stats) == []
    assert stats.known_seen[own.signature] == 1 and put.signature in baseline.known
