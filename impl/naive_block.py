"""The allocator without prefix caching (vLLM's ``naive_block``): reference
counts and a free list, no content hashes.

Free ids wait in a deque: allocation takes the leftmost, and an id whose last
reference is dropped goes back on the left, so the most recently freed id is
reused first.  Every public operation checks the caller's arguments before
it changes anything, so a mistake raises and leaves the allocator as it was.
"""

from __future__ import annotations

from collections import deque
from typing import Deque, Dict, FrozenSet, Iterable, List, Optional, Tuple

from .common import (
    BlockFields,
    BlockPool,
    CopyOnWriteTracker,
    RefCounter,
    check_block_ids,
    check_blocks,
    check_distinct_blocks,
    check_list_of_lists,
    check_sizes,
    check_token_ids,
    get_all_blocks_recursively,
)
from .errors import (
    DetachedBlockError,
    ForeignBlockError,
    InvalidArgumentError,
    NoFreeBlocksError,
    RefCountError,
    UnknownBlockIdError,
    WrongTypeError,
)
from .interfaces import Block, BlockAllocator, BlockId, Device

Refcount = int


def check_no_device(device: Optional[Device]) -> None:
    """A single-device allocator takes no ``device`` argument."""
    if device is not None:
        raise InvalidArgumentError("this allocator manages one device; pass device=None")


def check_detached(blocks: List[Block]) -> None:
    """``swap_in`` takes Blocks that hold no id (swapped out)."""
    for block in blocks:
        if block.block_id is not None:
            raise InvalidArgumentError(
                f"swap_in takes detached blocks; this one holds id {block.block_id}"
            )


