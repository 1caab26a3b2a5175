"""bench/vllm_repaired.py: vLLM 0.8.5 with only its latent faults repaired.

For each repair, a small scenario written against the allocators' API shows
the fault on the original vLLM 0.8.5 (``vllm_source.load()``) and its absence
on the repaired copy (``load_repaired()``); both are loaded into this process
under private package names, so Python's string hash (and with it every
content hash) is the same on both sides.  Then vLLM's own 910 block tests pass
on the repaired tree, and short clean campaigns of the oracle
(``--semantics vllm-0.8.5 --no-mistakes``) on the repaired
``PrefixCachingBlockAllocator`` and ``CpuGpuBlockAllocator`` end with exit
code 0 and no finding.  The wheel is fetched once per machine by
prefixcache.oracle.vllm_source; when it cannot be had the tests fail.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any, Callable, List, Tuple

import pytest

from prefixcache.oracle import vllm_source

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"


def _bench_module(name: str) -> Any:
    """bench/<name>.py, imported under a private name."""
    spec = importlib.util.spec_from_file_location(f"prefixcache_bench_{name}",
                                                  BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


repaired = _bench_module("vllm_repaired")
block_tests = _bench_module("vllm_block_tests")

ORIGINAL = vllm_source.load()
REPAIRED = repaired.load_repaired()
Ref = types.SimpleNamespace


def prefix(ref: Ref, num_blocks: int, block_size: int) -> Any:
    return ref.prefix_caching_block.PrefixCachingBlockAllocator(num_blocks=num_blocks,
                                                                 block_size=block_size)


def naive(ref: Ref, num_blocks: int, block_size: int) -> Any:
    return ref.naive_block.NaiveBlockAllocator(create_block=ref.naive_block.NaiveBlock,
                                               num_blocks=num_blocks, block_size=block_size)


def pair(ref: Ref, kind: str, gpu: int, cpu: int, block_size: int) -> Any:
    return ref.cpu_gpu_block_allocator.CpuGpuBlockAllocator.create(kind, gpu, cpu, block_size)


def outcome(scenario: Callable[[Ref], Any], ref: Ref) -> Any:
    """What ``scenario(ref)`` returns, or the class name of what it raised."""
    try:
        return scenario(ref)
    except Exception as exc:  # noqa: BLE001 - the exception is the observation
        return type(exc).__name__


def original_and_repaired(scenario: Callable[[Ref], Any]) -> Tuple[Any, Any]:
    return outcome(scenario, ORIGINAL), outcome(scenario, REPAIRED)


# -- the repairs, one fault each --------------------------------------------------------

def test_the_repairs_are_named_and_merged_in_order() -> None:
    names = [r.name for r in repaired.REPAIRS]
    assert len(set(names)) == len(names)
    for r in repaired.REPAIRS:
        assert r.edits and r.why and "\n" not in r.why
        assert all(old.rstrip("\n").count("\n") <= 1 for old, _ in r.edits)  # a line or two
    for path, edits in repaired.EDITS.items():
        assert list(edits) == [e for r in repaired.REPAIRS if r.path == path for e in r.edits]
    assert (repaired.repaired_tree() / "vllm" / repaired.EVICTOR).is_file()


def test_evictor_update_keeps_the_entry_in_the_heap() -> None:
    """vLLM: an entry updated while evictable drops out of the heap, so
    evict() finds nothing although num_blocks is 1."""
    def scenario(ref: Ref) -> Any:
        evictor = ref.evictor.LRUEvictor()
        evictor.add(0, 100, 1, 0)
        evictor.update(0, 5)
        return evictor.num_blocks, evictor.evict()

    assert original_and_repaired(scenario) == ("ValueError", (1, (0, 100)))


def test_evictor_evicts_in_the_documented_order_after_an_update() -> None:
    def scenario(ref: Ref) -> Any:
        evictor = ref.evictor.LRUEvictor()
        evictor.add(0, 100, 1, 1)
        evictor.add(1, 101, 1, 3)
        evictor.update(0, 2)  # still older than id 1
        return evictor.evict()

    assert original_and_repaired(scenario) == ((1, 101), (0, 100))


def test_evictor_ignores_a_stale_entry_with_the_same_timestamp() -> None:
    """An id removed and added again with other content: vLLM pops the
    stale entry (deeper, so first) and returns the old content hash."""
    def scenario(ref: Ref) -> Any:
        evictor = ref.evictor.LRUEvictor()
        evictor.add(0, 100, 2, -1)
        evictor.remove(0)
        evictor.add(0, 200, 1, -1)
        return evictor.evict()

    assert original_and_repaired(scenario) == ((0, 100), (0, 200))


def test_find_cached_blocks_prefix_is_the_longest_cached_prefix() -> None:
    """The evictor takes the first block of a chain before the second (it
    was accessed earlier): vLLM's bisection still reports both."""
    def scenario(ref: Ref) -> Any:
        alloc = prefix(ref, 3, 1)
        chain = alloc.allocate_immutable_blocks(None, [[0], [1]])
        hashes = [b.content_hash for b in chain]
        alloc.mark_blocks_as_computed([])
        alloc.mark_blocks_as_accessed([1], 3)
        for block in chain:
            alloc.free(block)
        alloc.allocate_mutable_block(None)
        alloc.allocate_mutable_block(None)  # evicts id 0
        return len(alloc.find_cached_blocks_prefix(hashes))

    assert original_and_repaired(scenario) == (2, 0)


