"""prefixcache.oracle.vllm_source: vLLM's pinned release fetched, checked,
edited and imported under a private name; and ``vllm==0.8.5`` as a target.

These tests fetch vLLM when it is not cached (the wheel once per machine, the
source archive into a temporary cache every run); when it cannot be had they
fail with the reason."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Dict, List

import pytest

from prefixcache.oracle import vllm_source
from prefixcache.oracle.targets import TargetError, resolve_target
from prefixcache.oracle.vllm_source import VllmSourceError

PIN = vllm_source.PINS["0.8.5"]
EVICTOR = "core/evictor.py"
REMOVE_MESSAGE = "Attempting to remove block that's not in the evictor"
MAKE_EVICTOR = "def make_evictor(eviction_policy: EvictionPolicy) -> Evictor:"
#: Every form of import the rewrite covers, at two indentations; the second
#: edit renames what the first one added (edits apply in order).
PROBE = '''\
def _probe():
    import vllm.utils
    from vllm import logger
    from vllm.core.block.interfaces import (
        Device as D)
    if True:
        from vllm.utils import cdiv
    import vllm.platforms as plat
    return vllm, vllm.utils, logger, D, cdiv, plat


def bare_import():
    import vllm
    return vllm


'''
EDITS: Dict[str, List[vllm_source.Edit]] = {
    EVICTOR: [(REMOVE_MESSAGE, "removed by an edit"), (MAKE_EVICTOR, PROBE + MAKE_EVICTOR),
              ("def _probe():", "def probe():")],
}


def _run(code: str, tree: Path, cwd: Path) -> str:
    """Run ``code`` in a fresh Python with ``tree`` first on sys.path; its output."""
    code = f"import sys; sys.path.insert(0, {str(tree)!r})\n{code}"
    result = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


# -- edits ------------------------------------------------------------------------------


def test_an_edit_that_matches_nowhere_raises_naming_the_file() -> None:
    with pytest.raises(VllmSourceError, match=r"vllm/core/evictor\.py: edit 2 of 2 .* nowhere"):
        vllm_source.source_tree(edits={EVICTOR: [(REMOVE_MESSAGE, "x"), ("no such text", "y")]})


def test_an_edit_that_matches_twice_raises_naming_the_file() -> None:
    twice = "No usable cache memory left"
    text = (vllm_source.source_tree() / "vllm" / EVICTOR).read_text()
    assert text.count(twice) == 2
    with pytest.raises(VllmSourceError, match=r"vllm/core/evictor\.py: .* more than once"):
        vllm_source.load(edits={EVICTOR: [(twice, "x")]})


def test_an_edit_of_a_missing_file_or_one_that_breaks_the_syntax_raises() -> None:
    with pytest.raises(VllmSourceError, match=r"vllm/core/nothing\.py: no such file"):
        vllm_source.source_tree(edits={"core/nothing.py": [("a", "b")]})
    with pytest.raises(VllmSourceError, match=r"vllm/core/evictor\.py after its edits"):
        vllm_source.source_tree(edits={EVICTOR: [(MAKE_EVICTOR, "def (")]})


@pytest.mark.parametrize("edits, error", [
    ({"../evictor.py": [("a", "b")]}, ValueError),
    ({"core/evictor": [("a", "b")]}, ValueError),
    ({EVICTOR: [("", "b")]}, ValueError),
    ({EVICTOR: [("a", "b", "c")]}, TypeError),
    ({EVICTOR: "ab"}, TypeError),
    ([(EVICTOR, [("a", "b")])], TypeError),
])
def test_malformed_edits_are_refused(edits: object, error: type) -> None:
    with pytest.raises(error):
        vllm_source.source_tree(edits=edits)  # type: ignore[arg-type]


def test_edits_change_only_the_edited_tree() -> None:
    real, edited = vllm_source.source_tree(), vllm_source.source_tree(edits=EDITS)
    assert real != edited
    assert REMOVE_MESSAGE in (real / "vllm" / EVICTOR).read_text()
    edited_text = (edited / "vllm" / EVICTOR).read_text()
    assert REMOVE_MESSAGE not in edited_text and "def probe():" in edited_text
    same = {"core/block/common.py": [], EVICTOR: tuple(EDITS[EVICTOR])}
    assert vllm_source.source_tree(edits=same) == edited  # the same edits, the same tree
    two = {"utils.py": [("def cdiv", "def cdiv_")], EVICTOR: [(MAKE_EVICTOR, "#\n" + MAKE_EVICTOR)]}
    tree = vllm_source.source_tree(edits=two)
    assert vllm_source.source_tree(edits=dict(reversed(two.items()))) == tree
    assert "def cdiv_" in (tree / "vllm" / "utils.py").read_text()
    assert tree not in (real, edited)


def test_the_real_and_an_edited_tree_load_side_by_side() -> None:
    before = {name for name in sys.modules if name == "vllm" or name.startswith("vllm.")}
    real, edited = vllm_source.load(), vllm_source.load(edits=EDITS)
    assert vllm_source.load() is real and vllm_source.load(edits=dict(EDITS)) is edited
    assert real.package == "_prefixcache_vllm_0_8_5"
    assert edited.package.startswith("_prefixcache_vllm_0_8_5_") and edited.package != real.package
    assert {n for n in sys.modules if n == "vllm" or n.startswith("vllm.")} == before
    for name in ("evictor", "prefix_caching_block", "cpu_gpu_block_allocator", "interfaces"):
        assert getattr(real, name) is not getattr(edited, name)
        assert getattr(edited, name).__name__.startswith(edited.package + ".")
    assert real.Device is not edited.Device and real.Device is real.utils.Device
    with pytest.raises(ValueError, match=REMOVE_MESSAGE):
        real.evictor.LRUEvictor().remove(0)
    with pytest.raises(ValueError, match="removed by an edit"):
        edited.evictor.LRUEvictor().remove(0)
    # each tree's allocator uses its own evictor: the imports were rewritten
    allocator = edited.prefix_caching_block.PrefixCachingBlockAllocator(num_blocks=2, block_size=1)
    assert type(allocator.evictor) is edited.evictor.LRUEvictor
    assert (edited.path / edited.package / "__init__.py").is_file()


def test_every_form_of_vllm_import_is_rewritten_to_the_private_package() -> None:
    edited = vllm_source.load(edits=EDITS)
    top = sys.modules[edited.package]
    package, utils, logger, device, cdiv, platforms = edited.evictor.probe()
    assert package is top and utils is edited.utils and device is edited.Device
    assert logger is sys.modules[f"{edited.package}.logger"]
    assert platforms is sys.modules[f"{edited.package}.platforms"]
    assert cdiv(7, 2) == 4
    assert edited.evictor.bare_import() is top
    assert edited.prefix_caching_block.logger.name == \
        f"{edited.package}.core.block.prefix_caching_block"


# -- source trees in a subprocess ---------------------------------------------------------


def test_a_subprocess_imports_vllm_from_the_source_tree(tmp_path: Path) -> None:
    tree = vllm_source.source_tree()
    out = _run("import vllm.core.block.prefix_caching_block as p\n"
               "a = p.PrefixCachingBlockAllocator(num_blocks=2, block_size=2)\n"
               "print(p.__file__)\n"
               "print(a.allocate_immutable_block(None, [1, 2]).block_id)\n",
               tree, tmp_path).split()
    assert Path(out[0]).resolve().is_relative_to(tree.resolve())
    assert out[1] == "0"
    edited = vllm_source.source_tree(edits=EDITS)
    out = _run("import vllm.core.evictor as e\nprint(e.probe()[0].__file__)\n",
               edited, tmp_path).split()
    assert Path(out[0]).resolve() == (edited / "vllm" / "__init__.py").resolve()


def test_parallel_processes_build_one_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    """Two processes build the same edited tree in an empty cache at once
    (the wheel named by $PREFIXCACHE_VLLM_WHEEL); both get it whole."""
    monkeypatch.setenv(vllm_source.WHEEL_ENV, str(vllm_source.wheel()))
    monkeypatch.setenv(vllm_source.CACHE_ENV, str(tmp_path / "cache"))
    code = ("from prefixcache.oracle import vllm_source\n"
            f"print(vllm_source.source_tree(edits={EDITS!r}))\n")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [proc.communicate(timeout=300) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outs
    assert outs[0][0] == outs[1][0]
    tree = Path(outs[0][0].strip())
    assert tree.is_relative_to(tmp_path / "cache")
    assert "def probe():" in (tree / "vllm" / EVICTOR).read_text()
    assert not [p for p in tree.parent.iterdir() if p.name.startswith(".build-")]


# -- fetching and verifying ---------------------------------------------------------------


def test_the_cache_directory_is_the_environment_s_or_the_default(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(vllm_source.CACHE_ENV, raising=False)
    assert vllm_source.cache_dir() == Path.home() / ".cache" / "prefixcache" / "vllm-0.8.5"
    monkeypatch.setenv(vllm_source.CACHE_ENV, str(tmp_path))
    assert vllm_source.cache_dir("0.8.5") == tmp_path
    with pytest.raises(VllmSourceError, match="9.9.9.*not pinned.*0.8.5"):
        vllm_source.cache_dir("9.9.9")


@pytest.mark.parametrize("env, fetch", [
    (vllm_source.WHEEL_ENV, vllm_source.wheel),
    (vllm_source.SDIST_ENV, vllm_source.sdist),
])
def test_a_local_file_with_the_wrong_sha256_is_refused(
        env: str, fetch: object, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bogus = tmp_path / "vllm-0.8.5.bogus"
    bogus.write_bytes(b"not vllm")
    monkeypatch.setenv(env, str(bogus))
    monkeypatch.setenv(vllm_source.CACHE_ENV, str(tmp_path / "cache"))
    digest = hashlib.sha256(b"not vllm").hexdigest()
    with pytest.raises(VllmSourceError, match=f"{re.escape(str(bogus))}.*sha256 {digest}"):
        fetch()  # type: ignore[operator]
    monkeypatch.setenv(env, str(tmp_path / "missing"))
    with pytest.raises(VllmSourceError, match="not found"):
        fetch()  # type: ignore[operator]


def test_a_tree_is_not_built_from_a_wrong_wheel(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    bogus = tmp_path / PIN.wheel
    bogus.write_bytes(b"not vllm")
    monkeypatch.setenv(vllm_source.WHEEL_ENV, str(bogus))
    monkeypatch.setenv(vllm_source.CACHE_ENV, str(tmp_path / "cache"))
    with pytest.raises(VllmSourceError, match="is not the published"):
        vllm_source.source_tree()
    assert not (tmp_path / "cache" / "trees").exists() or not any(
        (tmp_path / "cache" / "trees").iterdir())


def test_the_source_archive_is_fetched_from_the_index_and_verified(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A real download (7 MB) into an empty cache over a truncated copy; then
    the cached copy is used without the index."""
    monkeypatch.delenv(vllm_source.SDIST_ENV, raising=False)
    monkeypatch.delenv(vllm_source.INDEX_ENV, raising=False)
    monkeypatch.setenv(vllm_source.CACHE_ENV, str(tmp_path))
    (tmp_path / PIN.sdist).write_bytes(b"truncated")
    path = vllm_source.sdist()
    assert path == tmp_path / PIN.sdist
    assert hashlib.sha256(path.read_bytes()).hexdigest() == PIN.sdist_sha256
    with tarfile.open(path) as archive:
        names = set(archive.getnames())
    assert "vllm-0.8.5/tests/core/block/test_prefix_caching_block.py" in names
    assert [p.name for p in tmp_path.iterdir() if p.name != ".lock"] == [PIN.sdist]
    monkeypatch.setenv(vllm_source.INDEX_ENV, "http://127.0.0.1:9/simple/")
    assert vllm_source.sdist() == path


