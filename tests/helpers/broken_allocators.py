"""Deliberately broken allocators: the oracle proves itself by catching them.

Each class below is prefixcache.impl's allocator (its prefix-caching one,
once its naive one and once its CPU/GPU pair) with ONE realistic fault,
modelled on a bug that vLLM's block manager had, or that a reimplementation
of it easily gets wrong.  Each overrides a single method with the fault (for
promotion, eviction and copy-on-write the step that holds it: the bases
``_Promotion``, ``_TakeId`` and ``_CopyOnWrite`` do the rest as the impl
does); a few need wiring besides (a hash function passed to the constructor,
``_HashedBy``; a faulty evictor, ``_WithEvictor``, or Block class installed;
``free`` routed through the helper that holds the fault).  Each class says:

* ``FAULT``: the fault in one line (the docstring tells the story: what the
  code does wrong, which real bug it mirrors, what should catch it);
* ``EXPECTED``: the violation categories of prefixcache.oracle.violations
  that count as catching it (the first Violation's category must be one);
* ``INVARIANTS``: the spec invariants (prefixcache.spec.invariants) the
  fault breaks by design.  The driver compares the black-box answers (ids of
  live Blocks, the free count) before it checks invariants, so a fault that
  shows in the free count is reported as ``conformance`` although it breaks
  an invariant; :func:`hunt` records which invariants are broken at the
  moment of the catch, so the kill table shows both.

:data:`BROKEN` lists the faults the ``ci`` profile catches; together they
break every invariant of ``INVARIANTS`` plus ``ownership_matches`` by design
(:data:`INVARIANT_COVERAGE`; ``ids_well_formed``, ``eviction_order`` and
``touched_not_computed`` can
only be seen through conformance, see their allocators) and trip the
categories conformance, invariant, integrity, robustness and crash.
:data:`MISSED` lists realistic faults the profile does not catch, with why.

:func:`hunt` runs the oracle's state machine (``make_machine`` +
``run_state_machine_as_test``) with a settings profile against one target and
records the steps it took until the first Violation; the test
tests/test_oracle_catches_broken.py and bench/oracle_kill_table.py both use it.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Tuple

from hypothesis import Phase, Verbosity, settings
from hypothesis.stateful import run_state_machine_as_test

from prefixcache.impl.common import check_timestamp, get_all_blocks_recursively
from prefixcache.impl.cpu_gpu_block_allocator import CpuGpuBlockAllocator
from prefixcache.impl.errors import (
    BlockNotOnDeviceError,
    DetachedBlockError,
    ImmutableBlockError,
    NoFreeBlocksError,
    NotInEvictorError,
    RefCountError,
    UnhashableBlockError,
    UnknownBlockIdError,
)
from prefixcache.impl.evictor import EvictionPolicy, LRUEvictor
from prefixcache.impl.hashing import builtin_hash, sha256_hash
from prefixcache.impl.interfaces import Device
from prefixcache.impl.naive_block import NaiveBlockAllocator
from prefixcache.impl.prefix_caching_block import (
    PrefixCachingBlock,
    PrefixCachingBlockAllocator,
)
from prefixcache.oracle.machine import Stats, make_machine
from prefixcache.oracle.profiles import profile_settings
from prefixcache.oracle.targets import resolve_target
from prefixcache.oracle.trace import render
from prefixcache.oracle.violations import Violation
from prefixcache.spec.invariants import INVARIANTS, OWNERSHIP

_LAST_ACCESSED_DEFAULT = -1


class _Promotion(PrefixCachingBlockAllocator):
    """Promotion as the impl does it (without content verification), with
    the step a fault replaces as a method of its own: ``_cache_new`` for new
    content, ``_release_own`` for content already cached."""

    def promote_to_immutable_block(self, block: Any) -> int:
        block_id = self._check_owned(block)
        content_hash = block.content_hash
        if content_hash is None:
            raise UnhashableBlockError("only a full block after hashed blocks can be promoted")
        cached_id = self._cached_blocks.get(content_hash)
        if cached_id == block_id:
            raise ImmutableBlockError(f"block {block_id} is already immutable")
        if cached_id is None:
            self._cache_new(block_id, content_hash)
            return block_id
        self._release_own(block_id)
        self._acquire_cached(cached_id)
        block.block_id = cached_id
        block.computed = True
        return cached_id

    def _cache_new(self, block_id: int, content_hash: int) -> None:
        """``block_id`` cached under ``content_hash`` and touched."""
        self._cached_blocks[content_hash] = block_id
        self._touched_blocks.add(block_id)

    def _release_own(self, block_id: int) -> None:
        """The block's own id drops its reference (free, on the left, at 0)."""
        self._release_hashless(block_id)


class _TakeId(PrefixCachingBlockAllocator):
    """``_take_id`` as the impl does it (without content verification), with
    the eviction, where the fault is, left to ``_evicted``."""

    def _take_id(self) -> int:
        if self._free_ids:
            block_id = self._free_ids.popleft()
        elif self.evictor.num_blocks:
            block_id = self._evicted()
        else:
            raise NoFreeBlocksError("no free or evictable block")
        self._refcounts[block_id] = 1
        tracker = self._block_tracker[block_id]
        tracker.active = True
        tracker.last_accessed = _LAST_ACCESSED_DEFAULT
        tracker.computed = False
        return block_id

    def _evicted(self) -> int:
        """The evictor's victim, taken out of the evictor and the cache."""
        raise NotImplementedError


class _CopyOnWrite(PrefixCachingBlockAllocator):
    """Copy-on-write with the impl's checks, with the move of a shared block
    to a fresh id, where the fault is, left to ``_moved``."""

    def cow_block_if_not_appendable(self, block: Any) -> int:
        src = self._check_owned(block)
        if self._refcounts[src] <= 1:
            return src
        content_hash = block.content_hash
        if content_hash is not None and self._cached_blocks.get(content_hash) == src:
            raise ImmutableBlockError(f"block {src} is immutable: it is never written")
        self._check_capacity(1)
        return self._moved(block, src)

    def _moved(self, block: Any, src: int) -> int:
        """``block``, shared on ``src``, moved to a fresh id; the new id."""
        raise NotImplementedError


def _checked_chain(allocator: Any, last_block: Any) -> List[Any]:
    """The checks fork makes before it changes anything (as the impl does);
    the chain ending at ``last_block``."""
    allocator._check_owned(last_block)
    chain = get_all_blocks_recursively(last_block)
    for block in chain:
        allocator._check_owned(block)
    return chain