def test_get_common_computed_block_ids_always_returns_a_list() -> None:
    def scenario(ref: Ref) -> Any:
        alloc = prefix(ref, 2, 1)
        return (alloc.get_common_computed_block_ids([[], []]),
                alloc.get_common_computed_block_ids([[0, 1], [0, 2]]),
                alloc.get_common_computed_block_ids([[4]]))

    assert original_and_repaired(scenario) == (("", [0], [4]), ([], [0], [4]))


def test_allocate_immutable_blocks_is_all_or_nothing_and_counts_as_vllm() -> None:
    """The first block hits, the second misses onto the last id, the third
    finds none: vLLM keeps the hit's reference and the second id; the
    repaired copy takes nothing, and counts the same three queries."""
    def scenario(ref: Ref) -> Any:
        alloc = prefix(ref, 2, 1)
        held = alloc.allocate_immutable_block(None, [0])
        try:
            alloc.allocate_immutable_blocks(None, [[0], [1], [2]])
        except ref.interfaces.BlockAllocator.NoFreeBlocksError:
            pass
        return (alloc.get_num_free_blocks(), alloc._refcounter.get(held.block_id),
                alloc.get_prefix_cache_hit_rate())

    hit_rate = 1 / 4  # the held block's miss, then a hit and two misses
    assert original_and_repaired(scenario) == ((0, 2, hit_rate), (1, 1, hit_rate))


@pytest.mark.parametrize("make", [prefix, naive])
def test_swap_in_is_all_or_nothing(make: Callable[..., Any]) -> None:
    """Two swapped-out blocks, one free id: vLLM attaches the first."""
    def scenario(ref: Ref) -> Any:
        alloc = make(ref, 2, 2)
        blocks = [alloc.allocate_mutable_block(None) for _ in range(2)]
        alloc.swap_out(blocks)
        alloc.allocate_mutable_block(None)
        try:
            alloc.swap_in(blocks)
        except ref.interfaces.BlockAllocator.NoFreeBlocksError:
            pass
        return [b.block_id for b in blocks], alloc.get_num_free_blocks()

    assert original_and_repaired(scenario) == (([0, None], 0), ([None, None], 1))


def test_naive_allocate_immutable_blocks_is_all_or_nothing() -> None:
    def scenario(ref: Ref) -> Any:
        alloc = naive(ref, 2, 1)
        try:
            alloc.allocate_immutable_blocks(None, [[0], [1], [2]])
        except ref.interfaces.BlockAllocator.NoFreeBlocksError:
            pass
        return alloc.get_num_free_blocks()

    assert original_and_repaired(scenario) == (0, 2)


def test_a_device_swap_that_cannot_fit_moves_nothing() -> None:
    def scenario(ref: Ref) -> Any:
        gpu = ref.Device.GPU
        alloc = pair(ref, "prefix_caching", 2, 1, 1)
        blocks = [alloc.allocate_mutable_block(None, device=gpu) for _ in range(2)]
        try:
            alloc.swap(blocks, gpu, ref.Device.CPU)
        except ref.interfaces.BlockAllocator.NoFreeBlocksError:
            pass
        return [b.block_id for b in blocks], alloc.get_num_free_blocks(gpu)

    assert original_and_repaired(scenario) == (([2, None], 2), ([0, 1], 0))


