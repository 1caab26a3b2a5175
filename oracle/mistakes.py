"""The caller-mistake catalogue as oracle rules: one provoker per row of the
error table (:data:`~prefixcache.spec.error_table.ERROR_TABLE`).

A :class:`Provoker` knows when its mistake can be made in the machine's
current state (``possible``) and makes it (``provoke``): a few valid steps
to set the stage if needed (fill the pool, fork a sequence), then the one
wrong call, all through the :class:`~prefixcache.oracle.driver.Driver`, so
the target and the model both take it and the driver judges the target:
the same exception class, the state unchanged (every live id, the free
count and, white-box, the whole abstract state and every invariant), and
the run goes on with the same allocator.  The machine's ``mistake`` rule
draws one row that applies to the target's kind and is possible now, and
labels it ``mistake:<key>`` once the model refused it with the row's class.

Some rows are not calls of the allocator:

* Blocks whose id is not managed, or holds no reference: a Block's
  ``block_id`` is set for the one step (the step's ``tamper`` argument) on
  both sides and put back afterwards, as a caller who keeps a stale Block
  object would hold it.
* Constructors (``__init__``, ``create``): a fresh allocator of the
  target's own class is built with bad arguments; the model's constructors
  take the same arguments.  The model has no hash, no content check, no
  allocator type and no pair of sub-allocators, so those arguments are
  judged here, by the error table's rule.
* ``RefCounter``, ``ReadOnlyRefCounter``, ``LRUEvictor`` and
  ``make_evictor`` (public classes of vLLM's ``block.common`` and
  ``evictor`` modules): white-box only, on the target's own ``_refcounter`` and
  ``evictor`` (the GPU allocator's for a device pair; a fresh
  ``make_evictor`` of the target's package for an allocator without an
  evictor).  The model has no such objects: the exception is read off the
  model's abstract state (an id's reference count, the evictor's entries).
* ``free_block_id``, ``is_block_cached`` and ``block_is_computed`` are
  allocator calls the model does not offer; their mistakes are read off
  the model's state the same way.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Protocol, Tuple

from hypothesis import strategies as st

from ..impl import errors as err
from ..model import DeviceModel, Model
from ..spec.error_table import CPU_GPU, ERROR_TABLE, NAIVE, PREFIX, ErrorCase
from ..spec.state import AbstractState
from .held import Seq
from .targets import naive_block_class
from .trace import Step

#: The target kind (oracle.targets.KINDS) -> the error table's allocator name.
TABLE_KIND = {"prefix": PREFIX, "naive": NAIVE, "cpu_gpu": CPU_GPU}

#: An id no allocator of the machine manages.
UNKNOWN_ID = 10_000
#: An extra hash the machine never uses, so that its content is never cached.
FRESH_EXTRA = 12_345
NOT_A_BLOCK = {"raw": "not a block"}


class OracleError(RuntimeError):
    """A provoker made a call that is not a mistake: a bug of the oracle."""


class Driver(Protocol):
    """What this module uses of :class:`prefixcache.oracle.driver.Driver`
    (a Protocol: the driver imports this module, not the reverse)."""

    kind: str
    allocator: Any
    refused: Optional[str]
    white: bool

    def sub_allocators(self) -> Dict[str, Any]: ...

    def model_states(self) -> Dict[str, AbstractState]: ...


class Machine(Protocol):
    """What the provokers use of
    :class:`prefixcache.oracle.machine.AllocatorMachine` (a Protocol: the
    machine imports this module, not the reverse)."""

    seqs: List[Seq]
    swapped: List[Seq]
    detached: List[str]
    history: List[List[str]]

    @property
    def d(self) -> Driver: ...

    def run(self, op: str, **args: Any) -> Step: ...

    def ok(self) -> bool: ...

    def handle(self, name: str) -> Any: ...

    def block_size(self) -> int: ...

    def alloc_args(self, seq_device: str) -> Dict[str, Any]: ...


# ----------------------------------------------------------------------------
# calls the model does not offer (the driver routes these ops here)

COMPONENT_OPS = frozenset({
    "RefCounter.decr", "ReadOnlyRefCounter.incr", "ReadOnlyRefCounter.decr",
    "LRUEvictor.remove", "LRUEvictor.update", "LRUEvictor.evict", "make_evictor",
})
#: Every op :func:`call_special` handles on at least one side.
SPECIAL_OPS = COMPONENT_OPS | {"__init__", "create", "free_block_id", "is_block_cached",
                               "block_is_computed"}


def _label(driver: Driver) -> str:
    return "GPU" if driver.kind == "cpu_gpu" else ""


def _part(driver: Driver) -> Any:
    """The allocator whose internals the component rows use."""
    return driver.sub_allocators()[_label(driver)]


def _evictor_module(alloc: Any) -> Any:
    """The module with ``make_evictor`` and ``EvictionPolicy`` that the
    target uses: its evictor's, its class's (or a base class's), or
    ``evictor`` beside or above their package."""
    own = getattr(alloc, "evictor", None)
    classes: Tuple[Any, Any] = (None if own is None else type(own), type(alloc))
    return _evictor_module_of(*classes)


@functools.cache
def _evictor_module_of(evictor_class: Any, alloc_class: Any) -> Any:
    """``_evictor_module`` given the evictor's class (None without one) and
    the allocator's (looked up once per pair)."""
    modules = tuple(m for m in ("" if evictor_class is None else evictor_class.__module__,
                                *(c.__module__ for c in alloc_class.__mro__)) if m)
    names = list(modules)
    for module_name in modules:
        package = module_name.rpartition(".")[0]
        names += [f"{p}.evictor" for p in (package, package.rpartition(".")[0]) if p]
    for name in dict.fromkeys(names):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "make_evictor") and hasattr(module, "EvictionPolicy"):
            return module
    return None


