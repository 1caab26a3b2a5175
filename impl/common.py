"""Shared building blocks (vLLM's ``vllm.core.block.common``): reference
counting, copy-on-write bookkeeping, the Block object pool, block lists, the
hit-rate metric and chain walking."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Deque, Dict, Iterable, List, Optional, Tuple

from .errors import (
    BlockFullError,
    DetachedBlockError,
    InvalidArgumentError,
    ReadOnlyError,
    RefCountError,
    UnknownBlockIdError,
    WrongTypeError,
)
from .interfaces import Block, BlockAllocator, BlockId

RefCount = int


class BlockFields(Block):
    """The Block properties both Block classes read off the same slots."""

    # ``block_id`` is a plain slot, not a property: reading it (every caller
    # does, after each allocation and append) costs no Python call.
    __slots__ = ("_prev_block", "_token_ids", "_block_size", "block_id")
    _prev_block: Optional[Block]
    _token_ids: List[int]
    _block_size: int
    block_id: Optional[int]

    @property
    def _block_id(self) -> Optional[int]:
        """The same as ``block_id`` (the name it had as a private slot)."""
        return self.block_id

    @_block_id.setter
    def _block_id(self, value: Optional[int]) -> None:
        self.block_id = value

    @property
    def is_full(self) -> bool:
        return len(self._token_ids) == self._block_size

    @property
    def num_empty_slots(self) -> int:
        return self._block_size - len(self._token_ids)

    @property
    def token_ids(self) -> List[int]:
        return self._token_ids

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def prev_block(self) -> Optional[Block]:
        return self._prev_block


class RefCounter:
    """A reference count per physical id, all starting at 0.

    ``_refcounts`` (id -> count) is read by vLLM's tests and by the spec's
    abstraction function.  Every method is O(1)."""

    __slots__ = ("_refcounts",)

    def __init__(self, all_block_indices: Iterable[BlockId]) -> None:
        self._refcounts: Dict[BlockId, RefCount] = dict.fromkeys(all_block_indices, 0)

    def _unknown(self, block_id: BlockId) -> UnknownBlockIdError:
        return UnknownBlockIdError(f"block id {block_id!r} is not managed by this counter")

    def incr(self, block_id: BlockId) -> RefCount:
        """Add one reference to ``block_id``; return the new count."""
        count = self._refcounts.get(block_id)
        if count is None:
            raise self._unknown(block_id)
        count += 1
        self._refcounts[block_id] = count
        return count

    def decr(self, block_id: BlockId) -> RefCount:
        """Drop one reference from ``block_id``; return the new count.

        Raises RefCountError (an AssertionError) when the count is already 0;
        the count is then unchanged."""
        count = self._refcounts.get(block_id)
        if count is None:
            raise self._unknown(block_id)
        if count <= 0:
            raise RefCountError(f"block id {block_id} has no reference to drop")
        count -= 1
        self._refcounts[block_id] = count
        return count

    def get(self, block_id: BlockId) -> RefCount:
        """The current count of ``block_id``."""
        count = self._refcounts.get(block_id)
        if count is None:
            raise self._unknown(block_id)
        return count

    def as_readonly(self) -> ReadOnlyRefCounter:
        """A view that reads this counter and refuses to change it."""
        return ReadOnlyRefCounter(self)


class ReadOnlyRefCounter:
    """A read-only view of a :class:`RefCounter`."""

    __slots__ = ("_refcounter",)

    def __init__(self, refcounter: RefCounter) -> None:
        self._refcounter = refcounter

    def incr(self, block_id: BlockId) -> RefCount:
        """Always refused: ``ReadOnlyError("Incr not allowed")`` (a ValueError)."""
        raise ReadOnlyError("Incr not allowed")

    def decr(self, block_id: BlockId) -> RefCount:
        """Always refused: ``ReadOnlyError("Decr not allowed")`` (a ValueError)."""
        raise ReadOnlyError("Decr not allowed")

    def get(self, block_id: BlockId) -> RefCount:
        """The count of ``block_id`` in the underlying counter."""
        return self._refcounter.get(block_id)


class CopyOnWriteTracker:
    """Records the (source, destination) pairs of copy-on-writes until cleared."""

    __slots__ = ("_copy_on_writes", "_refcounter")

    def __init__(self, refcounter: ReadOnlyRefCounter | RefCounter) -> None:
        self._copy_on_writes: List[Tuple[BlockId, BlockId]] = []
        self._refcounter = refcounter

    def is_appendable(self, block: Block) -> bool:
        """True when ``block`` may be written in place: it has no id, or its
        id has at most one reference."""
        block_id = block.block_id
        if block_id is None:
            return True
        return self._refcounter.get(block_id) <= 1

    def record_cow(self, src_block_id: Optional[BlockId], trg_block_id: Optional[BlockId]) -> None:
        """Append the pair ``(src, dst)``; both must be ids."""
        if src_block_id is None or trg_block_id is None:
            raise InvalidArgumentError("a copy-on-write needs a source and a target id")
        self._copy_on_writes.append((src_block_id, trg_block_id))

    def clear_cows(self) -> List[Tuple[BlockId, BlockId]]:
        """Return the recorded pairs in order and forget them."""
        cows = self._copy_on_writes
        self._copy_on_writes = []
        return cows


class BlockPool:
    """A LIFO pool of reusable Block objects.

    Slot ``i`` holds at most one Block object for its whole life.  A request
    takes the leftmost free slot (the most recently returned one, else the
    lowest never-used slot) and re-initialises that object in place, so no
    Block object is created per allocation once the pool is warm.  Objects are
    created the first time their slot is taken, not up front: the order of
    slots handed out is the same, construction is O(1).  When every slot is
    taken the pool doubles."""

    __slots__ = ("_block_size", "_create_block", "_allocator", "_pool_size", "_pool",
                 "_free_ids")

    def __init__(
        self,
        block_size: int,
        create_block: Block.Factory,
        allocator: BlockAllocator,
        pool_size: int,
    ) -> None:
        if pool_size < 0:
            raise InvalidArgumentError(f"pool_size must be >= 0, got {pool_size}")
        self._block_size = block_size
        self._create_block = create_block
        self._allocator = allocator
        self._pool_size = pool_size
        self._pool: List[Block] = []
        self._free_ids: Deque[int] = deque()

    @property
    def pool_size(self) -> int:
        """How many slots the pool has (taken or free)."""
        return self._pool_size

    def increase_pool(self) -> None:
        """Double the number of slots (from 0, grow to 1)."""
        self._pool_size = max(1, 2 * self._pool_size)

    def init_block(
        self,
        prev_block: Optional[Block],
        token_ids: List[int],
        block_size: int,
        physical_block_id: Optional[int],
        extra_hash: Optional[int] = None,
    ) -> Block:
        """Take the leftmost free slot and return its Block, initialised with
        these arguments and the pool's allocator."""
        free_ids = self._free_ids
        if free_ids:
            pool_id = free_ids[0]  # taken only once the object accepted the arguments
            block = self._pool[pool_id]
            block.__init__(  # type: ignore[misc]
                prev_block=prev_block,
                token_ids=token_ids,
                block_size=block_size,
                allocator=block._allocator,  # type: ignore[attr-defined]
                block_id=physical_block_id,
                extra_hash=extra_hash,
            )
            free_ids.popleft()
            block.pool_id = pool_id  # type: ignore[attr-defined]
            return block
        pool_id = len(self._pool)
        block = self._create_block(
            prev_block=prev_block,
            token_ids=token_ids,
            block_size=block_size,
            allocator=self._allocator,
            block_id=physical_block_id,
            extra_hash=extra_hash,
        )
        if pool_id >= self._pool_size:
            self.increase_pool()
        block.pool_id = pool_id  # type: ignore[attr-defined]
        self._pool.append(block)
        return block

    def holds(self, block: Block) -> bool:
        """Whether ``block`` is the object of one of this pool's slots."""
        slot = getattr(block, "pool_id", None)
        return type(slot) is int and 0 <= slot < len(self._pool) and self._pool[slot] is block

    def free_block(self, block: Block) -> None:
        """Return ``block``'s slot to the left end of the free slots (a Block
        this pool does not hold is left alone)."""
        if self.holds(block):
            self._free_ids.appendleft(block.pool_id)  # type: ignore[attr-defined]

    def adopt(self, block: Block) -> None:
        """Make ``block`` (a taken object of another pool, or of none) a taken
        object of this pool.  Its old pool gets a fresh object in the slot it
        leaves, which is free again; so a Block swapped to another device is
        later freed into the pool that now owns it, and never into a slot of
        its old pool that another Block holds."""
        if self.holds(block):
            return
        old_pool = getattr(getattr(block, "_allocator", None), "_block_pool", None)
        if isinstance(old_pool, BlockPool):
            old_pool._give_away(block)
        block.pool_id = len(self._pool)  # type: ignore[attr-defined]
        self._pool.append(block)
        self._pool_size = max(self._pool_size, len(self._pool))

    def _give_away(self, block: Block) -> None:
        if not self.holds(block):
            return
        slot: int = getattr(block, "pool_id")  # noqa: B009 (not every Block has one)
        fresh = self._create_block(
            prev_block=None, token_ids=[], block_size=self._block_size,
            allocator=self._allocator, block_id=None, extra_hash=None,
        )
        fresh.pool_id = slot  # type: ignore[attr-defined]
        self._pool[slot] = fresh
        self._free_ids.append(slot)


