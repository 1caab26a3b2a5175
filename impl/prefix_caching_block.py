"""The prefix-caching allocator (vLLM's ``prefix_caching_block``).

A full block whose earlier blocks are all full is keyed by its content hash
(chained through its parent's hash).  Identical prefixes share physical ids;
an id whose last reference is dropped stays cached in the evictor until it
is reused for a hit or evicted for new content.

A physical id is in exactly one of these states:

* free: in ``_hashless_allocator._free_block_indices``, refcount 0;
* mutable: refcount > 0, not in ``_cached_blocks``;
* immutable: refcount > 0, ``_cached_blocks[hash] == id``;
* evictable: refcount 0, cached, in ``evictor``.

``get_num_free_blocks()`` counts free plus evictable ids, and that many
allocations succeed.  Every public method checks the caller's arguments and
the capacity it needs before it changes anything.
"""

from __future__ import annotations

import logging
from itertools import repeat
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Sequence, Set, Tuple

from .common import (
    BlockFields,
    BlockPool,
    CacheMetricData,
    CopyOnWriteTracker,
    check_blocks,
    check_distinct_blocks,
    check_extra_hash,
    check_list_of_lists,
    check_sizes,
    check_timestamp,
    check_token_ids,
    check_token_types,
    get_all_blocks_recursively,
)
from .errors import (
    BlockNotOnDeviceError,
    DetachedBlockError,
    ForeignBlockError,
    ImmutableBlockError,
    InvalidArgumentError,
    NoFreeBlocksError,
    RefCountError,
    UnhashableBlockError,
    UnknownBlockIdError,
    WrongTypeError,
)
from .evictor import EvictionPolicy, make_evictor
from .hashing import NONE_HASH, HashAlgo, HashFunction, builtin_hash, resolve_hash_algo
from .interfaces import Block, BlockAllocator, BlockId, Device
from .naive_block import NaiveBlockAllocator, check_detached, check_no_device
from .prefix_memo import PrefixMemo

logger = logging.getLogger(__name__)

_DEFAULT_LAST_ACCESSED_TIME = -1
_NO_TOKENS: List[int] = []  # read only: copied into each new mutable Block

#: The exact content of a block (``verify_content``): ``(parent, tokens,
#: extra_hash)`` where ``parent`` is the previous block's record (None for a
#: first block), so a record spells the whole prefix.
Content = Tuple[Any, Tuple[int, ...], Optional[int]]

# What a verifying allocation does with one block (see _verified_outcomes).
_HIT, _NEW, _PLAIN = 0, 1, 2


def same_content(first: Optional[Content], second: Optional[Content]) -> bool:
    """Whether two content records spell the same prefix.  Compared block by
    block from the end, stopping at the first record both share: O(1) when
    the parents are one object, as they are for blocks of a cached chain."""
    while first is not second:
        if (first is None or second is None or first[1] != second[1]
                or first[2] != second[2]):
            return False
        first, second = first[0], second[0]
    return True


def common_prefix(lists: Sequence[Sequence[BlockId]]) -> List[BlockId]:
    """A new list: the longest common prefix of the non-empty ``lists``
    (``[]`` when there are none), its ids taken from the first of them.
    Each list is compared with the first in C (slices and ``==``); where
    they differ, the first difference is found 16 ids at a time, then one
    at a time."""
    first: Optional[List[BlockId]] = None
    for ids in lists:
        if not ids:
            continue
        if type(ids) is not list:
            ids = list(ids)
        if first is None:
            first = ids
            length = len(ids)
            continue
        if len(ids) == length == len(first):
            if ids == first:
                continue
        else:
            length = min(length, len(ids))
            if ids[:length] == first[:length]:
                continue
        # first[:length] != ids[:length]: the first difference lies below length
        index = 0
        while first[index:index + 16] == ids[index:index + 16]:
            index += 16
        while first[index] == ids[index]:
            index += 1
        length = index
    return [] if first is None else first[:length]


class BlockTracker:
    """Per-id bookkeeping while the id is in use: its access time and
    whether its KV is computed.  Inactive trackers hold the defaults.

    ``held``: while the allocator holds the id in use, the very int object
    it handed out as that id (None otherwise, and always None for a tracker
    enabled by :meth:`enable`), so that ``held is x`` proves in one test
    that ``x`` is an int, managed here and in use.

    ``last_accessed`` and ``held`` live in flat tables indexed by id, the
    allocator's (see :func:`id_tables`), so that ``mark_blocks_as_accessed``
    tests and writes them without touching the tracker objects; a tracker
    made without tables has one-slot tables of its own."""

    __slots__ = ("active", "computed", "_times", "_held", "_id")

    def __init__(self, times: Any = None, held: Any = None, block_id: BlockId = 0) -> None:
        """A tracker of the slot ``block_id`` of the tables ``times`` and
        ``held`` (which the caller has set to -1 and None), or of one-slot
        tables of its own when ``times`` is not given."""
        self.active: bool = False
        self.computed: bool = False
        if times is None:
            times, held = [_DEFAULT_LAST_ACCESSED_TIME], [None]
        self._times = times
        self._held = held
        self._id = block_id

    @property
    def last_accessed(self) -> float:
        """The id's access time (-1 until marked)."""
        return self._times[self._id]  # type: ignore[no-any-return]

    @last_accessed.setter
    def last_accessed(self, value: float) -> None:
        self._times[self._id] = value

    @property
    def held(self) -> Optional[int]:
        """The id object while the allocator holds it in use, else None."""
        return self._held[self._id]  # type: ignore[no-any-return]

    @held.setter
    def held(self, value: Optional[int]) -> None:
        self._held[self._id] = value

    def enable(self) -> None:
        """Start tracking (the tracker must be inactive); reset the fields."""
        if self.active:
            raise InvalidArgumentError("the tracker is already active")
        self.active = True
        self.reset()

    def disable(self) -> None:
        """Stop tracking (the tracker must be active); reset the fields."""
        if not self.active:
            raise InvalidArgumentError("the tracker is not active")
        self.active = False
        self.held = None
        self.reset()

    def reset(self) -> None:
        """``last_accessed = -1`` and ``computed = False``."""
        self.last_accessed = _DEFAULT_LAST_ACCESSED_TIME
        self.computed = False


#: How far past the pool's size ids may reach for the flat tables to be lists
#: (beyond it, dicts serve): the CPU pool of a pair has ids from the GPU
#: pool's size on.
_FLAT_SLACK = 1024


def id_tables(ids: List[BlockId]) -> Tuple[Any, Any]:
    """The flat tables of access times (each -1) and held ids (each None),
    indexed by id: lists (with unused slots where no id is managed) when no
    id is negative and the largest is below ``2 * len(ids) + 1024``
    (:data:`_FLAT_SLACK`), as a list index costs less than a dict lookup;
    else dicts keyed by the ids.  Either way
    ``held[x] is x`` only for a managed id ``x`` held in use: any other
    ``x`` raises, or finds None, or another id's object (a negative index
    counts from a list's end)."""
    if ids and min(ids) >= 0 and max(ids) < 2 * len(ids) + _FLAT_SLACK:
        size = max(ids) + 1
        return [_DEFAULT_LAST_ACCESSED_TIME] * size, [None] * size
    return dict.fromkeys(ids, _DEFAULT_LAST_ACCESSED_TIME), dict.fromkeys(ids)


