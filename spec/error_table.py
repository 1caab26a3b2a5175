"""The error table: for every caller mistake, the exception it raises.

Each row names an operation, the mistake in words, the exception class of
:mod:`prefixcache.impl.errors` (or a builtin where vLLM's API fixes one) and
the allocators it applies to.  Every row comes with the same promise: the
call has no effect, the allocator's abstract state is exactly as before.

A ``NoFreeBlocksError`` row is not a mistake but a request that cannot be
satisfied now, and neither is an ``EvictorEmptyError`` row; both keep the
same all-or-nothing promise.

A row is named ``operation:tag``.  The oracle's fuzzer makes every row's
mistake (:mod:`prefixcache.oracle.mistakes`) on the target and on the model
alike, and checks the exception class, that nothing changed, and that the
allocator goes on serving.  Where vLLM's API fixes a wider class, the
target's exception need only be of that one: the target's own
``NoFreeBlocksError`` for a full pool, any ``ValueError`` for an empty
evictor (vLLM's is a plain one).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
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
    on the allocators named in ``applies_to``, and changes nothing.  ``tag``
    names the mistake among the operation's rows (SPEC.md's tag column);
    ``key``, ``operation:tag``, names the row."""

    operation: str
    mistake: str
    exception: Type[BaseException]
    applies_to: Tuple[str, ...] = BOTH
    tag: str = ""

    @cached_property
    def key(self) -> str:
        """The row's stable name, ``operation:tag`` (the oracle's coverage
        label is ``mistake:`` followed by it)."""
        return f"{self.operation}:{self.tag}"


Case = Tuple[str, str, Type[BaseException]]


def _rows(operation: str, applies_to: Tuple[str, ...], *cases: Case) -> List[ErrorCase]:
    return [ErrorCase(operation, m, e, applies_to, tag) for tag, m, e in cases]


_BLOCK_ARGUMENT: Tuple[Case, ...] = (
    ("not-a-block", "the argument is not a Block of this allocator's kind", WrongTypeError),
    ("detached", "the Block is detached (freed, swapped out, or never allocated)",
     DetachedBlockError),
    ("foreign", "the Block belongs to another allocator", ForeignBlockError),
    ("unknown-id", "the Block's id is not managed by this allocator", UnknownBlockIdError),
    ("stale", "the Block's id holds no reference (a stale Block: already freed)",
     RefCountError),
)

_NEW_BLOCK: Tuple[Case, ...] = (
    ("device", "a device is passed to a single-device allocator", InvalidArgumentError),
    ("prev-type", "prev_block is not a Block of this allocator's kind", WrongTypeError),
)

