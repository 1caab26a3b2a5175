"""``prefixcache fuzz`` as a campaign: every distinct finding in one run, each
with a signature and a trace file that replays to it, --max-findings,
--stop-at-first, --baseline, a time budget that bounds shrinking, hangs,
the target's log counted, and one-line usage errors with exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest
from hypothesis.statistics import note_statistics

import prefixcache.oracle.search as search_module
from prefixcache.oracle.machine import OutOfTime
from prefixcache.oracle.targets import resolve_target

TESTS = Path(__file__).resolve().parent
IMPL = "prefixcache.impl.prefix_caching_block:PrefixCachingBlockAllocator"


def run_cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(TESTS))
    env.pop("CI", None)
    return subprocess.run([sys.executable, "-m", "prefixcache.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def fuzz(tmp: Path, *args: str, expect: int) -> Dict[str, Any]:
    """A campaign with a JSON report; its exit code must be ``expect``."""
    result = run_cli("fuzz", "--quiet", "--json", "report.json", *args, cwd=tmp)
    assert result.returncode == expect, result.stdout + result.stderr
    report: Dict[str, Any] = json.loads((tmp / "report.json").read_text())
    report["stdout"] = result.stdout
    return report


def signatures(report: Dict[str, Any]) -> List[str]:
    return [f["signature"] for f in report["findings"]]


TWO_FAULTS = ("--target", "helpers.oracle_faults:WrongHitRateAndCommonPrefix")


@pytest.fixture(scope="module")
def two_faults(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory of one campaign against two independent faults."""
    tmp = tmp_path_factory.mktemp("two-faults")
    fuzz(tmp, *TWO_FAULTS, "--seconds", "120", "--max-findings", "2", expect=1)
    return tmp


def test_one_campaign_reports_two_independent_faults(two_faults: Path) -> None:
    tmp_path = two_faults
    report = json.loads((tmp_path / "report.json").read_text())
    found = signatures(report)
    assert "conformance/get_prefix_cache_hit_rate/result" in found
    assert "conformance/get_common_computed_block_ids/result" in found
    assert len(set(found)) == len(found)
    for finding in report["findings"]:
        assert finding["explained_by"] is None  # a fault under every preset
        replayed = run_cli("replay", finding["trace_file"], cwd=tmp_path)
        assert replayed.returncode == 1
        assert f"# signature: {finding['signature']}" in replayed.stdout


def test_max_findings_and_stop_at_first(tmp_path: Path) -> None:
    target = (*TWO_FAULTS, "--seconds", "60", "--no-shrink")  # the stop, not the shrinking
    assert len(fuzz(tmp_path, *target, "--stop-at-first", expect=1)["findings"]) == 1
    report = fuzz(tmp_path, *target, "--max-findings", "1", expect=1)
    assert len(report["findings"]) == 1 and report["stopped_because"] == "max-findings"


def test_a_baseline_makes_known_findings_pass(two_faults: Path, tmp_path: Path) -> None:
    first = json.loads((two_faults / "report.json").read_text())
    again = fuzz(tmp_path, *TWO_FAULTS, "--examples", "300", "--baseline",
                 str(two_faults / "report.json"), expect=0)
    assert again["findings"] == []
    known = {k["signature"] for k in again["known"]}
    assert known and known <= set(signatures(first))
    assert "known finding met again" in again["stdout"]


def test_the_time_budget_bounds_shrinking(tmp_path: Path) -> None:
    report = fuzz(tmp_path, "--target", "vllm==0.8.5", "--seconds", "8", expect=1)
    assert report["seconds"] < 8 + 2
    assert report["findings"]
    assert 0 <= report["shrink_seconds"] <= report["seconds"]


