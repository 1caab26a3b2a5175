"""``prefixcache fuzz --api v1`` and ``prefixcache replay`` of its traces, the
v1 driver's verdicts, and a few variants of the v1 fault corpus."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import unittest
from pathlib import Path
from typing import Any, Dict, List

import pytest
from helpers.v1_faults import CachedFreedToFront
from helpers.v1_releases import TESTED_RELEASES

from prefixcache.bench.v1_corpus import VARIANTS, judge
from prefixcache.oracle.conformance import conformance_test
from prefixcache.oracle.mistakes import OracleError
from prefixcache.oracle.replay import replay
from prefixcache.oracle.trace import Step, Trace, render
from prefixcache.oracle.v1_driver import V1Driver
from prefixcache.oracle.v1_machine import V1_MISTAKE_ROWS, make_v1_machine
from prefixcache.oracle.v1_targets import V1_KIND, resolve_v1_target
from prefixcache.oracle.violations import Violation
from prefixcache.oracle.vllm_v1_source import V1_DEFAULT, load_v1
from prefixcache.spec.v1_error_table import V1_ERROR_TABLE
from prefixcache.spec.v1_semantics import V1_PRESETS

TESTS = Path(__file__).resolve().parent


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(TESTS))
    return subprocess.run([sys.executable, "-m", "prefixcache.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


# -- the CI smoke test ---------------------------------------------------------------

@pytest.mark.parametrize("version", TESTED_RELEASES)
def test_a_short_v1_campaign_on_the_real_pool_is_clean(tmp_path: Path, version: str) -> None:
    """The CI smoke test: 60 seeded examples of valid calls on a pinned release's
    pool (before 0.34.0 free_blocks takes no evict_first, and is never asked for it).
    A budget of examples, not of seconds, so that what it covers does not depend on
    how busy the machine is."""
    target = f"vllm=={version}"
    args = ["--target", target] if version != V1_DEFAULT else []
    result = run_cli("fuzz", "--api", "v1", *args, "--no-mistakes", "--examples", "60",
                     "--seed", "0", "--quiet", "--json", "report.json", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["api"] == "v1" and report["target"] == target
    assert report["findings"] == []
    for op in ("get_new_blocks", "cache_full_blocks", "get_cached_block", "touch",
               "free_blocks", "evict_blocks"):
        assert report["coverage"][f"op:{op}"] > 0, op
    if version != V1_DEFAULT:
        assert "transition:evict-first" not in report["coverage"]
    assert f"api=v1 target={target}" in result.stdout and "no new finding" in result.stdout


# -- usage errors -------------------------------------------------------------------------

@pytest.mark.parametrize("args,says", [
    (["--api", "v2"], "invalid choice"),
    (["--api", "v1", "--semantics", "vllm-0.8.5"], "not a preset of --api v1"),
    (["--semantics", "vllm-0.34.0"], "not a preset of --api v0"),
    (["--api", "v1", "--kind", "naive"], "cannot be used with --api v1"),
    (["--api", "v1", "--relaxed"], "cannot be used with --api v1"),
    (["--api", "v1", "--hash-algo", "sha256"], "cannot be used with --api v1"),
    (["--api", "v1", "--target", "collections:OrderedDict"], "not a block pool"),
    (["--api", "v1", "--target", "os:path"], "not a block pool"),
    (["--api", "v1", "--target", "vllm==0.1.0"], "not pinned"),
    (["--api", "v1", "--target", "vllm==0.34.0:Evictor"], "judges BlockPool"),
    (["--api", "v1", "--seconds", "-5"], "--seconds must be > 0"),
])
def test_a_bad_v1_option_is_one_line_and_exit_2(tmp_path: Path, args: List[str],
                                                says: str) -> None:
    result = run_cli("fuzz", *args, "--quiet", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert result.stdout == ""


# -- findings, replay and the baseline ------------------------------------------------------

def test_a_fault_exits_1_replays_and_a_baseline_knows_it(tmp_path: Path) -> None:
    result = run_cli("fuzz", "--api", "v1", "--no-mistakes", "--seconds", "30",
                     "--stop-at-first", "--quiet", "--target",
                     "helpers.v1_faults:CachedFreedToFront", "--json", "report.json",
                     cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    [finding] = report["findings"]
    assert finding["signature"] == "conformance/free_blocks/state:free_queue"
    assert finding["shrunk"] and "a = BlockPool(num_gpu_blocks=" in finding["program"]
    replayed = run_cli("replay", finding["trace_file"], cwd=tmp_path)
    assert replayed.returncode == 1, replayed.stdout + replayed.stderr
    assert f"# signature: {finding['signature']}" in replayed.stdout
    fixed = run_cli("replay", finding["trace_file"], "--target", "vllm==0.34.0", cwd=tmp_path)
    assert fixed.returncode == 0 and "agree with the model" in fixed.stdout, fixed.stdout
    again = run_cli("fuzz", "--api", "v1", "--no-mistakes", "--seconds", "5", "--quiet",
                    "--target", "helpers.v1_faults:CachedFreedToFront",
                    "--baseline", "report.json", "--json", "again.json", cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    known = json.loads((tmp_path / "again.json").read_text())["known"]
    assert [k["signature"] for k in known] == [finding["signature"]]



def test_two_workers_find_a_fault_and_report_it_once(tmp_path: Path) -> None:
    """``--workers 2``: both workers search the pool, and a fault both may meet
    is one finding, shrunk, in one report."""
    result = run_cli("fuzz", "--api", "v1", "--no-mistakes", "--workers", "2", "--seconds",
                     "12", "--quiet", "--target", "helpers.v1_faults:CachedFreedToFront",
                     "--json", "report.json", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["workers"] == 2, report.get("workers")
    signatures = [f["signature"] for f in report["findings"]]
    assert "conformance/free_blocks/state:free_queue" in signatures
    assert len(signatures) == len(set(signatures)), signatures
    assert all(f["shrunk"] for f in report["findings"])

# -- the driver's verdicts on hand-made traces ------------------------------------------------

def _trace(steps: List[Dict[str, Any]], num_blocks: int = 4, size: int = 2,
           version: str = V1_DEFAULT) -> Trace:
    return Trace(num_blocks=num_blocks, block_size=size, kind=V1_KIND, target=f"vllm=={version}",
                 steps=[Step(op=s["op"], args={k: v for k, v in s.items() if k != "op"})
                        for s in steps])


CHAIN = [[0, 1]]


def _silent_mistake(row: str) -> List[Dict[str, Any]]:
    """A short program that ends in the mistake of ``row`` (a silent row of 0.34.0)."""
    cache = dict(op="cache_full_blocks", tokens=CHAIN, salt=None, blocks=[1],
                 num_cached_blocks=0, num_full_blocks=1, block_size=2, kv_cache_group_id=0)
    return {
        "get_new_blocks:negative": [dict(op="get_new_blocks", num_blocks=-1)],
        "free_blocks:unreferenced": [dict(op="free_blocks", ordered_blocks=[2])],
        "free_blocks:repeated": [dict(op="get_new_blocks", num_blocks=1),
                                 dict(op="free_blocks", ordered_blocks=[1, 1])],
        "touch:not-cached-free": [dict(op="touch", blocks=[3])],
        "cache_full_blocks:unreferenced": [cache],
        "evict_blocks:negative-id": [dict(op="evict_blocks", block_ids=[-1])],
        "get_cached_block:no-groups": [dict(op="get_cached_block", tokens=CHAIN, salt=None,
                                            kv_cache_group_ids=[])],
    }[row]


@pytest.mark.parametrize("row", [r for r in V1_ERROR_TABLE if r.silent], ids=lambda r: r.key)
@pytest.mark.parametrize("semantics", sorted(V1_PRESETS))
def test_every_mistake_the_pool_accepts_silently_is_reported(row: Any, semantics: str) -> None:
    steps = _silent_mistake(row.key)
    trace = _trace(steps)
    result = replay(trace, semantics=V1_PRESETS[semantics])
    assert result.violation is not None and result.steps_run == len(steps) - 1
    assert result.violation.signature == f"robustness/{row.operation}/no-ValueError:{row.tag}"
    assert render(result.violation.trace).endswith(f"  # row: {row.key}")


def test_every_mistake_row_has_a_provoker() -> None:
    assert set(V1_MISTAKE_ROWS) == {r.key for r in V1_ERROR_TABLE} - {"get_new_blocks:too-many"}
    machine = make_v1_machine(resolve_v1_target())()
    machine.driver = V1Driver(machine.config.target, 4, 1)
    assert set(machine._provokers()) == set(V1_MISTAKE_ROWS)


def test_a_refusal_that_changes_the_state_is_reported_under_both_presets() -> None:
    """0.34.0 caches the first block, then fails on the second's missing hash."""
    steps = [dict(op="get_new_blocks", num_blocks=2),
             dict(op="cache_full_blocks", tokens=CHAIN, salt=None, blocks=[1, 2],
                  num_cached_blocks=0, num_full_blocks=2, block_size=2, kv_cache_group_id=0)]
    strict = replay(_trace([dict(s) for s in steps]), semantics=V1_PRESETS["prefixcache"])
    assert strict.violation is not None
    assert strict.violation.signature == \
        "robustness/cache_full_blocks/not-ValueError:too-few-hashes"
    loose = replay(_trace([dict(s) for s in steps]), semantics=V1_PRESETS["vllm-0.34.0"])
    assert loose.violation is not None
    assert loose.violation.signature == "robustness/cache_full_blocks/changed:cached"


