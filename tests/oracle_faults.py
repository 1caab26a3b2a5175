"""Faulty allocators the oracle's own tests use as targets (importable by
``module:Class`` from a subprocess with ``tests/`` on ``PYTHONPATH``)."""

from __future__ import annotations

from prefixcache.impl.prefix_caching_block import PrefixCachingBlockAllocator


class FreesToTheRight(PrefixCachingBlockAllocator):
    """Puts a freed mutable id at the wrong end of the free list: the next
    allocation hands out a different id than vLLM would."""

    def _release_block(self, block, block_id):  # type: ignore[no-untyped-def]
        before = len(self._free_ids)
        super()._release_block(block, block_id)
        if len(self._free_ids) > before:
            self._free_ids.append(self._free_ids.popleft())