def _forked_block(allocator: Any, prev: Optional[PrefixCachingBlock],
                  source: PrefixCachingBlock) -> PrefixCachingBlock:
    """A Block after ``prev`` on ``source``'s id with a copy of its tokens,
    its extra hash, its known hash and hashability (as the impl's fork makes
    it); the id's reference count is the caller's."""
    forked = allocator._pooled_block(prev, source._token_ids, source._block_id,
                                     source._extra_hash)
    forked._cached_content_hash = source._cached_content_hash
    forked._unhashable = source._unhashable
    return forked


# ----------------------------------------------------------------------------
# reference counting and ownership


class ForkMissesFirstBlock(PrefixCachingBlockAllocator):
    """Refcount off by one on fork.

    The loop that takes a reference for every block of the forked chain
    skips index 0, so the first block (typically the shared system prompt)
    is held by two sequences with refcount 1.  Freeing either sequence then
    releases an id the other still uses.  Mirrors the refcount drift bugs of
    vLLM's v0 block managers around ``fork`` (beam search / parallel
    sampling), which surfaced as "double free" assertions much later.
    Caught by ``ownership_matches`` right after the fork."""

    FAULT = "fork() does not take a reference on the chain's first block"
    EXPECTED = frozenset({"invariant"})
    INVARIANTS = ("ownership_matches",)

    def fork(self, last_block: Any) -> List[Any]:
        forked: List[Any] = []
        prev: Optional[PrefixCachingBlock] = None
        for index, source in enumerate(_checked_chain(self, last_block)):
            if index > 0:  # FAULT: off by one, the first block is never counted
                self._refcounts[source._block_id] += 1
            prev = _forked_block(self, prev, source)
            forked.append(prev)
        return forked


class FreeCountWithoutEvictable(PrefixCachingBlockAllocator):
    """The free count forgets the evictable blocks.

    ``get_num_free_blocks`` answers only the ids of the hashless free list:
    cached blocks that nobody references (which ``_take_id`` will evict on
    demand) are not counted, so the scheduler believes the cache is full and
    preempts for nothing, and ``reset_prefix_cache`` refuses while the cache
    holds anything.  Mirrors vLLM's early prefix-caching allocator, whose
    free count had to be fixed to add ``evictor.num_blocks``.  Breaks
    ``counting``; the black-box free-count comparison sees it first."""

    FAULT = "get_num_free_blocks() counts the free list but not the evictor"
    EXPECTED = frozenset({"conformance"})
    INVARIANTS = ("counting",)

    def get_num_free_blocks(self, device: Optional[Device] = None) -> int:
        # the arguments still checked as before: the count is the one fault
        return super().get_num_free_blocks(device) - self.evictor.num_blocks  # FAULT


class DuplicatePromotionLeaksOwnId(_Promotion):
    """Duplicate promotion forgets to release the block's own id.

    When a decode fills a block whose content is already cached, the block
    moves to the cached id; this version never gives its own id back, so the
    id keeps refcount 1 with no owner: a leak of one block per duplicate.
    vLLM's ``_alloc_promotion`` unit test exists because this path is easy to
    get wrong.  Breaks ``ownership_matches``; the free count (one short)
    shows it first."""

    FAULT = "promotion onto cached content keeps the block's own id (leak)"
    EXPECTED = frozenset({"conformance"})
    INVARIANTS = ("ownership_matches",)

    def _release_own(self, block_id: int) -> None:
        pass  # FAULT: self._release_hashless(block_id) is missing


class DuplicatePromotionFreesToTheRight(_Promotion):
    """Duplicate promotion puts the block's own id on the wrong end of the
    free list.

    The id is released with ``append`` instead of ``appendleft``, so it is
    reused last instead of next.  No block is lost, but the allocator hands
    out ids in an order vLLM's tests pin down (``test_alloc_promotion`` reads
    ``_free_block_indices``, ``test_free_prevents_oom`` relies on LIFO reuse).
    Only a strict comparison of the free list (or of the next id handed
    out) sees it."""

    FAULT = "promotion onto cached content returns its own id to the right of the free list"
    EXPECTED = frozenset({"conformance"})
    INVARIANTS = ()

    def _release_own(self, block_id: int) -> None:
        count = self._refcounts[block_id]
        self._refcounts[block_id] = count - 1
        if count == 1:
            self._untrack(block_id)
            self._free_ids.append(block_id)  # FAULT: should be appendleft (LIFO)


class DuplicatePromotionReleasesTwice(_Promotion):
    """Duplicate promotion releases the block's own id twice.

    It frees the id through the hashless path (which decrements the refcount
    and returns the id to the free list) and then also decrements the counter
    itself, a leftover of a refactoring that moved the decrement into the
    helper; vLLM's ``_free_block_id`` + ``RefCounter.decr`` pair invites
    exactly this.  The id is free with refcount -1 (in vLLM the assert in
    ``decr`` would catch it, but not under ``python -O``).  Breaks
    ``refcounts_non_negative`` and ``partition`` while the free count stays
    right."""

    FAULT = "promotion onto cached content decrements its own id twice"
    EXPECTED = frozenset({"invariant"})
    INVARIANTS = ("refcounts_non_negative", "partition")

    def _release_own(self, block_id: int) -> None:
        self._release_hashless(block_id)
        self._refcounts[block_id] -= 1  # FAULT: the helper already decremented


# ----------------------------------------------------------------------------
# the cache map and the evictor


class EvictionKeepsStaleHash(_TakeId):
    """Stale cache entry after eviction.

    When an id is evicted for reuse, its content hash is not dropped from
    ``_cached_blocks``: the map still sends the old content to an id that now
    holds other tokens (or none), and a later request for the old content
    "hits" and reads the wrong KV.  Mirrors the vLLM failures where the
    cache map and the evictor disagreed (the ``assert content_hash in
    _cached_blocks`` / wrong-output reports of the v0 prefix cache).  Breaks
    ``cached_content_matches`` (and ``cached_ids_distinct`` once the id is
    promoted again)."""

    FAULT = "evicting an id for reuse leaves its old hash in _cached_blocks"
    EXPECTED = frozenset({"invariant", "integrity"})
    INVARIANTS = ("cached_content_matches", "cached_ids_distinct")

    def _evicted(self) -> int:
        block_id, content_hash = self.evictor.evict()
        # FAULT: del self._cached_blocks[content_hash] is missing
        self._touched_blocks.discard(block_id)
        self._prefix_memo.evicted(content_hash)
        return block_id


