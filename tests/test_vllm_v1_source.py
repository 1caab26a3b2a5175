"""prefixcache.oracle.vllm_v1_source: vLLM v1's BlockPool fetched from its
pinned wheel, SHA-256 checked, and imported without torch through stand-ins.

The wheel is fetched once per machine when it is not cached; when it cannot be
had these tests fail with the reason."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
from helpers.v1_releases import TESTED_RELEASES

from prefixcache.oracle import vllm_source, vllm_v1_source
from prefixcache.oracle.vllm_source import VllmSourceError
from prefixcache.oracle.vllm_v1_source import V1_DEFAULT, load_v1, repr_sha256


def _hashes(utils: types.ModuleType, *blocks: tuple) -> list:
    """vLLM's chained hashes of the token tuples ``blocks``."""
    out: list = []
    for tokens in blocks:
        out.append(utils.hash_block_tokens(repr_sha256, out[-1] if out else None, tokens))
    return out


@pytest.mark.parametrize("version", TESTED_RELEASES)
def test_the_real_block_pool_is_built_and_used(version: str) -> None:
    ref = load_v1(version)
    assert "torch" not in sys.modules
    assert ref.package == "_prefixcache_vllm_" + version.replace(".", "_")
    assert ref.block_pool.__file__.endswith("block_pool.py")
    pool = ref.BlockPool(num_gpu_blocks=6, enable_caching=True, hash_block_size=2)
    assert pool.null_block.block_id == 0 and pool.get_num_free_blocks() == 5
    blocks = pool.get_new_blocks(3)
    assert [b.block_id for b in blocks] == [1, 2, 3]
    hashes = _hashes(ref.kv_cache_utils, (1, 2), (3, 4))
    pool.cache_full_blocks(types.SimpleNamespace(block_hashes=hashes), blocks, 0, 2, 2, 0)
    hit = pool.get_cached_block(hashes[1], [0])
    assert hit is not None and [b.block_id for b in hit] == [2]
    assert pool.get_cached_block(hashes[1], [1]) is None  # another group
    pool.free_blocks(reversed(blocks))
    # the uncached tail block goes first, the cached ones last, in the order given
    queue = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
    assert queue == [3, 4, 5, 2, 1]
    pool.touch(hit)
    assert pool.get_num_free_blocks() == 4 and hit[0].ref_cnt == 1
    assert pool.get_usage() == pytest.approx(0.2)
    assert not pool.reset_prefix_cache()
    pool.free_blocks(hit)
    assert pool.reset_prefix_cache()
    assert pool.get_cached_block(hashes[0], [0]) is None


def test_load_is_memoised_and_edits_load_beside_it() -> None:
    real = load_v1()
    assert load_v1(V1_DEFAULT) is real
    edited = load_v1(edits={"v1/core/block_pool.py": [
        ("block.ref_cnt -= 1\n            if block.ref_cnt == 0:\n                if block",
         "block.ref_cnt -= 0\n            if block.ref_cnt == 0:\n                if block")]})
    assert edited is not real and edited.package != real.package
    pool = edited.BlockPool(num_gpu_blocks=3, enable_caching=True, hash_block_size=2)
    pool.free_blocks(pool.get_new_blocks(1))
    assert pool.get_num_free_blocks() == 1  # the lost decrement


def test_the_tree_holds_the_two_files_and_stubs_only() -> None:
    tree = vllm_v1_source.v1_source_tree() / "vllm"
    names = {p.relative_to(tree).as_posix() for p in tree.rglob("*.py")}
    taken = {name[len("vllm/"):] for name in vllm_v1_source.V1_FILES}
    assert taken <= names
    assert names - taken == set(vllm_v1_source.V1_LAYOUT.stubs(V1_DEFAULT))


def test_unpinned_versions_and_v0_pins_are_refused() -> None:
    with pytest.raises(VllmSourceError, match="not pinned"):
        load_v1("0.8.5")
    assert V1_DEFAULT not in vllm_source.PINS
    assert vllm_v1_source.V1_PINS[V1_DEFAULT].platform == "manylinux_2_28_x86_64"


def test_the_command_line_checks(capsys: pytest.CaptureFixture[str]) -> None:
    assert vllm_v1_source.main(["--check"]) == 0
    out = capsys.readouterr().out
    assert "lookup         : [1]" in out and "free queue     : [2, 3, 4, 1]" in out


def test_a_fresh_cache_is_built_from_the_verified_wheel(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pin = vllm_v1_source.V1_PINS[V1_DEFAULT]
    monkeypatch.setenv(vllm_source.WHEEL_ENV, str(vllm_source.pinned_wheel(pin)))
    monkeypatch.setenv(vllm_source.CACHE_ENV, str(tmp_path / "cache"))
    tree = vllm_v1_source.v1_source_tree()
    assert tree.is_relative_to(tmp_path)
    assert (tree / "vllm" / "v1" / "core" / "block_pool.py").is_file()


def test_a_wheel_with_another_digest_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / vllm_v1_source.V1_PINS[V1_DEFAULT].wheel
    fake.write_bytes(b"not the wheel")
    monkeypatch.setenv(vllm_source.WHEEL_ENV, str(fake))
    with pytest.raises(VllmSourceError, match="not the published"):
        vllm_source.pinned_wheel(vllm_v1_source.V1_PINS[V1_DEFAULT])