def components_reachable(driver: Driver) -> bool:
    """White-box with a ``_refcounter`` and an evictor module to use."""
    part = _part(driver)
    return (driver.white and getattr(part, "_refcounter", None) is not None
            and _evictor_module(part) is not None)


def _evictor(part: Any) -> Any:
    own = getattr(part, "evictor", None)
    if own is not None:
        return own
    module = _evictor_module(part)
    return module.make_evictor(module.EvictionPolicy.LRU)


def _target_component(driver: Driver, op: str, args: Dict[str, Any]) -> Any:
    part = _part(driver)
    if op == "RefCounter.decr":
        return part._refcounter.decr(args["block_id"])
    if op.startswith("ReadOnlyRefCounter."):
        readonly = part._refcounter.as_readonly()
        return getattr(readonly, op.partition(".")[2])(args["block_id"])
    if op == "make_evictor":
        return _evictor_module(part).make_evictor(args["eviction_policy"])
    evictor = _evictor(part)
    if op == "LRUEvictor.remove":
        return evictor.remove(args["block_id"])
    if op == "LRUEvictor.update":
        return evictor.update(args["block_id"], args["last_accessed"])
    return evictor.evict()


def _evictor_ids(driver: Driver) -> set[int]:
    """The ids in the model's evictor (none where the target has no evictor)."""
    if getattr(_part(driver), "evictor", None) is None:
        return set()
    return {e.block_id for e in driver.model_states()[_label(driver)].evictor}


def _zero_refs(state: AbstractState, block_id: Any) -> bool:
    block = state.blocks.get(block_id)
    return block is None or block.refcount == 0


def _model_component(driver: Driver, op: str, args: Dict[str, Any]) -> Any:
    """The exception the spec gives, read off the model's abstract state."""
    state = driver.model_states()[_label(driver)]
    entries = _evictor_ids(driver)
    block_id = args.get("block_id")
    if op == "RefCounter.decr":
        if block_id not in state.block_ids:
            raise err.UnknownBlockIdError(f"unknown block id {block_id!r}")
        if _zero_refs(state, block_id):
            raise err.RefCountError(f"block id {block_id} has no reference to drop")
    elif op.startswith("ReadOnlyRefCounter."):
        raise err.ReadOnlyError("a read-only reference counter")
    elif op in ("LRUEvictor.remove", "LRUEvictor.update"):
        if block_id not in entries:
            raise err.NotInEvictorError(f"block {block_id} is not in the evictor")
    elif op == "LRUEvictor.evict":
        if not entries:
            raise err.EvictorEmptyError("the evictor is empty")
    elif op == "make_evictor":
        raise err.InvalidArgumentError(f"unknown eviction policy {args['eviction_policy']!r}")
    raise OracleError(f"{op}({args}) is not a mistake: the oracle models only mistakes here")


def _target_constructor(driver: Driver, op: str, args: Dict[str, Any]) -> Any:
    cls = type(driver.allocator)
    if op == "create":
        return cls.create(**args)
    if driver.kind == "cpu_gpu":
        sub = type(_part(driver))
        size = args["block_size"]
        pair = {f"{d}_block_allocator": sub(num_blocks=len(args[f"{d}_block_ids"]),
                                            block_size=size, block_ids=args[f"{d}_block_ids"])
                for d in ("cpu", "gpu")}
        return cls(**pair)
    if driver.kind == "naive":
        return cls(**{"create_block": naive_block_class(cls), **args})
    return cls(**args)