class BlockList:
    """A list of Blocks with a cached list of their ids, kept in step."""

    __slots__ = ("_blocks", "_block_ids")

    def __init__(self, blocks: List[Block]) -> None:
        self._blocks: List[Block] = []
        self._block_ids: List[int] = []
        self.update(blocks)

    def _id_of(self, block: Block) -> int:
        block_id = block.block_id
        if block_id is None:
            raise DetachedBlockError("a BlockList holds only blocks with an id")
        return block_id

    def update(self, blocks: List[Block]) -> None:
        """Hold ``blocks`` (the list object itself) and rebuild the ids."""
        block_ids = [self._id_of(block) for block in blocks]
        self._blocks = blocks
        self._block_ids = block_ids

    def append_token_ids(self, block_index: int, token_ids: List[int]) -> None:
        """Append to block ``block_index``; refresh its id (CoW/promotion)."""
        block = self._blocks[block_index]
        prev_block_id = block.block_id
        block.append_token_ids(token_ids)
        if prev_block_id != block.block_id:
            self._block_ids[block_index] = self._id_of(block)

    def append(self, new_block: Block) -> None:
        """Add a block at the end."""
        block_id = self._id_of(new_block)
        self._blocks.append(new_block)
        self._block_ids.append(block_id)

    def __len__(self) -> int:
        return len(self._blocks)

    def __getitem__(self, block_index: int) -> Block:
        return self._blocks[block_index]

    def __setitem__(self, block_index: int, new_block: Block) -> None:
        block_id = self._id_of(new_block)
        self._blocks[block_index] = new_block
        self._block_ids[block_index] = block_id

    def reset(self) -> None:
        """Forget every block."""
        self._blocks = []
        self._block_ids = []

    def list(self) -> List[Block]:
        """The blocks."""
        return self._blocks

    def ids(self) -> List[int]:
        """The blocks' ids, in order."""
        return self._block_ids