@pytest.mark.parametrize("version", TESTED_RELEASES)
def test_valid_calls_on_the_real_pool_agree_and_render(version: str) -> None:
    steps = [dict(op="get_new_blocks", num_blocks=2),
             dict(op="cache_full_blocks", tokens=[[0, 1], [1, 1]], salt="a", blocks=[1, 2],
                  num_cached_blocks=0, num_full_blocks=2, block_size=2, kv_cache_group_id=1),
             dict(op="free_blocks", ordered_blocks=[2, 1, 0], evict_first=False),
             dict(op="get_cached_block", tokens=[[0, 1], [1, 1]], salt="a",
                  kv_cache_group_ids=[1]),
             dict(op="touch", blocks=[2]),
             dict(op="get_new_blocks", num_blocks=3),
             dict(op="reset_prefix_cache"), dict(op="get_usage")]
    trace = _trace(steps, version=version)
    assert replay(trace).violation is None
    program = render(trace)
    assert "a.free_blocks(ordered_blocks=[a.blocks[2], a.blocks[1], a.blocks[0]]" in program
    assert "block_hash=hash_of(request(tokens=[[0, 1], [1, 1]], salt='a'))" in program


def test_a_pool_without_evict_first_is_never_asked_for_it() -> None:
    """0.33.0's free_blocks takes no evict_first: the machine frees without
    it, and a trace that asks for it names the reason instead of a crash."""
    driver = V1Driver(resolve_v1_target("vllm==0.33.0"), 3, 1)
    assert driver.white and not driver.evict_first
    assert V1Driver(resolve_v1_target(), 3, 1).evict_first
    driver.run(Step(op="get_new_blocks", args={"num_blocks": 2}))
    driver.run(Step(op="free_blocks", args={"ordered_blocks": [1], "evict_first": False}))
    with pytest.raises(KeyError, match="evict_first"):
        driver.run(Step(op="free_blocks", args={"ordered_blocks": [2], "evict_first": True}))
    machine = make_v1_machine(resolve_v1_target("vllm==0.33.0"))()
    machine.driver = driver
    assert machine.free_args([2], True) == {"ordered_blocks": [2]}


