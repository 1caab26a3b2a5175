"""The abstract model of one block allocator (one device), with a prefix
cache (vLLM's ``PrefixCachingBlockAllocator``) or without (``caching=False``:
vLLM's ``NaiveBlockAllocator``).

Plain dicts and lists, exact content keys and no hashes: small enough to be
read against SPEC.md line by line.  Every public operation is
all-or-nothing (a failed call restores everything it touched, handles
included) and, when ``check_invariants`` is on, ends by checking the spec's
invariants on the model's own state.
"""

from __future__ import annotations

import copy
import functools
import math
from collections import Counter
from typing import Any, Callable, Iterable, Optional, Sequence, TypeVar, cast

from ..impl import errors as err
from ..spec.invariants import check_all
from ..spec.pure import chain_key as _checked_chain_key
from ..spec.pure import unchecked
from ..spec.semantics import PREFIXCACHE, Semantics
from ..spec.state import NEVER_ACCESSED, AbstractState, BlockState, ContentKey, EvictorEntry
from .errors import ChoiceNotAllowed, ModelInvariantError
from .handles import ChainKey, Handle, chain

#: :func:`prefixcache.spec.pure.chain_key` without its runtime contract (per block)
_chain_key = unchecked(_checked_chain_key)

Prev = Optional[Handle]
Extra = Optional[int]
#: Relaxed mode's chooser: given the ids the spec allows, return the one taken.
Chooser = Callable[[frozenset[int]], int]
_F = TypeVar("_F", bound=Callable[..., Any])
_BUCKET = 1000  # queries per bucket in vLLM's CacheMetricData


def _operation(method: _F) -> _F:
    """All or nothing: on any exception put the model and every handle it
    could have touched back as they were; then check the invariants."""

    @functools.wraps(method)
    def run(self: Model, *args: Any, **kwargs: Any) -> Any:
        saved = self._save((*args, *kwargs.values()))
        try:
            return method(self, *args, **kwargs)
        except BaseException as exc:
            self._rollback(saved, exc)
            raise
        finally:
            self._self_check()

    return cast(_F, run)


