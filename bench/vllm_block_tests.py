"""vLLM 0.8.5's own block unit tests, run against prefixcache.impl or against a
vLLM source tree.

    python bench/vllm_block_tests.py                       # against prefixcache.impl
    python bench/vllm_block_tests.py --against vllm        # against vLLM's own code
    python bench/vllm_block_tests.py --against DIR -- -x   # a source tree; pytest args after --

The tests (``tests/core/block/*.py`` of vLLM's source archive, without
``e2e/``, which needs GPUs and models: 910 tests) are fetched at run time by
:mod:`prefixcache.oracle.vllm_source`, never kept in this repository.  Each
run is a pytest subprocess whose ``vllm`` package is a scratch *run
directory*, first on ``sys.path``:

* ``against="vllm"`` or a directory ``D`` from
  :func:`prefixcache.oracle.vllm_source.source_tree` (vLLM's code, or an edited
  copy, as a mutation study makes): ``D/vllm``;
* ``against="prefixcache"``: the unedited tree, in which
  ``vllm.core.block.{interfaces,common,naive_block,prefix_caching_block,
  cpu_gpu_block_allocator}`` and ``vllm.core.evictor`` are aliases of
  prefixcache.impl's modules (each module file replaces itself in
  ``sys.modules`` with prefixcache's, so ``isinstance`` and
  ``pytest.raises(BlockAllocator.NoFreeBlocksError)`` see prefixcache's
  classes) and ``vllm.utils.Device`` is prefixcache's.  What prefixcache.impl
  does not provide stays vLLM's code, running on prefixcache's allocators:
  ``vllm/core/block/block_table.py`` and ``utils.py`` (from the wheel),
  ``vllm/core/block_manager.py`` and ``vllm/core/interfaces.py`` (from the
  source archive).

In both, the modules the tests need beyond the block code (``vllm.sequence``,
``vllm.inputs``, ``vllm.lora.request``, ``vllm.SamplingParams``,
``vllm.core.scheduler``) are prefixcache's stand-ins, bench/vllm_standins/
(see its README), copied over the tree; ``block_manager.py`` and
``core/interfaces.py`` come from the source archive unless the tree has its own.

The extraction from the source archive is done once and cached (below
``vllm_source.cache_dir()/block-tests/``), as is the run directory of
``"prefixcache"``; a tree's run directory is a copy of a few files made per
call and removed after it.  A call costs pytest's start and the tests
(about 25 s on one core).  Results come from pytest's JUnit XML report.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

from prefixcache.oracle import vllm_source

#: Bump when the extraction or the run directory's layout changes (a new cache key).
SUITE_VERSION = 1
#: The stand-in modules, laid out as inside the ``vllm`` package.
STANDINS = Path(__file__).resolve().parent / "vllm_standins" / "vllm"
#: The tests run by default, relative to the extracted tests' root.
TEST_DIR = "tests/core/block"

#: The modules of the run directory's ``vllm`` package that are prefixcache.impl's
#: (``against="prefixcache"``), by path inside the package.
ALIASES: Dict[str, str] = {
    "core/block/interfaces.py": "prefixcache.impl.interfaces",
    "core/block/common.py": "prefixcache.impl.common",
    "core/block/naive_block.py": "prefixcache.impl.naive_block",
    "core/block/prefix_caching_block.py": "prefixcache.impl.prefix_caching_block",
    "core/block/cpu_gpu_block_allocator.py": "prefixcache.impl.cpu_gpu_block_allocator",
    "core/evictor.py": "prefixcache.impl.evictor",
}

_ALIAS_MODULE = '''\
"""Alias written by prefixcache's bench/vllm_block_tests.py: this module is
{target}, so that vLLM's tests of vllm.{name} run on prefixcache's code."""

import sys

import {target}

sys.modules[__name__] = {target}
'''

_DEVICE_ALIAS = '''

# prefixcache (bench/vllm_block_tests.py): the tests and vLLM's block table use
# prefixcache's Device.
from prefixcache.impl.interfaces import Device  # noqa: E402,F811
'''

#: Files of the source archive (below ``vllm-<version>/``) the suite needs; every
#: ``tests/core/block/*.py`` is taken as well.
_SDIST_FILES = (
    "tests/__init__.py",
    "tests/core/__init__.py",
    "tests/core/conftest.py",
    "tests/core/utils.py",
    "tests/core/block/__init__.py",
    "vllm/core/block_manager.py",
    "vllm/core/interfaces.py",
)
#: Files of the ``vllm`` package a run directory takes from the source archive
#: when the tree has none (they are not in the wheel's block code), and where
#: the extraction keeps them (not in a ``vllm`` directory beside ``tests``).
_FROM_SDIST = ("core/block_manager.py", "core/interfaces.py")
_SDIST_VLLM = "vllm-files"
#: Files a tree must have to be tested.
_TREE_FILES = ("__init__.py", "utils.py", "sequence.py", "core/__init__.py",
               "core/block/block_table.py", "core/block/prefix_caching_block.py",
               "core/evictor.py")

_PYTEST_INI = """\
# Written by prefixcache's bench/vllm_block_tests.py: vLLM's block tests run
# here, with this file as their configuration (not vLLM's or prefixcache's).
[pytest]
"""

#: The subprocess: the run directory first on sys.path, a check that ``vllm`` is
#: the run directory's, then pytest.
_RUNNER = """\
import sys
from pathlib import Path
run = Path(sys.argv[1]).resolve()
sys.path.insert(0, str(run))
import vllm
where = Path(vllm.__file__).resolve().parent
if where != run / "vllm":
    sys.exit(f"vllm was imported from {where}, not from the run directory {run}")
