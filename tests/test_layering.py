"""The package's imports point one way: impl <- spec <- model <- oracle <- the
CLI, with the bench beside the oracle and using it; no cycle (imports inside
functions and under TYPE_CHECKING included) and no import of another
module's private names (tests/helpers/import_graph.py, which CI also runs)."""

from __future__ import annotations

import subprocess
import sys

from helpers import import_graph as G


def test_no_import_cycle() -> None:
    assert G.cycles(G.graph()) == []


def test_imports_point_one_way() -> None:
    assert G.upward(G.graph()) == []


def test_no_module_imports_another_modules_private_names() -> None:
    assert G.private_imports() == []


def test_a_cycle_is_found() -> None:
    edges = {"prefixcache.oracle.a": {"prefixcache.oracle.b"},
             "prefixcache.oracle.b": {"prefixcache.oracle.a"}}
    assert G.cycles(edges) == [["prefixcache.oracle.a", "prefixcache.oracle.b",
                                "prefixcache.oracle.a"]]
    assert G.upward({"prefixcache.spec.x": {"prefixcache.oracle.y"},
                     "prefixcache.oracle.y": set()}) == [
        "prefixcache.spec.x -> prefixcache.oracle.y"]


def test_the_script_prints_no_cycle() -> None:
    out = subprocess.run([sys.executable, G.__file__], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout
    assert "import cycles: 0" in out.stdout.splitlines()
