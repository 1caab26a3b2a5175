"""prefixcache.impl.interfaces: the abstract surface is exactly vLLM 0.8.5's."""

from __future__ import annotations

import pytest

from prefixcache.impl.cpu_gpu_block_allocator import CpuGpuBlockAllocator, NullBlock
from prefixcache.impl.errors import NoFreeBlocksError
from prefixcache.impl.interfaces import (
    Block,
    BlockAllocator,
    BlockId,
    Device,
    DeviceAwareBlockAllocator,
)
from prefixcache.impl.naive_block import NaiveBlock, NaiveBlockAllocator
from prefixcache.impl.prefix_caching_block import PrefixCachingBlock, PrefixCachingBlockAllocator


def test_device_enum_and_block_id_alias() -> None:
    assert [d.name for d in Device] == ["GPU", "CPU"]
    assert BlockId is int


def test_block_declares_exactly_vllms_abstract_members() -> None:
    assert Block.__abstractmethods__ == frozenset({
        "append_token_ids", "block_id", "token_ids", "num_tokens_total", "num_empty_slots",
        "is_full", "prev_block", "extra_hash", "computed", "last_accessed", "content_hash",
    })
    assert hasattr(Block, "Factory")
    with pytest.raises(TypeError):
        Block()  # type: ignore[abstract]


def test_block_allocator_abstract_methods() -> None:
    assert BlockAllocator.__abstractmethods__ == frozenset({
        "allocate_mutable_block", "allocate_immutable_block", "allocate_immutable_blocks",
        "free", "fork", "get_num_total_blocks", "get_num_free_blocks", "get_physical_block_id",
        "swap_out", "swap_in", "all_block_ids", "clear_copy_on_writes",
        "mark_blocks_as_accessed", "mark_blocks_as_computed", "get_common_computed_block_ids",
        "cow_block_if_not_appendable", "promote_to_immutable_block",
        "get_num_full_blocks_touched", "get_prefix_cache_hit_rate", "reset_prefix_cache",
        "find_cached_blocks_prefix",
    })
    assert BlockAllocator.NoFreeBlocksError is NoFreeBlocksError
    assert issubclass(BlockAllocator.NoFreeBlocksError, ValueError)


def test_device_aware_allocator_abstract_methods() -> None:
    assert DeviceAwareBlockAllocator.__abstractmethods__ == frozenset({
        "allocate_mutable_block", "allocate_immutable_block", "allocate_immutable_blocks",
        "get_num_free_blocks", "get_num_total_blocks", "free", "fork", "all_block_ids",
        "clear_copy_on_writes", "mark_blocks_as_accessed", "mark_blocks_as_computed",
        "get_common_computed_block_ids", "get_num_full_blocks_touched", "swap",
        "get_physical_block_id", "allocate_or_get_null_block", "get_prefix_cache_hit_rate",
        "reset_prefix_cache", "find_cached_blocks_prefix",
    })


def test_concrete_classes_implement_everything() -> None:
    for cls in (NaiveBlock, PrefixCachingBlock, NullBlock, NaiveBlockAllocator,
                PrefixCachingBlockAllocator, CpuGpuBlockAllocator):
        assert not getattr(cls, "__abstractmethods__", frozenset()), cls
    assert issubclass(NaiveBlockAllocator, BlockAllocator)
    assert issubclass(PrefixCachingBlockAllocator, BlockAllocator)
    assert issubclass(CpuGpuBlockAllocator, DeviceAwareBlockAllocator)
