"""The v1 model (model/v1_model.py) against vLLM 0.34.0's real BlockPool:
hand-worked scenarios, its size, and a Hypothesis state machine that makes the
same random valid calls on both and compares every answer, the abstract state
(the abstraction of the real pool against the model's) and the invariants
after every call."""

from __future__ import annotations

import ast
import types
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pytest
from helpers.code_lines import code_lines
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from prefixcache.model import v1_model
from prefixcache.model.errors import ModelInvariantError
from prefixcache.model.v1_model import V1Model
from prefixcache.oracle.vllm_source import Edits
from prefixcache.oracle.vllm_v1_source import load_v1, repr_sha256, v1_source_tree
from prefixcache.spec.v1_abstraction import abstract_v1
from prefixcache.spec.v1_error_table import V1_ERROR_TABLE, V1ErrorCase
from prefixcache.spec.v1_invariants import check_all_v1
from prefixcache.spec.v1_state import BlockHash, HashedContent, chain_hashes

HASH_BLOCK = 2


def _none_hash() -> BlockHash:
    return bytes(load_v1().kv_cache_utils.NONE_HASH)


def _hashes(blocks: Sequence[Tuple[int, ...]], salt: Optional[str] = None
            ) -> Tuple[List[BlockHash], Dict[BlockHash, HashedContent]]:
    """The chained hashes of ``blocks`` and what each stands for."""
    hashes = chain_hashes(repr_sha256, _none_hash(), blocks, salt)
    return hashes, {h: (salt, tuple(blocks[:k + 1])) for k, h in enumerate(hashes)}


class Pair:
    """A real pool and the model, called alike; blocks named by id."""

    def __init__(self, num_blocks: int, edits: Optional[Edits] = None) -> None:
        self.pool = load_v1(edits=edits).BlockPool(num_gpu_blocks=num_blocks, enable_caching=True,
                                        hash_block_size=HASH_BLOCK)
        self.model = V1Model(num_blocks, HASH_BLOCK)

    def blocks(self, ids: Sequence[int]) -> List[Any]:
        return [self.pool.blocks[i] for i in ids]

    def check(self) -> None:
        """The abstraction of the pool equals the model's state; both keep the invariants."""
        real = abstract_v1(self.pool, self.model.contents, HASH_BLOCK)
        assert check_all_v1(real) == []
        assert real == self.model.state()
        assert self.pool.get_num_free_blocks() == self.model.get_num_free_blocks()
        assert self.pool.get_usage() == pytest.approx(self.model.get_usage())

    def new(self, n: int) -> List[int]:
        real = [b.block_id for b in self.pool.get_new_blocks(n)]
        assert real == self.model.get_new_blocks(n)
        return real

    def cache(self, hashes: Sequence[BlockHash], contents: Dict[BlockHash, HashedContent],
              ids: Sequence[int], num_cached: int, num_full: int, block_size: int,
              group: int) -> None:
        self.model.record(contents)
        request = types.SimpleNamespace(block_hashes=list(hashes))
        self.pool.cache_full_blocks(request, self.blocks(ids), num_cached, num_full,
                                    block_size, group)
        self.model.cache_full_blocks(hashes, ids, num_cached, num_full, block_size, group)

    def lookup(self, block_hash: BlockHash, groups: Sequence[int]) -> Optional[List[int]]:
        found = self.pool.get_cached_block(block_hash, list(groups))
        real = None if found is None else [b.block_id for b in found]
        assert real == self.model.get_cached_block(block_hash, groups)
        return real

    def touch(self, ids: Sequence[int]) -> None:
        self.pool.touch(self.blocks(ids))
        self.model.touch(ids)

    def free(self, ids: Sequence[int], evict_first: bool = False) -> None:
        self.pool.free_blocks(self.blocks(ids), evict_first=evict_first)
        self.model.free_blocks(ids, evict_first=evict_first)

    def evict(self, ids: Sequence[int]) -> None:
        self.pool.evict_blocks(set(ids))
        self.model.evict_blocks(ids)

    def reset(self) -> bool:
        real = self.pool.reset_prefix_cache()
        assert real == self.model.reset_prefix_cache()
        return bool(real)


# -- hand-worked scenarios --------------------------------------------------------------

def test_a_fresh_pool_holds_the_null_block_apart() -> None:
    pair = Pair(4)
    pair.check()
    assert pair.model.state().free_queue == (1, 2, 3) and pair.model.get_usage() == 0.0
    assert pair.new(3) == [1, 2, 3] and pair.model.get_usage() == 1.0
    pair.check()


