"""The abstraction function: from an allocator's vLLM-shaped internals to an
:class:`~prefixcache.spec.state.AbstractState`.

It reads only the attributes vLLM 0.8.5's own tests read (``_refcounter``,
``_cached_blocks``, ``_touched_blocks``, ``_block_tracker``,
``_hashless_allocator._free_block_indices``, ``evictor.free_table``,
``_cow_tracker._copy_on_writes``, ``metric_data``, ``_block_size``) plus the
public ``all_block_ids`` and ``get_num_free_blocks()``, always through
``getattr`` and never through ``isinstance``: the same functions read
prefixcache.impl and vLLM 0.8.5's ``PrefixCachingBlockAllocator`` alike.

Naming content.  An allocator stores content *hashes*; the abstract state names
content by its exact key (the extra hash and the exact tokens of every block
from the first one: one ``(extra_hash, tokens)`` pair per block).  A
:class:`ContentLedger` remembers, for every hashed Block it has been shown, the
hash and the key the Block's chain spells, so that ids without a live Block
(evictable ids) can be named too.  A hash shown with two different keys is a
collision, and the ledger records it: that is the "integrity" violation a
hash-based allocator cannot see by itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice
from typing import (
    AbstractSet,
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
)

from . import pure
from .invariants import ownership_matches
from .state import (
    NEVER_ACCESSED,
    AbstractState,
    BlockId,
    BlockState,
    ContentKey,
    EvictorEntry,
    HashedKey,
    PartialState,
)

Part = Tuple[AbstractSet[BlockId], AbstractSet[ContentKey]]
"""The elements a partial state is read at: (ids, content keys)."""

Reuse = Tuple[Mapping[BlockId, BlockState], Mapping[BlockId, EvictorEntry]]
"""Block states and evictor entries by id that a reading may reuse."""

#: :func:`.pure.chain_key` without its runtime contract (read for every live
#: Block at every reading of the state)
_chain_key = pure.unchecked(pure.chain_key)


class AbstractionError(LookupError):
    """The allocator holds a content hash that nothing names: no live Block
    passed to the abstraction and no Block shown to the ledger spelled it."""


class AnswerTypeError(AbstractionError):
    """An answer the abstraction reads is not of the type the API gives
    (``block_is_computed`` answering None for False)."""


def _time(value: Any, holder: str, i: BlockId) -> float:
    """A last-access time read off ``holder`` of id ``i``: a number
    (AnswerTypeError else)."""
    if type(value) is float:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AnswerTypeError(f"{holder} {i} holds last_accessed {value!r}, not a number")
    return float(value)


@dataclass(frozen=True)
class Collision:
    """One hash seen with two different content keys."""

    content_hash: int
    first: ContentKey
    second: ContentKey


@dataclass(frozen=True)
class Alias:
    """One content key seen under two different hashes (harmless for
    correctness, but two ids may then cache the same key)."""

    key: ContentKey
    first_hash: int
    second_hash: int


@dataclass(frozen=True)
class SharedIdConflict:
    """Two live Blocks point at one id but hold different contents."""

    block_id: BlockId
    first: Optional[ContentKey]
    second: Optional[ContentKey]


# --------------------------------------------------------------------------
# reading Blocks


def chain_of(block: Any) -> List[Any]:
    """The chain ending at ``block``, first block first (iterative walk)."""
    chain: List[Any] = []
    b = block
    seen: Set[int] = set()
    while b is not None and id(b) not in seen:
        seen.add(id(b))
        chain.append(b)
        b = getattr(b, "prev_block", None)
    chain.reverse()
    return chain


def _pair(block: Any) -> Tuple[Optional[int], Tuple[int, ...]]:
    """One block's own part of a content key: its extra hash and its tokens."""
    return (getattr(block, "extra_hash", None), tuple(getattr(block, "token_ids", ())))


def content_key_of(block: Any) -> ContentKey:
    """Return the content key a Block spells (:func:`.pure.chain_key` along
    its chain, from the first block through itself).  Pure: reads
    ``prev_block``, ``token_ids`` and ``extra_hash`` only."""
    keys = chain_keys(block)
    return keys[-1][1] if keys else ()


