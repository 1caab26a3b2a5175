"""The contracts: for every operation, when it succeeds and what it does.

Each operation ``X`` has two pure functions over abstract states:

* ``pre_X(state, args...) -> bool``: the call succeeds.  When it is False the
  call must raise the exception :mod:`prefixcache.spec.error_table` names and
  leave the state exactly as it was.
* ``post_X(old, new, result, args...) -> bool``: after a successful call, the
  state moved from ``old`` to ``new`` as described and ``result`` is right.

Arguments are abstract: a Block is named by its ``block_id`` (None for a
detached Block) and content by a :data:`~prefixcache.spec.state.ContentKey`
(None where the tokens do not form a full, hashable block).  A postcondition is
stated as "``new`` equals ``old`` after these steps", built from a handful of
named steps (take an id, release a reference, hit, promote, record a query),
each described in words below.  One freedom is left to the allocator: where
in the free list an id whose last reference was dropped is put back (vLLM puts
it first); the next id handed out is always the first of ``free``, else the
first evictor entry.

``post_naive_X`` are the contracts of the allocator without a prefix cache
where they differ.  The docstrings are rendered into SPEC.md.
"""

from __future__ import annotations

import math
from typing import (
    AbstractSet,
    Any,
    Callable,
    Dict,
    FrozenSet,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
)

from . import pure
from .state import (
    NEVER_ACCESSED,
    AbstractState,
    BlockId,
    BlockState,
    ContentKey,
    EvictorEntry,
    replace,
)

#: the pure cores these contracts state their rules by, without the cores'
#: own runtime contracts (proved by CrossHair; each would double the check)
_longest_ready_prefix = pure.unchecked(pure.longest_ready_prefix)
_hit_rate = pure.unchecked(pure.hit_rate)

Step = Tuple[AbstractState, BlockId, FrozenSet[BlockId]]
"""A step's outcome: the state after it, the id it concerns, the ids it put
back on the free list."""

FRESH = BlockState(refcount=1, content=None, computed=False, last_accessed=NEVER_ACCESSED)
"""The state of an id just handed out as a mutable block."""


# ==========================================================================
# helpers


def next_id(s: AbstractState) -> Optional[BlockId]:
    """The id the next allocation takes: the first free id, else the first
    evictor entry (evicted), else None."""
    if s.free:
        return s.free[0]
    if s.evictor:
        return s.evictor[0].block_id
    return None


def _sorted_evictor(entries: Sequence[EvictorEntry]) -> Tuple[EvictorEntry, ...]:
    return tuple(sorted(entries, key=EvictorEntry.eviction_rank))


def agrees(expected: AbstractState, new: AbstractState, released: AbstractSet[BlockId]) -> bool:
    """``new`` equals ``expected`` except that the ids in ``released`` (put
    back on the free list) may sit anywhere in ``new.free``."""
    if replace(new, free=expected.free) != expected:
        return False
    if len(new.free) != len(expected.free) or set(new.free) != set(expected.free):
        return False
    keep_new = [i for i in new.free if i not in released]
    keep_exp = [i for i in expected.free if i not in released]
    return keep_new == keep_exp


def _unchanged(old: AbstractState, new: AbstractState) -> bool:
    return old == new


def in_use(s: AbstractState, i: Optional[BlockId]) -> bool:
    """``i`` is an id with at least one reference."""
    if i is None:
        return False
    b = s.blocks.get(i)
    return b is not None and b.refcount > 0


def is_mutable(s: AbstractState, i: Optional[BlockId]) -> bool:
    """``i`` is in use and holds no content."""
    return in_use(s, i) and s.blocks[i].content is None  # type: ignore[index]


# ==========================================================================
# steps


def take(s: AbstractState) -> Step:
    """Take an id: the first free id, else evict the first evictor entry
    (its content leaves the cache).  The id becomes a fresh mutable block
    (refcount 1, no content, not computed, never accessed), leaves the
    touched set, and the free count drops by one.  Needs ``next_id(s)``."""
    i = next_id(s)
    if i is None:
        raise ValueError("take() on a state with no free id")
    blocks = dict(s.blocks)
    blocks[i] = FRESH
    if s.free:
        s2 = replace(s, free=s.free[1:], blocks=blocks)
    else:
        victim = s.evictor[0]
        cached = {k: v for k, v in s.cached.items() if k != victim.content}
        s2 = replace(s, blocks=blocks, cached=cached, evictor=s.evictor[1:])
    s3 = replace(s2, touched=s2.touched - {i}, reported_free=s.reported_free - 1)
    return (s3, i, frozenset())