class PrefixCachingBlockAllocator(BlockAllocator):
    """A block allocator that shares full blocks with identical prefixes.

    ``hash_algo`` (keyword-only) chooses the content hash: ``"builtin"``
    (vLLM's), ``"sha256"`` or a callable; see :mod:`prefixcache.impl.hashing`.

    ``verify_content`` (keyword-only, default False): keep each cached id's
    exact content (tokens, extra hash and, through its parent's record, the
    whole prefix) and compare it on every cache hit, so that a hash collision
    costs a miss instead of handing out another content's KV.  The colliding
    block gets an id of its own and no content hash (like a block after a
    non-full one), so one hash keeps naming one id; blocks chained after it
    in the same call get none either.  Off, the behaviour is vLLM's.

    Costs: allocation, free, promotion and copy-on-write O(log n) in the pool
    size (the evictor's heap) and O(1) otherwise; operations over a list or
    chain O(k) in its length; ``get_physical_block_id`` O(1)."""

    _none_hash: int = NONE_HASH

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        block_ids: Optional[Iterable[int]] = None,
        eviction_policy: EvictionPolicy = EvictionPolicy.LRU,
        *,
        hash_algo: HashAlgo = "builtin",
        verify_content: bool = False,
    ) -> None:
        check_sizes(num_blocks, block_size)
        self._hash_fn: HashFunction = resolve_hash_algo(hash_algo)
        if type(verify_content) is not bool:
            raise InvalidArgumentError(f"verify_content must be a bool, got {verify_content!r}")
        self._verify_content = verify_content
        # verify_content: the content record of every cached id
        self._contents: Dict[BlockId, Content] = {}
        self.evictor = make_evictor(eviction_policy)
        self.eviction_policy = eviction_policy
        self._block_size = block_size
        self._int_types = [int] * block_size  # the token types of a full block
        self._block_pool = BlockPool(block_size, self._create_block, self, 4 * num_blocks)
        self._hashless_allocator = NaiveBlockAllocator(
            create_block=self._create_block,
            num_blocks=num_blocks,
            block_size=block_size,
            block_ids=block_ids,
            block_pool=self._block_pool,
        )
        self._free_ids = self._hashless_allocator._free_block_indices
        self._refcounter = self._hashless_allocator.refcounter
        self._refcounts = self._refcounter._refcounts
        # one tracker per id, from the start (vLLM's tests count them)
        # the access times and held ids, flat (the trackers read them there)
        self._times, self._held = id_tables(list(self._refcounts))
        self._block_tracker: Dict[BlockId, BlockTracker] = {
            block_id: BlockTracker(self._times, self._held, block_id)
            for block_id in self._refcounts}
        self._cached_blocks: Dict[int, BlockId] = {}
        self._touched_blocks: Set[BlockId] = set()
        self._cow_tracker = CopyOnWriteTracker(self._refcounter.as_readonly())
        self.metric_data = CacheMetricData()
        # The pool's slot table and free slots (both objects live as long as the pool).
        self._pool_blocks = self._block_pool._pool
        # The cached-and-computed prefixes of the hash lists asked about (told of every eviction).
        self._prefix_memo = PrefixMemo()
        self._memo_entries = self._prefix_memo._entries  # lives as long as the memo
        self._pool_free_slots = self._block_pool._free_ids

    def _create_block(
        self,
        prev_block: Optional[Block],
        token_ids: List[int],
        block_size: int,
        allocator: BlockAllocator,
        block_id: Optional[int] = None,
        extra_hash: Optional[int] = None,
    ) -> Block:
        """The pool's factory: a PrefixCachingBlock of ``allocator`` (the pool's,
        this one), not computed (the pools never ask for a computed one)."""
        return PrefixCachingBlock(
            prev_block=prev_block, token_ids=token_ids, block_size=block_size,
            allocator=allocator, block_id=block_id, extra_hash=extra_hash,
        )

    @property
    def content_hash_function(self) -> HashFunction:
        """The ``(parent_hash, token_ids, extra_hash) -> int`` function in use."""
        return self._hash_fn

    @property
    def verify_content(self) -> bool:
        """Whether cache hits are checked against the cached content (the
        constructor's ``verify_content``)."""
        return self._verify_content

    # -- checks of the caller's arguments (they raise before any change) -------

    def _check_owned(self, block: Block) -> BlockId:
        """The id of ``block`` after checking that it is one of this
        allocator's Blocks, attached, and that its id holds a reference.
        (``free`` and ``cow_block_if_not_appendable`` inline the passing case.)"""
        if not isinstance(block, PrefixCachingBlock):
            raise WrongTypeError(f"expected a PrefixCachingBlock, got {type(block).__name__}")
        block_id = block.block_id
        if block_id is None:
            raise DetachedBlockError("the block holds no id (freed or never allocated)")
        if block._allocator is not self:
            raise ForeignBlockError(f"block {block_id} belongs to another allocator")
        count = self._refcounts.get(block_id)
        if count is None:
            raise UnknownBlockIdError(f"block id {block_id} is not managed by this allocator")
        if count <= 0:
            raise RefCountError(f"block {block_id} holds no reference (already freed)")
        return block_id

    def _check_releasable(self, blocks: Iterable[Block]) -> None:
        """Check that every block may drop its reference, counting repeats."""
        wanted: Dict[BlockId, int] = {}
        for block in blocks:
            block_id = self._check_owned(block)
            wanted[block_id] = wanted.get(block_id, 0) + 1
            if wanted[block_id] > self._refcounts[block_id]:
                raise RefCountError(f"block {block_id} is released more often than referenced")

    def _check_new_block_args(
        self, prev_block: Optional[Block], extra_hash: Optional[int], device: Optional[Device]
    ) -> None:
        check_no_device(device)
        if not isinstance(prev_block, _BLOCK_OR_NONE):
            raise WrongTypeError(f"prev_block must be a PrefixCachingBlock or None, "
                                 f"got {type(prev_block).__name__}")
        check_extra_hash(extra_hash)

    def _check_capacity(self, needed: int) -> None:
        available = len(self._free_ids) + len(self.evictor.free_table)
        if needed > available:
            raise NoFreeBlocksError(f"{needed} blocks needed, {available} free or evictable")

    def _full_block_hashes(
        self,
        prev_block: Optional[Block],
        block_token_ids: List[List[int]],
        extra_hash: Optional[int],
    ) -> List[int]:
        """The content hash of each full block of a new chain after
        ``prev_block``; UnhashableBlockError when one cannot have a hash."""
        parent: Optional[int] = None
        if prev_block is not None:
            parent = prev_block.content_hash
            if parent is None or parent == NONE_HASH:
                raise UnhashableBlockError("the previous block has no content hash")
        hashes: List[int] = []
        size = self._block_size
        int_types = self._int_types
        hash_fn = self._hash_fn
        for token_ids in block_token_ids:
            if not isinstance(token_ids, (list, tuple)) or [*map(type, token_ids)] != int_types:
                check_token_ids(token_ids, size)
                raise UnhashableBlockError(
                    f"an immutable block needs {size} tokens, got {len(token_ids)}")
            parent = hash_fn(parent, token_ids, extra_hash)
            hashes.append(parent)
        return hashes

    def _check_demand(self, hashes: Sequence[Optional[int]]) -> None:
        """NoFreeBlocksError unless the free and evictable ids suffice for a
        run of allocations (see ``_demand``).  A run takes at most one id per
        hash, so the exact count is needed only when there are fewer ids."""
        if len(hashes) > len(self._free_ids) + len(self.evictor.free_table):
            self._check_capacity(self._demand(hashes))

    def _demand(self, hashes: Sequence[Optional[int]]) -> int:
        """How many free-or-evictable ids a run of allocations takes, one per
        hash in order (None: a mutable block).  Each takes one, except a hash
        whose cached id is in use now or that an earlier one in the run
        cached; the count is exact, so checking it makes the run atomic."""
        distinct: Set[Any] = set(hashes)
        distinct.discard(None)
        cached_ids: Iterable[Any] = map(self._cached_blocks.get, distinct)
        # a distinct hash takes an id unless its cached id holds a reference
        refcounts = [*map(self._refcounts.get, cached_ids, repeat(0))]
        return hashes.count(None) + refcounts.count(0)

    # -- verify_content: content records ------------------------------------------

    def _interned(self, record: Content, content_hash: Optional[int]) -> Content:
        """``record``, or the equal record of the id cached under
        ``content_hash`` (so that records of one content are one object and
        compare in O(1))."""
        cached_id = self._cached_blocks.get(content_hash)  # type: ignore[arg-type]
        if cached_id is not None:
            known = self._contents[cached_id]
            if same_content(known, record):
                return known
        return record

    def _content_of(self, block: Optional[Block],
                    memo: Optional[Dict[int, Content]] = None) -> Optional[Content]:
        """The content record of the hashed ``block`` (None for no block): the
        record of the cached id it sits on, else spelled from its chain.
        ``memo`` (Block identity -> record) is read and extended."""
        pending: List[Block] = []
        record: Optional[Content] = None
        while block is not None:
            if memo is not None and id(block) in memo:
                record = memo[id(block)]
                break
            block_id = block.block_id
            if (getattr(block, "_allocator", None) is self and block_id is not None
                    and self._cached_blocks.get(block.content_hash) == block_id):
                record = self._contents[block_id]
                break
            pending.append(block)
            block = block.prev_block
        for earlier in reversed(pending):
            record = self._interned((record, tuple(earlier.token_ids), earlier.extra_hash),
                                    earlier.content_hash)
            if memo is not None:
                memo[id(earlier)] = record
        return record

    def _verified_demand(self, hashes: Sequence[Optional[int]],
                         records: Sequence[Optional[Content]], parents: Iterable[int]) -> int:
        """``_demand`` when verifying content: how many free-or-evictable ids a
        run takes, one per block in order (hash None: a mutable block), the
        parent of each being the run's block at the index given (-1: none in
        the run).  A block takes none when it hits an id in use or one that
        an earlier block of the run holds; a block whose hash names other
        content, or whose parent got none, takes one and gets no content."""
        cached = self._cached_blocks
        contents = self._contents
        refcounts = self._refcounts
        pending: Dict[int, Optional[Content]] = {}
        plain: List[bool] = []
        needed = 0
        for content_hash, record, parent in zip(hashes, records, parents):
            outcome = _PLAIN
            if content_hash is not None and (parent < 0 or not plain[parent]):
                if content_hash in pending:
                    if same_content(pending[content_hash], record):
                        outcome = _HIT
                else:
                    cached_id = cached.get(content_hash)
                    if cached_id is None:
                        outcome = _NEW
                        pending[content_hash] = record
                    elif same_content(contents[cached_id], record):
                        outcome = _HIT
                        pending[content_hash] = record
                        needed += refcounts[cached_id] == 0
            plain.append(outcome == _PLAIN)
            needed += outcome != _HIT
        return needed

    def _verified_id(self, content_hash: int, record: Content,
                     after_plain: bool) -> Tuple[BlockId, int]:
        """The id of one hashed block of a verifying allocation, and what it
        was: ``_HIT`` the cached id of this very content (one more
        reference); ``_NEW`` a fresh id cached under the hash and touched;
        ``_PLAIN`` a fresh id without content, when the hash names other
        content, or the block follows a ``_PLAIN`` one.  The outcome is
        settled before the id is taken: taking it may evict the other
        content, and a block that then took its hash could turn a later
        block's counted hit into a collision (``_verified_demand`` counts
        on the outcomes it foresaw).  One query."""
        cached_id = None if after_plain else self._cached_blocks.get(content_hash)
        if cached_id is not None and same_content(self._contents[cached_id], record):
            self.metric_data.query(True)
            self._acquire_cached(cached_id)
            return cached_id, _HIT
        self.metric_data.query(False)
        block_id = self._take_id()
        if after_plain or cached_id is not None:
            return block_id, _PLAIN
        self._cached_blocks[content_hash] = block_id
        self._touched_blocks.add(block_id)
        self._contents[block_id] = record
        return block_id, _NEW

    def _allocate_verified(
        self, prev_block: Optional[Block], block_token_ids: List[List[int]],
        extra_hash: Optional[int], hashes: List[int],
    ) -> List[Block]:
        """``allocate_immutable_blocks`` when verifying content (arguments
        checked, ``hashes`` computed): all or nothing."""
        record = self._content_of(prev_block)
        records: List[Content] = []
        for token_ids, content_hash in zip(block_token_ids, hashes):
            record = self._interned((record, tuple(token_ids), extra_hash), content_hash)
            records.append(record)
        self._check_capacity(self._verified_demand(hashes, records, range(-1, len(hashes) - 1)))
        blocks: List[Block] = []
        plain = False
        for token_ids, content_hash, record in zip(block_token_ids, hashes, records):
            block_id, outcome = self._verified_id(content_hash, record, plain)
            block = self._pooled_block(prev_block, token_ids, block_id, extra_hash)
            if outcome == _PLAIN:
                block._unhashable = plain = True
            else:
                block._cached_content_hash = content_hash
                block._computed = outcome == _HIT
            blocks.append(block)
            prev_block = block
        return blocks

    def _swap_in_plan(
        self, blocks: List[Block]
    ) -> Tuple[List[Optional[int]], List[Optional[Content]], List[int]]:
        """Each block's hash, content record and parent index in ``blocks``
        (-1 when its previous block is not listed before it)."""
        memo: Dict[int, Content] = {}
        index: Dict[int, int] = {}
        hashes: List[Optional[int]] = []
        records: List[Optional[Content]] = []
        parents: List[int] = []
        for position, block in enumerate(blocks):
            content_hash = block.content_hash
            hashes.append(content_hash)
            records.append(None if content_hash is None else self._content_of(block, memo))
            parents.append(index.get(id(block.prev_block), -1))
            index[id(block)] = position
        return hashes, records, parents

    # -- the id mechanics (no checks: callers checked) ----------------------------

    def _take_id(self) -> BlockId:
        """A fresh id with one reference, not computed: the leftmost free id,
        else the evictor's first victim (which leaves the cache)."""
        if self._free_ids:
            block_id = self._free_ids.popleft()
        elif self.evictor.free_table:
            block_id, content_hash = self.evictor.evict()
            del self._cached_blocks[content_hash]
            if self._verify_content:
                del self._contents[block_id]
            self._touched_blocks.discard(block_id)
            self._prefix_memo.evicted(content_hash)
        else:
            raise NoFreeBlocksError("no free or evictable block")
        self._refcounts[block_id] = 1
        tracker = self._block_tracker[block_id]
        tracker.active = True
        tracker.computed = False
        self._held[block_id] = block_id
        self._times[block_id] = _DEFAULT_LAST_ACCESSED_TIME
        return block_id

    def _acquire_cached(self, block_id: BlockId) -> None:
        """One more reference to the cached ``block_id``; if it was evictable
        it leaves the evictor and is tracked again (computed unless it was
        promoted and not yet marked computed)."""
        count = self._refcounts[block_id]
        self._refcounts[block_id] = count + 1
        if count == 0:
            self.evictor.remove(block_id)
            tracker = self._block_tracker[block_id]
            tracker.active = True
            tracker.computed = block_id not in self._touched_blocks
            self._held[block_id] = block_id
            self._times[block_id] = _DEFAULT_LAST_ACCESSED_TIME

    def _release_hashless(self, block_id: BlockId) -> None:
        """One reference less to a mutable id; at 0 it is free (on the left)."""
        count = self._refcounts[block_id]
        self._refcounts[block_id] = count - 1
        if count == 1:
            self._untrack(block_id)
            self._free_ids.appendleft(block_id)

    def _untrack(self, block_id: BlockId) -> None:
        tracker = self._block_tracker[block_id]
        tracker.active = False
        tracker.computed = False
        self._held[block_id] = None
        self._times[block_id] = _DEFAULT_LAST_ACCESSED_TIME

    def _release_block(self, block: PrefixCachingBlock, block_id: BlockId) -> None:
        """Drop ``block``'s reference to ``block_id``.  At 0 an immutable id
        (cached under the block's hash) becomes evictable with its tracked
        access time, a mutable one free (on the left).  A Block on a cached id
        always knows its hash: caching an id computes the hash on the Block
        that takes it, and ``fork`` copies it to the Blocks that share it."""
        content_hash = block._cached_content_hash
        refcounts = self._refcounts
        count = refcounts[block_id] - 1
        refcounts[block_id] = count
        if count:
            return
        times = self._times
        if self._cached_blocks.get(content_hash) == block_id:  # type: ignore[arg-type]
            self.evictor.add(block_id, content_hash, block._num_tokens_total,  # type: ignore[arg-type]
                             times[block_id])
        else:
            self._free_ids.appendleft(block_id)
        tracker = self._block_tracker[block_id]
        tracker.active = False
        tracker.computed = False
        self._held[block_id] = None
        times[block_id] = _DEFAULT_LAST_ACCESSED_TIME

    def _pooled_block(
        self, prev_block: Optional[Block], token_ids: List[int], block_id: BlockId,
        extra_hash: Optional[int],
    ) -> PrefixCachingBlock:
        """A Block on ``block_id`` holding a copy of ``token_ids``, not computed
        and without a known hash.  The caller checked the arguments, so a free
        pooled object is re-initialised in place without validation (the
        pool's ``init_block`` runs only when the pool must grow)."""
        slots = self._pool_free_slots
        if not slots:
            return self._block_pool.init_block(  # type: ignore[return-value]
                prev_block=prev_block, token_ids=token_ids, block_size=self._block_size,
                physical_block_id=block_id, extra_hash=extra_hash,
            )
        block: PrefixCachingBlock = self._pool_blocks[slots.popleft()]  # type: ignore[assignment]
        block._prev_block = prev_block  # checked by the caller
        block._token_ids = list(token_ids)
        block.block_id = block_id
        block._extra_hash = extra_hash
        block._computed = False
        block._last_accessed = _DEFAULT_LAST_ACCESSED_TIME
        block._cached_content_hash = None
        block._unhashable = False
        if prev_block is None:
            block._num_tokens_total = len(token_ids)
        else:  # a PrefixCachingBlock: every caller checked it
            block._num_tokens_total = len(token_ids) + prev_block._num_tokens_total  # type: ignore[attr-defined]
        return block

    def _allocate_full(
        self, prev_block: Optional[Block], token_ids: List[int], extra_hash: Optional[int],
        content_hash: int,
    ) -> PrefixCachingBlock:
        """A Block for one full block of tokens: the cached id on a hit, else
        a fresh id promoted under ``content_hash``.  Records one query."""
        cached_id = self._cached_blocks.get(content_hash)
        if cached_id is not None:
            self.metric_data.query(True)
            self._acquire_cached(cached_id)
            block_id = cached_id
        else:
            self.metric_data.query(False)
            block_id = self._take_id()
            self._cached_blocks[content_hash] = block_id
            self._touched_blocks.add(block_id)
        block = self._pooled_block(prev_block, token_ids, block_id, extra_hash)
        block._cached_content_hash = content_hash
        if cached_id is not None:
            block._computed = True
        return block

    # -- allocation --------------------------------------------------------------

    def allocate_mutable_block(
        self,
        prev_block: Optional[Block],
        extra_hash: Optional[int] = None,
        device: Optional[Device] = None,
    ) -> Block:
        """An empty Block on a fresh id (the leftmost free id, else the first
        evictor victim, which leaves the cache).  Raises NoFreeBlocksError
        when neither exists."""
        if (device is not None or extra_hash is not None
                or not isinstance(prev_block, _BLOCK_OR_NONE)):
            self._check_new_block_args(prev_block, extra_hash, device)
        return self._pooled_block(prev_block, _NO_TOKENS, self._take_id(), extra_hash)

    def allocate_immutable_block(
        self,
        prev_block: Optional[Block],
        token_ids: List[int],
        extra_hash: Optional[int] = None,
        device: Optional[Device] = None,
    ) -> Block:
        """A Block holding ``token_ids`` (exactly one full block, after a
        hashable ``prev_block``).  Hit: the cached id gains a reference (and
        leaves the evictor), the Block is computed.  Miss: a fresh id is
        promoted under the content hash and touched.  One hit-rate query
        either way; nothing changes when NoFreeBlocksError is raised."""
        self._check_new_block_args(prev_block, extra_hash, device)
        (content_hash,) = self._full_block_hashes(prev_block, [token_ids], extra_hash)
        if self._verify_content:
            return self._allocate_verified(prev_block, [token_ids], extra_hash,
                                           [content_hash])[0]
        self._check_demand((content_hash,))
        return self._allocate_full(prev_block, token_ids, extra_hash, content_hash)

    def allocate_immutable_blocks(
        self,
        prev_block: Optional[Block],
        block_token_ids: List[List[int]],
        extra_hash: Optional[int] = None,
        device: Optional[Device] = None,
    ) -> List[Block]:
        """``allocate_immutable_block`` for each token list in order, each
        Block chained to the one before.  All or nothing: when the ids do not
        suffice NoFreeBlocksError is raised and nothing changes."""
        self._check_new_block_args(prev_block, extra_hash, device)
        check_list_of_lists(block_token_ids, "block_token_ids")
        hashes = self._full_block_hashes(prev_block, block_token_ids, extra_hash)
        if self._verify_content:
            return self._allocate_verified(prev_block, block_token_ids, extra_hash, hashes)
        self._check_demand(hashes)
        # _allocate_full for each block, with _acquire_cached inline
        cached = self._cached_blocks
        refcounts = self._refcounts
        touched = self._touched_blocks
        hits: List[bool] = []  # the hit-rate queries, recorded at once
        query = hits.append
        blocks: List[Block] = []
        for token_ids, content_hash in zip(block_token_ids, hashes):
            cached_id = cached.get(content_hash)
            if cached_id is not None:
                query(True)
                count = refcounts[cached_id]
                refcounts[cached_id] = count + 1
                if count == 0:
                    self.evictor.remove(cached_id)
                    tracker = self._block_tracker[cached_id]
                    tracker.active = True
                    tracker.computed = cached_id not in touched
                    self._held[cached_id] = cached_id
                    self._times[cached_id] = _DEFAULT_LAST_ACCESSED_TIME
                block = self._pooled_block(prev_block, token_ids, cached_id, extra_hash)
                block._computed = True
            else:
                query(False)
                block_id = self._take_id()
                cached[content_hash] = block_id
                touched.add(block_id)
                block = self._pooled_block(prev_block, token_ids, block_id, extra_hash)
            block._cached_content_hash = content_hash
            blocks.append(block)
            prev_block = block
        self.metric_data.query_all(hits)
        return blocks

    # -- promotion and copy-on-write -------------------------------------------------

    def promote_to_immutable_block(self, block: Block) -> BlockId:
        """Make the full, hashable, mutable ``block`` immutable; return its id.

        New content: the id is cached under the hash and touched (shared, not
        yet computed).  Content already cached: the block's own id drops its
        reference (free again, on the left, at 0) and the block moves to the
        cached id as on a hit.  With ``verify_content``, a hash cached for
        other content leaves the block on its id without a content hash.
        Not a hit-rate query."""
        block_id = self._check_owned(block)
        content_hash = block.content_hash
        if content_hash is None:
            raise UnhashableBlockError("only a full block after hashed blocks can be promoted")
        cached_id = self._cached_blocks.get(content_hash)
        if cached_id == block_id:
            raise ImmutableBlockError(f"block {block_id} is already immutable")
        if cached_id is None:
            if self._verify_content:
                self._contents[block_id] = self._content_of(block)  # type: ignore[assignment]
            self._cached_blocks[content_hash] = block_id
            self._touched_blocks.add(block_id)
            return block_id
        if self._verify_content and not same_content(self._contents[cached_id],
                                                     self._content_of(block)):
            # a collision: the block keeps its id and has no content hash
            block._cached_content_hash = None  # type: ignore[attr-defined]
            block._unhashable = True  # type: ignore[attr-defined]
            return block_id
        self._release_hashless(block_id)
        self._acquire_cached(cached_id)
        block.block_id = cached_id
        block.computed = True
        return cached_id

    def cow_block_if_not_appendable(self, block: Block) -> BlockId:
        """The id ``block`` may write to: its own when it holds the only
        reference; else a fresh id, with ``(old, new)`` recorded, the old id
        losing one reference and ``block`` moved to the new id.  All or
        nothing: NoFreeBlocksError leaves ``block`` on its old id."""
        if isinstance(block, PrefixCachingBlock) and block._allocator is self:
            src = block.block_id
            if src is not None and self._refcounts.get(src) == 1:
                return src
        src = self._check_owned(block)
        if self._refcounts[src] <= 1:
            return src
        content_hash = block.content_hash
        if content_hash is not None and self._cached_blocks.get(content_hash) == src:
            raise ImmutableBlockError(f"block {src} is immutable: it is never written")
        self._check_capacity(1)
        self._refcounts[src] -= 1
        dst = self._take_id()
        self._cow_tracker.record_cow(src, dst)
        block.block_id = dst
        return dst

    def clear_copy_on_writes(self) -> List[Tuple[BlockId, BlockId]]:
        """The recorded copy-on-write pairs, in order; the record is cleared."""
        tracker = self._cow_tracker
        if not tracker._copy_on_writes:
            return []
        return tracker.clear_cows()

    # -- freeing and forking ----------------------------------------------------------

    def free(self, block: Block, keep_block_object: bool = False) -> None:
        """Drop ``block``'s reference and detach it.  At refcount 0 an
        immutable id becomes evictable (still cached) and a mutable id free.
        The Block object returns to the pool unless ``keep_block_object``."""
        if isinstance(block, PrefixCachingBlock) and block._allocator is self:
            block_id = block.block_id
            if block_id is None or not self._refcounts.get(block_id):
                block_id = self._check_owned(block)  # raises
        else:
            block_id = self._check_owned(block)  # raises or returns
        self._release_block(block, block_id)  # type: ignore[arg-type]
        block.block_id = None
        if not keep_block_object:
            slot = getattr(block, "pool_id", None)
            pooled = self._pool_blocks
            if type(slot) is int and 0 <= slot < len(pooled) and pooled[slot] is block:
                self._pool_free_slots.appendleft(slot)  # BlockPool.free_block, inline

    def fork(self, last_block: Block) -> List[Block]:
        """A new chain of Blocks sharing the ids of ``last_block``'s chain
        (each id gains a reference); same tokens and extra hashes, not
        computed.  O(chain length), no recursion."""
        self._check_owned(last_block)
        chain = get_all_blocks_recursively(last_block)
        for block in chain:
            self._check_owned(block)
        forked: List[Block] = []
        prev: Optional[PrefixCachingBlock] = None
        for block in chain:
            source: PrefixCachingBlock = block  # type: ignore[assignment]
            block_id: BlockId = source.block_id  # type: ignore[assignment]
            self._refcounts[block_id] += 1
            prev = self._pooled_block(prev, source._token_ids, block_id, source._extra_hash)
            prev._cached_content_hash = source._cached_content_hash
            prev._unhashable = source._unhashable
            forked.append(prev)
        return forked

    # -- counts and lookups ---------------------------------------------------------------

    def get_num_free_blocks(self, device: Optional[Device] = None) -> int:
        """Free plus evictable ids: exactly how many allocations succeed."""
        if device is not None:
            check_no_device(device)
        return len(self._free_ids) + len(self.evictor.free_table)

    def get_num_total_blocks(self) -> int:
        """How many ids this allocator manages."""
        return self._hashless_allocator.get_num_total_blocks()

    def get_physical_block_id(self, absolute_id: int) -> int:
        """The rank of ``absolute_id`` among the sorted ids. O(1)."""
        return self._hashless_allocator.get_physical_block_id(absolute_id)

    @property
    def all_block_ids(self) -> FrozenSet[int]:
        """Every id this allocator manages."""
        return self._hashless_allocator.all_block_ids

    def is_block_cached(self, block: Block) -> bool:
        """Whether ``block``'s content hash is cached (with ``verify_content``:
        for this very content).  UnhashableBlockError when it has none."""
        if not isinstance(block, Block):
            raise WrongTypeError(f"expected a Block, got {type(block).__name__}")
        content_hash = block.content_hash
        if content_hash is None:
            raise UnhashableBlockError("the block has no content hash")
        cached_id = self._cached_blocks.get(content_hash)
        if cached_id is None:
            return False
        return not self._verify_content or same_content(self._contents[cached_id],
                                                        self._content_of(block))

    def block_is_computed(self, block_id: int) -> bool:
        """Whether the KV of ``block_id`` is computed: the tracked flag of an
        id in use; for an evictable id, True unless it was promoted and not
        yet marked computed; False for a free id."""
        try:
            known = block_id in self._refcounts
        except TypeError as exc:
            raise WrongTypeError(f"a block id must be an int, got {block_id!r}") from exc
        if not known:
            raise UnknownBlockIdError(f"block id {block_id!r} is not managed here")
        tracker = self._block_tracker[block_id]
        if tracker.active:
            return tracker.computed
        return block_id in self.evictor and block_id not in self._touched_blocks

    def get_num_full_blocks_touched(self, blocks: List[Block]) -> int:
        """How many of ``blocks`` are full and would take an id: not cached
        (with ``verify_content``: not for this very content), or cached on
        an evictable id.  Repeats count each time."""
        check_blocks(blocks)
        full = [block for block in blocks if block.is_full]
        hashes: List[Any] = [block.content_hash for block in full]  # None: cached nowhere
        cached_ids = [*map(self._cached_blocks.get, hashes)]
        evictable = self.evictor.free_table
        touched = cached_ids.count(None) + sum(map(evictable.__contains__, cached_ids))
        if self._verify_content:  # a cached id in use holding other content is touched too
            contents = self._contents
            touched += sum(1 for block, cached_id in zip(full, cached_ids)
                           if cached_id is not None and cached_id not in evictable
                           and not same_content(contents[cached_id], self._content_of(block)))
        return touched

    def get_prefix_cache_hit_rate(self) -> float:
        """Hits over queries since construction or the last reset (0.0 at first)."""
        return self.metric_data.get_hit_rate()

    def find_cached_blocks_prefix(self, block_hashes: List[int]) -> List[int]:
        """The longest prefix of ``block_hashes`` whose blocks are all cached
        and computed (a new list).  A cached id is computed exactly when it
        is not touched (the spec's ``touched_not_computed`` and
        ``untouched_content_computed``).  O(length); for a list asked about
        before, O(length) in C plus O(1) per hash appended since (see
        :mod:`prefixcache.impl.prefix_memo`).  WrongTypeError unless it is
        a list or tuple of hashable values."""
        memo = self._prefix_memo
        entry = self._memo_entries.get(id(block_hashes))
        try:
            if entry is not None and block_hashes == entry.snapshot:
                # PrefixMemo.find's most common case, inline: the list is
                # unchanged, so its remembered prefix stands (evictions cut it
                # as they happen), and only hashes after it can extend it;
                # when the next hash is not cached and computed, none does.
                length = entry.length
                if length == len(block_hashes):
                    return block_hashes[:]
                block_id = self._cached_blocks.get(block_hashes[length])
                if block_id is None or block_id in self._touched_blocks:
                    return block_hashes[:length]
                return memo.extend(entry, block_hashes, self._cached_blocks,
                                   self._touched_blocks)
            if isinstance(block_hashes, (list, tuple)):
                return memo.find(block_hashes, self._cached_blocks, self._touched_blocks)
        except TypeError as exc:
            # a scan that stopped half-way left the memo's index half-made: start over
            memo.clear()
            raise WrongTypeError(f"block_hashes must be a list of ints: {exc}") from exc
        raise WrongTypeError(
            f"block_hashes must be a list of ints, got {type(block_hashes).__name__}")

    def find_verified_blocks_prefix(self, block_hashes: List[int], token_ids: List[int],
                                    extra_hash: Optional[int] = None) -> List[int]:
        """``find_cached_blocks_prefix(block_hashes)`` cut, with
        ``verify_content``, before the first block whose cached content is
        not the sequence's: block ``i`` of ``token_ids`` (its tokens
        ``i * block_size`` to ``(i + 1) * block_size``) with ``extra_hash``,
        after the blocks before it.  Without ``verify_content`` it is
        ``find_cached_blocks_prefix(block_hashes)``.  O(prefix tokens)."""
        check_token_types(token_ids)
        check_extra_hash(extra_hash)
        found = self.find_cached_blocks_prefix(block_hashes)
        if not self._verify_content:
            return found
        size = self._block_size
        parent: Optional[Content] = None
        for index, content_hash in enumerate(found):
            record = self._contents[self._cached_blocks[content_hash]]
            if (record[1] != tuple(token_ids[index * size:(index + 1) * size])
                    or record[2] != extra_hash or not same_content(record[0], parent)):
                return found[:index]
            parent = record
        return found

    # -- access times and the computed flag ------------------------------------------------

    def mark_blocks_as_accessed(self, block_ids: List[int], now: float) -> None:
        """Set the access time of each id: in use, on its tracker; evictable,
        in the evictor (which reorders).  All or nothing: an unknown id
        raises UnknownBlockIdError (a KeyError), a free id
        BlockNotOnDeviceError (a ValueError)."""
        held = self._held
        if block_ids.__class__ is list and (type(now) is float or type(now) is int) and now == now:
            try:
                for block_id in block_ids:
                    if held[block_id] is not block_id:
                        break
                else:  # the common case: every id is one this allocator holds in use
                    times = self._times
                    for block_id in block_ids:
                        times[block_id] = now
                    return
            except Exception:  # an unknown or unhashable id: the checks below name the mistake
                pass
        self._mark_accessed_checked(block_ids, now)

    def _mark_accessed_checked(self, block_ids: List[int], now: float) -> None:
        """:meth:`mark_blocks_as_accessed` with every argument checked one by one."""
        check_timestamp(now)
        if not isinstance(block_ids, (list, tuple)):
            raise WrongTypeError(f"block_ids must be a list, got {type(block_ids).__name__}")
        refcounts = self._refcounts
        trackers = self._block_tracker
        evictable = self.evictor.free_table
        for block_id in block_ids:
            if type(block_id) is not int or block_id not in refcounts:
                raise UnknownBlockIdError(f"block id {block_id!r} is not managed here")
            if not trackers[block_id].active and block_id not in evictable:
                raise BlockNotOnDeviceError(
                    "Mark block as accessed which is not belonged to GPU"
                )
        update = self.evictor.update
        for block_id in block_ids:
            tracker = trackers[block_id]
            if tracker.active:
                tracker.last_accessed = now
            else:
                update(block_id, now)

    def mark_blocks_as_computed(self, block_ids: List[int]) -> None:
        """Mark every touched id computed and clear the touched set (the
        argument is ignored, as in vLLM)."""
        touched = self._touched_blocks
        if not touched:
            return
        trackers = self._block_tracker
        for block_id in touched:
            tracker = trackers[block_id]
            if tracker.active:
                tracker.computed = True
        touched.clear()

    def get_common_computed_block_ids(self, computed_seq_block_ids: List[List[int]]) -> List[int]:
        """One list: that list itself, a list subclass too (a tuple: a list of
        its ids).  Otherwise a new list, the longest common prefix of the
        non-empty lists (``[]`` when there are none).  Ids are compared with
        ``==`` only, so lists and tuples mix and any ids are accepted."""
        try:
            [only] = computed_seq_block_ids
        except Exception:  # not one item: the checks below
            pass
        else:
            if only.__class__ is list and computed_seq_block_ids.__class__ is list:
                return only  # the common case, already checked
        check_list_of_lists(computed_seq_block_ids, "computed_seq_block_ids")
        if len(computed_seq_block_ids) == 1:
            only = computed_seq_block_ids[0]
            return only if isinstance(only, list) else list(only)
        return common_prefix(computed_seq_block_ids)

    # -- swapping ---------------------------------------------------------------------------

    def swap_out(self, blocks: List[Block]) -> None:
        """Drop each block's reference and detach it (the objects are kept;
        immutable ids become evictable and stay cached)."""
        check_blocks(blocks)
        check_distinct_blocks(blocks)
        self._check_releasable(blocks)
        for block in blocks:
            self._release_block(block, block.block_id)  # type: ignore[arg-type]
            block.block_id = None

    def swap_in_demand(self, blocks: List[Block]) -> int:
        """How many free-or-evictable ids ``swap_in(blocks)`` takes."""
        if self._verify_content:
            return self._verified_demand(*self._swap_in_plan(blocks))
        return self._demand([block.content_hash for block in blocks])

    def swap_in(self, blocks: List[Block]) -> None:
        """Give each detached block an id, in order: a full hashable block as
        ``allocate_immutable_block`` would (it may hit; one query), any other
        a fresh id.  The blocks become this allocator's.  All or nothing."""
        check_blocks(blocks)
        for block in blocks:
            if not isinstance(block, PrefixCachingBlock):
                raise WrongTypeError(f"expected a PrefixCachingBlock, got {type(block).__name__}")
        check_detached(blocks)
        check_distinct_blocks(blocks)
        if self._verify_content:
            self._swap_in_verified(blocks)
            return
        self._check_capacity(self.swap_in_demand(blocks))
        for block in blocks:
            content_hash = block.content_hash
            if content_hash is None:
                block_id = self._take_id()
            else:
                cached_id = self._cached_blocks.get(content_hash)
                self.metric_data.query(cached_id is not None)
                if cached_id is not None:
                    self._acquire_cached(cached_id)
                    block_id = cached_id
                else:
                    block_id = self._take_id()
                    self._cached_blocks[content_hash] = block_id
                    self._touched_blocks.add(block_id)
            self._adopt(block, block_id)

    def _swap_in_verified(self, blocks: List[Block]) -> None:
        """``swap_in`` when verifying content (arguments checked): a block
        whose hash names other content, or whose previous block (listed
        before it) got none, gets a fresh id and loses its content hash."""
        hashes, records, parents = self._swap_in_plan(blocks)
        self._check_capacity(self._verified_demand(hashes, records, parents))
        plain: List[bool] = []
        for block, content_hash, record, parent in zip(blocks, hashes, records, parents):
            if content_hash is None:
                block_id, outcome = self._take_id(), _PLAIN
            else:
                block_id, outcome = self._verified_id(
                    content_hash, record, parent >= 0 and plain[parent])  # type: ignore[arg-type]
                if outcome == _PLAIN:
                    block._cached_content_hash = None  # type: ignore[attr-defined]
                    block._unhashable = True  # type: ignore[attr-defined]
            plain.append(outcome == _PLAIN)
            self._adopt(block, block_id)

    def _adopt(self, block: Block, block_id: BlockId) -> None:
        """Attach the swapped-in ``block`` to ``block_id``; it becomes this
        allocator's (and its pool's)."""
        block.block_id = block_id
        self._block_pool.adopt(block)
        block._allocator = self  # type: ignore[attr-defined]

    # -- reset --------------------------------------------------------------------------

    def reset_prefix_cache(self) -> bool:
        """Forget the cache when no id is in use: every evictable id becomes
        free (pushed on the left in eviction order), the evictor, the touched
        set and the hit-rate counters start afresh.  Returns False and changes
        nothing while any id is in use."""
        in_use = self.get_num_total_blocks() - self.get_num_free_blocks()
        if in_use > 0:
            logger.warning(
                "Failed to reset prefix cache because some blocks (%d) are not freed yet", in_use
            )
            return False
        while self.evictor.num_blocks:
            block_id, content_hash = self.evictor.evict()
            del self._cached_blocks[content_hash]
            self._free_ids.appendleft(block_id)
        self._contents.clear()
        self.evictor = make_evictor(self.eviction_policy)
        self._prefix_memo.clear()
        self._touched_blocks.clear()
        self.metric_data = CacheMetricData()
        return True