def _memoised_keys() -> Callable[[Any], ContentKey]:
    """``content_key_of``, remembering the key of every block it spelled, so
    that the blocks of one chain cost one walk of it, not one each (a chain
    of a thousand blocks is read in milliseconds).  For one reading: the
    Blocks must not change while it is used."""
    memo: Dict[int, ContentKey] = {}
    alive: List[Any] = []  # the blocks memoised, so that their ids are not reused

    def key_of(block: Any) -> ContentKey:
        path: List[Any] = []
        on_path: Set[int] = set()
        b = block
        while b is not None and id(b) not in memo and id(b) not in on_path:
            on_path.add(id(b))
            path.append(b)
            b = getattr(b, "prev_block", None)
        key: ContentKey = memo[id(b)] if b is not None and id(b) in memo else ()
        for x in reversed(path):
            key = _chain_key(key, *_pair(x))
            memo[id(x)] = key
            alive.append(x)
        return memo[id(block)]

    return key_of


def chain_keys(last_block: Any) -> List[Tuple[Any, ContentKey]]:
    """Return ``(block, key)`` for every block of the chain that ends at
    ``last_block``, first block first, in one pass over the chain (each key
    is its predecessor's key plus the block's own pair)."""
    out: List[Tuple[Any, ContentKey]] = []
    key: ContentKey = ()
    for b in chain_of(last_block):
        key = _chain_key(key, *_pair(b))
        out.append((b, key))
    return out


def ownership_matches_live(state: AbstractState, live_blocks: Iterable[Any]) -> bool:
    """Return whether the refcounts in ``state`` equal the number of live
    Blocks on each id (the ownership invariant, from Blocks directly)."""
    return ownership_matches(state, ownership(live_blocks))


def ownership(live_blocks: Iterable[Any]) -> Dict[BlockId, int]:
    """Return id -> number of distinct live Block objects (by identity) whose
    ``block_id`` is that id; detached Blocks (id None) count nowhere."""
    seen: Set[int] = set()
    owners: Dict[BlockId, int] = {}
    for b in live_blocks:
        if id(b) in seen:
            continue
        seen.add(id(b))
        i = getattr(b, "block_id", None)
        if i is not None:
            owners[i] = owners.get(i, 0) + 1
    return owners


# --------------------------------------------------------------------------
# the ledger


class ContentLedger:
    """Remembers hash -> content key for every hashed Block it is shown.

    ``observe_block``/``observe_blocks`` read a Block's ``content_hash`` and
    walk its chain to spell the key.  The first key seen for a hash names it
    from then on; a later, different key for the same hash is recorded in
    :attr:`collisions`.  A key seen under a second hash is recorded in
    :attr:`aliases`.  Memory grows with the number of distinct hashes shown.
    """

    def __init__(self) -> None:
        """Start with no names and no anomalies."""
        self._names: Dict[int, ContentKey] = {}
        self._hashes: Dict[ContentKey, int] = {}
        self.collisions: List[Collision] = []
        self.aliases: List[Alias] = []
        self.conflicts: List[SharedIdConflict] = []

    def __len__(self) -> int:
        """Return the number of hashes named."""
        return len(self._names)

    def __contains__(self, content_hash: object) -> bool:
        """Return whether the hash has a name."""
        return content_hash in self._names

    def name(self, content_hash: int) -> Optional[ContentKey]:
        """Return the key first seen for ``content_hash``, or None."""
        return self._names.get(content_hash)

    def hash_of(self, key: ContentKey) -> Optional[int]:
        """Return the hash first seen for ``key``, or None."""
        return self._hashes.get(key)

    @property
    def names(self) -> Mapping[int, ContentKey]:
        """Return hash -> the key first seen for it (to look many up: ``name``
        each time costs a call more)."""
        return self._names

    @property
    def hashes(self) -> Mapping[ContentKey, int]:
        """Return key -> the hash first seen for it (as ``names``)."""
        return self._hashes

    def observe(self, content_hash: int, key: ContentKey) -> bool:
        """Record that ``content_hash`` names ``key``; return False (and record
        a :class:`Collision`) when the hash already names a different key."""
        known = self._names.get(content_hash)
        if known is None:
            key = self._names[content_hash] = HashedKey(key)
        elif known != key:
            self.collisions.append(Collision(content_hash, known, key))
            return False
        other = self._hashes.setdefault(key, content_hash)
        if other != content_hash and not any(
            a.key == key and a.second_hash == content_hash for a in self.aliases
        ):
            self.aliases.append(Alias(key, other, content_hash))
        return True

    def observe_block(self, block: Any) -> Optional[ContentKey]:
        """Record the hash and key of ``block`` and of every hashed block
        before it in its chain; return the block's key, or None if it has no
        content hash."""
        result: Optional[ContentKey] = None
        for b, key in chain_keys(block):
            h = getattr(b, "content_hash", None)
            if h is not None:
                self.observe(h, key)
                if b is block:
                    result = key
        return result

    def observe_blocks(self, blocks: Iterable[Any]) -> None:
        """Record every hashed block of every chain that ends at one of
        ``blocks``; each Block object is walked at most once per call."""
        done: Set[int] = set()
        for block in reversed(list(blocks)):
            if block is None or id(block) in done:
                continue
            for b, key in chain_keys(block):
                if id(b) in done:
                    continue
                done.add(id(b))
                h = getattr(b, "content_hash", None)
                if h is not None:
                    self.observe(h, key)

    def anomalies(self) -> List[str]:
        """Return one line per collision and shared-id conflict seen so far
        (aliases are not anomalies of the allocator)."""
        lines = [
            f"hash {c.content_hash} names two contents: {c.first!r} and {c.second!r}"
            for c in self.collisions
        ]
        lines += [
            f"id {c.block_id} is held by Blocks with contents {c.first!r} and {c.second!r}"
            for c in self.conflicts
        ]
        return lines