def release(s: AbstractState, i: BlockId, n: int = 1) -> Step:
    """Drop ``n`` references to ``i``.  While references remain nothing else
    changes.  At zero a mutable id goes back to the free list (and leaves the
    touched set); an id with content becomes evictable: it stays cached,
    counts as computed unless it is touched, keeps its access time, and
    enters the evictor.  The free count grows by one either way."""
    b = s.blocks[i]
    blocks = dict(s.blocks)
    rc = b.refcount - n
    if rc > 0:
        blocks[i] = replace(b, refcount=rc)
        return (replace(s, blocks=blocks), i, frozenset())
    if b.content is None:
        del blocks[i]
        s2 = replace(
            s,
            free=(i,) + s.free,
            blocks=blocks,
            touched=s.touched - {i},
            reported_free=s.reported_free + 1,
        )
        return (s2, i, frozenset({i}))
    blocks[i] = BlockState(refcount=0, content=b.content, computed=i not in s.touched,
                           last_accessed=b.last_accessed)
    tokens = sum(len(toks) for _, toks in b.content)
    entry = EvictorEntry(b.last_accessed, tokens, i, b.content)
    s2 = replace(
        s,
        blocks=blocks,
        evictor=_sorted_evictor(s.evictor + (entry,)),
        reported_free=s.reported_free + 1,
    )
    return (s2, i, frozenset())


def share(s: AbstractState, key: ContentKey) -> Step:
    """Add a reference to the id cached under ``key``.  An evictable id
    leaves the evictor and comes back in use, never accessed, computed
    unless touched (the free count drops by one); an id in use just gains
    the reference."""
    i = s.cached[key]
    b = s.blocks[i]
    blocks = dict(s.blocks)
    if b.refcount > 0:
        blocks[i] = replace(b, refcount=b.refcount + 1)
        return (replace(s, blocks=blocks), i, frozenset())
    blocks[i] = BlockState(refcount=1, content=key, computed=i not in s.touched,
                           last_accessed=NEVER_ACCESSED)
    s2 = replace(s, blocks=blocks, evictor=tuple(e for e in s.evictor if e.block_id != i),
                 reported_free=s.reported_free - 1)
    return (s2, i, frozenset())


def promote(s: AbstractState, i: BlockId, key: ContentKey) -> Step:
    """Give the mutable id ``i`` (one reference) the content ``key``.  New
    content: ``i`` is cached under ``key`` and touched (not computed yet).
    Content already cached (a duplicate): ``i`` is released to the free list
    and the block shares the cached id instead."""
    if key in s.cached:
        s1, _, released = release(s, i)
        s2, j, _ = share(s1, key)
        return (s2, j, released)
    blocks = dict(s.blocks)
    blocks[i] = replace(s.blocks[i], content=key)
    cached = dict(s.cached)
    cached[key] = i
    return (replace(s, blocks=blocks, cached=cached, touched=s.touched | {i}), i, frozenset())


def query(s: AbstractState, hit: bool) -> AbstractState:
    """Count one cache query as a hit or a miss."""
    if hit:
        return replace(s, hits=s.hits + 1)
    return replace(s, misses=s.misses + 1)


def lookup(s: AbstractState, key: ContentKey) -> Step:
    """An immutable allocation of ``key``: a hit shares the cached id; a miss
    takes an id and promotes it to ``key``.  Either way one query is counted."""
    if key in s.cached:
        s1, i, rel = share(s, key)
        return (query(s1, True), i, rel)
    s1, i, _ = take(s)
    s2, j, rel = promote(s1, i, key)
    return (query(s2, False), j, rel)