import pytest
sys.exit(pytest.main(sys.argv[2:]))
"""

#: Inherited environment variables that would change the inner pytest run.
_DROPPED_ENV = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTHONOPTIMIZE", "PYTHONPATH")


class BlockTestsError(RuntimeError):
    """The suite could not be set up or run (no report came back); the
    message says why."""


@dataclass(frozen=True)
class SuiteResult:
    """The outcome of one run of the suite.  ``failures`` holds the node ids
    (``tests/core/block/test_x.py::Class::test[params]``) of the tests that
    failed or errored, in the report's order; ``returncode`` is pytest's
    (None when the run timed out, and then the counts are all 0)."""

    against: str
    passed: int
    failed: int
    errors: int
    skipped: int
    failures: Tuple[str, ...]
    seconds: float
    returncode: Optional[int]
    timed_out: bool
    output: str

    @property
    def collected(self) -> int:
        """How many tests the report holds."""
        return self.passed + self.failed + self.errors + self.skipped

    @property
    def ok(self) -> bool:
        """Every test ran and passed: none failed, errored or was skipped, and
        pytest exited with 0."""
        return (not self.timed_out and self.returncode == 0 and self.passed > 0
                and self.failed == self.errors == self.skipped == 0)

    def summary(self) -> str:
        """One line: the counts and the time."""
        if self.timed_out:
            return f"against {self.against}: timed out after {self.seconds:.1f} s"
        return (f"against {self.against}: {self.passed} passed, {self.failed} failed, "
                f"{self.errors} errors, {self.skipped} skipped in {self.seconds:.1f} s")


# -- the extraction and the run directories --------------------------------------------

def _digest(paths: Sequence[Tuple[str, bytes]]) -> str:
    digest = hashlib.sha256()
    for name, data in sorted(paths):
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def _extract_sdist(version: str, into: Path) -> None:
    """The suite's files of the source archive, below ``into``."""
    source = vllm_source.sdist(version)
    prefix = f"vllm-{version}/"
    found = set()
    try:
        with tarfile.open(source, "r:gz") as archive:
            for member in archive:
                relative = member.name[len(prefix):] if member.name.startswith(prefix) else ""
                head, _, tail = relative.rpartition("/")
                if not member.isfile() or not (relative in _SDIST_FILES or (
                        head == TEST_DIR and tail.endswith(".py"))):
                    continue
                handle = archive.extractfile(member)
                if handle is None:
                    continue
                dest = into / (_SDIST_VLLM + relative[len("vllm"):]
                               if relative.startswith("vllm/") else relative)
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(handle.read())
                found.add(relative)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise BlockTestsError(f"cannot read {source}: {exc}; delete it and retry") from exc
    missing = sorted(set(_SDIST_FILES) - found)
    if missing or not any(name.startswith(f"{TEST_DIR}/test_") for name in found):
        raise BlockTestsError(f"{source} lacks {', '.join(missing) or TEST_DIR + '/test_*.py'}")
    (into / "pytest.ini").write_text(_PYTEST_INI, encoding="utf-8")


def tests_root(version: str = "0.8.5") -> Path:
    """The directory holding vLLM ``version``'s block tests as
    ``tests/core/block/``, with ``tests/core/utils.py``, their ``__init__.py``
    and ``conftest.py`` files, a ``pytest.ini``, and the source archive's
    ``vllm/core/block_manager.py`` and ``vllm/core/interfaces.py`` (below
    ``vllm-files/``, so that no ``vllm`` directory sits beside ``tests``).  Extracted
    from the source archive once (fetching it if need be) and reused.
    Raises BlockTestsError or VllmSourceError when the archive cannot be had
    or read."""
    pin = vllm_source.pin_of(version)
    stamp = {"suite": SUITE_VERSION, "sdist_sha256": pin.sdist_sha256}
    return vllm_source.cached_directory(
        version, f"block-tests/v{SUITE_VERSION}/sdist", stamp,
        lambda into: _extract_sdist(version, into))


