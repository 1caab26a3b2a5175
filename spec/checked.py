"""Checked allocators: prefixcache.impl's allocators with the spec enforced.

``CheckedPrefixCachingBlockAllocator``, ``CheckedNaiveBlockAllocator`` and
``CheckedCpuGpuBlockAllocator`` subclass the impl's classes (and
:func:`checked_class` makes the same of any subclass of them).  Every public
method calls the impl's own method and, around the outermost call (calls the
impl makes to itself are not checked), checks what the spec says of it:

* every invariant of :mod:`prefixcache.spec.invariants` on the new state;
* that the call was allowed (``pre_X`` of :mod:`prefixcache.spec.contracts`)
  and did what ``post_X`` says, on the old and new states;
* when the call raises instead: the state is unchanged, and, unless the
  error is about the argument's shape (:data:`~prefixcache.spec.error_table.ARGUMENT_ERRORS`),
  ``pre_X`` was indeed False.

Two modes, chosen by ``PREFIXCACHE_CHECK`` (read when this module is
imported) or per class by ``checked_class(base, check=...)``:

``incremental`` (the default)
    Checks each call at the elements it touched: the ids and content keys
    its arguments and result name, the ids it may take (the first free ids
    and evictor entries, which the spec fixes), every touched id for
    ``mark_blocks_as_computed``, every cached id for a reset, and the ids
    and keys these map to, both before and after.  The old state is not
    read from the allocator but from a :class:`~prefixcache.spec.mirror.Mirror`,
    the spec's own copy of it, which takes the touched elements' new
    values once the call has met its contract.  Old and new states are
    partial states (:class:`~prefixcache.spec.state.PartialState`) over those
    elements plus the sizes of the rest (free list, evictor, cache), read in O(1),
    so the very same contracts and invariants run on them, at O(touched)
    cost (the invariants at the elements the call changed; a call that
    changed nothing leaves a state that keeps them), and a change outside
    the touched elements that changes a size is a violation of the
    contract.  ``audit()`` checks the whole state
    (every invariant, and that the allocator's state is the mirror's); it
    runs at construction, every ``PREFIXCACHE_AUDIT_EVERY`` calls (0, the
    default: never) and whenever called.  A plain wrapper, not icontract.
``full``
    With icontract: the whole abstract state is read before and after
    every call, and every invariant and contract checked on it (as a class
    invariant, a snapshot and a postcondition).  Costs grow with the pool.

Appends go through the Blocks, so the checked allocators hand out Blocks of a
checked subclass whose ``append_token_ids`` is checked the same way.
Contracts cannot see which Blocks the caller still holds, so the ownership
invariant is left to callers that know (:func:`prefixcache.spec.abstraction.ownership`).

Content keys: each checked allocator keeps a
:class:`~prefixcache.spec.abstraction.ContentLedger`, fed with every Block
passed in or handed out that may carry new content, so every cached hash
has a name.

Checking is on unless ``PREFIXCACHE_CONTRACTS=0`` or Python runs with
``-O``; when off, the three names are the impl's classes themselves, so the
cost is zero.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from types import MethodType
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Set, Tuple, Type

from prefixcache.impl.cpu_gpu_block_allocator import CpuGpuBlockAllocator
from prefixcache.impl.errors import PrefixCacheError
from prefixcache.impl.naive_block import NaiveBlock, NaiveBlockAllocator
from prefixcache.impl.prefix_caching_block import PrefixCachingBlockAllocator

from . import contracts as C
from .abstraction import (
    AbstractionError,
    ContentLedger,
    Part,
    abstract_state,
    chain_of,
    content_key_of,
)
from .error_table import ARGUMENT_ERRORS, NAIVE, PREFIX
from .invariants import check_all
from .mirror import Mirror
from .operations import OPERATIONS, operation
from .pure import chain_key, contracts_enabled, unchecked
from .state import AbstractState, BlockId, ContentKey, HashedKey

#: :func:`.pure.chain_key` without its runtime contract (once per new key)
_chain_key = unchecked(chain_key)

FULL = "full"
INCREMENTAL = "incremental"
MODES = (INCREMENTAL, FULL)


def check_mode() -> str:
    """Return the mode ``PREFIXCACHE_CHECK`` names (``incremental`` when
    unset).  Raises ValueError for another value."""
    mode = os.environ.get("PREFIXCACHE_CHECK", INCREMENTAL).strip() or INCREMENTAL
    if mode not in MODES:
        raise ValueError(f"PREFIXCACHE_CHECK must be one of {', '.join(MODES)}, not {mode!r}")
    return mode


def audit_every() -> int:
    """Return ``PREFIXCACHE_AUDIT_EVERY`` (0 when unset): in incremental
    mode, a full audit after every that many checked calls (0: never).
    Raises ValueError for a value that is not a whole number >= 0."""
    text = os.environ.get("PREFIXCACHE_AUDIT_EVERY", "0").strip() or "0"
    if not text.isdigit():
        raise ValueError(f"PREFIXCACHE_AUDIT_EVERY must be a whole number >= 0, not {text!r}")
    return int(text)


CONTRACTS_ENABLED: bool = contracts_enabled()
"""Whether this import made checked classes (fixed at import time)."""


def describe_change(old: AbstractState, new: AbstractState) -> str:
    """Return the fields of the abstract state that differ, old -> new."""
    parts = []
    for name in type(old).__dataclass_fields__:
        a, b = getattr(old, name), getattr(new, name)
        if a != b:
            parts.append(f"{name}: {a!r} -> {b!r}")
    return "; ".join(parts) or "no change"


PreFn = Callable[[AbstractState], bool]
PostFn = Callable[[AbstractState, AbstractState, Any], bool]
FinishFn = Callable[[Any], Any]


@dataclass
class Bound:
    """One call's contract over abstract states (``pre``, ``post``, and
    ``finish``, which turns the call's result into the contract's), and the
    elements it touches that its arguments name: ``ids`` and ``keys`` (None
    entries ignored), ``takes`` (at most how many ids it takes),
    ``result_ids`` (the finished result is an id), ``new_blocks`` (Blocks
    whose id or content the call may change), ``all_touched`` (it concerns
    every touched id) and ``reset`` (every cached id)."""

    pre: PreFn
    post: PostFn
    finish: FinishFn
    ids: Tuple[BlockId, ...] = ()
    keys: Tuple[Optional[ContentKey], ...] = ()
    takes: int = 0
    result_ids: bool = False
    new_blocks: Tuple[Any, ...] = ()
    all_touched: bool = False
    reset: bool = False


Adapter = Callable[["Checker", Mapping[str, Any]], Bound]


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


Binder = Callable[[Tuple[Any, ...], Mapping[str, Any]], Dict[str, Any]]


def _binder(fn: Callable[..., Any]) -> Binder:
    """A fast ``inspect.signature(fn).bind(...)`` with defaults applied, for
    a function of plain positional-or-keyword parameters."""
    params = list(inspect.signature(fn).parameters.values())
    names = [p.name for p in params]
    defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}

    def bind(args: Tuple[Any, ...], kwargs: Mapping[str, Any]) -> Dict[str, Any]:
        bound = dict(defaults)
        bound.update(zip(names, args))
        bound.update(kwargs)
        if len(args) > len(names) or len(bound) != len(names):
            inspect.signature(fn).bind(*args, **kwargs)  # raises the call's TypeError
        return bound

    return bind


class Checker:
    """The checking machinery one checked allocator carries (as ``_pc``):
    its ledger, call depth, mode, and the mirror (incremental) or the last
    snapshot and cached abstract states (full)."""

    def __init__(self, allocator: Any, adapters: Mapping[str, Adapter],
                 mode: str = FULL) -> None:
        """Attach to ``allocator``; ``adapters`` map its operations to contracts."""
        self.allocator = allocator
        self.adapters = adapters
        self.mode = mode
        self.ledger = ContentLedger()
        self.depth = 0
        self.record: Optional[Record] = None
        self.cache: Optional[Tuple[str, AbstractState]] = None
        self.failure = ""
        self.mirror: Optional[Mirror] = None
        self.calls = 0
        self.audit_every = audit_every()
        self._readers: Optional[Tuple[Callable[[Any], Any], Callable[[Any], int],
                                      Optional[Callable[[BlockId], Any]]]] = None
        self._signatures: Dict[Any, inspect.Signature] = {}
        self._binders: Dict[Any, Callable[..., Dict[str, Any]]] = {}

    # -- reading ---------------------------------------------------------------

    def state(self, part: Optional[Part] = None) -> AbstractState:
        """The allocator's abstract state now (whole, or with ``part`` at those
        elements), read through the undecorated ``all_block_ids`` and
        ``get_num_free_blocks`` of the instance's class (so no contract runs
        inside the reading)."""
        a = self.allocator
        if self._readers is None:
            cls = type(a)
            ask = getattr(cls, "block_is_computed", None)
            self._readers = (inspect.unwrap(cls.all_block_ids.fget),
                             inspect.unwrap(cls.get_num_free_blocks),
                             None if ask is None else MethodType(inspect.unwrap(ask), a))
        ids_of, free_of, computed = self._readers
        self.depth += 1         # the readers may call checked methods: they run plain
        try:
            if part is not None:
                m = self.mirror
                assert m is not None
                return abstract_state(a, ledger=self.ledger, reported_free=free_of(a),
                                      block_ids=m.block_ids, part=part,
                                      reuse=(m.blocks, m.entries), computed=computed)
            ids, free = ids_of(a), free_of(a)
            return abstract_state(a, ledger=self.ledger, reported_free=free, block_ids=ids,
                                  computed=computed)
        finally:
            self.depth -= 1

    def _checked_state(self, when: str, part: Optional[Part] = None) -> AbstractState:
        """``state(part)``, with an unnameable content turned into a violation."""
        try:
            return self.state(part)
        except AbstractionError as exc:
            import icontract

            self.cache = None
            self.mirror = None
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
        prefix = self.prefix_of(getattr(block, "prev_block", None))
        if prefix is None:
            return content_key_of(block)
        return HashedKey(_chain_key(prefix, getattr(block, "extra_hash", None), block.token_ids))

    def prefix_of(self, prev_block: Any) -> Optional[ContentKey]:
        """The content key a new block chained after ``prev_block`` extends
        (``()`` for a first block), or None when ``prev_block`` is not hashed
        (then nothing after it is).  The key the ledger names for its hash
        when it has one (each hash is named once, when first shown, and a
        second content for it is a collision), else spelled from its chain."""
        if prev_block is None:
            return ()
        h = getattr(prev_block, "content_hash", None)
        if h is None:
            return None
        return self.ledger.name(h) or content_key_of(prev_block)

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
            prefix = HashedKey(_chain_key(prefix, extra_hash, tuple(tokens)))
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

    def observe_new(self, blocks: Iterable[Any]) -> None:
        """Feed the ledger the hash and key of each hashed Block of ``blocks``
        (Blocks that may carry content new to it), first block first: O(its
        key) each, its chain's earlier blocks named by the ledger already."""
        for b in blocks:
            h = getattr(b, "content_hash", None) if self.owns(b) else None
            if h is not None:
                key = self.key_of(b)
                if key is not None:
                    self.ledger.observe(h, key)

    # -- invariants (full mode) ------------------------------------------------

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

    # -- contracts (full mode) -------------------------------------------------

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
        return self._record(op, old, bound.arguments)

    def _record(self, op: str, old: AbstractState, arguments: Mapping[str, Any]) -> Record:
        """Keep in ``record`` what the postcondition of ``op`` needs."""
        b = self.adapters[op](self, arguments)
        self.record = Record(op=op, old=old, pre=b.pre(old), post=b.post, finish=b.finish)
        return self.record

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
                rec, self.record = self.record, None
                self.cache = None
                if rec is not None:
                    new = self._checked_state(f"{rec.op} raised {exc!r}")
                    self.judge_error(rec.op, rec.old, new, rec.pre, exc)
            raise
        self.depth -= 1
        self.observe(result, *args, *kwargs.values())
        return result

    def judge_error(self, op: str, old: AbstractState, new: AbstractState, pre: bool,
                    exc: BaseException) -> None:
        """The call raised ``exc``: the state must be unchanged, and the
        precondition must have been False (unless the error is about the
        argument's shape).  Raises ViolationError otherwise."""
        import icontract

        if new != old:
            self.mirror = None
            raise icontract.ViolationError(
                f"{op} raised {exc!r} but changed the state: {describe_change(old, new)}"
            ) from exc
        checked = isinstance(exc, (PrefixCacheError, NotImplementedError))
        if pre and checked and not isinstance(exc, ARGUMENT_ERRORS):
            self.mirror = None
            raise icontract.ViolationError(
                f"{op} raised {exc!r} although its precondition holds"
            ) from exc

    def post(self, rec: Optional[Record], result: Any) -> bool:
        """The postcondition of the outermost call (True for nested calls)."""
        if rec is None:
            return True
        self.record = None
        new = self._checked_state(f"after {rec.op}")
        self.failure = self.judge(rec.op, rec.old, new, rec.pre, rec.post, result, rec.finish)
        if self.failure:
            return False
        self.cache = ("post", new)
        return True

    def judge(self, op: str, old: AbstractState, new: AbstractState, pre: bool,
              post: PostFn, result: Any, finish: FinishFn) -> str:
        """Why the successful call ``op`` broke its contract, or ""."""
        if not pre:
            return f"{op} succeeded although its precondition does not hold"
        if not post(old, new, finish(result)):
            failure = (f"{op} broke its postcondition (result {result!r}): "
                       f"{describe_change(old, new)}")
            if self.ledger.aliases:
                failure += (" [note: one content key was seen under two hashes "
                            "(a chain mixing extra hashes); the key cannot tell them apart]")
            return failure
        return ""

    # -- incremental mode ------------------------------------------------------

    def start(self) -> None:
        """Take the allocator's whole state as the mirror, after a full audit
        of it (at construction, and after a violation)."""
        import icontract

        whole = self._checked_state("audit")
        violated = check_all(whole)
        if violated:
            raise icontract.ViolationError(
                f"invariants violated: {', '.join(violated)}; state: {whole!r}")
        self.mirror = Mirror(whole)

    def audit(self) -> None:
        """The full check: every invariant on the allocator's whole state, and
        that state equal to the mirror's (O(pool size)).  Raises
        ViolationError naming what differs."""
        import icontract

        if self.mirror is None:
            self.start()
            return
        whole = self._checked_state("audit")
        violated = check_all(whole)
        expected = self.mirror.state()
        if violated or not C.agrees(expected, whole, frozenset()):
            self.mirror = None
            raise icontract.ViolationError(
                f"audit: invariants violated: {', '.join(violated) or 'none'}; the state "
                f"differs from the spec's: {describe_change(expected, whole)}")

    def elements(self, bound: Bound, result: Any, blocks: Optional[List[Any]]) -> Part:
        """The ids and keys the call touched: those its arguments and result
        name (``blocks``: the Blocks it may have changed, from its arguments
        and result; None when it raised), the ids it may take, the touched
        or cached ids it concerns, and the ids and keys these map to before
        (in the mirror) and after (in the allocator)."""
        m = self.mirror
        assert m is not None
        a = self.allocator
        ids: Set[BlockId] = set(bound.ids)
        name, hash_of = self.ledger.names.get, self.ledger.hashes.get
        keys: Set[ContentKey] = set()
        for k in bound.keys:     # as the ledger's own objects (equal: quick to compare)
            if k is not None:
                h = hash_of(k)
                keys.add(k if h is None else name(h) or k)
        if blocks is not None:
            if bound.result_ids or bound.finish in (_ids_of_result, _id_of_result):
                ids.update(_ids_in(bound.finish(result)))
            for b in blocks:
                i = getattr(b, "block_id", None)
                if type(i) is int:
                    ids.add(i)
                elif i is not None:
                    ids.update(_ids_in(i))
                h = getattr(b, "content_hash", None)
                k = name(h) if h is not None else None
                if k is not None:
                    keys.add(k)
        if bound.takes:
            free, victims = m.head(bound.takes)
            ids.update(free)
            ids.update(victims)
        if bound.all_touched:
            ids.update(m.touched)
            ids.update(getattr(a, "_touched_blocks", ()))
        table = getattr(getattr(a, "evictor", None), "free_table", {})
        if bound.reset:
            ids.update(m.blocks if not m.in_use else (next(iter(m.in_use)),))
            ids.update(table)
        cached = getattr(a, "_cached_blocks", {})
        mirror_blocks, mirror_cached = m.blocks.get, m.cached.get
        todo_ids, todo_keys = list(ids), list(keys)
        while todo_ids or todo_keys:
            for i in todo_ids:
                b = mirror_blocks(i)
                if b is not None and b.content is not None and b.content not in keys:
                    keys.add(b.content)
                    todo_keys.append(b.content)
                meta = table.get(i)
                if meta is not None:
                    k = name(meta.content_hash)
                    if k is not None and k not in keys:
                        keys.add(k)
                        todo_keys.append(k)
            todo_ids = []
            for k in todo_keys:
                j = mirror_cached(k)
                if j is not None and j not in ids:
                    ids.add(j)
                    todo_ids.append(j)
                h = hash_of(k)
                j = cached.get(h) if h is not None else None
                if j is not None and j not in ids:
                    ids.add(j)
                    todo_ids.append(j)
            todo_keys = []
        known = m.block_ids
        return (frozenset([i for i in ids if i in known]), frozenset(keys))

    def run(self, op: str, fn: Callable[..., Any], args: Tuple[Any, ...],
            kwargs: Mapping[str, Any]) -> Any:
        """Call the impl's method ``fn`` (``args[0]`` the allocator) and
        check the call incrementally (see the module doc)."""
        bind = self._binders.get(fn)
        if bind is None:
            bind = self._binders[fn] = _binder(fn)
        return self.run_bound(op, lambda: fn(*args, **kwargs), bind(args, kwargs))

    def run_bound(self, op: str, call: Callable[[], Any], arguments: Mapping[str, Any]) -> Any:
        """``call()``, the operation ``op`` with ``arguments``, checked
        incrementally."""
        if self.mirror is None:
            self.start()
        bound = self.adapters[op](self, arguments)
        self.depth += 1
        try:
            result = call()
        except BaseException as exc:
            self.depth -= 1
            part = self.elements(bound, None, None)
            old = self.mirror.part(part)  # type: ignore[union-attr]
            self.judge_error(op, old, self._checked_state(f"{op} raised {exc!r}", part),
                             bound.pre(old), exc)
            raise
        self.depth -= 1
        ledger = self.ledger
        collisions = len(ledger.collisions)
        blocks = [*bound.new_blocks, *_blocks_in(result)]
        if blocks:
            self.observe_new(blocks)
        part = self.elements(bound, result, blocks)
        mirror = self.mirror
        assert mirror is not None
        old = mirror.part(part)
        new = self._checked_state(f"after {op}", part)
        failure = self.judge(op, old, new, bound.pre(old), bound.post, result, bound.finish)
        changed = new.changed(old)  # type: ignore[attr-defined]
        if not failure:     # an unchanged state keeps the invariants the mirror's held
            violated = [] if new == old else check_all(
                new.narrowed(*changed))  # type: ignore[attr-defined]
            if ledger.collisions or ledger.conflicts:
                violated += ["content_collision: " + line
                             for line in ledger.anomalies()[collisions:]]
            if violated:
                failure = (f"invariants violated at the elements {op} touched: "
                           f"{', '.join(violated)}; state: {new!r}")
        if failure:
            import icontract

            self.mirror = None
            raise icontract.ViolationError(failure)
        a = self.allocator
        free = getattr(getattr(a, "_hashless_allocator", a), "_free_block_indices", ())
        mirror.commit(old, new, free, changed)  # type: ignore[arg-type]
        self.calls += 1
        if self.audit_every and self.calls % self.audit_every == 0:
            self.audit()
        return result

    def run_append(self, block: Any, token_ids: Any, fn: Callable[[Any], None]) -> None:
        """Check an append made through a Block like an outermost call."""
        import icontract

        if self.depth > 0:
            fn(token_ids)
            return
        arguments = {"block": block, "token_ids": token_ids}
        if self.mode == INCREMENTAL:
            self.run_bound("append_token_ids", lambda: fn(token_ids), arguments)
            return
        self.cache = None
        rec = self._record("append_token_ids", self.state(), arguments)
        self.call(fn, (token_ids,), {})
        self.observe(block)
        try:
            if not (self.post(rec, None) and self.invariants_hold()):
                raise icontract.ViolationError(self.failure)
        finally:
            self.cache = None