def _steps(s: AbstractState, step: Callable[[AbstractState, Any], Step], items: Sequence[Any]
           ) -> Tuple[AbstractState, List[BlockId], FrozenSet[BlockId]]:
    """``step(s, item)`` for each item in order: the last state, the ids the
    steps concern and the ids they released."""
    ids: List[BlockId] = []
    rel: FrozenSet[BlockId] = frozenset()
    for item in items:
        s, i, r = step(s, item)
        ids.append(i)
        rel = rel | r
    return s, ids, rel


def demand(s: AbstractState, keys: Sequence[Optional[ContentKey]]) -> int:
    """How many free-count units allocating ``keys`` in order consumes: one
    per key not cached in use (a miss, or a hit that revives an evictable
    id), one per mutable block (key None); a repeated key counts once."""
    seen: set[ContentKey] = set()
    n = 0
    for key in keys:
        if key is None:
            n += 1
        elif key not in seen:
            seen.add(key)
            if not in_use(s, s.cached.get(key)):
                n += 1
    return n


# ==========================================================================
# allocation


def pre_allocate_mutable_block(s: AbstractState) -> bool:
    """Succeeds when some id is free or evictable (``reported_free > 0``)."""
    return s.reported_free > 0 and next_id(s) is not None


def post_allocate_mutable_block(old: AbstractState, new: AbstractState, result: BlockId) -> bool:
    """Takes an id (the first free id, else evicts the first evictor entry)
    and returns it as a fresh mutable block: refcount 1, no content, not
    computed; the free count drops by one; nothing else changes."""
    expected, i, rel = take(old)
    return result == i and agrees(expected, new, rel)


def pre_allocate_immutable_block(s: AbstractState, key: Optional[ContentKey]) -> bool:
    """Succeeds when the tokens fill a block whose previous block is hashed
    (``key`` is not None) and either the content is cached or an id is free
    or evictable."""
    if key is None:
        return False
    return key in s.cached or pre_allocate_mutable_block(s)


def post_allocate_immutable_block(
    old: AbstractState, new: AbstractState, result: BlockId, key: ContentKey
) -> bool:
    """Hit (``key`` cached): returns the cached id with one more reference;
    an evictable id leaves the evictor computed and the free count drops;
    one hit is counted.  Miss: takes an id, caches ``key`` on it, marks it
    touched and not computed, counts one miss; the free count drops by one."""
    expected, i, rel = lookup(old, key)
    return result == i and agrees(expected, new, rel)


def pre_naive_allocate_immutable_block(s: AbstractState, fits: bool) -> bool:
    """Without a cache: succeeds when the tokens fit in one block and an id
    is free."""
    return fits and s.count_free() > 0


def post_naive_allocate_immutable_block(
    old: AbstractState, new: AbstractState, result: BlockId, key: Optional[ContentKey] = None
) -> bool:
    """Without a cache: takes the first free id as a block without content
    (the tokens are not hashed); the free count drops by one."""
    return post_allocate_mutable_block(old, new, result)


def pre_allocate_immutable_blocks(s: AbstractState, keys: Sequence[Optional[ContentKey]]) -> bool:
    """Succeeds when every token list fills a hashable block and the ids the
    misses and revived evictable hits need are available (all or nothing)."""
    if any(k is None for k in keys):
        return False
    return demand(s, keys) <= s.reported_free


def post_allocate_immutable_blocks(
    old: AbstractState, new: AbstractState, result: Sequence[BlockId],
    keys: Sequence[ContentKey],
) -> bool:
    """The same as ``allocate_immutable_block`` once per key, in order; the
    result lists the ids in that order."""
    s, ids, rel = _steps(old, lookup, keys)
    return list(result) == ids and agrees(s, new, rel)


def pre_naive_allocate_immutable_blocks(s: AbstractState, count: int, fits: bool = True) -> bool:
    """Without a cache: succeeds when every token list fits in a block and
    ``count`` (their number) ids are free."""
    return fits and count <= s.count_free()


def post_naive_allocate_immutable_blocks(
    old: AbstractState, new: AbstractState, result: Sequence[BlockId], count: int
) -> bool:
    """Without a cache: takes ``count`` free ids in order, each a block
    without content."""
    s, ids, rel = _steps(old, lambda s, _: take(s), range(count))
    return list(result) == ids and agrees(s, new, rel)


# ==========================================================================
# freeing, forking, appending