def _model_constructor(driver: Driver, op: str, args: Dict[str, Any]) -> Any:
    if op == "create":
        if args["allocator_type"] not in ("naive", "prefix_caching"):
            raise err.InvalidArgumentError(f"unknown allocator type {args['allocator_type']!r}")
        return DeviceModel(args["num_gpu_blocks"], args["num_cpu_blocks"], args["block_size"])
    if driver.kind == "cpu_gpu":
        if set(args["cpu_block_ids"]) & set(args["gpu_block_ids"]):
            raise err.InvalidArgumentError("the two allocators share an id")
        raise OracleError("a pair of allocators with distinct ids is not a mistake")
    options = dict(args)
    hash_algo = options.pop("hash_algo", "builtin")
    if hash_algo not in ("builtin", "sha256") and not callable(hash_algo):
        raise err.InvalidArgumentError(f"unknown hash_algo {hash_algo!r}")
    if type(options.pop("verify_content", False)) is not bool:
        raise err.InvalidArgumentError("verify_content must be a bool")
    if driver.kind == "naive":
        if not callable(options.pop("create_block", callable)):
            raise err.WrongTypeError("create_block must be callable")
        options["caching"] = False
    return Model(**options)


def _model_query(driver: Driver, op: str, args: Dict[str, Any]) -> Any:
    state = driver.model_states()[_label(driver)]
    if op == "is_block_cached":
        key = getattr(args["block"], "content_key", None)
        if key is None:
            raise err.UnhashableBlockError("the block has no content hash")
        return key in state.cached
    block_id = args["block_id"]
    if block_id not in state.block_ids:
        raise err.UnknownBlockIdError(f"unknown block id {block_id!r}")
    if op == "block_is_computed":
        block = state.blocks.get(block_id)
        return block is not None and block.computed
    if _zero_refs(state, block_id):  # free_block_id
        raise err.RefCountError(f"block id {block_id} holds no reference")
    raise OracleError(f"free_block_id({block_id}) of an id in use is not a mistake")


def call_special(driver: Driver, side: str, op: str, args: Dict[str, Any]) -> Any:
    """Run one of :data:`SPECIAL_OPS` on ``side`` ("target" or "model")."""
    if op in COMPONENT_OPS:
        call = _target_component if side == "target" else _model_component
    elif op in ("__init__", "create"):
        call = _target_constructor if side == "target" else _model_constructor
    elif side == "target":
        return getattr(driver.allocator, op)(**args)
    else:
        call = _model_query
    return call(driver, op, args)


# ----------------------------------------------------------------------------
# the provokers

Possible = Callable[[Machine], bool]
Provoke = Callable[[Machine, st.DataObject], bool]


@dataclass(frozen=True)
class Provoker:
    """When the mistake can be made, and how.  ``provoke`` returns whether
    it reached the wrong call (a set-up step can fail first)."""

    possible: Possible
    provoke: Provoke


def _always(m: Machine) -> bool:
    return True


def _state(m: Machine, device: str = "GPU") -> AbstractState:
    state: AbstractState = m.d.model_states()[device if m.d.kind == "cpu_gpu" else ""]
    return state


def _live(m: Machine, test: Callable[[Any], bool] = lambda h: True) -> List[Tuple[Any, str]]:
    """(sequence, block name) of every live block that passes ``test``."""
    return [(s, n) for s in m.seqs for n in s.names if test(m.handle(n))]


def _draw(data: st.DataObject, items: List[Any], label: str) -> Any:
    return items[data.draw(st.integers(0, len(items) - 1), label=label)]


def _kw(m: Machine, device: str = "GPU") -> Dict[str, Any]:
    return dict(m.alloc_args(device))


def _refcount(m: Machine, name: str, device: str = "GPU") -> int:
    block = _state(m, device).blocks.get(m.handle(name).block_id)
    return 0 if block is None else block.refcount


def _zero_ref_ids(m: Machine, device: str = "GPU") -> List[int]:
    state = _state(m, device)
    return sorted(set(state.free) | {e.block_id for e in state.evictor})


def _fill(m: Machine, device: str = "GPU") -> bool:
    """Valid allocations (new sequences) until nothing is free or evictable."""
    while _state(m, device).reported_free > 0:
        step = m.run("allocate_mutable_block", prev_block=None, extra_hash=None,
                     **_kw(m, device))
        if not m.ok():
            return False
        _new_seq(m, step, device=device)
    return True


def _new_seq(m: Machine, step: Any, like: Any = None, device: str = "GPU") -> Any:
    """Hold the Blocks a valid set-up step handed out as a new sequence
    (on ``like``'s device, with its extra hash, if given)."""
    seq = Seq(list(step.out), like.extra_hash if like else None, like.device if like else device)
    m.seqs.append(seq)
    m.history.append(seq.names)
    return seq


def _one_held(data: st.DataObject, found: List[Any]) -> bool:
    """Whether to use one of the blocks ``found`` (if any) rather than a new one."""
    return bool(found) and bool(data.draw(st.booleans(), label="one held"))


def _open_block(m: Machine, data: st.DataObject) -> Optional[Tuple[Any, str]]:
    """(sequence, name) of a block that can take a token: one the machine
    holds, or a new mutable block (a valid step; None if it cannot be had)."""
    found = _live(m, _open)
    if _one_held(data, found):
        return tuple(_draw(data, found, "block"))
    step = m.run("allocate_mutable_block", prev_block=None, extra_hash=None, **_kw(m))
    if not m.ok():
        return None
    return _new_seq(m, step), step.out[0]


