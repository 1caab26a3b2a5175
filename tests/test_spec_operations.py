"""The table of operations (spec/operations.py) is the API: every row's
arguments are the parameters of prefixcache.impl's classes and of vLLM
0.8.5's own, kind by kind, and every public method of those classes that the
spec covers is a row."""

from __future__ import annotations

import inspect
from typing import Any, Dict

import pytest

from prefixcache.impl.cpu_gpu_block_allocator import CpuGpuBlockAllocator
from prefixcache.impl.naive_block import NaiveBlock, NaiveBlockAllocator
from prefixcache.impl.prefix_caching_block import PrefixCachingBlock, PrefixCachingBlockAllocator
from prefixcache.oracle import vllm_source
from prefixcache.spec.error_table import CPU_GPU, NAIVE, PREFIX
from prefixcache.spec.operations import OPERATIONS, missing, names_for

IMPL: Dict[str, Any] = {PREFIX: (PrefixCachingBlockAllocator, PrefixCachingBlock),
                        NAIVE: (NaiveBlockAllocator, NaiveBlock),
                        CPU_GPU: (CpuGpuBlockAllocator, PrefixCachingBlock)}


def _check(classes: Dict[str, Any], optional_too: bool) -> None:
    for kind, (allocator, block) in classes.items():
        for op in OPERATIONS:
            if kind not in op.allocators or not (op.required or optional_too):
                continue
            member = inspect.getattr_static(block if op.owner == "Block" else allocator,
                                            op.name, None)
            assert member is not None, (kind, op.name)
            if op.attribute:
                assert isinstance(member, property), (kind, op.name)
                continue
            params = set(inspect.signature(member).parameters) - {"self"}
            assert params == {a.name for a in op.args_for(kind)}, (kind, op.name, params)


def test_the_table_is_prefixcache_impls_api() -> None:
    _check(IMPL, optional_too=True)
    for kind, (allocator, _) in IMPL.items():
        assert missing(allocator, kind) == []


def test_the_table_is_vllm_0_8_5s_api() -> None:
    try:
        ref = vllm_source.load()
    except vllm_source.VllmSourceError as exc:  # pragma: no cover - offline machine
        pytest.fail(f"vLLM 0.8.5 could not be obtained: {exc}")
    pcb, naive, cpu_gpu = ref.prefix_caching_block, ref.naive_block, ref.cpu_gpu_block_allocator
    _check({PREFIX: (pcb.PrefixCachingBlockAllocator, pcb.PrefixCachingBlock),
            NAIVE: (naive.NaiveBlockAllocator, naive.NaiveBlock),
            CPU_GPU: (cpu_gpu.CpuGpuBlockAllocator, pcb.PrefixCachingBlock)},
           optional_too=True)


def test_what_an_allocator_lacks_is_named() -> None:
    class Half:
        def allocate_mutable_block(self) -> None: ...

    lacking = missing(Half, PREFIX)
    assert "allocate_mutable_block" not in lacking
    assert "free" in lacking and "block_is_computed" not in lacking  # not the interface's
    assert set(lacking) < set(names_for(PREFIX))


def test_the_benchmark_and_the_error_table_name_only_operations_of_the_table() -> None:
    from prefixcache.bench.replayer import CALL_NAMES
    from prefixcache.spec.error_table import operations as error_operations

    names = {op.name for op in OPERATIONS}
    assert set(CALL_NAMES) <= names
    components = {"__init__", "create", "make_evictor"}  # constructors
    assert {op for op in error_operations()
            if "." not in op and op not in components} <= names