def pre_free(s: AbstractState, block_id: Optional[BlockId]) -> bool:
    """Succeeds for an attached Block whose id is in use."""
    return in_use(s, block_id)


def post_free(old: AbstractState, new: AbstractState, result: Any, block_id: BlockId) -> bool:
    """Drops one reference.  At zero a mutable id is free again and an id
    with content becomes evictable (still cached, in the evictor); the free
    count grows by one.  Returns None."""
    expected, _, rel = release(old, block_id)
    return result is None and agrees(expected, new, rel)


def pre_free_block_id(s: AbstractState, block_id: Optional[BlockId]) -> bool:
    """(Naive allocator, bare id.) Succeeds for an id in use."""
    return in_use(s, block_id)


def post_free_block_id(
    old: AbstractState, new: AbstractState, result: Any, block_id: BlockId
) -> bool:
    """Drops one reference to the id, as ``free`` does for a Block."""
    return post_free(old, new, result, block_id)


def pre_fork(s: AbstractState, chain_ids: Sequence[Optional[BlockId]]) -> bool:
    """Succeeds when every Block of the chain is attached and in use."""
    return all(in_use(s, i) for i in chain_ids)


def post_fork(
    old: AbstractState, new: AbstractState, result: Sequence[BlockId],
    chain_ids: Sequence[BlockId],
) -> bool:
    """Returns a new chain on the same ids, first block first; each id gains
    one reference; nothing else changes."""
    blocks = dict(old.blocks)
    for i in chain_ids:
        blocks[i] = replace(blocks[i], refcount=blocks[i].refcount + 1)
    return list(result) == list(chain_ids) and agrees(replace(old, blocks=blocks), new, frozenset())


def copy_on_write(s: AbstractState, i: BlockId) -> Step:
    """Make ``i`` writable for one of its Blocks: with one reference it is
    already; else that Block drops its reference and takes a new id, and the
    pair (old, new) is recorded."""
    b = s.blocks[i]
    if b.refcount <= 1:
        return (s, i, frozenset())
    blocks = dict(s.blocks)
    blocks[i] = replace(b, refcount=b.refcount - 1)
    s1, j, rel = take(replace(s, blocks=blocks))
    return (replace(s1, copy_on_writes=s1.copy_on_writes + ((i, j),)), j, rel)


def pre_cow_block_if_not_appendable(s: AbstractState, block_id: Optional[BlockId]) -> bool:
    """Succeeds for a Block on an id in use; a shared id must be mutable
    (an immutable one is never written) and needs a free or evictable id
    for the copy."""
    if block_id is None or not in_use(s, block_id):
        return False
    b = s.blocks[block_id]
    return b.refcount <= 1 or (b.content is None and next_id(s) is not None)


def post_cow_block_if_not_appendable(
    old: AbstractState, new: AbstractState, result: BlockId, block_id: BlockId
) -> bool:
    """An id with one reference: returned unchanged, nothing changes.  A
    shared id: it loses one reference, a new mutable id is taken and
    returned, and (old, new) is recorded as a copy-on-write."""
    expected, j, rel = copy_on_write(old, block_id)
    return result == j and agrees(expected, new, rel)


def pre_append_token_ids(
    s: AbstractState, block_id: Optional[BlockId], immutable: bool, room: int,
    num_tokens: int, full_key: Optional[ContentKey],
) -> bool:
    """Succeeds for a Block that is not immutable (not full and hashed, not
    computed) and has at least ``num_tokens`` empty slots (``room``; no
    tokens always fit).  An attached Block must be on an id in use, and if
    the id is shared a free or evictable id is needed for the copy-on-write.
    A detached Block just takes the tokens."""
    if immutable:
        return False
    if num_tokens == 0 or block_id is None:
        return num_tokens <= room
    if num_tokens > room or not in_use(s, block_id):
        return False
    return s.blocks[block_id].refcount <= 1 or next_id(s) is not None


