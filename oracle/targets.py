"""What the oracle judges: a target allocator, named ``module:Class`` or given
as a factory callable, and how to build one of a given size.

``vllm==VERSION[:Class]`` names a pinned vLLM release's own allocator
(:mod:`prefixcache.oracle.vllm_source`): ``PrefixCachingBlockAllocator``
unless another class of its ``naive_block``, ``prefix_caching_block`` or
``cpu_gpu_block_allocator`` is named (``vllm==0.8.5:CpuGpuBlockAllocator``).

Three kinds of target, told apart by their constructor:

* ``prefix``: ``Class(num_blocks=..., block_size=...)`` -- a prefix-caching
  allocator for one device (``PrefixCachingBlockAllocator``'s shape);
* ``naive``: ``Class(create_block=..., num_blocks=..., block_size=...)`` --
  an allocator without a cache (``NaiveBlockAllocator``'s shape), given the
  ``NaiveBlock`` class of the target's own module (or prefixcache's);
* ``cpu_gpu``: ``Class.create(allocator_type, num_gpu_blocks, num_cpu_blocks,
  block_size)`` -- a device pair (``CpuGpuBlockAllocator``'s shape).

A factory callable ``(num_blocks, block_size) -> allocator`` is a ``prefix``
target unless told otherwise.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Tuple, Union

from ..spec.operations import missing

DEFAULT_TARGET = "prefixcache.impl.prefix_caching_block:PrefixCachingBlockAllocator"
#: The same allocator with the spec's contracts (on unless PREFIXCACHE_CONTRACTS=0).
CHECKED_TARGET = "prefixcache.spec.checked:CheckedPrefixCachingBlockAllocator"
KINDS = ("prefix", "naive", "cpu_gpu")
#: How a target string names a pinned vLLM release.
VLLM_PREFIX = "vllm=="

Factory = Callable[[int, int], Any]


class TargetError(ValueError):
    """The target cannot be loaded or built (a usage error: exit code 2)."""


@dataclass(frozen=True)
class Target:
    """A buildable allocator under test.

    ``name`` is how it was named (``module:Class`` or the factory's
    qualified name); ``kind`` one of :data:`KINDS`; ``strict`` whether the
    model demands vLLM's order of free ids (False: any free id the spec
    allows, the model follows the target's choice)."""

    name: str
    kind: str
    build: Callable[[int, int], Any]
    strict: bool = True
    #: the constructor options, as JSON values (a trace records them)
    options: Dict[str, Any] = field(default_factory=dict)

    def make(self, num_blocks: int, block_size: int) -> Any:
        """A fresh allocator with ``num_blocks`` ids (per device for
        ``cpu_gpu``) of ``block_size`` tokens."""
        return self.build(num_blocks, block_size)