def _ids_in(value: Any) -> List[BlockId]:
    items = value if isinstance(value, (list, tuple)) else [value]
    return [i for i in items if type(i) is int]


def _blocks_in(value: Any) -> List[Any]:
    """The items of a result that may be Blocks (not ids, hashes or pairs)."""
    if isinstance(value, (list, tuple)):
        return [b for b in value if type(b) not in (int, tuple)]
    return [value] if hasattr(value, "content_hash") else []


# ==========================================================================
# adapters: concrete arguments -> the contract over abstract states, and the
# elements the call touches


def _ids(*ids: Any) -> Tuple[BlockId, ...]:
    return tuple(i for i in ids if type(i) is int)


def _bind(pre: Optional[Callable[..., bool]], post: Callable[..., bool], *args: Any,
          finish: FinishFn = _same, **elements: Any) -> Bound:
    """The contract ``pre``/``post`` (``pre`` None: it always succeeds) with
    the abstract arguments ``args`` after the states, and its elements."""
    return Bound(_no_pre if pre is None else lambda s: pre(s, *args),
                 lambda o, n, r: post(o, n, r, *args), finish, **elements)


def _fixed(pre: Optional[PreFn], post: PostFn, finish: FinishFn = _same,
           **elements: Any) -> Adapter:
    """The adapter of an operation whose contract takes no argument."""
    bound = Bound(_no_pre if pre is None else pre, post, finish, **elements)
    return lambda c, a: bound


