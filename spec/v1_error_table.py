"""The v1 error table: the caller mistakes of vLLM v1's ``BlockPool``, what the
spec asks of each, and what the pinned releases do (0.34.0, and each earlier
pinned release alike).

The spec's rule is v0's: a mistake raises and changes nothing.  The v1 pool
checks few of its arguments (it trusts its one caller, the KV-cache manager):
the ``pinned`` column says what 0.34.0 does, and ``silent`` marks the
mistakes it accepts without raising, which leave the pool's state broken
(the invariants name how) or act on the wrong block.  A row is named
``operation:tag``, as v0's are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple, Type


@dataclass(frozen=True)
class V1ErrorCase:
    """One row: calling ``operation`` with ``mistake`` should raise
    ``expected`` and change nothing; 0.34.0 raises ``pinned_raises`` (None:
    nothing) and ``pinned`` says with what effect."""

    operation: str
    tag: str
    mistake: str
    expected: Type[BaseException]
    pinned_raises: Optional[Type[BaseException]]
    pinned: str

    @property
    def key(self) -> str:
        """The row's stable name, ``operation:tag``."""
        return f"{self.operation}:{self.tag}"

    @property
    def silent(self) -> bool:
        """Whether 0.34.0 accepts the mistake without raising."""
        return self.pinned_raises is None


V1_ERROR_TABLE: Tuple[V1ErrorCase, ...] = (
    V1ErrorCase("get_new_blocks", "too-many", "more blocks than are free", ValueError,
                ValueError, "raises; nothing changes (not a mistake: a request that cannot "
                "be met now)"),
    V1ErrorCase("get_new_blocks", "negative", "a negative number of blocks", ValueError,
                None, "returns []; the free count grows by the number's size while the "
                "queue does not (free_count_is_queue_length)"),
    V1ErrorCase("free_blocks", "unreferenced", "a block that holds no reference (already "
                "free, or freed twice)", ValueError, None,
                "its ref_cnt goes below zero; a queued block stays queued "
                "(refcounts_non_negative, referenced_not_queued)"),
    V1ErrorCase("free_blocks", "repeated", "one block twice in the list, with one "
                "reference", ValueError, None, "the same as unreferenced, for the second"),
    V1ErrorCase("touch", "not-cached-free", "a free block that holds no hash (no lookup "
                "returned it)", ValueError, None, "takes it out of the free queue with one "
                "reference, as a hit would: the caller now holds a block it never allocated"),
    V1ErrorCase("cache_full_blocks", "unreferenced", "a block that holds no reference",
                ValueError, None, "caches it: a free block becomes a lookup hit"),
    V1ErrorCase("cache_full_blocks", "already-cached", "a block already cached over as "
                "many tokens", ValueError, AssertionError,
                "an assert; the blocks before it in the list stay cached"),
    V1ErrorCase("cache_full_blocks", "too-few-hashes", "fewer request hashes than full "
                "blocks", ValueError, IndexError,
                "IndexError; the blocks before the first without a hash stay cached"),
    V1ErrorCase("evict_blocks", "unknown-id", "an id at or past the number of blocks",
                ValueError, AssertionError, "an assert; the ids before it (set order) are "
                "evicted"),
    V1ErrorCase("evict_blocks", "negative-id", "a negative id", ValueError, None,
                "Python's negative indexing evicts the block counted from the end"),
    V1ErrorCase("get_cached_block", "no-groups", "an empty list of group ids", ValueError,
                None, "returns [] (a hit of nothing) rather than None"),
)
"""Every row, grouped by operation."""
