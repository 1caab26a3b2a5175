"""Production traces: record what an allocator was asked and answered, and
judge the recording offline.

:class:`RecordingAllocator` wraps any allocator instance (prefix, naive or
device pair).  Every call through it, and every ``append_token_ids`` on a
Block it handed out, is appended to a :class:`~prefixcache.oracle.trace.Trace`
with the answer: the result (Blocks as ids), the exception class, the ids
and content hashes of the Blocks involved afterwards, and the free count.
The engine gets :class:`RecordedBlock` proxies that behave as the Blocks.
A ``find_cached_blocks_prefix`` query is recorded by the Blocks it asks
about: each hash as the name of the last recorded Block that carried it,
and a hash no recorded Block carried (content the allocator never cached)
as ``{"hash": <the hash>}``.

:func:`recorded_target` turns such a trace back into a target whose
answers are the recorded ones, so ``prefixcache replay`` can hold a run
recorded inside a real engine against the model, with no engine at hand.
"""

from __future__ import annotations

import builtins
from typing import Any, Dict, List, Optional

from ..impl import errors as err
from ..spec.operations import DEVICE, NEW_BLOCK, NEW_BLOCKS, argument_names, returning
from .targets import Target
from .trace import Step, Trace

#: from the spec's table of operations: the arguments that name a device,
#: and the operations that hand out new Blocks
_DEVICE_ARGS = argument_names(DEVICE)
_BLOCK_RESULTS = returning(NEW_BLOCK, NEW_BLOCKS)


class RecordedBlock:
    """A Block handed out through a :class:`RecordingAllocator`: attribute
    reads pass through to the real Block; ``append_token_ids`` is recorded."""

    __slots__ = ("_real", "_recorder", "_name")

    def __init__(self, real: Any, recorder: RecordingAllocator, name: str) -> None:
        object.__setattr__(self, "_real", real)
        object.__setattr__(self, "_recorder", recorder)
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._real, attr)
        if attr == "prev_block" and value is not None:
            return self._recorder._proxy_of(value)
        return value

    def __setattr__(self, attr: str, value: Any) -> None:
        setattr(self._real, attr, value)

    def append_token_ids(self, token_ids: List[int]) -> None:
        """Append through the real Block, recording the call and its answer."""
        self._recorder._record("append_token_ids", {"block": self._name,
                                                    "token_ids": list(token_ids)},
                               lambda: self._real.append_token_ids(token_ids), [self])


class RecordingAllocator:
    """Wraps ``allocator`` and records every call as a trace step.

    ``num_blocks`` is the pool size (per device for a pair) and
    ``block_size`` the block size, as the trace must state them."""

    def __init__(self, allocator: Any, num_blocks: int, block_size: int, *,
                 kind: str = "prefix", name: Optional[str] = None) -> None:
        self._allocator = allocator
        self.trace = Trace(num_blocks=num_blocks, block_size=block_size, kind=kind,
                           target=name or f"{type(allocator).__module__}:"
                                          f"{type(allocator).__qualname__}")
        self._proxies: Dict[int, RecordedBlock] = {}
        self._count = 0
        #: content hash -> the name of the last recorded Block that carried it
        self._carriers: Dict[Any, str] = {}

    # -- bookkeeping -------------------------------------------------------------

    def _proxy_of(self, real: Any) -> Any:
        proxy = self._proxies.get(id(real))
        return proxy if proxy is not None and proxy._real is real else real

    def _wrap(self, real: Any) -> RecordedBlock:
        name = f"b{self._count}"
        self._count += 1
        proxy = RecordedBlock(real, self, name)
        self._proxies[id(real)] = proxy
        return proxy

    def _encode(self, key: str, value: Any) -> Any:
        if isinstance(value, RecordedBlock):
            return value._name
        if key in _DEVICE_ARGS and value is not None:
            return str(getattr(value, "name", value))
        if isinstance(value, (list, tuple)):
            return [self._encode(key, v) for v in value]
        return value

    def _unwrap(self, value: Any) -> Any:
        if isinstance(value, RecordedBlock):
            return value._real
        if isinstance(value, list):
            return [self._unwrap(v) for v in value]
        return value

    def _query_name(self, content_hash: Any) -> Any:
        """How a hash of a cache query is recorded: the name of the last
        recorded Block that carried it, else ``{"hash": content_hash}``."""
        name = self._carriers.get(content_hash) if type(content_hash) is int else None
        return name or {"hash": content_hash}

    def _free_count(self) -> Any:
        alloc = self._allocator
        if self.trace.kind == "cpu_gpu":
            return {str(getattr(d, "name", d)): alloc.get_num_free_blocks(d)
                    for d in alloc._allocators}
        return alloc.get_num_free_blocks()

    def _record(self, op: str, args: Dict[str, Any], call: Any,
                blocks: List[RecordedBlock]) -> Any:
        step = Step(op=op, args=args)
        self.trace.steps.append(step)
        try:
            result = call()
        except Exception as exc:
            step.expect = {"raises": type(exc).__name__, "free": self._free_count(),
                           "ids": {b._name: b._real.block_id for b in blocks}}
            raise
        expect: Dict[str, Any] = {}
        if op in _BLOCK_RESULTS:
            made = [self._wrap(r) for r in (result if isinstance(result, list) else [result])]
            step.out = [r._name for r in made]
            blocks = blocks + made
            result = made if isinstance(result, list) else made[0]
        else:
            expect["result"] = _jsonable(result)
        expect["ids"] = {b._name: b._real.block_id for b in blocks}
        expect["hashes"] = {b._name: b._real.content_hash for b in blocks
                            if getattr(b._real, "content_hash", None) is not None}
        self._carriers.update((h, name) for name, h in expect["hashes"].items())
        expect["free"] = self._free_count()
        step.expect = expect
        return result

    def __getattr__(self, op: str) -> Any:
        method = getattr(self._allocator, op)
        if not callable(method):
            return method

        def recorded(*args: Any, **kwargs: Any) -> Any:
            params = _bind(method, args, kwargs)
            blocks = [v for v in params.values() if isinstance(v, RecordedBlock)]
            blocks += [b for v in params.values() if isinstance(v, list)
                       for b in v if isinstance(b, RecordedBlock)]
            encoded = {k: self._encode(k, v) for k, v in params.items()}
            if op == "find_cached_blocks_prefix" and params:
                hashes = encoded.pop(next(iter(params)))   # the hash list, however named
                names = list(map(self._query_name, hashes)) if isinstance(hashes, list) \
                    else hashes
                encoded = {"names": names, **encoded}
            real_args = [self._unwrap(a) for a in args]
            real_kwargs = {k: self._unwrap(v) for k, v in kwargs.items()}
            return self._record(op, encoded, lambda: method(*real_args, **real_kwargs), blocks)

        return recorded

    @property
    def all_block_ids(self) -> Any:
        """The wrapped allocator's ids (recorded)."""
        return self._record("all_block_ids", {}, lambda: self._allocator.all_block_ids, [])