def _a_allocate_immutable(c: Checker, a: Mapping[str, Any]) -> Bound:
    (key,) = c.new_keys(a["prev_block"], [a["token_ids"]], a["extra_hash"])
    return _bind(C.pre_allocate_immutable_block, C.post_allocate_immutable_block, key,
                 finish=_id_of_result, keys=(key,), takes=1)


def _a_allocate_immutables(c: Checker, a: Mapping[str, Any]) -> Bound:
    lists = a["block_token_ids"]
    keys = c.new_keys(a["prev_block"], lists if isinstance(lists, (list, tuple)) else [],
                      a["extra_hash"])
    return _bind(C.pre_allocate_immutable_blocks, C.post_allocate_immutable_blocks, keys,
                 finish=_ids_of_result, keys=tuple(keys), takes=len(keys))


def _a_free(c: Checker, a: Mapping[str, Any]) -> Bound:
    i = c.id_of(a["block"])
    return _bind(C.pre_free, C.post_free, i, ids=_ids(i))


def _a_free_block_id(c: Checker, a: Mapping[str, Any]) -> Bound:
    i = a["block_id"] if type(a["block_id"]) is int else None
    return _bind(C.pre_free_block_id, C.post_free_block_id, i, ids=_ids(i))


def _a_fork(c: Checker, a: Mapping[str, Any]) -> Bound:
    last = a["last_block"]
    ids = [c.id_of(b) for b in chain_of(last)] if c.owns(last) else [None]
    return _bind(C.pre_fork, C.post_fork, ids, finish=_ids_of_result, ids=_ids(*ids))


