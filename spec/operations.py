"""The operations of the allocator API, and which allocators have them.

One row per public operation of vLLM 0.8.5's block allocators (the
``BlockAllocator`` and ``DeviceAwareBlockAllocator`` interfaces): its name
and the kinds of allocator that offer it (``prefix_caching``, ``naive``,
``cpu_gpu``, as in the error table).  :func:`missing` tells what an object
lacks to be an allocator of a kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

from .error_table import ALL, BOTH, CPU_GPU


@dataclass(frozen=True)
class Operation:
    """One public operation: its name and the allocators that have it."""

    name: str
    allocators: Tuple[str, ...] = ALL


OPERATIONS: Tuple[Operation, ...] = (
    Operation("allocate_mutable_block"),
    Operation("allocate_immutable_block"),
    Operation("allocate_immutable_blocks"),
    Operation("free"),
    Operation("fork"),
    Operation("get_num_total_blocks"),
    Operation("get_num_free_blocks"),
    Operation("get_physical_block_id"),
    Operation("all_block_ids"),
    Operation("clear_copy_on_writes"),
    Operation("mark_blocks_as_accessed"),
    Operation("mark_blocks_as_computed"),
    Operation("get_common_computed_block_ids"),
    Operation("get_num_full_blocks_touched"),
    Operation("get_prefix_cache_hit_rate"),
    Operation("reset_prefix_cache"),
    Operation("find_cached_blocks_prefix"),
    Operation("swap_out", BOTH),
    Operation("swap_in", BOTH),
    Operation("cow_block_if_not_appendable", BOTH),
    Operation("promote_to_immutable_block", BOTH),
    Operation("swap", (CPU_GPU,)),
    Operation("allocate_or_get_null_block", (CPU_GPU,)),
)
"""Every public operation, in API order."""


def names_for(allocator: str) -> List[str]:
    """The operations an allocator of kind ``allocator`` has."""
    return [op.name for op in OPERATIONS if allocator in op.allocators]


def missing(obj: object, allocator: str) -> List[str]:
    """The operations of kind ``allocator`` that ``obj`` (a class or an
    instance) does not have."""
    return [name for name in names_for(allocator) if not hasattr(obj, name)]
