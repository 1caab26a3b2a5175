"""A GPU allocator and a CPU allocator behind one interface (vLLM's
``cpu_gpu_block_allocator``): calls are routed by device, or by the id a
Block holds; ``swap`` moves blocks between the two."""

from __future__ import annotations

from typing import Dict, FrozenSet, List, Optional, Tuple

from .common import check_blocks
from .errors import (
    DetachedBlockError,
    InvalidArgumentError,
    NullBlockWriteError,
    UnknownBlockIdError,
    WrongTypeError,
)
from .hashing import HashAlgo, HashFunction
from .interfaces import Block, BlockAllocator, BlockId, Device, DeviceAwareBlockAllocator
from .naive_block import NaiveBlock, NaiveBlockAllocator
from .prefix_caching_block import PrefixCachingBlock, PrefixCachingBlockAllocator

#: The Block classes the allocators hand out: Blocks, and not NullBlocks.  The
#: type tests below try them first, as an isinstance against the Block ABC
#: that is not an exact match costs an ABC check.
_PLAIN_BLOCKS = (PrefixCachingBlock, NaiveBlock)


class CpuGpuBlockAllocator(DeviceAwareBlockAllocator):
    """Routes each call to the GPU or the CPU allocator.

    ``_allocators`` (device -> allocator, CPU first) is read by vLLM's tests.
    Copy-on-writes, access times, computed flags and common-prefix queries
    always go to the GPU allocator."""

    @staticmethod
    def create(
        allocator_type: str,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        block_size: int,
        *,
        hash_algo: HashAlgo = "builtin",
        verify_content: bool = False,
    ) -> DeviceAwareBlockAllocator:
        """A pair of ``"naive"`` or ``"prefix_caching"`` allocators: GPU ids
        ``0..num_gpu_blocks-1``, then the CPU ids.  ``hash_algo`` and
        ``verify_content`` apply to both prefix-caching allocators, so a
        swapped block keeps its hash."""
        for name, value in (("num_gpu_blocks", num_gpu_blocks),
                            ("num_cpu_blocks", num_cpu_blocks)):
            if type(value) is not int or value < 0:
                raise InvalidArgumentError(f"{name} must be an int >= 0, got {value!r}")
        gpu_block_ids = range(num_gpu_blocks)
        cpu_block_ids = range(num_gpu_blocks, num_gpu_blocks + num_cpu_blocks)
        gpu_allocator: BlockAllocator
        cpu_allocator: BlockAllocator
        if allocator_type == "naive":
            gpu_allocator = NaiveBlockAllocator(
                create_block=NaiveBlock, num_blocks=num_gpu_blocks, block_size=block_size,
                block_ids=gpu_block_ids,
            )
            cpu_allocator = NaiveBlockAllocator(
                create_block=NaiveBlock, num_blocks=num_cpu_blocks, block_size=block_size,
                block_ids=cpu_block_ids,
            )
        elif allocator_type == "prefix_caching":
            gpu_allocator = PrefixCachingBlockAllocator(
                num_blocks=num_gpu_blocks, block_size=block_size, block_ids=gpu_block_ids,
                hash_algo=hash_algo, verify_content=verify_content,
            )
            cpu_allocator = PrefixCachingBlockAllocator(
                num_blocks=num_cpu_blocks, block_size=block_size, block_ids=cpu_block_ids,
                hash_algo=hash_algo, verify_content=verify_content,
            )
        else:
            raise InvalidArgumentError(f"Unknown allocator type {allocator_type=}")
        return CpuGpuBlockAllocator(cpu_block_allocator=cpu_allocator,
                                    gpu_block_allocator=gpu_allocator)

    def __init__(self, cpu_block_allocator: BlockAllocator,
                 gpu_block_allocator: BlockAllocator) -> None:
        for name, value in (("cpu_block_allocator", cpu_block_allocator),
                            ("gpu_block_allocator", gpu_block_allocator)):
            if not isinstance(getattr(value, "all_block_ids", None), frozenset):
                raise WrongTypeError(f"{name} must be a block allocator, got {value!r}")
        overlap = cpu_block_allocator.all_block_ids & gpu_block_allocator.all_block_ids
        if overlap:
            raise InvalidArgumentError(
                f"cpu and gpu block allocators can't have intersection of block ids: "
                f"{sorted(overlap)[:8]}"
            )
        self._allocators: Dict[Device, BlockAllocator] = {
            Device.CPU: cpu_block_allocator,
            Device.GPU: gpu_block_allocator,
        }
        self._swap_mapping: Dict[int, int] = {}
        self._null_block: Optional[Block] = None
        self._block_ids_to_allocator: Dict[int, BlockAllocator] = {}
        for allocator in self._allocators.values():
            for block_id in allocator.all_block_ids:
                self._block_ids_to_allocator[block_id] = allocator

    def _allocator_of(self, device: Device) -> BlockAllocator:
        allocator = self._allocators.get(device)
        if allocator is None:
            raise InvalidArgumentError(f"unknown device {device!r}")
        return allocator

    def _owner_of(self, block: Block) -> BlockAllocator:
        """The allocator that manages the id ``block`` holds."""
        if type(block) not in _PLAIN_BLOCKS and not isinstance(block, Block):
            raise WrongTypeError(f"expected a Block, got {type(block).__name__}")
        block_id = block.block_id
        if block_id is None:
            raise DetachedBlockError("the block holds no id (freed or never allocated)")
        allocator = self._block_ids_to_allocator.get(block_id)
        if allocator is None:
            raise UnknownBlockIdError(f"block id {block_id} is not managed here")
        return allocator

    @property
    def content_hash_function(self) -> Optional[HashFunction]:
        """The GPU allocator's content hash function, if it hashes."""
        return getattr(self._allocators[Device.GPU], "content_hash_function", None)

    @property
    def verify_content(self) -> bool:
        """Whether the GPU allocator checks cache hits against the cached
        content (``verify_content``)."""
        return getattr(self._allocators[Device.GPU], "verify_content", False) is True

    def allocate_or_get_null_block(self) -> Block:
        """The null block: one GPU block, allocated on first use, that
        refuses every write."""
        if self._null_block is None:
            self._null_block = NullBlock(self.allocate_mutable_block(None, Device.GPU))
        return self._null_block

    def allocate_mutable_block(self, prev_block: Optional[Block], device: Device,
                               extra_hash: Optional[int] = None) -> Block:
        """``allocate_mutable_block`` on ``device``'s allocator."""
        return self._allocator_of(device).allocate_mutable_block(prev_block,
                                                                 extra_hash=extra_hash)

    def allocate_immutable_blocks(self, prev_block: Optional[Block],
                                  block_token_ids: List[List[int]], device: Device,
                                  extra_hash: Optional[int] = None) -> List[Block]:
        """``allocate_immutable_blocks`` on ``device``'s allocator."""
        return self._allocator_of(device).allocate_immutable_blocks(
            prev_block, block_token_ids, extra_hash=extra_hash)

    def allocate_immutable_block(self, prev_block: Optional[Block], token_ids: List[int],
                                 device: Device, extra_hash: Optional[int] = None) -> Block:
        """``allocate_immutable_block`` on ``device``'s allocator."""
        return self._allocator_of(device).allocate_immutable_block(
            prev_block, token_ids, extra_hash=extra_hash)

    def free(self, block: Block) -> None:
        """Free ``block`` on the allocator that owns its id (the null block
        is never freed)."""
        if type(block) not in _PLAIN_BLOCKS and isinstance(block, NullBlock):
            return
        self._owner_of(block).free(block)

    def fork(self, last_block: Block) -> List[Block]:
        """Fork ``last_block``'s chain on the allocator that owns its id."""
        if type(last_block) not in _PLAIN_BLOCKS and isinstance(last_block, NullBlock):
            raise InvalidArgumentError("the null block cannot be forked")
        return self._owner_of(last_block).fork(last_block)

    def get_num_free_blocks(self, device: Device) -> int:
        """Free (and evictable) ids on ``device``."""
        return self._allocator_of(device).get_num_free_blocks()

    def get_num_total_blocks(self, device: Device) -> int:
        """All ids on ``device``."""
        return self._allocator_of(device).get_num_total_blocks()

    def get_physical_block_id(self, device: Device, absolute_id: int) -> int:
        """The rank of ``absolute_id`` among ``device``'s sorted ids."""
        return self._allocator_of(device).get_physical_block_id(absolute_id)

    def swap(self, blocks: List[Block], src_device: Device,
             dst_device: Device) -> Dict[int, int]:
        """Move ``blocks`` from ``src_device`` to ``dst_device``; return the
        source id -> destination id mapping (also kept for
        ``get_and_reset_swaps``).  All or nothing: when the destination
        cannot take them all, NoFreeBlocksError and nothing moves."""
        src = self._allocator_of(src_device)
        dst = self._allocator_of(dst_device)
        check_blocks(blocks)
        check_releasable = getattr(src, "_check_releasable", None)
        if check_releasable is not None:
            check_releasable(blocks)
        demand = getattr(dst, "swap_in_demand", None)
        if demand is not None:
            needed = demand(blocks)
            free = dst.get_num_free_blocks()
            if needed > free:
                raise BlockAllocator.NoFreeBlocksError(
                    f"swap needs {needed} blocks on {dst_device}, {free} free")
        src_block_ids = [block.block_id for block in blocks]
        src.swap_out(blocks)
        dst.swap_in(blocks)
        mapping: Dict[int, int] = {}
        for src_id, block in zip(src_block_ids, blocks):
            dst_id = block.block_id
            if src_id is not None and dst_id is not None:
                self._swap_mapping[src_id] = dst_id
                mapping[src_id] = dst_id
        return mapping

    def get_num_full_blocks_touched(self, blocks: List[Block], device: Device) -> int:
        """``get_num_full_blocks_touched`` on ``device``'s allocator."""
        return self._allocator_of(device).get_num_full_blocks_touched(blocks)

    def clear_copy_on_writes(self) -> List[Tuple[BlockId, BlockId]]:
        """The GPU allocator's copy-on-write pairs (cleared)."""
        return self._allocators[Device.GPU].clear_copy_on_writes()

    def mark_blocks_as_accessed(self, block_ids: List[int], now: float) -> None:
        """Mark GPU ids accessed at ``now``."""
        self._allocators[Device.GPU].mark_blocks_as_accessed(block_ids, now)

    def mark_blocks_as_computed(self, block_ids: List[int]) -> None:
        """Mark the GPU allocator's touched ids computed."""
        self._allocators[Device.GPU].mark_blocks_as_computed(block_ids)

    def get_common_computed_block_ids(self, computed_seq_block_ids: List[List[int]]) -> List[int]:
        """The GPU allocator's answer."""
        return self._allocators[Device.GPU].get_common_computed_block_ids(computed_seq_block_ids)

    @property
    def all_block_ids(self) -> FrozenSet[int]:
        """Every id of both devices."""
        return frozenset(self._block_ids_to_allocator)

    def get_prefix_cache_hit_rate(self, device: Device) -> float:
        """``device``'s hit rate."""
        return self._allocator_of(device).get_prefix_cache_hit_rate()

    def reset_prefix_cache(self, device: Optional[Device] = None) -> bool:
        """Reset ``device``'s cache, or every device's (CPU first), stopping
        at the first that refuses."""
        if device is not None:
            return self._allocator_of(device).reset_prefix_cache()
        return all(allocator.reset_prefix_cache() for allocator in self._allocators.values())

    def get_and_reset_swaps(self) -> List[Tuple[int, int]]:
        """Every (source, destination) pair swapped since the last call."""
        pairs = list(self._swap_mapping.items())
        self._swap_mapping.clear()
        return pairs

    def find_cached_blocks_prefix(self, block_hashes: List[int],
                                  device: Device = Device.GPU) -> List[int]:
        """``find_cached_blocks_prefix`` on ``device``'s allocator."""
        return self._allocator_of(device).find_cached_blocks_prefix(block_hashes)

    def find_verified_blocks_prefix(self, block_hashes: List[int], token_ids: List[int],
                                    extra_hash: Optional[int] = None,
                                    device: Device = Device.GPU) -> List[int]:
        """``find_verified_blocks_prefix`` on ``device``'s allocator
        (``find_cached_blocks_prefix`` on one without it)."""
        allocator = self._allocator_of(device)
        verified = getattr(allocator, "find_verified_blocks_prefix", None)
        if verified is None:
            return allocator.find_cached_blocks_prefix(block_hashes)
        return verified(block_hashes, token_ids, extra_hash)  # type: ignore[no-any-return]