def _a_cow(c: Checker, a: Mapping[str, Any]) -> Bound:
    i = c.id_of(a["block"])
    return _bind(C.pre_cow_block_if_not_appendable, C.post_cow_block_if_not_appendable, i,
                 ids=_ids(i), takes=1, result_ids=True)


def _a_promote(c: Checker, a: Mapping[str, Any]) -> Bound:
    block = a["block"]
    i = c.id_of(block)
    key = c.key_of(block) if c.owns(block) else None
    return _bind(C.pre_promote_to_immutable_block, C.post_promote_to_immutable_block, i, key,
                 ids=_ids(i), keys=(key,), result_ids=True, new_blocks=(block,))


def _append_args(c: Checker, block: Any, token_ids: Any) -> Tuple[Optional[BlockId], int, int]:
    i = c.id_of(block)
    room = int(getattr(block, "num_empty_slots", 0))
    n = len(token_ids) if isinstance(token_ids, (list, tuple)) else 0
    return i, room, n


def _a_append(c: Checker, a: Mapping[str, Any]) -> Bound:
    block, tokens = a["block"], a["token_ids"]
    i, room, n = _append_args(c, block, tokens)
    immutable = bool(block.computed) or block.content_hash is not None
    full_key: Optional[ContentKey] = None
    if i is not None and n == room and n > 0:
        prefix = c.prefix_of(block.prev_block)
        if prefix is not None:
            full_key = HashedKey(_chain_key(prefix, block.extra_hash,
                                            (*block.token_ids, *tokens)))
    return Bound(lambda s: C.pre_append_token_ids(s, i, immutable, room, n, full_key),
                 lambda o, n_, r: C.post_append_token_ids(o, n_, block.block_id, i, immutable,
                                                          room, n, full_key),
                 _same, ids=_ids(i), keys=(full_key,), takes=1, new_blocks=(block,))