@dataclass
class CacheMetricData:
    """The prefix-cache hit rate, folded in buckets of ``block_size`` queries.

    ``block_size`` counts queries, not tokens.  Each completed bucket's hit
    ratio joins a running mean; the open bucket counts in proportion to how
    full it is.  With equal buckets this equals hits / queries."""

    num_completed_blocks: int = 0
    completed_block_cache_hit_rate: float = 0.0
    num_incompleted_block_queries: int = 0
    num_incompleted_block_hit: int = 0
    block_size: int = 1000

    def query(self, hit: bool) -> None:
        """Record one query; close the bucket when it holds ``block_size``."""
        self.num_incompleted_block_queries += 1
        if hit:
            self.num_incompleted_block_hit += 1
        if self.num_incompleted_block_queries == self.block_size:
            bucket_rate = self.num_incompleted_block_hit / self.num_incompleted_block_queries
            done = self.num_completed_blocks
            self.completed_block_cache_hit_rate = (
                self.completed_block_cache_hit_rate * done + bucket_rate
            ) / (done + 1)
            self.num_completed_blocks = done + 1
            self.num_incompleted_block_queries = 0
            self.num_incompleted_block_hit = 0

    def query_all(self, hits: List[bool]) -> None:
        """``query(hit)`` for each of ``hits`` in order, at once while no
        bucket closes on the way."""
        queries = self.num_incompleted_block_queries + len(hits)
        if queries < self.block_size:
            self.num_incompleted_block_queries = queries
            self.num_incompleted_block_hit += hits.count(True)
        else:
            for hit in hits:
                self.query(hit)

    def get_hit_rate(self) -> float:
        """The hit rate over every query so far; 0.0 before the first."""
        open_fraction = self.num_incompleted_block_queries / self.block_size
        weight = self.num_completed_blocks + open_fraction
        if weight == 0:
            return 0.0
        completed = 0.0
        if self.num_completed_blocks > 0:
            completed = self.completed_block_cache_hit_rate * self.num_completed_blocks
        partial = 0.0
        if self.num_incompleted_block_queries > 0:
            partial = (
                self.num_incompleted_block_hit / self.num_incompleted_block_queries
            ) * open_fraction
        return (completed + partial) / weight


