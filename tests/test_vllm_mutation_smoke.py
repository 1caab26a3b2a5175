"""A smoke of the mutation campaign over real vLLM 0.8.5 (issue #20, point 5)
for CI: ``bench/vllm_mutation.py --smoke`` generates the mutants of the
repaired vLLM files with mutmut's engine, judges a few of them with a short
oracle budget and a part of vLLM's block tests, and renders the report.  It
proves the plumbing (mutants as edits on the repaired tree, both judges, the
results file, the report) and that the oracle kills a mutant it should; the
whole campaign takes too long for CI.  Needs vLLM 0.8.5's wheel and source
archive (fetched once into the cache, see prefixcache.oracle.vllm_source)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prefixcache.bench import vllm_mutation

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "vllm_mutation.py"


@pytest.mark.skipif(not __debug__, reason="run once, not again under python -O")
def test_the_smoke_kills_a_known_mutant_and_renders_the_report(tmp_path: Path) -> None:
    results, report = tmp_path / "results.json", tmp_path / "report.md"
    run = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--jobs", "2",
                          "--results", str(results), "--output", str(report)],
                         capture_output=True, text=True, timeout=600)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    data = json.loads(results.read_text(encoding="utf-8"))
    assert set(data["mutants"]) == set(vllm_mutation.SMOKE_MUTANTS)
    killable = data["mutants"][vllm_mutation.SMOKE_KILLABLE]
    assert killable["oracle"]["status"] != "survived", killable
    assert killable["diff"].count("\n-") >= 1
    text = report.read_text(encoding="utf-8")
    assert "**The oracle alone**" in text and "Wilson" in text
    assert "python bench/vllm_mutation.py --smoke" in text