def _fork_partial(m: Machine, data: st.DataObject) -> Optional[Tuple[str, str]]:
    """Fork a sequence whose last block can take a token: returns (the
    fork's last block, its device), shared with the original."""
    opened = _open_block(m, data)
    if opened is None:
        return None
    seq, name = opened
    step = m.run("fork", last_block=name)
    if not m.ok():
        return None
    return _new_seq(m, step, seq).names[-1], seq.device


def _open(h: Any) -> bool:
    """A block that can take a token (room, no content, not computed)."""
    return h.content_key is None and not h.is_full and not h.computed


# -- the five ways a Block argument can be wrong -------------------------------

def _swapped_names(m: Machine) -> List[str]:
    return [n for s in m.swapped for n in s.names]


def _detached_pool(m: Machine) -> List[str]:
    return list(m.detached) + _swapped_names(m)


Arg = Optional[Tuple[Any, Dict[str, Any]]]
BlockArg = Tuple[Possible, Callable[[Machine, st.DataObject], Arg]]


def _held(m: Machine) -> List[str]:
    """Every Block object the machine may still hand back: live or kept."""
    return [n for _, n in _live(m)] + _detached_pool(m)


def _with_id(as_id: Callable[[Machine, st.DataObject], Any],
             live_only: bool = False) -> Callable[..., Arg]:
    """A Block the machine holds (``live_only``: one whose chain is live,
    so that it is the one mistake of a fork), its id set to ``as_id`` for
    the step."""

    def make(m: Machine, data: st.DataObject) -> Arg:
        held = [n for _, n in _live(m)] if live_only else _held(m)
        if not held:
            return None
        name = _draw(data, held, "block")
        return name, {name: as_id(m, data)}

    return make


def _detached(m: Machine, data: st.DataObject) -> Arg:
    pool = _detached_pool(m)
    if pool and (not m.seqs or data.draw(st.booleans(), label="kept object")):
        return _draw(data, pool, "detached"), {}
    return _with_id(lambda m, d: None)(m, data)


def _stale(live_only: bool) -> Callable[..., Arg]:
    """A Block given an id that holds no reference (one is freed first, by
    ending a sequence, if every id is in use)."""

    def make(m: Machine, data: st.DataObject) -> Arg:
        if not _zero_ref_ids(m):
            seq = _draw(data, m.seqs, "seq to end")
            m.seqs.remove(seq)
            for name in seq.names:
                m.run("free", block=name)
        if live_only and not m.seqs and _zero_ref_ids(m):  # a live Block to give it to
            step = m.run("allocate_mutable_block", prev_block=None, extra_hash=None, **_kw(m))
            if m.ok():
                _new_seq(m, step)
        if not _zero_ref_ids(m) or not (m.seqs if live_only else _held(m)):
            return None
        return _with_id(lambda m, d: _draw(d, _zero_ref_ids(m), "stale id"), live_only)(m, data)

    return make


def _block_args(live_only: bool) -> Dict[str, BlockArg]:
    """The five wrong Block arguments (``live_only``: tampered Blocks are
    live ones, whose chain is live)."""
    def held(m: Machine) -> bool:
        return bool(m.seqs if live_only else _held(m))

    return {
        "not-a-block": (_always, lambda m, d: (NOT_A_BLOCK, {})),
        "detached": (lambda m: bool(_held(m)), _detached),
        "foreign": (_always, lambda m, d: ("@foreign", {})),
        "unknown-id": (held, _with_id(lambda m, d: UNKNOWN_ID, live_only)),
        "stale": (lambda m: bool(m.seqs or _zero_ref_ids(m) and held(m)), _stale(live_only)),
    }


BLOCK_ARGS = _block_args(live_only=False)


def _block_row(op: str, tag: str) -> Provoker:
    possible, make = _block_args(live_only=op == "fork")[tag]

    def provoke(m: Machine, data: st.DataObject) -> bool:
        made = make(m, data)
        if made is None:
            return False
        value, tamper = made
        extra = {"tamper": tamper} if tamper else {}
        if op == "fork":
            m.run(op, last_block=value, **extra)
        elif op == "swap_out":
            m.run(op, blocks=[value], **extra)
        else:
            m.run(op, block=value, **extra)
        return True

    return Provoker(possible, provoke)


# -- allocations ---------------------------------------------------------------

def _alloc(op: str, m: Machine, tokens: Any, **args: Any) -> bool:
    args.setdefault("prev_block", None)
    args.setdefault("extra_hash", None)
    if op == "allocate_immutable_blocks":
        m.run(op, block_token_ids=tokens, **args)
    elif op == "allocate_immutable_block":
        m.run(op, token_ids=tokens[0], **args)
    else:
        m.run(op, **args)
    return True