def test_shrinking_cut_off_in_the_final_replay_is_counted_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Hypothesis shrinks a batch's failure, notes its statistics, then
    replays the shortest example; when the budget ends in that replay, the
    shrinking was counted twice (from the statistics and from the first
    failure): a CI run reported 10.987 s of shrinking in an 8.051 s campaign."""
    def shrunk_then_cut_off(machine: Any, settings: Any) -> None:
        machine.config.stats.failing_since = time.monotonic()
        time.sleep(0.2)  # Hypothesis shrinks
        note_statistics({"shrink-phase": {"duration-seconds": 0.2}})
        raise OutOfTime()  # the final replay's first step is past the deadline

    monkeypatch.setattr(search_module, "run_state_machine_as_test", shrunk_then_cut_off)
    outcome = search_module.search(resolve_target(None), search_module.Budget(seconds=0.5),
                                   search_module.SearchOptions(mistakes=False))
    assert 0.2 <= outcome.shrink_seconds <= outcome.seconds


def test_a_call_that_never_returns_is_a_hang(tmp_path: Path) -> None:
    report = fuzz(tmp_path, "--target", "helpers.oracle_faults:ForkLoopsOnLongChains",
                  "--seconds", "30", "--call-timeout", "0.5", "--no-mistakes", "--stop-at-first",
                  expect=1)
    hangs = [f for f in report["findings"] if f["category"] == "hang"]
    assert hangs and hangs[0]["signature"] == "hang/fork/timeout"
    replayed = run_cli("replay", hangs[0]["trace_file"], "--call-timeout", "0.5", cwd=tmp_path)
    assert replayed.returncode == 1
    assert "# signature: hang/fork/timeout" in replayed.stdout


def test_the_targets_log_is_counted_not_printed(tmp_path: Path) -> None:
    report = fuzz(tmp_path, "--target", "helpers.oracle_faults:Chatty", "--examples", "20",
                  expect=0)
    log = report["target_log"]
    assert log["lines"] > 0
    assert log["kinds"][0]["logger"] == "chatty.allocator"
    assert log["kinds"][0]["message"] == "allocating after %s"
    assert "allocating after" not in report["stdout"].replace("'allocating after %s'", "")


def test_no_mistakes_and_lists_only_pass_no_tuple(tmp_path: Path) -> None:
    target = ("--target", "helpers.oracle_faults:ListsOnly", "--examples", "150", "--no-shrink")
    fuzz(tmp_path, *target, "--no-mistakes", expect=0)
    report = fuzz(tmp_path, *target, expect=1)  # with mistakes, prefixcache passes tuples
    assert "crash/get_common_computed_block_ids/raised-TypeError" in signatures(report)
    # vLLM's rules: no tuple (the other findings are prefixcache.impl's stricter rules)
    report = fuzz(tmp_path, *target, "--semantics", "vllm-0.8.5", expect=1)
    assert not [s for s in signatures(report) if "get_common_computed_block_ids" in s]


def test_a_finding_only_prefixcache_rules_make_names_its_option(tmp_path: Path) -> None:
    target = ("--target", "helpers.oracle_faults:AssertsOnDetachedFree", "--seconds", "60")
    report = fuzz(tmp_path, *target, "--stop-at-first", expect=1)
    (finding,) = [f for f in report["findings"] if f["operation"] == "free"]
    assert finding["explained_by"] == {"options": ["any-mistake-exception"],
                                       "accepted_by": ["vllm-0.8.5"]}
    assert "accepted by --semantics vllm-0.8.5" in " ".join(report["stdout"].split())
    replayed = run_cli("replay", finding["trace_file"], "--semantics", "vllm-0.8.5",
                       cwd=tmp_path)
    assert replayed.returncode == 0, replayed.stdout


TRACE = ('{"format": "prefixcache-trace/1", "num_blocks": 1, "block_size": 1, '
         '"steps": []}')


@pytest.mark.parametrize(("verb", "args", "says"), [
    ("fuzz", ["--hash-algo", "nope"], "--hash-algo must be"),
    ("fuzz", ["--hash-algo", "nowhere:nothing"], "--hash-algo nowhere:nothing"),
    ("fuzz", ["--database", "redis://127.0.0.1:1/0"], "cannot reach the Redis server"),
    ("fuzz", ["--target", "collections:OrderedDict"], "this is not an allocator"),
    ("fuzz", ["--target", "os:path"], "this is not an allocator"),
    ("fuzz", ["--target", "vllm==9.9.9"], "not pinned"),
    ("fuzz", ["--target", IMPL, "--kind", "cpu_gpu"], "cannot be built"),
    ("fuzz", ["--seconds", "-5"], "--seconds must be > 0"),
    ("fuzz", ["--examples", "0"], "--examples must be > 0"),
    ("fuzz", ["--max-findings", "0"], "--max-findings must be >= 1"),
    ("fuzz", ["--call-timeout", "-1"], "--call-timeout must be >= 0"),
    ("fuzz", ["--workers", "0"], "--workers must be >= 1"),
    ("fuzz", ["--baseline", "missing.json"], "cannot read the baseline"),
    ("fuzz", ["--semantics", "nope"], "invalid choice"),
    ("fuzz", ["--seconds", "soon"], "invalid float value"),
    ("replay", ["missing.json"], "cannot read missing.json"),
    ("replay", ["trace.json", "--semantics", "nope"], "invalid choice"),
    ("replay", ["trace.json", "--call-timeout", "-1"], "--call-timeout"),
    ("replay", ["trace.json", "--target", "os:path"], "this is not an allocator"),
    ("bench", ["--target", "collections:OrderedDict"], "this is not an allocator"),
    ("bench", ["--target", "no.such.module:Allocator"], "cannot import"),
    ("bench", ["--against", "nope"], "MODULE:CLASS"),
    ("bench", ["--repeats", "0"], "--repeats must be >= 1"),
    ("bench", ["--soak", "--rounds", "0"], "--rounds must be >= 1"),
    ("bench", ["--soak", "--check-every", "x"], "invalid int value"),
    ("verify", ["--max-seconds", "0"], "timeouts must be > 0"),
])
def test_bad_options_are_one_line_usage_errors(tmp_path: Path, verb: str, args: List[str],
                                               says: str) -> None:
    """Exit code 2 and one line on stderr, never 1 (a finding) or a traceback."""
    (tmp_path / "trace.json").write_text(TRACE)
    budget = ["--examples", "1"] if verb == "fuzz" and not {"--seconds", "--examples"} & set(
        args) else []
    result = run_cli(verb, *budget, *args, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], result.stderr


def test_real_vllm_shows_its_faults_each_replayable(tmp_path: Path) -> None:
    """vLLM 0.8.5 itself, judged by its own semantics on valid calls only: its
    latent faults (the lazy evictor heap, the bisecting prefix search, calls
    that are not all-or-nothing, stale touched ids, ...) are distinct findings."""
    report = fuzz(tmp_path, "--target", "vllm==0.8.5", "--semantics", "vllm-0.8.5",
                  "--no-mistakes", "--seconds", "20", "--max-findings", "5", expect=1)
    assert len(report["findings"]) >= 4, signatures(report)
    for finding in report["findings"]:
        assert finding["explained_by"] is None  # faults under every preset
        replayed = run_cli("replay", finding["trace_file"], cwd=tmp_path)
        assert replayed.returncode == 1
        assert f"# signature: {finding['signature']}" in replayed.stdout


def test_a_device_pair_marks_accesses_of_gpu_sequences_only(tmp_path: Path) -> None:
    """mark_blocks_as_accessed of a device pair goes to its GPU allocator, so
    a valid call names GPU ids only: with --no-mistakes the machine never
    marks a sequence swapped to the CPU (it used to, and the campaign ended
    in an OracleError after a few dozen examples of this seed)."""
    report = fuzz(tmp_path, "--target", "prefixcache.impl.cpu_gpu_block_allocator:"
                  "CpuGpuBlockAllocator", "--no-mistakes", "--examples", "50", "--seed", "0",
                  expect=0)
    assert report["findings"] == [] and report["examples"] >= 50
