"""Runs one step on the target and on the model, and judges the target.

The :class:`Driver` owns a target allocator, the model of the same size and
the names of the Blocks handed out so far.  :meth:`Driver.run` executes a
:class:`~prefixcache.oracle.trace.Step` on the target first, then on the
model (in relaxed mode the model follows the target's choice of free ids),
and compares:

* black-box, for any target: the exception class or the result of the call,
  every live Block's id, and the free count;
* white-box, where the target has vLLM-shaped internals: the whole abstract
  state (through the spec's abstraction function) and every invariant.

A refusal is judged by its role, with the target's own classes: a
caller mistake (the model raises a ``CallerError``) must raise the same
class in the target (any exception under the option
``any_mistake_exception``) and a request for which no id is free must raise
``NoFreeBlocksError``, prefixcache's or the one the target's own classes
publish as ``BlockAllocator.NoFreeBlocksError``; either way the target's
state must be exactly as it was.  Anything else raises
:class:`~prefixcache.oracle.violations.Violation` with a category, the
operation and the rule broken.  Every call of the target runs under the
call timeout: one that does not return in time is a ``hang``.
"""

from __future__ import annotations

import functools
import math
import sys
from collections import Counter
from collections.abc import Hashable
from dataclasses import fields
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from ..impl import errors as err
from ..model import ChoiceNotAllowed, DeviceModel, Model
from ..spec.abstraction import (
    AbstractionError,
    AnswerTypeError,
    ContentLedger,
    abstract_state,
    content_key_of,
    is_prefix_caching,
)
from ..spec.invariants import INVARIANTS, OWNERSHIP, check_all
from ..spec.operations import NEW_BLOCK, NEW_BLOCKS, returning
from ..spec.semantics import PREFIXCACHE, Semantics
from ..spec.state import AbstractState, BlockState, ContentKey
from .call_timeout import CallTimeout, time_limit
from .mistakes import SPECIAL_OPS, OracleError, call_special
from .target_log import take_unformattable, watch_log_formatting
from .targets import Target
from .trace import BLOCK_ARGS, BLOCK_LIST_ARGS, Step, Trace
from .trackers import TRACKER_OPS, Trackers, call_tracker, make_trackers
from .violations import AFTER_REFUSAL, Violation

#: The API's own exception vocabulary: raising one of these on a valid call
#: is a conformance failure; raising anything else is a crash.
API_EXCEPTIONS: Tuple[type, ...] = (err.PrefixCacheError, ValueError, KeyError)

#: Operations that hand out new Blocks (their ``out`` names them).
BLOCK_RESULTS = returning(NEW_BLOCK, NEW_BLOCKS)

#: Each invariant's statement, by name, for the message of an invariant finding.
_MEANINGS: Dict[str, str] = {inv.name: inv.meaning.replace("``", "") for inv in INVARIANTS}
_MEANINGS[OWNERSHIP.name] = OWNERSHIP.meaning.replace("``", "")


#: A Block without a ``computed`` flag.
_ABSENT = object()


def _computed_flag(block: Any) -> Any:
    """The Block's ``computed`` flag, or :data:`_ABSENT` where it has none
    (vLLM's NaiveBlock raises NotImplementedError)."""
    try:
        return block.computed
    except (AttributeError, NotImplementedError):
        return _ABSENT


def no_free_classes(*allocators: Any) -> Tuple[type, ...]:
    """prefixcache's ``NoFreeBlocksError`` and every ``NoFreeBlocksError``
    the allocators' own classes publish: a nested class of a class in their
    MRO (vLLM's ``BlockAllocator.NoFreeBlocksError``), or of a class the
    modules of those classes define or import (``BlockAllocator`` beside a
    ``CpuGpuBlockAllocator``)."""
    found: Dict[type, None] = {err.NoFreeBlocksError: None}
    for allocator in allocators:
        for klass in type(allocator).__mro__:
            owners = [klass, *vars(sys.modules.get(klass.__module__, object())).values()]
            for owner in owners:
                nested = getattr(owner, "__dict__", {}).get("NoFreeBlocksError") \
                    if isinstance(owner, type) else None
                if isinstance(nested, type) and issubclass(nested, BaseException):
                    found[nested] = None
    return tuple(found)


def _device_enum(allocator: Any) -> Any:
    module = sys.modules.get(type(allocator).__module__)
    device = getattr(module, "Device", None)
    if device is None:
        from ..impl.interfaces import Device

        device = Device
    return device


def _uncached_key(content_hash: Any) -> Any:
    """The model's key for a hash no Block carried (a recorded query): a
    pair no Block spells (its first item, a Block's extra hash, is never a
    string), so the model caches it nowhere.  An unhashable one (a caller's
    mistake) stays itself, for the model to refuse."""
    if not isinstance(content_hash, Hashable):
        return content_hash
    return (("a hash no Block carried", (content_hash,)),)


