"""The v1 spec: the state's invariants, the abstraction of a real BlockPool
(of each pinned release), vLLM's hash chain, and the error table's account
of the pinned pools."""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Callable, Dict

import pytest
from helpers.v1_releases import TESTED_RELEASES

from prefixcache.model.v1_model import V1Model
from prefixcache.oracle.vllm_v1_source import load_v1, repr_sha256
from prefixcache.spec.v1_abstraction import abstract_v1
from prefixcache.spec.v1_error_table import V1_ERROR_TABLE
from prefixcache.spec.v1_invariants import V1_INVARIANTS, check_all_v1
from prefixcache.spec.v1_operations import V1_OPERATIONS
from prefixcache.spec.v1_state import NULL_BLOCK, V1State, chain_hashes, pack_key, unpack_key

H0, H1 = b"h0" * 16, b"h1" * 16


def _state(**changes: Any) -> V1State:
    """A sound state of 5 ids: 1 in use cached under (H0, 0), 2 free cached under
    (H0, 0) too, 3 and 4 free."""
    base = V1State(num_blocks=5, null_block=NULL_BLOCK, ref_cnt=(0, 1, 0, 0, 0),
                   free_queue=(3, 4, 2), queue_backward=(3, 4, 2), reported_free=3,
                   cached={(H0, 0): (1, 2)},
                   lookup={(H0, 0): 1}, block_keys={1: ((H0, 0), 2), 2: ((H0, 0), 2)},
                   secondary={}, contents={H0: (None, ((1, 2),))}, block_size=2)
    return dataclasses.replace(base, **changes)


BROKEN: Dict[str, Dict[str, Any]] = {
    "ids_well_formed": {"ref_cnt": (0, 1, 0, 0)},
    "free_count_is_queue_length": {"reported_free": 4},
    "queue_well_formed": {"free_queue": (3, 4, 2, 9), "queue_backward": (3, 4, 2, 9),
                          "reported_free": 4},
    "queue_links_agree": {"queue_backward": (4, 3, 2)},
    "refcounts_non_negative": {"ref_cnt": (0, 1, -1, 0, 0)},
    "referenced_not_queued": {"ref_cnt": (0, 1, 1, 0, 0)},
    "unreferenced_queued": {"free_queue": (3, 4), "queue_backward": (3, 4),
                            "reported_free": 2},
    "null_block_apart": {"free_queue": (3, 4, 2, 0), "queue_backward": (3, 4, 2, 0),
                         "reported_free": 4},
    "no_stale_map_entry": {"cached": {(H0, 0): (1, 2, 3)}},
    "lookup_is_first": {"lookup": {(H0, 0): 2}},
    "salts_and_groups_apart": {"secondary": {1: frozenset({(H1, 1)})},
                               "cached": {(H0, 0): (1, 2), (H1, 1): (1,)},
                               "lookup": {(H0, 0): 1, (H1, 1): 1}},
    "keys_cover_whole_blocks": {"block_keys": {1: ((H0, 0), 3), 2: ((H0, 0), 2)}},
}


def test_a_sound_state_satisfies_every_invariant() -> None:
    assert check_all_v1(_state()) == []
    assert _state().usage() == pytest.approx(0.25)


@pytest.mark.parametrize("name", [inv.name for inv in V1_INVARIANTS])
def test_each_invariant_catches_its_breach(name: str) -> None:
    assert name in check_all_v1(_state(**BROKEN[name]))


def test_keys_pack_as_vllm_packs_them() -> None:
    utils = load_v1().kv_cache_utils
    for key in [(H0, 0), (H1, 7), (b"", 2**32 - 1)]:
        assert pack_key(key) == utils.make_block_hash_with_group_id(key[0], key[1])
        assert unpack_key(pack_key(key)) == key


def test_the_chain_is_vllm_s() -> None:
    utils = load_v1().kv_cache_utils
    blocks = [(1, 2), (3, 4), (5, 6)]
    for salt in (None, "salt"):
        ours = chain_hashes(repr_sha256, utils.NONE_HASH, blocks, salt)
        theirs: list = []
        for k, tokens in enumerate(blocks):
            extra = (("cache_salt", salt),) if salt and k == 0 else None
            theirs.append(utils.hash_block_tokens(repr_sha256, theirs[-1] if theirs else None,
                                                  tokens, extra))
        assert ours == theirs
    assert chain_hashes(repr_sha256, utils.NONE_HASH, blocks, "a")[2] != \
        chain_hashes(repr_sha256, utils.NONE_HASH, blocks, "b")[2]


