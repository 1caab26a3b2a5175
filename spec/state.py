"""The abstract state of a prefix-caching block allocator: an immutable value.

Everything the spec says is said about an :class:`AbstractState`.  The model
keeps one; the abstraction function (spec/abstraction.py) reads one out of
any allocator with vLLM-shaped internals.  Content is named by a
:data:`ContentKey` -- the extra hash and the exact tokens of every block from
the first one -- never by a hash, so two different contents can never look
equal here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Tuple

from .pure import eviction_rank

BlockId = int
Tokens = Tuple[int, ...]
#: The exact content of a full block whose chain is hashed: the extra hash and
#: the exact tokens of every block from the first one, as a tuple of
#: ``(extra_hash, tokens)`` pairs, one per block, first block first, this
#: block last.  Two chains are the same content exactly when every block
#: carries the same extra hash and the same tokens (what a vLLM block hash,
#: which chains each block's own extra hash, distinguishes).  Never a hash.
ContentKey = Tuple[Tuple[Optional[int], Tokens], ...]

#: The ``last_accessed`` of an id that was never marked accessed since it was
#: (re)allocated: vLLM's ``_DEFAULT_LAST_ACCESSED_TIME``.
NEVER_ACCESSED: float = -1.0


@dataclass(frozen=True)
class BlockState:
    """What the allocator knows about one physical id that is not free.

    ``refcount`` 0 means evictable (it sits in the evictor and stays cached);
    ``content`` is None for a mutable (not yet full or unhashable) block.
    """

    refcount: int
    content: Optional[ContentKey]
    computed: bool
    last_accessed: float


@dataclass(frozen=True, order=True)
class EvictorEntry:
    """One evictable id, fields in the order that defines the eviction order
    except that ``num_hashed_tokens`` counts with the opposite sign.
    ``num_hashed_tokens`` is the number of tokens ``content`` covers: the
    tokens of every block of its chain."""

    last_accessed: float
    num_hashed_tokens: int
    block_id: BlockId
    content: ContentKey

    def eviction_rank(self) -> Tuple[float, int, BlockId]:
        """This entry's key in the eviction order (:func:`.pure.eviction_rank`)."""
        return eviction_rank(self.last_accessed, self.num_hashed_tokens, self.block_id)


@dataclass(frozen=True)
class AbstractState:
    """The whole observable state of one allocator (one device).

    * ``block_ids``: every physical id, sorted.
    * ``free``: the ids that hold no content and no reference, in the order
      in which they will be handed out (first = next).
    * ``blocks``: id -> :class:`BlockState` for every id that is in use
      (refcount > 0) or evictable (refcount 0, still cached).
    * ``cached``: content key -> id for every cached id, in use or evictable.
    * ``evictor``: the evictable ids in eviction order (first = next victim).
    * ``touched``: ids promoted since the last ``mark_blocks_as_computed``.
    * ``copy_on_writes``: the (source, destination) pairs recorded and not yet
      cleared, in order.
    * ``hits`` / ``misses``: cache queries since construction or the last
      successful ``reset_prefix_cache``.
    * ``reported_free``: what ``get_num_free_blocks()`` answers.
    * ``block_size``: tokens per block; 0 when not recorded (then the checks
      that need it are skipped).

    ``blocks[i].computed`` is what ``block_is_computed(i)`` answers: the
    tracked flag of an id in use; for an evictable id True unless it is
    touched (promoted, then released before ``mark_blocks_as_computed``; vLLM
    0.8.5 answers True for it too).  Hence a block with content is computed
    exactly when it is not touched, and a mutable id (``content`` None) never
    is.  ``blocks[i].last_accessed`` of an evictable id is its evictor entry's
    time.
    """

    block_ids: Tuple[BlockId, ...]
    free: Tuple[BlockId, ...]
    blocks: Mapping[BlockId, BlockState] = field(hash=False)
    cached: Mapping[ContentKey, BlockId] = field(hash=False)
    evictor: Tuple[EvictorEntry, ...]
    touched: frozenset[BlockId]
    copy_on_writes: Tuple[Tuple[BlockId, BlockId], ...]
    hits: int
    misses: int
    reported_free: int
    block_size: int = 0

    def in_use(self) -> frozenset[BlockId]:
        """Ids with at least one reference."""
        return frozenset(i for i, b in self.blocks.items() if b.refcount > 0)

    def evictable(self) -> frozenset[BlockId]:
        """Ids with no reference that are still cached (in the evictor)."""
        return frozenset(i for i, b in self.blocks.items() if b.refcount == 0)