def post_append_token_ids(
    old: AbstractState, new: AbstractState, result: Optional[BlockId],
    block_id: Optional[BlockId], immutable: bool, room: int, num_tokens: int,
    full_key: Optional[ContentKey],
) -> bool:
    """No tokens, or a detached Block: nothing changes.  Otherwise a shared
    id is first copied on write (see ``cow_block_if_not_appendable``); then,
    if the tokens fill the block and it is hashable (``full_key``), the
    block is promoted (see ``promote_to_immutable_block``).  ``result`` is
    the Block's id afterwards."""
    if num_tokens == 0 or block_id is None:
        return result == block_id and _unchanged(old, new)
    s1, j, rel = copy_on_write(old, block_id)
    if full_key is not None:
        s1, j, rel2 = promote(s1, j, full_key)
        rel = rel | rel2
    return result == j and agrees(s1, new, rel)


def pre_naive_append_token_ids(
    s: AbstractState, block_id: Optional[BlockId], room: int, num_tokens: int
) -> bool:
    """Without a cache: as for the prefix-caching allocator, with no
    immutable blocks."""
    return pre_append_token_ids(s, block_id, False, room, num_tokens, None)


def post_naive_append_token_ids(
    old: AbstractState, new: AbstractState, result: Optional[BlockId],
    block_id: Optional[BlockId], room: int, num_tokens: int,
) -> bool:
    """Without a cache: a shared id is copied on write; nothing is promoted."""
    return post_append_token_ids(old, new, result, block_id, False, room, num_tokens, None)


def pre_promote_to_immutable_block(
    s: AbstractState, block_id: Optional[BlockId], key: Optional[ContentKey]
) -> bool:
    """Succeeds for a full, hashable Block (``key``) on a mutable id in use
    (an id already cached is immutable)."""
    return key is not None and is_mutable(s, block_id)


def post_promote_to_immutable_block(
    old: AbstractState, new: AbstractState, result: BlockId, block_id: BlockId,
    key: ContentKey,
) -> bool:
    """New content: the id is cached under ``key`` and touched, not computed;
    it is returned.  Duplicate content: the id is freed, the cached id gains
    a reference (leaving the evictor if it was there) and is returned.  No
    query is counted."""
    expected, j, rel = promote(old, block_id, key)
    return result == j and agrees(expected, new, rel)


# ==========================================================================
# copy-on-write records, access times, computed flags


def pre_clear_copy_on_writes(s: AbstractState) -> bool:
    """Always succeeds."""
    return True


def post_clear_copy_on_writes(
    old: AbstractState, new: AbstractState, result: Sequence[Tuple[BlockId, BlockId]]
) -> bool:
    """Returns the recorded (source, destination) pairs in order and forgets
    them; nothing else changes."""
    return [tuple(p) for p in result] == list(old.copy_on_writes) and agrees(
        replace(old, copy_on_writes=()), new, frozenset()
    )


def pre_mark_blocks_as_accessed(
    s: AbstractState, block_ids: Sequence[Optional[BlockId]], now: Any = 0.0
) -> bool:
    """Succeeds when every id is in use or evictable here and ``now`` is a
    number that is not NaN (a NaN time has no place in the eviction order)."""
    if type(now) not in (int, float) or now != now:
        return False
    return all(i is not None and i in s.blocks for i in block_ids)


def post_mark_blocks_as_accessed(
    old: AbstractState, new: AbstractState, result: Any, block_ids: Sequence[BlockId],
    now: float,
) -> bool:
    """Each id's access time becomes ``now`` (an evictable id moves to its
    new place in the eviction order); nothing else changes."""
    blocks = dict(old.blocks)
    for i in block_ids:
        blocks[i] = replace(blocks[i], last_accessed=now)
    targets = set(block_ids)
    evictor = _sorted_evictor(
        [replace(e, last_accessed=now) if e.block_id in targets else e for e in old.evictor]
    )
    expected = replace(old, blocks=blocks, evictor=evictor)
    return result is None and agrees(expected, new, frozenset())


def pre_mark_blocks_as_computed(s: AbstractState, block_ids: Sequence[BlockId]) -> bool:
    """Always succeeds (the argument is ignored, as in vLLM)."""
    return True