def contents_of(
    live_blocks: Iterable[Any], ledger: Optional[ContentLedger] = None
) -> Dict[BlockId, Optional[ContentKey]]:
    """Return id -> content key spelled by the live Blocks that point at it
    (None for a Block without content hash), feeding ``ledger`` with every
    hashed block; two live Blocks on one id with different keys are recorded
    in ``ledger.conflicts`` (the first key wins)."""
    blocks = list(live_blocks)
    if ledger is not None:
        ledger.observe_blocks(blocks)
    out: Dict[BlockId, Optional[ContentKey]] = {}
    seen: Set[int] = set()
    key_of = _memoised_keys()
    for b in blocks:
        if id(b) in seen:
            continue
        seen.add(id(b))
        i = getattr(b, "block_id", None)
        if i is None:
            continue
        key = key_of(b) if getattr(b, "content_hash", None) is not None else None
        if i in out:
            if out[i] != key and ledger is not None:
                ledger.conflicts.append(SharedIdConflict(i, out[i], key))
        else:
            out[i] = key
    return out


# --------------------------------------------------------------------------
# reading allocators


def _refcounts(allocator: Any, ids: Sequence[BlockId]) -> Dict[BlockId, int]:
    counter = getattr(allocator, "_refcounter", None)
    counts = getattr(counter, "_refcounts", None)
    if type(counts) is dict or isinstance(counts, Mapping):
        return {i: int(counts.get(i, 0)) for i in ids}
    return {i: int(counter.get(i)) for i in ids} if counter is not None else {}


def _copy_on_writes(allocator: Any) -> Tuple[Tuple[BlockId, BlockId], ...]:
    tracker = getattr(allocator, "_cow_tracker", None)
    pairs = getattr(tracker, "_copy_on_writes", ())
    return tuple([(int(a), int(b)) for a, b in pairs]) if pairs else ()


def hits_and_misses(metric_data: Any) -> Tuple[int, int]:
    """Return (hits, misses) recovered from a ``CacheMetricData``: the
    completed buckets' running average times their queries, plus the open
    bucket's exact counts."""
    if metric_data is None:
        return (0, 0)
    completed = int(getattr(metric_data, "num_completed_blocks", 0))
    rate = float(getattr(metric_data, "completed_block_cache_hit_rate", 0.0))
    bucket = int(getattr(metric_data, "block_size", 1000))
    open_queries = int(getattr(metric_data, "num_incompleted_block_queries", 0))
    open_hits = int(getattr(metric_data, "num_incompleted_block_hit", 0))
    hits = round(rate * completed * bucket) + open_hits
    return (hits, completed * bucket + open_queries - hits)


def _reported_free(allocator: Any, reported_free: Optional[int]) -> int:
    if reported_free is not None:
        return reported_free
    return int(allocator.get_num_free_blocks())


def _block_ids(allocator: Any, block_ids: Optional[Iterable[BlockId]]) -> Tuple[BlockId, ...]:
    return tuple(sorted(allocator.all_block_ids if block_ids is None else block_ids))