def _a_naive_append(c: Checker, a: Mapping[str, Any]) -> Bound:
    block, tokens = a["block"], a["token_ids"]
    i, room, n = _append_args(c, block, tokens)
    return Bound(lambda s: C.pre_naive_append_token_ids(s, i, room, n),
                 lambda o, n_, r: C.post_naive_append_token_ids(o, n_, block.block_id, i, room, n),
                 _same, ids=_ids(i), takes=1, new_blocks=(block,))


def _a_mark_accessed(c: Checker, a: Mapping[str, Any]) -> Bound:
    ids = list(a["block_ids"]) if isinstance(a["block_ids"], (list, tuple)) else []
    return _bind(C.pre_mark_blocks_as_accessed, C.post_mark_blocks_as_accessed, ids, a["now"],
                 ids=_ids(*ids))


def _a_mark_computed(c: Checker, a: Mapping[str, Any]) -> Bound:
    return _bind(None, C.post_mark_blocks_as_computed, a["block_ids"], all_touched=True)


def _a_common(c: Checker, a: Mapping[str, Any]) -> Bound:
    lists = [list(x) for x in a["computed_seq_block_ids"]]
    return _bind(None, C.post_get_common_computed_block_ids, lists)


def _a_naive_common(c: Checker, a: Mapping[str, Any]) -> Bound:
    return _bind(None, C.post_naive_get_common_computed_block_ids, a["computed_seq_block_ids"])