class FreeDecidesByComputed(PrefixCachingBlockAllocator):
    """The release path asks "is it computed?" where it means "is it cached?".

    At refcount 0 a block goes to the evictor only if its tracker says
    computed; a block promoted but not yet marked computed (touched) goes to
    the hashless free list although its hash stays cached, so the cache map
    points at a free id that the next mutable allocation takes.  Mirrors the
    computed/cached confusion vLLM fixed by introducing ``_touched_blocks``
    (blocks shared within a batch before their KV exists).  Breaks
    ``partition`` and ``evictor_is_evictable`` with the free count intact."""

    FAULT = "free() sends a touched (not yet computed) cached id to the free list"
    EXPECTED = frozenset({"invariant"})
    INVARIANTS = ("partition", "evictor_is_evictable")

    def _release_block(self, block: Any, block_id: int) -> None:
        count = self._refcounts[block_id] - 1
        self._refcounts[block_id] = count
        if count:
            return
        tracker = self._block_tracker[block_id]
        if tracker.computed:  # FAULT: should test "cached under this block's hash"
            self.evictor.add(block_id, block.content_hash, block._num_tokens_total,
                             tracker.last_accessed)
        else:
            self._free_ids.appendleft(block_id)
        self._untrack(block_id)


class ResetLeavesEvictor(PrefixCachingBlockAllocator):
    """``reset_prefix_cache`` drops the cache map but not the evictor.

    It clears ``_cached_blocks`` and the touched set and starts the metrics
    afresh, but forgets to move the evictable ids back to the free list: the
    evictor keeps ids whose content is no longer cached, and the next
    eviction looks up a hash that is gone.  Mirrors the reset bugs of vLLM's
    prefix caches (v1's ``reset_prefix_cache`` had to be taught to free
    every cached block first).  Breaks ``evictable_hold_content`` with the
    free count intact."""

    FAULT = "reset_prefix_cache() clears the cache map but leaves the evictor full"
    EXPECTED = frozenset({"invariant"})
    INVARIANTS = ("evictable_hold_content",)

    def reset_prefix_cache(self) -> bool:
        if self.get_num_total_blocks() - self.get_num_free_blocks() > 0:
            return False
        # FAULT: the loop that evicts every entry back to the free list is missing
        self._cached_blocks.clear()
        self._prefix_memo.clear()
        self._touched_blocks.clear()
        self.metric_data = type(self.metric_data)()
        return True


class EvictorEntryCountsOwnTokens(PrefixCachingBlockAllocator):
    """The evictor entry's ``num_hashed_tokens`` is the block's own length.

    On release the entry records ``len(block.token_ids)`` (always the block
    size) instead of ``num_tokens_total`` (every token of the prefix through
    this block).  All entries tie on depth, so among blocks with equal access
    time the tail of a chain is no longer evicted first: the tie-break that
    vLLM's ``test_eviction_order`` pins down is lost.  Breaks
    ``evictor_entries_match``."""

    FAULT = "free() records the block's own token count as num_hashed_tokens"
    EXPECTED = frozenset({"invariant"})
    INVARIANTS = ("evictor_entries_match",)

    def _release_block(self, block: Any, block_id: int) -> None:
        content_hash = block._cached_content_hash
        if content_hash is None and len(block._token_ids) == block._block_size:
            content_hash = block.content_hash
        count = self._refcounts[block_id] - 1
        self._refcounts[block_id] = count
        if count:
            return
        tracker = self._block_tracker[block_id]
        if content_hash is not None and self._cached_blocks.get(content_hash) == block_id:
            # FAULT: len(block.token_ids) instead of block.num_tokens_total
            self.evictor.add(block_id, content_hash, len(block._token_ids),
                             tracker.last_accessed)
        else:
            self._free_ids.appendleft(block_id)
        self._untrack(block_id)


class EvictsShallowestFirst(_TakeId):
    """Eviction tie-break the wrong way round.

    The victim is chosen by ``(last_accessed, num_hashed_tokens, block_id)``
    instead of ``(last_accessed, -num_hashed_tokens, block_id)``: among
    blocks with the same access time the *first* block of a chain is evicted
    first, which breaks every longer prefix that shares it.  vLLM's first
    LRU evictor chose the victim with a hand-written comparison loop of
    exactly this shape.  It breaks the spec's ``eviction_order``, but no
    invariant check can see a wrong victim (the abstraction sorts the evictor
    by the spec's rank itself): the next id handed out differs from the
    spec's, a ``conformance`` failure.

    ORACLE NOTE: the driver labels it ``integrity``: when a live Block's id
    differs from the spec's, it calls it integrity if the *spec's* content of
    the target's id differs, which after a different victim it always does,
    although the target's own content map is consistent (reported to the
    lead; ``integrity`` is accepted here until the label is fixed)."""

    FAULT = "evicts the shallowest block first among equal access times"
    EXPECTED = frozenset({"conformance", "integrity"})
    INVARIANTS = ("eviction_order",)

    def _evicted(self) -> int:
        table = self.evictor.free_table
        block_id = min(table, key=lambda i: (  # FAULT: +num_hashed_tokens
            table[i].last_accessed, table[i].num_hashed_tokens, i))
        content_hash = table[block_id].content_hash
        self.evictor.remove(block_id)
        del self._cached_blocks[content_hash]
        self._touched_blocks.discard(block_id)
        self._prefix_memo.evicted(content_hash)
        return block_id


class Vllm085Evictor(LRUEvictor):
    """vLLM 0.8.5's ``LRUEvictor.update``: it changes the entry in place and
    pushes nothing on the heap, so the entry's only heap record is stale and
    is skipped (lost) when it surfaces.  An absent id is refused as the spec
    says (vLLM raises a bare KeyError), so that the fault is the order alone."""

    def update(self, block_id: int, last_accessed: float) -> None:
        if block_id not in self.free_table:
            raise NotInEvictorError(f"block {block_id} is not in the evictor")
        self.free_table[block_id].last_accessed = last_accessed  # FAULT: no heap push


class _WithEvictor(PrefixCachingBlockAllocator):
    """Wiring: the evictor is an ``EVICTOR``, also after a reset."""

    EVICTOR: type

    def __init__(self, num_blocks: int, block_size: int, block_ids: Any = None,
                 eviction_policy: EvictionPolicy = EvictionPolicy.LRU, **kwargs: Any) -> None:
        super().__init__(num_blocks, block_size, block_ids, eviction_policy, **kwargs)
        self.evictor = self.EVICTOR()

    def reset_prefix_cache(self) -> bool:
        done = super().reset_prefix_cache()
        if done:  # the fresh (empty) evictor is the faulty kind again
            self.evictor = self.EVICTOR()
        return done