class Lockstep:
    """What the drivers of both profiles share: the target, the trace of the
    steps run, the options a refusal is judged by, the coverage labels, and
    how a call of the target is timed and a finding raised."""

    def __init__(self, target: Target, num_blocks: int, block_size: int, *, kind: str,
                 strict: bool, semantics: Semantics, mistakes: bool,
                 call_timeout: Optional[float]) -> None:
        self.target = target
        self.kind = kind
        self.semantics = semantics
        self.mistakes = mistakes
        self.call_timeout = call_timeout
        self.trace = Trace(num_blocks=num_blocks, block_size=block_size, kind=kind,
                           target=target.name, strict=strict, semantics=semantics.to_json())
        self._op = "__init__"
        self.refused: Optional[str] = None
        #: the steps of the caller mistakes the target refused while the
        #: oracle could not read its state (black-box)
        self.unseen_refusals: List[int] = []
        self.step_events: List[str] = []
        self.events: Counter[str] = Counter()

    def run(self, step: Step) -> Any:
        """Execute ``step`` on both sides and judge the target; returns the
        target's result.  Raises Violation."""
        raise NotImplementedError

    def _begin(self, step: Step) -> None:
        """Start ``step``: traced, nothing refused, no coverage label yet."""
        self.trace.steps.append(step)
        self.refused, self.step_events, self._op = None, [], step.op

    def _event(self, label: str) -> None:
        """Count a coverage label for this step."""
        self.events[label] += 1
        self.step_events.append(label)

    def _step_no(self) -> int:
        return len(self.trace.steps) - 1

    def _fail(self, category: str, message: str, rule: str) -> Violation:
        """A finding at this step; after an unseen refusal (see
        :meth:`_refused_mistake`) any but a robustness one may be that
        refusal's doing: ``robustness/<operation>/after-refusal:<rule>``
        (a campaign replays its trace without the refusals to tell:
        :func:`~prefixcache.oracle.minimise.without_refusals`)."""
        unseen = self.unseen_refusals
        if unseen and category != "robustness":
            which = (f"a caller mistake refused at step {unseen[0]}" if len(unseen) == 1 else
                     f"caller mistakes refused at steps {', '.join(map(str, unseen))}")
            message += (f" [{category}], after {which}: black-box, the oracle cannot see "
                        "that a refusal changed nothing")
            category, rule = "robustness", AFTER_REFUSAL + rule
        return Violation(category, message, self._step_no(), operation=self._op, rule=rule)

    def _refused_mistake(self, seen: bool) -> None:
        """The target refused this step's caller mistake and changed nothing
        that the oracle could see: all of its state when ``seen``, else its
        answers only, so that a later difference may be this refusal's."""
        if not seen:
            self.unseen_refusals.append(self._step_no())

    def _attach_trace(self, violation: Violation) -> None:
        """Give ``violation`` the trace that led to it."""
        self.trace.violation = violation.to_json()
        violation.trace = self.trace

    def _timed(self, call: Callable[[], Any]) -> Any:
        """``call()`` under the call timeout (a ``hang`` when it runs past)."""
        try:
            with time_limit(self.call_timeout):
                return call()
        except CallTimeout as exc:
            raise self._fail("hang", f"{self._op} did not return within "
                             f"{self.call_timeout:g} s", "timeout") from exc

    def _guard(self, what: str, call: Callable[[], Any]) -> Any:
        try:
            return self._timed(call)
        except Violation:
            raise
        except Exception as exc:  # the target crashed outside any step
            raise self._fail("crash", f"{what}: {type(exc).__name__}: {exc}",
                             f"raised-{type(exc).__name__}") from exc

    def _valid_call_raised(self, step: Step, t_exc: BaseException,
                           api_exceptions: Tuple[type, ...]) -> Violation:
        """A valid call raised: conformance for one of ``api_exceptions``, else a crash."""
        category = "conformance" if isinstance(t_exc, api_exceptions) else "crash"
        return self._fail(category, f"{step.op}: a valid call raised "
                          f"{type(t_exc).__name__}: {t_exc}", f"raised-{type(t_exc).__name__}")

    def _unlike_refusal(self, step: Step, category: str, name: str, m_exc: BaseException,
                        t_exc: Optional[BaseException], suffix: str = "") -> Violation:
        """The spec refuses with ``name``; the target accepted (``t_exc`` None) or raised else."""
        did, rule = ("accepted the call", "no") if t_exc is None else (
            f"raised {type(t_exc).__name__}: {t_exc}", "not")
        return self._fail(category, f"{step.op}: the spec raises {name} ({m_exc}), the "
                          f"target {did}", f"{rule}-{name}{suffix}")

    def _compare_free(self, step: Step, unchanged: bool,
                      counts: Dict[str, Tuple[int, int]]) -> None:
        """The target's free count against the model's, per device label."""
        for label, (t_free, m_free) in counts.items():
            if t_free != m_free:
                raise self._fail("robustness" if unchanged else "conformance",
                                 f"{step.op}: {after_call(unchanged)}, get_num_free_blocks"
                                 f"({label}) is {t_free} in the target, {m_free} in the spec",
                                 "free-count")

    def _judge_state(self, step: Step, changed: Tuple[str, str], broken: List[str],
                     meanings: Dict[str, str], parted: Callable[[], Tuple[str, str]]) -> None:
        """Raise the first of: a refused call ``changed`` the state, it breaks
        the invariants ``broken``, ``parted()`` says it differs from the model's."""
        part, diff = changed
        if diff:
            raise self._fail("robustness", f"{step.op} was refused but changed the "
                             f"state: {diff}", f"changed:{part}")
        if broken:
            raise self._fail("invariant", f"{step.op}: the target's state breaks "
                             f"{', '.join(broken)} ({meanings[broken[0]]})", broken[0])
        part, diff = parted()
        if diff:
            raise self._fail("conformance", f"{step.op}: {diff} (target vs spec)",
                             f"state:{part}")