@pytest.mark.parametrize("version", TESTED_RELEASES)
def test_the_abstraction_reads_a_real_pool(version: str) -> None:
    """Both shapes of the hash map (0.33.0: blocks, or dicts of them; 0.34.0:
    ids apart from the duplicates) read as the same state."""
    ref = load_v1(version)
    pool = ref.BlockPool(num_gpu_blocks=5, enable_caching=True, hash_block_size=2)
    hashes = chain_hashes(repr_sha256, ref.kv_cache_utils.NONE_HASH, [(1, 2)])
    request = types.SimpleNamespace(block_hashes=hashes)
    first, second = pool.get_new_blocks(1), pool.get_new_blocks(1)
    pool.cache_full_blocks(request, first, 0, 1, 2, 0)
    pool.cache_full_blocks(request, second, 0, 1, 2, 0)
    pool.free_blocks(second)
    s = abstract_v1(pool, {hashes[0]: (None, ((1, 2),))}, block_size=2)
    key = (hashes[0], 0)
    assert s == _state(cached={key: (1, 2)}, lookup={key: 1},
                       block_keys={1: (key, 2), 2: (key, 2)}, contents=s.contents)
    assert check_all_v1(s) == []
    pool.evict_blocks({1})  # the duplicate left alone under its key
    s = abstract_v1(pool, s.contents, block_size=2)
    assert s == _state(cached={key: (2,)}, lookup={key: 2}, block_keys={2: (key, 2)},
                       contents=s.contents)
    assert check_all_v1(s) == []


def test_the_null_block_s_count_reads_as_zero() -> None:
    """0.28.0 counts touches and frees of the null block (0.33.0 on skip it);
    nothing reads that count, so the abstraction reads it as 0."""
    pool = load_v1("0.28.0").BlockPool(num_gpu_blocks=3, enable_caching=True, hash_block_size=1)
    pool.touch([pool.null_block])
    pool.free_blocks([pool.null_block, pool.null_block])
    assert pool.null_block.ref_cnt == -1
    s = abstract_v1(pool)
    assert s.ref_cnt == (0, 0, 0) and check_all_v1(s) == []


def _provoke(row_key: str, pool: Any, hashes: list) -> Callable[[], Any]:
    request = types.SimpleNamespace(block_hashes=hashes)
    held = pool.get_new_blocks(2)
    calls: Dict[str, Callable[[], Any]] = {
        "get_new_blocks:too-many": lambda: pool.get_new_blocks(3),
        "get_new_blocks:negative": lambda: pool.get_new_blocks(-1),
        "free_blocks:unreferenced": lambda: pool.free_blocks([pool.blocks[4]]),
        "free_blocks:repeated": lambda: pool.free_blocks([held[0], held[0]]),
        "touch:not-cached-free": lambda: pool.touch([pool.blocks[4]]),
        "cache_full_blocks:unreferenced": lambda: pool.cache_full_blocks(
            request, [pool.blocks[4]], 0, 1, 2, 0),
        "cache_full_blocks:already-cached": lambda: (
            pool.cache_full_blocks(request, held, 0, 1, 2, 0),
            pool.cache_full_blocks(request, held, 0, 1, 2, 0)),
        "cache_full_blocks:too-few-hashes": lambda: pool.cache_full_blocks(
            types.SimpleNamespace(block_hashes=hashes[:1]), held, 0, 2, 2, 0),
        "evict_blocks:unknown-id": lambda: pool.evict_blocks({5}),
        "evict_blocks:negative-id": lambda: pool.evict_blocks({-1}),
        "get_cached_block:no-groups": lambda: pool.get_cached_block(hashes[0], []),
    }
    return calls[row_key]


@pytest.mark.parametrize("version", TESTED_RELEASES)
@pytest.mark.parametrize("row", V1_ERROR_TABLE, ids=lambda r: r.key)
def test_the_error_table_says_what_each_pinned_release_does(row: Any, version: str) -> None:
    ref = load_v1(version)
    pool = ref.BlockPool(num_gpu_blocks=5, enable_caching=True, hash_block_size=2)
    hashes = chain_hashes(repr_sha256, ref.kv_cache_utils.NONE_HASH, [(1, 2), (3, 4)])
    call = _provoke(row.key, pool, hashes)
    if row.pinned_raises is None:
        call()  # accepted silently
    else:
        with pytest.raises(row.pinned_raises):
            call()


def test_the_abstraction_shows_a_corrupted_queue() -> None:
    ref = load_v1()
    pool = ref.BlockPool(num_gpu_blocks=5, enable_caching=True, hash_block_size=2)
    pool.blocks[3].prev_free_block = pool.blocks[1]      # skips 2 read backwards
    assert check_all_v1(abstract_v1(pool)) == ["queue_links_agree"]
    pool.blocks[4].next_free_block = pool.blocks[1]      # a cycle read forwards
    s = abstract_v1(pool)
    assert len(s.free_queue) == 6 and "queue_well_formed" in check_all_v1(s)  # cut at 5 + 1


def test_the_operations_are_the_pool_s_and_the_model_s() -> None:
    names = [op.name for op in V1_OPERATIONS]
    pool = load_v1().BlockPool
    model_ops = {name for name in vars(V1Model) if not name.startswith("_")}
    assert all(callable(getattr(pool, name, None)) for name in names)
    assert set(names) == model_ops - {"state", "record"}
    assert {row.operation for row in V1_ERROR_TABLE} <= set(names)
