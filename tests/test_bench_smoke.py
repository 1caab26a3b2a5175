"""A short smoke of ``prefixcache bench``: the workload, the replay driver and
the report run end to end on a tiny configuration.  Benchmarks are not
tests: nothing here looks at a timing."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any, List

import pytest
from helpers import broken_allocators

from prefixcache.bench import benchmark as bench
from prefixcache.bench.replayer import (
    ACCESS,
    CALL_NAMES,
    FREE_DECODE,
    MARK_COMPUTED,
    Compiler,
    Machine,
    compile_workload,
    fuse,
    plan,
)
from prefixcache.bench.soak import soak
from prefixcache.bench.workload import OP_KINDS, WorkloadConfig
from prefixcache.impl.prefix_caching_block import PrefixCachingBlockAllocator
from prefixcache.oracle.targets import Target, resolve_target

TINY = WorkloadConfig(num_blocks=48, block_size=4, max_running=4, num_requests=16,
                      seed=3, system_prompt_tokens=(4, 40), user_tokens=(1, 12),
                      output_tokens=(1, 24), parallel_prob=0.3, arrival_rate=0.5)
TINY_ACCESS_HEAVY = WorkloadConfig(**{**TINY.__dict__, "access_heavy": True})


def _sha256_allocator(num_blocks: int, block_size: int) -> Any:
    return PrefixCachingBlockAllocator(num_blocks=num_blocks, block_size=block_size,
                                       hash_algo="sha256")


def test_the_workload_is_plain_data_and_depends_only_on_the_seed() -> None:
    first = plan(TINY).workload
    again = plan(TINY).workload
    assert first.ops == again.ops
    assert {op[0] for op in first.ops} <= set(OP_KINDS)
    for kind in ("admit", "append", "fork", "free", "query_free", "scheduled"):
        assert any(op[0] == kind for op in first.ops), kind
    assert first.stats.turns == TINY.num_requests
    assert first.stats.recompute_preemptions + first.stats.swap_preemptions > 0
    other = plan(WorkloadConfig(**{**TINY.__dict__, "seed": 4})).workload
    assert other.ops != first.ops


def test_the_program_replays_with_the_planned_answers() -> None:
    program_plan = plan(TINY)
    program = compile_workload(program_plan.workload)
    assert program.instructions == program_plan.program.instructions
    assert program.calls == sum(program.calls_by_name.values())
    assert set(program.calls_by_name) <= set(CALL_NAMES)
    machine = Machine(PrefixCachingBlockAllocator(num_blocks=TINY.num_blocks,
                                                  block_size=TINY.block_size),
                      program.num_seqs)
    machine.run(program.instructions)
    assert machine.answers == program.expected
    assert len(machine.fingerprint()) == 64


def test_fusing_keeps_the_calls_and_run_timed_makes_the_same_ones() -> None:
    """The fused program makes the unfused one's calls (same count, same ids,
    same answers) in fewer instructions, and run_timed makes the same calls
    as run."""
    workload = plan(TINY).workload
    compiler = Compiler(TINY.block_size)
    for op in workload.ops:
        compiler.compile(op)
    unfused = compiler.program.instructions
    program = compile_workload(workload)
    fused_ops = {instruction[0] for instruction in program.instructions}
    assert FREE_DECODE in fused_ops and len(program.instructions) < len(unfused)
    assert any(op == MARK_COMPUTED and x > 1 for op, _, x, _ in program.instructions)
    assert fuse(unfused) == program.instructions
    calls_made = []
    fingerprints = []
    for instructions, timed in ((unfused, False), (program.instructions, False),
                                (program.instructions, True)):
        counted = _CountingAllocator(num_blocks=TINY.num_blocks, block_size=TINY.block_size)
        machine = Machine(counted, program.num_seqs)
        if timed:
            machine.run_timed(instructions)
        else:
            machine.run(instructions)
        assert machine.answers == program.expected
        calls_made.append(counted.calls)
        fingerprints.append(machine.fingerprint())
    assert calls_made[0] == calls_made[1] == calls_made[2]
    assert fingerprints[0] == fingerprints[1] == fingerprints[2]


class _CountingAllocator(PrefixCachingBlockAllocator):
    """Records the name of every public call the driver makes."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls: List[str] = []

    def __getattribute__(self, name: str) -> Any:
        value = super().__getattribute__(name)
        if name in CALL_NAMES and callable(value):
            calls = super().__getattribute__("calls")

            def counted(*args: Any, **kwargs: Any) -> Any:
                calls.append(name)
                return value(*args, **kwargs)
            return counted
        return value


