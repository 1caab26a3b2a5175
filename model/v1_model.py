"""The model of vLLM v1's ``BlockPool`` (pinned: 0.34.0), with prefix caching on.

Plain lists and dicts: the free queue is a list, front first; the hash map is a
dict from :data:`~prefixcache.spec.v1_state.CacheKey` to the ids cached under
it, in the order they were cached.  Blocks are named by their ids.  The block
hashes are the caller's (:func:`~prefixcache.spec.v1_state.chain_hashes`
computes them as vLLM does).  A caller mistake (a row of
:data:`~prefixcache.spec.v1_error_table.V1_ERROR_TABLE`) raises ValueError
before anything changes; every call ends by checking the v1 invariants when
``check_invariants`` is on.
"""

from __future__ import annotations

from collections import Counter
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, TypeVar

from ..spec.v1_invariants import check_all_v1
from ..spec.v1_state import NULL_BLOCK, BlockHash, BlockId, CacheKey, HashedContent, V1State
from .errors import ModelInvariantError

_R = TypeVar("_R")


class V1Refusal(ValueError):
    """The model refuses a call: ``row`` names the row of the v1 error table
    the call breaks (``operation:tag``), or is "" for a malformed call outside
    the table (an unknown id, a block size that is no multiple, ...)."""

    def __init__(self, row: str, message: str) -> None:
        super().__init__(message)
        self.row = row