def _naive_state(
    allocator: Any, reported_free: Optional[int], block_ids: Optional[Iterable[BlockId]],
    whole: bool = True,
) -> AbstractState:
    """The state of an allocator without a cache; not ``whole``: at the ids
    ``block_ids`` only (taken as given), without the free list."""
    ids = _block_ids(allocator, block_ids) if whole else tuple(block_ids or ())
    counts = _refcounts(allocator, ids)
    blocks = {
        i: BlockState(refcount=n, content=None, computed=False, last_accessed=NEVER_ACCESSED)
        for i, n in counts.items()
        if n != 0
    }
    return AbstractState(
        block_ids=ids,
        free=tuple(getattr(allocator, "_free_block_indices", ())) if whole else (),
        blocks=blocks,
        cached={},
        evictor=(),
        touched=frozenset(),
        copy_on_writes=_copy_on_writes(allocator),
        hits=0,
        misses=0,
        reported_free=_reported_free(allocator, reported_free),
        block_size=int(getattr(allocator, "_block_size", 0) or 0),
    )


def is_prefix_caching(allocator: Any) -> bool:
    """Return whether the allocator has prefix-caching internals
    (``_cached_blocks``); otherwise it is read as a naive allocator."""
    return getattr(allocator, "_cached_blocks", None) is not None


def _with_live_contents(
    contents: Optional[Mapping[BlockId, Optional[ContentKey]]],
    live_blocks: Optional[Iterable[Any]],
    ledger: ContentLedger,
) -> Optional[Mapping[BlockId, Optional[ContentKey]]]:
    """``contents`` over what ``live_blocks`` spell (feeding ``ledger``);
    ``contents`` itself when no live Blocks are given."""
    if live_blocks is None:
        return contents
    spelled: Dict[BlockId, Optional[ContentKey]] = dict(contents_of(live_blocks, ledger))
    if contents is not None:
        spelled.update(contents)
    return spelled


def abstract_state(
    allocator: Any,
    contents: Optional[Mapping[BlockId, Optional[ContentKey]]] = None,
    *,
    ledger: Optional[ContentLedger] = None,
    live_blocks: Optional[Iterable[Any]] = None,
    reported_free: Optional[int] = None,
    block_ids: Optional[Iterable[BlockId]] = None,
    part: Optional[Part] = None,
    reuse: Optional[Reuse] = None,
    computed: Optional[Callable[[BlockId], Any]] = None,
) -> AbstractState:
    """Return the abstract state of one allocator (one device), reading its
    vLLM-shaped attributes; the allocator is not changed.  With ``part``
    (ids, keys): the :class:`~prefixcache.spec.state.PartialState` over
    those ids and keys, read at those elements only (``block_ids`` is then
    taken as given, unsorted): its cost is the elements', not the pool's.

    Content of an id, first rule that applies:

    1. ``contents[i]`` when given (what the caller's live Blocks spell; None
       means "a live Block without content hash points here");
    2. otherwise the key ``ledger`` (or ``contents``) names for the hash that
       ``_cached_blocks`` maps to ``i``;
    3. otherwise None (a mutable block).

    ``live_blocks`` is a shorthand: ``contents`` is computed from them with
    :func:`contents_of` (feeding ``ledger``).  Evictor entries are named by
    their own hash.  ``reported_free`` and ``block_ids`` override the calls
    to ``get_num_free_blocks()`` and ``all_block_ids``, and ``computed``
    the allocator's ``block_is_computed`` (the checked allocators pass the
    undecorated answers and method).  ``reuse`` (block states and
    evictor entries by id, say a former reading's): where the reading equals
    one of them it is that very object (so that comparing the two is quick).
    Raises :class:`AbstractionError` for a cached hash nothing names.
    """
    if ledger is None:
        ledger = ContentLedger()
    if part is not None:
        if block_ids is None:
            raise ValueError("a partial state needs the allocator's block_ids")
        ids = block_ids if isinstance(block_ids, (range, tuple, Sequence)) else tuple(block_ids)
        if is_prefix_caching(allocator):
            return _state(allocator, ledger, None, None, reported_free, ids, part, reuse, computed)
        whole = _naive_state(allocator, reported_free, sorted(part[0]), whole=False)
        free = getattr(allocator, "_free_block_indices", ())
        return _restricted(dict(whole.__dict__), free, part, 0, 0, ids)
    if not is_prefix_caching(allocator):
        return _naive_state(allocator, reported_free, block_ids)
    return _state(allocator, ledger, contents, live_blocks, reported_free, block_ids,
                  reuse=reuse, ask=computed)


