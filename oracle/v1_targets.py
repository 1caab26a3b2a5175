"""What the v1 profile of the oracle judges: a ``BlockPool``-shaped class.

A v1 target is built as vLLM v1 builds its pool,
``Class(num_gpu_blocks=N, enable_caching=True, hash_block_size=S)``, and
named like a v0 target: ``MODULE:CLASS``, a factory callable ``(N, S) ->
pool``, or ``vllm==VERSION[:BlockPool]`` for a pinned release's own pool
(:mod:`prefixcache.oracle.vllm_v1_source`, fetched and cached on first use).
Its :class:`~prefixcache.oracle.targets.Target` has the kind :data:`V1_KIND`,
which a trace records, so that ``prefixcache replay`` re-runs it on the v1
driver.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional, Union

from ..spec.v1_operations import V1_OPERATIONS
from .targets import VLLM_PREFIX, Target, TargetError, named_callable

#: The kind of a v1 target (beside v0's ``prefix``, ``naive``, ``cpu_gpu``).
V1_KIND = "v1"
#: The pinned release's own pool: the v1 profile's default target.
V1_DEFAULT_TARGET = "vllm==0.34.0"


def _pinned_pool(spec: str) -> Any:
    """The pool class ``vllm==VERSION[:BlockPool]`` names."""
    from .vllm_source import VllmSourceError
    from .vllm_v1_source import load_v1

    version, _, class_name = spec[len(VLLM_PREFIX):].partition(":")
    if class_name not in ("", "BlockPool"):
        raise TargetError(f"vLLM {version}'s v1 profile judges BlockPool, not {class_name!r}")
    try:
        return load_v1(version).BlockPool
    except VllmSourceError as exc:
        raise TargetError(str(exc)) from exc


def resolve_v1_target(target: Union[str, Callable[[int, int], Any], None] = None) -> Target:
    """The v1 :class:`Target` that ``target`` names (default: vLLM 0.34.0's
    pool).  TargetError when it cannot be loaded or is not callable."""
    if target is None:
        target = V1_DEFAULT_TARGET
    obj, name = named_callable(target, _pinned_pool, "a block pool")
    pool: Any = obj
    if inspect.isclass(obj):
        def build(n: int, size: int) -> Any:
            return pool(num_gpu_blocks=n, enable_caching=True, hash_block_size=size)
    else:
        def build(n: int, size: int) -> Any:
            return pool(n, size)
    return Target(name=name, kind=V1_KIND, build=build, strict=True)


def check_v1_pool(target: Target) -> None:
    """Build a small pool of ``target`` (3 ids, hash block size 1) and check
    that it has every v1 operation; TargetError saying what it lacks, or why
    it cannot be built."""
    try:
        pool = target.make(3, 1)
    except Exception as exc:
        raise TargetError(f"{target.name} cannot be built as a v1 block pool with "
                          f"num_gpu_blocks=3, enable_caching=True, hash_block_size=1: "
                          f"{type(exc).__name__}: {exc}") from exc
    lacking = [op.name for op in V1_OPERATIONS if not callable(getattr(pool, op.name, None))]
    if lacking:
        more = f" and {len(lacking) - 4} more" if len(lacking) > 4 else ""
        raise TargetError(f"this is not a block pool: {target.name} lacks "
                          f"{', '.join(lacking[:4])}{more} (a v1 BlockPool has every "
                          "operation of vLLM's)")


def takes_evict_first(pool: Any) -> bool:
    """Whether the pool's ``free_blocks`` takes ``evict_first`` (0.34.0's does,
    earlier releases' do not; a signature that cannot be read counts as
    taking it)."""
    try:
        params = inspect.signature(pool.free_blocks).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == "evict_first" or p.kind is p.VAR_KEYWORD for p in params)


def null_block_of(pool: Any) -> Optional[Any]:
    """The pool's null block object, where it publishes one (``null_block``)."""
    return getattr(pool, "null_block", None)