@pytest.mark.parametrize("make", [prefix, naive])
@pytest.mark.parametrize("how", ["append", "cow"])
def test_a_refused_copy_on_write_leaves_the_block_as_it_was(make: Callable[..., Any],
                                                            how: str) -> None:
    """A shared block and no free id: vLLM detaches the block (and an append
    keeps its tokens); the repaired copy changes nothing."""
    def scenario(ref: Ref) -> Any:
        alloc = make(ref, 1, 2)
        block = alloc.allocate_mutable_block(None)
        block.append_token_ids([0])
        alloc.fork(block)
        try:
            if how == "append":
                block.append_token_ids([1])
            else:
                alloc.cow_block_if_not_appendable(block)
        except ref.interfaces.BlockAllocator.NoFreeBlocksError:
            return block.block_id, list(block.token_ids)
        return "no refusal"

    kept = [0, 1] if how == "append" else [0]
    assert original_and_repaired(scenario) == ((None, kept), (0, [0]))


def test_a_full_block_after_a_partial_one_has_no_hash_and_shares_nothing() -> None:
    """vLLM hashes such a block with a None parent, so two of them after
    different partial blocks share an id."""
    def scenario(ref: Ref) -> Any:
        alloc = prefix(ref, 4, 2)
        tails = []
        for first in ([0], [5]):
            head = alloc.allocate_mutable_block(None)
            head.append_token_ids(first)
            tail = alloc.allocate_mutable_block(head)
            tail.append_token_ids([1, 2])
            tails.append(tail)
        return (tails[0].block_id == tails[1].block_id, tails[0].content_hash is None,
                alloc.get_num_full_blocks_touched(tails))

    assert original_and_repaired(scenario) == ((True, False, 0), (False, True, 2))


def test_fork_walks_a_chain_longer_than_the_recursion_limit() -> None:
    length = sys.getrecursionlimit() + 50

    def scenario(ref: Ref) -> Any:
        alloc = prefix(ref, length, 1)
        chain = alloc.allocate_immutable_blocks(None, [[0]] * length)
        return len(alloc.fork(chain[-1]))

    assert original_and_repaired(scenario) == ("RecursionError", length)


def test_a_long_unhashed_chain_hashes_without_recursion() -> None:
    """Blocks made by the factory (as fork makes them) hash lazily; the last
    of a long chain asks every earlier one.  Short chains hash alike."""
    def chain_hash(length: int) -> Callable[[Ref], Any]:
        def scenario(ref: Ref) -> Any:
            alloc = prefix(ref, 1, 1)
            block = None
            for token in range(length):
                block = ref.prefix_caching_block.PrefixCachingBlock(
                    prev_block=block, token_ids=[token % 3], block_size=1, allocator=alloc)
            assert block is not None
            return block.content_hash
        return scenario

    short = original_and_repaired(chain_hash(5))
    assert isinstance(short[0], int) and short[0] == short[1]
    long = original_and_repaired(chain_hash(sys.getrecursionlimit() + 50))
    assert long[0] == "RecursionError" and isinstance(long[1], int)


@pytest.mark.parametrize("reset", [False, True])
def test_an_evicted_id_is_no_longer_touched(reset: bool) -> None:
    """A promoted id is evicted (or the cache reset) before the batch is
    marked computed: vLLM then marks whatever reuses the id computed, so a
    block promoted after that counts as cached before it ever ran."""
    def scenario(ref: Ref) -> Any:
        alloc = prefix(ref, 1, 1)
        alloc.free(alloc.allocate_immutable_block(None, [0]))
        if reset:
            assert alloc.reset_prefix_cache()
        block = alloc.allocate_mutable_block(None)  # evicts id 0 (or takes it free)
        alloc.mark_blocks_as_computed([])
        block.append_token_ids([5])  # promoted, not computed yet
        return len(alloc.find_cached_blocks_prefix([block.content_hash]))

    assert original_and_repaired(scenario) == (1, 0)


def test_a_pooled_block_swapped_away_returns_to_its_own_pool() -> None:
    """A GPU pool's Block freed by the CPU allocator: vLLM puts its GPU pool
    index into the CPU pool, which later indexes past its end."""
    def scenario(ref: Ref) -> Any:
        gpu, cpu = ref.Device.GPU, ref.Device.CPU
        alloc = pair(ref, "prefix_caching", 6, 1, 1)
        first = alloc.allocate_immutable_blocks(None, [[0], [0]], device=gpu)
        second = alloc.allocate_immutable_blocks(None, [[0], [0]], device=gpu)
        moved = alloc.allocate_mutable_block(None, device=gpu)  # GPU pool slot 4
        for block in second + first:
            alloc.free(block)
        alloc.swap([moved], gpu, cpu)
        alloc.free(moved)
        block = alloc.allocate_immutable_block(None, [0], device=gpu)
        return sorted(alloc.swap([block], gpu, cpu).values())

    assert original_and_repaired(scenario) == ("IndexError", [6])