def _state(allocator: Any, ledger: ContentLedger,
           contents: Optional[Mapping[BlockId, Optional[ContentKey]]],
           live_blocks: Optional[Iterable[Any]], reported_free: Optional[int],
           block_ids: Optional[Iterable[BlockId]], part: Optional[Part] = None,
           reuse: Optional[Reuse] = None,
           ask: Optional[Callable[[BlockId], Any]] = None) -> AbstractState:
    """The state of a prefix-caching allocator (see :func:`abstract_state`)."""
    contents = _with_live_contents(contents, live_blocks, ledger)
    given: Mapping[BlockId, Optional[ContentKey]] = contents if contents is not None else {}

    ids: Sequence[BlockId]
    all_cached: Mapping[int, BlockId] = allocator._cached_blocks
    all_free_table: Mapping[BlockId, Any] = getattr(allocator.evictor, "free_table", {})
    all_promoted = getattr(allocator, "_touched_blocks", ())
    if part is None:
        ids = _block_ids(allocator, block_ids)
        cached_hashes, free_table, promoted = all_cached, all_free_table, frozenset(all_promoted)
    else:
        ids = sorted(part[0])
        hash_of = ledger.hashes.get
        cached_hashes = {}
        for k in part[1]:
            h = hash_of(k)
            if h is not None and h in all_cached:
                cached_hashes[h] = all_cached[h]
        free_table = {i: all_free_table[i] for i in ids if i in all_free_table}
        promoted = frozenset(filter(all_promoted.__contains__, ids))
    counts = _refcounts(allocator, ids)
    names = ledger.names.get

    def name(h: int, i: Optional[BlockId]) -> ContentKey:
        key = names(h)
        if key is None and i is not None:
            key = given.get(i)
            if key is not None:
                ledger.observe(h, key)
        if key is None:
            raise AbstractionError(f"no Block shown spells content hash {h} (id {i})")
        return key

    cached: Dict[ContentKey, BlockId] = {}
    key_of_id: Dict[BlockId, ContentKey] = {}   # the key of an id's first cached hash
    for h, i in cached_hashes.items():
        key = names(h) or name(h, i)
        cached.setdefault(key, i)
        key_of_id.setdefault(i, key)

    former_blocks, former_entries = reuse if reuse is not None else ({}, {})
    entries: List[EvictorEntry] = []
    for i, meta in free_table.items():
        last = meta.last_accessed
        if type(last) is not float:
            last = _time(last, "the evictor's entry of id", i)
        tokens = int(meta.num_hashed_tokens)
        key = names(meta.content_hash) or name(meta.content_hash, i)
        e = former_entries.get(i)
        if e is None or e.last_accessed != last or e.num_hashed_tokens != tokens \
                or e.content is not key:
            e = EvictorEntry(last_accessed=last, num_hashed_tokens=tokens, block_id=i,
                             content=key)
        entries.append(e)
    if len(entries) > 1:
        entries.sort(key=lambda e: (e.eviction_rank(), free_table[e.block_id].content_hash))

    trackers: Mapping[BlockId, Any] = getattr(allocator, "_block_tracker", {})
    if ask is None:
        ask = getattr(allocator, "block_is_computed", None)

    def computed(i: BlockId, tracker: Any) -> bool:
        """What ``block_is_computed(i)`` answers (read off ``tracker``, the
        id's active tracker or None, and the evictor where the allocator has
        no such method)."""
        if ask is not None:
            answer = ask(i)
            if type(answer) is not bool:
                raise AnswerTypeError(f"block_is_computed({i}) answered {answer!r}, not a bool")
            return answer
        return bool(tracker.computed) if tracker is not None else (
            i in free_table and i not in promoted)

    blocks: Dict[BlockId, BlockState] = {}
    for i in ids:
        rc = counts.get(i, 0)
        content = key_of_id.get(i, _NO_HASH)
        if rc == 0 and content is _NO_HASH and i not in free_table:
            continue
        if given and i in given:
            content = given[i]
        elif content is _NO_HASH:
            content = None
        tracker = trackers.get(i)
        if tracker is not None and getattr(tracker, "active", False):
            last = tracker.last_accessed
            if type(last) is not float:
                last = _time(last, "the tracker of id", i)
        else:
            tracker = None
            meta = free_table.get(i)
            last = NEVER_ACCESSED if meta is None else meta.last_accessed
            if type(last) is not float:
                last = _time(last, "the evictor's entry of id", i)
        if ask is not None:     # computed(i, tracker), inline (it runs once per id)
            done = ask(i)
            if type(done) is not bool:
                raise AnswerTypeError(f"block_is_computed({i}) answered {done!r}, not a bool")
        else:
            done = computed(i, tracker)
        b = former_blocks.get(i)
        if b is None or b.refcount != rc or b.content is not content or b.computed != done \
                or b.last_accessed != last:
            b = BlockState(refcount=rc, content=content, computed=done, last_accessed=last)
        blocks[i] = b
    # touched: promoted and not computed yet (an allocator may keep an id in
    # its set after it reports it computed; vLLM 0.8.5 does for evictable ids)
    touched = frozenset(i for i in promoted if not (
        blocks[i].computed if i in blocks else computed(i, _active(trackers.get(i)))))

    hits, misses = hits_and_misses(getattr(allocator, "metric_data", None))
    free = getattr(getattr(allocator, "_hashless_allocator", None), "_free_block_indices", ())
    fields: Dict[str, Any] = dict(
        block_ids=ids,
        free=tuple(free) if part is None else (),
        blocks=blocks,
        cached=cached,
        evictor=tuple(entries),
        touched=touched,
        copy_on_writes=_copy_on_writes(allocator),
        hits=hits,
        misses=misses,
        reported_free=_reported_free(allocator, reported_free),
        block_size=int(getattr(allocator, "_block_size", 0) or 0),
    )
    if part is None:
        return AbstractState(**fields)
    return _restricted(fields, free, part, len(all_free_table), len(all_cached), block_ids)


