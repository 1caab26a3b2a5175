"""Faulty allocators the oracle's own tests use as targets (importable by
``module:Class`` from a subprocess with ``tests/`` on ``PYTHONPATH``)."""

from __future__ import annotations

from prefixcache.impl.evictor import LRUEvictor
from prefixcache.impl.prefix_caching_block import PrefixCachingBlockAllocator


class FreesToTheRight(PrefixCachingBlockAllocator):
    """Puts a freed mutable id at the wrong end of the free list: the next
    allocation hands out a different id than vLLM would."""

    def _release_block(self, block, block_id):  # type: ignore[no-untyped-def]
        before = len(self._free_ids)
        super()._release_block(block, block_id)
        if len(self._free_ids) > before:
            self._free_ids.append(self._free_ids.popleft())


class WrongHitRateAndCommonPrefix(PrefixCachingBlockAllocator):
    """Two independent faults: the hit rate is always 0.0, and the common
    prefix of several id lists is always the first list.  One campaign must
    report both."""

    def get_prefix_cache_hit_rate(self, device=None):  # type: ignore[no-untyped-def]
        return 0.0

    def get_common_computed_block_ids(self, computed_seq_block_ids):  # type: ignore[no-untyped-def]
        lists = [ids for ids in computed_seq_block_ids if ids]
        return list(lists[0]) if lists else []


class ForkLoopsOnLongChains(PrefixCachingBlockAllocator):
    """``fork`` never returns for a chain of three blocks or more."""

    def fork(self, last_block):  # type: ignore[no-untyped-def]
        length, block = 0, last_block
        while block is not None:
            length, block = length + 1, block.prev_block
        while length >= 3:
            pass
        return super().fork(last_block)


class Chatty(PrefixCachingBlockAllocator):
    """Correct, but logs a warning at every mutable allocation."""

    def allocate_mutable_block(self, prev_block, extra_hash=None, device=None):  # type: ignore[no-untyped-def]
        import logging

        logging.getLogger("chatty.allocator").warning("allocating after %s", prev_block)
        return super().allocate_mutable_block(prev_block, extra_hash=extra_hash, device=device)


class ListsOnly(PrefixCachingBlockAllocator):
    """Takes only lists in ``get_common_computed_block_ids``, as vLLM 0.8.5
    does (its os.path.commonprefix compares a list with a tuple)."""

    def get_common_computed_block_ids(self, computed_seq_block_ids):  # type: ignore[no-untyped-def]
        if not all(type(ids) is list for ids in computed_seq_block_ids):
            raise TypeError("'<' not supported between instances of 'tuple' and 'list'")
        return super().get_common_computed_block_ids(computed_seq_block_ids)


class AssertsOnDetachedFree(PrefixCachingBlockAllocator):
    """Answers the free of a detached Block with a bare AssertionError (as
    vLLM 0.8.5 does), changing nothing."""

    def free(self, block, keep_block_object=False):  # type: ignore[no-untyped-def]
        if getattr(block, "block_id", 0) is None:
            raise AssertionError("block_id is None")
        return super().free(block, keep_block_object=keep_block_object)


class _KeyErrorEvictor(LRUEvictor):
    """An LRU evictor that refuses ``evict()`` when empty with a KeyError."""

    def evict(self):  # type: ignore[no-untyped-def]
        if not self.free_table:
            raise KeyError("empty")
        return super().evict()


class EvictorRaisesKeyError(PrefixCachingBlockAllocator):
    """Its evictor refuses ``evict()`` when empty with a KeyError, not the
    API's ValueError."""

    def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.evictor = _KeyErrorEvictor()


class HashesOtherTokensAsZero(PrefixCachingBlockAllocator):
    """Accepts a token that is not an int in ``allocate_immutable_block`` and
    hashes it as 0: a Block of ``['x']`` hits the id that holds ``[0]``, so
    it is handed someone else's KV."""

    def allocate_immutable_block(self, prev_block, token_ids, extra_hash=None, device=None):  # type: ignore[no-untyped-def]
        as_ints = [t if type(t) is int else 0 for t in token_ids]
        block = super().allocate_immutable_block(prev_block, as_ints, extra_hash, device)
        block._token_ids = list(token_ids)
        return block