def _alloc_rows(op: str) -> Dict[str, Provoker]:
    """The mistakes of the three allocation calls (a one-block request is
    ``[tokens]``; the batched call puts a good list first)."""
    single = op != "allocate_immutable_blocks"

    def lists(m: Machine, bad: List[Any]) -> List[Any]:
        return [bad] if single else [[0] * m.block_size(), bad]

    def full(m: Machine) -> List[int]:
        return [0] * m.block_size()

    def no_free(m: Machine, data: st.DataObject) -> bool:
        return _fill(m) and _alloc(op, m, [[2] * m.block_size()], extra_hash=FRESH_EXTRA,
                                   **_kw(m))

    def prev_unhashed(m: Machine, data: st.DataObject) -> bool:
        opened = _open_block(m, data)
        return opened is not None and _alloc(op, m, [full(m)], prev_block=opened[1])

    rows = {
        "device": Provoker(_always, lambda m, d: _alloc(op, m, [full(m)], device="GPU")),
        "prev-type": Provoker(_always, lambda m, d: _alloc(op, m, [full(m)],
                                                           prev_block=NOT_A_BLOCK)),
        "no-free": Provoker(_always, no_free),
        "extra-type": Provoker(_always, lambda m, d: _alloc(op, m, [full(m)], extra_hash="x")),
        "tokens-type": Provoker(_always, lambda m, d: _alloc(
            op, m, lists(m, [0] * (m.block_size() - 1) + ["x"]))),
        "overfull": Provoker(_always, lambda m, d: _alloc(
            op, m, lists(m, [0] * (m.block_size() + 1)))),
        "underfull": Provoker(_always, lambda m, d: _alloc(
            op, m, lists(m, [0] * (m.block_size() - 1)))),
        "prev-unhashed": Provoker(_always, prev_unhashed),
    }
    return {f"{op}:{r.tag}": rows[r.tag] for r in ERROR_TABLE if r.operation == op}


# -- appends, copy-on-write, promotion -------------------------------------------------

def _on_open(op: str, make: Callable[[Machine, str, st.DataObject], Dict[str, Any]]) -> Provoke:
    """The wrong call on a block that can take a token, with the arguments
    ``make`` gives for the machine, the block's name and the data."""

    def provoke(m: Machine, data: st.DataObject) -> bool:
        opened = _open_block(m, data)
        if opened is None:
            return False
        m.run(op, block=opened[1], **make(m, opened[1], data))
        return True

    return provoke


#: Token arguments that are not a list of ints, each one token long: a
#: one-entry mapping indexes like a one-token list, which a fast path that
#: looks only at ``token_ids[0]`` would take.
BAD_TOKENS: List[Any] = [["x"], [True], [1.5], {0: 5}]


def _write(m: Machine, op: str, name: str) -> bool:
    """``op`` on the block ``name``: a one-token append, or the call on the block alone."""
    m.run(op, block=name, **({"token_ids": [0]} if op == "append_token_ids" else {}))
    return True


def _shared_then_full(op: str) -> Provoke:
    def provoke(m: Machine, data: st.DataObject) -> bool:
        forked = _fork_partial(m, data)
        return forked is not None and _fill(m, forked[1]) and _write(m, op, forked[0])

    return provoke


def _immutable(h: Any) -> bool:
    return h.content_key is not None


def _immutable_block(m: Machine, data: st.DataObject) -> Optional[Tuple[Any, str]]:
    """(sequence, name) of a block with content: one the machine holds, or
    a new full first block (a valid step; None if it cannot be had)."""
    found = _live(m, _immutable)
    if _one_held(data, found):
        return tuple(_draw(data, found, "block"))
    tokens = data.draw(st.lists(st.integers(0, 2), min_size=m.block_size(),
                                max_size=m.block_size()), label="tokens")
    step = m.run("allocate_immutable_block", prev_block=None, token_ids=tokens,
                 extra_hash=None, **_kw(m))
    if not m.ok():
        return None
    return _new_seq(m, step), step.out[0]


def _on_immutable(op: str, fork_first: bool = False) -> Provoke:
    def provoke(m: Machine, data: st.DataObject) -> bool:
        found = _immutable_block(m, data)
        if found is None:
            return False
        seq, name = found
        if fork_first:  # share it: a fork of the chain up to it
            step = m.run("fork", last_block=name)
            if not m.ok():
                return False
            name = _new_seq(m, step, seq).names[-1]
        return _write(m, op, name)

    return provoke


def _any_live(m: Machine) -> bool:
    return bool(m.seqs)


def _on_live(op: str, args: Callable[[str], Dict[str, Any]]) -> Provoke:
    """The wrong call on a live block, with the arguments ``args`` gives for its name."""

    def provoke(m: Machine, data: st.DataObject) -> bool:
        _, name = _draw(data, _live(m), "block")
        m.run(op, **args(name))
        return True

    return provoke


# -- ids: marks, queries, free_block_id -------------------------------------------------

