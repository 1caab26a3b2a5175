"""The abstract interfaces of vLLM 0.8.5's ``vllm.core.block.interfaces``.

``Block`` declares exactly the abstract members vLLM declares (a
reimplementation that adds one would make ``NullBlock`` abstract), and
``BlockAllocator.NoFreeBlocksError`` is the class callers catch.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from typing import Any, Dict, FrozenSet, List, Optional, Protocol, Tuple

from .errors import NoFreeBlocksError

BlockId = int


class Device(enum.Enum):
    """Where a block lives (``vllm.utils.Device``)."""

    GPU = enum.auto()
    CPU = enum.auto()

    # Members are equal only to themselves, so identity is their hash: a dict
    # keyed by Device then finds them without Enum's hash of the member's name.
    __hash__ = object.__hash__


class Block(ABC):
    """One block of ``block_size`` token slots, bound to a physical id.

    A Block is a recycled object: after it is freed the allocator reuses it,
    so a caller must not touch a Block after freeing it."""

    __slots__ = ()

    @abstractmethod
    def append_token_ids(self, token_ids: List[int]) -> None:
        """Append tokens; may copy-on-write or promote (changes ``block_id``)."""

    @property
    @abstractmethod
    def block_id(self) -> Optional[int]:
        """The physical id, or None when the Block is detached."""

    @block_id.setter
    @abstractmethod
    def block_id(self, value: Optional[int]) -> None:
        """Rebind the Block to another physical id (allocator use only)."""

    @property
    @abstractmethod
    def token_ids(self) -> List[int]:
        """The tokens this block holds (the live list)."""

    @property
    @abstractmethod
    def num_tokens_total(self) -> int:
        """Tokens in this block plus every earlier block of its chain."""

    @property
    @abstractmethod
    def num_empty_slots(self) -> int:
        """``block_size - len(token_ids)``."""

    @property
    @abstractmethod
    def is_full(self) -> bool:
        """True when no slot is empty."""

    @property
    @abstractmethod
    def prev_block(self) -> Optional[Block]:
        """The previous block of the chain, or None for a first block."""

    @property
    @abstractmethod
    def extra_hash(self) -> Optional[int]:
        """Extra input to the content hash (LoRA id, adapter, cache salt)."""

    @property
    @abstractmethod
    def computed(self) -> bool:
        """True when the block's KV is known to be present."""

    @computed.setter
    @abstractmethod
    def computed(self, value: bool) -> None:
        """Set the computed flag (allocator use only)."""

    @property
    @abstractmethod
    def last_accessed(self) -> float:
        """Per-object access time (the prefix allocator keeps its own)."""

    @last_accessed.setter
    @abstractmethod
    def last_accessed(self, last_accessed_ts: float) -> None:
        """Set the per-object access time."""

    class Factory(Protocol):
        """Creates a Block: ``(prev_block, token_ids, block_size, allocator,
        block_id=None, computed=False, extra_hash=None) -> Block``."""

        def __call__(self, *args: Any, **kwargs: Any) -> Block: ...

    @property
    @abstractmethod
    def content_hash(self) -> Optional[int]:
        """The prefix-chained content hash, or None when the block has none."""