def _bind(method: Any, args: Any, kwargs: Dict[str, Any]) -> Dict[str, Any]:
    import inspect

    try:
        bound = inspect.signature(method).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return {f"arg{i}": a for i, a in enumerate(args)} | kwargs
    return dict(bound.arguments)


def _jsonable(value: Any) -> Any:
    if isinstance(value, (frozenset, set)):
        return sorted(value)
    if isinstance(value, dict):
        return [[k, v] for k, v in value.items()]
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


# -- playing a recording back -----------------------------------------------------


class _PlayedBlock:
    """Stands for a recorded Block: its id and hash as recorded."""

    def __init__(self, player: _Player, name: str) -> None:
        self.player, self.name = player, name
        self.block_id: Optional[int] = None
        self.content_hash: Optional[int] = None

    def append_token_ids(self, token_ids: List[int]) -> None:
        self.player._answer("append_token_ids")


def _exception(name: str) -> BaseException:
    cls = getattr(err, name, None) or getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, BaseException):
        return cls(f"recorded {name}")
    return RuntimeError(f"recorded {name}")


class _Player:
    """An allocator that answers with a trace's recorded answers, in order."""

    def __init__(self, trace: Trace) -> None:
        self._steps = list(trace.steps)
        self._next = 0
        self._free: Any = trace.num_blocks
        self._blocks: Dict[str, _PlayedBlock] = {}

    def _block(self, name: str) -> _PlayedBlock:
        return self._blocks.setdefault(name, _PlayedBlock(self, name))

    def _answer(self, op: str) -> Any:
        step = self._steps[self._next]
        self._next += 1
        if step.op != op:
            raise RuntimeError(f"the recording has {step.op} here, the replay asked {op}")
        expect = step.expect or {}
        self._free = expect.get("free", self._free)
        for name, block_id in expect.get("ids", {}).items():
            self._block(name).block_id = block_id
        for name, content_hash in expect.get("hashes", {}).items():
            self._block(name).content_hash = content_hash
        if "raises" in expect:
            raise _exception(expect["raises"])
        if step.out:
            blocks = [self._block(n) for n in step.out]
            return blocks if op in ("allocate_immutable_blocks", "fork") else blocks[0]
        result = expect.get("result")
        if op == "all_block_ids":
            return frozenset(result or ())
        if op == "swap":
            return {k: v for k, v in result or []}
        if op in ("clear_copy_on_writes", "get_and_reset_swaps"):
            return [tuple(p) for p in result or []]
        return result

    def recorded_free_count(self, device: Any = None) -> int:
        """The free count recorded after the last answered call."""
        if isinstance(self._free, dict):
            return int(self._free[str(getattr(device, "name", device))])
        return int(self._free)

    @property
    def all_block_ids(self) -> Any:
        return self._answer("all_block_ids")

    def __getattr__(self, op: str) -> Any:
        if op.startswith("_"):
            raise AttributeError(op)
        return lambda *args, **kwargs: self._answer(op)


def recorded_target(trace: Trace) -> Target:
    """A target whose answers are those recorded in ``trace``."""
    return Target(name=f"recording of {trace.target}", kind=trace.kind,
                  build=lambda n, size: _Player(trace), strict=trace.strict)