ERROR_TABLE: Tuple[ErrorCase, ...] = tuple(
    _rows("allocate_mutable_block", BOTH, *_NEW_BLOCK,
          ("no-free", "no id is free or evictable", NoFreeBlocksError))
    + _rows("allocate_mutable_block", (PREFIX,),
            ("extra-type", "extra_hash is neither None nor an int", WrongTypeError))
    + _rows("allocate_immutable_block", BOTH, *_NEW_BLOCK,
            ("tokens-type", "token_ids is not a list of ints", WrongTypeError),
            ("overfull", "more tokens than a block holds", BlockFullError),
            ("no-free", "no id is free (or evictable) for a miss", NoFreeBlocksError))
    + _rows("allocate_immutable_block", (PREFIX,),
            ("underfull", "fewer tokens than a block holds", UnhashableBlockError),
            ("prev-unhashed",
             "prev_block has no content hash (not full, or after a block that is not)",
             UnhashableBlockError),
            ("extra-type", "extra_hash is neither None nor an int", WrongTypeError))
    + _rows("allocate_immutable_blocks", BOTH, *_NEW_BLOCK,
            ("tokens-type", "a token list is not a list of ints", WrongTypeError),
            ("overfull", "a token list has more tokens than a block holds", BlockFullError),
            ("no-free",
             "the misses need more ids than are free or evictable (nothing is taken)",
             NoFreeBlocksError))
    + _rows("allocate_immutable_blocks", (PREFIX,),
            ("underfull", "a token list has fewer tokens than a block holds",
             UnhashableBlockError),
            ("prev-unhashed", "prev_block has no content hash", UnhashableBlockError),
            ("extra-type", "extra_hash is neither None nor an int", WrongTypeError))
    + _rows("free", BOTH, *_BLOCK_ARGUMENT)
    + _rows("free", (CPU_GPU,),
            ("pair-detached", "the Block is detached", DetachedBlockError),
            ("pair-unknown-id", "the Block's id belongs to neither device", UnknownBlockIdError))
    + _rows("free_block_id", (NAIVE,),
            ("unknown-id", "the id is not managed by this allocator", UnknownBlockIdError),
            ("double-free", "the id holds no reference (a double free)", RefCountError))
    + _rows("fork", BOTH,
            *((t, f"a Block of the chain: {m}", e) for t, m, e in _BLOCK_ARGUMENT))
    + _rows("fork", (CPU_GPU,),
            ("null-block", "the Block is the null block", InvalidArgumentError))
    + _rows("append_token_ids", BOTH,
            ("tokens-type", "token_ids is not a list of ints", WrongTypeError),
            ("overfull", "more tokens than the block has empty slots", BlockFullError),
            ("no-free-cow",
             "the id is shared and no id is free or evictable for the copy-on-write",
             NoFreeBlocksError))
    + _rows("append_token_ids", (PREFIX,),
            ("immutable", "the block is immutable (full and hashed) or computed",
             ImmutableBlockError))
    + _rows("append_token_ids", (CPU_GPU,),
            ("null-block", "the block is the null block", NullBlockWriteError))
    + _rows("cow_block_if_not_appendable", BOTH, *_BLOCK_ARGUMENT,
            ("no-free", "the id is shared and no id is free or evictable for the copy",
             NoFreeBlocksError))
    + _rows("cow_block_if_not_appendable", (PREFIX,),
            ("immutable-shared", "the id is shared and immutable (cached): it is never written",
             ImmutableBlockError))
    + _rows("promote_to_immutable_block", (PREFIX,), *_BLOCK_ARGUMENT,
            ("unhashable", "the block is not full, or an earlier block is not hashed",
             UnhashableBlockError),
            ("immutable", "the block is already immutable (its id is cached under its hash)",
             ImmutableBlockError))
    + _rows("promote_to_immutable_block", (NAIVE,),
            ("naive", "any call: the naive allocator has no promotion", NotImplementedError))
    + _rows("mark_blocks_as_accessed", (PREFIX,),
            ("unknown-id", "an id is not managed by this allocator (or is not an int)",
             UnknownBlockIdError),
            ("free-id", "an id is free: neither in use nor evictable here",
             BlockNotOnDeviceError),
            ("now-type", "now is not a number", WrongTypeError),
            ("now-nan", "now is NaN", InvalidArgumentError))
    + _rows("get_physical_block_id", ALL,
            ("unknown-id", "the id is not managed by this allocator", UnknownBlockIdError))
    + _rows("get_num_free_blocks", (PREFIX,),
            ("device", "a device is passed to a single-device allocator", InvalidArgumentError))
    + _rows("swap_out", BOTH, *_BLOCK_ARGUMENT,
            ("over-release", "one id is released more often than it is referenced",
             RefCountError),
            ("repeated", "one Block appears twice in the list", InvalidArgumentError))
    + _rows("swap_in", BOTH,
            ("attached", "a Block still holds an id (it was not swapped out)",
             InvalidArgumentError),
            ("repeated", "one Block appears twice in the list", InvalidArgumentError),
            ("no-free", "the Blocks need more ids than are free or evictable (nothing is taken)",
             NoFreeBlocksError))
    + _rows("swap_in", (PREFIX,),
            ("wrong-type", "a Block is not a PrefixCachingBlock", WrongTypeError))
    + _rows("swap", (CPU_GPU,),
            ("over-release", "a Block cannot be released on the source device (see swap_out)",
             RefCountError),
            ("no-free", "the destination cannot take every Block (nothing moves)",
             NoFreeBlocksError),
            ("unknown-device", "a device is unknown", InvalidArgumentError))
    + _rows("is_block_cached", (PREFIX,),
            ("unhashed", "the block has no content hash", UnhashableBlockError))
    + _rows("block_is_computed", (PREFIX,),
            ("unknown-id", "the id is not managed by this allocator", UnknownBlockIdError))
    + _rows("__init__", BOTH,
            ("sizes", "num_blocks is not an int >= 0 or block_size is not an int >= 1",
             InvalidArgumentError),
            ("block-ids", "block_ids has duplicates, non-ints, or not num_blocks ids",
             InvalidArgumentError))
    + _rows("__init__", (NAIVE,),
            ("create-block", "create_block is not callable", WrongTypeError))
    + _rows("__init__", (PREFIX,),
            ("hash-algo", "hash_algo is neither 'builtin', 'sha256' nor a callable",
             InvalidArgumentError),
            ("verify-content", "verify_content is not a bool", InvalidArgumentError))
    + _rows("create", (CPU_GPU,),
            ("allocator-type", "allocator_type is neither 'naive' nor 'prefix_caching'",
             InvalidArgumentError),
            ("counts", "a block count is not an int >= 0", InvalidArgumentError))
    + _rows("__init__", (CPU_GPU,),
            ("shared-ids", "the two allocators share an id", InvalidArgumentError))
    + _rows("RefCounter.decr", ALL,
            ("zero", "the count is already 0", RefCountError),
            ("unknown-id", "the id is unknown", UnknownBlockIdError))
    + _rows("ReadOnlyRefCounter.incr/decr", ALL, ("any", "any call", ReadOnlyError))
    + _rows("LRUEvictor.remove/update", ALL,
            ("absent", "the id is not in the evictor", NotInEvictorError))
    + _rows("LRUEvictor.evict", ALL, ("empty", "the evictor is empty", EvictorEmptyError))
    + _rows("make_evictor", ALL, ("policy", "the policy is unknown", InvalidArgumentError))
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
    return list(dict.fromkeys(row.operation for row in ERROR_TABLE))


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
