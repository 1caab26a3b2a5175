"""Checked allocators: prefixcache.impl's allocators with the spec enforced.

``CheckedPrefixCachingBlockAllocator``, ``CheckedNaiveBlockAllocator`` and
``CheckedCpuGpuBlockAllocator`` subclass the impl's classes (and
:func:`checked_class` makes the same of any subclass of them).  Every public
method calls the impl's own method; around it, icontract checks:

* the class invariant (:func:`prefixcache.spec.invariants.check_all` on the
  abstract state, plus "no content hash names two contents") before and
  after every outermost public call (icontract skips nested calls);
* a snapshot (``OLD``) of the abstract state and the abstract arguments, and
  a postcondition: the call was allowed (``pre_X``) and did what ``post_X``
  of :mod:`prefixcache.spec.contracts` says;
* when the call raises instead: the state is unchanged, and, unless the
  error is about the argument's shape (:data:`~prefixcache.spec.error_table.ARGUMENT_ERRORS`),
  ``pre_X`` was indeed False.

Appends go through the Blocks, so the checked allocators hand out Blocks of a
checked subclass whose ``append_token_ids`` is checked the same way.  The
contracts of calls made from inside another call (``self.x`` inside the
impl) are not checked: only the call the user made is.  Contracts cannot see
which Blocks the caller still holds, so the ownership invariant is left to
callers that know (:func:`prefixcache.spec.abstraction.ownership`).

Content keys: each checked allocator keeps a
:class:`~prefixcache.spec.abstraction.ContentLedger`, fed with every Block
passed in or handed out, so every cached hash has a name.

Contracts are on unless ``PREFIXCACHE_CONTRACTS=0`` or Python runs with
``-O``; when off, the three names are the impl's classes themselves, so the
cost is zero.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Type

from prefixcache.impl.cpu_gpu_block_allocator import CpuGpuBlockAllocator
from prefixcache.impl.errors import PrefixCacheError
from prefixcache.impl.naive_block import NaiveBlock, NaiveBlockAllocator
from prefixcache.impl.prefix_caching_block import PrefixCachingBlock, PrefixCachingBlockAllocator

from . import contracts as C
from .abstraction import (
    AbstractionError,
    ContentLedger,
    abstract_state,
    chain_keys,
    content_key_of,
)
from .error_table import ARGUMENT_ERRORS, NAIVE, PREFIX
from .invariants import check_all
from .operations import OPERATIONS, operation
from .state import AbstractState, BlockId, ContentKey


def contracts_enabled() -> bool:
    """Return whether contracts are on: Python without ``-O`` and the
    environment variable ``PREFIXCACHE_CONTRACTS`` not ``0``."""
    return __debug__ and os.environ.get("PREFIXCACHE_CONTRACTS", "1").strip() != "0"


CONTRACTS_ENABLED: bool = contracts_enabled()
"""Whether this import made checked classes (fixed at import time)."""


def describe_change(old: AbstractState, new: AbstractState) -> str:
    """Return the fields of the abstract state that differ, old -> new."""
    parts = []
    for name in AbstractState.__dataclass_fields__:
        a, b = getattr(old, name), getattr(new, name)
        if a != b:
            parts.append(f"{name}: {a!r} -> {b!r}")
    return "; ".join(parts) or "no change"


PreFn = Callable[[AbstractState], bool]
PostFn = Callable[[AbstractState, AbstractState, Any], bool]
FinishFn = Callable[[Any], Any]
Adapter = Callable[["Checker", Mapping[str, Any]], Tuple[PreFn, PostFn, FinishFn]]


@dataclass
class Record:
    """What a snapshot keeps for the postcondition of one outermost call."""

    op: str
    old: AbstractState
    pre: bool
    post: PostFn
    finish: FinishFn


def _same(x: Any) -> Any:
    return x


def _id_of_result(block: Any) -> Optional[BlockId]:
    return getattr(block, "block_id", None)


def _ids_of_result(blocks: Any) -> List[Optional[BlockId]]:
    return [getattr(b, "block_id", None) for b in blocks]


def _no_pre(s: AbstractState) -> bool:
    return True


class Checker:
    """The checking machinery one checked allocator carries (as ``_pc``):
    its ledger, call depth, last snapshot and cached abstract states."""

    def __init__(self, allocator: Any, adapters: Mapping[str, Adapter]) -> None:
        """Attach to ``allocator``; ``adapters`` map its operations to contracts."""
        self.allocator = allocator
        self.adapters = adapters
        self.ledger = ContentLedger()
        self.depth = 0
        self.record: Optional[Record] = None
        self.cache: Optional[Tuple[str, AbstractState]] = None
        self.failure = ""
        self._readers: Optional[Tuple[Callable[[Any], Any], Callable[[Any], int]]] = None
        self._signatures: Dict[Any, inspect.Signature] = {}

    # -- reading ---------------------------------------------------------------

    def state(self) -> AbstractState:
        """The allocator's abstract state now, read through the undecorated
        ``all_block_ids`` and ``get_num_free_blocks`` of the instance's class
        (so no contract runs inside the reading)."""
        if self._readers is None:
            cls = type(self.allocator)
            self._readers = (inspect.unwrap(cls.all_block_ids.fget),
                             inspect.unwrap(cls.get_num_free_blocks))
        ids_of, free_of = self._readers
        a = self.allocator
        self.depth += 1         # the readers may call checked methods: they run plain
        try:
            ids, free = ids_of(a), free_of(a)
            return abstract_state(a, ledger=self.ledger, reported_free=free, block_ids=ids)
        finally:
            self.depth -= 1

    def _checked_state(self, when: str) -> AbstractState:
        """``state()``, with an unnameable content turned into a violation."""
        import icontract

        try:
            return self.state()
        except AbstractionError as exc:
            self.cache = None
            raise icontract.ViolationError(
                f"{when}: the allocator caches content no Block it handed out spells ({exc})"
            ) from exc

    def _take(self, tag: str) -> Optional[AbstractState]:
        cache, self.cache = self.cache, None
        return cache[1] if cache is not None and cache[0] == tag else None

    def owns(self, block: Any) -> bool:
        """Whether ``block`` is a Block bound to this allocator."""
        return block is not None and getattr(block, "_allocator", None) is self.allocator

    def id_of(self, block: Any) -> Optional[BlockId]:
        """The abstract id of a Block argument: its id if it is one of this
        allocator's Blocks, else None (foreign, wrong type, detached)."""
        return getattr(block, "block_id", None) if self.owns(block) else None

    def key_of(self, block: Any) -> Optional[ContentKey]:
        """The content key of a hashed Block, else None."""
        if getattr(block, "content_hash", None) is None:
            return None
        return content_key_of(block)

    def prefix_of(self, prev_block: Any) -> Optional[ContentKey]:
        """The content key a new block chained after ``prev_block`` extends
        (``()`` for a first block), or None when ``prev_block`` is not hashed
        (then nothing after it is)."""
        if prev_block is None:
            return ()
        if getattr(prev_block, "content_hash", None) is None:
            return None
        return content_key_of(prev_block)

    def new_keys(
        self, prev_block: Any, lists: Iterable[Any], extra_hash: Any
    ) -> List[Optional[ContentKey]]:
        """The content keys of new full blocks chained after ``prev_block``
        (None for a list that does not fill a block, and after it)."""
        size = self.allocator._block_size
        prefix = self.prefix_of(prev_block)
        keys: List[Optional[ContentKey]] = []
        for tokens in lists:
            if prefix is None or not isinstance(tokens, (list, tuple)) or len(tokens) != size:
                prefix = None
                keys.append(None)
                continue
            prefix = prefix + ((extra_hash, tuple(tokens)),)
            keys.append(prefix)
        return keys

    def observe(self, *objs: Any) -> None:
        """Feed the ledger every hashed Block of this allocator found in
        ``objs`` (Blocks, or lists of Blocks)."""
        blocks: List[Any] = []
        for obj in objs:
            if isinstance(obj, (list, tuple)):
                blocks.extend(b for b in obj if self.owns(b))
            elif self.owns(obj):
                blocks.append(obj)
        if blocks:
            self.ledger.observe_blocks(blocks)

    # -- invariants ------------------------------------------------------------

    def invariants_hold(self) -> bool:
        """Check every state invariant (and the ledger) now; on failure keep
        a message in ``failure``."""
        s = self._take("post") or self._checked_state("invariant")
        self.cache = ("pre", s)
        violated = check_all(s)
        violated += ["content_collision: " + line for line in self.ledger.anomalies()]
        if violated:
            self.cache = None
            self.failure = f"invariants violated: {', '.join(violated)}; state: {s!r}"
            return False
        return True

    # -- contracts -------------------------------------------------------------

    def snapshot(self, op: str, fn: Callable[..., Any], args: Tuple[Any, ...],
                 kwargs: Mapping[str, Any]) -> Optional[Record]:
        """At the outermost call: the old state, whether ``pre_op`` holds, and
        how to check ``post_op``.  Nested calls: None."""
        if self.depth > 0:
            return None
        old = self._take("pre") or self.state()
        sig = self._signatures.get(fn)
        if sig is None:
            sig = self._signatures[fn] = inspect.signature(fn)
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        pre, post, finish = self.adapters[op](self, bound.arguments)
        rec = Record(op=op, old=old, pre=pre(old), post=post, finish=finish)
        self.record = rec
        return rec

    def call(self, fn: Callable[..., Any], args: Tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """Run the impl's method one level deeper and feed the ledger with
        the Blocks passed and returned; at the outermost level check the
        error promise when it raises."""
        self.depth += 1
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            self.depth -= 1
            if self.depth == 0:
                self.after_error(exc)
            raise
        self.depth -= 1
        self.observe(result, *args, *kwargs.values())
        return result

    def after_error(self, exc: BaseException) -> None:
        """The call raised ``exc``: the state must be unchanged, and the
        precondition must have been False (unless the error is about the
        argument's shape).  Raises ViolationError otherwise."""
        import icontract

        rec, self.record = self.record, None
        self.cache = None
        if rec is None:
            return
        new = self._checked_state(f"{rec.op} raised {exc!r}")
        if new != rec.old:
            raise icontract.ViolationError(
                f"{rec.op} raised {exc!r} but changed the state: {describe_change(rec.old, new)}"
            ) from exc
        checked = isinstance(exc, (PrefixCacheError, NotImplementedError))
        if rec.pre and checked and not isinstance(exc, ARGUMENT_ERRORS):
            raise icontract.ViolationError(
                f"{rec.op} raised {exc!r} although its precondition holds"
            ) from exc

    def post(self, rec: Optional[Record], result: Any) -> bool:
        """The postcondition of the outermost call (True for nested calls)."""
        if rec is None:
            return True
        self.record = None
        new = self._checked_state(f"after {rec.op}")
        if not rec.pre:
            self.failure = f"{rec.op} succeeded although its precondition does not hold"
            return False
        if not rec.post(rec.old, new, rec.finish(result)):
            self.failure = (f"{rec.op} broke its postcondition (result {result!r}): "
                            f"{describe_change(rec.old, new)}")
            if self.ledger.aliases:
                self.failure += (" [note: one content key was seen under two hashes "
                                 "(a chain mixing extra hashes); the key cannot tell them apart]")
            return False
        self.cache = ("post", new)
        return True

    def run_append(self, block: Any, token_ids: Any, fn: Callable[[Any], None]) -> None:
        """Check an append made through a Block like an outermost call."""
        import icontract

        if self.depth > 0:
            fn(token_ids)
            return
        self.cache = None
        old = self.state()
        pre, post, finish = self.adapters["append_token_ids"](
            self, {"block": block, "token_ids": token_ids})
        rec = Record(op="append_token_ids", old=old, pre=pre(old), post=post, finish=finish)
        self.record = rec
        self.call(fn, (token_ids,), {})
        self.observe(block)
        ok = self.post(rec, None)
        self.cache = None
        if not ok or not self.invariants_hold():
            self.cache = None
            raise icontract.ViolationError(self.failure)
        self.cache = None


# ==========================================================================
# adapters: concrete arguments -> (pre, post, finish) over abstract states


def _a_allocate_mutable(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    return (C.pre_allocate_mutable_block, C.post_allocate_mutable_block, _id_of_result)


def _a_allocate_immutable(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    (key,) = c.new_keys(a["prev_block"], [a["token_ids"]], a["extra_hash"])
    return (lambda s: C.pre_allocate_immutable_block(s, key),
            lambda o, n, r: C.post_allocate_immutable_block(o, n, r, key),  # type: ignore[arg-type]
            _id_of_result)


def _a_allocate_immutables(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    lists = a["block_token_ids"]
    keys = c.new_keys(a["prev_block"], lists if isinstance(lists, (list, tuple)) else [],
                      a["extra_hash"])
    return (lambda s: C.pre_allocate_immutable_blocks(s, keys),
            lambda o, n, r: C.post_allocate_immutable_blocks(o, n, r, keys),  # type: ignore[arg-type]
            _ids_of_result)


def _a_free(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    i = c.id_of(a["block"])
    return (lambda s: C.pre_free(s, i),
            lambda o, n, r: C.post_free(o, n, r, i),  # type: ignore[arg-type]
            _same)


def _a_free_block_id(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    i = a["block_id"]
    i = i if type(i) is int else None
    return (lambda s: C.pre_free_block_id(s, i),
            lambda o, n, r: C.post_free_block_id(o, n, r, i),  # type: ignore[arg-type]
            _same)


def _a_fork(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    last = a["last_block"]
    ids = [c.id_of(b) for b, _ in chain_keys(last)] if c.owns(last) else [None]
    return (lambda s: C.pre_fork(s, ids),
            lambda o, n, r: C.post_fork(o, n, r, ids),  # type: ignore[arg-type]
            _ids_of_result)


def _a_cow(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    i = c.id_of(a["block"])
    return (lambda s: C.pre_cow_block_if_not_appendable(s, i),
            lambda o, n, r: C.post_cow_block_if_not_appendable(o, n, r, i),  # type: ignore[arg-type]
            _same)


def _a_promote(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    block = a["block"]
    i = c.id_of(block)
    key = c.key_of(block) if c.owns(block) else None
    return (lambda s: C.pre_promote_to_immutable_block(s, i, key),
            lambda o, n, r: C.post_promote_to_immutable_block(o, n, r, i, key),  # type: ignore[arg-type]
            _same)


def _a_naive_promote(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    return (lambda s: False, lambda o, n, r: False, _same)


def _append_args(c: Checker, block: Any, token_ids: Any) -> Tuple[Optional[BlockId], int, int]:
    i = c.id_of(block)
    room = int(getattr(block, "num_empty_slots", 0))
    n = len(token_ids) if isinstance(token_ids, (list, tuple)) else 0
    return i, room, n


def _a_append(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    block, tokens = a["block"], a["token_ids"]
    i, room, n = _append_args(c, block, tokens)
    immutable = bool(block.computed) or block.content_hash is not None
    full_key: Optional[ContentKey] = None
    if i is not None and n == room and n > 0:
        prefix = c.prefix_of(block.prev_block)
        if prefix is not None:
            full_key = prefix + ((block.extra_hash, tuple(block.token_ids) + tuple(tokens)),)
    return (lambda s: C.pre_append_token_ids(s, i, immutable, room, n, full_key),
            lambda o, n_, r: C.post_append_token_ids(o, n_, block.block_id, i, immutable,
                                                     room, n, full_key),
            _same)


def _a_naive_append(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    block, tokens = a["block"], a["token_ids"]
    i, room, n = _append_args(c, block, tokens)
    return (lambda s: C.pre_naive_append_token_ids(s, i, room, n),
            lambda o, n_, r: C.post_naive_append_token_ids(o, n_, block.block_id, i, room, n),
            _same)


def _a_clear_cows(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    return (C.pre_clear_copy_on_writes, C.post_clear_copy_on_writes, _same)


def _a_mark_accessed(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    ids = list(a["block_ids"]) if isinstance(a["block_ids"], (list, tuple)) else []
    now = a["now"]
    return (lambda s: C.pre_mark_blocks_as_accessed(s, ids, now),
            lambda o, n, r: C.post_mark_blocks_as_accessed(o, n, r, ids, now),
            _same)


def _a_mark_computed(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    ids = a["block_ids"]
    return (_no_pre, lambda o, n, r: C.post_mark_blocks_as_computed(o, n, r, ids), _same)


def _a_naive_no_change(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    return (_no_pre, C.post_naive_query_no_change, _same)


def _a_common(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    lists = [list(x) for x in a["computed_seq_block_ids"]]
    return (_no_pre, lambda o, n, r: C.post_get_common_computed_block_ids(o, n, r, lists), _same)


def _a_naive_common(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    lists = a["computed_seq_block_ids"]
    return (_no_pre, lambda o, n, r: C.post_naive_get_common_computed_block_ids(o, n, r, lists),
            _same)


def _a_full_touched(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    entries = [(bool(b.is_full), c.key_of(b) if b.is_full else None) for b in a["blocks"]]
    return (_no_pre, lambda o, n, r: C.post_get_num_full_blocks_touched(o, n, r, entries), _same)


def _a_naive_full_touched(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    entries = [(id(b), bool(b.is_full)) for b in a["blocks"]]
    return (_no_pre, lambda o, n, r: C.post_naive_get_num_full_blocks_touched(o, n, r, entries),
            _same)


def _a_find_prefix(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    keys = [c.ledger.name(h) for h in a["block_hashes"]]
    return (_no_pre, lambda o, n, r: C.post_find_cached_blocks_prefix(o, n, r, keys), len)


def _a_naive_find_prefix(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    return (_no_pre, lambda o, n, r: C.post_naive_find_cached_blocks_prefix(o, n, r, []), len)


def _a_swap_out(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    seen: set[int] = set()
    ids: List[Optional[BlockId]] = []
    for b in a["blocks"]:
        # a Block listed again is detached by then: it held one reference
        ids.append(None if id(b) in seen else c.id_of(b))
        seen.add(id(b))
    return (lambda s: C.pre_swap_out(s, ids),
            lambda o, n, r: C.post_swap_out(o, n, r, ids),  # type: ignore[arg-type]
            _same)


def _a_swap_in(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    blocks = list(a["blocks"])
    keys = [c.key_of(b) for b in blocks]
    distinct = len({id(b) for b in blocks}) == len(blocks)
    return (lambda s: C.pre_swap_in(s, keys, distinct),
            lambda o, n, r: C.post_swap_in(o, n, [b.block_id for b in blocks], keys),
            _same)


def _a_naive_swap_in(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    blocks = list(a["blocks"])
    distinct = len({id(b) for b in blocks}) == len(blocks)
    return (lambda s: C.pre_naive_swap_in(s, len(blocks), distinct),
            lambda o, n, r: C.post_naive_swap_in(o, n, [b.block_id for b in blocks], len(blocks)),
            _same)


def _a_naive_allocate_immutable(
    c: Checker, a: Mapping[str, Any]
) -> Tuple[PreFn, PostFn, FinishFn]:
    tokens = a["token_ids"]
    fits = isinstance(tokens, (list, tuple)) and len(tokens) <= c.allocator._block_size
    return (lambda s: C.pre_naive_allocate_immutable_block(s, fits),
            C.post_naive_allocate_immutable_block, _id_of_result)


def _a_naive_allocate_immutables(
    c: Checker, a: Mapping[str, Any]
) -> Tuple[PreFn, PostFn, FinishFn]:
    lists = a["block_token_ids"]
    lists = list(lists) if isinstance(lists, (list, tuple)) else []
    size = c.allocator._block_size
    fits = all(isinstance(t, (list, tuple)) and len(t) <= size for t in lists)
    return (lambda s: C.pre_naive_allocate_immutable_blocks(s, len(lists), fits),
            lambda o, n, r: C.post_naive_allocate_immutable_blocks(o, n, r, len(lists)),
            _ids_of_result)


def _a_reset(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    return (C.pre_reset_prefix_cache, C.post_reset_prefix_cache, _same)


def _a_naive_reset(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    return (_no_pre, C.post_naive_reset_prefix_cache, _same)


def _a_hit_rate(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    return (_no_pre, C.post_get_prefix_cache_hit_rate, _same)


def _a_naive_hit_rate(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    return (_no_pre, C.post_naive_get_prefix_cache_hit_rate, _same)


def _a_num_free(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    ok = a.get("device") is None
    return (lambda s: ok, C.post_get_num_free_blocks, _same)


def _a_num_total(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    return (_no_pre, C.post_get_num_total_blocks, _same)


def _a_physical(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    i = a["absolute_id"]
    return (lambda s: C.pre_get_physical_block_id(s, i),
            lambda o, n, r: C.post_get_physical_block_id(o, n, r, i), _same)


def _a_is_block_cached(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    block = a["block"]
    key = c.key_of(block) if c.owns(block) else None
    return (lambda s: C.pre_is_block_cached(s, key),
            lambda o, n, r: C.post_is_block_cached(o, n, r, key), _same)


def _a_block_is_computed(c: Checker, a: Mapping[str, Any]) -> Tuple[PreFn, PostFn, FinishFn]:
    i = a["block_id"]
    return (lambda s: C.pre_block_is_computed(s, i),
            lambda o, n, r: C.post_block_is_computed(o, n, r, i), _same)


_COMMON: Dict[str, Adapter] = {
    "allocate_mutable_block": _a_allocate_mutable,
    "free": _a_free,
    "fork": _a_fork,
    "cow_block_if_not_appendable": _a_cow,
    "clear_copy_on_writes": _a_clear_cows,
    "swap_out": _a_swap_out,
    "get_num_free_blocks": _a_num_free,
    "get_num_total_blocks": _a_num_total,
    "get_physical_block_id": _a_physical,
}

PREFIX_ADAPTERS: Dict[str, Adapter] = {
    **_COMMON,
    "allocate_immutable_block": _a_allocate_immutable,
    "allocate_immutable_blocks": _a_allocate_immutables,
    "promote_to_immutable_block": _a_promote,
    "append_token_ids": _a_append,
    "mark_blocks_as_accessed": _a_mark_accessed,
    "mark_blocks_as_computed": _a_mark_computed,
    "get_common_computed_block_ids": _a_common,
    "get_num_full_blocks_touched": _a_full_touched,
    "find_cached_blocks_prefix": _a_find_prefix,
    "swap_in": _a_swap_in,
    "reset_prefix_cache": _a_reset,
    "get_prefix_cache_hit_rate": _a_hit_rate,
    "block_is_computed": _a_block_is_computed,
    "is_block_cached": _a_is_block_cached,
}
"""Operation -> adapter for the prefix-caching allocator."""

NAIVE_ADAPTERS: Dict[str, Adapter] = {
    **_COMMON,
    "allocate_immutable_block": _a_naive_allocate_immutable,
    "allocate_immutable_blocks": _a_naive_allocate_immutables,
    "promote_to_immutable_block": _a_naive_promote,
    "append_token_ids": _a_naive_append,
    "free_block_id": _a_free_block_id,
    "mark_blocks_as_accessed": _a_naive_no_change,
    "mark_blocks_as_computed": _a_naive_no_change,
    "get_common_computed_block_ids": _a_naive_common,
    "get_num_full_blocks_touched": _a_naive_full_touched,
    "find_cached_blocks_prefix": _a_naive_find_prefix,
    "swap_in": _a_naive_swap_in,
    "reset_prefix_cache": _a_naive_reset,
    "get_prefix_cache_hit_rate": _a_naive_hit_rate,
}
"""Operation -> adapter for the naive allocator."""


# ==========================================================================
# building the checked classes


def _checked_method(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """A method that calls ``fn`` (the impl's) under the contract of ``name``."""
    import functools

    import icontract

    @functools.wraps(fn)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self._pc.call(fn, (self, *args), kwargs)

    snap = icontract.snapshot(
        lambda self, _ARGS, _KWARGS: self._pc.snapshot(name, fn, _ARGS, _KWARGS), name="pc")
    ensure = icontract.ensure(
        lambda self, OLD, result: self._pc.post(OLD.pc, result),
        description=f"the contract of {name}",
        error=lambda self: icontract.ViolationError(self._pc.failure))
    return snap(ensure(method))


def _contracted(kind: str, adapters: Mapping[str, Adapter]) -> List[str]:
    """The methods of an allocator of ``kind`` that get a contract: every
    allocator method of the table of operations (not a property), each of
    which must have an adapter here, and the adapters must name nothing else
    (the Block's ``append_token_ids`` is checked by the checked Block)."""
    names = [op.name for op in OPERATIONS if kind in op.allocators and not op.attribute]
    methods = [n for n in names if operation(n).owner == "allocator"]
    unknown = sorted(set(adapters) - set(names))
    lacking = sorted(set(methods) - set(adapters))
    if unknown or lacking:
        raise RuntimeError(f"the {kind} adapters and the table of operations differ: "
                           f"no such operation {unknown}, no adapter for {lacking}")
    return methods


def _add_contracts(cls: type, base: type, kind: str, adapters: Mapping[str, Adapter]) -> None:
    for name in _contracted(kind, adapters):
        setattr(cls, name, _checked_method(name, getattr(base, name)))


def _invariant(cls: type) -> type:
    import icontract

    return icontract.invariant(
        lambda self: self._pc.invariants_hold(),
        description="the spec's invariants",
        error=lambda self: icontract.ViolationError(self._pc.failure),
    )(cls)


class _CheckedPrefixCachingBlock(PrefixCachingBlock):
    """A PrefixCachingBlock whose appends are checked by its allocator."""

    __slots__ = ()

    def append_token_ids(self, token_ids: List[int]) -> None:
        """Append as the impl does, under the append contract."""
        checker = getattr(self._allocator, "_pc", None)
        if checker is None:
            super().append_token_ids(token_ids)
        else:
            checker.run_append(self, token_ids, super().append_token_ids)


class _CheckedNaiveBlock(NaiveBlock):
    """A NaiveBlock whose appends are checked by its allocator."""

    __slots__ = ()

    def append_token_ids(self, token_ids: List[int]) -> None:
        """Append as the impl does, under the append contract."""
        checker = getattr(self._allocator, "_pc", None)
        if checker is None:
            super().append_token_ids(token_ids)
        else:
            checker.run_append(self, token_ids, super().append_token_ids)


def checked_class(base: type) -> type:
    """Return a checked subclass of ``base``, a subclass of prefixcache.impl's
    ``PrefixCachingBlockAllocator`` or ``NaiveBlockAllocator`` (for example
    one under development, or a deliberately broken one in a test): every
    public operation of the spec is checked around ``base``'s own method.
    Returns ``base`` itself when contracts are off."""
    if not contracts_enabled():
        return base
    if issubclass(base, PrefixCachingBlockAllocator):
        return _checked_prefix(base)
    if issubclass(base, NaiveBlockAllocator):
        return _checked_naive(base)
    raise TypeError(f"checked_class needs a prefixcache.impl allocator class, got {base!r}")


def _checked_prefix(base: Type[PrefixCachingBlockAllocator]) -> type:
    class CheckedPrefixCachingBlockAllocator(base):  # type: ignore[valid-type,misc]
        """PrefixCachingBlockAllocator with the spec's invariants and
        contracts checked on every public call (see the module doc)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._pc = Checker(self, PREFIX_ADAPTERS)
            super().__init__(*args, **kwargs)

        def _create_block(self, prev_block: Any, token_ids: List[int], block_size: int,
                          allocator: Any, block_id: Optional[int] = None,
                          computed: bool = False, extra_hash: Optional[int] = None) -> Any:
            return _CheckedPrefixCachingBlock(
                prev_block=prev_block, token_ids=token_ids, block_size=block_size,
                allocator=self, block_id=block_id, computed=computed, extra_hash=extra_hash)

    if base is not PrefixCachingBlockAllocator:
        CheckedPrefixCachingBlockAllocator.__name__ = f"Checked{base.__name__}"
        CheckedPrefixCachingBlockAllocator.__qualname__ = f"Checked{base.__name__}"
    _add_contracts(CheckedPrefixCachingBlockAllocator, base, PREFIX, PREFIX_ADAPTERS)
    return _invariant(CheckedPrefixCachingBlockAllocator)


def _checked_naive(base: Type[NaiveBlockAllocator]) -> type:
    class CheckedNaiveBlockAllocator(base):  # type: ignore[valid-type,misc]
        """NaiveBlockAllocator with the spec's invariants and contracts
        checked on every public call (see the module doc)."""

        def __init__(self, create_block: Any, num_blocks: int, block_size: int,
                     block_ids: Optional[Iterable[int]] = None,
                     block_pool: Any = None) -> None:
            self._pc = Checker(self, NAIVE_ADAPTERS)
            if create_block is NaiveBlock:
                create_block = _CheckedNaiveBlock
            super().__init__(create_block, num_blocks, block_size, block_ids, block_pool)

    if base is not NaiveBlockAllocator:
        CheckedNaiveBlockAllocator.__name__ = f"Checked{base.__name__}"
        CheckedNaiveBlockAllocator.__qualname__ = f"Checked{base.__name__}"
    _add_contracts(CheckedNaiveBlockAllocator, base, NAIVE, NAIVE_ADAPTERS)
    return _invariant(CheckedNaiveBlockAllocator)


def _build_cpu_gpu(prefix_cls: type, naive_cls: type) -> Type[CpuGpuBlockAllocator]:
    import icontract

    from prefixcache.impl.interfaces import Device

    def swap_snapshot(self: Any, blocks: Any, src_device: Any, dst_device: Any) -> Any:
        src = self._allocators.get(src_device)
        dst = self._allocators.get(dst_device)
        checkers = (getattr(src, "_pc", None), getattr(dst, "_pc", None))
        if checkers[0] is None or checkers[1] is None or src is dst:
            return None
        src_ids = [checkers[0].id_of(b) for b in blocks]
        keys = [checkers[1].key_of(b) for b in blocks]
        return (checkers, checkers[0].state(), checkers[1].state(), src_ids, keys, list(blocks))

    def swap_post(OLD: Any, result: Any) -> bool:
        snap = OLD.swap
        if snap is None:
            return True
        (src_c, dst_c), old_src, old_dst, src_ids, keys, blocks = snap
        return C.post_swap(old_src, src_c.state(), old_dst, dst_c.state(), result,
                           src_ids, keys, [b.block_id for b in blocks])

    class CheckedCpuGpuBlockAllocator(CpuGpuBlockAllocator):
        """CpuGpuBlockAllocator over checked per-device allocators, with the
        swap contract checked across both devices."""

        @staticmethod
        def create(allocator_type: str, num_gpu_blocks: int, num_cpu_blocks: int,
                   block_size: int, *, hash_algo: Any = "builtin",
                   verify_content: bool = False) -> Any:
            """As ``CpuGpuBlockAllocator.create``, with checked allocators."""
            plain = CpuGpuBlockAllocator.create(allocator_type, num_gpu_blocks, num_cpu_blocks,
                                                block_size, hash_algo=hash_algo,
                                                verify_content=verify_content)
            made: Dict[Any, Any] = {}
            for device in (Device.GPU, Device.CPU):
                ids = sorted(plain._allocators[device].all_block_ids)  # type: ignore[attr-defined]
                if allocator_type == "naive":
                    made[device] = naive_cls(create_block=NaiveBlock, num_blocks=len(ids),
                                             block_size=block_size, block_ids=ids)
                else:
                    made[device] = prefix_cls(num_blocks=len(ids), block_size=block_size,
                                              block_ids=ids, hash_algo=hash_algo,
                                              verify_content=verify_content)
            return CheckedCpuGpuBlockAllocator(cpu_block_allocator=made[Device.CPU],
                                               gpu_block_allocator=made[Device.GPU])

        @icontract.snapshot(swap_snapshot, name="swap")
        @icontract.ensure(swap_post, description="the contract of swap")
        def swap(self, blocks: List[Any], src_device: Any, dst_device: Any) -> Dict[int, int]:
            """Swap as the impl does, under the swap contract."""
            return super().swap(blocks, src_device, dst_device)

    return CheckedCpuGpuBlockAllocator


CheckedPrefixCachingBlockAllocator: Type[PrefixCachingBlockAllocator]
CheckedNaiveBlockAllocator: Type[NaiveBlockAllocator]
CheckedCpuGpuBlockAllocator: Type[CpuGpuBlockAllocator]

if CONTRACTS_ENABLED:
    CheckedPrefixCachingBlockAllocator = _checked_prefix(PrefixCachingBlockAllocator)
    CheckedNaiveBlockAllocator = _checked_naive(NaiveBlockAllocator)
    CheckedCpuGpuBlockAllocator = _build_cpu_gpu(CheckedPrefixCachingBlockAllocator,
                                                 CheckedNaiveBlockAllocator)
else:
    CheckedPrefixCachingBlockAllocator = PrefixCachingBlockAllocator
    CheckedNaiveBlockAllocator = NaiveBlockAllocator
    CheckedCpuGpuBlockAllocator = CpuGpuBlockAllocator


def checker_of(allocator: Any) -> Optional[Checker]:
    """Return the :class:`Checker` a checked allocator carries, or None."""
    return getattr(allocator, "_pc", None)


__all__ = [
    "CONTRACTS_ENABLED",
    "CheckedCpuGpuBlockAllocator",
    "CheckedNaiveBlockAllocator",
    "CheckedPrefixCachingBlockAllocator",
    "Checker",
    "NAIVE_ADAPTERS",
    "PREFIX_ADAPTERS",
    "checked_class",
    "checker_of",
    "contracts_enabled",
    "describe_change",
]