class V1Model:
    """What a correct v1 ``BlockPool`` of ``num_blocks`` ids answers; block
    hashes are computed every ``hash_block_size`` tokens.  Id 0 is the null
    block: never handed out, queued, counted or cached."""

    def __init__(self, num_blocks: int, hash_block_size: int,
                 check_invariants: bool = True) -> None:
        """A fresh pool: every id but the null block free, in id order; no hash."""
        if num_blocks < 1 or hash_block_size < 1:
            raise ValueError("a pool needs at least one block and a positive hash block size")
        self.num_blocks, self.hash_block_size = num_blocks, hash_block_size
        self.check_invariants = check_invariants
        self.ref: List[int] = [0] * num_blocks
        self.queue: List[BlockId] = [i for i in range(num_blocks) if i != NULL_BLOCK]
        self.cached: Dict[CacheKey, List[BlockId]] = {}
        self.key_of: Dict[BlockId, Tuple[CacheKey, int]] = {}
        self.contents: Dict[BlockHash, HashedContent] = {}

    # -- operations -------------------------------------------------------------------

    def get_new_blocks(self, num_blocks: int) -> List[BlockId]:
        """Take ``num_blocks`` ids from the front of the free queue; each loses its
        key (if cached: its entry goes, the next id under the key is promoted)
        and gets one reference.  Returns them in queue order."""
        if not 0 <= num_blocks <= len(self.queue):
            raise V1Refusal("get_new_blocks:" + ("negative" if num_blocks < 0 else "too-many"),
                            f"cannot get {num_blocks} of {len(self.queue)} free blocks")
        taken, self.queue = self.queue[:num_blocks], self.queue[num_blocks:]
        for i in taken:
            self._uncache(i)
            self.ref[i] = 1
        return self._done(taken)

    def cache_full_blocks(self, block_hashes: Sequence[BlockHash], blocks: Sequence[BlockId],
                          num_cached_blocks: int, num_full_blocks: int, block_size: int,
                          group_id: int) -> None:
        """Cache ``blocks[num_cached_blocks:num_full_blocks]`` (the null block
        skipped): block ``k`` under (its hash, ``group_id``), after the ids
        already cached under that key, covering ``(k + 1) * block_size`` tokens;
        a block cached over fewer tokens loses that key first.
        ``block_hashes`` are the request's, one per ``hash_block_size`` tokens:
        block ``k``'s is the last one inside it."""
        if num_cached_blocks < 0:
            raise V1Refusal("", "a negative number of cached blocks")
        if num_cached_blocks >= num_full_blocks:
            return self._done(None)
        scale, rest = divmod(block_size, self.hash_block_size)
        new = [(k, i) for k, i in enumerate(blocks[:num_full_blocks]) if k >= num_cached_blocks
               and i != NULL_BLOCK]
        if rest or scale < 1 or num_full_blocks > len(blocks) or any(self._bad(i) for _, i in new):
            raise V1Refusal("", "unknown blocks, or a block size that is no multiple")
        if num_full_blocks * scale > len(block_hashes):
            raise V1Refusal("cache_full_blocks:too-few-hashes", "too few hashes")
        if any(self.ref[i] <= 0 for _, i in new):
            raise V1Refusal("cache_full_blocks:unreferenced", "a block holds no reference")
        if any(self.key_of.get(i, (None, 0))[1] >= (k + 1) * block_size for k, i in new):
            raise V1Refusal("cache_full_blocks:already-cached",
                            "a block is cached over as many tokens already")
        if len({i for _, i in new}) != len(new):
            raise V1Refusal("", "a block is listed twice")
        for k, i in new:
            self._uncache(i)  # a key over fewer tokens gives way
            key = (block_hashes[(k + 1) * scale - 1], group_id)
            self.key_of[i] = (key, (k + 1) * block_size)
            self.cached.setdefault(key, []).append(i)
        return self._done(None)

    def get_cached_block(self, block_hash: BlockHash,
                         group_ids: Sequence[int]) -> Optional[List[BlockId]]:
        """The first id cached under (``block_hash``, g) for each group g, or None
        when one of them is not cached.  Nothing changes."""
        if not group_ids:
            raise V1Refusal("get_cached_block:no-groups", "a lookup names at least one group")
        found = [self.cached.get((block_hash, g), [None])[0] for g in group_ids]
        return None if None in found else [i for i in found if i is not None]

    def touch(self, blocks: Sequence[BlockId]) -> None:
        """One more reference to each id (the null block skipped); a free id
        leaves the free queue.  Only cached or referenced ids may be touched."""
        touched = [i for i in blocks if i != NULL_BLOCK]
        if any(self._bad(i) for i in touched):
            raise V1Refusal("", "touched an unknown block")
        if any(self.ref[i] == 0 and i not in self.key_of for i in touched):
            raise V1Refusal("touch:not-cached-free", "touched a free block that is not cached")
        for i in touched:
            if self.ref[i] == 0:
                self.queue.remove(i)
            self.ref[i] += 1
        return self._done(None)

    def free_blocks(self, ordered_blocks: Iterable[BlockId], evict_first: bool = False) -> None:
        """One reference fewer for each id (the null block skipped).  The ids
        left without one join the free queue, in the order given: those
        without a key (or all, with ``evict_first``) at its front, the cached
        ones at its back."""
        ordered = [i for i in ordered_blocks if i != NULL_BLOCK]
        if any(self._bad(i) for i in ordered):
            raise V1Refusal("", "freed an unknown block")
        if any(self.ref[i] < n for i, n in Counter(ordered).items()):
            raise V1Refusal("free_blocks:" + ("unreferenced" if any(self.ref[i] == 0 for i in
                                              ordered) else "repeated"),
                            "freed a block more times than it is referenced")
        front: List[BlockId] = []
        back: List[BlockId] = []
        for i in ordered:
            self.ref[i] -= 1
            if self.ref[i] == 0:
                (front if evict_first or i not in self.key_of else back).append(i)
        self.queue = front + self.queue + back
        return self._done(None)

    def evict_blocks(self, block_ids: Iterable[BlockId]) -> None:
        """Each id loses its key (the next id under it is promoted); references
        and the free queue do not change (the null block holds none)."""
        ids = set(block_ids)
        if any(self._bad(i) and i != NULL_BLOCK for i in ids):
            raise V1Refusal("evict_blocks:" + ("negative-id" if any(
                isinstance(i, int) and i < 0 for i in ids) else "unknown-id"),
                "evicted an unknown block id")
        for i in ids:
            self._uncache(i)
        return self._done(None)

    def reset_prefix_cache(self) -> bool:
        """With every id but the null block free: drop every key and answer
        True; else change nothing and answer False."""
        if len(self.queue) != self.num_blocks - 1:
            return self._done(False)
        self.cached.clear()
        self.key_of.clear()
        return self._done(True)

    def get_num_free_blocks(self) -> int:
        """The length of the free queue."""
        return len(self.queue)

    def get_usage(self) -> float:
        """The share of the ids other than the null block that are not free."""
        return self.state().usage()

    def record(self, contents: Mapping[BlockHash, HashedContent]) -> None:
        """Remember what the hashes in ``contents`` were computed from (for the
        salt invariant); nothing else changes."""
        self.contents.update(contents)

    # -- the state ---------------------------------------------------------------------

    def state(self) -> V1State:
        """The model's abstract state."""
        return V1State(
            num_blocks=self.num_blocks, null_block=NULL_BLOCK, ref_cnt=tuple(self.ref),
            free_queue=tuple(self.queue), queue_backward=tuple(self.queue),
            reported_free=len(self.queue),
            cached={k: tuple(ids) for k, ids in self.cached.items()},
            lookup={k: ids[0] for k, ids in self.cached.items()},
            block_keys=dict(self.key_of), secondary={}, contents=dict(self.contents),
            block_size=self.hash_block_size)

    def _bad(self, i: object) -> bool:
        return not isinstance(i, int) or not 0 <= i < self.num_blocks or i == NULL_BLOCK

    def _uncache(self, i: BlockId) -> None:
        entry = self.key_of.pop(i, None)
        if entry is not None:
            ids = self.cached[entry[0]]
            ids.remove(i)
            if not ids:
                del self.cached[entry[0]]

    def _done(self, result: _R) -> _R:
        if self.check_invariants:
            violated = check_all_v1(self.state())
            if violated:
                raise ModelInvariantError(violated)
        return result