def test_the_access_heavy_workload_marks_every_running_sequence_every_step() -> None:
    """Access-heavy: right after a group's ``scheduled``, each of its running
    sequences marks its blocks accessed at the step's time; the main
    workload makes no such marks; the program makes one
    ``mark_blocks_as_accessed`` per mark, on the sequence's current ids."""
    main = plan(TINY)
    heavy = plan(TINY_ACCESS_HEAVY)
    assert TINY_ACCESS_HEAVY.workload_name == "access-heavy" and TINY.workload_name == "main"
    assert not any(op[0] == "access" for op in main.workload.ops)
    ops = heavy.workload.ops
    marks = 0
    for index, op in enumerate(ops):
        if op[0] != "scheduled":
            continue
        following = ops[index + 1:index + 1 + len(op[1])]
        assert [(o[0], o[1]) for o in following] == [("access", seq) for seq in op[1]]
        assert len({o[2] for o in following}) == 1
        marks += len(op[1])
    assert marks == sum(1 for op in ops if op[0] == "access") > 0
    times = [op[2] for op in ops if op[0] == "access"]
    assert times == sorted(times) and len(set(times)) > 1  # a new time every step
    program = heavy.program
    assert sum(1 for instruction in program.instructions if instruction[0] == ACCESS) == marks
    extra = (program.calls_by_name["mark_blocks_as_accessed"]
             - main.program.calls_by_name["mark_blocks_as_accessed"])
    assert extra == marks and program.calls == main.program.calls + marks
    recorded = _AccessRecorder(num_blocks=TINY.num_blocks, block_size=TINY.block_size)
    machine = Machine(recorded, program.num_seqs)
    machine.run(program.instructions)
    assert machine.answers == program.expected
    assert recorded.marks == program.calls_by_name["mark_blocks_as_accessed"]