@pytest.mark.parametrize("kind", ["prefix_caching", "naive"])
def test_a_swapped_block_belongs_to_the_allocator_that_holds_it(kind: str) -> None:
    """A Block born on the CPU, swapped to the GPU, forked there and
    appended to: vLLM asks the CPU allocator about the GPU id (an assert)."""
    def scenario(ref: Ref) -> Any:
        gpu, cpu = ref.Device.GPU, ref.Device.CPU
        alloc = pair(ref, kind, 3, 2, 2)
        block = alloc.allocate_mutable_block(None, device=cpu)
        block.append_token_ids([0])
        alloc.swap([block], cpu, gpu)
        alloc.fork(block)
        block.append_token_ids([1])  # a copy-on-write on the GPU
        return alloc.clear_copy_on_writes(), alloc.get_num_free_blocks(gpu)

    assert original_and_repaired(scenario) == ("AssertionError", ([(0, 1)], 1))


def test_the_module_exposes_the_repaired_classes() -> None:
    module = REPAIRED.prefix_caching_block
    assert repaired.PrefixCachingBlockAllocator is module.PrefixCachingBlockAllocator
    assert repaired.CpuGpuBlockAllocator is \
        REPAIRED.cpu_gpu_block_allocator.CpuGpuBlockAllocator
    assert repaired.NaiveBlockAllocator is REPAIRED.naive_block.NaiveBlockAllocator
    with pytest.raises(AttributeError):
        repaired.NoSuchAllocator  # noqa: B018


def test_the_command_line_prints_the_tree_and_the_repairs() -> None:
    script = str(BENCH / "vllm_repaired.py")
    tree = subprocess.run([sys.executable, script, "--tree"], capture_output=True, text=True)
    assert tree.returncode == 0 and Path(tree.stdout.strip()) == repaired.repaired_tree()
    listed = subprocess.run([sys.executable, script, "--list"], capture_output=True, text=True)
    assert listed.returncode == 0
    assert all(r.name in listed.stdout for r in repaired.REPAIRS)


# -- vLLM's own tests and the oracle ------------------------------------------------------

def test_vllms_block_tests_all_pass_on_the_repaired_tree() -> None:
    result = block_tests.run_block_tests(repaired.repaired_tree())
    tail = result.output[-4000:]
    assert result.collected == 910, tail
    assert result.failures == () and result.ok, tail


def _campaign(target: str, tmp_path: Path, *options: str) -> Tuple[int, Any, str]:
    """A campaign of the oracle on the repaired ``target`` by vLLM's
    semantics: its exit code, its JSON report and its output."""
    env = dict(os.environ)
    env.pop("CI", None)
    cmd = [sys.executable, "-m", "prefixcache.cli", "fuzz", "--target",
           f"prefixcache.bench.vllm_repaired:{target}", "--semantics", "vllm-0.8.5",
           *options, "--quiet", "--json", "report.json"]
    result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    report = json.loads((tmp_path / "report.json").read_text())
    return result.returncode, report, result.stdout[-4000:] + result.stderr[-4000:]


@pytest.mark.parametrize("target", ["PrefixCachingBlockAllocator", "CpuGpuBlockAllocator"])
def test_a_clean_campaign_by_vllms_semantics(target: str, tmp_path: Path) -> None:
    code, report, output = _campaign(target, tmp_path, "--no-mistakes", "--seconds", "15")
    assert code == 0, output
    findings: List[Any] = report["findings"]
    assert findings == [] and report["steps"] > 0


def test_with_caller_mistakes_only_robustness_findings(tmp_path: Path) -> None:
    """With mistakes on, the repaired vLLM is judged only for accepting them
    (or changing something when it refuses): no conformance, invariant,
    integrity or crash finding, so nothing that vLLM's API allows."""
    code, report, output = _campaign("PrefixCachingBlockAllocator", tmp_path, "--seconds",
                                     "20", "--seed", "4711", "--max-findings", "300")
    categories = {f["category"] for f in report["findings"]}
    assert code == 1 and categories == {"robustness"}, output