class NullBlock(Block):
    """The placeholder block of sliding-window attention: reads pass through
    to one real GPU block, writes raise NullBlockWriteError (a ValueError)."""

    __slots__ = ("_proxy",)

    def __init__(self, proxy: Block) -> None:
        super().__init__()
        self._proxy = proxy

    def append_token_ids(self, token_ids: List[BlockId]) -> None:
        raise NullBlockWriteError("null block should not be modified")

    @property
    def block_id(self) -> Optional[int]:
        return self._proxy.block_id

    @block_id.setter
    def block_id(self, value: Optional[BlockId]) -> None:
        raise NullBlockWriteError("null block should not be modified")

    @property
    def token_ids(self) -> List[BlockId]:
        return self._proxy.token_ids

    @property
    def num_tokens_total(self) -> int:
        raise NotImplementedError("num_tokens_total is not used for null block")

    @property
    def num_empty_slots(self) -> int:
        return self._proxy.num_empty_slots

    @property
    def is_full(self) -> bool:
        return self._proxy.is_full

    @property
    def prev_block(self) -> Optional[Block]:
        return self._proxy.prev_block

    @property
    def extra_hash(self) -> Optional[int]:
        return None

    @property
    def computed(self) -> bool:
        return self._proxy.computed

    @computed.setter
    def computed(self, value: bool) -> None:
        self._proxy.computed = value

    @property
    def last_accessed(self) -> float:
        return self._proxy.last_accessed

    @last_accessed.setter
    def last_accessed(self, last_accessed_ts: float) -> None:
        self._proxy.last_accessed = last_accessed_ts

    @property
    def content_hash(self) -> Optional[int]:
        return self._proxy.content_hash