def test_mistakes_off_promises_valid_calls() -> None:
    driver = V1Driver(resolve_v1_target(), 3, 1, mistakes=False)
    with pytest.raises(OracleError):
        driver.run(Step(op="touch", args={"blocks": [1]}))


def test_a_black_box_pool_is_judged_by_its_answers() -> None:
    clean = V1Driver(resolve_v1_target("helpers.v1_faults:BlackBox"), 4, 1)
    assert not clean.white
    faulty = V1Driver(resolve_v1_target("helpers.v1_faults:BlackBoxPopleftLostDecrement"), 4,
                      1)
    assert not faulty.white
    clean.run(Step(op="get_new_blocks", args={"num_blocks": 2}))
    clean.run(Step(op="free_blocks", args={"ordered_blocks": [1, 2]}))
    with pytest.raises(Violation) as caught:
        faulty.run(Step(op="get_new_blocks", args={"num_blocks": 2}))
    assert caught.value.signature == "conformance/get_new_blocks/free-count"


# -- the fault corpus -----------------------------------------------------------------------

def test_every_corpus_edit_applies_and_changes_the_source() -> None:
    assert len(VARIANTS) >= 15 and len({v.name for v in VARIANTS}) == len(VARIANTS)
    for variant in VARIANTS:
        assert load_v1(edits=variant.as_edits()).BlockPool is not load_v1().BlockPool