def post_mark_blocks_as_computed(
    old: AbstractState, new: AbstractState, result: Any, block_ids: Sequence[BlockId]
) -> bool:
    """Every touched id becomes computed and the touched set is emptied,
    whatever ``block_ids`` says; nothing else changes."""
    blocks = dict(old.blocks)
    for i in old.touched:
        if i in blocks:
            blocks[i] = replace(blocks[i], computed=True)
    expected = replace(old, blocks=blocks, touched=frozenset())
    return result is None and agrees(expected, new, frozenset())


def post_naive_query_no_change(old: AbstractState, new: AbstractState, result: Any) -> bool:
    """Without a cache the prefix-caching hooks change nothing."""
    return _unchanged(old, new)


# ==========================================================================
# queries (never change the state)


def common_computed_prefix(lists: Sequence[Sequence[BlockId]]) -> List[BlockId]:
    """One list: that list.  Otherwise the longest common prefix of the
    non-empty lists ([] when there is none)."""
    if len(lists) == 1:
        return list(lists[0])
    nonempty = [list(x) for x in lists if len(x) > 0]
    if not nonempty:
        return []
    n = min(len(x) for x in nonempty)
    k = 0
    while k < n and all(x[k] == nonempty[0][k] for x in nonempty):
        k += 1
    return nonempty[0][:k]


def pre_get_common_computed_block_ids(
    s: AbstractState, lists: Sequence[Sequence[BlockId]]
) -> bool:
    """Always succeeds."""
    return True


def post_get_common_computed_block_ids(
    old: AbstractState, new: AbstractState, result: Any, lists: Sequence[Sequence[BlockId]]
) -> bool:
    """Returns a list: the only list when there is one, else the longest
    common prefix of the non-empty lists; the computed flags are not
    consulted; nothing changes."""
    return (isinstance(result, list) and result == common_computed_prefix(lists)
            and _unchanged(old, new))


def post_naive_get_common_computed_block_ids(
    old: AbstractState, new: AbstractState, result: Any, lists: Sequence[Sequence[BlockId]]
) -> bool:
    """Without a cache: always ``[]``."""
    return result == [] and _unchanged(old, new)


def full_blocks_touched(
    s: AbstractState, blocks: Sequence[Tuple[bool, Optional[ContentKey]]]
) -> int:
    """How many of ``blocks`` (is_full, key) are full and would need an id:
    not cached here, or cached on an evictable id (no deduplication)."""
    n = 0
    for full, key in blocks:
        if not full:
            continue
        i = s.cached.get(key) if key is not None else None
        if i is None or not in_use(s, i):
            n += 1
    return n


def pre_get_num_full_blocks_touched(
    s: AbstractState, blocks: Sequence[Tuple[bool, Optional[ContentKey]]]
) -> bool:
    """Always succeeds."""
    return True


def post_get_num_full_blocks_touched(
    old: AbstractState, new: AbstractState, result: int,
    blocks: Sequence[Tuple[bool, Optional[ContentKey]]],
) -> bool:
    """Counts the full blocks that are not cached here or cached on an
    evictable id; nothing changes."""
    return result == full_blocks_touched(old, blocks) and _unchanged(old, new)


def post_naive_get_num_full_blocks_touched(
    old: AbstractState, new: AbstractState, result: int,
    blocks: Sequence[Tuple[int, bool]],
) -> bool:
    """Without a cache: counts the distinct (by identity) full Blocks."""
    return result == len({ident for ident, full in blocks if full}) and _unchanged(old, new)


class _Ready:
    """The keys cached on computed ids of a state, as a container (looked
    up key by key, never listed)."""

    def __init__(self, s: AbstractState) -> None:
        self.s = s

    def __contains__(self, key: object) -> bool:
        i = self.s.cached.get(key) if key is not None else None  # type: ignore[call-overload]
        return i is not None and self.s.blocks[i].computed


def cached_prefix_length(s: AbstractState, keys: Sequence[Optional[ContentKey]]) -> int:
    """The length of the longest prefix of ``keys`` that are all cached on
    computed ids (:func:`.pure.longest_ready_prefix`)."""
    return _longest_ready_prefix(keys, _Ready(s))


def pre_find_cached_blocks_prefix(s: AbstractState, keys: Sequence[Optional[ContentKey]]) -> bool:
    """Always succeeds."""
    return True