_NO_HASH: Any = object()
"""No cached hash (``key_of_id.get``'s default)."""


def _active(tracker: Any) -> Any:
    """``tracker`` if it is an active tracker, else None."""
    return tracker if tracker is not None and getattr(tracker, "active", False) else None


def free_in_order(free: Sequence[BlockId], wanted: AbstractSet[BlockId]) -> Tuple[BlockId, ...]:
    """The ids of ``wanted`` that ``free`` lists, in its order: read from its
    first ``len(wanted) + 1`` ids when they are all there (the usual case:
    ids are taken from and returned to the front), else from the whole list."""
    if not wanted:
        return ()
    head = tuple(islice(free, len(wanted) + 1))
    found = tuple(i for i in head if i in wanted)
    if len(found) == len(wanted) or len(head) == len(free):
        return found
    return tuple(i for i in free if i in wanted)


def _restricted(fields: Dict[str, Any], free: Sequence[BlockId], part: Part,
                num_evictable: int, num_cached: int,
                block_ids: Optional[Iterable[BlockId]]) -> PartialState:
    """The state of ``fields`` (read at the ids and keys of ``part``) as a
    PartialState: its free ids among them from the free list ``free``, and
    the counts of the free list, evictor (``num_evictable``) and cache
    (``num_cached``) beyond them."""
    ids, keys = part
    listed = free_in_order(free, frozenset(ids).difference(fields["blocks"]))
    state = object.__new__(PartialState)  # its fields set at once (a frozen dataclass)
    state.__dict__.update(
        fields, free=listed, block_ids=block_ids, ids=frozenset(ids),
        keys=frozenset(keys), outside_free=len(free) - len(listed),
        outside_evictable=num_evictable - len(fields["evictor"]),
        outside_cached=num_cached - len(fields["cached"]))
    return state


def abstract_device_states(allocator: Any, *, ledger: Optional[ContentLedger] = None,
                           live_blocks: Optional[Iterable[Any]] = None) -> Dict[str, AbstractState]:
    """Return device name (``"GPU"``, ``"CPU"``) -> abstract state of each
    per-device allocator (its ``_allocators``) of a ``CpuGpuBlockAllocator``;
    ``live_blocks`` may hold Blocks of every device (ids are disjoint across
    devices)."""
    if ledger is None:
        ledger = ContentLedger()
    contents = _with_live_contents(None, live_blocks, ledger)
    return {str(getattr(device, "name", device)): abstract_state(a, contents, ledger=ledger)
            for device, a in allocator._allocators.items()}


__all__ = [
    "AbstractionError",
    "Alias",
    "AnswerTypeError",
    "Collision",
    "ContentLedger",
    "SharedIdConflict",
    "abstract_device_states",
    "abstract_state",
    "chain_keys",
    "content_key_of",
    "contents_of",
    "hits_and_misses",
    "is_prefix_caching",
    "ownership",
    "ownership_matches_live",
]