@pytest.mark.parametrize("name", ["free-lost-decrement", "duplicate-lookup-last",
                                  "remove-breaks-back-link"])
def test_the_oracle_catches_a_corpus_variant(name: str) -> None:
    variant = next(v for v in VARIANTS if v.name == name)
    verdict = judge(variant.name, variant.fault, variant.as_edits(), seconds=30)
    assert verdict.signature is not None, f"{name} not caught in 30 s"


def test_a_refused_call_that_changes_nothing_is_not_reported() -> None:
    """0.34.0 asserts on a block cached over as many tokens before changing
    anything: accepted under vllm-0.34.0 (the hashes the refused request
    carried are the caller's knowledge, not a change of the pool)."""
    steps = [dict(op="get_new_blocks", num_blocks=1),
             dict(op="cache_full_blocks", tokens=CHAIN, salt=None, blocks=[1],
                  num_cached_blocks=0, num_full_blocks=1, block_size=2, kv_cache_group_id=0),
             dict(op="cache_full_blocks", tokens=[[2, 2]], salt=None, blocks=[1],
                  num_cached_blocks=0, num_full_blocks=1, block_size=2, kv_cache_group_id=0)]
    assert replay(_trace(steps), semantics=V1_PRESETS["vllm-0.34.0"]).violation is None
    strict = replay(_trace(steps), semantics=V1_PRESETS["prefixcache"]).violation
    assert strict is not None
    assert strict.signature == "robustness/cache_full_blocks/not-ValueError:already-cached"


# -- conformance_test(api="v1") ------------------------------------------------------------------

def _run_case(case: type) -> Any:
    result = unittest.TestResult()
    unittest.defaultTestLoader.loadTestsFromTestCase(case).run(result)
    return result


def test_conformance_test_judges_a_v1_pool() -> None:
    """The pytest entry point with ``api="v1"``: vLLM 0.34.0's pool passes
    on valid calls; a pool with a planted fault fails, naming the state it
    got wrong."""
    clean = _run_case(conformance_test(api="v1", mistakes=False, profile="dev"))
    assert clean.wasSuccessful(), clean.failures + clean.errors
    faulty = _run_case(conformance_test(CachedFreedToFront, api="v1", mistakes=False,
                                        profile="dev"))
    [(_, report)] = faulty.failures + faulty.errors
    assert "free_queue" in report, report[-2000:]


@pytest.mark.parametrize("options,says", [
    (dict(api="v2"), "api must be 'v0' or 'v1'"),
    (dict(api="v1", semantics="vllm-0.8.5"), "not a preset of api 'v1'"),
    (dict(semantics="vllm-0.34.0"), "not a preset of api 'v0'"),
    (dict(api="v1", kind="naive"), "concern v0 allocators"),
    (dict(api="v1", strict=False), "concern v0 allocators"),
])
def test_conformance_test_refuses_options_of_the_other_api(options: Dict[str, Any],
                                                           says: str) -> None:
    with pytest.raises(ValueError, match=says):
        conformance_test(**options)