def _check_tree(tree: Path) -> None:
    missing = [name for name in _TREE_FILES if not (tree / "vllm" / name).is_file()]
    if missing:
        raise BlockTestsError(f"{tree} is not a vLLM source tree (no vllm/{missing[0]}); "
                              "make one with prefixcache.oracle.vllm_source.source_tree()")


def _compose(tree: Path, sdist_root: Path, into: Path, alias: bool) -> None:
    """``into/vllm``: ``tree/vllm``, the source archive's files it lacks, the
    stand-ins over it and, with ``alias``, prefixcache.impl's modules."""
    package = into / "vllm"
    shutil.copytree(tree / "vllm", package, ignore=shutil.ignore_patterns("__pycache__"))
    for relative in _FROM_SDIST:
        if not (package / relative).exists():
            shutil.copyfile(sdist_root / _SDIST_VLLM / relative, package / relative)
    shutil.copytree(STANDINS, package, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    if alias:
        for relative, target in ALIASES.items():
            name = relative[:-len(".py")].replace("/", ".")
            (package / relative).write_text(_ALIAS_MODULE.format(target=target, name=name),
                                             encoding="utf-8")
        with open(package / "utils.py", "a", encoding="utf-8") as utils:
            utils.write(_DEVICE_ALIAS)


def prefixcache_run_dir(version: str = "0.8.5") -> Path:
    """The run directory of ``against="prefixcache"``: built once per version
    of the stand-ins and of this harness, and reused."""
    tree = vllm_source.source_tree(version)
    _check_tree(tree)
    sdist_root = tests_root(version)
    standins = [(path.relative_to(STANDINS).as_posix(), path.read_bytes())
                for path in sorted(STANDINS.rglob("*.py"))]
    recipe = _digest(standins + [("aliases", json.dumps(ALIASES).encode())])
    stamp = {"suite": SUITE_VERSION, "recipe": recipe, "tree": str(tree),
             "sdist": str(sdist_root)}
    return vllm_source.cached_directory(
        version, f"block-tests/v{SUITE_VERSION}/prefixcache-{recipe[:16]}", stamp,
        lambda into: _compose(tree, sdist_root, into, alias=True))


# -- running and reading the report ------------------------------------------------------

def _node_id(root: Path, classname: str, name: str) -> str:
    """The pytest node id of a JUnit test case: its classname is the module's
    dotted path, then any classes; a collection error has no classname and
    names its module."""
    parts = classname.split(".") if classname else []
    for cut in range(len(parts), 0, -1):
        path = "/".join(parts[:cut]) + ".py"
        if (root / path).is_file():
            return "::".join([path, *parts[cut:], name])
    module = name.replace(".", "/") + ".py"
    if not classname and (root / module).is_file():
        return module
    return "::".join([*filter(None, [classname]), name])


def parse_junit(report: Path, root: Path) -> Tuple[Dict[str, str], List[str]]:
    """Each test's outcome in the JUnit XML ``report`` (``passed``,
    ``failed``, ``error`` or ``skipped``, by node id relative to ``root``)
    and the node ids that failed or errored, in the report's order.  A test
    reported twice (a failure, then an error in its teardown) counts once,
    as failed."""
    outcomes: Dict[str, str] = {}
    rank = {"passed": 0, "skipped": 1, "error": 2, "failed": 3}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        node = _node_id(root, case.get("classname", ""), case.get("name", ""))
        if case.find("failure") is not None:
            outcome = "failed"
        elif case.find("error") is not None:
            outcome = "error"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        else:
            outcome = "passed"
        if rank[outcome] >= rank[outcomes.get(node, "passed")]:
            outcomes[node] = outcome
    failures = [node for node, outcome in outcomes.items() if outcome in ("failed", "error")]
    return outcomes, failures


def _environment(extra: Optional[Mapping[str, str]], alias: bool) -> Dict[str, str]:
    environment = {key: value for key, value in os.environ.items() if key not in _DROPPED_ENV}
    if alias:  # the subprocess imports the prefixcache this process imports
        import prefixcache

        environment["PYTHONPATH"] = str(Path(prefixcache.__file__).resolve().parent.parent)
    environment.update(extra or {})
    return environment


def run_process(cmd: List[str], cwd: Path, env: Dict[str, str],
         timeout: float) -> Tuple[Optional[int], str, bool]:
    """Run ``cmd`` (in ``cwd``, environment ``env``, stdout and stderr
    together) and return (exit code or None, output, timed out); past
    ``timeout`` seconds its whole process group is killed."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
        return proc.returncode, output, False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, AttributeError):
            proc.kill()
        output, _ = proc.communicate()
        return None, output, True


def run_block_tests(against: Union[str, Path], *, pytest_args: Sequence[str] = (),
                    timeout: float = 900, version: str = "0.8.5",
                    env: Optional[Mapping[str, str]] = None) -> SuiteResult:
    """Run vLLM ``version``'s block unit tests in a pytest subprocess and
    return the counts and the failures.

    ``against``: ``"prefixcache"`` (prefixcache.impl under vLLM's module
    names), ``"vllm"`` (vLLM's own code, the unedited
    ``vllm_source.source_tree(version)``) or a directory ``D`` with ``D/vllm``
    from ``vllm_source.source_tree(version, edits)``; any other string is
    taken as such a directory.  ``pytest_args`` are added to pytest's
    command line (cwd: :func:`tests_root`); when one of them starts with
    ``tests/`` it replaces the default ``tests/core/block``.  ``timeout`` (s)
    bounds the subprocess: past it, its process group is killed and the
    result says ``timed_out``.  ``env`` is added to the subprocess's
    environment (inherited, without PYTEST_ADDOPTS, PYTEST_PLUGINS,
    PYTHONOPTIMIZE and PYTHONPATH).  Raises BlockTestsError (or
    VllmSourceError) when vLLM's files cannot be had, ``D`` is not a source
    tree, or pytest ended without a report (a usage error, say)."""
    root = tests_root(version)
    tree: Optional[Path] = None
    if isinstance(against, str) and against == "prefixcache":
        run_dir = prefixcache_run_dir(version)
    else:
        tree = (vllm_source.source_tree(version)
                if isinstance(against, str) and against == "vllm" else Path(against))
        _check_tree(tree)
    with tempfile.TemporaryDirectory(prefix="vllm-block-tests-") as scratch:
        if tree is not None:  # a copy of the tree with the stand-ins, for this run only
            run_dir = Path(scratch) / "run"
            _compose(tree, root, run_dir, alias=False)
        report = Path(scratch) / "junit.xml"
        paths = [] if any(arg.startswith("tests/") for arg in pytest_args) else [TEST_DIR]
        cmd = [sys.executable, "-c", _RUNNER, str(run_dir), "-p", "no:cacheprovider", "-q",
               "--rootdir", str(root), "--config-file", str(root / "pytest.ini"),
               f"--junitxml={report}", *paths, *pytest_args]
        start = time.monotonic()
        returncode, output, timed_out = run_process(cmd, root, _environment(env, tree is None),
                                             timeout)
        seconds = time.monotonic() - start
        label = str(against)
        if timed_out:
            return SuiteResult(label, 0, 0, 0, 0, (), seconds, None, True, output)
        if not report.is_file():
            tail = "\n".join(output.strip().splitlines()[-15:])
            raise BlockTestsError(f"pytest exited with {returncode} and no report:\n{tail}")
        outcomes, failures = parse_junit(report, root)
    counts = {kind: 0 for kind in ("passed", "failed", "error", "skipped")}
    for outcome in outcomes.values():
        counts[outcome] += 1
    return SuiteResult(label, counts["passed"], counts["failed"], counts["error"],
                       counts["skipped"], tuple(failures), seconds, returncode, False, output)


# -- command line -------------------------------------------------------------------------

def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line: run the suite, print the summary and the failures.
    Returns 0 when every test passed, 1 otherwise, 2 when it could not run."""
    args = list(sys.argv[1:] if argv is None else argv)
    pytest_args: List[str] = []
    if "--" in args:
        cut = args.index("--")
        args, pytest_args = args[:cut], args[cut + 1:]
    parser = argparse.ArgumentParser(
        prog="python bench/vllm_block_tests.py",
        description="Run vLLM's own block unit tests against prefixcache.impl or vLLM "
                    "(pytest arguments after --).")
    parser.add_argument("--against", default="prefixcache",
                        help="prefixcache (default), vllm (its own code) or a directory D "
                             "with D/vllm from vllm_source.source_tree()")
    parser.add_argument("--version", default="0.8.5", choices=sorted(vllm_source.PINS),
                        help="the vLLM release whose tests run (0.8.5)")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds before the run is stopped (900)")
    parser.add_argument("--show-output", action="store_true",
                        help="print pytest's own output too")
    options = parser.parse_args(args)
    try:
        result = run_block_tests(options.against, pytest_args=pytest_args,
                                 timeout=options.timeout, version=options.version)
    except (BlockTestsError, vllm_source.VllmSourceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if options.show_output:
        print(result.output)
    print(f"vLLM {options.version}'s block tests {result.summary()}")
    for node in result.failures:
        print(f"  FAILED {node}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
