"""The model of an allocator without a prefix cache (vLLM's
``NaiveBlockAllocator``): reference counts, a free list and copy-on-write;
nothing is hashed, cached, evicted or computed."""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Optional, Sequence, cast

from ..impl import errors as err
from ..spec.state import NEVER_ACCESSED, AbstractState, BlockState
from .handles import Handle
from .model import Chooser, Model


class NaiveModel:
    """What a correct naive allocator answers; operations as in
    :class:`~prefixcache.model.Model` (handles for Blocks), all or nothing.

    Ids are handed out from the front of the free list and a freed id goes
    back to the front; relaxed mode (``strict=False``) asks ``chooser`` as
    ``Model`` does."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        block_ids: Optional[Iterable[int]] = None,
        *,
        strict: bool = True,
        chooser: Optional[Chooser] = None,
    ) -> None:
        """Every id free, no copy-on-write recorded."""
        ids = list(range(num_blocks) if block_ids is None else block_ids)
        if block_size < 1 or len(set(ids)) != len(ids) or len(ids) != num_blocks:
            raise err.InvalidArgumentError("need block_size >= 1 and num_blocks distinct ids")
        self.block_size, self.strict, self.chooser = block_size, strict, chooser
        self._ids = tuple(sorted(ids))
        self._free = ids
        self._ref = dict.fromkeys(ids, 0)
        self._cows: list[tuple[int, int]] = []
        self._live: dict[int, Handle] = {}

    def _own(self, h: object, attached: bool = True) -> Handle:
        if not isinstance(h, Handle):
            raise err.WrongTypeError(f"not a block handle: {h!r}")
        if h.owner is not self:
            raise err.ForeignBlockError("the block belongs to another allocator")
        if attached and h.block_id is None:
            raise err.DetachedBlockError("the block is detached (freed or swapped out)")
        if not attached and h.block_id is not None:
            raise err.InvalidArgumentError("the block is attached (not swapped out)")
        return h

    def _tokens(self, toks: object, room: int) -> list[int]:
        if not isinstance(toks, (list, tuple)) or not all(type(t) is int for t in toks):
            raise err.WrongTypeError("token_ids must be a list of ints")
        if len(toks) > room:
            raise err.BlockFullError(f"{len(toks)} tokens, {room} empty slots")
        return list(toks)

    def _need(self, n: int) -> None:
        if n > len(self._free):
            raise err.NoFreeBlocksError(f"{n} blocks requested, {len(self._free)} free")

    def _take(self) -> int:
        i = self._free[0]
        if not self.strict and self.chooser is not None:
            allowed = frozenset(self._free)
            i = self.chooser(allowed)
            if i not in allowed:
                from .errors import ChoiceNotAllowed

                raise ChoiceNotAllowed(i, allowed)
        self._free.remove(i)
        self._ref[i] = 1
        return i

    def _check_prev(self, prev: object) -> None:
        if prev is not None and not isinstance(prev, Handle):
            raise err.WrongTypeError(f"prev_block must be a block handle: {prev!r}")

    def _new(self, prev: object, toks: Any) -> Handle:
        h = Handle(self, self.block_size, cast(Optional[Handle], prev), toks)
        h.block_id = self._take()
        self._live[id(h)] = h
        return h

    def _drop(self, h: Handle) -> None:
        i, h.block_id = cast(int, h.block_id), None
        del self._live[id(h)]
        self._ref[i] -= 1
        if self._ref[i] == 0:
            self._free.insert(0, i)

    def allocate_mutable_block(
        self, prev_block: Optional[Handle], extra_hash: Optional[int] = None
    ) -> Handle:
        """An empty block on the first free id."""
        self._check_prev(prev_block)
        self._need(1)
        return self._new(prev_block, [])

    def allocate_immutable_block(
        self,
        prev_block: Optional[Handle],
        token_ids: Sequence[int],
        extra_hash: Optional[int] = None,
    ) -> Handle:
        """A block holding ``token_ids`` on the first free id (never shared)."""
        self._check_prev(prev_block)
        toks = self._tokens(token_ids, self.block_size)
        self._need(1)
        return self._new(prev_block, toks)

    def allocate_immutable_blocks(
        self,
        prev_block: Optional[Handle],
        block_token_ids: Sequence[Sequence[int]],
        extra_hash: Optional[int] = None,
    ) -> list[Handle]:
        """A chain of blocks on the next free ids; all or none."""
        self._check_prev(prev_block)
        if not isinstance(block_token_ids, (list, tuple)):
            raise err.WrongTypeError("block_token_ids must be a list of token lists")
        lists = [self._tokens(t, self.block_size) for t in block_token_ids]
        self._need(len(lists))
        out: list[Handle] = []
        for toks in lists:
            prev_block = self._new(prev_block, toks)
            out.append(prev_block)
        return out

    def append_token_ids(self, handle: Handle, token_ids: Sequence[int]) -> None:
        """Append; a shared id is first copied to a fresh one (pair recorded)."""
        h = self._own(handle)
        toks = self._tokens(token_ids, h.num_empty_slots)
        if toks:
            self.cow_block_if_not_appendable(h)
            h.token_ids.extend(toks)

    def cow_block_if_not_appendable(self, handle: Handle) -> int:
        """The handle's id if unshared, else a fresh id (pair recorded)."""
        h = self._own(handle)
        old = cast(int, h.block_id)
        if self._ref[old] <= 1:
            return old
        self._need(1)
        self._ref[old] -= 1
        h.block_id = self._take()
        self._cows.append((old, h.block_id))
        return h.block_id

    def promote_to_immutable_block(self, handle: Handle) -> int:
        """There is no promotion without a cache: NotImplementedError."""
        raise NotImplementedError("There is no promotion for naive blocks")

    def free(self, handle: Handle) -> None:
        """Detach; the id is free again when its last reference goes."""
        self._drop(self._own(handle))

    def fork(self, last_block: Handle) -> list[Handle]:
        """New handles sharing every id of the chain (one more reference each)."""
        chain: list[Handle] = []
        h: Optional[Handle] = self._own(last_block)
        while h is not None:
            chain.insert(0, self._own(h))
            h = h.prev_block
        out: list[Handle] = []
        for old in chain:
            n = Handle(self, self.block_size, out[-1] if out else None, list(old.token_ids))
            n.block_id = old.block_id
            self._ref[cast(int, old.block_id)] += 1
            self._live[id(n)] = n
            out.append(n)
        return out

    def swap_out(self, blocks: Sequence[Handle]) -> None:
        """Free each block; the handles keep their tokens."""
        hs = [self._own(b) for b in blocks]
        need = Counter(cast(int, h.block_id) for h in hs)
        if any(self._ref[i] < n for i, n in need.items()) or len({id(h) for h in hs}) < len(hs):
            raise err.RefCountError("a block is released more often than referenced")
        for h in hs:
            self._drop(h)

    def swap_in(self, blocks: Sequence[Handle]) -> None:
        """A fresh id for each detached handle, in order; all or none."""
        hs = [self._own(b, attached=False) for b in blocks]
        self._need(len(hs))
        for h in hs:
            h.block_id = self._take()
            self._live[id(h)] = h

    def clear_copy_on_writes(self) -> list[tuple[int, int]]:
        """The recorded pairs in order; the record is emptied."""
        pairs, self._cows = self._cows, []
        return pairs

    def mark_blocks_as_accessed(self, block_ids: Iterable[int], now: float) -> None:
        """Nothing to record."""

    def mark_blocks_as_computed(self, block_ids: Iterable[int]) -> None:
        """Nothing to record."""

    def get_common_computed_block_ids(self, computed_seq_block_ids: list[list[int]]) -> list[int]:
        """Always []."""
        return []

    def get_num_full_blocks_touched(self, blocks: Sequence[Handle]) -> int:
        """Distinct full blocks among ``blocks``."""
        return len({id(b) for b in blocks if b.is_full})

    def find_cached_blocks_prefix(self, keys: Sequence[Any]) -> list[Any]:
        """Always []: nothing is cached."""
        return []

    def reset_prefix_cache(self) -> bool:
        """Always True: nothing to reset."""
        return True

    def get_prefix_cache_hit_rate(self) -> float:
        """Always -1: there is no cache."""
        return -1

    def get_num_free_blocks(self) -> int:
        """Free ids."""
        return len(self._free)

    # the id queries are the prefix-caching model's own: they read only ``_ids``
    get_num_total_blocks = Model.get_num_total_blocks
    get_physical_block_id = Model.get_physical_block_id
    all_block_ids = Model.all_block_ids

    def state(self) -> AbstractState:
        """The spec's state: in-use ids hold no content, nothing is cached."""
        blocks = {
            i: BlockState(r, None, False, NEVER_ACCESSED) for i, r in self._ref.items() if r > 0
        }
        return AbstractState(
            block_ids=self._ids,
            free=tuple(self._free),
            blocks=blocks,
            cached={},
            evictor=(),
            touched=frozenset(),
            copy_on_writes=tuple(self._cows),
            hits=0,
            misses=0,
            reported_free=len(self._free),
            block_size=self.block_size,
        )

    def ownership(self) -> dict[int, int]:
        """id -> number of attached handles on it."""
        return dict(Counter(cast(int, h.block_id) for h in self._live.values()))