def _a_full_touched(c: Checker, a: Mapping[str, Any]) -> Bound:
    entries = [(bool(b.is_full), c.key_of(b) if b.is_full else None) for b in a["blocks"]]
    return _bind(None, C.post_get_num_full_blocks_touched, entries,
                 keys=tuple(k for _, k in entries))


def _a_naive_full_touched(c: Checker, a: Mapping[str, Any]) -> Bound:
    entries = [(id(b), bool(b.is_full)) for b in a["blocks"]]
    return _bind(None, C.post_naive_get_num_full_blocks_touched, entries)


def _a_find_prefix(c: Checker, a: Mapping[str, Any]) -> Bound:
    keys = list(map(c.ledger.names.get, a["block_hashes"]))
    return _bind(None, C.post_find_cached_blocks_prefix, keys, finish=len, keys=tuple(keys))


def _a_swap_out(c: Checker, a: Mapping[str, Any]) -> Bound:
    seen: set[int] = set()
    ids: List[Optional[BlockId]] = []
    for b in a["blocks"]:
        # a Block listed again is detached by then: it held one reference
        ids.append(None if id(b) in seen else c.id_of(b))
        seen.add(id(b))
    return _bind(C.pre_swap_out, C.post_swap_out, ids, ids=_ids(*ids))


def _a_swap_in(c: Checker, a: Mapping[str, Any]) -> Bound:
    blocks = list(a["blocks"])
    keys = [c.key_of(b) for b in blocks]
    distinct = len({id(b) for b in blocks}) == len(blocks)
    return Bound(lambda s: C.pre_swap_in(s, keys, distinct),
                 lambda o, n, r: C.post_swap_in(o, n, [b.block_id for b in blocks], keys),
                 _same, keys=tuple(keys), takes=len(blocks), new_blocks=tuple(blocks))


def _a_naive_swap_in(c: Checker, a: Mapping[str, Any]) -> Bound:
    blocks = list(a["blocks"])
    distinct = len({id(b) for b in blocks}) == len(blocks)
    return Bound(lambda s: C.pre_naive_swap_in(s, len(blocks), distinct),
                 lambda o, n, r: C.post_naive_swap_in(o, n, [b.block_id for b in blocks],
                                                      len(blocks)),
                 _same, takes=len(blocks), new_blocks=tuple(blocks))


def _a_naive_allocate_immutable(c: Checker, a: Mapping[str, Any]) -> Bound:
    tokens = a["token_ids"]
    fits = isinstance(tokens, (list, tuple)) and len(tokens) <= c.allocator._block_size
    return Bound(lambda s: C.pre_naive_allocate_immutable_block(s, fits),
                 C.post_naive_allocate_immutable_block, _id_of_result, takes=1)


def _a_naive_allocate_immutables(c: Checker, a: Mapping[str, Any]) -> Bound:
    lists = a["block_token_ids"]
    lists = list(lists) if isinstance(lists, (list, tuple)) else []
    size = c.allocator._block_size
    fits = all(isinstance(t, (list, tuple)) and len(t) <= size for t in lists)
    return Bound(lambda s: C.pre_naive_allocate_immutable_blocks(s, len(lists), fits),
                 lambda o, n, r: C.post_naive_allocate_immutable_blocks(o, n, r, len(lists)),
                 _ids_of_result, takes=len(lists))


