"""``prefixcache verify``: CrossHair finds the planted bug and passes the real modules.

The CrossHair runs are bounded (well under a minute on two cores): the
planted bisection bug falls in the first few paths, and the real modules get
a short per-condition timeout, enough to explore every function at least a
little without the full CI budget.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from prefixcache.cli import main
from prefixcache.oracle import verify as V

TESTS = Path(__file__).resolve().parent


def test_the_planted_bisection_is_refuted(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["verify", "--path", str(TESTS), "--per-condition-timeout", "5",
                 "--max-seconds", "50", "helpers.crosshair_planted"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "helpers.crosshair_planted.bisect_ready_prefix: COUNTEREXAMPLE" in out
    assert "when calling bisect_ready_prefix(" in out
    assert "the longest prefix of ready keys" in out


def test_the_real_modules_have_no_counterexample() -> None:
    functions = V.discover(V.DEFAULT_TARGETS)
    names = {f.target.rsplit(".", 1)[1] for f in functions}
    assert {"chain_key", "longest_ready_prefix", "victim", "fold_hit_rate",
            "spec_steps_keep_invariants", "model_prefix_search_agrees"} <= names
    options = V.Options(per_condition_timeout=0.5, max_uninteresting_iterations=None)
    outcomes = V.check_all(functions, options, max_seconds=150, jobs=2, report=[])
    for outcome in outcomes:
        assert outcome.status in (V.CONFIRMED, V.BOUNDED), V.describe(outcome)
        assert sum(outcome.iterations) > 0, V.describe(outcome)


def test_list_names_every_function_and_postcondition(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "--list"]) == 0
    out = capsys.readouterr().out
    assert "prefixcache.spec.pure.longest_ready_prefix" in out
    assert "prefixcache.model.pure_model.model_eviction_agrees" in out
    assert "ensures: the victim is the entry minimal under" in out


@pytest.mark.parametrize("argv", [
    ["verify", "no_such_module_for_verify"],
    ["verify", "prefixcache.spec.state"],           # imports, but nothing to check
    ["verify", "--per-condition-timeout", "0"],
    ["verify", "--jobs", "0"],
])
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "prefixcache verify:" in capsys.readouterr().err


FUNCTION = V.Contracted("m.f", 3, (), ("holds",))


def test_parse_reads_a_counterexample() -> None:
    out = "/x/m.py:3: error: false when calling f(1) (which returns 2)\n"
    err = "... Aborted calltree search with REFUTED and 1 messages. Number of iterations:  4\n"
    outcome = V.parse(FUNCTION, 1, out, err, 1.0)
    assert outcome.status == V.COUNTEREXAMPLE and outcome.failed
    assert outcome.iterations == [4]
    assert "when calling f(1)" in outcome.messages[0]


def test_parse_tells_bounded_confirmed_unexplored_and_cut_short() -> None:
    bounded = V.parse(FUNCTION, 0, "/x/m.py:3: info: Not confirmed.\n", "", 1.0)
    assert bounded.status == V.BOUNDED and not bounded.failed
    confirmed = V.parse(FUNCTION, 0, "/x/m.py:3: info: Confirmed over all paths.\n", "", 1.0)
    assert confirmed.status == V.CONFIRMED
    vacuous = V.parse(FUNCTION, 0, "/x/m.py:3: info: Unable to meet precondition.\n", "", 1.0)
    assert vacuous.status == V.UNEXPLORED and vacuous.failed
    silent = V.parse(FUNCTION, 0, "", "", 1.0)
    assert silent.status == V.UNEXPLORED
    cut = V.parse(FUNCTION, None, "", "", 1.0)
    assert cut.status == V.NOT_REACHED and not cut.failed
    crashed = V.parse(FUNCTION, 2, "", "Traceback...\nValueError: boom\n", 1.0)
    assert crashed.status == V.ERROR and "ValueError: boom" in crashed.messages[0]


def test_the_command_names_the_target_by_module_and_bounds_it() -> None:
    cmd = V.crosshair_command("prefixcache.spec.pure.victim", V.Options(2, 50))
    assert cmd[1:4] == ["-m", "crosshair", "check"]
    assert "--analysis_kind=icontract" in cmd
    assert "--per_condition_timeout=2" in cmd
    assert "--max_uninteresting_iterations=50" in cmd
    assert cmd[-1] == "prefixcache.spec.pure.victim"
    env = V.child_env([str(TESTS)])
    assert env["PREFIXCACHE_EXPLORE"] == "1" and env["PREFIXCACHE_CONTRACTS"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(TESTS)


def test_without_crosshair_it_names_the_extra_and_exits_2(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(V, "crosshair_version", lambda: None)
    assert main(["verify", "--list"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "prefixcache[verify]" in err
