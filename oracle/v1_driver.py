"""Runs one step of the v1 profile on the target pool and on the v1 model,
and judges the target.

The :class:`V1Driver` owns a target ``BlockPool`` and a
:class:`~prefixcache.model.v1_model.V1Model` of the same size.  Blocks are
named by id: the driver hands the target its own block objects (``blocks[i]``
where the target has them, else the objects it handed out), and the model
the ids.  Chains are given by their tokens; the driver computes their block
hashes as vLLM chains them (:func:`~prefixcache.spec.v1_state.chain_hashes`).
After every step it compares:

* black-box, for any target: the answer of the call (ids, hits, booleans,
  counts), ``get_num_free_blocks()`` and ``get_usage()``;
* white-box, where the target has ``BlockPool``-shaped internals: the whole
  abstract state (:func:`~prefixcache.spec.v1_abstraction.abstract_v1`)
  against the model's, and every v1 invariant.

A caller mistake (the model refuses: a row of the v1 error table) must raise
``ValueError`` in the target (any exception under the option
``any_mistake_exception``) and change nothing; a request for more blocks than
are free must raise ``ValueError`` and change nothing.  Anything else raises a
:class:`~prefixcache.oracle.violations.Violation` whose signature names the
category, the operation and the rule, invariant or row broken.
"""

from __future__ import annotations

import math
import types
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..model.v1_model import V1Model, V1Refusal
from ..spec.semantics import PREFIXCACHE, Semantics
from ..spec.v1_abstraction import abstract_v1
from ..spec.v1_invariants import V1_INVARIANTS, check_all_v1
from ..spec.v1_state import BlockHash, HashedContent, V1State, chain_hashes
from .driver import Lockstep, after_call, first_difference
from .mistakes import OracleError
from .targets import Target
from .trace import Step
from .v1_targets import V1_KIND, null_block_of, takes_evict_first
from .violations import Violation
from .vllm_v1_source import repr_sha256

#: The hash of "no parent" for the chains the oracle makes (any fixed bytes
#: serve: the pool keys by the caller's hashes and never recomputes them).
NONE_HASH: BlockHash = b"prefixcache-v1-none-hash".ljust(32, b"\0")

#: The exceptions a v1 pool's API raises on purpose: a valid call raising one
#: of them is a conformance finding, anything else a crash.
V1_API_EXCEPTIONS: Tuple[type, ...] = (ValueError,)

_MEANINGS: Dict[str, str] = {inv.name: inv.meaning.replace("``", "") for inv in V1_INVARIANTS}


def chain(tokens: Sequence[Sequence[int]], salt: Optional[str]
          ) -> Tuple[List[BlockHash], Dict[BlockHash, HashedContent]]:
    """The block hashes of the chain ``tokens`` (one entry per hash block)
    under ``salt``, made with :func:`~.vllm_v1_source.repr_sha256`, and what
    each hash stands for."""
    blocks = [tuple(t) for t in tokens]
    hashes = chain_hashes(repr_sha256, NONE_HASH, blocks, salt)
    return hashes, {h: (salt, tuple(blocks[:k + 1])) for k, h in enumerate(hashes)}


def has_pool_internals(pool: Any) -> bool:
    """Whether ``pool`` has the internals the v1 abstraction reads."""
    queue = getattr(pool, "free_block_queue", None)
    hash_map = getattr(pool, "cached_block_hash_to_block", None)
    return (isinstance(getattr(pool, "blocks", None), list) and queue is not None
            and hasattr(queue, "fake_free_list_head") and hash_map is not None
            and isinstance(getattr(hash_map, "_cache", None), dict)
            and isinstance(getattr(pool, "cached_block_hashes_by_block", None), dict)
            and null_block_of(pool) is not None)