def _spelled_key(block: Any) -> Optional[ContentKey]:
    """The content key a target's Block spells (None when its tokens are
    not a sequence): an answer to a refused call may hit that content."""
    try:
        return content_key_of(block)
    except TypeError:
        return None


def after_call(unchanged: bool) -> str:
    """How a comparison names the moment: after the call, or after a refused one."""
    return "after a refused call" if unchanged else "after the call"


class Driver(Lockstep):
    """A target and its model in lockstep, judged after every step.

    ``white_box`` compares abstract states and invariants where the target
    has vLLM-shaped internals; ``semantics`` picks the rule of each option
    (the model follows it, refusals are judged by it); ``mistakes=False``
    promises valid calls only (a step the model refuses as a caller mistake
    is then a bug of the oracle: OracleError); ``call_timeout`` (seconds,
    None for none) bounds each call of the target."""

    def __init__(self, target: Target, num_blocks: int, block_size: int, *,
                 white_box: bool = True, check_model: bool = False,
                 semantics: Semantics = PREFIXCACHE, mistakes: bool = True,
                 call_timeout: Optional[float] = None) -> None:
        super().__init__(target, num_blocks, block_size, kind=target.kind, strict=target.strict,
                         semantics=semantics, mistakes=mistakes, call_timeout=call_timeout)
        watch_log_formatting()
        self.allocator = self._guard("construct the target", lambda: target.make(num_blocks,
                                                                                  block_size))
        options: Dict[str, Any] = {"strict": target.strict, "check_invariants": check_model,
                                   "semantics": semantics}
        self.model: Any
        if self.kind == "cpu_gpu":
            self.model = DeviceModel(num_blocks, num_blocks, block_size, **options)
        else:
            self.model = Model(num_blocks, block_size, caching=self.kind != "naive", **options)
        self._device = _device_enum(self.allocator)  # a mistake passes one to one device
        self.blocks: Dict[str, Any] = {}
        self.handles: Dict[str, Any] = {}
        self.hashes: Dict[str, int] = {}
        self._queries: Dict[str, List[int]] = {}  # first name -> the target's list
        self._reused: Dict[int, List[int]] = {}  # slot -> the target's list there
        self.keys: Dict[str, ContentKey] = {}
        self.dead: Set[str] = set()
        self.ledger = ContentLedger()
        self.white = white_box and self._has_internals()
        #: compare abstract states and invariants after each step (white-box
        #: targets only); a caller may switch it off for steps on states too
        #: big to read every step (the machine's thousand-block chains)
        self.state_checks = True
        self._before: Optional[Dict[str, AbstractState]] = None
        self._counter = 0
        self._model_states: Optional[Dict[str, AbstractState]] = None
        self._previous_model_states: Optional[Dict[str, AbstractState]] = None
        self._foreign: Optional[Tuple[Any, Any]] = None
        self._no_free = no_free_classes(self.allocator, *self.sub_allocators().values()) \
            if self.white else no_free_classes(self.allocator)
        #: the target's block-manager helpers and their models (None without)
        self.trackers: Optional[Trackers] = make_trackers(
            self.kind, self.allocator, list(self.sub_allocators().values()) if self.white else [],
            self.model, block_size)
        if self.white:
            self._before = self._target_states()

    # -- helpers -------------------------------------------------------------

    def _has_internals(self) -> bool:
        alloc = self.allocator
        if self.kind == "cpu_gpu":
            allocators = getattr(alloc, "_allocators", None)
            return isinstance(allocators, dict) and all(
                getattr(a, "_refcounter", None) is not None for a in allocators.values())
        return getattr(alloc, "_refcounter", None) is not None

    def sub_allocators(self) -> Dict[str, Any]:
        if self.kind == "cpu_gpu":
            return {str(getattr(d, "name", d)).upper(): a
                    for d, a in self.allocator._allocators.items()}
        return {"": self.allocator}

    def _sub_models(self) -> Dict[str, Any]:
        if self.kind == "cpu_gpu":
            return {"GPU": self.model.gpu, "CPU": self.model.cpu}
        return {"": self.model}

    def live_names(self) -> List[str]:
        """Names of the Blocks that hold an id now (per the model)."""
        return [n for n, h in self.handles.items()
                if n not in self.dead and getattr(h, "block_id", None) is not None]

    def _new_name(self) -> str:
        """A name no Block of this run has had: a replayed trace names its
        Blocks itself (``step.out``), and a step without names (the last
        step of a trace that crashed its target) must not reuse one."""
        while f"b{self._counter}" in self.handles:
            self._counter += 1
        name = f"b{self._counter}"
        self._counter += 1
        return name

    def device(self, name: str) -> Any:
        """The target's Device member called ``name``."""
        return getattr(self._device, name.upper())

    # -- argument resolution ----------------------------------------------------

    def _block_arg(self, value: Any, side: str) -> Any:
        if value is None:
            return None
        if isinstance(value, dict) and "raw" in value:
            return value["raw"]
        if value == "@foreign":
            return self._foreign_block(side)
        table = self.blocks if side == "target" else self.handles
        if value not in table:
            raise KeyError(f"the trace names an unknown block {value!r}")
        return table[value]

    def _foreign_block(self, side: str) -> Any:
        """A Block of another allocator of the same kind (made once)."""
        if self._foreign is None:
            size = self.trace.block_size
            other = self.target.make(1, size)
            if self.kind == "cpu_gpu":
                block = other.allocate_mutable_block(None, self.device("GPU"))
                handle = DeviceModel(1, 1, size).allocate_mutable_block(None, "GPU")
            else:
                block = other.allocate_mutable_block(None)
                handle = Model(1, size, caching=self.kind != "naive").allocate_mutable_block(None)
            self._foreign = (block, handle)
        return self._foreign[0] if side == "target" else self._foreign[1]

    def _args(self, step: Step, side: str) -> Dict[str, Any]:
        args: Dict[str, Any] = {}
        for key, value in step.args.items():
            if key == "tamper":  # applied to the Blocks themselves (see run)
                continue
            if key in BLOCK_ARGS:
                args[key] = self._block_arg(value, side)
            elif key in BLOCK_LIST_ARGS:
                args[key] = [self._block_arg(v, side) for v in value]
            elif key in ("device", "src_device", "dst_device") and isinstance(value, dict):
                args[key] = value["raw"]  # not a device at all
            elif key in ("device", "src_device", "dst_device") and value is not None:
                args[key] = self.device(value) if side == "target" else value
            else:
                args[key] = value
        return args

    # -- calling each side ----------------------------------------------------------

    def _call(self, side: str, op: str, args: Dict[str, Any]) -> Any:
        obj = self.allocator if side == "target" else self.model
        if op in SPECIAL_OPS:
            return call_special(self, side, op, args)
        if op in TRACKER_OPS and self.trackers is not None:
            return call_tracker(self.trackers, side, op, args)
        if op == "append_token_ids":
            block = args.pop("block")
            if side == "target":
                return block.append_token_ids(args["token_ids"])
            return obj.append_token_ids(block, args["token_ids"])
        if op == "all_block_ids":
            return obj.all_block_ids
        if op == "find_cached_blocks_prefix":
            names = args.pop("names")
            slot = args.pop("reused_list", None)
            if side == "target":
                query = (self._standing_query(names) if slot is None
                         else self._reused_query(slot, names))
                return obj.find_cached_blocks_prefix(query, **args)
            return obj.find_cached_blocks_prefix(self._keys_of(names), **args)
        if side == "model":
            args.pop("keep_block_object", None)
            if "block" in args:  # the model names it ``handle``
                return getattr(obj, op)(args.pop("block"), **args)
        if op == "cow_block_if_not_appendable" and side == "target":
            block = args["block"]
            new_id = obj.cow_block_if_not_appendable(block)
            block.block_id = new_id  # as the Block's own append does with the answer
            return new_id
        return getattr(obj, op)(**args)

    def _standing_query(self, names: Any) -> Any:
        """The target's hash list for the chain ``names``: one list per chain,
        asked about again and grown in place, as vLLM's ComputedBlocksTracker
        asks about each running sequence's own list every step.  A target
        that remembers lists by identity must still see every eviction."""
        hashes = self._hashes_of(names)
        if not isinstance(names, list) or not names or not isinstance(names[0], str):
            return hashes   # no chain of Blocks: a list of its own
        query = self._queries.get(names[0])
        if query is None or hashes[:len(query)] != query:  # shrunk or changed: a new list
            query = self._queries[names[0]] = []
        query.extend(hashes[len(query):])
        return query

    def _reused_query(self, slot: int, names: List[str]) -> List[int]:
        """The target's hash list for the chain ``names`` in the list object
        of ``slot``, rewritten in place, as a caller that keeps one list per
        slot (a position in its queue) and reuses it for whichever sequence
        is there: to a target that remembers lists by identity, the same list
        comes back shorter, changed, or longer with another start."""
        query = self._reused.setdefault(slot, [])
        query[:] = self._hashes_of(names)
        return query

    def _hashes_of(self, names: Any) -> Any:
        """The target's hashes of a query's ``names``: a Block's name stands
        for its hash, ``{"hash": h}`` for a hash ``h`` no Block carried (a
        recorded query: :mod:`~prefixcache.oracle.recorder`); a query that
        is not a list (a caller's mistake) for itself."""
        if not isinstance(names, list):
            return names
        hashes = self.hashes
        return [hashes[n] if isinstance(n, str) else n["hash"] for n in names]

    def _keys_of(self, names: Any) -> Any:
        """The model's content keys of a query's ``names``: a Block's name
        stands for its content, ``{"hash": h}`` for content no Block carried,
        which the model caches nowhere (:func:`_uncached_key`)."""
        if not isinstance(names, list):
            return names
        keys = self.keys
        return [keys[n] if isinstance(n, str) else _uncached_key(n["hash"]) for n in names]

    def _chooser(self, target_ids: List[int]) -> Callable[[frozenset[int]], int]:
        """Relaxed mode: hand the model the target's fresh ids, in order."""
        pending = list(target_ids)

        def choose(allowed: frozenset[int]) -> int:
            while pending:
                candidate = pending.pop(0)
                if candidate in allowed:
                    return candidate
            return int(min(allowed))

        return choose

    def _fresh_ids_of(self, step: Step, result: Any) -> List[int]:
        if step.op in BLOCK_RESULTS:
            blocks = result if isinstance(result, list) else [result]
            return [b.block_id for b in blocks if getattr(b, "block_id", None) is not None]
        names = [step.args.get("block")] + list(step.args.get("blocks", []))
        return [self.blocks[n].block_id for n in names
                if isinstance(n, str) and n in self.blocks
                and getattr(self.blocks[n], "block_id", None) is not None]

    # -- the step ---------------------------------------------------------------------

    def run(self, step: Step) -> Any:
        self._begin(step)
        self._previous_model_states = self._model_states
        self._model_states = None
        if step.op in TRACKER_OPS and self.trackers is None:
            raise OracleError(f"{step.op}: the target publishes no block-manager helpers")
        self._event(f"op:{step.op}")
        t_args = self._args(step, "target")
        m_args = self._args(step, "model")
        tampered = self._tamper(step.args.get("tamper") or {})
        t_exc: Optional[BaseException] = None
        t_res: Any = None
        take_unformattable()
        try:
            t_res = self._timed(lambda: self._call("target", step.op, dict(t_args)))
        except Violation as violation:  # a hang
            self._attach_trace(violation)
            raise
        except Exception as exc:
            t_exc = exc
        if not self.target.strict and t_exc is None:
            chooser = self._chooser(self._fresh_ids_of(step, t_res))
            for model in self._sub_models().values():
                model.chooser = chooser
        m_exc: Optional[BaseException] = None
        m_res: Any = None
        try:
            m_res = self._call("model", step.op, dict(m_args))
        except ChoiceNotAllowed as exc:
            raise self._fail("conformance", f"{step.op}: the target took id {exc.chosen}, "
                             f"which the spec does not allow here (allowed: "
                             f"{sorted(exc.allowed)})", "free-id-choice") from exc
        except (err.PrefixCacheError, NotImplementedError) as exc:
            m_exc = exc
        try:
            for logger, message, error in take_unformattable():
                raise self._fail("conformance", f"{step.op}: the target logged a message its "
                                 f"arguments do not fit ({logger}: {message!r}: {error})",
                                 "log-format")
            self._untamper(step, tampered, refused=m_exc is not None)
            if m_exc is not None:
                self._judge_refusal(step, m_exc, t_exc, t_res)
            else:
                self._judge_success(step, t_res, t_exc, m_res)
        except Violation as violation:
            self._attach_trace(violation)
            raise
        return t_res

    def _tamper(self, ids: Dict[str, Any]) -> List[Tuple[str, Any, Any]]:
        """A caller who keeps a stale Block: give the named Blocks (and
        their handles) another ``block_id`` for this step; returns what to
        put back."""
        saved = []
        for name, block_id in ids.items():
            saved.append((name, self.blocks[name].block_id, block_id))
            self.blocks[name].block_id = self.handles[name].block_id = block_id
        return saved

    def _untamper(self, step: Step, saved: List[Tuple[str, Any, Any]], *,
                  refused: bool) -> None:
        for name, block_id, tampered in saved:
            changed = self.blocks[name].block_id != tampered
            self.blocks[name].block_id = self.handles[name].block_id = block_id
            if changed and refused:
                raise self._fail("robustness", f"{step.op} was refused but changed the id "
                                 f"of block {name} (given {tampered})", "changed:block-id")

    def _check_integrity_of(self, step: Step, t_res: Any) -> None:
        """A call the spec refused but the target answered with Blocks: are
        they on ids that hold other content (a hit on someone else's KV)?"""
        if step.op not in ("allocate_immutable_block", "allocate_immutable_blocks"):
            return
        blocks = t_res if isinstance(t_res, list) else [t_res]
        if self.white:  # a hit on an evictable id of other content: the hash collided
            self.ledger.observe_blocks(blocks)
            if self.ledger.collisions:
                raise self._fail("integrity", f"{step.op}: the target answered through a "
                                 "hash collision: " + "; ".join(self.ledger.anomalies()),
                                 "collision")
        for block in blocks:
            held = self._content_in_use_before(getattr(block, "block_id", None))
            if held is not None and held != _spelled_key(block):
                raise self._fail("integrity", f"{step.op}: the target answered with id "
                                 f"{block.block_id}, which holds other content {held!r}",
                                 "other-content")

    def _judge_refusal(self, step: Step, m_exc: BaseException,
                       t_exc: Optional[BaseException], t_res: Any = None) -> None:
        expected = type(m_exc)
        name = expected.__name__
        self.refused = name
        mistake = isinstance(m_exc, err.CallerError)
        if mistake and not self.mistakes:
            raise OracleError(f"{step.op}: a caller mistake ({name}: {m_exc}) was made "
                              "although mistakes are off")
        category = "robustness" if mistake else "conformance"
        self._event("caller-mistake" if mistake else f"refused:{name}")
        if t_exc is None:
            self._check_integrity_of(step, t_res)
        if t_exc is None or not self._accepts(m_exc, t_exc):
            raise self._unlike_refusal(step, category, name, m_exc, t_exc)
        self._compare_after(step, unchanged=True)
        if mistake:
            self._refused_mistake(self.white and self.state_checks)

    def _accepts(self, m_exc: BaseException, t_exc: BaseException) -> bool:
        """Whether the target's exception plays the role of the model's: a
        NoFreeBlocksError of prefixcache or of the target's own classes; for
        an empty evictor any ValueError (the API's: vLLM's evictor raises a
        plain one); for a caller mistake the same class, or any exception
        under the option ``any_mistake_exception``; else the same class."""
        if isinstance(m_exc, err.NoFreeBlocksError):
            return isinstance(t_exc, self._no_free)
        if isinstance(m_exc, err.EvictorEmptyError):
            return isinstance(t_exc, ValueError)
        if isinstance(m_exc, err.CallerError) and self.semantics.any_mistake_exception:
            return isinstance(t_exc, Exception)
        return isinstance(t_exc, type(m_exc))

    def _judge_success(self, step: Step, t_res: Any, t_exc: Optional[BaseException],
                       m_res: Any) -> None:
        if t_exc is not None:
            raise self._valid_call_raised(step, t_exc, API_EXCEPTIONS + self._no_free)
        if step.op in BLOCK_RESULTS:
            t_list = t_res if isinstance(t_res, list) else [t_res]
            m_list = m_res if isinstance(m_res, list) else [m_res]
            if len(t_list) != len(m_list):
                raise self._fail("conformance", f"{step.op}: {len(t_list)} blocks returned, "
                                 f"the spec gives {len(m_list)}", "result")
            names = step.out or [self._new_name() for _ in t_list]
            step.out = names
            for name, block, handle in zip(names, t_list, m_list):
                self.blocks[name], self.handles[name] = block, handle
        else:
            self._compare_result(step, t_res, m_res)
        if step.op == "free" and not step.args.get("keep_block_object"):
            self.dead.add(step.args["block"])
        self._compare_after(step, unchanged=False)

    def _compare_result(self, step: Step, t_res: Any, m_res: Any) -> None:
        if step.op == "find_cached_blocks_prefix":
            query = self._hashes_of(step.args["names"])
            if list(t_res) != query[:len(m_res)]:
                raise self._fail("conformance", f"find_cached_blocks_prefix: the target "
                                 f"found {len(t_res)} cached blocks, the spec "
                                 f"{len(m_res)}", "result")
            return
        if isinstance(m_res, float) or isinstance(t_res, float):
            same = isinstance(t_res, (int, float)) and math.isclose(
                t_res, m_res, rel_tol=1e-9, abs_tol=1e-12)
        elif step.op == "get_common_computed_block_ids":  # a List[int] (a str is not one)
            same = isinstance(t_res, (list, tuple)) and list(t_res) == list(m_res)
        elif step.op == "clear_copy_on_writes" or step.op == "get_and_reset_swaps":
            same = [tuple(p) for p in t_res] == [tuple(p) for p in m_res]
        else:
            same = t_res == m_res
        if not same:
            raise self._fail("conformance", f"{step.op}: the target answered {t_res!r}, "
                             f"the spec {m_res!r}", "result")

    # -- comparing the states --------------------------------------------------------------

    def _record_contents(self, live: List[str]) -> None:
        """Note the content key and hash of each of the ``live`` Blocks not noted yet."""
        for name in live:
            handle = self.handles[name]
            key = getattr(handle, "content_key", None)
            if key is not None and name not in self.keys:
                self.keys[name] = key
                content_hash = getattr(self.blocks[name], "content_hash", None)
                if content_hash is not None:
                    self.hashes[name] = content_hash

    def model_states(self) -> Dict[str, AbstractState]:
        """The model's abstract state per device ("" for one device), read
        once per step."""
        if self._model_states is None:
            self._model_states = {label: model.state()
                                  for label, model in self._sub_models().items()}
        return self._model_states

    def _content_in_use_before(self, block_id: Any) -> Optional[ContentKey]:
        """The content the model's id held in use before this step (None if
        it was free, evictable or mutable): handing such an id to other
        content shares someone else's KV, an integrity violation; taking a
        wrong free or evictable id is only a conformance one."""
        for state in (self._previous_model_states or {}).values():
            block = state.blocks.get(block_id)
            if block is not None and block.refcount > 0:
                return block.content
        return None

    def _compare_after(self, step: Step, *, unchanged: bool) -> None:
        what = after_call(unchanged)
        category = "robustness" if unchanged else "conformance"
        live = self.live_names()
        for name in live:
            t_id = getattr(self.blocks[name], "block_id", None)
            m_id = self.handles[name].block_id
            if t_id != m_id:
                key = getattr(self.handles[name], "content_key", None)
                held = self._content_in_use_before(t_id)
                if key is not None and self.white:
                    try:
                        self._target_states()  # feeds the ledger with this step's hashes
                    except Violation:
                        pass
                    if self.ledger.collisions:
                        raise self._fail("integrity", f"{step.op}: block {name} got id "
                                         f"{t_id} through a hash collision: "
                                         + "; ".join(self.ledger.anomalies()), "collision")
                if key is not None and held is not None and held != key:
                    raise self._fail("integrity", f"{step.op}: block {name} holds content "
                                     f"{key!r} but the target gave it id {t_id}, which "
                                     f"holds {held!r}", "other-content")
                raise self._fail(category, f"{step.op}: {what}, block {name} has id {t_id} "
                                 f"in the target, {m_id} in the spec", "block-id")
        for name in live:  # the flag a cache hit sets on the Block object
            computed = _computed_flag(self.blocks[name])
            if computed is not _ABSENT and computed is not self.handles[name].computed:
                raise self._fail(category, f"{step.op}: {what}, block {name}.computed is "
                                 f"{computed!r} in the target, {self.handles[name].computed} "
                                 f"in the spec", "block-computed")
        self._compare_free(step, unchanged, self._free_counts())
        self._record_contents(live)
        if self.white and self.state_checks:
            self._compare_states(step, unchanged, [self.blocks[n] for n in live])
        self._note_events()

    def _free_counts(self) -> Dict[str, Tuple[int, int]]:
        # a recording answers with the count it recorded, without a step
        recorded = getattr(type(self.allocator), "recorded_free_count", None) is not None
        count = self.allocator.recorded_free_count if recorded \
            else self.allocator.get_num_free_blocks
        if self.kind == "cpu_gpu":
            return {d: (count(self.device(d)), self.model.get_num_free_blocks(d))
                    for d in ("GPU", "CPU")}
        return {"": (count(), self.model.get_num_free_blocks())}

    def _target_states(self, live: Optional[List[Any]] = None) -> Dict[str, AbstractState]:
        """The target's abstract state per device; ``live``: the live Blocks
        (default: listed afresh)."""
        if live is None:
            live = [self.blocks[n] for n in self.live_names()]
        states: Dict[str, AbstractState] = {}
        for label, alloc in self.sub_allocators().items():
            ids = alloc.all_block_ids
            mine = [b for b in live if getattr(b, "block_id", None) in ids]
            try:
                states[label] = abstract_state(alloc, ledger=self.ledger, live_blocks=mine)
            except AnswerTypeError as exc:
                raise self._fail("conformance", str(exc), "answer-type") from exc
            except AbstractionError as exc:
                raise self._fail("integrity", f"the target caches a hash that no block "
                                 f"spells: {exc}", "unnamed-hash") from exc
        return states

    def broken_invariants(self, label: str, state: AbstractState, live: List[Any]) -> List[str]:
        """The invariants ``state``, the target's on device ``label``, breaks,
        with the live Blocks ``live`` as the owners of its ids (none for an
        allocator without a cache)."""
        if not is_prefix_caching(self.sub_allocators()[label]):
            return []
        owners = Counter(b.block_id for b in {id(b): b for b in live}.values()
                         if b.block_id in state.blocks)
        return check_all(state, dict(owners))

    def _compare_states(self, step: Step, unchanged: bool, live: List[Any]) -> None:
        """The target's state against the model's (and, after a refusal,
        against its own before the step), every invariant on it; ``live``:
        the live Blocks."""
        states = self._target_states(live)  # feeds the ledger first
        if self.ledger.collisions or self.ledger.conflicts:
            raise self._fail("integrity", "; ".join(self.ledger.anomalies()),
                             "collision" if self.ledger.collisions else "shared-id")
        models = self.model_states()
        for label, state in states.items():
            changed = ("", "")
            if unchanged and self._before is not None and label in self._before:
                # the option failed_query_counted lets a refusal count its queries
                # (the comparison with the model below checks how many)
                counted = self.semantics.failed_query_counted and self.refused is not None \
                    and self.refused == err.NoFreeBlocksError.__name__
                changed = first_difference(self._before[label], state, ordered_free=True,
                                            ignore=("hits", "misses") if counted else ())
            broken = self.broken_invariants(label, state, live)
            self._judge_state(step, changed, broken, _MEANINGS, functools.partial(
                first_difference, state, models[label], ordered_free=self.target.strict))
        self._before = states

    def _note_events(self) -> None:
        before = self._previous_model_states or {}
        for label, state in self.model_states().items():
            prefix = f"{label.lower()}:" if label else ""
            if label in before:
                for transition in _transitions(before[label], state):
                    self._event(f"{prefix}transition:{transition}")
            if state.evictor:
                self._event(f"{prefix}state:evictable-blocks")
            if state.reported_free == 0:
                self._event(f"{prefix}state:pool-full")
            if state.copy_on_writes:
                self._event(f"{prefix}state:pending-copy-on-write")
            if state.touched:
                self._event(f"{prefix}state:touched-not-computed")
            if any(b.refcount > 1 for b in state.blocks.values()):
                self._event(f"{prefix}state:shared-block")
            if state.hits:
                self._event(f"{prefix}state:cache-hit-seen")