class _AccessRecorder(PrefixCachingBlockAllocator):
    """Counts ``mark_blocks_as_accessed``; the allocator itself refuses an id
    it does not hold (a stale id in the driver would raise)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.marks = 0

    def mark_blocks_as_accessed(self, block_ids: List[int], now: float) -> None:
        self.marks += 1
        assert block_ids, "a running sequence has blocks"
        super().mark_blocks_as_accessed(block_ids, now)


def test_both_targets_give_identical_fingerprints_on_the_access_heavy_workload() -> None:
    """prefixcache.impl and vLLM 0.8.5 replay the access-heavy program with
    the same ids, the planned answers and per-call latencies of the marks."""
    program_plan = plan(TINY_ACCESS_HEAVY)
    targets = [resolve_target(None), bench.load_target(bench.VLLM)]
    results = bench.measure(targets, program_plan, "tiny", TINY.num_blocks, repeats=1,
                            latency=True)
    assert [r.error for r in results] == [None, None]
    assert results[0].fingerprint == results[1].fingerprint
    assert all(r.answers_match for r in results)
    for result in results:
        assert (result.latency["mark_blocks_as_accessed"].count
                == program_plan.program.calls_by_name["mark_blocks_as_accessed"])


def test_the_verb_times_the_access_heavy_workload(tmp_path: Path) -> None:
    """``prefixcache bench --workload access-heavy`` names its workload in the JSON."""
    out = tmp_path / "bench.json"
    code = bench.main(["--workload", "access-heavy", "--blocks", "256", "--tight-blocks", "0",
                       "--running", "4", "--requests", "6", "--repeats", "1",
                       "--against", "prefixcache.impl.prefix_caching_block:"
                       "PrefixCachingBlockAllocator", "--json", str(out)])
    assert code == 0
    document = json.loads(out.read_text())
    assert document["workload"] == "access-heavy"
    pool = document["pools"][0]
    assert pool["workload_name"] == "access-heavy" and pool["config"]["access_heavy"] is True
    assert pool["fingerprints_identical"] is True
    assert "mark_blocks_as_accessed" in pool["results"][0]["latency"]


def test_two_correct_allocators_hand_out_the_same_ids() -> None:
    program_plan = plan(TINY)
    builtin = resolve_target(None)
    sha256 = resolve_target(_sha256_allocator)
    results = bench.measure([builtin, sha256], program_plan, "tiny", TINY.num_blocks,
                            repeats=1, latency=True)
    assert [r.error for r in results] == [None, None]
    assert results[0].fingerprint == results[1].fingerprint
    assert all(r.answers_match for r in results)
    assert results[0].hit_rate == results[1].hit_rate
    assert "append_token_ids" in results[0].latency
    assert results[0].latency["append_token_ids"].count > 0


@pytest.mark.parametrize("count", [1, 64, 130])
def test_the_scaling_prefill_leaves_cached_computed_evictable_blocks(count: int) -> None:
    """fill_cache leaves ``count`` evictable blocks, every one cached and
    computed (none touched: the timed replay's first mark_blocks_as_computed
    must not pay for the prefill), and the free count as it was."""
    allocator = PrefixCachingBlockAllocator(num_blocks=256, block_size=4)
    bench.fill_cache(allocator, count, 4)
    assert allocator.evictor.num_blocks == count
    assert allocator.get_num_free_blocks() == 256
    assert not allocator._touched_blocks
    assert all(allocator.block_is_computed(block_id) for block_id in allocator.evictor.free_table)


def test_the_verb_prints_and_writes_json(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    out = tmp_path / "bench.json"
    args = parser.parse_args([
        "--blocks", "512", "--tight-blocks", "128", "--running", "4",
        "--requests", "6", "--repeats", "1", "--scaling", "--scaling-sizes", "512,2048",
        "--against", "prefixcache.impl.prefix_caching_block:PrefixCachingBlockAllocator",
        "--json", str(out),
    ])
    assert bench.run(args) == 0
    printed = capsys.readouterr().out
    assert "calls/s" in printed and "fingerprints identical" in printed
    assert "flat cost" in printed
    document = json.loads(out.read_text())
    assert [pool["pool"] for pool in document["pools"]] == ["roomy", "tight"]
    for pool in document["pools"]:
        assert pool["fingerprints_identical"] is True
        for result in pool["results"]:
            assert result["calls"] > 0 and result["error"] is None
            assert set(result["latency"]) <= set(CALL_NAMES)
    assert [row["num_blocks"] for row in document["scaling"]] == [512, 2048]


def test_a_bad_target_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--target", "no.such.module:Allocator"])
    assert bench.run(args) == 2


def _bench_script(name: str) -> Any:
    path = Path(__file__).resolve().parent.parent / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"prefixcache_bench_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_driver_cost_stand_in_replays_the_recorded_answers() -> None:
    """bench/driver_cost.py records one answer per allocator call (the
    Block's appends are not the allocator's) and its stand-in replays the
    whole program on them, twice in a row (each stand-in has its own copies)."""
    script = _bench_script("driver_cost")
    program_plan = plan(TINY)
    program = program_plan.program
    answers = script.record_answers(program_plan, TINY.num_blocks)
    assert len(answers) == program.calls - program.calls_by_name["append_token_ids"]
    stand_in = Target(name="stand-in", kind="prefix",
                      build=lambda num_blocks, block_size: script.StandIn(answers))
    results = bench.measure([stand_in, resolve_target(None)], program_plan, "tiny",
                            TINY.num_blocks, repeats=2, latency=False)
    assert [r.error for r in results] == [None, None]
    assert results[0].answers_match and results[1].answers_match


def test_the_oracle_speed_reports_both_targets_with_the_shrinking_apart(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """bench/oracle_speed.py runs a campaign on prefixcache.impl and one on vLLM
    0.8.5 (its own rules, valid calls) and gives the shrinking's time and
    steps apart from the checking's."""
    script = _bench_script("oracle_speed")
    out = tmp_path / "speed.json"
    assert script.main(["--seconds", "2", "--no-profile", "--json", str(out)]) == 0
    document = json.loads(out.read_text())
    speeds = document["speeds"]
    assert [speed["target"] for speed in speeds] == ["prefixcache.impl", "vLLM 0.8.5"]
    assert "--semantics vllm-0.8.5 --no-mistakes" in speeds[1]["command"]
    for speed in speeds:
        assert speed["steps"] > 0
        assert 0 <= speed["shrink_steps"] <= speed["steps"]
        assert 0 <= speed["shrink_seconds"] <= speed["seconds"]
        assert speed["shrink_steps"] == 0 or speed["findings"] > 0
    assert "checked steps/s" in capsys.readouterr().out


def test_the_paired_ratio_is_the_median_of_the_rounds_ratios() -> None:
    assert bench.paired_ratio([1.0, 2.0, 1.0], [3.0, 4.0, 2.5]) == 2.5
    assert bench.paired_ratio([1.0, 1.0], [2.0, 3.0]) == 2.5
    assert bench.paired_ratio([], []) is None