def load_object(spec: str) -> Any:
    """The object ``MODULE:NAME`` names (``NAME`` may be dotted); TargetError
    when it cannot be imported or found."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise TargetError(f"a target is named MODULE:CLASS, got {spec!r}")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise TargetError(f"cannot import {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise TargetError(f"{module_name!r} has no attribute {attr!r}") from exc
    return obj


def _vllm_class(spec: str) -> Any:
    """The allocator class ``vllm==VERSION[:Class]`` names, from that release's
    own code (loaded by vllm_source.load, under a private package name)."""
    from . import vllm_source

    version, _, class_name = spec[len(VLLM_PREFIX):].partition(":")
    try:
        ref = vllm_source.load(version)
    except vllm_source.VllmSourceError as exc:
        raise TargetError(str(exc)) from exc
    bases = (ref.interfaces.BlockAllocator, ref.interfaces.DeviceAwareBlockAllocator)
    allocators = {
        name: obj
        for module in (ref.naive_block, ref.prefix_caching_block, ref.cpu_gpu_block_allocator)
        for name, obj in vars(module).items()
        if inspect.isclass(obj) and obj.__module__ == module.__name__
        and issubclass(obj, bases) and not inspect.isabstract(obj)
    }
    cls = allocators.get(class_name or "PrefixCachingBlockAllocator")
    if cls is None:
        raise TargetError(f"vLLM {version} has no allocator class {class_name!r}; it has "
                          f"{', '.join(sorted(allocators))}")
    return cls


def _guess_kind(cls: type) -> str:
    if callable(getattr(cls, "create", None)) and isinstance(
        inspect.getattr_static(cls, "create"), staticmethod
    ):
        return "cpu_gpu"
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return "prefix"
    return "naive" if "create_block" in params else "prefix"


def naive_block_class(cls: type) -> Any:
    """The Block class a naive allocator class builds its Blocks with: its
    module's ``NaiveBlock``, else prefixcache's."""
    module = importlib.import_module(cls.__module__)
    block = getattr(module, "NaiveBlock", None)
    if block is None:
        from ..impl.naive_block import NaiveBlock

        block = NaiveBlock
    return block


def _builder(target: Any, kind: str, options: Dict[str, Any]) -> Callable[[int, int], Any]:
    obj: Any = target
    is_class = inspect.isclass(target)  # kept apart: isclass() would narrow obj
    if kind == "cpu_gpu":
        allocator_type = "prefix_caching"
        return lambda n, size: obj.create(allocator_type, n, n, size, **options)
    if kind == "naive" and is_class:
        block_cls = naive_block_class(obj)
        return lambda n, size: obj(create_block=block_cls, num_blocks=n, block_size=size,
                                   **options)
    if is_class:
        return lambda n, size: obj(num_blocks=n, block_size=size, **options)
    return lambda n, size: obj(n, size, **options)


def named_callable(target: Union[str, Callable[..., Any]], pinned: Callable[[str], Any],
                   what: str) -> Tuple[Any, str]:
    """The class or factory ``target`` names and its name: ``MODULE:CLASS``
    (imported), ``vllm==VERSION...`` (``pinned(target)``) or a callable given
    directly.  TargetError when it cannot be loaded or is not callable
    ("this is not ``what``")."""
    if isinstance(target, str):
        obj = pinned(target) if target.startswith(VLLM_PREFIX) else load_object(target)
        name = target
    elif callable(target):
        obj = target
        name = f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', target)}"
    else:
        raise TargetError(f"a target is MODULE:CLASS or a callable, got {target!r}")
    if not callable(obj):
        raise TargetError(f"this is not {what}: {name} is a {type(obj).__name__}, "
                          "neither a class nor a factory")
    return obj, name


def resolve_target(
    target: Union[str, Factory, None] = None,
    *,
    kind: Optional[str] = None,
    strict: bool = True,
    options: Optional[Dict[str, Any]] = None,
) -> Target:
    """The :class:`Target` that ``target`` names (default: prefixcache.impl's
    prefix-caching allocator; ``vllm==0.8.5[:Class]``: vLLM's own).  ``kind``
    overrides the guess from the constructor; ``options`` are extra keyword
    arguments of every construction (``hash_algo=...``).  Raises TargetError
    when it cannot be loaded."""
    if target is None:
        target = DEFAULT_TARGET
    if kind is not None and kind not in KINDS:
        raise TargetError(f"kind must be one of {KINDS}, got {kind!r}")
    obj, name = named_callable(target, _vllm_class, "an allocator")
    if kind is None:
        kind = _guess_kind(obj) if inspect.isclass(obj) else "prefix"
    return Target(name=name, kind=kind, build=_builder(obj, kind, dict(options or {})),
                  strict=strict, options=_json_options(options or {}))


def _json_options(options: Dict[str, Any]) -> Dict[str, Any]:
    """The options as JSON values: a callable by its ``module:qualname``."""
    return {k: v if isinstance(v, (str, int, float, bool, type(None)))
            else f"{getattr(v, '__module__', '?')}:{getattr(v, '__qualname__', v)}"
            for k, v in options.items()}


#: The target kind -> the spec's name of that kind of allocator.
SPEC_KIND = {"prefix": "prefix_caching", "naive": "naive", "cpu_gpu": "cpu_gpu"}


def check_allocator(target: Target) -> None:
    """Build a small ``target`` (2 ids of 1 token) and check that it has every
    operation of its kind; TargetError saying what it lacks, or why it
    cannot be built, otherwise."""
    try:
        allocator = target.make(2, 1)
    except Exception as exc:
        raise TargetError(f"{target.name} cannot be built as a {target.kind} allocator with "
                          f"num_blocks=2, block_size=1: {type(exc).__name__}: {exc}") from exc
    lacking = missing(allocator, SPEC_KIND[target.kind])
    if lacking:
        more = f" and {len(lacking) - 4} more" if len(lacking) > 4 else ""
        raise TargetError(f"this is not an allocator: {target.name} lacks "
                          f"{', '.join(lacking[:4])}{more} (a {target.kind} block allocator "
                          "has every operation of vLLM's API)")