def _a_num_free(c: Checker, a: Mapping[str, Any]) -> Bound:
    ok = a.get("device") is None
    return Bound(lambda s: ok, C.post_get_num_free_blocks, _same)


def _a_physical(c: Checker, a: Mapping[str, Any]) -> Bound:
    i = a["absolute_id"]
    return _bind(C.pre_get_physical_block_id, C.post_get_physical_block_id, i, ids=_ids(i))


def _a_is_block_cached(c: Checker, a: Mapping[str, Any]) -> Bound:
    block = a["block"]
    key = c.key_of(block) if c.owns(block) else None
    return _bind(C.pre_is_block_cached, C.post_is_block_cached, key, keys=(key,))


def _a_block_is_computed(c: Checker, a: Mapping[str, Any]) -> Bound:
    i = a["block_id"]
    return _bind(C.pre_block_is_computed, C.post_block_is_computed, i, ids=_ids(i))


_COMMON: Dict[str, Adapter] = {
    "allocate_mutable_block": _fixed(C.pre_allocate_mutable_block,
                                     C.post_allocate_mutable_block, _id_of_result, takes=1),
    "free": _a_free,
    "fork": _a_fork,
    "cow_block_if_not_appendable": _a_cow,
    "clear_copy_on_writes": _fixed(C.pre_clear_copy_on_writes, C.post_clear_copy_on_writes),
    "swap_out": _a_swap_out,
    "get_num_free_blocks": _a_num_free,
    "get_num_total_blocks": _fixed(None, C.post_get_num_total_blocks),
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
    "reset_prefix_cache": _fixed(C.pre_reset_prefix_cache, C.post_reset_prefix_cache,
                                 reset=True),
    "get_prefix_cache_hit_rate": _fixed(None, C.post_get_prefix_cache_hit_rate),
    "block_is_computed": _a_block_is_computed,
    "is_block_cached": _a_is_block_cached,
}
"""Operation -> adapter for the prefix-caching allocator."""

NAIVE_ADAPTERS: Dict[str, Adapter] = {
    **_COMMON,
    "allocate_immutable_block": _a_naive_allocate_immutable,
    "allocate_immutable_blocks": _a_naive_allocate_immutables,
    "promote_to_immutable_block": _fixed(lambda s: False, lambda o, n, r: False),
    "append_token_ids": _a_naive_append,
    "free_block_id": _a_free_block_id,
    "mark_blocks_as_accessed": _fixed(None, C.post_naive_query_no_change),
    "mark_blocks_as_computed": _fixed(None, C.post_naive_query_no_change),
    "get_common_computed_block_ids": _a_naive_common,
    "get_num_full_blocks_touched": _a_naive_full_touched,
    "find_cached_blocks_prefix": _fixed(
        None, lambda o, n, r: C.post_naive_find_cached_blocks_prefix(o, n, r, []), len),
    "swap_in": _a_naive_swap_in,
    "reset_prefix_cache": _fixed(None, C.post_naive_reset_prefix_cache),
    "get_prefix_cache_hit_rate": _fixed(None, C.post_naive_get_prefix_cache_hit_rate),
}
"""Operation -> adapter for the naive allocator."""


# ==========================================================================
# building the checked classes


def _checked_method(name: str, fn: Callable[..., Any], mode: str) -> Callable[..., Any]:
    """A method that calls ``fn`` (the impl's) under the contract of ``name``:
    in ``full`` mode through icontract, in ``incremental`` mode through
    :meth:`Checker.run`."""
    import functools

    if mode == INCREMENTAL:
        @functools.wraps(fn)
        def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
            c = self._pc
            if c.depth:
                return fn(self, *args, **kwargs)
            return c.run(name, fn, (self, *args), kwargs)

        return checked

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


def _add_contracts(cls: type, base: type, plain: type, kind: str,
                   adapters: Mapping[str, Adapter], mode: str) -> type:
    """Name ``cls`` after ``base`` unless that is the impl's ``plain`` class;
    give it a checked method per allocator method of the table of
    operations of ``kind`` (not a property; the Block's ``append_token_ids``
    is checked by the checked Block), each of which must have an adapter
    here, and the adapters must name nothing else; return it, with the
    icontract class invariant in ``full`` mode."""
    names = [op.name for op in OPERATIONS if kind in op.allocators and not op.attribute]
    methods = [n for n in names if operation(n).owner == "allocator"]
    unknown = sorted(set(adapters) - set(names))
    lacking = sorted(set(methods) - set(adapters))
    if unknown or lacking:
        raise RuntimeError(f"the {kind} adapters and the table of operations differ: "
                           f"no such operation {unknown}, no adapter for {lacking}")
    if base is not plain:
        cls.__name__ = cls.__qualname__ = f"Checked{base.__name__}"
    for name in methods:
        setattr(cls, name, _checked_method(name, getattr(base, name), mode))
    if mode != FULL:
        return cls
    import icontract

    return icontract.invariant(lambda self: self._pc.invariants_hold(),
                               description="the spec's invariants",
                               error=lambda self: icontract.ViolationError(self._pc.failure))(cls)