def _mark(m: Machine, extra_ids: List[Any], now: Any = 1) -> bool:
    """Mark the first sequence's ids (if any) and ``extra_ids`` accessed at ``now``."""
    good = [m.handle(n).block_id for n in m.seqs[0].names] if m.seqs else []
    m.run("mark_blocks_as_accessed", block_ids=good + extra_ids, now=now)
    return True


def _free_ids(m: Machine) -> List[int]:
    return list(_state(m).free)


# -- swaps ------------------------------------------------------------------------

def _single_ref(m: Machine, device: str = "GPU") -> List[Tuple[Any, str]]:
    return [(s, n) for s, n in _live(m) if s.device == device and _refcount(m, n, device) == 1]


def _over_release_devices(m: Machine) -> List[str]:
    return [d for d in ("GPU", "CPU") if _single_ref(m, d)
            and len([n for s, n in _live(m) if s.device == d]) >= 2]


def _over_release(m: Machine, data: st.DataObject) -> bool:
    """Two Blocks on one id that holds one reference: a second Block of the
    same device is given the first one's id for the step (two new mutable
    blocks are taken first if no device has such a pair)."""
    for _ in range(2):
        if _over_release_devices(m):
            break
        step = m.run("allocate_mutable_block", prev_block=None, extra_hash=None, **_kw(m))
        if not m.ok():
            return False
        _new_seq(m, step)
    if not _over_release_devices(m):
        return False
    device = _draw(data, _over_release_devices(m), "device")
    seq, name = _draw(data, _single_ref(m, device), "block")
    others = [n for s, n in _live(m) if s.device == device and n != name]
    other = _draw(data, others, "other")
    tamper = {other: m.handle(name).block_id}
    if m.d.kind == "cpu_gpu":
        dst = "CPU" if device == "GPU" else "GPU"
        m.run("swap", blocks=[name, other], src_device=device, dst_device=dst, tamper=tamper)
    else:
        m.run("swap_out", blocks=[name, other], tamper=tamper)
    return True


def _swap_in_repeated(m: Machine, data: st.DataObject) -> bool:
    name = _swapped_open(m, data)
    if name is None:
        return False
    m.run("swap_in", blocks=[name, name])
    return True


def _swapped_open(m: Machine, data: st.DataObject) -> Optional[str]:
    """A swapped-out block without content (it needs a fresh id to come
    back): one the machine holds, or an open block swapped out now."""
    found = [n for n in _swapped_names(m) if m.handle(n).content_key is None]
    if _one_held(data, found):
        return str(_draw(data, found, "block"))
    opened = _open_block(m, data)
    if opened is None:
        return None
    seq, name = opened
    m.run("swap_out", blocks=seq.names)
    if not m.ok():
        return None
    m.seqs.remove(seq)
    m.swapped.append(seq)
    return name


def _swap_in_no_free(m: Machine, data: st.DataObject) -> bool:
    name = _swapped_open(m, data)
    if name is None or not _fill(m):
        return False
    m.run("swap_in", blocks=[name])
    return True


def _cached_in_use(state: AbstractState, key: Any) -> bool:
    block_id = state.cached.get(key)
    return block_id is not None and state.blocks[block_id].refcount > 0


def _swap_no_free_seqs(m: Machine) -> List[Any]:
    """Sequences with a block that would need an id on the other device
    even once it is full of blocks in use."""
    out = []
    for seq in m.seqs:
        dst = _state(m, "CPU" if seq.device == "GPU" else "GPU")
        if any(not _cached_in_use(dst, m.handle(n).content_key) for n in seq.names):
            out.append(seq)
    return out


def _swap_no_free(m: Machine, data: st.DataObject) -> bool:
    seq = _draw(data, _swap_no_free_seqs(m), "seq")
    dst = "CPU" if seq.device == "GPU" else "GPU"
    if not _fill(m, dst) or seq not in m.seqs:
        return False
    m.run("swap", blocks=seq.names, src_device=seq.device, dst_device=dst)
    return True


def _swap_unknown_device(m: Machine, data: st.DataObject) -> bool:
    seq = _draw(data, m.seqs, "seq")
    m.run("swap", blocks=seq.names, src_device=seq.device, dst_device={"raw": "TPU"})
    return True


# -- the device pair's own rows ------------------------------------------------------

def _null_then(op: str) -> Provoke:
    def provoke(m: Machine, data: st.DataObject) -> bool:
        step = m.run("allocate_or_get_null_block")
        if not m.ok():
            return False
        if op == "fork":
            return bool(m.run("fork", last_block=step.out[0]))
        return _write(m, op, step.out[0])

    return provoke


# -- constructors and components ------------------------------------------------------

def _construct(choices: List[Dict[str, Any]], op: str = "__init__") -> Provoker:
    """A fresh allocator of the target's class, built with one of ``choices``."""
    def provoke(m: Machine, data: st.DataObject) -> bool:
        m.run(op, **_draw(data, choices, "arguments"))
        return True

    return Provoker(_always, provoke)


