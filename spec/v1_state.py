"""The abstract state of vLLM v1's ``BlockPool`` (pinned: vLLM 0.34.0): an
immutable value.

Where v0's allocator keys its cache by content, the v1 pool keys it by a
caller-computed block hash: the request hashes each full block, chaining the
previous block's hash, and the pool files the block under that hash and a
KV-cache group id.  Duplicates are kept (two blocks that fill with the same
content are both cached, in the order they were cached), a lookup returns the
first, and removing the first promotes the next.  The eviction order is the
free queue itself: ids are handed out from its front.

A :data:`CacheKey` is the pair ``(block hash, group id)`` (vLLM packs it as
the hash's bytes followed by the group id in 4 big-endian bytes).  The block
hash of a token chain is :func:`chain_hashes`'s: what vLLM's
``hash_block_tokens`` computes for requests without multi-modal, LoRA or
prompt-embedding inputs, whose only extra key is the cache salt, on the first
block.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence, Tuple

BlockId = int
Tokens = Tuple[int, ...]
#: A block hash: the bytes vLLM's hash function returns.
BlockHash = bytes
#: The key a block is cached under: its block hash and its KV-cache group id.
CacheKey = Tuple[BlockHash, int]
#: What a block hash stands for: the cache salt (None: unsalted) and the exact
#: tokens of every block of its chain, first block first.
HashedContent = Tuple[Optional[str], Tuple[Tokens, ...]]
#: The id of the null block: the pool takes the first id of its free queue
#: for it when it is built, and never queues, counts or caches it again.
NULL_BLOCK: BlockId = 0


@dataclass(frozen=True)
class V1State:
    """The whole observable state of one v1 ``BlockPool``.

    * ``num_blocks``: the number of physical ids, ``0 .. num_blocks - 1``.
    * ``null_block``: the id of the null block (:data:`NULL_BLOCK`).
    * ``ref_cnt``: the reference count of every id, by id (the null block's
      is 0: the pool does not maintain it).
    * ``free_queue``: the ids with no reference, in the order the pool hands
      them out (first = next; a cached id there is an eviction candidate).
    * ``queue_backward``: the free queue as its back links list it (read from
      its back, then reversed): ``free_queue`` again in a sound list.
    * ``reported_free``: what ``get_num_free_blocks()`` answers.
    * ``cached``: key -> the ids cached under it, in the order they were
      cached (duplicates kept; never empty).
    * ``lookup``: key -> the id a lookup of that key returns.
    * ``block_keys``: id -> the key the id is cached under (its
      ``block_hash``) and the number of prefix tokens that key covers, for
      every id that holds one.
    * ``secondary``: id -> further keys the id is cached under (vLLM's
      ``cached_block_hashes_by_block``: partial entries); empty for the
      operations the model makes.
    * ``contents``: block hash -> the content it was computed from, for the
      hashes whose content the caller recorded (the model records all it is
      given); empty when unknown (then the salt check is skipped).
    * ``block_size``: tokens per block; 0 when not recorded.
    """

    num_blocks: int
    null_block: BlockId
    ref_cnt: Tuple[int, ...]
    free_queue: Tuple[BlockId, ...]
    queue_backward: Tuple[BlockId, ...]
    reported_free: int
    cached: Mapping[CacheKey, Tuple[BlockId, ...]] = field(hash=False)
    lookup: Mapping[CacheKey, BlockId] = field(hash=False)
    block_keys: Mapping[BlockId, Tuple[CacheKey, int]] = field(hash=False)
    secondary: Mapping[BlockId, frozenset[CacheKey]] = field(hash=False)
    contents: Mapping[BlockHash, HashedContent] = field(hash=False, default_factory=dict)
    block_size: int = 0

    def keys_of(self, block_id: BlockId) -> frozenset[CacheKey]:
        """Every key ``block_id`` is cached under, primary and secondary."""
        primary = self.block_keys.get(block_id)
        rest = self.secondary.get(block_id, frozenset())
        return rest | {primary[0]} if primary is not None else rest

    def usage(self) -> float:
        """What ``get_usage()`` answers: the share of the ids other than the
        null block that are not free (0.0 for a pool of the null block alone)."""
        total = self.num_blocks - 1
        return 0.0 if total == 0 else 1.0 - self.reported_free / total


def salt_key(salt: Optional[str]) -> Optional[Tuple[Tuple[str, str], ...]]:
    """The extra keys of a chain's first block: the cache salt, if any."""
    return (("cache_salt", salt),) if salt else None


def chain_hashes(hash_fn: Callable[[Any], bytes], none_hash: BlockHash,
                 blocks: Sequence[Tokens], salt: Optional[str] = None) -> list[BlockHash]:
    """The block hashes of the full blocks ``blocks`` of one request, as vLLM
    chains them: block ``k``'s hash is ``hash_fn((parent, tokens_k, extra_k))``
    where ``parent`` is block ``k - 1``'s hash (``none_hash`` for the first)
    and ``extra_k`` is :func:`salt_key` for the first block and None after."""
    out: list[BlockHash] = []
    for k, tokens in enumerate(blocks):
        parent = out[-1] if out else none_hash
        out.append(hash_fn((parent, tuple(tokens), salt_key(salt) if k == 0 else None)))
    return out


def pack_key(key: CacheKey) -> bytes:
    """``key`` as vLLM packs it: the hash, then the group id in 4 big-endian bytes."""
    return key[0] + key[1].to_bytes(4, "big", signed=False)


def unpack_key(packed: bytes) -> CacheKey:
    """The :data:`CacheKey` vLLM's packed key ``packed`` stands for."""
    return bytes(packed[:-4]), int.from_bytes(packed[-4:], "big", signed=False)