def test_the_rounds_ratios_are_sorted_and_their_spread_is_shown() -> None:
    assert bench.round_ratios([1.0, 2.0, 1.0], [3.0, 4.0, 2.5]) == [2.0, 2.5, 3.0]
    assert bench.round_ratios([1.0, 0.0], [2.0, 5.0]) == [2.0]  # a round without a time
    assert bench.spread_text([2.0, 2.5, 3.0]) == ", from 2x to 3x"
    assert bench.spread_text([2.5]) == ""


def test_results_render_from_a_kept_run_with_its_time_and_spread(tmp_path: Path) -> None:
    """bench/run_benchmarks.py --render-only writes RESULTS.md from the JSON a
    run kept: the run's own time in the header, beside each ratio the median
    of the rounds' ratios and how far they lie apart, and the contracts-off
    instruction counts."""
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    kept = tmp_path / "kept"
    kept.mkdir()
    args = parser.parse_args([
        "--blocks", "256", "--tight-blocks", "0", "--running", "4", "--requests", "4",
        "--repeats", "3", "--no-latency", "--json", str(kept / "impl_vs_vllm.json"),
        "--against", "prefixcache.impl.prefix_caching_block:PrefixCachingBlockAllocator",
    ])
    assert bench.run(args) == 0
    main_json = kept / "impl_vs_vllm.json"
    document = json.loads(main_json.read_text())  # as run_benchmarks.py keeps it
    document.update(exit_code=0, shown_command="prefixcache bench ...")
    main_json.write_text(json.dumps(document))
    (kept / "contracts_off.json").write_text(json.dumps(document))  # contracts on missing
    (kept / "instructions_contracts_off.json").write_text(json.dumps({
        "pair": "contracts-off", "fingerprints_identical": True,
        "rows": [{"target": "checked (contracts off)", "instructions": 1_000_200},
                 {"target": "plain impl", "instructions": 1_000_000}]}))
    written_at = 1_700_000_000  # 2023-11-14 22:13 UTC
    for path in kept.iterdir():
        os.utime(path, (written_at, written_at))
    out = tmp_path / "RESULTS.md"
    script = _bench_script("run_benchmarks")
    assert script.main(["--render-only", str(kept), "--out", str(out)]) == 0
    text = out.read_text()
    assert "on 2023-11-14 22:13 UTC" in text
    rounds = bench.round_ratios(*(result["seconds_all"]
                                  for result in document["pools"][0]["results"]))
    assert len(rounds) == 3
    assert f"from {rounds[0]:.3g}x to {rounds[-1]:.3g}x)" in text
    assert ("checked (contracts off) 1,000,200, plain impl 1,000,000: **1.0002x**; "
            "id fingerprints identical.") in text
    assert "Contracts on: not measured in this recording" in text
    assert "not importable" not in text
    assert "## Checked mode (incremental) against the plain allocator\n\nNot measured" in text


def test_results_render_the_checked_mode_side_by_side(tmp_path: Path) -> None:
    """The checked-mode section: the replay's ratio, one row per pool size
    with both allocators' cost per call, and icontract's own cost."""
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    kept = tmp_path / "kept"
    kept.mkdir()
    plain = "prefixcache.impl.prefix_caching_block:PrefixCachingBlockAllocator"
    args = parser.parse_args([
        "--blocks", "256", "--tight-blocks", "0", "--running", "4", "--requests", "4",
        "--repeats", "2", "--no-latency", "--json", str(kept / "checked.json"),
        "--target", "prefixcache.spec.checked:CheckedPrefixCachingBlockAllocator",
        "--against", plain, "--scaling", "--scaling-against", "--scaling-sizes", "256,512"])
    assert bench.run(args) == 0
    for name in ("checked.json", "impl_vs_vllm.json"):
        document = json.loads((kept / "checked.json").read_text())
        document.update(exit_code=0, shown_command=f"prefixcache bench ({name})")
        (kept / name).write_text(json.dumps(document))
    (kept / "wrapper.json").write_text(json.dumps({"plain": 50.0, "icontract": 4800.0,
                                                   "lean": 120.0}))
    out = tmp_path / "RESULTS.md"
    assert _bench_script("run_benchmarks").main(["--render-only", str(kept), "--out",
                                                 str(out)]) == 0
    section = out.read_text().split("## Checked mode (incremental)")[1].split("\n## ")[0]
    assert "prefixcache bench (checked.json)" in section
    assert "Checked over plain per call: **" in section
    rows = [line for line in section.splitlines() if line.startswith(("| 256 |", "| 512 |"))]
    assert len(rows) == 2 and all(line.count("|") == 6 for line in rows)
    assert "dearest pool size over its cheapest" in section
    assert "**4,800 ns** per call, against 50 ns plain and 120 ns" in section


