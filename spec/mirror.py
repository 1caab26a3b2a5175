"""The mirror: the spec's own copy of one checked allocator's abstract state.

The incremental checked mode (:mod:`prefixcache.spec.checked`) keeps one per
allocator.  It starts as the allocator's whole abstract state, checked in
full, and after every call that met its contract it takes the new values
of the elements that call touched (which the contract has just compared
with what the spec expects).  So it is the state the spec says the allocator
is in, and the old state of each contract is read from it, never from the
allocator under check.  It is indexed so that reading or updating one
element costs O(1) (an evictor entry O(log n)): a :class:`PartialState`
over k elements costs O(k) whatever the pool's size.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import AbstractSet, Any, Deque, Dict, List, Sequence, Set, Tuple

from .abstraction import Part, free_in_order
from .state import AbstractState, BlockId, BlockState, ContentKey, EvictorEntry, PartialState

_Rank = Tuple[float, int, BlockId]


def id_sequence(ids: Sequence[BlockId]) -> Sequence[BlockId]:
    """``ids`` (sorted) as a ``range`` when they are consecutive (membership
    and rank in O(1)), else as they are."""
    if ids and list(ids) == list(range(ids[0], ids[0] + len(ids))):
        return range(ids[0], ids[0] + len(ids))
    return tuple(ids)


class Mirror:
    """The abstract state of one allocator, element by element."""

    def __init__(self, s: AbstractState) -> None:
        """Start as ``s`` (a whole state)."""
        self.block_ids = id_sequence(s.block_ids)
        self.block_size = s.block_size
        self.free: Deque[BlockId] = deque(s.free)
        self.blocks: Dict[BlockId, BlockState] = dict(s.blocks)
        self.cached: Dict[ContentKey, BlockId] = dict(s.cached)
        self.entries: Dict[BlockId, EvictorEntry] = {e.block_id: e for e in s.evictor}
        self.heap: List[Tuple[_Rank, BlockId]] = [(e.eviction_rank(), e.block_id)
                                                  for e in s.evictor]
        heapq.heapify(self.heap)
        self.touched: Set[BlockId] = set(s.touched)
        self.in_use: Set[BlockId] = {i for i, b in s.blocks.items() if b.refcount > 0}
        self.copy_on_writes = s.copy_on_writes
        self.hits, self.misses, self.reported_free = s.hits, s.misses, s.reported_free

    # -- reading -----------------------------------------------------------------

    def _live(self, rank: _Rank, i: BlockId) -> bool:
        e = self.entries.get(i)
        return e is not None and e.eviction_rank() == rank

    def head(self, n: int) -> Tuple[List[BlockId], List[BlockId]]:
        """The ids ``n`` takes would hand out, in order: the first free ids,
        then the first evictor entries (O(n log size))."""
        free = [self.free[k] for k in range(min(n, len(self.free)))]
        victims: List[Tuple[_Rank, BlockId]] = []
        heap = self.heap
        while heap and len(victims) < n - len(free):
            top = heapq.heappop(heap)
            if self._live(*top):
                victims.append(top)
        for top in victims:
            heapq.heappush(heap, top)
        return free, [i for _, i in victims]

    def part(self, part: Part) -> PartialState:
        """The state at the ids and keys of ``part``, with the counts of the rest."""
        ids, keys = frozenset(part[0]), frozenset(part[1])
        get_block, get_id, get_entry = self.blocks.get, self.cached.get, self.entries.get
        blocks = {i: b for i in ids if (b := get_block(i)) is not None}
        cached = {k: j for k in keys if (j := get_id(k)) is not None}
        entries = [e for i in ids if (e := get_entry(i)) is not None]
        if len(entries) > 1:
            entries.sort(key=EvictorEntry.eviction_rank)
        evictor = tuple(entries)
        free = free_in_order(self.free, ids.difference(blocks)) if len(blocks) < len(ids) else ()
        state = object.__new__(PartialState)  # its fields set at once (a frozen dataclass)
        state.__dict__.update(
            block_ids=self.block_ids, free=free, blocks=blocks, cached=cached, evictor=evictor,
            touched=ids & self.touched,
            copy_on_writes=self.copy_on_writes, hits=self.hits, misses=self.misses,
            reported_free=self.reported_free, block_size=self.block_size,
            ids=ids, keys=keys,
            outside_free=len(self.free) - len(free),
            outside_evictable=len(self.entries) - len(evictor),
            outside_cached=len(self.cached) - len(cached))
        return state

    def state(self) -> AbstractState:
        """The whole state (O(size))."""
        return AbstractState(
            block_ids=tuple(self.block_ids), free=tuple(self.free), blocks=dict(self.blocks),
            cached=dict(self.cached),
            evictor=tuple(sorted(self.entries.values(), key=EvictorEntry.eviction_rank)),
            touched=frozenset(self.touched), copy_on_writes=self.copy_on_writes,
            hits=self.hits, misses=self.misses, reported_free=self.reported_free,
            block_size=self.block_size)

    # -- updating ----------------------------------------------------------------

    def commit(self, old: PartialState, new: PartialState, free: Sequence[BlockId],
               changed: Part) -> None:
        """Take the values of ``new`` (a partial state that met the
        contract, read at the same elements as ``old``, which this mirror
        gave) at the ids and keys ``changed`` (where they differ);
        ``free`` is the allocator's free list, read only to learn where its
        newly free ids went (the spec leaves that open)."""
        ids, keys = changed
        for i in ids:
            b = new.blocks.get(i)
            _assign(self.blocks, i, b)
            _put(self.in_use, i, b is not None and b.refcount > 0)
            _put(self.touched, i, i in new.touched)
            self.entries.pop(i, None)
        for e in new.evictor:
            if e.block_id in ids:
                self.entries[e.block_id] = e
                heapq.heappush(self.heap, (e.eviction_rank(), e.block_id))
        if len(self.heap) > 2 * len(self.entries) + 64:
            self.heap = [(e.eviction_rank(), i) for i, e in self.entries.items()]
            heapq.heapify(self.heap)
        for k in keys:
            _assign(self.cached, k, new.cached.get(k))
        self._move_free(old.free, new.free, free)
        self.copy_on_writes = new.copy_on_writes
        self.hits, self.misses, self.reported_free = new.hits, new.misses, new.reported_free

    def _move_free(self, gone: Tuple[BlockId, ...], came: Tuple[BlockId, ...],
                   free: Sequence[BlockId]) -> None:
        """Replace the free ids ``gone`` by ``came``, placed as in ``free``
        (nothing to do when they are the same ids in the same order: none
        was released)."""
        if gone == came:
            return
        n = len(gone)
        if tuple(self.free[k] for k in range(min(n, len(self.free)))) == gone:
            for _ in range(n):
                self.free.popleft()
        else:
            dropped: AbstractSet[BlockId] = frozenset(gone)
            self.free = deque(i for i in self.free if i not in dropped)
        m = len(came)
        if tuple(free[k] for k in range(min(m, len(free)))) == came:
            self.free.extendleft(reversed(came))
        elif m <= len(free) and tuple(free[len(free) - m + k] for k in range(m)) == came:
            self.free.extend(came)
        else:
            self.free = deque(free)


def _assign(d: Dict[Any, Any], key: Any, value: Any) -> None:
    """``d[key] = value``, or no entry for ``key`` when ``value`` is None."""
    if value is None:
        d.pop(key, None)
    else:
        d[key] = value


def _put(s: Set[BlockId], i: BlockId, member: bool) -> None:
    if member:
        s.add(i)
    else:
        s.discard(i)


__all__ = ["Mirror", "id_sequence"]
