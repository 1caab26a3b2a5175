"""The evictor (vLLM's ``vllm.core.evictor``): the cached blocks that no
sequence references, and the order in which they are given up.

Eviction order, at every moment and whatever sequence of ``add``,
``update``, ``remove`` and ``evict`` led there: smallest ``last_accessed``
first; on a tie the largest ``num_hashed_tokens`` (the deepest block of a
chain); then the smallest block id; then the smallest content hash.
"""

from __future__ import annotations

import enum
import heapq
from abc import ABC, abstractmethod
from typing import Dict, List, Tuple

from .errors import EvictorEmptyError, InvalidArgumentError, NotInEvictorError

# (last_accessed, -num_hashed_tokens, block_id, content_hash): plain tuple order
# is the eviction order.
_HeapEntry = Tuple[float, int, int, int]


class EvictionPolicy(enum.Enum):
    """The eviction policies there are: only LRU."""

    LRU = enum.auto()


class Evictor(ABC):
    """The interface of an evictor."""

    @abstractmethod
    def __init__(self) -> None: ...

    @abstractmethod
    def __contains__(self, block_id: int) -> bool: ...

    @abstractmethod
    def evict(self) -> Tuple[int, int]:
        """Remove the next victim; return ``(block_id, content_hash)``."""

    @abstractmethod
    def add(
        self, block_id: int, content_hash: int, num_hashed_tokens: int, last_accessed: float
    ) -> None:
        """Put (or overwrite) the entry of ``block_id``."""

    @abstractmethod
    def update(self, block_id: int, last_accessed: float) -> None:
        """Set the access time of ``block_id``."""

    @abstractmethod
    def remove(self, block_id: int) -> None:
        """Take ``block_id`` out."""

    @property
    @abstractmethod
    def num_blocks(self) -> int: ...


class BlockMetaData:
    """The data of one evictor entry."""

    __slots__ = ("content_hash", "num_hashed_tokens", "last_accessed")

    def __init__(self, content_hash: int, num_hashed_tokens: int, last_accessed: float) -> None:
        self.content_hash = content_hash
        self.num_hashed_tokens = num_hashed_tokens
        self.last_accessed = last_accessed

    def __repr__(self) -> str:
        return (
            f"BlockMetaData(content_hash={self.content_hash!r}, "
            f"num_hashed_tokens={self.num_hashed_tokens!r}, last_accessed={self.last_accessed!r})"
        )


_new_meta = object.__new__
_heappush = heapq.heappush
_heappop = heapq.heappop


class LRUEvictor(Evictor):
    """Least-recently-used eviction, exact at every moment.

    ``free_table`` (id -> :class:`BlockMetaData`, insertion order) is the
    truth.  A binary heap of ``(last_accessed, -num_hashed_tokens, id, hash)``
    tuples keeps the order; entries made stale by ``update``/``remove`` stay in
    the heap and are skipped when they surface, and the heap is rebuilt once
    stale entries outnumber live ones.  Costs: ``add``/``update`` O(log n),
    ``remove`` O(1), ``evict`` O(log n) amortised, ``in`` O(1)."""

    _COMPACT_SLACK = 64

    def __init__(self) -> None:
        self.free_table: Dict[int, BlockMetaData] = {}
        self.priority_queue: List[_HeapEntry] = []

    def __contains__(self, block_id: int) -> bool:
        return block_id in self.free_table

    def _is_live(self, entry: _HeapEntry) -> bool:
        meta = self.free_table.get(entry[2])
        return (
            meta is not None
            and meta.last_accessed == entry[0]
            and meta.num_hashed_tokens == -entry[1]
            and meta.content_hash == entry[3]
        )

    def _push(self, block_id: int, meta: BlockMetaData) -> None:
        queue = self.priority_queue
        heapq.heappush(
            queue, (meta.last_accessed, -meta.num_hashed_tokens, block_id, meta.content_hash)
        )
        if len(queue) > 2 * len(self.free_table) + self._COMPACT_SLACK:
            self._compact()

    def _compact(self) -> None:
        """Rebuild the heap from ``free_table`` (drops every stale entry)."""
        queue = [
            (meta.last_accessed, -meta.num_hashed_tokens, block_id, meta.content_hash)
            for block_id, meta in self.free_table.items()
        ]
        heapq.heapify(queue)
        self.priority_queue = queue

    def evict(self) -> Tuple[int, int]:
        """Remove the first entry in eviction order; return ``(id, hash)``.

        Raises EvictorEmptyError (a ValueError) when there is none."""
        table = self.free_table
        if not table:
            raise EvictorEmptyError("No usable cache memory left")
        queue = self.priority_queue
        while True:
            entry = _heappop(queue)
            block_id = entry[2]
            meta = table.get(block_id)
            if (meta is not None and meta.last_accessed == entry[0]
                    and meta.num_hashed_tokens == -entry[1] and meta.content_hash == entry[3]):
                del table[block_id]
                return block_id, entry[3]

    def peek(self) -> Tuple[int, int]:
        """The entry ``evict()`` would remove, without removing it."""
        if not self.free_table:
            raise EvictorEmptyError("No usable cache memory left")
        queue = self.priority_queue
        while not self._is_live(queue[0]):
            heapq.heappop(queue)
        return queue[0][2], queue[0][3]

    def add(
        self, block_id: int, content_hash: int, num_hashed_tokens: int, last_accessed: float
    ) -> None:
        """Put (or overwrite) ``block_id``'s entry. O(log n)."""
        table = self.free_table
        meta = _new_meta(BlockMetaData)  # BlockMetaData(...) without the Python-level call
        meta.content_hash = content_hash
        meta.num_hashed_tokens = num_hashed_tokens
        meta.last_accessed = last_accessed
        table[block_id] = meta
        queue = self.priority_queue
        _heappush(queue, (last_accessed, -num_hashed_tokens, block_id, content_hash))
        if len(queue) > 2 * len(table) + self._COMPACT_SLACK:
            self._compact()

    def update(self, block_id: int, last_accessed: float) -> None:
        """Set ``block_id``'s access time. O(log n).

        Raises NotInEvictorError (a KeyError) for an absent id."""
        meta = self.free_table.get(block_id)
        if meta is None:
            raise NotInEvictorError(f"block {block_id} is not in the evictor")
        if meta.last_accessed != last_accessed:
            meta.last_accessed = last_accessed
            self._push(block_id, meta)

    def remove(self, block_id: int) -> None:
        """Take ``block_id`` out. O(1).

        Raises NotInEvictorError (a ValueError) for an absent id."""
        if self.free_table.pop(block_id, None) is None:
            raise NotInEvictorError("Attempting to remove block that's not in the evictor")
        if not self.free_table:
            self.priority_queue.clear()

    @property
    def num_blocks(self) -> int:
        """How many entries the evictor holds."""
        return len(self.free_table)


def make_evictor(eviction_policy: EvictionPolicy) -> LRUEvictor:
    """A new empty evictor for ``eviction_policy`` (only LRU exists)."""
    if eviction_policy == EvictionPolicy.LRU:
        return LRUEvictor()
    raise InvalidArgumentError(f"Unknown cache eviction policy: {eviction_policy}")
