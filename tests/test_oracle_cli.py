"""``prefixcache fuzz`` and ``prefixcache replay`` end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.oracle_faults import FreesToTheRight

from prefixcache.cli import main
from prefixcache.oracle.replay import replay
from prefixcache.oracle.targets import resolve_target
from prefixcache.oracle.trace import Step, Trace, render

TESTS = Path(__file__).resolve().parent


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(TESTS))
    return subprocess.run([sys.executable, "-m", "prefixcache.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_an_exception_of_prefixcache_exits_3_not_as_a_finding() -> None:
    """Python exits 1 on an uncaught exception, which is a finding's code: a
    job would read a crash of the checker as a fault of its allocator."""
    code = ("import prefixcache.cli as cli\n"
            "def broken(argv=None):\n"
            "    raise RuntimeError('the checker broke')\n"
            "cli.main = broken\n"
            "cli.entry()\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "RuntimeError: the checker broke" in result.stderr  # the traceback
    assert "internal error (exit code 3)" in result.stderr and "not a finding" in result.stderr


def test_help_lists_every_verb(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for verb in ("fuzz", "replay", "verify", "bench"):
        assert verb in out


def test_clean_campaign_exits_0_with_a_json_report(tmp_path: Path) -> None:
    result = run_cli("fuzz", "--examples", "30", "--quiet", "--json", "report.json",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert set(report) >= {"steps", "examples", "steps_per_second", "coverage", "findings",
                           "known", "shrink_seconds", "target_log", "semantics"}
    assert report["findings"] == []
    # the campaign counts every example it ran; Hypothesis runs a few that it
    # abandons (too long, or rejected) and does not count toward --examples
    assert 30 <= report["examples"] <= 36
    assert report["steps"] > 30
    assert report["coverage"]["op:allocate_immutable_block"] > 0
    assert "no new finding" in result.stdout


def test_unknown_target_is_a_usage_error(tmp_path: Path) -> None:
    result = run_cli("fuzz", "--examples", "1", "--target", "no_such_module:X", cwd=tmp_path)
    assert result.returncode == 2
    assert "cannot import" in result.stderr


def test_a_fault_exits_1_and_each_finding_replays_to_its_signature(tmp_path: Path) -> None:
    result = run_cli("fuzz", "--examples", "200", "--quiet", "--seed", "1",
                     "--target", "helpers.oracle_faults:FreesToTheRight", "--json", "report.json",
                     cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    findings = report["findings"]
    assert findings and {f["category"] for f in findings} == {"conformance"}
    assert len({f["signature"] for f in findings}) == len(findings)
    assert "a = make_allocator(" in result.stdout  # the shrunk programs are printed
    for finding in findings:
        assert finding["trace"]["steps"] and finding["shrunk"]
        trace_file = finding["trace_file"]
        assert Path(tmp_path, trace_file).is_file()
        replayed = run_cli("replay", trace_file, cwd=tmp_path)
        assert replayed.returncode == 1, replayed.stdout + replayed.stderr
        assert "target and model part at step" in replayed.stdout
        assert f"# signature: {finding['signature']}" in replayed.stdout
        fixed = run_cli("replay", trace_file, "--target",
                        "prefixcache.impl.prefix_caching_block:PrefixCachingBlockAllocator",
                        cwd=tmp_path)
        assert fixed.returncode == 0, fixed.stdout
        assert "agree with the model" in fixed.stdout


def test_a_replayed_step_without_names_gets_a_fresh_one() -> None:
    """A trace's last step may carry no output names (it crashed the target
    it was found on); replayed against another target, its Block gets a
    name of its own, not the name of a freed Block of the trace (which
    left the new Block unowned: an ownership_matches violation)."""
    trace = Trace(num_blocks=1, block_size=1, steps=[
        Step("allocate_immutable_block", {"prev_block": None, "token_ids": [0]}, out=["b0"]),
        Step("free", {"block": "b0"}),
        Step("allocate_mutable_block", {"prev_block": None}),
    ])
    result = replay(trace)
    assert result.violation is None and result.steps_run == 3


def test_replay_of_a_hand_written_trace_is_deterministic() -> None:
    trace = Trace(num_blocks=4, block_size=2, steps=[
        Step("allocate_immutable_block", {"prev_block": None, "token_ids": [1, 2]}),
        Step("allocate_immutable_block", {"prev_block": None, "token_ids": [1, 2]}),
        Step("allocate_mutable_block", {"prev_block": None}),
        Step("free", {"block": "b0"}),
        Step("free", {"block": "b2"}),
        Step("allocate_mutable_block", {"prev_block": None}),
        Step("get_prefix_cache_hit_rate", {}),
    ])
    for _ in range(2):
        lines: list[str] = []
        result = replay(Trace.from_json(trace.to_json()), echo=lines)
        assert result.violation is None
        assert len(lines) == len(trace.steps)
    bad = replay(trace, resolve_target(FreesToTheRight))
    assert bad.violation is not None and bad.violation.category == "conformance"
    assert bad.steps_run == 4  # white-box: the free list order parts at the free itself
    assert "a.free(block=b0)" in render(trace)
