"""Production traces: record through the wrapper, judge offline."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, List

from helpers.oracle_faults import FreesToTheRight

from prefixcache.bench.replayer import plan
from prefixcache.bench.workload import WorkloadConfig
from prefixcache.impl import errors as err
from prefixcache.impl.cpu_gpu_block_allocator import CpuGpuBlockAllocator
from prefixcache.impl.interfaces import Device
from prefixcache.impl.prefix_caching_block import PrefixCachingBlock, PrefixCachingBlockAllocator
from prefixcache.oracle.recorder import RecordingAllocator
from prefixcache.oracle.replay import replay
from prefixcache.oracle.targets import resolve_target
from prefixcache.oracle.trace import Trace
from prefixcache.spec.semantics import PRESETS


def serve(alloc: Any, block_size: int, seed: int, rounds: int = 60) -> None:
    """A little engine: prompts that share a system prompt, decode appends,
    forks, preemption by freeing, access marks, cache queries."""
    rng = random.Random(seed)
    system = [7] * (2 * block_size)
    running: List[List[Any]] = []
    now = 0.0
    for _ in range(rounds):
        now += 1
        choice = rng.random()
        if choice < 0.3 or not running:
            prompt = system[: rng.choice([0, block_size, 2 * block_size])] + [
                rng.randrange(3) for _ in range(rng.randrange(1, 2 * block_size))]
            full = [prompt[i:i + block_size]
                    for i in range(0, len(prompt) - block_size + 1, block_size)]
            try:
                blocks = alloc.allocate_immutable_blocks(None, full) if full else []
                tail = prompt[len(full) * block_size:]
                if tail:
                    last = alloc.allocate_mutable_block(blocks[-1] if blocks else None)
                    last.append_token_ids(tail)
                    blocks.append(last)
            except err.NoFreeBlocksError:
                continue
            if blocks:
                running.append(blocks)
        elif choice < 0.7:
            seq = rng.choice(running)
            try:
                if seq[-1].is_full:
                    seq.append(alloc.allocate_mutable_block(seq[-1]))
                seq[-1].append_token_ids([rng.randrange(3)])
            except err.NoFreeBlocksError:
                pass
        elif choice < 0.8:
            seq = rng.choice(running)
            running.append(alloc.fork(seq[-1]))
        else:
            seq = running.pop(rng.randrange(len(running)))
            alloc.mark_blocks_as_accessed([b.block_id for b in seq], now)
            for block in seq:
                alloc.free(block)
            alloc.mark_blocks_as_computed([])
        alloc.get_num_free_blocks()
    alloc.get_prefix_cache_hit_rate()
    alloc.clear_copy_on_writes()


def record(allocator: Any, seed: int) -> Trace:
    recorder = RecordingAllocator(allocator, num_blocks=8, block_size=2)
    serve(recorder, 2, seed)
    return recorder.trace


def test_a_recorded_run_of_the_impl_replays_clean_offline(tmp_path: Path) -> None:
    trace = record(PrefixCachingBlockAllocator(num_blocks=8, block_size=2), seed=3)
    assert len(trace.steps) > 60
    assert all(step.expect is not None for step in trace.steps)
    assert any(step.op == "append_token_ids" for step in trace.steps)
    path = tmp_path / "recorded.json"
    trace.save(path)
    result = replay(Trace.load(path))
    assert result.violation is None
    assert result.steps_run == len(trace.steps)


def test_a_tampered_recording_is_caught(tmp_path: Path) -> None:
    trace = record(PrefixCachingBlockAllocator(num_blocks=8, block_size=2), seed=3)
    step = next(s for s in trace.steps if s.op == "allocate_mutable_block" and s.expect)
    name = step.out[0]
    step.expect["ids"][name] = (step.expect["ids"][name] + 1) % 8  # type: ignore[index]
    result = replay(Trace.from_json(trace.to_json()))
    assert result.violation is not None
    assert result.violation.category in ("conformance", "integrity")


def test_a_recording_of_a_faulty_allocator_is_caught() -> None:
    result = replay(record(FreesToTheRight(num_blocks=8, block_size=2), seed=5))
    assert result.violation is not None
    assert result.violation.category == "conformance"


def test_a_device_pair_recording_replays_clean() -> None:
    pair = CpuGpuBlockAllocator.create("prefix_caching", 4, 4, 2)
    recorder = RecordingAllocator(pair, num_blocks=4, block_size=2, kind="cpu_gpu")
    blocks = recorder.allocate_immutable_blocks(None, [[1, 2], [3, 4]], Device.GPU)
    tail = recorder.allocate_mutable_block(blocks[-1], Device.GPU)
    tail.append_token_ids([5])
    recorder.swap(blocks + [tail], Device.GPU, Device.CPU)
    recorder.swap(blocks + [tail], Device.CPU, Device.GPU)
    recorder.get_and_reset_swaps()
    for block in blocks + [tail]:
        recorder.free(block)
    assert replay(recorder.trace).violation is None


def test_a_query_about_content_never_cached_replays_clean() -> None:
    """An engine hashes a prompt and asks how much of it is cached before
    it allocates: the hashes of recorded Blocks are recorded by the Blocks'
    names, the new one as ``{"hash": ...}``; the replay holds the answer
    against the model, and a tampered answer is caught.  Hash lists of the
    wrong shape are recorded and replayed as the caller's mistakes they are."""
    recorder = RecordingAllocator(PrefixCachingBlockAllocator(num_blocks=8, block_size=2),
                                  num_blocks=8, block_size=2)
    first, second = recorder.allocate_immutable_blocks(None, [[1, 2], [3, 4]])
    recorder.mark_blocks_as_computed([])
    new = PrefixCachingBlock.hash_block_tokens(False, second.content_hash, [5, 6], None)
    found = recorder.find_cached_blocks_prefix([first.content_hash, second.content_hash, new])
    assert len(found) == 2
    step = recorder.trace.steps[-1]
    assert step.args == {"names": [first._name, second._name, {"hash": new}]}
    assert replay(Trace.from_json(recorder.trace.to_json())).violation is None
    step.expect["result"] = [first.content_hash]  # type: ignore[index]
    result = replay(Trace.from_json(recorder.trace.to_json()))
    assert result.violation is not None
    assert result.violation.signature == "conformance/find_cached_blocks_prefix/result"
    for odd in (None, "b0", [[1]], ["b0", None, 1.5]):
        recorder = RecordingAllocator(PrefixCachingBlockAllocator(num_blocks=4, block_size=2),
                                      num_blocks=4, block_size=2)
        try:
            recorder.find_cached_blocks_prefix(odd)
        except err.WrongTypeError:
            pass
        assert replay(Trace.from_json(recorder.trace.to_json())).violation is None, odd


def test_vllms_allocator_recorded_serving_a_workload_replays_clean() -> None:
    """vLLM 0.8.5's allocator, repaired, recorded while the benchmark's
    scheduler serves a workload on it (cache queries, forks, preemptions),
    replays clean by vLLM's rules: the recorder and the replay raise no
    false alarm on real code."""
    target = resolve_target("prefixcache.bench.vllm_repaired:PrefixCachingBlockAllocator")
    recorders: List[RecordingAllocator] = []

    def make(num_blocks: int, block_size: int) -> RecordingAllocator:
        recorders.append(RecordingAllocator(target.make(num_blocks, block_size),
                                            num_blocks=num_blocks, block_size=block_size))
        return recorders[-1]

    plan(WorkloadConfig(num_blocks=64, num_requests=16), make_allocator=make)
    trace = recorders[0].trace
    assert {"find_cached_blocks_prefix", "fork", "free"} <= {step.op for step in trace.steps}
    result = replay(Trace.from_json(trace.to_json()), semantics=PRESETS["vllm-0.8.5"])
    assert result.violation is None, result.violation
    assert result.steps_run == len(trace.steps)
