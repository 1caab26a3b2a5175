"""The whole suite passes under ``python -O`` too: the strict checks of
prefixcache.impl raise real exceptions and do not rely on ``assert``.

Runs every other test module of tests/ in a subprocess with asserts
stripped (pytest still rewrites the asserts of the test modules themselves,
and tests/impl_snapshot.py raises AssertionError explicitly).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def test_python_dash_o_strips_asserts_in_the_child() -> None:
    # the flag really reaches a child interpreter started this way
    done = subprocess.run(
        [sys.executable, "-O", "-c", "import sys; assert False; print(sys.flags.optimize)"],
        capture_output=True, text=True, timeout=60, check=True,
    )
    assert done.stdout.strip() == "1"


def test_whole_suite_passes_under_python_dash_o() -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT_TEST", "PYTEST_ADDOPTS"))}
    cmd = [
        sys.executable, "-O", "-m", "pytest", str(TESTS),
        "--ignore", str(Path(__file__).resolve()),
        "-p", "no:cacheprovider", "-rfE", "--no-header",
    ]
    if importlib.util.find_spec("xdist") is not None:
        cmd += ["-n", "2"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1800)
    tail = "\n".join((done.stdout + done.stderr).splitlines()[-80:])
    assert done.returncode == 0, tail
    lines = done.stdout.strip().splitlines()
    summary = lines[-1] if lines else ""
    assert " passed" in summary and "failed" not in summary and "error" not in summary, tail