Args = List[Dict[str, Any]]
BAD_SIZES: Args = [dict(num_blocks=-1, block_size=2), dict(num_blocks="3", block_size=2),
                   dict(num_blocks=2, block_size=0), dict(num_blocks=2, block_size="2")]
BAD_IDS: Args = [dict(num_blocks=2, block_size=1, block_ids=ids)
                 for ids in ([0, 0], [0, "1"], [0, 1, 2])]
BAD_FACTORY: Args = [dict(num_blocks=1, block_size=1, create_block=f) for f in (None, "NaiveBlock")]
BAD_HASH: Args = [dict(num_blocks=1, block_size=1, hash_algo=h) for h in ("md5", 7)]
BAD_VERIFY: Args = [dict(num_blocks=1, block_size=1, verify_content=v) for v in ("yes", 1, None)]
BAD_TYPE: Args = [dict(allocator_type=t, num_gpu_blocks=1, num_cpu_blocks=1, block_size=1)
                  for t in ("fifo", "prefix")]
BAD_COUNTS: Args = [dict(allocator_type="prefix_caching", num_gpu_blocks=g, num_cpu_blocks=c,
                         block_size=1) for g, c in ((-1, 1), (1, "2"))]
SHARED_IDS: Args = [dict(gpu_block_ids=[0, 1], cpu_block_ids=[1, 2], block_size=1)]


def _component(possible: Possible, make: Callable[[Machine, st.DataObject],
                                                  Tuple[str, Dict[str, Any]]]) -> Provoker:
    def provoke(m: Machine, data: st.DataObject) -> bool:
        op, args = make(m, data)
        m.run(op, **args)
        return True

    return Provoker(lambda m: components_reachable(m.d) and possible(m), provoke)


def _not_in_evictor(m: Machine, data: st.DataObject) -> Tuple[str, Dict[str, Any]]:
    ids = [i for i in _state(m).block_ids if i not in _evictor_ids(m.d)] + [UNKNOWN_ID]
    block_id = _draw(data, ids, "id")
    if data.draw(st.booleans(), label="update"):
        return "LRUEvictor.update", {"block_id": block_id, "last_accessed": 1.0}
    return "LRUEvictor.remove", {"block_id": block_id}