def _transitions(old: AbstractState, new: AbstractState) -> List[str]:
    """The spec-level transitions one step made, read from two model states."""
    found = []
    if new.hits > old.hits:
        found.append("cache-hit")
    if new.misses > old.misses:
        found.append("cache-miss")
    if len(new.copy_on_writes) > len(old.copy_on_writes):
        found.append("copy-on-write")
    if new.touched - old.touched:
        found.append("promotion")
    old_evictable = {e.block_id: e.content for e in old.evictor}
    new_evictable = {e.block_id for e in new.evictor}
    for block_id, content in old_evictable.items():
        if block_id in new_evictable:
            continue
        now = new.blocks.get(block_id)
        if now is not None and now.content == content:
            found.append("evictable-revived")
        elif now is not None or block_id in new.free:
            found.append("eviction" if new.cached or now is not None else "reset-frees")
    if new_evictable - set(old_evictable):
        found.append("became-evictable")
    if [e.block_id for e in new.evictor] != [e.block_id for e in old.evictor if
                                             e.block_id in new_evictable] and \
            set(old_evictable) == new_evictable:
        found.append("evictor-reordered")
    released = [i for i in old.blocks if old.blocks[i].content is None and i in new.free]
    shared = [i for i, b in new.blocks.items()
              if b.content is not None and i in old.blocks and b.refcount > old.blocks[i].refcount]
    if released and shared and new.hits == old.hits:
        found.append("duplicate-promotion")
    elif released:
        found.append("mutable-id-freed")
    return sorted(set(found))