class PrefixCachingBlock(BlockFields):
    """A block whose full content is keyed by a chained content hash.

    Whether a block has content is decided once, when it becomes full: it
    has a hash only if its previous block has one at that moment; a block
    that filled after a non-full block never gets one (``_unhashable``).  The
    value itself is computed when first asked for, and kept."""

    __slots__ = ("_allocator", "_extra_hash", "_computed", "_last_accessed",
                 "_cached_content_hash", "_unhashable", "_num_tokens_total", "pool_id")

    _none_hash: int = NONE_HASH

    def __init__(
        self,
        prev_block: Optional[Block],
        token_ids: List[int],
        block_size: int,
        allocator: BlockAllocator,
        block_id: Optional[int] = None,
        computed: bool = False,
        extra_hash: Optional[int] = None,
    ) -> None:
        if not isinstance(allocator, PrefixCachingBlockAllocator):
            raise WrongTypeError("a PrefixCachingBlock needs a PrefixCachingBlockAllocator")
        if not isinstance(prev_block, _BLOCK_OR_NONE):
            raise WrongTypeError("prev_block must be a PrefixCachingBlock or None")
        check_token_ids(token_ids, block_size)
        self._prev_block = prev_block
        self._token_ids: List[int] = list(token_ids)
        self._block_size = block_size
        self._allocator = allocator
        self.block_id = block_id
        self._extra_hash = extra_hash
        self._computed = computed
        self._last_accessed: float = _DEFAULT_LAST_ACCESSED_TIME
        self._cached_content_hash: Optional[int] = None
        self._unhashable = False
        self._num_tokens_total: int = len(self._token_ids) + (
            0 if prev_block is None else prev_block.num_tokens_total
        )
        if len(self._token_ids) == block_size:
            self._settle_hashability()

    def _settle_hashability(self) -> None:
        """Called when the block becomes full: without a hashed previous block
        now, it has no content hash, ever."""
        prev = self._prev_block
        if prev is not None:
            prev_hash = prev.content_hash
            if prev_hash is None or prev_hash == NONE_HASH:
                self._unhashable = True

    def append_token_ids(self, token_ids: List[int]) -> None:
        """Append tokens.  A shared id is first copied (copy-on-write through
        the allocator); a block that becomes full and hashable is promoted
        (its id may change to a cached one).  All or nothing."""
        tokens = self._token_ids
        size = self._block_size
        used = len(tokens)
        if (used + 1 < size and type(token_ids) is list and len(token_ids) == 1
                and not self._computed and type(token_ids[0]) is int):
            # One token into a block that stays non-full (so has no hash), which
            # this Block alone references: nothing to copy, nothing to promote.
            block_id = self.block_id
            allocator = self._allocator
            if block_id is None or (type(allocator) is PrefixCachingBlockAllocator
                                    and allocator._refcounts.get(block_id) == 1):
                tokens.append(token_ids[0])
                self._num_tokens_total += 1
                return
        # (a Block whose hash is known is full, so the hash test covers it)
        if self._computed or (used == size and self.content_hash is not None):
            check_token_types(token_ids)  # a wrong type is reported first
            raise ImmutableBlockError("cannot append to an immutable or computed block")
        if not token_ids:
            return
        check_token_ids(token_ids, size - used)
        count = len(token_ids)
        if self.block_id is not None:
            self.block_id = self._allocator.cow_block_if_not_appendable(self)
        tokens.extend(token_ids)
        self._num_tokens_total += count
        if used + count == size:
            self._settle_hashability()
            if self.block_id is not None and self.content_hash is not None:
                self.block_id = self._allocator.promote_to_immutable_block(self)

    @property
    def content_hash(self) -> Optional[int]:
        """The chained content hash, or None while this block is not full, or
        when an earlier block was not full or hashed as this one filled.
        Computed without recursion and kept."""
        content_hash = self._cached_content_hash
        if content_hash is not None:
            return content_hash
        if len(self._token_ids) != self._block_size or self._unhashable:
            return None
        pending: List[PrefixCachingBlock] = [self]
        prev = self._prev_block
        while isinstance(prev, PrefixCachingBlock) and prev._cached_content_hash is None:
            if len(prev._token_ids) != prev._block_size or prev._unhashable:
                return None
            pending.append(prev)
            prev = prev._prev_block
        parent: Optional[int] = None
        if prev is not None:
            parent = prev.content_hash
            if parent is None or parent == NONE_HASH:
                return None
        hash_fn = getattr(self._allocator, "_hash_fn", None)
        if not callable(hash_fn):
            hash_fn = builtin_hash
        for block in reversed(pending):
            parent = hash_fn(parent, block._token_ids, block._extra_hash)
            block._cached_content_hash = parent
        return parent

    @classmethod
    def hash_block_tokens(
        cls,
        is_first_block: bool,
        prev_block_hash: Optional[int],
        cur_block_token_ids: List[int],
        extra_hash: Optional[int] = None,
    ) -> int:
        """vLLM's builtin content hash of one block."""
        if is_first_block and prev_block_hash is None:
            prev_block_hash = NONE_HASH
        return hash((is_first_block, prev_block_hash, *cur_block_token_ids, extra_hash))

    @property
    def computed(self) -> bool:
        return self._computed

    @computed.setter
    def computed(self, value: bool) -> None:
        self._computed = value

    @property
    def last_accessed(self) -> float:
        return self._last_accessed

    @last_accessed.setter
    def last_accessed(self, last_accessed_ts: float) -> None:
        self._last_accessed = last_accessed_ts

    @property
    def num_tokens_total(self) -> int:
        return self._num_tokens_total

    @property
    def extra_hash(self) -> Optional[int]:
        return self._extra_hash