class EvictorUpdateDoesNotReorder(_WithEvictor):
    """An evictor whose ``update`` does not reorder.

    vLLM 0.8.5's heap-based ``LRUEvictor.update`` sets ``last_accessed`` in
    the free table and pushes nothing; ``evict`` then skips the entry's stale
    heap record, so a block marked accessed while evictable is never chosen
    again, and an evictor whose only entries were updated answers "No usable
    cache memory left" while ``free_table`` is not empty: the heap/table
    desynchronization family of vLLM issue #16825 (reported there for
    ``remove`` under swap preemption).  The allocator only
    installs that evictor (also after a reset).  It breaks the spec's
    ``eviction_order``; seen as a wrong victim or as an exception (an
    IndexError from the emptied heap) on a valid call."""

    FAULT = "the evictor's update() changes the time without reordering (vLLM 0.8.5)"
    EXPECTED = frozenset({"conformance", "crash"})
    INVARIANTS = ("eviction_order",)
    EVICTOR = Vllm085Evictor


class MarkAccessedSkipsEvictable(PrefixCachingBlockAllocator):
    """``mark_blocks_as_accessed`` ignores evictable blocks.

    Only ids in use get the new time; an id already in the evictor keeps its
    old time.  vLLM defers ``mark_blocks_as_accessed`` until a sequence is
    freed, so exactly the evictable blocks are the ones whose time matters:
    recently used prefixes are evicted as if cold.  Seen as a different
    evictor state (and later a different victim)."""

    FAULT = "mark_blocks_as_accessed() does not update ids in the evictor"
    EXPECTED = frozenset({"conformance"})
    INVARIANTS = ()

    def mark_blocks_as_accessed(self, block_ids: List[int], now: float) -> None:
        # the impl's checks and its update of the ids in use, with the evictor's
        # update of an evictable id made a no-op for the call
        evictor: Any = self.evictor
        evictor.update = lambda block_id, last_accessed: None  # FAULT: the update is skipped
        try:
            super().mark_blocks_as_accessed(block_ids, now)
        finally:
            del evictor.update


# ----------------------------------------------------------------------------
# the computed / touched life cycle


class PromotionMarksComputed(_Promotion):
    """A block marked computed at promotion.

    A newly promoted block's tracker is set computed at once, instead of when
    the batch has run (``mark_blocks_as_computed``): another request in the
    same batch can skip a block whose KV does not exist yet.  This is the bug
    vLLM fixed by deferring to ``_touched_blocks`` (``test_touch_block``).
    Breaks ``touched_not_computed``, seen through conformance: the
    abstraction reads "touched" as promoted and not yet computed (what
    ``block_is_computed`` answers), so the early flag shows as a computed id
    where the model's is touched."""

    FAULT = "promotion of new content marks the id computed immediately"
    EXPECTED = frozenset({"conformance"})
    INVARIANTS = ("touched_not_computed",)

    def _cache_new(self, block_id: int, content_hash: int) -> None:
        super()._cache_new(block_id, content_hash)
        self._block_tracker[block_id].computed = True  # FAULT: too early


class EvictionKeepsTouched(_TakeId):
    """An evicted-then-reused id left in ``_touched_blocks``.

    A block promoted and freed before ``mark_blocks_as_computed`` is
    evictable and touched; when it is evicted for reuse the id stays in the
    touched set, so the next ``mark_blocks_as_computed`` marks whatever the
    id holds now computed, a mutable block included.  Breaks
    ``touched_hold_content`` (and then ``mutable_not_computed``)."""

    FAULT = "evicting an id for reuse leaves it in _touched_blocks"
    EXPECTED = frozenset({"invariant"})
    INVARIANTS = ("touched_hold_content",)

    def _evicted(self) -> int:
        block_id, content_hash = self.evictor.evict()
        del self._cached_blocks[content_hash]
        # FAULT: self._touched_blocks.discard(block_id) is missing
        self._prefix_memo.evicted(content_hash)
        return block_id


class MarkComputedOnlyListedIds(PrefixCachingBlockAllocator):
    """``mark_blocks_as_computed`` honours its argument.

    Written against the older contract (mark the ids passed), it marks the
    listed ids and clears the touched set; vLLM 0.8.5's block manager passes
    ``[]``, so touched blocks leave the touched set without ever becoming
    computed.  Breaks ``untouched_content_computed``."""

    FAULT = "mark_blocks_as_computed() marks only the ids passed (vLLM passes [])"
    EXPECTED = frozenset({"invariant"})
    INVARIANTS = ("untouched_content_computed",)

    def mark_blocks_as_computed(self, block_ids: List[int]) -> None:
        for block_id in block_ids:  # FAULT: should mark every touched id
            tracker = self._block_tracker[block_id]
            if tracker.active:
                tracker.computed = True
        self._touched_blocks.clear()


class MarkComputedIncludesPartialBlocks(PrefixCachingBlockAllocator):
    """``mark_blocks_as_computed`` marks every block in use, the partially
    filled last block of each sequence included.

    vLLM's v1 block manager marked "all blocks but the last" of a sequence
    computed, because the last one may be partial; marking every tracked
    block computed makes a mutable block computed, and when it later fills
    and is promoted it is shared as computed before its KV is complete.
    Breaks ``mutable_not_computed``."""

    FAULT = "mark_blocks_as_computed() marks every tracked id, mutable ones too"
    EXPECTED = frozenset({"invariant"})
    INVARIANTS = ("mutable_not_computed",)

    def mark_blocks_as_computed(self, block_ids: List[int]) -> None:
        for tracker in self._block_tracker.values():  # FAULT: not only the touched ids
            if tracker.active:
                tracker.computed = True
        self._touched_blocks.clear()


# ----------------------------------------------------------------------------
# content hashes


def _hash_without_extra(parent: Optional[int], token_ids: Any, extra_hash: Optional[int]) -> int:
    return builtin_hash(parent, token_ids, None)  # FAULT: extra_hash dropped


def _four_bit_hash(parent: Optional[int], token_ids: Any, extra_hash: Optional[int]) -> int:
    # sha256 (not the builtin hash, seeded per process) so that the
    # collisions, and the steps to the catch, are the same in every run
    return sha256_hash(parent, token_ids, extra_hash) & 0xF  # FAULT: 16 values


class _HashedBy(PrefixCachingBlockAllocator):
    """Wiring: the content hash is ``HASH`` unless the caller names one."""

    HASH: Callable[[Optional[int], Any, Optional[int]], int]

    def __init__(self, num_blocks: int, block_size: int, block_ids: Any = None,
                 eviction_policy: EvictionPolicy = EvictionPolicy.LRU, **kwargs: Any) -> None:
        kwargs.setdefault("hash_algo", self.HASH)
        super().__init__(num_blocks, block_size, block_ids, eviction_policy, **kwargs)