def post_find_cached_blocks_prefix(
    old: AbstractState, new: AbstractState, result: int, keys: Sequence[Optional[ContentKey]]
) -> bool:
    """Returns (as the length of the returned hash list) the longest prefix
    of the hashes whose blocks are all cached and computed (an evictable id
    counts as computed; a touched one does not); nothing changes."""
    return result == cached_prefix_length(old, keys) and _unchanged(old, new)


def post_naive_find_cached_blocks_prefix(
    old: AbstractState, new: AbstractState, result: int, keys: Sequence[Optional[ContentKey]]
) -> bool:
    """Without a cache: always the empty prefix."""
    return result == 0 and _unchanged(old, new)


def pre_block_is_computed(s: AbstractState, block_id: Any) -> bool:
    """Succeeds for an id of this allocator."""
    return block_id in s.block_ids


def post_block_is_computed(
    old: AbstractState, new: AbstractState, result: bool, block_id: BlockId
) -> bool:
    """Returns whether the id is computed: the flag of an id in use, True
    for an evictable id that is not touched, False for a free id; nothing
    changes."""
    b = old.blocks.get(block_id)
    return result == (b is not None and b.computed) and _unchanged(old, new)


def pre_is_block_cached(s: AbstractState, key: Optional[ContentKey]) -> bool:
    """Succeeds for a Block with content (a full block whose earlier blocks
    are all full)."""
    return key is not None


def post_is_block_cached(
    old: AbstractState, new: AbstractState, result: bool, key: Optional[ContentKey]
) -> bool:
    """Returns whether the Block's content is cached (on an id in use or
    evictable); nothing changes."""
    return result == (key in old.cached) and _unchanged(old, new)


def hit_rate(s: AbstractState) -> float:
    """The state's hit rate (:func:`.pure.hit_rate`)."""
    return _hit_rate(s.hits, s.misses)


def post_get_prefix_cache_hit_rate(old: AbstractState, new: AbstractState, result: float) -> bool:
    """Returns hits / (hits + misses), 0.0 with no query (to 1e-9); nothing
    changes."""
    return math.isclose(result, hit_rate(old), rel_tol=1e-9, abs_tol=1e-9) and _unchanged(old, new)


def post_naive_get_prefix_cache_hit_rate(
    old: AbstractState, new: AbstractState, result: float
) -> bool:
    """Without a cache: always -1."""
    return result == -1 and _unchanged(old, new)


def post_get_num_free_blocks(old: AbstractState, new: AbstractState, result: int) -> bool:
    """Returns the number of free plus evictable ids (``reported_free``, which
    the invariant ``counting`` ties to them); nothing changes."""
    return result == old.reported_free and _unchanged(old, new)


def post_get_num_total_blocks(old: AbstractState, new: AbstractState, result: int) -> bool:
    """Returns the number of ids; nothing changes."""
    return result == len(old.block_ids) and _unchanged(old, new)


def pre_get_physical_block_id(s: AbstractState, absolute_id: Any) -> bool:
    """Succeeds for an id of this allocator."""
    return absolute_id in s.block_ids


def post_get_physical_block_id(
    old: AbstractState, new: AbstractState, result: int, absolute_id: BlockId
) -> bool:
    """Returns the rank of the id among this allocator's sorted ids; nothing
    changes."""
    return result == old.block_ids.index(absolute_id) and _unchanged(old, new)


def post_all_block_ids(old: AbstractState, new: AbstractState, result: AbstractSet[int]) -> bool:
    """Returns every id of this allocator as a set; nothing changes."""
    return frozenset(result) == frozenset(old.block_ids) and _unchanged(old, new)


# ==========================================================================
# swapping and reset


def pre_swap_out(s: AbstractState, block_ids: Sequence[Optional[BlockId]]) -> bool:
    """Succeeds when every Block is attached, in use, and no id is released
    more often than it is referenced."""
    counts: Dict[BlockId, int] = {}
    for i in block_ids:
        if i is None or not in_use(s, i):
            return False
        counts[i] = counts.get(i, 0) + 1
    return all(n <= s.blocks[i].refcount for i, n in counts.items())