def _pool(workload_p50s: List[int], vllm_p50s: List[int]) -> Any:
    names = ["free", "mark_blocks_as_accessed"]

    def latency(p50s: List[int]) -> Any:
        return {name: {"count": 1, "p50_ns": p50, "p99_ns": p50, "total_ms": 0.0}
                for name, p50 in zip(names, p50s)}
    return {"pool": "roomy", "calls": 10, "calls_by_name": {"free": 6,
                                                            "mark_blocks_as_accessed": 4},
            "ratio": 2.0, "paired_ratio": 2.0, "fingerprints_identical": True,
            "results": [{"calls_per_s": 200.0, "seconds_all": [1.0, 1.0],
                         "latency": latency(workload_p50s)},
                        {"calls_per_s": 100.0, "seconds_all": [2.0, 2.0],
                         "latency": latency(vllm_p50s)}]}


def test_results_mark_the_call_kinds_slower_than_vllms_at_p50() -> None:
    """The side-by-side table names, per workload, the kinds of call whose p50
    is above vLLM's; the oracle section shows both targets' checked steps/s."""
    script = _bench_script("run_benchmarks")
    main = {"workload": "main", "pools": [_pool([100, 300], [200, 200])]}
    heavy = {"workload": "access-heavy", "pools": [_pool([100, 100], [200, 200])]}
    assert script.slower_at_p50(main["pools"][0]) == ["mark_blocks_as_accessed"]
    text = "\n".join(script._workloads_summary([main, heavy]))
    assert "| main | roomy | 10 | 200 | 100 | **2x** | 2x (2x to 2x) | identical | " \
           "`mark_blocks_as_accessed` |" in text
    assert ("| access-heavy | roomy | 10 | 200 | 100 | **2x** | 2x (2x to 2x) | identical | "
            "none |") in text
    speed = {"seconds": 5, "command": "python bench/oracle_speed.py --seconds 5",
             "speeds": [{"target": target, "command": "prefixcache fuzz", "steps": 100,
                         "seconds": 5.0, "shrink_seconds": 4.0, "shrink_steps": 90,
                         "steps_per_s": 20.0, "checking_steps_per_s": 10.0,
                         "cpu_seconds": 2.5, "steps_per_cpu_s": 40.0,
                         "checking_steps_per_cpu_s": 20.0, "findings": 1}
                        for target in ("prefixcache.impl", "vLLM 0.8.5")],
             "profiles": []}
    oracle = "\n".join(script._oracle_section(speed))
    assert "| vLLM 0.8.5 | `prefixcache fuzz` | 100 | 5.0 | 4.0 | 90 | 20 | **10** | 50% | " \
           "40 | **20** | 1 |" in oracle


def test_the_soak_checks_a_correct_allocator_and_finds_nothing() -> None:
    report = soak(resolve_target(), plan(TINY), TINY.num_blocks, TINY.block_size,
                  check_every=50)
    assert report.ok, report.violations
    assert report.white_box and report.rounds == 2 and report.checks > 2
    assert report.calls == 2 * plan(TINY).program.calls
    assert len(report.memory_after_round) == 2


@pytest.mark.parametrize("fault", ["ForkMissesFirstBlock", "ResetLeavesEvictor",
                                   "EvictionKeepsStaleHash", "FreeCountWithoutEvictable"])
def test_the_soak_finds_a_planted_fault(fault: str) -> None:
    target = resolve_target(getattr(broken_allocators, fault))
    report = soak(target, plan(TINY), TINY.num_blocks, TINY.block_size, check_every=20)
    assert not report.ok


def test_the_soak_is_an_option_of_the_verb(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "soak.json"
    code = bench.main(["--soak", "--blocks", "48", "--block-size", "4", "--requests", "12",
                       "--running", "4", "--check-every", "100", "--json", str(out)])
    assert code == 0, capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["ok"] and data["format"] == "prefixcache-soak/1" and data["checks"] >= 2