#: What ``prev_block`` may be: the one spelling of that test in this module.
_BLOCK_OR_NONE = (PrefixCachingBlock, type(None))


def assert_prefix_caching_block_or_none(block: Optional[Block]) -> None:
    """Raise WrongTypeError unless ``block`` is a PrefixCachingBlock or None."""
    if not isinstance(block, _BLOCK_OR_NONE):
        raise WrongTypeError(f"got block = {block}")


class ComputedBlocksTracker:
    """Per sequence: the content hashes of its full blocks (extended as it
    grows) and how many of its tokens are cached and computed: asked of the
    allocator's ``find_cached_blocks_prefix``, or, when its ``verify_content``
    is True, of ``find_verified_blocks_prefix`` (the blocks must also hold
    the sequence's very content).

    Hashes the way the GPU allocator does (its ``content_hash_function``,
    vLLM's builtin hash when it has none)."""

    _none_hash: int = NONE_HASH

    def __init__(self, allocator: object, block_size: int, enable_caching: bool) -> None:
        self._allocator = allocator
        self._block_size = block_size
        self._enable_caching = enable_caching
        hash_fn = getattr(allocator, "content_hash_function", None)
        self._hash_fn: HashFunction = hash_fn if callable(hash_fn) else builtin_hash
        # Content verification on: ask find_verified_blocks_prefix.  Otherwise,
        # and of an allocator that does not say (vLLM's, a mock), hashes only.
        self._verified = getattr(allocator, "verify_content", False) is True
        self._seq_id_to_blocks_hashes: Dict[int, List[int]] = {}
        self._seq_id_to_num_tokens_computed: Dict[int, int] = {}

    def _update_seq_hashes(self, seq: object, token_ids: List[int],
                           extra_hash: Optional[int]) -> List[int]:
        """Extend the recorded hashes of ``seq`` to its current full blocks."""
        seq_id: int = seq.seq_id  # type: ignore[attr-defined]
        hashes = self._seq_id_to_blocks_hashes.setdefault(seq_id, [])
        size = self._block_size
        if len(token_ids) < len(hashes) * size:
            raise InvalidArgumentError(
                f"sequence {seq_id} shrank below the {len(hashes)} blocks already recorded"
            )
        parent: Optional[int] = hashes[-1] if hashes else None
        for start in range(len(hashes) * size, len(token_ids) - size + 1, size):
            parent = self._hash_fn(parent, token_ids[start:start + size], extra_hash)
            hashes.append(parent)
        return hashes

    def get_num_cached_tokens(self, seq: object) -> int:
        """Tokens of ``seq`` covered by cached, computed blocks (0 when caching
        is off).  While the sequence is in prefill, the first answer sticks."""
        if not self._enable_caching:
            return 0
        token_ids: List[int] = seq.get_token_ids()  # type: ignore[attr-defined]
        extra_hash: Optional[int] = seq.extra_hash()  # type: ignore[attr-defined]
        hashes = self._update_seq_hashes(seq, token_ids, extra_hash)
        seq_id: int = seq.seq_id  # type: ignore[attr-defined]
        previous = self._seq_id_to_num_tokens_computed.get(seq_id)
        if previous is not None and seq.is_prefill():  # type: ignore[attr-defined]
            return previous
        if self._verified:  # checks the cached content too
            cached = self._allocator.find_verified_blocks_prefix(  # type: ignore[attr-defined]
                hashes, token_ids, extra_hash)
        else:
            cached = self._allocator.find_cached_blocks_prefix(hashes)  # type: ignore[attr-defined]
        num_tokens = len(cached) * self._block_size
        self._seq_id_to_num_tokens_computed[seq_id] = num_tokens
        return num_tokens

    def remove_seq(self, seq_id: int) -> None:
        """Forget ``seq_id`` (it must have been queried)."""
        if not self._enable_caching:
            return
        if (seq_id not in self._seq_id_to_blocks_hashes
                or seq_id not in self._seq_id_to_num_tokens_computed):
            raise UnknownBlockIdError(f"sequence {seq_id} is not tracked")
        del self._seq_id_to_blocks_hashes[seq_id]
        del self._seq_id_to_num_tokens_computed[seq_id]


