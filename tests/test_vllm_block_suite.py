"""vLLM 0.8.5's own block unit tests (``tests/core/block/*.py`` of its source
archive, fetched at run time, never committed), run by
bench/vllm_block_tests.py in a pytest subprocess:

* against prefixcache.impl, through the run directory's import alias: all
  910 are collected and pass;
* against vLLM's own code, with prefixcache's stand-ins for ``vllm.sequence``
  and the rest: all 910 pass too, which is the proof that the stand-ins
  behave as vLLM's modules do where the tests look;
* against an edited tree (as a mutation study makes one), with extra
  environment: the failures come back by node id.

Each of the first two takes about 5 and 25 s.  Nothing is skipped: when
vLLM's files cannot be had, the tests fail with the reason."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from prefixcache.oracle import vllm_source

#: vLLM 0.8.5's block tests outside e2e/: 106 in test_block_manager.py, 426 in
#: test_block_table.py, 80 in test_common.py, 8 in test_cpu_gpu_block_allocator.py,
#: 19 in test_naive_block.py and 271 in test_prefix_caching_block.py.
EXPECTED_TESTS = 910
COMMON_TESTS = "tests/core/block/test_common.py"


def _harness() -> Any:
    path = Path(__file__).resolve().parent.parent / "bench" / "vllm_block_tests.py"
    spec = importlib.util.spec_from_file_location("prefixcache_bench_vllm_block_tests", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


harness = _harness()


def _check_all_pass(result: Any) -> None:
    tail = result.output[-4000:]
    assert result.collected == EXPECTED_TESTS, tail
    assert result.failures == (), tail
    assert (result.passed, result.skipped) == (EXPECTED_TESTS, 0), tail
    assert result.ok and result.returncode == 0 and not result.timed_out


def test_vllms_block_tests_pass_on_prefixcache() -> None:
    _check_all_pass(harness.run_block_tests("prefixcache"))


def test_vllms_block_tests_pass_on_vllms_own_code_with_the_stand_ins() -> None:
    _check_all_pass(harness.run_block_tests("vllm"))


def test_the_alias_makes_vllms_block_modules_prefixcaches() -> None:
    """In the run directory of "prefixcache", each aliased ``vllm`` module is
    prefixcache.impl's module object, ``vllm.utils.Device`` is prefixcache's,
    and the modules prefixcache does not provide are vLLM's, on top of them."""
    run_dir = harness.prefixcache_run_dir()
    probe = textwrap.dedent(f"""
        import importlib, sys
        sys.path.insert(0, {str(run_dir)!r})
        aliases = {harness.ALIASES!r}
        for path, target in aliases.items():
            name = "vllm." + path[:-3].replace("/", ".")
            assert importlib.import_module(name) is importlib.import_module(target), name
        import vllm.utils, vllm.core.block.block_table as table, vllm.core.block_manager
        from prefixcache.impl.interfaces import Device
        from prefixcache.impl.common import BlockList
        assert vllm.utils.Device is Device and table.BlockList is BlockList
        assert vllm.core.block_manager.Device is Device
        assert table.__name__ == "vllm.core.block.block_table"
        assert table.__file__.startswith({str(run_dir)!r})
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=run_dir, env=harness._environment(None, alias=True))
    assert proc.stdout.strip() == "ok", proc.stderr


def test_an_edited_tree_reports_its_failures_by_node_id() -> None:
    """A tree whose RefCounter counts one too many when the environment says
    so: the extra environment reaches the tests, and every failed test comes
    back by its node id."""
    probe = "(__import__('os').environ.get('PREFIXCACHE_PROBE') == 'on')"
    tree = vllm_source.source_tree(edits={"core/block/common.py": [(
        "post_incr_refcount = pre_incr_refcount + 1",
        f"post_incr_refcount = pre_incr_refcount + 1 + {probe}")]})
    clean = harness.run_block_tests(tree, pytest_args=[COMMON_TESTS])
    assert (clean.passed, clean.failures, clean.ok) == (80, (), True), clean.output[-2000:]
    broken = harness.run_block_tests(str(tree), pytest_args=[COMMON_TESTS],
                                     env={"PREFIXCACHE_PROBE": "on"})
    assert (broken.passed, broken.failed, broken.errors) == (0, 80, 0)
    assert not broken.ok and broken.returncode == 1
    assert f"{COMMON_TESTS}::test_incr[1024-1-0]" in broken.failures
    assert f"{COMMON_TESTS}::test_incr_decr[1024-100-19]" in broken.failures
    assert len(set(broken.failures)) == 80
    assert all(node.startswith(f"{COMMON_TESTS}::test_incr") for node in broken.failures)


def test_a_run_past_its_timeout_is_stopped_and_said() -> None:
    result = harness.run_block_tests("prefixcache", timeout=0.3)
    assert result.timed_out and not result.ok and result.returncode is None
    assert "timed out" in result.summary()


def test_a_run_without_a_report_or_a_tree_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(harness.BlockTestsError, match="no report"):
        harness.run_block_tests("prefixcache", pytest_args=["--no-such-option"])
    with pytest.raises(harness.BlockTestsError, match="not a vLLM source tree"):
        harness.run_block_tests(tmp_path)


def test_the_junit_report_reads_as_node_ids(tmp_path: Path) -> None:
    """Classes become ``::`` parts, a failure then a teardown error of one
    test counts once (failed), a collection error is an error of the file."""
    root = tmp_path / "root"
    (root / "tests" / "core").mkdir(parents=True)
    (root / "tests" / "core" / "test_a.py").write_text("")
    (root / "tests" / "core" / "test_b.py").write_text("")
    report = tmp_path / "junit.xml"
    report.write_text(textwrap.dedent("""\
        <testsuites><testsuite>
        <testcase classname="tests.core.test_a" name="test_ok[1-2.5]"/>
        <testcase classname="tests.core.test_a.TestK" name="test_bad"><failure/></testcase>
        <testcase classname="tests.core.test_a.TestK" name="test_bad"><error/></testcase>
        <testcase classname="tests.core.test_a" name="test_skip"><skipped/></testcase>
        <testcase classname="tests.core.test_a" name="test_err"><error/></testcase>
        <testcase classname="" name="tests.core.test_b"><error/></testcase>
        <testcase classname="" name="tests.core.test_c"><error/></testcase>
        </testsuite></testsuites>
    """))
    outcomes, failures = harness.parse_junit(report, root)
    assert outcomes == {
        "tests/core/test_a.py::test_ok[1-2.5]": "passed",
        "tests/core/test_a.py::TestK::test_bad": "failed",
        "tests/core/test_a.py::test_skip": "skipped",
        "tests/core/test_a.py::test_err": "error",
        "tests/core/test_b.py": "error",
        "tests.core.test_c": "error",  # no such file: as the report says
    }
    assert failures == ["tests/core/test_a.py::TestK::test_bad", "tests/core/test_a.py::test_err",
                        "tests/core/test_b.py", "tests.core.test_c"]