def test_freed_blocks_go_to_the_front_unless_cached() -> None:
    pair = Pair(6)
    ids = pair.new(3)                          # [1, 2, 3]; queue [4, 5]
    hashes, contents = _hashes([(1, 2), (3, 4)])
    pair.cache(hashes, contents, ids, 0, 2, HASH_BLOCK, 0)  # 1 and 2 cached, 3 not
    pair.free(ids[::-1])                       # a request frees its tail first
    assert pair.model.state().free_queue == (3, 4, 5, 2, 1)
    pair.check()
    ids = pair.new(2)
    assert ids == [3, 4]
    pair.free(ids, evict_first=True)
    assert pair.model.state().free_queue == (3, 4, 5, 2, 1)
    pair.check()


def test_a_hit_is_touched_out_of_the_queue_and_eviction_forgets_it() -> None:
    pair = Pair(5)
    ids = pair.new(2)
    hashes, contents = _hashes([(1, 2), (3, 4)], salt="s")
    pair.cache(hashes, contents, ids, 0, 2, HASH_BLOCK, 1)
    pair.free(ids[::-1])
    assert pair.lookup(hashes[1], [1]) == [2]
    assert pair.lookup(hashes[1], [0]) is None         # another group
    assert pair.lookup(_hashes([(1, 2), (3, 4)])[0][1], [1]) is None  # no salt
    pair.touch([2])
    assert pair.model.state().free_queue == (3, 4, 1)
    pair.check()
    pair.new(3)                                        # takes 3, 4 and 1: 1 is evicted
    assert pair.lookup(hashes[0], [1]) is None and pair.lookup(hashes[1], [1]) == [2]
    pair.check()
    assert not pair.reset()


def test_duplicates_are_kept_and_the_next_one_promoted() -> None:
    pair = Pair(5)
    hashes, contents = _hashes([(7, 7)])
    first, second = pair.new(1), pair.new(1)
    pair.cache(hashes, contents, first, 0, 1, HASH_BLOCK, 0)
    pair.cache(hashes, contents, second, 0, 1, HASH_BLOCK, 0)
    key = (hashes[0], 0)
    assert pair.model.state().cached[key] == (1, 2) and pair.lookup(hashes[0], [0]) == [1]
    pair.evict(first)
    assert pair.lookup(hashes[0], [0]) == [2]
    pair.check()
    pair.free(first + second)
    assert pair.reset()
    assert pair.lookup(hashes[0], [0]) is None
    pair.check()


def test_a_larger_block_takes_the_last_hash_inside_it() -> None:
    pair = Pair(4)
    ids = pair.new(2)
    hashes, contents = _hashes([(1, 2), (3, 4), (5, 6), (7, 8)])
    pair.cache(hashes, contents, [0] + ids[1:], 0, 2, 2 * HASH_BLOCK, 0)  # null block skipped
    state = pair.model.state()
    assert state.block_keys == {ids[1]: ((hashes[3], 0), 8)}
    pair.check()


def test_a_block_cached_over_fewer_tokens_is_cached_again_further_on() -> None:
    """0.34.0 lets a request cache a block at a later position than it was
    cached at (over more tokens): the old key goes first.  Only over as many
    tokens or fewer is it the mistake ``cache_full_blocks:already-cached``."""
    pair = Pair(5)
    ids = pair.new(2)
    short, short_contents = _hashes([(1, 2)])
    pair.cache(short, short_contents, ids[:1], 0, 1, HASH_BLOCK, 0)
    long, long_contents = _hashes([(0, 0), (1, 2)])
    pair.cache(long, long_contents, [ids[1], ids[0]], 1, 2, HASH_BLOCK, 0)
    assert pair.model.state().block_keys == {ids[0]: ((long[1], 0), 4)}
    assert pair.lookup(short[0], [0]) is None and pair.lookup(long[1], [0]) == ids[:1]
    pair.check()


def _model_mistake(row_key: str, model: V1Model, held: List[int],
                   hashes: List[BlockHash]) -> Callable[[], Any]:
    """The mistake of the v1 error table's row ``row_key``, made on ``model``
    (``held``: its one cached block in use; ``hashes``: a chain of two)."""
    return {
        "get_new_blocks:too-many": lambda: model.get_new_blocks(3),
        "get_new_blocks:negative": lambda: model.get_new_blocks(-1),
        "free_blocks:unreferenced": lambda: model.free_blocks([3]),
        "free_blocks:repeated": lambda: model.free_blocks(held + held),
        "touch:not-cached-free": lambda: model.touch([3]),
        "cache_full_blocks:unreferenced": lambda: model.cache_full_blocks(
            hashes, [3], 0, 1, 2, 0),
        "cache_full_blocks:already-cached": lambda: model.cache_full_blocks(
            hashes, held, 0, 1, 2, 0),
        "cache_full_blocks:too-few-hashes": lambda: model.cache_full_blocks(
            hashes[:1], [1, 2], 1, 2, 2, 0),
        "evict_blocks:unknown-id": lambda: model.evict_blocks([4]),
        "evict_blocks:negative-id": lambda: model.evict_blocks([-1]),
        "get_cached_block:no-groups": lambda: model.get_cached_block(hashes[0], []),
    }[row_key]