class Model:
    """What a correct prefix-caching allocator answers (vLLM 0.8.5's
    ``PrefixCachingBlockAllocator`` plus prefixcache's stricter rules).

    The operations mirror the allocator's, with :class:`Handle` objects in
    place of ``Block`` objects; ``append_token_ids(handle, tokens)`` stands
    for ``block.append_token_ids(tokens)``.  A caller mistake raises the
    :mod:`prefixcache.impl.errors` class of spec/error_table.py, before
    anything happens, and changes nothing.

    **Which id is handed out.**  A fresh id is needed by a cache miss, a
    mutable allocation, a copy-on-write and a ``swap_in`` of a block without
    a cache hit.  If some id is free, a free id is taken; only when none is
    free is the first evictor entry's id taken (it leaves the cache); with
    neither, ``NoFreeBlocksError``.

    * Strict mode (``strict=True``, the default) takes the first id of the
      free list, vLLM's order: ``block_ids`` in the order given, an id whose
      last reference goes (without content) put back at the front, and
      ``reset_prefix_cache`` putting the evicted ids at the front one by
      one, in eviction order.
    * Relaxed mode (``strict=False``): the spec only says *some* free id.
      Each time a fresh id is taken while the free list is not empty, the
      model calls ``self.chooser(allowed)``, ``allowed`` being the frozenset
      of all free ids, and takes the id it returns; an id outside
      ``allowed`` raises :class:`~prefixcache.model.errors.ChoiceNotAllowed`
      and the call has no effect.  One call per fresh id, in the order the
      operation takes them: ``allocate_mutable_block`` once;
      ``allocate_immutable_block(s)`` once per miss, in block order;
      ``append_token_ids`` and ``cow_block_if_not_appendable`` once if the
      block is shared (its copy-on-write); ``swap_in`` once per block
      without content and once per miss, in list order.  Never for a hit or
      a duplicate promotion (they take the cached id), and never when the
      free list is empty (the eviction order is not a choice).  With no
      chooser set the first free id is taken.  ``chooser`` is a plain
      attribute, so it can be set before each operation.  In relaxed mode
      the order of ``state().free`` carries no meaning: compare it as a set.

    **Without a cache** (``caching=False``, vLLM's ``NaiveBlockAllocator``)
    no block ever has content: nothing is hashed, cached, evicted, touched or
    counted; an immutable block may hold fewer tokens than a block does and
    always takes a fresh id; handles carry no extra hash; promotion raises
    ``NotImplementedError``; marks do nothing; the cache queries answer
    ``[]``, ``-1`` and ``True``; ``get_num_full_blocks_touched`` counts
    each handle once.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        block_ids: Optional[Iterable[int]] = None,
        *,
        strict: bool = True,
        chooser: Optional[Chooser] = None,
        check_invariants: bool = True,
        caching: bool = True,
        semantics: Semantics = PREFIXCACHE,
    ) -> None:
        """An allocator with every id free, nothing cached, no query yet,
        following ``semantics`` where the spec names two rules
        (prefixcache's by default)."""
        if not (_is_int(num_blocks) and _is_int(block_size) and num_blocks >= 0 < block_size):
            raise err.InvalidArgumentError("need an int num_blocks >= 0 and block_size >= 1")
        ids = list(range(num_blocks) if block_ids is None else block_ids)
        if not all(map(_is_int, ids)) or len(set(ids)) != len(ids) or len(ids) != num_blocks:
            raise err.InvalidArgumentError("block_ids must be num_blocks distinct ints")
        self.block_size = block_size
        self.strict, self.chooser, self.check_invariants = strict, chooser, check_invariants
        self.caching, self.semantics = caching, semantics
        self._ids = tuple(sorted(ids))
        self._free = ids  # hand-out order, first = next
        self._ref = dict.fromkeys(ids, 0)
        self._content: dict[int, ChainKey] = {}  # cached id -> its content
        self._cached: dict[ChainKey, int] = {}  # content -> cached id
        self._last: dict[int, float] = {}  # last accessed of in-use ids
        self._evictor: list[tuple[float, int, int]] = []  # (last, -tokens, id), sorted
        self._touched: set[int] = set()  # cached ids promoted since the last marking
        self._cows: list[tuple[int, int]] = []
        self._hits = self._misses = 0
        self._buckets: list[int] = []  # hits of each completed bucket of queries
        self._live: dict[int, Handle] = {}  # id(handle) -> attached handle

    # ----------------------------------------------------------- allocation

    @_operation
    def allocate_mutable_block(
        self, prev_block: Prev, extra_hash: Extra = None, device: None = None
    ) -> Handle:
        """A new empty block after ``prev_block`` on a fresh id (refcount 1,
        not computed, last accessed -1)."""
        extra = self._check_new(prev_block, extra_hash, device)
        h = Handle(self, self.block_size, prev_block, [], extra)
        self._attach(h, self._fresh_id())
        return h

    @_operation
    def allocate_immutable_block(
        self,
        prev_block: Prev,
        token_ids: Sequence[int],
        extra_hash: Extra = None,
        device: None = None,
    ) -> Handle:
        """A full block after ``prev_block`` (whose content must exist).
        Hit (content cached): one more reference on the cached id, the
        handle's own flag is computed, an evictable id leaves the evictor
        with last accessed -1 (touched or not, as it was).  Miss: a fresh id
        now caches the content and is touched.  Counts one query."""
        return self._immutables(prev_block, [token_ids], extra_hash, device)[0]

    @_operation
    def allocate_immutable_blocks(
        self,
        prev_block: Prev,
        block_token_ids: Sequence[Sequence[int]],
        extra_hash: Extra = None,
        device: None = None,
    ) -> list[Handle]:
        """``allocate_immutable_block`` for each list in turn, each block
        after the previous one; all of them or none."""
        return self._immutables(prev_block, block_token_ids, extra_hash, device)

    def _immutables(
        self, prev: Prev, blocks: Sequence[Sequence[int]], extra: Extra, device: object
    ) -> list[Handle]:
        """Mistakes, the first found wins: a device; prev_block's type;
        extra_hash's type; prev_block without content; then per token list
        in order: not a list, too many tokens, a token not an int, too few."""
        extra = self._check_new(prev, extra, device)
        if not isinstance(blocks, (list, tuple)):
            raise err.WrongTypeError("block_token_ids must be a list of token lists")
        if self.caching and prev is not None and prev.key is None:
            raise err.UnhashableBlockError("the previous block has no content")
        keys = [_base(prev)]
        for toks in (self._tokens(t, self.block_size) for t in blocks):
            if self.caching and len(toks) < self.block_size:
                raise err.UnhashableBlockError("an immutable block must be full")
            keys.append(_chain_key(keys[-1], extra, toks))
        out: list[Handle] = []
        for key in keys[1:]:
            h = Handle(self, self.block_size, prev, list(key[-1][1]), extra)
            if self.caching:
                h.key = key
                block_id, h.computed = self._acquire(key)
            else:
                block_id = self._fresh_id()
            self._attach(h, block_id)
            out.append(h)
            prev = h
        return out

    # ------------------------------------------------ appending and sharing

    @_operation
    def append_token_ids(self, block: Handle, token_ids: Sequence[int]) -> None:
        """Append to a block that has no content yet.  A shared id is first
        copied (fresh id, pair (old, new) recorded).  A block that becomes
        full after a chain of blocks with content gets its content: new
        content is cached on its id, which is touched; content already
        cached sends its id to the front of the free list and the handle
        takes the cached id exactly like a hit (no query counted).  A
        detached (swapped-out) block only changes its own tokens and content."""
        h = self._own(block)
        if h.key is not None or h.computed:
            self._tokens(token_ids, len(token_ids) if isinstance(token_ids, (list, tuple)) else 0)
            raise err.ImmutableBlockError("the block is immutable")
        if not self._tokens(token_ids, h.num_empty_slots):
            return
        if h.block_id is not None:
            self._cow(h)
        h.token_ids.extend(token_ids)
        prev = h.prev_block
        if not (self.caching and h.is_full) or (prev is not None and prev.key is None):
            return
        h.key = _chain_key(_base(prev), h.extra_hash, tuple(h.token_ids))
        if h.block_id is None:
            return
        if h.key not in self._cached:
            self._cache(h.block_id, h.key)
            return
        self._drop(h.block_id)
        h.block_id, h.computed = self._acquire(h.key, query=False)[0], True

    @_operation
    def cow_block_if_not_appendable(self, block: Handle) -> int:
        """The handle's id if it is not shared; else the handle moves to a
        fresh id, the pair (old, new) is recorded and the new id returned.
        A shared block with content cannot be written: ImmutableBlockError."""
        h = self._own(block, attached=True)
        if h.key is not None and self._ref[cast(int, h.block_id)] > 1:
            raise err.ImmutableBlockError("a shared block with content is never copied")
        return self._cow(h)

    @_operation
    def promote_to_immutable_block(self, block: Handle) -> int:
        """Never has an effect: a block is promoted by the append that fills
        it, so an explicit call is a caller mistake (ImmutableBlockError if
        the block already has content, else UnhashableBlockError).  Without
        a cache: NotImplementedError."""
        if not self.caching:
            raise NotImplementedError("There is no promotion for naive blocks")
        h = self._own(block, attached=True)
        if h.key is not None:
            raise err.ImmutableBlockError("the block was promoted when it became full")
        raise err.UnhashableBlockError("the block is not full or an earlier block had no content")

    @_operation
    def fork(self, last_block: Handle) -> list[Handle]:
        """New handles for the whole chain ending at ``last_block``: same ids
        (one more reference each), same tokens and content, not computed.
        Every block of the chain must be attached and this model's."""
        old = [self._own(h, attached=True) for h in chain(self._own(last_block, foreign_ok=True))]
        out: list[Handle] = []
        for h in old:
            bid = cast(int, h.block_id)
            self._ref[bid] += 1
            prev = out[-1] if out else None
            n = Handle(self, self.block_size, prev, list(h.token_ids), h.extra_hash, key=h.key)
            self._attach(n, bid)
            out.append(n)
        return out

    @_operation
    def free(self, block: Handle) -> None:
        """Detach the handle; its id loses a reference.  At 0 an id with
        content becomes evictable (entry: its last accessed, its chain's
        token count) and stays cached; an id without goes to the front of
        the free list."""
        self._detach(self._own(block, attached=True))

    @_operation
    def swap_out(self, blocks: Sequence[Handle]) -> None:
        """``free`` each handle in turn; the handles keep their tokens.  A
        handle listed twice: InvalidArgumentError; more handles on an id
        than it has references: RefCountError."""
        hs = [self._own(b, attached=True) for b in blocks]
        if len({id(h) for h in hs}) < len(hs):
            raise err.InvalidArgumentError("a block is listed twice")
        if any(self._ref[i] < n for i, n in Counter(cast(int, h.block_id) for h in hs).items()):
            raise err.RefCountError("an id is released more often than it is referenced")
        for h in hs:
            self._detach(h)

    @_operation
    def swap_in(self, blocks: Sequence[Handle]) -> None:
        """Attach each detached handle in turn: one with content as
        ``allocate_immutable_block`` would (a query, maybe a hit; the
        handle's own computed flag is left alone), any other on a fresh id.
        Handles of another model are welcome (that is how a block changes
        device) and become this model's.  Attached or repeated handles:
        InvalidArgumentError."""
        hs = [self._own(b, foreign_ok=True) for b in blocks]
        for k, h in enumerate(hs):
            if h.block_id is not None or any(x is h for x in hs[:k]):
                raise err.InvalidArgumentError("swap_in takes distinct detached blocks")
        for h in hs:
            h.owner = self
            self._attach(h, self._fresh_id() if h.key is None else self._acquire(h.key)[0])

    @_operation
    def clear_copy_on_writes(self) -> list[tuple[int, int]]:
        """The recorded (source, destination) pairs in order; the record is emptied."""
        pairs, self._cows = self._cows, []
        return pairs

    # -------------------------------------------------- access and computed

    @_operation
    def mark_blocks_as_accessed(self, block_ids: Iterable[int], now: float) -> None:
        """Set last accessed to ``now`` for each id: on the tracker of an id
        in use, on the evictor entry (re-sorted) of an evictable id.  A free
        id: BlockNotOnDeviceError; unknown: UnknownBlockIdError."""
        if not self.caching:
            return
        if type(now) not in (int, float):
            raise err.WrongTypeError("now must be a number")
        if math.isnan(now):
            raise err.InvalidArgumentError("now is NaN")
        ids = list(block_ids)
        for i in ids:
            if not isinstance(i, int) or i not in self._ref:
                raise err.UnknownBlockIdError(f"unknown block id {i!r}")
            if self._ref[i] == 0 and i not in self._content:
                raise err.BlockNotOnDeviceError(f"block {i} is free")
        for i in ids:
            if self._ref[i] > 0:
                self._last[i] = now
            else:
                self._evictor = sorted(
                    (now, n, j) if j == i else (t, n, j) for t, n, j in self._evictor
                )

    @_operation
    def mark_blocks_as_computed(self, block_ids: Iterable[int]) -> None:
        """Ignores its argument: no id is touched any more, so every id with
        content is computed."""
        self._touched.clear()

    # -------------------------------------------------------------- queries

    def get_common_computed_block_ids(self, computed_seq_block_ids: list[list[int]]) -> list[int]:
        """The one list itself if there is exactly one (a tuple: a list of
        its ids), else the longest common prefix of the non-empty lists ([]
        if none).  No effect."""
        if not self.caching:
            return []
        if len(computed_seq_block_ids) == 1:
            only = computed_seq_block_ids[0]
            return only if isinstance(only, list) else list(only)
        rows = [r for r in computed_seq_block_ids if r]
        n = 0
        while rows and all(len(r) > n and r[n] == rows[0][n] for r in rows):
            n += 1
        return list(rows[0][:n]) if rows else []

    def get_num_full_blocks_touched(self, blocks: Sequence[Handle]) -> int:
        """How many of the handles (any model's; no deduplication) are full
        and would need an id here: no content, content not cached, or
        content cached on an evictable id.  No effect."""
        hs = [self._own(b, foreign_ok=True) for b in blocks]
        if not self.caching:  # each handle once
            hs = list({id(h): h for h in hs}.values())
        return sum(
            h.is_full and (h.key not in self._cached or self._ref[self._cached[h.key]] == 0)
            for h in hs
        )

    def find_cached_blocks_prefix(self, keys: Sequence[ContentKey]) -> list[ContentKey]:
        """The longest prefix of ``keys`` (spec content keys: one
        (extra_hash, tokens) pair per block of the chain) whose blocks are
        all cached and computed (not touched), in use or evictable.  No effect.
        WrongTypeError when ``keys`` is not a list (or tuple)."""
        out: list[ContentKey] = []
        if not isinstance(keys, (list, tuple)):
            raise err.WrongTypeError(f"keys must be a list, got {type(keys).__name__}")
        if not self.caching:
            return out
        for k in keys:
            if not _is_content_key(k):
                raise err.WrongTypeError(f"not a content key: {k!r}")
            i = self._cached.get(k)
            if i is None or i in self._touched:
                break
            out.append(k)
        return out

    @_operation
    def reset_prefix_cache(self) -> bool:
        """False, with no effect, while any id is in use.  Else every
        evictable id, in eviction order, goes to the front of the free list;
        nothing is cached or touched; the query counts restart; True."""
        if self.caching and any(self._ref.values()):
            return False
        for _, _, i in self._evictor:
            self._free.insert(0, i)
        self._evictor, self._cached, self._content, self._touched = [], {}, {}, set()
        self._hits = self._misses = 0
        self._buckets = []
        return True

    def get_prefix_cache_hit_rate(self) -> float:
        """vLLM's bucketed hit rate (``CacheMetricData``, buckets of 1000
        queries), bit for bit; 0.0 before any query; -1 without a cache.  No effect."""
        if not self.caching:
            return -1
        nb, rate = len(self._buckets), 0.0
        for k, hits in enumerate(self._buckets):  # the running average, folded as vLLM does
            rate = (rate * k + hits / _BUCKET) / (k + 1)
        q = self._hits + self._misses - nb * _BUCKET
        ratio = q / _BUCKET
        if nb + ratio == 0:
            return 0.0
        part = (self._hits - sum(self._buckets)) / q * ratio if q > 0 else 0.0
        return ((rate * nb if nb > 0 else 0.0) + part) / (nb + ratio)

    def get_num_free_blocks(self, device: None = None) -> int:
        """Free ids plus evictable ids: exactly how many allocations can succeed."""
        self._check_new(None, None, device)
        return len(self._free) + len(self._evictor)

    def get_num_total_blocks(self) -> int:
        """How many ids the allocator owns."""
        return len(self._ids)

    def get_physical_block_id(self, absolute_id: int) -> int:
        """The rank of ``absolute_id`` among all ids, smallest first."""
        if absolute_id not in self._ids:
            raise err.UnknownBlockIdError(f"unknown block id {absolute_id!r}")
        return self._ids.index(absolute_id)

    @property
    def all_block_ids(self) -> frozenset[int]:
        """Every id the allocator owns."""
        return frozenset(self._ids)

    def state(self) -> AbstractState:
        """The model's state as the spec's value.  ``computed`` is exact
        (see ``_computed``); an evictable id reports its entry's last access."""

        def ck(i: int) -> Optional[ContentKey]:
            return self._content.get(i)

        last = {i: t for t, _, i in self._evictor} | self._last
        blocks = {i: BlockState(self._ref[i], ck(i), self._computed(i), t) for i, t in last.items()}
        return AbstractState(
            block_ids=self._ids,
            free=tuple(self._free),
            blocks=blocks,
            cached=dict(self._cached),
            evictor=tuple(
                EvictorEntry(t, -n, i, self._content[i]) for t, n, i in self._evictor
            ),
            touched=frozenset(self._touched),
            copy_on_writes=tuple(self._cows),
            hits=self._hits,
            misses=self._misses,
            reported_free=len(self._free) + len(self._evictor),
            block_size=self.block_size,
        )

    def ownership(self) -> dict[int, int]:
        """id -> number of attached handles that point at it."""
        return dict(Counter(cast(int, h.block_id) for h in self._live.values()))

    # ------------------------------------------------------------ internals

    def _fresh_id(self) -> int:
        """Take an id for new content (see the class docstring): refcount 1,
        last accessed -1, no content (so not computed)."""
        if self._free:
            i = self._free[0]
            if not self.strict and self.chooser is not None:
                allowed = frozenset(self._free)
                i = self.chooser(allowed)
                if not _is_int(i) or i not in allowed:
                    raise ChoiceNotAllowed(i, allowed)
            self._free.remove(i)
        elif self._evictor:
            i = self._evictor.pop(0)[2]
            del self._cached[self._content.pop(i)]
            self._touched.discard(i)  # it no longer holds what was promoted
        else:
            raise err.NoFreeBlocksError("no free or evictable block")
        self._ref[i], self._last[i] = 1, NEVER_ACCESSED
        return i

    def _acquire(self, key: ChainKey, query: bool = True) -> tuple[int, bool]:
        """A reference on the id holding ``key``: the cached one (a hit; an
        evictable id comes back with last accessed -1) or a fresh one that
        now caches it, touched (a miss).  Returns (id, hit)."""
        hit = key in self._cached
        if query:
            self._count(hit)
        if not hit:
            i = self._fresh_id()
            self._cache(i, key)
            return i, False
        i = self._cached[key]
        self._ref[i] += 1
        if self._ref[i] == 1:
            self._evictor = [e for e in self._evictor if e[2] != i]
            self._last[i] = NEVER_ACCESSED
        return i, True

    def _computed(self, i: int) -> bool:
        """vLLM's ``block_is_computed``, made exact: an id with content is
        computed unless it was promoted since the last
        ``mark_blocks_as_computed`` (in use or evictable alike; under the
        option ``computed_on_release`` an id stops being touched when its last
        reference goes); a mutable id never is."""
        return i in self._content and i not in self._touched

    def _cache(self, i: int, key: ChainKey) -> None:
        self._content[i], self._cached[key] = key, i
        self._touched.add(i)

    def _cow(self, h: Handle) -> int:
        old = cast(int, h.block_id)
        if self._ref[old] <= 1:
            return old
        h.block_id = self._fresh_id()
        self._ref[old] -= 1
        self._cows.append((old, h.block_id))
        return h.block_id

    def _drop(self, i: int) -> None:
        """One reference less on ``i``; at 0 it becomes evictable or free."""
        self._ref[i] -= 1
        if self._ref[i] == 0:
            if i in self._content:
                if self.semantics.computed_on_release:
                    self._touched.discard(i)
                tokens = sum(len(toks) for _, toks in self._content[i])
                self._evictor.append((self._last[i], -tokens, i))
                self._evictor.sort()
            else:
                self._free.insert(0, i)
            del self._last[i]

    def _attach(self, h: Handle, i: int) -> None:
        h.block_id = i
        self._live[id(h)] = h

    def _detach(self, h: Handle) -> None:
        i, h.block_id = cast(int, h.block_id), None
        del self._live[id(h)]
        self._drop(i)

    def _count(self, hit: bool) -> None:
        self._hits, self._misses = self._hits + hit, self._misses + (not hit)
        if (self._hits + self._misses) % _BUCKET == 0:
            self._buckets.append(self._hits - sum(self._buckets))

    def _own(self, h: object, attached: bool = False, foreign_ok: bool = False) -> Handle:
        """``h`` itself, once known to be a handle (WrongTypeError), attached
        if asked (DetachedBlockError), and this model's unless another's is
        fine (ForeignBlockError), and, if attached, on a managed id
        (UnknownBlockIdError) that holds a reference (RefCountError), checked
        in that order."""
        if not isinstance(h, Handle):
            raise err.WrongTypeError(f"not a block handle: {h!r}")
        if attached and h.block_id is None:
            raise err.DetachedBlockError("the block is detached (freed or swapped out)")
        if h.owner is not self and not foreign_ok:
            raise err.ForeignBlockError("the block belongs to another allocator")
        if attached and h.block_id not in self._ref:
            raise err.UnknownBlockIdError(f"block id {h.block_id} is not managed here")
        if attached and self._ref[cast(int, h.block_id)] == 0:
            raise err.RefCountError(f"block id {h.block_id} holds no reference (a stale block)")
        return h

    def _check_new(self, prev: object, extra: Any, device: object) -> Extra:
        """The checks of a new block's arguments; returns the extra hash its
        handle carries (none without a cache)."""
        if device is not None:
            raise err.InvalidArgumentError("one device here: pass device=None")
        if prev is not None:
            self._own(prev, foreign_ok=True)
        if not self.caching:
            return None
        if extra is not None and not _is_int(extra):
            raise err.WrongTypeError("extra_hash must be an int or None")
        return cast(Extra, extra)

    def _tokens(self, toks: object, room: int) -> tuple[int, ...]:
        if not isinstance(toks, (list, tuple)) or not all(map(_is_int, toks)):
            raise err.WrongTypeError("token_ids must be a list of ints")
        if len(toks) > room:
            raise err.BlockFullError(f"{len(toks)} tokens do not fit in {room} empty slots")
        return tuple(toks)

    def _save(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        # every container holds immutable values: a shallow copy is a snapshot
        fields = {k: copy.copy(v) for k, v in vars(self).items() if k not in ("_live", "chooser")}
        handles = list(self._live.values()) + [a for a in args if isinstance(a, Handle)]
        handles += [x for a in args if isinstance(a, (list, tuple)) for x in a]
        marks = [(h, h.owner, h.block_id, list(h.token_ids), h.computed, h.key)
                 for h in handles if isinstance(h, Handle)]  # fmt: skip
        return fields, dict(self._live), marks

    def _rollback(self, saved: tuple[Any, ...], exc: BaseException) -> None:
        """Put back what a failed call changed (see ``_save``); under
        ``failed_query_counted`` a refusal for want of ids keeps the cache
        queries it made."""
        counts = self._hits, self._misses, self._buckets
        self._load(saved)
        if self.semantics.failed_query_counted and isinstance(exc, err.NoFreeBlocksError):
            self._hits, self._misses, self._buckets = counts

    def _load(self, saved: tuple[Any, ...]) -> None:
        fields, live, marks = saved
        vars(self).update(fields)
        self._live = live
        for h, owner, block_id, toks, computed, key in marks:
            h.owner, h.block_id, h.computed, h.key = owner, block_id, computed, key
            h.token_ids[:] = toks

    def _self_check(self) -> None:
        if self.check_invariants:
            broken = check_all(self.state(), self.ownership())
            if broken:
                raise ModelInvariantError(broken)


def _is_int(x: object) -> bool:
    return type(x) is int


def _is_content_key(k: object) -> bool:
    """A non-empty tuple of (extra_hash, tokens) pairs, tokens a tuple."""
    return (isinstance(k, tuple) and len(k) > 0
            and all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[1], tuple) for p in k))


def _base(prev: Optional[Handle]) -> ChainKey:
    """The content a block after ``prev`` extends (() for a first block)."""
    return prev.key if prev is not None and prev.key is not None else ()