def _construct(self: Any, adapters: Mapping[str, Adapter], mode: str,
               init: Callable[[], None]) -> None:
    """Attach a Checker to the new allocator ``self`` and run ``init`` (the
    impl's constructor) unchecked; in incremental mode, then audit it."""
    self._pc = Checker(self, adapters, mode)
    self._pc.depth = 1
    try:
        init()
    finally:
        self._pc.depth = 0
    if mode == INCREMENTAL:
        self._pc.start()


_CHECKED_BLOCKS: Dict[type, type] = {}


def _checked_block(block: Any) -> Any:
    """``block``, its class now a subclass of its own whose
    ``append_token_ids`` is checked by its allocator (the allocator's own
    Block class, faults included, is kept)."""
    cls = type(block)
    checked = _CHECKED_BLOCKS.get(cls)
    if checked is None:
        def append_token_ids(self: Any, token_ids: List[int]) -> None:
            """Append as the Block's class does, under the append contract."""
            checker = getattr(self._allocator, "_pc", None)
            if checker is None:
                cls.append_token_ids(self, token_ids)
            else:
                checker.run_append(self, token_ids,
                                   lambda tokens: cls.append_token_ids(self, tokens))

        checked = _CHECKED_BLOCKS[cls] = type(f"Checked{cls.__name__}", (cls,), {
            "__slots__": (), "append_token_ids": append_token_ids,
            "__doc__": f"A {cls.__name__} whose appends are checked by its allocator."})
    block.__class__ = checked
    return block


def checked_class(base: type, check: Optional[str] = None) -> type:
    """Return a checked subclass of ``base``, a subclass of prefixcache.impl's
    ``PrefixCachingBlockAllocator`` or ``NaiveBlockAllocator`` (for example
    one under development, or a deliberately broken one in a test): every
    public operation of the spec is checked around ``base``'s own method,
    in the mode ``check`` (``incremental`` or ``full``; default
    ``PREFIXCACHE_CHECK``'s).  Returns ``base`` itself when contracts are
    off.  Raises TypeError for another class, ValueError for another mode."""
    mode = check_mode() if check is None else check
    if mode not in MODES:
        raise ValueError(f"check must be one of {', '.join(MODES)}, not {mode!r}")
    if not contracts_enabled():
        return base
    if issubclass(base, PrefixCachingBlockAllocator):
        return _checked_prefix(base, mode)
    if issubclass(base, NaiveBlockAllocator):
        return _checked_naive(base, mode)
    raise TypeError(f"checked_class needs a prefixcache.impl allocator class, got {base!r}")


def _audit(self: Any) -> None:
    """The full check (see :meth:`Checker.audit`)."""
    self._pc.audit()


def _checked_prefix(base: Type[PrefixCachingBlockAllocator], mode: str) -> type:
    class CheckedPrefixCachingBlockAllocator(base):  # type: ignore[valid-type,misc]
        """PrefixCachingBlockAllocator with the spec's invariants and
        contracts checked on every public call (see the module doc)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            _construct(self, PREFIX_ADAPTERS, mode, lambda: base.__init__(self, *args, **kwargs))

        def _create_block(self, *args: Any, **kwargs: Any) -> Any:
            return _checked_block(base._create_block(self, *args, **kwargs))

        audit = _audit

    return _add_contracts(CheckedPrefixCachingBlockAllocator, base, PrefixCachingBlockAllocator,
                          PREFIX, PREFIX_ADAPTERS, mode)


def _checked_naive(base: Type[NaiveBlockAllocator], mode: str) -> type:
    class CheckedNaiveBlockAllocator(base):  # type: ignore[valid-type,misc]
        """NaiveBlockAllocator with the spec's invariants and contracts
        checked on every public call (see the module doc)."""

        def __init__(self, create_block: Any, num_blocks: int, block_size: int,
                     block_ids: Optional[Iterable[int]] = None,
                     block_pool: Any = None) -> None:
            def make(*args: Any, **kwargs: Any) -> Any:
                return _checked_block(create_block(*args, **kwargs))

            _construct(self, NAIVE_ADAPTERS, mode, lambda: base.__init__(
                self, make if callable(create_block) else create_block, num_blocks,
                block_size, block_ids, block_pool))

        audit = _audit

    return _add_contracts(CheckedNaiveBlockAllocator, base, NaiveBlockAllocator, NAIVE,
                          NAIVE_ADAPTERS, mode)


def _build_cpu_gpu(prefix_cls: type, naive_cls: type) -> Type[CpuGpuBlockAllocator]:
    import icontract

    from prefixcache.impl.interfaces import Device

    def swap_snapshot(self: Any, blocks: Any, src_device: Any, dst_device: Any) -> Any:
        src = self._allocators.get(src_device)
        dst = self._allocators.get(dst_device)
        checkers = (getattr(src, "_pc", None), getattr(dst, "_pc", None))
        if checkers[0] is None or checkers[1] is None or src is dst:
            return None
        if checkers[0].mode == INCREMENTAL:   # each device checks its swap_out / swap_in
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
    CheckedPrefixCachingBlockAllocator = checked_class(PrefixCachingBlockAllocator)
    CheckedNaiveBlockAllocator = checked_class(NaiveBlockAllocator)
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