def test_an_unreachable_index_raises_saying_what_to_do(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    monkeypatch.delenv(vllm_source.SDIST_ENV, raising=False)
    monkeypatch.setenv(vllm_source.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv(vllm_source.INDEX_ENV, "http://127.0.0.1:9/simple/")
    with pytest.raises(VllmSourceError, match=f"127.0.0.1:9.*{vllm_source.SDIST_ENV}"):
        vllm_source.sdist()
    assert not (tmp_path / PIN.sdist).exists()


# -- the command line -------------------------------------------------------------------


def test_check_runs_a_small_allocation(capsys: pytest.CaptureFixture[str]) -> None:
    assert vllm_source.main(["--check"]) == 0
    out = capsys.readouterr().out
    assert "_prefixcache_vllm_0_8_5" in out
    assert "second chain ids: [0, 1] (prefix cache hits)" in out
    assert "naive block id  : 0 free 2" in out


def test_check_fails_with_a_one_line_reason(tmp_path: Path) -> None:
    env = {**os.environ, vllm_source.CACHE_ENV: str(tmp_path),
           vllm_source.WHEEL_ENV: str(tmp_path / "missing.whl")}
    result = subprocess.run([sys.executable, "-m", "prefixcache.oracle.vllm_source", "--check"],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert "missing.whl" in result.stderr


# -- vllm==0.8.5 as a target ----------------------------------------------------------------


def test_vllm_0_8_5_is_a_target_that_allocates() -> None:
    target = resolve_target("vllm==0.8.5")
    assert target.kind == "prefix" and target.name == "vllm==0.8.5"
    allocator = target.make(4, 2)
    assert type(allocator) is vllm_source.load().prefix_caching_block.PrefixCachingBlockAllocator
    assert allocator.allocate_immutable_block(None, [1, 2]).block_id == 0
    assert allocator.get_num_free_blocks() == 3


def test_other_vllm_allocator_classes_are_targets_of_their_kind() -> None:
    ref = vllm_source.load()
    naive = resolve_target("vllm==0.8.5:NaiveBlockAllocator")
    assert naive.kind == "naive"
    block = naive.make(3, 2).allocate_immutable_block(None, [7, 8])
    assert type(block) is ref.naive_block.NaiveBlock and block.block_id == 0
    pair = resolve_target("vllm==0.8.5:CpuGpuBlockAllocator")
    assert pair.kind == "cpu_gpu"
    allocator = pair.make(2, 2)
    assert allocator.allocate_mutable_block(None, device=ref.Device.GPU).block_id == 0
    assert allocator.get_num_free_blocks(ref.Device.CPU) == 2


def test_unpinned_versions_and_unknown_classes_are_target_errors() -> None:
    with pytest.raises(TargetError, match="9.9.9.*not pinned.*0.8.5"):
        resolve_target("vllm==9.9.9")
    with pytest.raises(TargetError, match="no allocator class 'BlockPool'.*NaiveBlockAllocator"):
        resolve_target("vllm==0.8.5:BlockPool")