def get_all_blocks_recursively(last_block: Block) -> List[Block]:
    """The chain ending at ``last_block``, first block first.

    Iterative: no recursion limit on the chain's length.  O(chain length)."""
    chain: List[Block] = []
    block: Optional[Block] = last_block
    while block is not None:
        chain.append(block)
        block = block.prev_block
    chain.reverse()
    return chain


def check_token_ids(token_ids: object, room: int) -> None:
    """Reject token lists a block cannot take: not a list/tuple of ints
    (WrongTypeError, checked first), or more than ``room`` tokens
    (BlockFullError)."""
    check_token_types(token_ids)
    if len(token_ids) > room:  # type: ignore[arg-type]
        raise BlockFullError(f"{len(token_ids)} tokens do not fit in "  # type: ignore[arg-type]
                             f"{room} empty slots")


def check_token_types(token_ids: object) -> None:
    """Reject anything but a list (or tuple) of ints (WrongTypeError)."""
    if not isinstance(token_ids, (list, tuple)):
        raise WrongTypeError(f"token_ids must be a list of ints, got {type(token_ids).__name__}")
    for token in token_ids:
        if type(token) is not int:
            raise WrongTypeError(f"a token id must be an int, got {token!r}")


def check_blocks(blocks: object) -> None:
    """Reject anything but a list (or tuple) of Blocks."""
    if not isinstance(blocks, (list, tuple)):
        raise WrongTypeError(f"expected a list of Blocks, got {type(blocks).__name__}")
    if all(issubclass(kind, Block) for kind in {*map(type, blocks)}):
        return  # each type checked once: an isinstance per block costs an ABC check each
    for block in blocks:
        if not isinstance(block, Block):
            raise WrongTypeError(f"expected a Block, got {type(block).__name__}")


def check_list_of_lists(values: object, what: str) -> None:
    """Reject anything but a list (or tuple) of lists (or tuples)."""
    if not isinstance(values, (list, tuple)):
        raise WrongTypeError(f"{what} must be a list of lists")
    for value in values:
        if not isinstance(value, (list, tuple)):
            raise WrongTypeError(f"{what} must be a list of lists")


def check_distinct_blocks(blocks: Iterable[Block]) -> None:
    """Reject a list that names one Block object twice."""
    seen: set[int] = set()
    for block in blocks:
        if id(block) in seen:
            raise InvalidArgumentError("the same Block is listed twice")
        seen.add(id(block))


def check_timestamp(now: object) -> None:
    """Reject an access time that is not a number, or is NaN (which would
    break the eviction order)."""
    if type(now) not in (int, float):
        raise WrongTypeError(f"now must be a number, got {now!r}")
    if now != now:
        raise InvalidArgumentError("now must not be NaN")


def check_extra_hash(extra_hash: object) -> None:
    """Reject an extra hash that is neither None nor an int."""
    if extra_hash is not None and type(extra_hash) is not int:
        raise WrongTypeError(f"extra_hash must be an int or None, got {extra_hash!r}")


def check_sizes(num_blocks: object, block_size: object) -> None:
    """Reject a pool size that is not an int >= 0 or a block size that is
    not an int >= 1."""
    if type(num_blocks) is not int or num_blocks < 0:
        raise InvalidArgumentError(f"num_blocks must be an int >= 0, got {num_blocks!r}")
    if type(block_size) is not int or block_size < 1:
        raise InvalidArgumentError(f"block_size must be an int >= 1, got {block_size!r}")


def check_block_ids(block_ids: Iterable[object], num_blocks: int) -> List[int]:
    """The ids as a list, after checking they are distinct ints and that
    there are ``num_blocks`` of them (a ``range`` is distinct ints)."""
    if type(block_ids) is range and len(block_ids) == num_blocks:
        return list(block_ids)
    ids: List[int] = []
    for block_id in block_ids:
        if type(block_id) is not int:
            raise InvalidArgumentError(f"a block id must be an int, got {block_id!r}")
        ids.append(block_id)
    if len(set(ids)) != len(ids):
        raise InvalidArgumentError("block_ids contains duplicates")
    if len(ids) != num_blocks:
        raise InvalidArgumentError(f"{len(ids)} block ids given for num_blocks={num_blocks}")
    return ids