class BlockAllocator(ABC):
    """An allocator of physical block ids on one device."""

    NoFreeBlocksError = NoFreeBlocksError

    @abstractmethod
    def allocate_mutable_block(
        self, prev_block: Optional[Block], extra_hash: Optional[int] = None
    ) -> Block: ...

    @abstractmethod
    def allocate_immutable_block(
        self, prev_block: Optional[Block], token_ids: List[int], extra_hash: Optional[int] = None
    ) -> Block: ...

    @abstractmethod
    def allocate_immutable_blocks(
        self,
        prev_block: Optional[Block],
        block_token_ids: List[List[int]],
        extra_hash: Optional[int] = None,
    ) -> List[Block]: ...

    @abstractmethod
    def free(self, block: Block) -> None: ...

    @abstractmethod
    def fork(self, last_block: Block) -> List[Block]: ...

    @abstractmethod
    def get_num_total_blocks(self) -> int: ...

    @abstractmethod
    def get_num_free_blocks(self) -> int: ...

    @abstractmethod
    def get_physical_block_id(self, absolute_id: int) -> int: ...

    @abstractmethod
    def swap_out(self, blocks: List[Block]) -> None: ...

    @abstractmethod
    def swap_in(self, blocks: List[Block]) -> None: ...

    @property
    @abstractmethod
    def all_block_ids(self) -> FrozenSet[int]: ...

    @abstractmethod
    def clear_copy_on_writes(self) -> List[Tuple[int, int]]: ...

    @abstractmethod
    def mark_blocks_as_accessed(self, block_ids: List[int], now: float) -> None: ...

    @abstractmethod
    def mark_blocks_as_computed(self, block_ids: List[int]) -> None: ...

    @abstractmethod
    def get_common_computed_block_ids(
        self, computed_seq_block_ids: List[List[int]]
    ) -> List[int]: ...

    @abstractmethod
    def cow_block_if_not_appendable(self, block: Block) -> BlockId: ...

    @abstractmethod
    def promote_to_immutable_block(self, block: Block) -> BlockId: ...

    @abstractmethod
    def get_num_full_blocks_touched(self, blocks: List[Block]) -> int: ...

    @abstractmethod
    def get_prefix_cache_hit_rate(self) -> float: ...

    @abstractmethod
    def reset_prefix_cache(self) -> bool: ...

    @abstractmethod
    def find_cached_blocks_prefix(self, block_hashes: List[int]) -> List[int]: ...


class DeviceAwareBlockAllocator(ABC):
    """A pair of allocators (GPU and CPU) behind one interface."""

    @abstractmethod
    def allocate_mutable_block(
        self, prev_block: Optional[Block], device: Device, extra_hash: Optional[int] = None
    ) -> Block: ...

    @abstractmethod
    def allocate_immutable_block(
        self,
        prev_block: Optional[Block],
        token_ids: List[int],
        device: Device,
        extra_hash: Optional[int] = None,
    ) -> Block: ...

    @abstractmethod
    def allocate_immutable_blocks(
        self,
        prev_block: Optional[Block],
        block_token_ids: List[List[int]],
        device: Device,
        extra_hash: Optional[int] = None,
    ) -> List[Block]: ...

    @abstractmethod
    def get_num_free_blocks(self, device: Device) -> int: ...

    @abstractmethod
    def get_num_total_blocks(self, device: Device) -> int: ...

    @abstractmethod
    def free(self, block: Block) -> None: ...

    @abstractmethod
    def fork(self, last_block: Block) -> List[Block]: ...

    @property
    @abstractmethod
    def all_block_ids(self) -> FrozenSet[int]: ...

    @abstractmethod
    def clear_copy_on_writes(self) -> List[Tuple[int, int]]: ...

    @abstractmethod
    def mark_blocks_as_accessed(self, block_ids: List[int], now: float) -> None: ...

    @abstractmethod
    def mark_blocks_as_computed(self, block_ids: List[int]) -> None: ...

    @abstractmethod
    def get_common_computed_block_ids(
        self, computed_seq_block_ids: List[List[int]]
    ) -> List[int]: ...

    @abstractmethod
    def get_num_full_blocks_touched(self, blocks: List[Block], device: Device) -> int: ...

    @abstractmethod
    def swap(
        self, blocks: List[Block], src_device: Device, dst_device: Device
    ) -> Dict[int, int]: ...

    @abstractmethod
    def get_physical_block_id(self, device: Device, absolute_id: int) -> int: ...

    @abstractmethod
    def allocate_or_get_null_block(self) -> Block: ...

    @abstractmethod
    def get_prefix_cache_hit_rate(self, device: Device) -> float: ...

    @abstractmethod
    def reset_prefix_cache(self, device: Optional[Device] = None) -> bool: ...

    @abstractmethod
    def find_cached_blocks_prefix(
        self, block_hashes: List[int], device: Device = Device.GPU
    ) -> List[int]: ...
