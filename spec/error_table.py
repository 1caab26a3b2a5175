"""The error table: for every caller mistake, the exception it raises.

Each row names an operation, the mistake in words, the exception class of
:mod:`prefixcache.impl.errors` (or a builtin where vLLM's API fixes one) and
the allocators it applies to.  Every row comes with the same promise: the
call has no effect, the allocator's abstract state is exactly as before.

A ``NoFreeBlocksError`` row is not a mistake but a request that cannot be
satisfied now; it keeps the same all-or-nothing promise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple, Type

from prefixcache.impl.errors import (
    BlockFullError,
    BlockNotOnDeviceError,
    DetachedBlockError,
    EvictorEmptyError,
    ForeignBlockError,
    ImmutableBlockError,
    InvalidArgumentError,
    NoFreeBlocksError,
    NotInEvictorError,
    NullBlockWriteError,
    ReadOnlyError,
    RefCountError,
    UnhashableBlockError,
    UnknownBlockIdError,
    WrongTypeError,
)

PREFIX = "prefix_caching"
NAIVE = "naive"
CPU_GPU = "cpu_gpu"
BOTH: Tuple[str, ...] = (PREFIX, NAIVE)
ALL: Tuple[str, ...] = (PREFIX, NAIVE, CPU_GPU)


@dataclass(frozen=True)
class ErrorCase:
    """One row: calling ``operation`` with ``mistake`` raises ``exception``
    on the allocators named in ``applies_to``, and changes nothing."""

    operation: str
    mistake: str
    exception: Type[BaseException]
    applies_to: Tuple[str, ...] = BOTH


def _rows(operation: str, applies_to: Tuple[str, ...],
          *cases: Tuple[str, Type[BaseException]]) -> List[ErrorCase]:
    return [ErrorCase(operation, m, e, applies_to) for m, e in cases]


_BLOCK_ARGUMENT: Tuple[Tuple[str, Type[BaseException]], ...] = (
    ("the argument is not a Block of this allocator's kind", WrongTypeError),
    ("the Block is detached (freed, swapped out, or never allocated)", DetachedBlockError),
    ("the Block belongs to another allocator", ForeignBlockError),
    ("the Block's id is not managed by this allocator", UnknownBlockIdError),
    ("the Block's id holds no reference (a stale Block: already freed)", RefCountError),
)

_NEW_BLOCK: Tuple[Tuple[str, Type[BaseException]], ...] = (
    ("a device is passed to a single-device allocator", InvalidArgumentError),
    ("prev_block is not a Block of this allocator's kind", WrongTypeError),
)

ERROR_TABLE: Tuple[ErrorCase, ...] = tuple(
    _rows("allocate_mutable_block", BOTH, *_NEW_BLOCK,
          ("no id is free or evictable", NoFreeBlocksError))
    + _rows("allocate_mutable_block", (PREFIX,),
            ("extra_hash is neither None nor an int", WrongTypeError))
    + _rows("allocate_immutable_block", BOTH, *_NEW_BLOCK,
            ("token_ids is not a list of ints", WrongTypeError),
            ("more tokens than a block holds", BlockFullError),
            ("no id is free (or evictable) for a miss", NoFreeBlocksError))
    + _rows("allocate_immutable_block", (PREFIX,),
            ("fewer tokens than a block holds", UnhashableBlockError),
            ("prev_block has no content hash (not full, or after a block that is not)",
             UnhashableBlockError),
            ("extra_hash is neither None nor an int", WrongTypeError))
    + _rows("allocate_immutable_blocks", BOTH, *_NEW_BLOCK,
            ("a token list is not a list of ints", WrongTypeError),
            ("a token list has more tokens than a block holds", BlockFullError),
            ("the misses need more ids than are free or evictable (nothing is taken)",
             NoFreeBlocksError))
    + _rows("allocate_immutable_blocks", (PREFIX,),
            ("a token list has fewer tokens than a block holds", UnhashableBlockError),
            ("prev_block has no content hash", UnhashableBlockError))
    + _rows("free", BOTH, *_BLOCK_ARGUMENT)
    + _rows("free", (CPU_GPU,),
            ("the Block is detached", DetachedBlockError),
            ("the Block's id belongs to neither device", UnknownBlockIdError))
    + _rows("free_block_id", (NAIVE,),
            ("the id is not managed by this allocator", UnknownBlockIdError),
            ("the id holds no reference (a double free)", RefCountError))
    + _rows("fork", BOTH, *((f"a Block of the chain: {m}", e) for m, e in _BLOCK_ARGUMENT))
    + _rows("fork", (CPU_GPU,), ("the Block is the null block", InvalidArgumentError))
    + _rows("append_token_ids", BOTH,
            ("token_ids is not a list of ints", WrongTypeError),
            ("more tokens than the block has empty slots", BlockFullError),
            ("the id is shared and no id is free or evictable for the copy-on-write",
             NoFreeBlocksError))
    + _rows("append_token_ids", (PREFIX,),
            ("the block is immutable (full and hashed) or computed", ImmutableBlockError))
    + _rows("append_token_ids", (CPU_GPU,),
            ("the block is the null block", NullBlockWriteError))
    + _rows("cow_block_if_not_appendable", BOTH, *_BLOCK_ARGUMENT,
            ("the id is shared and no id is free or evictable for the copy",
             NoFreeBlocksError))
    + _rows("cow_block_if_not_appendable", (PREFIX,),
            ("the id is shared and immutable (cached): it is never written",
             ImmutableBlockError))
    + _rows("promote_to_immutable_block", (PREFIX,), *_BLOCK_ARGUMENT,
            ("the block is not full, or an earlier block is not hashed",
             UnhashableBlockError),
            ("the block is already immutable (its id is cached under its hash)",
             ImmutableBlockError))
    + _rows("promote_to_immutable_block", (NAIVE,),
            ("any call: the naive allocator has no promotion", NotImplementedError))
    + _rows("mark_blocks_as_accessed", (PREFIX,),
            ("an id is not managed by this allocator (or is not an int)",
             UnknownBlockIdError),
            ("an id is free: neither in use nor evictable here", BlockNotOnDeviceError),
            ("now is not a number", WrongTypeError),
            ("now is NaN", InvalidArgumentError))
    + _rows("get_physical_block_id", ALL,
            ("the id is not managed by this allocator", UnknownBlockIdError))
    + _rows("get_num_free_blocks", (PREFIX,),
            ("a device is passed to a single-device allocator", InvalidArgumentError))
    + _rows("swap_out", BOTH, *_BLOCK_ARGUMENT,
            ("one id is released more often than it is referenced", RefCountError),
            ("one Block appears twice in the list", InvalidArgumentError))
    + _rows("swap_in", BOTH,
            ("a Block still holds an id (it was not swapped out)", InvalidArgumentError),
            ("one Block appears twice in the list", InvalidArgumentError),
            ("the Blocks need more ids than are free or evictable (nothing is taken)",
             NoFreeBlocksError))
    + _rows("swap_in", (PREFIX,), ("a Block is not a PrefixCachingBlock", WrongTypeError))
    + _rows("swap", (CPU_GPU,),
            ("a Block cannot be released on the source device (see swap_out)", RefCountError),
            ("the destination cannot take every Block (nothing moves)", NoFreeBlocksError),
            ("a device is unknown", InvalidArgumentError))
    + _rows("is_block_cached", (PREFIX,),
            ("the block has no content hash", UnhashableBlockError))
    + _rows("block_is_computed", (PREFIX,),
            ("the id is not managed by this allocator", UnknownBlockIdError))
    + _rows("__init__", BOTH,
            ("num_blocks is not an int >= 0 or block_size is not an int >= 1",
             InvalidArgumentError),
            ("block_ids has duplicates, non-ints, or not num_blocks ids", InvalidArgumentError))
    + _rows("__init__", (PREFIX,),
            ("hash_algo is neither 'builtin', 'sha256' nor a callable", InvalidArgumentError))
    + _rows("create", (CPU_GPU,),
            ("allocator_type is neither 'naive' nor 'prefix_caching'", InvalidArgumentError),
            ("a block count is not an int >= 0", InvalidArgumentError))
    + _rows("__init__", (CPU_GPU,),
            ("the two allocators share an id", InvalidArgumentError))
    + _rows("RefCounter.decr", ALL,
            ("the count is already 0", RefCountError),
            ("the id is unknown", UnknownBlockIdError))
    + _rows("ReadOnlyRefCounter.incr/decr", ALL, ("any call", ReadOnlyError))
    + _rows("LRUEvictor.remove/update", ALL,
            ("the id is not in the evictor", NotInEvictorError))
    + _rows("LRUEvictor.evict", ALL, ("the evictor is empty", EvictorEmptyError))
    + _rows("make_evictor", ALL, ("the policy is unknown", InvalidArgumentError))
)
"""Every caller mistake and the exception it raises (state unchanged)."""

#: Exceptions that depend on the argument's shape only, not on the state: a
#: checked allocator accepts them even where the abstract precondition holds.
ARGUMENT_ERRORS: Tuple[Type[BaseException], ...] = (
    WrongTypeError,
    InvalidArgumentError,
    ForeignBlockError,
)


def errors_of(operation: str, allocator: str = PREFIX) -> Dict[str, Type[BaseException]]:
    """Return mistake -> exception for one operation on one kind of
    allocator (``"prefix_caching"``, ``"naive"`` or ``"cpu_gpu"``)."""
    return {
        row.mistake: row.exception
        for row in ERROR_TABLE
        if row.operation == operation and allocator in row.applies_to
    }


def operations() -> List[str]:
    """Return every operation the table names, in table order, once each."""
    seen: Dict[str, None] = {}
    for row in ERROR_TABLE:
        seen.setdefault(row.operation, None)
    return list(seen)


__all__ = [
    "ALL",
    "ARGUMENT_ERRORS",
    "BOTH",
    "CPU_GPU",
    "ERROR_TABLE",
    "ErrorCase",
    "NAIVE",
    "PREFIX",
    "errors_of",
    "operations",
]