class ExtraHashIgnored(_HashedBy):
    """A content hash that ignores ``extra_hash`` (tenant / LoRA leak).

    Two requests with the same tokens under different LoRA adapters (or
    tenants, or prompt adapters) share KV computed under the other adapter.
    vLLM's v0 prefix cache had to add the LoRA id to the block hash for this
    reason (the ``extra_hash`` argument).  The oracle names content by
    (extra hash, tokens), so the shared id is an integrity violation."""

    FAULT = "the content hash ignores extra_hash (LoRA / tenant)"
    EXPECTED = frozenset({"integrity"})
    INVARIANTS = ()
    HASH = staticmethod(_hash_without_extra)


class FourBitHash(_HashedBy):
    """A content hash truncated to 4 bits.

    Stands for every weak or predictable block hash: a truncated hash, a hash
    of a hash stored in a narrow field, or vLLM's builtin ``hash`` whose
    collisions can be constructed (CVE-2025-25183: a chosen prompt collides
    with another tenant's cached prefix).  With 16 values two different
    contents collide within a few requests, and a request reads another
    content's KV.  Only the oracle's content ledger (content named by exact
    tokens) can see it."""

    FAULT = "the content hash is truncated to 4 bits (collisions)"
    EXPECTED = frozenset({"integrity"})
    INVARIANTS = ()
    HASH = staticmethod(_four_bit_hash)


class _OneSlotEarlyBlock(PrefixCachingBlock):
    """A Block whose content hash is taken one token early (see below)."""

    __slots__ = ()

    @property
    def content_hash(self) -> Optional[int]:
        if (self._cached_content_hash is None and not self._unhashable
                and self.num_empty_slots == 1):  # FAULT: the last slot counted as filled
            parent = None if self._prev_block is None else self._prev_block.content_hash
            if self._prev_block is None or parent is not None:
                hash_fn = self._allocator._hash_fn
                self._cached_content_hash = hash_fn(parent, self._token_ids, self._extra_hash)
        return PrefixCachingBlock.content_hash.fget(self)  # type: ignore[attr-defined]


class HashOneSlotEarly(PrefixCachingBlockAllocator):
    """A Block hashed one token before it is full.

    The fullness test of the content hash is off by one
    (``num_empty_slots <= 1``), as when a reserved lookahead slot (speculative
    decoding) is counted as filled: a block with one empty slot gets a hash
    over a partial block, and the next append to it is refused as "immutable".
    The allocator only builds its Blocks from that class.  Breaks
    ``content_whole_blocks`` (and ``content_is_cached``)."""

    FAULT = "a Block's content hash exists once it has one empty slot left"
    EXPECTED = frozenset({"invariant"})
    INVARIANTS = ("content_whole_blocks", "content_is_cached")

    def _create_block(self, prev_block: Any, token_ids: List[int], block_size: int,
                      allocator: Any, block_id: Optional[int] = None, computed: bool = False,
                      extra_hash: Optional[int] = None) -> Any:
        return _OneSlotEarlyBlock(prev_block=prev_block, token_ids=token_ids,
                                  block_size=block_size, allocator=self, block_id=block_id,
                                  computed=computed, extra_hash=extra_hash)


class ForkSharesTokenList(PrefixCachingBlockAllocator):
    """Fork shares the token list instead of copying it.

    The forked Blocks alias the source Blocks' ``token_ids`` lists.  Appending
    to one sequence's last block (after its copy-on-write) also appends to
    its sibling's, which fills without being promoted: it holds content that
    is cached under another id, or tokens its sequence never produced.  A
    classic aliasing bug (vLLM's Blocks copy ``token_ids`` in the
    constructor for this reason).  Breaks ``content_is_cached``."""

    FAULT = "fork() makes the new Blocks share the source Blocks' token lists"
    EXPECTED = frozenset({"invariant", "conformance"})
    INVARIANTS = ("content_is_cached",)

    def fork(self, last_block: Any) -> List[Any]:
        forked: List[Any] = []
        prev: Optional[PrefixCachingBlock] = None
        for source in _checked_chain(self, last_block):
            self._refcounts[source._block_id] += 1
            prev = _forked_block(self, prev, source)
            prev._token_ids = source._token_ids  # FAULT: aliased, not copied
            forked.append(prev)
        return forked


# ----------------------------------------------------------------------------
# copy-on-write


class CowForgetsRecord(_CopyOnWrite):
    """Copy-on-write that does not record the pair.

    The block moves to a fresh id but ``(src, dst)`` is never recorded, so
    the worker never copies the KV: the sequence continues on an id holding
    garbage (beam search / parallel sampling corruption)."""

    FAULT = "cow_block_if_not_appendable() does not record (src, dst)"
    EXPECTED = frozenset({"conformance"})
    INVARIANTS = ()

    def _moved(self, block: Any, src: int) -> int:
        self._refcounts[src] -= 1
        dst = self._take_id()
        # FAULT: self._cow_tracker.record_cow(src, dst) is missing
        block.block_id = dst
        return dst


class CowKeepsSourceReference(_CopyOnWrite):
    """Copy-on-write that forgets to decrement the source.

    The block leaves the shared id but the id keeps its reference, so it is
    never freed when the other sharers finish: a leak per copy-on-write.
    Breaks ``ownership_matches``."""

    FAULT = "cow_block_if_not_appendable() does not drop the source's reference"
    EXPECTED = frozenset({"invariant"})
    INVARIANTS = ("ownership_matches",)

    def _moved(self, block: Any, src: int) -> int:
        # FAULT: self._refcounts[src] -= 1 is missing
        dst = self._take_id()
        self._cow_tracker.record_cow(src, dst)
        block.block_id = dst
        return dst


class CowRecordsAfterMove(_CopyOnWrite):
    """Copy-on-write that records the pair after moving the block.

    ``record_cow(block.block_id, dst)`` is written after ``block.block_id =
    dst``, so the pair is ``(dst, dst)``: the worker copies a block onto
    itself.  Breaks ``copy_on_writes_well_formed``."""

    FAULT = "cow_block_if_not_appendable() records (dst, dst)"
    EXPECTED = frozenset({"invariant"})
    INVARIANTS = ("copy_on_writes_well_formed",)

    def _moved(self, block: Any, src: int) -> int:
        self._refcounts[src] -= 1
        dst = self._take_id()
        block.block_id = dst
        self._cow_tracker.record_cow(block.block_id, dst)  # FAULT: reads the moved id
        return dst