@pytest.mark.parametrize("row", V1_ERROR_TABLE, ids=lambda r: r.key)
def test_the_model_refuses_every_mistake_of_the_error_table(row: V1ErrorCase) -> None:
    model = V1Model(4, HASH_BLOCK)
    held = model.get_new_blocks(1)
    hashes, _ = _hashes([(1, 2), (3, 4)])
    model.cache_full_blocks(hashes, held, 0, 1, 2, 0)
    before = model.state()
    with pytest.raises(row.expected) as refused:
        _model_mistake(row.key, model, held, hashes)()
    assert model.state() == before
    assert getattr(refused.value, "row", None) == row.key  # the model names the row


def test_the_model_refuses_other_malformed_calls() -> None:
    model = V1Model(4, HASH_BLOCK)
    ids = model.get_new_blocks(1)
    hashes, _ = _hashes([(1, 2)])
    for mistake in [lambda: model.cache_full_blocks(hashes, ids * 2, 0, 2, 2, 0),
                    lambda: model.cache_full_blocks(hashes, ids, -1, 1, 2, 0),
                    lambda: model.cache_full_blocks(hashes, ids, 0, 1, 3, 0),
                    lambda: model.free_blocks(["x"])]:  # type: ignore[list-item]
        before = model.state()
        with pytest.raises(ValueError):
            mistake()
        assert model.state() == before


def test_the_model_checks_its_own_invariants() -> None:
    model = V1Model(3, HASH_BLOCK)
    model.queue.append(model.queue[0])  # break it from outside
    with pytest.raises(ModelInvariantError):
        model.get_new_blocks(0)


# -- size ---------------------------------------------------------------------------------

def test_the_model_is_less_than_a_third_of_the_pool_it_models() -> None:
    """model/v1_model.py against block_pool.py plus the free queue of kv_cache_utils.py."""
    tree = v1_source_tree() / "vllm" / "v1" / "core"
    pool = code_lines((tree / "block_pool.py").read_text())
    utils = (tree / "kv_cache_utils.py").read_text()
    queue = next(node for node in ast.parse(utils).body if isinstance(node, ast.ClassDef)
                 and node.name == "FreeKVCacheBlockQueue")
    real = pool + code_lines(utils, (queue.lineno, queue.end_lineno or queue.lineno))
    model = code_lines(Path(v1_model.__file__).read_text())
    assert real > 500 and model > 80
    assert 3 * model < real, f"model/v1_model.py has {model} lines of code, the pool {real}"


# -- the differential state machine ------------------------------------------------------

TOKENS = st.tuples(st.integers(0, 2), st.integers(0, 2))