def _block_part(x: Optional[BlockState], y: Optional[BlockState]) -> str:
    """Which part of one id's state differs: ``presence`` (free on one
    side) or the first field of :class:`BlockState` that differs."""
    if x is None or y is None:
        return "presence"
    return next(f.name for f in fields(BlockState) if getattr(x, f.name) != getattr(y, f.name))


def first_difference(a: Any, b: Any, *, ordered_free: bool = True,
                     ignore: Tuple[str, ...] = ()) -> Tuple[str, str]:
    """(the part, a sentence) naming the first field, not in ``ignore``,
    where two states (an :class:`AbstractState` or a v1 state) differ, or
    ("", "") when they agree.  The part names the field, and for ``blocks``
    the field of the id's state."""
    if a == b:  # the common case: equal fields agree however they are compared below
        return "", ""
    for f in fields(a):
        if f.name in ignore:
            continue
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name == "free" and not ordered_free:
            x, y = sorted(x), sorted(y)
        elif f.name in ("cached", "blocks") or isinstance(x, dict) or isinstance(y, dict):
            x, y = dict(x), dict(y)
            if f.name == "blocks" and x != y:
                for i in sorted(set(x) | set(y)):
                    if x.get(i) != y.get(i):
                        return (f"blocks.{_block_part(x.get(i), y.get(i))}",
                                f"id {i} is {x.get(i)} vs {y.get(i)}")
        if x != y:
            return f.name, f"{f.name} is {x!r} vs {y!r}"
    return "", ""