class V1Driver(Lockstep):
    """A target pool and the v1 model in lockstep, judged after every step.

    ``white_box`` compares abstract states and invariants where the target
    has BlockPool-shaped internals; ``semantics`` decides how a refusal is
    judged (``any_mistake_exception``); ``mistakes=False`` promises valid
    calls only (a step the model refuses as a caller mistake is then a bug of
    the oracle: OracleError); ``call_timeout`` bounds each call of the target."""

    def __init__(self, target: Target, num_blocks: int, block_size: int, *,
                 white_box: bool = True, semantics: Semantics = PREFIXCACHE,
                 mistakes: bool = True, call_timeout: Optional[float] = None,
                 check_model: bool = False) -> None:
        """A fresh target pool of ``num_blocks`` ids hashing every
        ``block_size`` tokens, and the model of the same pool."""
        super().__init__(target, num_blocks, block_size, kind=V1_KIND, strict=True,
                         semantics=semantics, mistakes=mistakes, call_timeout=call_timeout)
        self.pool = self._guard("construct the target",
                                lambda: target.make(num_blocks, block_size))
        self.model = V1Model(num_blocks, block_size, check_invariants=check_model)
        #: id -> the target's block object, for every block it has shown
        self.objects: Dict[int, Any] = {}
        null = null_block_of(self.pool)
        if null is not None and isinstance(getattr(null, "block_id", None), int):
            self.objects[null.block_id] = null
        self.white = white_box and has_pool_internals(self.pool)
        #: whether the pool's free_blocks takes evict_first (new in 0.34.0)
        self.evict_first = takes_evict_first(self.pool)
        self._before: Optional[V1State] = self._abstract() if self.white else None

    # -- helpers ------------------------------------------------------------------------

    def can_name(self, block_id: int) -> bool:
        """Whether the driver can hand the target block ``block_id``."""
        return block_id in self.objects or (
            self.white and 0 <= block_id < len(self.pool.blocks))

    def _object(self, block_id: int) -> Any:
        if self.white and 0 <= block_id < len(self.pool.blocks):
            return self.pool.blocks[block_id]
        if block_id not in self.objects:
            raise KeyError(f"the trace names block {block_id}, which the target never showed")
        return self.objects[block_id]

    def _ids(self, blocks: Any) -> Any:
        """The ids of the block objects ``blocks`` (None stays None); each is remembered."""
        if blocks is None:
            return None
        out = []
        for block in blocks:
            block_id = getattr(block, "block_id", block)
            if isinstance(block_id, int):
                self.objects.setdefault(block_id, block)
            out.append(block_id)
        return out

    def _abstract(self) -> V1State:
        try:
            return abstract_v1(self.pool, self.model.contents, self.trace.block_size)
        except Exception as exc:  # a structure too broken to read is an invariant breach
            raise self._fail("invariant", f"{self._op}: the target's state cannot be read "
                             f"({type(exc).__name__}: {exc})", "readable-state") from exc

    # -- calling each side ----------------------------------------------------------------

    def _target_call(self, op: str, args: Dict[str, Any]) -> Callable[[], Any]:
        """The call of the target ``op`` with ``args``, its blocks resolved
        now: a trace that names a block the target never showed, or an
        unknown operation, raises KeyError here, not as the target's answer."""
        pool = self.pool
        objects = {name: [self._object(i) for i in args[name]]
                   for name in ("blocks", "ordered_blocks") if name in args}
        if op == "get_new_blocks":
            return lambda: self._ids(pool.get_new_blocks(args["num_blocks"]))
        if op == "cache_full_blocks":
            hashes, _ = chain(args["tokens"], args.get("salt"))
            request = types.SimpleNamespace(block_hashes=hashes)
            return lambda: pool.cache_full_blocks(
                request, objects["blocks"], args["num_cached_blocks"], args["num_full_blocks"],
                args["block_size"], args["kv_cache_group_id"])
        if op == "get_cached_block":
            hashes, _ = chain(args["tokens"], args.get("salt"))
            return lambda: self._ids(pool.get_cached_block(
                hashes[-1] if hashes else b"", list(args["kv_cache_group_ids"])))
        if op == "touch":
            return lambda: pool.touch(objects["blocks"])
        if op == "free_blocks":
            if not args.get("evict_first"):  # as a pool without evict_first takes it too
                return lambda: pool.free_blocks(objects["ordered_blocks"])
            if not self.evict_first:
                raise KeyError("the trace frees with evict_first=True, which this pool's "
                               "free_blocks does not take")
            return lambda: pool.free_blocks(objects["ordered_blocks"], evict_first=True)
        if op == "evict_blocks":
            return lambda: pool.evict_blocks(set(args["block_ids"]))
        if op in ("reset_prefix_cache", "get_num_free_blocks", "get_usage"):
            return getattr(pool, op)  # type: ignore[no-any-return]
        raise KeyError(f"the trace names an unknown v1 operation {op!r}")

    def _call_model(self, op: str, args: Dict[str, Any]) -> Any:
        model = self.model
        if op == "cache_full_blocks":
            hashes, contents = chain(args["tokens"], args.get("salt"))
            model.record(contents)
            return model.cache_full_blocks(hashes, list(args["blocks"]),
                                           args["num_cached_blocks"], args["num_full_blocks"],
                                           args["block_size"], args["kv_cache_group_id"])
        if op == "get_cached_block":
            hashes, contents = chain(args["tokens"], args.get("salt"))
            model.record(contents)
            return model.get_cached_block(hashes[-1], list(args["kv_cache_group_ids"]))
        if op == "touch":
            return model.touch(list(args["blocks"]))
        if op == "free_blocks":
            return model.free_blocks(list(args["ordered_blocks"]),
                                     evict_first=args.get("evict_first", False))
        if op == "evict_blocks":
            return model.evict_blocks(list(args["block_ids"]))
        return getattr(model, op)(**args)

    # -- the step -------------------------------------------------------------------------

    def run(self, step: Step) -> Any:
        self._begin(step)
        self._event(f"op:{step.op}")
        args = {k: v for k, v in step.args.items() if not k.startswith("_")}
        keys_before = dict(self.model.key_of)
        call = self._target_call(step.op, args)
        t_exc: Optional[BaseException] = None
        t_res: Any = None
        try:
            try:
                t_res = self._timed(call)
            except Violation:
                raise
            except Exception as exc:
                t_exc = exc
            m_exc: Optional[V1Refusal] = None
            m_res: Any = None
            try:
                m_res = self._call_model(step.op, args)
            except V1Refusal as exc:
                m_exc = exc
            if m_exc is not None:
                self._judge_refusal(step, m_exc, t_exc)
            else:
                self._judge_success(step, t_res, t_exc, m_res)
                self._note_events(step, keys_before, m_res)
        except Violation as violation:
            self._attach_trace(violation)
            raise
        return t_res

    def _judge_refusal(self, step: Step, m_exc: V1Refusal,
                       t_exc: Optional[BaseException]) -> None:
        """The model refused: the target must raise (ValueError, or any
        exception for a mistake under ``any_mistake_exception``) and change
        nothing.  The row the model names goes into the step (``_row``) and
        the signature, so that a shrunk program still says which row it is."""
        row = m_exc.row
        capacity = row == "get_new_blocks:too-many"
        if row and not capacity:
            step.args["_row"] = row
        tag = row.partition(":")[2] if row else "malformed"
        self.refused = "ValueError"
        if not capacity and not self.mistakes:
            raise OracleError(f"{step.op}: a caller mistake (ValueError: {m_exc}) was made "
                              "although mistakes are off")
        category = "conformance" if capacity else "robustness"
        self._event("refused:no-free-blocks" if capacity else f"caller-mistake:{row or step.op}")
        accepted = isinstance(t_exc, ValueError) or (
            not capacity and self.semantics.any_mistake_exception and isinstance(t_exc, Exception))
        if not accepted:
            raise self._unlike_refusal(step, category, "ValueError", m_exc, t_exc,
                                       "" if capacity else f":{tag}")
        self._compare_after(step, unchanged=True)
        if not capacity:
            self._refused_mistake(self.white)

    def _judge_success(self, step: Step, t_res: Any, t_exc: Optional[BaseException],
                       m_res: Any) -> None:
        if t_exc is not None:
            raise self._valid_call_raised(step, t_exc, V1_API_EXCEPTIONS)
        if step.op == "get_usage":
            same = isinstance(t_res, (int, float)) and math.isclose(
                t_res, m_res, rel_tol=1e-9, abs_tol=1e-12)
        elif step.op in ("cache_full_blocks", "touch", "free_blocks", "evict_blocks"):
            same = True  # they answer None; what they did shows in the state
        else:
            same = t_res == m_res
        if not same:
            raise self._fail("conformance", f"{step.op}: the target answered {t_res!r}, "
                             f"the spec {m_res!r}", "result")
        self._compare_after(step, unchanged=False)

    def _compare_after(self, step: Step, *, unchanged: bool) -> None:
        self._compare_free(step, unchanged, {"": (self.pool.get_num_free_blocks(),
                                                  self.model.get_num_free_blocks())})
        t_usage, m_usage = self.pool.get_usage(), self.model.get_usage()
        if not math.isclose(t_usage, m_usage, rel_tol=1e-9, abs_tol=1e-12):
            raise self._fail("robustness" if unchanged else "conformance",
                             f"{step.op}: {after_call(unchanged)}, get_usage() is {t_usage} in the "
                             f"target, {m_usage} in the spec", "usage")
        if not self.white:
            return
        state = self._abstract()
        # contents: what the caller knows of its hashes (the model records a
        # refused call's hashes too), not the pool's state
        changed = first_difference(self._before, state, ignore=("contents",)) \
            if unchanged and self._before is not None else ("", "")
        self._judge_state(step, changed, check_all_v1(state), _MEANINGS,
                          lambda: first_difference(state, self.model.state()))
        self._before = state

    def _note_events(self, step: Step, keys_before: Dict[int, Any], result: Any) -> None:
        """Coverage: the transitions this step made and the states it reached."""
        model = self.model
        if step.op == "get_cached_block":
            self._event("transition:cache-hit" if result is not None else "transition:miss")
        if step.op == "get_new_blocks" and any(i in keys_before for i in result or []):
            self._event("transition:eviction")
        if step.op == "touch" and any(model.ref[i] == 1 and i in model.key_of
                                      for i in step.args.get("blocks", []) if i):
            self._event("transition:revived")
        if step.op == "cache_full_blocks" and any(
                i in keys_before for i in step.args.get("blocks", []) if i):
            self._event("transition:recached-longer")
        if step.op == "free_blocks" and step.args.get("evict_first"):
            self._event("transition:evict-first")
        if step.op == "reset_prefix_cache":
            self._event(f"transition:reset-{'done' if result else 'refused'}")
        if any(len(ids) > 1 for ids in model.cached.values()):
            self._event("state:duplicate-keys")
        if not model.queue:
            self._event("state:pool-full")
        if any(i in model.key_of for i in model.queue):
            self._event("state:evictable-blocks")
        if any(n > 1 for n in model.ref):
            self._event("state:shared-block")
        if len({key[1] for key in model.cached}) > 1:
            self._event("state:two-groups")