class PoolVersusModel(RuleBasedStateMachine):
    """Random valid calls on the real pool (with ``EDITS``) and the model alike."""

    EDITS: Optional[Edits] = None

    def __init__(self) -> None:
        super().__init__()
        self.pair = Pair(7, self.EDITS)
        self.held: List[int] = []          # one entry per reference the caller holds
        self.seen: List[BlockHash] = []    # every hash made so far
        self.chains: List[List[Tuple[int, ...]]] = []  # every token chain cached so far
        #: (chain, salt, group, scale, k) of every block cached so far: block k of the chain
        self.entries: List[Tuple[List[Tuple[int, ...]], Optional[str], int, int, int]] = []

    @property
    def model(self) -> V1Model:
        return self.pair.model

    @rule(data=st.data())
    def new(self, data: st.DataObject) -> None:
        n = data.draw(st.integers(0, self.model.get_num_free_blocks()), label="n")
        self.held += self.pair.new(n)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), salt=st.sampled_from([None, "a"]), group=st.integers(0, 1),
          scale=st.sampled_from([1, 2]), null=st.booleans())
    def cache(self, data: st.DataObject, salt: Optional[str], group: int, scale: int,
              null: bool) -> None:
        distinct = sorted(set(self.held))
        ids = data.draw(st.permutations(distinct), label="order")
        ids = ([0] if null else []) + ids[:data.draw(st.integers(1, len(ids)), label="len")]
        num_full = data.draw(st.integers(1, len(ids)), label="num_full")
        num_cached = data.draw(st.integers(0, num_full - 1), label="num_cached")
        if any(self.model.key_of.get(i, (None, 0))[1] >= (k + 1) * scale * HASH_BLOCK
               for k, i in enumerate(ids[:num_full]) if k >= num_cached and i != 0):
            return  # caching a block again over as many tokens is a mistake (not made here)
        need = num_full * scale
        # half the time a prefix of an earlier chain: duplicates in the cache
        old = data.draw(st.sampled_from(self.chains), label="reuse") if self.chains \
            and data.draw(st.booleans(), label="reuse?") else []
        blocks = old[:need] + data.draw(st.lists(TOKENS, min_size=max(0, need - len(old)),
                                                 max_size=max(0, need - len(old))),
                                        label="tokens")
        self.chains.append(blocks)
        hashes, contents = _hashes(blocks, salt)
        self.seen += hashes
        self.pair.cache(hashes, contents, ids, num_cached, num_full, scale * HASH_BLOCK, group)
        self.entries += [(blocks, salt, group, scale, k) for k in range(num_cached, num_full)]

    @precondition(lambda self: self.entries and set(self.held) - set(self.model.key_of))
    @rule(data=st.data())
    def duplicate(self, data: st.DataObject) -> None:
        """Cache one more block under a key cached before (a duplicate)."""
        blocks, salt, group, scale, k = data.draw(st.sampled_from(self.entries), label="key")
        block = data.draw(st.sampled_from(sorted(set(self.held) - set(self.model.key_of))),
                          label="block")
        hashes, contents = _hashes(blocks, salt)
        self.pair.cache(hashes, contents, [0] * k + [block], k, k + 1, scale * HASH_BLOCK,
                        group)

    @precondition(lambda self: self.seen)
    @rule(data=st.data(), groups=st.lists(st.integers(0, 1), min_size=1, max_size=2))
    def lookup(self, data: st.DataObject, groups: List[int]) -> None:
        self.pair.lookup(data.draw(st.sampled_from(self.seen), label="hash"), groups)

    @rule(data=st.data())
    def touch(self, data: st.DataObject) -> None:
        allowed = sorted(set(self.held) | set(self.model.key_of) | {0})
        ids = data.draw(st.lists(st.sampled_from(allowed), max_size=3), label="ids")
        self.pair.touch(ids)
        self.held += [i for i in ids if i != 0]

    @precondition(lambda self: self.held)
    @rule(data=st.data(), evict_first=st.booleans())
    def free(self, data: st.DataObject, evict_first: bool) -> None:
        order = data.draw(st.permutations(range(len(self.held))), label="order")
        chosen = order[:data.draw(st.integers(1, len(order)), label="count")]
        ids = [self.held[k] for k in chosen]
        self.held = [i for k, i in enumerate(self.held) if k not in set(chosen)]
        self.pair.free(ids + ([0] if evict_first else []), evict_first)

    @rule(data=st.data())
    def evict(self, data: st.DataObject) -> None:
        cached = st.sampled_from(sorted(self.model.key_of) or [0])
        self.pair.evict(data.draw(st.lists(cached | st.integers(0, 6), max_size=3), label="ids"))

    @rule()
    def reset(self) -> None:
        self.pair.reset()

    @invariant()
    def same_state(self) -> None:
        self.pair.check()


PoolVersusModel.TestCase.settings = settings(
    max_examples=150, stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_the_model_answers_as_the_real_pool = PoolVersusModel.TestCase


#: Single faults planted in the real pool (block_pool.py), each of which the
#: state machine must catch: the comparison is live.
PLANTED: Dict[str, Tuple[str, str]] = {
    "cached blocks freed to the front": (
        "self.free_block_queue.append_n(blocks_to_evict_last)",
        "self.free_block_queue.prepend_n(blocks_to_evict_last)"),
    "a duplicate's removal promotes nothing": (
        "self._cache[key] = next(iter(dup_ids))", "pass"),
    "touch forgets the reference": ("block.ref_cnt += 1\n", "pass\n"),
}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_the_state_machine_catches_a_planted_fault(name: str) -> None:
    machine = type("Planted", (PoolVersusModel,), {
        "EDITS": {"v1/core/block_pool.py": [PLANTED[name]]}})
    case = machine.TestCase
    case.settings = settings(case.settings, max_examples=300, phases=[Phase.generate])
    with pytest.raises(AssertionError):
        case("runTest").runTest()