# ----------------------------------------------------------------------------
# queries, reset and metrics


class BisectFindCachedPrefix(PrefixCachingBlockAllocator):
    """``find_cached_blocks_prefix`` by bisection (vLLM 0.8.5's code).  In
    :data:`MISSED`: the ci profile never builds the state that shows it.

    ``bisect_left`` over "not cached-and-computed" assumes the cached blocks
    always form a prefix of the list; once the evictor took a block in the
    middle of a chain (its tail-first order does not prevent it after access
    times differ) the answer can include uncached blocks, and the scheduler
    skips computing tokens whose KV is gone."""

    FAULT = "find_cached_blocks_prefix() bisects (wrong when a middle block was evicted)"
    EXPECTED = frozenset({"conformance"})
    INVARIANTS = ()

    def find_cached_blocks_prefix(self, block_hashes: List[int]) -> List[int]:
        def cached_and_computed(content_hash: int) -> bool:
            block_id = self._cached_blocks.get(content_hash)
            return block_id is not None and self.block_is_computed(block_id)

        index = bisect_left(block_hashes, True, key=lambda h: not cached_and_computed(h))
        return block_hashes[:index]


class ResetWhileInUse(PrefixCachingBlockAllocator):
    """``reset_prefix_cache`` that succeeds while blocks are in use.

    The guard "refuse while any id is in use" is missing: the evictable ids
    go back to the free list and the touched set and metrics restart while
    sequences still hold cached blocks, and the call answers True (vLLM
    0.8.5 answers False and logs a warning)."""

    FAULT = "reset_prefix_cache() does not refuse while blocks are in use"
    EXPECTED = frozenset({"conformance"})
    INVARIANTS = ()

    def reset_prefix_cache(self) -> bool:
        # FAULT: the "total - free > 0: return False" guard is missing
        while self.evictor.num_blocks:
            block_id, content_hash = self.evictor.evict()
            del self._cached_blocks[content_hash]
            self._free_ids.appendleft(block_id)
        self.evictor = type(self.evictor)()
        self._prefix_memo.clear()
        self._touched_blocks.clear()
        self.metric_data = type(self.metric_data)()
        return True


class ResetKeepsHitCount(PrefixCachingBlockAllocator):
    """``reset_prefix_cache`` resets the metrics in place and forgets one
    field.

    To keep the object a metrics exporter holds, the counters are zeroed
    field by field, except ``num_incompleted_block_hit``: after a reset the
    hit rate exceeds 100% (more hits than queries).  Breaks
    ``hit_counts_non_negative`` (misses = queries - hits < 0)."""

    FAULT = "reset_prefix_cache() zeroes the query count but not the hit count"
    EXPECTED = frozenset({"invariant"})
    INVARIANTS = ("hit_counts_non_negative",)

    def reset_prefix_cache(self) -> bool:
        metrics = self.metric_data
        done = super().reset_prefix_cache()
        if done:
            self.metric_data = metrics
            metrics.num_completed_blocks = 0
            metrics.completed_block_cache_hit_rate = 0.0
            metrics.num_incompleted_block_queries = 0
            # FAULT: metrics.num_incompleted_block_hit = 0 is missing
        return done


class AllBlockIdsRebuilt(PrefixCachingBlockAllocator):
    """``all_block_ids`` rebuilt from the allocator's parts.

    Instead of the frozenset of the ids it manages, it is assembled from the
    free list, the ids with references and the cached ids: an id in use and
    cached is listed twice.  (The abstraction sorts the ids, so duplicates are
    the only way ``ids_well_formed`` can fail.)"""

    FAULT = "all_block_ids lists an id that is in use and cached twice"
    EXPECTED = frozenset({"invariant", "conformance"})
    INVARIANTS = ("ids_well_formed",)

    @property
    def all_block_ids(self) -> Any:
        in_use = [i for i, n in self._refcounts.items() if n > 0]
        return tuple(sorted([*self._free_ids, *in_use, *self._cached_blocks.values()]))


# ----------------------------------------------------------------------------
# caller mistakes and all-or-nothing


class ImmutableBlocksNotAtomic(PrefixCachingBlockAllocator):
    """``allocate_immutable_blocks`` that is not all-or-nothing (vLLM 0.8.5).

    One ``allocate_immutable_block`` per block: when the ids run out half
    way, ``NoFreeBlocksError`` is raised after the first blocks took ids
    (and hits took references) that nobody will free."""

    FAULT = "allocate_immutable_blocks() takes ids, then raises NoFreeBlocksError"
    EXPECTED = frozenset({"robustness"})
    INVARIANTS = ()

    def allocate_immutable_blocks(self, prev_block: Any, block_token_ids: List[List[int]],
                                  extra_hash: Optional[int] = None,
                                  device: Optional[Device] = None) -> List[Any]:
        blocks: List[Any] = []
        for token_ids in block_token_ids:  # FAULT: no capacity check up front
            prev_block = self.allocate_immutable_block(prev_block, token_ids,
                                                       extra_hash=extra_hash, device=device)
            blocks.append(prev_block)
        return blocks


class MarkAccessedNotAtomic(PrefixCachingBlockAllocator):
    """``mark_blocks_as_accessed`` that changes state before it raises
    (vLLM 0.8.5's loop).

    Each id is updated in turn and a free id raises when the loop reaches
    it: the ids before it were already marked, so a refused call changed
    the access times (and the eviction order).  A caller's mistake must
    change nothing.  In :data:`MISHANDLED`: the error table's provokers
    pass the ids of a live sequence before the bad one."""

    FAULT = "mark_blocks_as_accessed() marks the ids before the bad one, then raises"
    EXPECTED = frozenset({"robustness"})
    INVARIANTS = ()
    ROW = "mark_blocks_as_accessed:free-id"

    def mark_blocks_as_accessed(self, block_ids: List[int], now: float) -> None:
        check_timestamp(now)
        trackers = self._block_tracker
        for block_id in block_ids:  # FAULT: no validation pass before the first change
            if type(block_id) is not int or block_id not in self._refcounts:
                raise UnknownBlockIdError(f"block id {block_id!r} is not managed here")
            tracker = trackers[block_id]
            if tracker.active:
                tracker.last_accessed = now
            elif block_id in self.evictor:
                self.evictor.update(block_id, now)
            else:
                raise BlockNotOnDeviceError("Mark block as accessed which is not belonged to GPU")