class NaiveBlockAllocator(BlockAllocator):
    """Hands out physical ids with reference counting and copy-on-write.

    ``_free_block_indices`` (the free deque, in hand-out order) and
    ``_refcounter`` are read by vLLM's tests and the spec."""

    def __init__(
        self,
        create_block: Block.Factory,
        num_blocks: int,
        block_size: int,
        block_ids: Optional[Iterable[int]] = None,
        block_pool: Optional[BlockPool] = None,
    ) -> None:
        check_sizes(num_blocks, block_size)
        if not callable(create_block):
            raise WrongTypeError(f"create_block must be callable, got {create_block!r}")
        ids = check_block_ids(range(num_blocks) if block_ids is None else block_ids, num_blocks)
        self._free_block_indices: Deque[BlockId] = deque(ids)
        self._all_block_indices: FrozenSet[BlockId] = frozenset(ids)
        # id -> rank among the sorted ids, built by the first get_physical_block_id
        self._physical_index: Optional[Dict[BlockId, int]] = None
        self._refcounter = RefCounter(all_block_indices=ids)
        self._block_size = block_size
        self._cow_tracker = CopyOnWriteTracker(self._refcounter.as_readonly())
        if block_pool is None:
            block_pool = BlockPool(block_size, create_block, self, 4 * num_blocks)
        self._block_pool = block_pool

    # -- checks of the caller's arguments (raise before any change) ----------

    def _check_owned(self, block: Block) -> BlockId:
        """The id of ``block`` after checking it is attached, belongs to this
        allocator and holds a reference."""
        if not isinstance(block, Block):
            raise WrongTypeError(f"expected a Block, got {type(block).__name__}")
        block_id = block.block_id
        if block_id is None:
            raise DetachedBlockError("the block holds no id (freed or never allocated)")
        if getattr(block, "_allocator", None) is not self:
            raise ForeignBlockError(f"block {block_id} belongs to another allocator")
        count = self._refcounter._refcounts.get(block_id)
        if count is None:
            raise UnknownBlockIdError(f"block id {block_id} is not managed by this allocator")
        if count <= 0:
            raise RefCountError(f"block {block_id} holds no reference (already freed)")
        return block_id

    def _check_releasable(self, blocks: Iterable[Block]) -> None:
        """Check every block may drop its reference, counting repeats."""
        wanted: Dict[BlockId, int] = {}
        for block in blocks:
            block_id = self._check_owned(block)
            wanted[block_id] = wanted.get(block_id, 0) + 1
            if wanted[block_id] > self._refcounter._refcounts[block_id]:
                raise RefCountError(f"block {block_id} is released more often than referenced")

    def _check_prev_block(self, prev_block: Optional[Block]) -> None:
        if prev_block is not None and not isinstance(prev_block, Block):
            raise WrongTypeError(f"prev_block must be a Block or None, got {prev_block!r}")

    def _check_free_ids(self, needed: int) -> None:
        if needed > len(self._free_block_indices):
            raise NoFreeBlocksError(
                f"{needed} blocks requested, {len(self._free_block_indices)} free"
            )

    # -- the id mechanics ----------------------------------------------------

    def _allocate_block_id(self) -> BlockId:
        """Take the leftmost free id with one reference."""
        if not self._free_block_indices:
            raise NoFreeBlocksError("no free block")
        block_id = self._free_block_indices.popleft()
        self._refcounter._refcounts[block_id] = 1
        return block_id

    def free_block_id(self, block_id: BlockId) -> None:
        """Drop one reference to ``block_id``; at 0 the id goes back on the
        left of the free list."""
        if self._refcounter.decr(block_id) == 0:
            self._free_block_indices.appendleft(block_id)

    def _free_block_id(self, block: Block) -> None:
        block_id = block.block_id
        block.block_id = None
        self.free_block_id(block_id)  # type: ignore[arg-type]

    # -- allocation ------------------------------------------------------------

    def allocate_mutable_block(
        self,
        prev_block: Optional[Block],
        extra_hash: Optional[int] = None,
        device: Optional[Device] = None,
    ) -> Block:
        """Take the leftmost free id (refcount 1) and return an empty Block
        on it.  Raises NoFreeBlocksError when no id is free."""
        check_no_device(device)
        self._check_prev_block(prev_block)
        block_id = self._allocate_block_id()
        return self._block_pool.init_block(
            prev_block=prev_block, token_ids=[], block_size=self._block_size,
            physical_block_id=block_id,
        )

    def allocate_immutable_block(
        self,
        prev_block: Optional[Block],
        token_ids: List[int],
        extra_hash: Optional[int] = None,
        device: Optional[Device] = None,
    ) -> Block:
        """Take the leftmost free id and return a Block holding
        ``token_ids`` (``extra_hash`` is ignored: nothing is hashed here)."""
        check_no_device(device)
        self._check_prev_block(prev_block)
        check_token_ids(token_ids, self._block_size)
        block_id = self._allocate_block_id()
        return self._block_pool.init_block(
            prev_block=prev_block, token_ids=token_ids, block_size=self._block_size,
            physical_block_id=block_id,
        )

    def allocate_immutable_blocks(
        self,
        prev_block: Optional[Block],
        block_token_ids: List[List[int]],
        extra_hash: Optional[int] = None,
        device: Optional[Device] = None,
    ) -> List[Block]:
        """A chain of Blocks after ``prev_block``, one per token list, on the
        next free ids in order.  All or nothing: NoFreeBlocksError and no id
        taken when there are fewer free ids than lists."""
        check_no_device(device)
        self._check_prev_block(prev_block)
        check_list_of_lists(block_token_ids, "block_token_ids")
        for token_ids in block_token_ids:
            check_token_ids(token_ids, self._block_size)
        self._check_free_ids(len(block_token_ids))
        blocks: List[Block] = []
        for token_ids in block_token_ids:
            prev_block = self._block_pool.init_block(
                prev_block=prev_block, token_ids=token_ids, block_size=self._block_size,
                physical_block_id=self._allocate_block_id(),
            )
            blocks.append(prev_block)
        return blocks

    # -- freeing and sharing -----------------------------------------------------

    def free(self, block: Block, keep_block_object: bool = False) -> None:
        """Drop ``block``'s reference (its id is free again at refcount 0) and
        detach it; the Block object returns to the pool unless
        ``keep_block_object``."""
        self._check_owned(block)
        self._free_block_id(block)
        if not keep_block_object:
            self._block_pool.free_block(block)

    def fork(self, last_block: Block) -> List[Block]:
        """A new chain of Blocks sharing the ids of ``last_block``'s chain:
        each id gains one reference.  O(chain length), no recursion."""
        self._check_owned(last_block)
        chain = get_all_blocks_recursively(last_block)
        for block in chain:
            self._check_owned(block)
        forked: List[Block] = []
        prev: Optional[Block] = None
        refcounts = self._refcounter._refcounts
        for block in chain:
            block_id: BlockId = block.block_id  # type: ignore[assignment]
            refcounts[block_id] += 1
            prev = self._block_pool.init_block(
                prev_block=prev, token_ids=block.token_ids, block_size=self._block_size,
                physical_block_id=block_id,
            )
            forked.append(prev)
        return forked

    def cow_block_if_not_appendable(self, block: Block) -> BlockId:
        """The id ``block`` may write to: its own when it has at most one
        reference; else a new id, with ``(old, new)`` recorded, the old id
        losing one reference and ``block`` moved to the new id.  All or
        nothing: NoFreeBlocksError leaves ``block`` on its old id."""
        src = self._check_owned(block)
        if self._refcounter._refcounts[src] <= 1:
            return src
        self._check_free_ids(1)
        self._refcounter._refcounts[src] -= 1
        dst = self._allocate_block_id()
        self._cow_tracker.record_cow(src, dst)
        block.block_id = dst
        return dst

    def clear_copy_on_writes(self) -> List[Tuple[BlockId, BlockId]]:
        """The recorded copy-on-write pairs, in order; the record is cleared."""
        return self._cow_tracker.clear_cows()

    # -- counts and lookups --------------------------------------------------------

    @property
    def refcounter(self) -> RefCounter:
        """The reference counter."""
        return self._refcounter

    @property
    def all_block_ids(self) -> FrozenSet[int]:
        """Every id this allocator manages."""
        return self._all_block_indices

    def get_num_free_blocks(self) -> int:
        """How many ids are free. O(1)."""
        return len(self._free_block_indices)

    def get_num_total_blocks(self) -> int:
        """How many ids this allocator manages."""
        return len(self._all_block_indices)

    def get_physical_block_id(self, absolute_id: int) -> int:
        """The rank of ``absolute_id`` among the sorted ids.  O(1) (the first
        call O(n log n): it ranks the ids)."""
        index = self._physical_index
        if index is None:
            index = self._physical_index = {
                block_id: rank for rank, block_id in enumerate(sorted(self._all_block_indices))
            }
        try:
            rank = index.get(absolute_id)
        except TypeError as exc:
            raise WrongTypeError(f"a block id must be an int, got {absolute_id!r}") from exc
        if rank is None:
            raise UnknownBlockIdError(f"block id {absolute_id!r} is not managed here")
        return rank

    def get_num_full_blocks_touched(self, blocks: List[Block]) -> int:
        """How many distinct full Block objects ``blocks`` holds."""
        check_blocks(blocks)
        return len({id(block) for block in blocks if block.is_full})

    # -- prefix-caching hooks: inert without a cache ----------------------------------

    def mark_blocks_as_accessed(self, block_ids: List[int], now: float) -> None:
        """Nothing to record without a prefix cache."""

    def mark_blocks_as_computed(self, block_ids: List[int]) -> None:
        """Nothing to record without a prefix cache."""

    def get_common_computed_block_ids(self, computed_seq_block_ids: List[List[int]]) -> List[int]:
        """Always ``[]``: nothing is cached."""
        return []

    def promote_to_immutable_block(self, block: Block) -> BlockId:
        """Not supported without a prefix cache."""
        raise NotImplementedError("There is no promotion for naive blocks")

    def get_prefix_cache_hit_rate(self) -> float:
        """Always -1: there is no prefix cache."""
        return -1

    def reset_prefix_cache(self) -> bool:
        """Always True: there is nothing to reset."""
        return True

    def find_cached_blocks_prefix(self, block_hashes: List[int]) -> List[int]:
        """Always ``[]``: nothing is cached."""
        return []

    # -- swapping ---------------------------------------------------------------------

    def swap_out(self, blocks: List[Block]) -> None:
        """Drop each block's reference and detach it; the objects are kept."""
        check_blocks(blocks)
        check_distinct_blocks(blocks)
        self._check_releasable(blocks)
        for block in blocks:
            self._free_block_id(block)

    def swap_in_demand(self, blocks: List[Block]) -> int:
        """How many free ids ``swap_in(blocks)`` takes."""
        return len(blocks)

    def swap_in(self, blocks: List[Block]) -> None:
        """Give each detached block a new id, in order (and make this
        allocator its owner).  All or nothing: NoFreeBlocksError and no id
        taken when they do not all fit."""
        check_blocks(blocks)
        check_detached(blocks)
        check_distinct_blocks(blocks)
        self._check_free_ids(self.swap_in_demand(blocks))
        for block in blocks:
            block.block_id = self._allocate_block_id()
            rebind = getattr(block, "_rebind_allocator", None)
            if rebind is not None:
                self._block_pool.adopt(block)
                rebind(self)