class LastAccessBlocksTracker:
    """Per sequence: the time it last ran, passed on to the allocator's
    ``mark_blocks_as_accessed`` when asked (vLLM defers it to this moment)."""

    def __init__(self, allocator: object) -> None:
        self._allocator = allocator
        self._seq_last_access: Dict[int, Optional[float]] = {}

    def _check_known(self, seq_id: int) -> None:
        if seq_id not in self._seq_last_access:
            raise UnknownBlockIdError(f"sequence {seq_id} is not tracked")

    def add_seq(self, seq_id: int) -> None:
        """Start tracking ``seq_id`` (with no time yet)."""
        if seq_id in self._seq_last_access:
            raise InvalidArgumentError(f"sequence {seq_id} is already tracked")
        self._seq_last_access[seq_id] = None

    def remove_seq(self, seq_id: int) -> None:
        """Stop tracking ``seq_id``."""
        self._check_known(seq_id)
        del self._seq_last_access[seq_id]

    def update_last_access(self, seq_id: int, time: float) -> None:
        """Record that ``seq_id`` ran at ``time``."""
        self._check_known(seq_id)
        self._seq_last_access[seq_id] = time

    def update_seq_blocks_last_access(self, seq_id: int, block_ids: List[int]) -> None:
        """Mark ``block_ids`` accessed at ``seq_id``'s recorded time (nothing
        when no time was recorded)."""
        self._check_known(seq_id)
        time = self._seq_last_access[seq_id]
        if time is None:
            return
        self._allocator.mark_blocks_as_accessed(block_ids, time)  # type: ignore[attr-defined]