class FreeDetachedIsNoop(PrefixCachingBlockAllocator):
    """Freeing a detached Block does not raise.

    A "defensive" free returns quietly for a Block without an id, which hides
    the caller's double free (vLLM asserts here)."""

    FAULT = "free() of a detached Block returns quietly"
    EXPECTED = frozenset({"robustness"})
    INVARIANTS = ()

    def free(self, block: Any, keep_block_object: bool = False) -> None:
        if getattr(block, "block_id", 0) is None:
            return  # FAULT: should raise DetachedBlockError
        super().free(block, keep_block_object)


class SwapNotAtomic(CpuGpuBlockAllocator):
    """``swap`` without the destination capacity check (vLLM 0.8.5).

    ``swap_out`` runs before ``swap_in`` finds the destination full: the
    blocks have lost their source ids and the call raises, so the sequence's
    KV is gone.  (A CPU/GPU pair: ``create`` builds this class.)  The ci
    profile catches it when a caller-mistake rule has filled the destination
    first (row ``swap:no-free``); before each example drew its own order of
    the rows, no example of the profile did."""

    FAULT = "swap() swaps out before knowing the destination can take the blocks"
    EXPECTED = frozenset({"robustness"})
    INVARIANTS = ()

    @staticmethod
    def create(allocator_type: str, num_gpu_blocks: int, num_cpu_blocks: int,
               block_size: int, **kwargs: Any) -> SwapNotAtomic:
        pair = CpuGpuBlockAllocator.create(allocator_type, num_gpu_blocks, num_cpu_blocks,
                                           block_size, **kwargs)
        allocators = pair._allocators  # type: ignore[attr-defined]
        return SwapNotAtomic(cpu_block_allocator=allocators[Device.CPU],
                             gpu_block_allocator=allocators[Device.GPU])

    def swap(self, blocks: List[Any], src_device: Device, dst_device: Device) -> Dict[int, int]:
        src = self._allocator_of(src_device)
        dst = self._allocator_of(dst_device)
        src_block_ids = [block.block_id for block in blocks]
        src.swap_out(blocks)  # FAULT: no "dst can take them" check first
        dst.swap_in(blocks)
        mapping: Dict[int, int] = {}
        for src_id, block in zip(src_block_ids, blocks):
            if src_id is not None and block.block_id is not None:
                self._swap_mapping[src_id] = block.block_id
                mapping[src_id] = block.block_id
        return mapping


class NaiveFreesToTheRight(NaiveBlockAllocator):
    """A naive allocator whose free list is FIFO.

    A freed id goes to the right end of the free deque, so the id freed last
    is reused last: vLLM's ``test_free_prevents_oom`` and every test that
    predicts ids rely on LIFO reuse."""

    FAULT = "the naive allocator returns freed ids to the right (FIFO)"
    EXPECTED = frozenset({"conformance"})
    INVARIANTS = ()

    def free_block_id(self, block_id: int) -> None:
        if self._refcounter.decr(block_id) == 0:
            self._free_block_indices.append(block_id)  # FAULT: should be appendleft


#: (target class, violation categories that count as catching it).
BROKEN: List[Tuple[type, FrozenSet[str]]] = [
    (cls, cls.EXPECTED)  # type: ignore[attr-defined]
    for cls in (
        ForkMissesFirstBlock,
        FreeCountWithoutEvictable,
        DuplicatePromotionLeaksOwnId,
        DuplicatePromotionFreesToTheRight,
        DuplicatePromotionReleasesTwice,
        EvictionKeepsStaleHash,
        FreeDecidesByComputed,
        ResetLeavesEvictor,
        EvictorEntryCountsOwnTokens,
        EvictsShallowestFirst,
        EvictorUpdateDoesNotReorder,
        MarkAccessedSkipsEvictable,
        PromotionMarksComputed,
        EvictionKeepsTouched,
        MarkComputedOnlyListedIds,
        MarkComputedIncludesPartialBlocks,
        ExtraHashIgnored,
        FourBitHash,
        HashOneSlotEarly,
        ForkSharesTokenList,
        CowForgetsRecord,
        CowKeepsSourceReference,
        CowRecordsAfterMove,
        ResetWhileInUse,
        ResetKeepsHitCount,
        AllBlockIdsRebuilt,
        ImmutableBlocksNotAtomic,
        FreeDetachedIsNoop,
        NaiveFreesToTheRight,
        SwapNotAtomic,
    )
]

#: Realistic faults the CI profile does NOT catch (yet), with the reason; the
#: tests show each fault is real with a directed example, and
#: bench/oracle_kill_table.py runs the oracle on them too.
MISSED: List[Tuple[type, str]] = [
    (BisectFindCachedPrefix,
     "weak strategy: the answer is wrong only when a block in the middle of a "
     "queried chain was evicted while later blocks stayed cached, which needs "
     "an early block to be older than the blocks after it, then a query of "
     "that chain; the machine marks all blocks of a sequence with one time "
     "(and marks before freeing), so no chain of the profile's run has such "
     "a hole (12,223 steps counted by instrumenting the machine); a rule "
     "that ages a prefix of a sequence, plus a query of every chain after "
     "each allocation, catches it at example 320"),
]

#: Every invariant name -> the broken allocators that break it by design.
INVARIANT_COVERAGE: Dict[str, List[str]] = {
    name: [cls.__name__ for cls, _ in BROKEN if name in cls.INVARIANTS]  # type: ignore[attr-defined]
    for name in [inv.name for inv in INVARIANTS] + [OWNERSHIP.name]
}

#: The violation categories the table is meant to trip, with the allocators.
CATEGORY_COVERAGE: Dict[str, List[str]] = {
    category: [cls.__name__ for cls, expected in BROKEN if category in expected]
    for category in ("conformance", "invariant", "integrity", "robustness")
}


# ----------------------------------------------------------------------------
# mishandled caller mistakes (the error table's rows, oracle/mistakes.py)


class StaleFreeWrongClass(PrefixCachingBlockAllocator):
    """``free`` of a stale Block (its id holds no reference) raises
    DetachedBlockError instead of the error table's RefCountError: a caller
    that catches the documented class misses it."""

    FAULT = "free() of a stale Block raises the wrong class"
    EXPECTED = frozenset({"robustness"})
    INVARIANTS = ()
    ROW = "free:stale"

    def free(self, block: Any, keep_block_object: bool = False) -> None:
        try:
            super().free(block, keep_block_object)
        except RefCountError as exc:
            raise DetachedBlockError(str(exc)) from exc  # FAULT: the wrong class