PROVOKERS: Dict[str, Provoker] = {
    **{f"{op}:{tag}": _block_row(op, tag) for tag in BLOCK_ARGS
       for op in ("free", "fork", "cow_block_if_not_appendable", "promote_to_immutable_block",
                  "swap_out")},
    **_alloc_rows("allocate_mutable_block"),
    **_alloc_rows("allocate_immutable_block"),
    **_alloc_rows("allocate_immutable_blocks"),
    "free:pair-detached": Provoker(_any_live, _on_live(
        "free", lambda n: {"block": n, "tamper": {n: None}})),
    "free:pair-unknown-id": Provoker(_any_live, _on_live(
        "free", lambda n: {"block": n, "tamper": {n: UNKNOWN_ID}})),
    "free_block_id:unknown-id": Provoker(_always, lambda m, d: bool(
        m.run("free_block_id", block_id=UNKNOWN_ID))),
    "free_block_id:double-free": Provoker(lambda m: bool(_free_ids(m)), lambda m, d: bool(
        m.run("free_block_id", block_id=_draw(d, _free_ids(m), "id")))),
    "fork:null-block": Provoker(_always, _null_then("fork")),
    "append_token_ids:tokens-type": Provoker(_always, _on_open(
        "append_token_ids", lambda m, n, d: {"token_ids": _draw(d, BAD_TOKENS, "token_ids")})),
    "append_token_ids:overfull": Provoker(_always, _on_open(
        "append_token_ids",
        lambda m, n, d: {"token_ids": [0] * (m.handle(n).num_empty_slots + 1)})),
    "append_token_ids:no-free-cow": Provoker(_always, _shared_then_full("append_token_ids")),
    "append_token_ids:immutable": Provoker(_always, _on_immutable("append_token_ids")),
    "append_token_ids:null-block": Provoker(_always, _null_then("append_token_ids")),
    "cow_block_if_not_appendable:no-free": Provoker(
        _always, _shared_then_full("cow_block_if_not_appendable")),
    "cow_block_if_not_appendable:immutable-shared": Provoker(
        _always, _on_immutable("cow_block_if_not_appendable", fork_first=True)),
    "promote_to_immutable_block:unhashable": Provoker(
        _always, _on_open("promote_to_immutable_block", lambda m, n, d: {})),
    "promote_to_immutable_block:immutable": Provoker(
        _always, _on_immutable("promote_to_immutable_block")),
    "promote_to_immutable_block:naive": Provoker(_any_live, _on_live(
        "promote_to_immutable_block", lambda n: {"block": n})),
    "mark_blocks_as_accessed:unknown-id": Provoker(
        _always, lambda m, d: _mark(m, [_draw(d, [UNKNOWN_ID, -1, "0"], "id")])),
    "mark_blocks_as_accessed:free-id": Provoker(
        lambda m: bool(_free_ids(m)), lambda m, d: _mark(m, [_draw(d, _free_ids(m), "id")])),
    "mark_blocks_as_accessed:now-type": Provoker(_always, lambda m, d: _mark(m, [], "soon")),
    "mark_blocks_as_accessed:now-nan": Provoker(_always,
                                                lambda m, d: _mark(m, [], float("nan"))),
    "get_physical_block_id:unknown-id": Provoker(_always, lambda m, d: bool(
        m.run("get_physical_block_id", **_kw(m), absolute_id=UNKNOWN_ID))),
    "get_num_free_blocks:device": Provoker(_always, lambda m, d: bool(
        m.run("get_num_free_blocks", device="GPU"))),
    "swap_out:over-release": Provoker(_always, _over_release),
    "swap_out:repeated": Provoker(_any_live, _on_live("swap_out", lambda n: {"blocks": [n, n]})),
    "swap_in:attached": Provoker(_any_live, _on_live("swap_in", lambda n: {"blocks": [n]})),
    "swap_in:repeated": Provoker(_always, _swap_in_repeated),
    "swap_in:no-free": Provoker(_always, _swap_in_no_free),
    "swap_in:wrong-type": Provoker(_always, lambda m, d: bool(
        m.run("swap_in", blocks=[NOT_A_BLOCK]))),
    "swap:over-release": Provoker(_always, _over_release),
    "swap:no-free": Provoker(lambda m: bool(_swap_no_free_seqs(m)), _swap_no_free),
    "swap:unknown-device": Provoker(_any_live, _swap_unknown_device),
    "is_block_cached:unhashed": Provoker(_always, _on_open("is_block_cached", lambda m, n, d: {})),
    "block_is_computed:unknown-id": Provoker(_always, lambda m, d: bool(
        m.run("block_is_computed", block_id=UNKNOWN_ID))),
    "__init__:sizes": _construct(BAD_SIZES),
    "__init__:block-ids": _construct(BAD_IDS),
    "__init__:create-block": _construct(BAD_FACTORY),
    "__init__:hash-algo": _construct(BAD_HASH),
    "__init__:verify-content": _construct(BAD_VERIFY),
    "__init__:shared-ids": _construct(SHARED_IDS),
    "create:allocator-type": _construct(BAD_TYPE, "create"),
    "create:counts": _construct(BAD_COUNTS, "create"),
    "RefCounter.decr:zero": _component(
        lambda m: bool(_zero_ref_ids(m)),
        lambda m, d: ("RefCounter.decr", {"block_id": _draw(d, _zero_ref_ids(m), "id")})),
    "RefCounter.decr:unknown-id": _component(
        _always, lambda m, d: ("RefCounter.decr", {"block_id": UNKNOWN_ID})),
    "ReadOnlyRefCounter.incr/decr:any": _component(
        _always, lambda m, d: (f"ReadOnlyRefCounter.{_draw(d, ['incr', 'decr'], 'op')}",
                               {"block_id": _draw(d, list(_state(m).block_ids), "id")})),
    "LRUEvictor.remove/update:absent": _component(_always, _not_in_evictor),
    "LRUEvictor.evict:empty": _component(lambda m: not _evictor_ids(m.d),
                                         lambda m, d: ("LRUEvictor.evict", {})),
    "make_evictor:policy": _component(
        _always, lambda m, d: ("make_evictor", {"eviction_policy": _draw(
            d, ["MRU", "lru", 0], "policy")})),
}


def rows_for(kind: str) -> List[ErrorCase]:
    """The error table's rows that apply to a target of ``kind`` and have
    a provoker (tests/test_oracle_mistakes.py checks that every row has)."""
    return list(_rows_for(kind))


@functools.cache
def _rows_for(kind: str) -> Tuple[ErrorCase, ...]:
    """:func:`rows_for`, worked out once per kind."""
    return tuple(row for row in ERROR_TABLE
                 if TABLE_KIND[kind] in row.applies_to and row.key in PROVOKERS)


def possible_rows(m: Machine, rows: List[ErrorCase]) -> List[ErrorCase]:
    """The rows whose mistake can be made in the machine's state now."""
    return [row for row in rows if PROVOKERS[row.key].possible(m)]


def provoke(m: Machine, row: ErrorCase, data: st.DataObject) -> Optional[str]:
    """Make the row's mistake; return its coverage label: ``mistake:<key>``
    when the model refused the wrong call with the row's class,
    ``mistake-mismatch:<key>:<class>`` when it refused another way (a
    provoker or model bug), None when a set-up step failed."""
    if not PROVOKERS[row.key].provoke(m, data):
        return None
    if m.d.refused == row.exception.__name__:
        return f"mistake:{row.key}"
    return f"mistake-mismatch:{row.key}:{m.d.refused}"
