"""Every exception prefixcache.impl raises, under one base class.

Two families:

* :class:`CallerError` -- the caller broke the API's rules (freed a detached
  Block, appended too many tokens, named an unknown id, ...).  The call had no
  effect: the allocator is exactly as it was before it.  Where vLLM 0.8.5
  rejected the same mistake with an ``assert``, the class also derives from
  :class:`AssertionError`, and where vLLM raised ``ValueError``/``KeyError`` it
  derives from that, so ``pytest.raises`` written for vLLM keeps passing while
  the check itself survives ``python -O``.
* :class:`NoFreeBlocksError` / :class:`EvictorEmptyError` -- a valid request
  that cannot be satisfied now.  Also all-or-nothing: nothing was taken.
"""

from __future__ import annotations


class PrefixCacheError(Exception):
    """Base class of every exception raised by prefixcache.impl."""


class NoFreeBlocksError(PrefixCacheError, ValueError):
    """No physical block id is free or evictable.

    Published as ``BlockAllocator.NoFreeBlocksError`` (vLLM's name)."""


class EvictorEmptyError(PrefixCacheError, ValueError):
    """``evict()`` on an evictor that holds no block."""


class CallerError(PrefixCacheError, ValueError, AssertionError):
    """The caller broke a rule of the API; the state is unchanged.

    Derives from ``ValueError`` and ``AssertionError`` because vLLM 0.8.5
    reports the same mistakes with one or the other."""


class InvalidArgumentError(CallerError):
    """An argument has a value the operation does not accept (a bad
    constructor argument, a negative size, duplicate ids, ...)."""


class WrongTypeError(CallerError, TypeError):
    """An argument has the wrong type (a token that is not an ``int``, a
    ``prev_block`` that is not a block of this kind, ...)."""


class _PlainMessageKeyError(KeyError):
    """A KeyError that prints its message as it is (KeyError prints a repr)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class UnknownBlockIdError(CallerError, _PlainMessageKeyError):
    """A physical block id that this allocator (or counter) does not own."""


class DetachedBlockError(CallerError):
    """The Block has no physical id (it was freed, swapped out, or never
    allocated), so it cannot be freed, forked or queried."""


class RefCountError(CallerError):
    """A reference count would drop below zero (a double free), or an id
    that holds no reference was used as if it did."""


class ForeignBlockError(CallerError):
    """The Block belongs to another allocator."""


class BlockFullError(CallerError):
    """More tokens than the block has empty slots."""


class ImmutableBlockError(CallerError):
    """An append to a block that is already full and hashed, or computed."""


class UnhashableBlockError(CallerError):
    """An immutable block was requested for tokens that do not fill the
    block, or whose previous block has no content hash."""


class NotInEvictorError(CallerError, _PlainMessageKeyError):
    """The id is not in the evictor (``remove``/``update`` of an absent id).

    vLLM raises ValueError for ``remove`` and KeyError for ``update``."""


class BlockNotOnDeviceError(CallerError):
    """``mark_blocks_as_accessed`` for an id that is neither in use nor
    evictable on this allocator."""


class ReadOnlyError(CallerError):
    """``incr``/``decr`` through a read-only view of a reference counter."""


class NullBlockWriteError(CallerError):
    """A write to the shared null block."""


__all__ = [
    "BlockFullError",
    "BlockNotOnDeviceError",
    "CallerError",
    "DetachedBlockError",
    "EvictorEmptyError",
    "ForeignBlockError",
    "ImmutableBlockError",
    "InvalidArgumentError",
    "NoFreeBlocksError",
    "NotInEvictorError",
    "NullBlockWriteError",
    "PrefixCacheError",
    "ReadOnlyError",
    "RefCountError",
    "UnhashableBlockError",
    "UnknownBlockIdError",
    "WrongTypeError",
]