class AcceptsUnknownHashAlgo(PrefixCachingBlockAllocator):
    """A constructor that falls back to the builtin hash when ``hash_algo``
    names nothing it knows (a typo such as "sha-256" silently gives the
    weak, per-process hash)."""

    FAULT = "__init__ accepts an unknown hash_algo"
    EXPECTED = frozenset({"robustness"})
    INVARIANTS = ()
    ROW = "__init__:hash-algo"

    def __init__(self, num_blocks: int, block_size: int, block_ids: Any = None,
                 eviction_policy: EvictionPolicy = EvictionPolicy.LRU, **kwargs: Any) -> None:
        algo = kwargs.get("hash_algo", "builtin")
        if algo not in ("builtin", "sha256") and not callable(algo):
            kwargs.pop("hash_algo")  # FAULT: should raise InvalidArgumentError
        super().__init__(num_blocks, block_size, block_ids, eviction_policy, **kwargs)


class _LenientEvictor(LRUEvictor):
    def remove(self, block_id: int) -> None:
        if block_id in self:  # FAULT: an absent id is ignored
            super().remove(block_id)


class EvictorRemoveIgnoresAbsent(_WithEvictor):
    """An evictor whose ``remove`` ignores an id it does not hold (the
    caller's bookkeeping error goes unnoticed)."""

    FAULT = "LRUEvictor.remove() of an absent id does nothing"
    EXPECTED = frozenset({"robustness"})
    INVARIANTS = ()
    ROW = "LRUEvictor.remove/update:absent"
    EVICTOR = _LenientEvictor


#: Allocators that mishandle one row of the error table (``ROW``): the
#: oracle's mistake rule must catch each as a robustness violation.
MISHANDLED: List[type] = [MarkAccessedNotAtomic, StaleFreeWrongClass, AcceptsUnknownHashAlgo,
                          EvictorRemoveIgnoresAbsent]


# ----------------------------------------------------------------------------
# the harness


@dataclass
class Kill:
    """What the oracle did to one target."""

    name: str
    fault: str
    expected: List[str]
    caught: bool = False
    #: Stats.steps when the first Violation was raised (every step of every
    #: example run before it, the failing one included)
    steps: Optional[int] = None
    #: Stats.examples at that moment (the failing example included)
    examples: Optional[int] = None
    #: the first Violation's category, message, and step within its example
    category: Optional[str] = None
    message: Optional[str] = None
    step_in_example: Optional[int] = None
    #: invariants the target's state broke at that moment (the driver's view)
    invariants_at_catch: List[str] = field(default_factory=list)
    #: the Violation(s) Hypothesis finally raised (after shrinking, if on)
    final_categories: List[str] = field(default_factory=list)
    final_program: Optional[str] = None
    final_steps: Optional[int] = None
    #: total steps and examples run (shrinking included), and wall time
    total_steps: int = 0
    total_examples: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    error: Optional[str] = None

    def to_json(self) -> Dict[str, Any]:
        """The record as a JSON object."""
        return asdict(self)


def _broken_invariants(driver: Any) -> List[str]:
    """The invariants the driver would find broken in the target now."""
    live = [driver.blocks[name] for name in driver.live_names()]
    try:
        states = driver._target_states(live)
    except Exception as exc:  # the abstraction itself fails on a broken target
        return [f"<abstraction: {type(exc).__name__}>"]
    return sorted({name for label, state in states.items()
                   for name in driver.broken_invariants(label, state, live)})


def _violations_in(exc: BaseException) -> List[Violation]:
    if isinstance(exc, Violation):
        return [exc]
    found: List[Violation] = []
    for inner in getattr(exc, "exceptions", ()) or ():
        found += _violations_in(inner)
    return found


def run_settings(profile: str = "ci", *, max_examples: Optional[int] = None,
                 shrink: bool = False, quiet: bool = False) -> settings:
    """The profile's settings; without ``shrink`` the run stops at the first
    failure (no shrinking, no search for further bugs), which changes
    neither the examples generated nor the steps to the first failure;
    ``quiet`` silences Hypothesis's report of the failing example."""
    base = profile_settings(profile)
    overrides: Dict[str, Any] = {}
    if quiet:
        overrides["verbosity"] = Verbosity.quiet
        overrides["print_blob"] = False
    if max_examples is not None:
        overrides["max_examples"] = max_examples
    if not shrink:
        overrides["phases"] = [p for p in base.phases if p is not Phase.shrink]
        overrides["report_multiple_bugs"] = False
    return settings(base, **overrides)


def hunt(target: Any, *, profile: str = "ci", max_examples: Optional[int] = None,
         shrink: bool = False, quiet: bool = False) -> Kill:
    """Run the oracle (profile ``profile``) against ``target`` (a class or a
    factory) and record the steps it took to the first Violation."""
    resolved = resolve_target(target)
    stats = Stats()
    base = make_machine(resolved, stats=stats)
    kill = Kill(name=getattr(target, "__name__", resolved.name),
                fault=getattr(target, "FAULT", ""),
                expected=sorted(getattr(target, "EXPECTED", ())))

    class Recording(base):  # type: ignore[misc, valid-type]
        """The oracle's machine, noting the moment of the first Violation."""

        def run(self, op: str, **args: Any) -> Any:
            try:
                return super().run(op, **args)
            except Violation as violation:
                if not kill.caught:
                    kill.caught = True
                    kill.steps, kill.examples = stats.steps, stats.examples
                    kill.category, kill.message = violation.category, violation.message
                    kill.step_in_example = violation.step
                    try:
                        kill.invariants_at_catch = _broken_invariants(self.d)
                    except Exception as exc:  # a diagnostic only
                        kill.invariants_at_catch = [f"<error: {type(exc).__name__}>"]
                raise

    Recording.__name__ = base.__name__
    start, cpu_start = time.monotonic(), time.process_time()
    try:
        run_state_machine_as_test(Recording, settings=run_settings(
            profile, max_examples=max_examples, shrink=shrink, quiet=quiet))
    except BaseException as exc:  # a Violation, an ExceptionGroup of them, or a bug
        found = _violations_in(exc)
        if not found:
            kill.error = f"{type(exc).__name__}: {exc}"
        kill.final_categories = sorted({v.category for v in found})
        if found and found[0].trace is not None:
            kill.final_program = render(found[0].trace)
            kill.final_steps = len(found[0].trace.steps)
        if found and not kill.caught:  # raised outside a step (the constructor)
            kill.caught = True
            kill.steps, kill.examples = stats.steps, stats.examples
            kill.category, kill.message = found[0].category, found[0].message
            kill.step_in_example = found[0].step
    kill.seconds = round(time.monotonic() - start, 3)
    kill.cpu_seconds = round(time.process_time() - cpu_start, 3)
    kill.total_steps, kill.total_examples = stats.steps, stats.examples
    return kill