def post_swap_out(
    old: AbstractState, new: AbstractState, result: Any, block_ids: Sequence[BlockId]
) -> bool:
    """Frees each Block's reference in order (as ``free``); the Block
    objects are kept, detached.  Returns None."""
    s, _, rel = _steps(old, release, block_ids)
    return result is None and agrees(s, new, rel)


def pre_swap_in(
    s: AbstractState, keys: Sequence[Optional[ContentKey]], distinct: bool = True
) -> bool:
    """Succeeds when each Block appears once (``distinct``) and the ids the
    Blocks need are available (all or nothing); ``keys`` holds each Block's
    content, None for a Block without content hash."""
    return distinct and demand(s, keys) <= s.reported_free


def post_swap_in(
    old: AbstractState, new: AbstractState, result: Sequence[BlockId],
    keys: Sequence[Optional[ContentKey]],
) -> bool:
    """Each Block in order gets an id: a hashed one as by
    ``allocate_immutable_block`` of its content (a hit or a miss, counted),
    any other a fresh mutable id.  ``result`` lists the new ids."""
    s, ids, rel = _steps(old, lambda s, key: take(s) if key is None else lookup(s, key), keys)
    return list(result) == ids and agrees(s, new, rel)


def pre_naive_swap_in(s: AbstractState, count: int, distinct: bool = True) -> bool:
    """Without a cache: succeeds when each Block appears once and ``count``
    ids are free."""
    return distinct and count <= s.count_free()


def post_naive_swap_in(
    old: AbstractState, new: AbstractState, result: Sequence[BlockId], count: int
) -> bool:
    """Without a cache: each Block takes the next free id, in order."""
    return post_naive_allocate_immutable_blocks(old, new, result, count)


def pre_reset_prefix_cache(s: AbstractState) -> bool:
    """Always succeeds (it answers False when it cannot reset)."""
    return True


def post_reset_prefix_cache(old: AbstractState, new: AbstractState, result: bool) -> bool:
    """With an id in use: returns False and nothing changes.  Otherwise every
    evictable id is evicted back to the free list, the cache, the evictor,
    the touched set and the hit/miss counts are emptied, and it returns True."""
    if old.in_use():
        return result is False and _unchanged(old, new)
    evicted = tuple(e.block_id for e in reversed(old.evictor))
    expected = replace(
        old,
        free=evicted + old.free,
        blocks={},
        cached={},
        evictor=(),
        touched=frozenset(),
        hits=0,
        misses=0,
        reported_free=old.count_free() + old.count_evictable(),
    )
    return result is True and agrees(expected, new, frozenset(evicted))


def post_naive_reset_prefix_cache(old: AbstractState, new: AbstractState, result: bool) -> bool:
    """Without a cache: returns True and nothing changes."""
    return result is True and _unchanged(old, new)


# ==========================================================================
# two devices


def pre_swap(
    src: AbstractState, dst: AbstractState, src_ids: Sequence[Optional[BlockId]],
    keys: Sequence[Optional[ContentKey]],
) -> bool:
    """``CpuGpuBlockAllocator.swap`` succeeds when the Blocks can be swapped
    out of the source device and the destination can take them in."""
    return pre_swap_out(src, src_ids) and pre_swap_in(dst, keys)


def post_swap(
    old_src: AbstractState, new_src: AbstractState, old_dst: AbstractState,
    new_dst: AbstractState, result: Mapping[BlockId, BlockId],
    src_ids: Sequence[BlockId], keys: Sequence[Optional[ContentKey]],
    dst_ids: Sequence[BlockId],
) -> bool:
    """The source device swaps the Blocks out, the destination swaps them in
    (``dst_ids`` are their new ids); the result maps each source id to its
    destination id."""
    return (
        post_swap_out(old_src, new_src, None, src_ids)
        and post_swap_in(old_dst, new_dst, dst_ids, keys)
        and dict(result) == dict(zip(src_ids, dst_ids))
    )


__all__ = [name for name in dir() if name.startswith(("pre_", "post_"))] + [
    "FRESH",
    "agrees",
    "cached_prefix_length",
    "common_computed_prefix",
    "copy_on_write",
    "demand",
    "full_blocks_touched",
    "hit_rate",
    "in_use",
    "is_mutable",
    "lookup",
    "next_id",
    "promote",
    "query",
    "release",
    "share",
    "take",
]
