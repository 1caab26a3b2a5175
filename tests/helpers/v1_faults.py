"""v1 pools the oracle's v1 tests use as targets (importable by
``module:Class`` from a subprocess with ``tests/`` on ``PYTHONPATH``): vLLM
0.34.0's real BlockPool with one fault planted by a run-time edit, and a
black-box wrapper that shows only the pool's API."""

from __future__ import annotations

from typing import Any

from prefixcache.bench.v1_corpus import VARIANTS
from prefixcache.oracle.vllm_v1_source import load_v1

_BY_NAME = {v.name: v for v in VARIANTS}

#: freed cached blocks go to the front of the free queue
CachedFreedToFront = load_v1(edits=_BY_NAME["cached-freed-to-front"].as_edits()).BlockPool
#: popleft_n counts one block too few when taking two or more
PopleftLostDecrement = load_v1(edits=_BY_NAME["popleft-n-lost-decrement"].as_edits()).BlockPool


class BlackBox:
    """A pool that shows only the v1 API and its null block (no internals)."""

    def __init__(self, num_gpu_blocks: int, enable_caching: bool, hash_block_size: int,
                 pool_class: Any = None) -> None:
        cls = pool_class or load_v1().BlockPool
        self._pool = cls(num_gpu_blocks=num_gpu_blocks, enable_caching=enable_caching,
                         hash_block_size=hash_block_size)
        self.null_block = self._pool.null_block
        for name in ("get_new_blocks", "cache_full_blocks", "get_cached_block", "touch",
                     "free_blocks", "evict_blocks", "reset_prefix_cache",
                     "get_num_free_blocks", "get_usage"):
            setattr(self, name, getattr(self._pool, name))


class BlackBoxPopleftLostDecrement(BlackBox):
    """The black-box pool whose popleft_n loses a decrement."""

    def __init__(self, num_gpu_blocks: int, enable_caching: bool,
                 hash_block_size: int) -> None:
        super().__init__(num_gpu_blocks, enable_caching, hash_block_size, PopleftLostDecrement)