class NaiveBlock(BlockFields):
    """A block without a content hash.  Appending to a shared block first
    moves it to a private id (copy-on-write through its allocator)."""

    __slots__ = ("_allocator", "_cow_target", "pool_id")

    def __init__(
        self,
        prev_block: Optional[Block],
        token_ids: List[int],
        block_size: int,
        allocator: BlockAllocator,
        block_id: Optional[int] = None,
        _cow_target: Optional[Block] = None,
        extra_hash: Optional[int] = None,
    ) -> None:
        check_token_ids(token_ids, block_size)
        self._prev_block = prev_block
        self._token_ids: List[int] = list(token_ids)
        self._block_size = block_size
        self._allocator = allocator
        self.block_id = block_id
        self._cow_target = _cow_target if _cow_target is not None else self

    def _rebind_allocator(self, allocator: BlockAllocator) -> None:
        self._allocator = allocator

    def append_token_ids(self, token_ids: List[int]) -> None:
        """Append ``token_ids``; if the id is shared, first move this block to
        a private id.  All or nothing."""
        if not token_ids:
            return
        check_token_ids(token_ids, self._block_size - len(self._token_ids))
        if self.block_id is not None:
            self.block_id = self._allocator.cow_block_if_not_appendable(self._cow_target)
        self._token_ids.extend(token_ids)

    @property
    def computed(self) -> bool:
        raise NotImplementedError

    @computed.setter
    def computed(self, value: bool) -> None:
        raise NotImplementedError

    @property
    def last_accessed(self) -> float:
        raise NotImplementedError

    @last_accessed.setter
    def last_accessed(self, last_accessed_ts: float) -> None:
        raise NotImplementedError

    @property
    def num_tokens_total(self) -> int:
        raise NotImplementedError("num_tokens_total is not used for naive block")

    @property
    def extra_hash(self) -> Optional[int]:
        return None

    @property
    def content_hash(self) -> Optional[int]:
        return None

