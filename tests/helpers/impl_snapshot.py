"""One picture of everything observable in a prefixcache.impl object, for
"the call changed nothing" checks.

``snapshot(obj)`` returns a plain dict (compare two with ``==``) for a
``NaiveBlockAllocator``, a ``PrefixCachingBlockAllocator``, a
``CpuGpuBlockAllocator`` (both devices), an ``LRUEvictor`` or a
``RefCounter``.  Optional ``blocks`` adds the caller-visible state of those
Block objects (their id, tokens, flags), so a rejected call is also seen not
to have detached or rebound a Block.

This module is not a test module, so pytest does not rewrite its asserts and
``python -O`` would strip them: it raises AssertionError explicitly instead.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Type

import pytest

from prefixcache.impl.common import BlockPool, RefCounter
from prefixcache.impl.cpu_gpu_block_allocator import CpuGpuBlockAllocator
from prefixcache.impl.errors import CallerError, NoFreeBlocksError
from prefixcache.impl.evictor import LRUEvictor
from prefixcache.impl.interfaces import Block, Device
from prefixcache.impl.naive_block import NaiveBlockAllocator
from prefixcache.impl.prefix_caching_block import PrefixCachingBlock, PrefixCachingBlockAllocator


def _tracker(t: Any) -> Tuple[bool, float, bool]:
    """(active, last_accessed, computed) of a tracker; None is an idle one."""
    if t is None:
        return (False, -1, False)
    return (t.active, t.last_accessed, t.computed)


def eviction_key(block_id: int, meta: Any) -> Tuple[float, int, int, int]:
    """The documented eviction order as a sort key: oldest access first, then
    the most hashed tokens, then the smallest id, then the smallest hash."""
    return (meta.last_accessed, -meta.num_hashed_tokens, block_id, meta.content_hash)


def _evictor_state(evictor: LRUEvictor) -> Dict[str, Any]:
    table = evictor.free_table
    return {
        # insertion order is observable (vLLM's tests read free_table.keys())
        "free_table": [
            (i, m.content_hash, m.num_hashed_tokens, m.last_accessed) for i, m in table.items()
        ],
        "evict_order": [i for i, _ in sorted(table.items(), key=lambda kv: eviction_key(*kv))],
        "num_blocks": evictor.num_blocks,
    }


def _pool_state(pool: BlockPool) -> Tuple[int, int, List[int]]:
    return (pool.pool_size, len(pool._pool), list(pool._free_ids))


def _block_state(block: Block) -> Tuple[Any, ...]:
    state: Tuple[Any, ...] = (
        type(block).__name__,
        block.block_id,
        list(block.token_ids),
        id(getattr(block, "_allocator", None)),
        id(block.prev_block) if block.prev_block is not None else None,
    )
    if isinstance(block, PrefixCachingBlock):
        state += (block._computed, block._cached_content_hash, block._num_tokens_total,
                  block._extra_hash, block._last_accessed)
    return state


def _naive_state(a: NaiveBlockAllocator) -> Dict[str, Any]:
    return {
        "kind": "naive",
        "free": list(a._free_block_indices),
        "refcounts": dict(a._refcounter._refcounts),
        "cows": list(a._cow_tracker._copy_on_writes),
        "num_free": a.get_num_free_blocks(),
        "pool": _pool_state(a._block_pool),
    }


def _prefix_state(a: PrefixCachingBlockAllocator) -> Dict[str, Any]:
    state: Dict[str, Any] = {
        "kind": "prefix_caching",
        "free": list(a._hashless_allocator._free_block_indices),
        "refcounts": dict(a._refcounter._refcounts),
        # insertion order of the cache is observable
        "cached": list(a._cached_blocks.items()),
        "touched": set(a._touched_blocks),
        # every id's tracker (made lazily: an id without one yet is idle)
        "trackers": {
            i: _tracker(a._block_tracker.get(i)) for i in a._refcounter._refcounts
        },
        "cows": list(a._cow_tracker._copy_on_writes),
        "metric": dataclasses.asdict(a.metric_data),
        "num_free": a.get_num_free_blocks(),
        "pool": _pool_state(a._block_pool),
    }
    for key, value in _evictor_state(a.evictor).items():  # type: ignore[arg-type]
        state[f"evictor_{key}"] = value
    return state


def snapshot(obj: Any, blocks: Iterable[Block] = ()) -> Dict[str, Any]:
    """Everything observable about ``obj`` (and the given Blocks) as a dict."""
    state: Dict[str, Any]
    if isinstance(obj, CpuGpuBlockAllocator):
        null = obj._null_block
        state = {
            "gpu": snapshot(obj._allocators[Device.GPU]),
            "cpu": snapshot(obj._allocators[Device.CPU]),
            "swaps": list(obj._swap_mapping.items()),
            "null_block": None if null is None else (id(null), null.block_id),
        }
    elif isinstance(obj, PrefixCachingBlockAllocator):
        state = _prefix_state(obj)
    elif isinstance(obj, NaiveBlockAllocator):
        state = _naive_state(obj)
    elif isinstance(obj, LRUEvictor):
        state = _evictor_state(obj)
    elif isinstance(obj, RefCounter):
        state = {"refcounts": dict(obj._refcounts)}
    else:
        raise TypeError(f"snapshot() does not know {type(obj).__name__}")
    state["blocks"] = [_block_state(b) for b in blocks]
    return state


def _fail(message: str) -> None:
    raise AssertionError(message)


def _diff(before: Dict[str, Any], after: Dict[str, Any]) -> str:
    keys = sorted(set(before) | set(after))
    return "; ".join(
        f"{k}: {before.get(k)!r} -> {after.get(k)!r}" for k in keys if before.get(k) != after.get(k)
    )


def next_id(allocator: Any) -> Optional[int]:
    """The id the next allocation on a single-device allocator will take
    (first free id, else the first eviction victim), from a snapshot."""
    s = snapshot(allocator)
    if s["free"]:
        return s["free"][0]
    if s.get("evictor_evict_order"):
        return s["evictor_evict_order"][0]
    return None


def check_still_works(obj: Any) -> None:
    """After a rejected call: the allocator still works.  Checked on an exact
    copy (so the real allocator is left alone): exactly
    ``get_num_free_blocks()`` mutable allocations succeed, each on the id it
    should take (the first free id, else the first eviction victim), and
    the next one raises NoFreeBlocksError."""
    if isinstance(obj, CpuGpuBlockAllocator):
        for device in (Device.GPU, Device.CPU):
            check_still_works(obj._allocators[device])
        return
    if not isinstance(obj, (NaiveBlockAllocator, PrefixCachingBlockAllocator)):
        return
    twin = copy.deepcopy(obj)
    if snapshot(twin) != snapshot(obj):
        _fail("the copy of the allocator differs from it: " + _diff(snapshot(obj), snapshot(twin)))
    for _ in range(twin.get_num_free_blocks()):
        expected = next_id(twin)
        if expected is None:
            _fail("get_num_free_blocks() promised more ids than there are")
        block = twin.allocate_mutable_block(None)
        if block.block_id != expected:
            _fail(f"allocation got id {block.block_id}, expected {expected}")
    before = snapshot(twin)
    with pytest.raises(NoFreeBlocksError):
        twin.allocate_mutable_block(None)
    if snapshot(twin) != before:
        _fail("a refused allocation changed the state: " + _diff(before, snapshot(twin)))


def expect_rejected(
    obj: Any,
    exc_type: Type[BaseException],
    call: Callable[[], object],
    *,
    blocks: Iterable[Block] = (),
    match: Optional[str] = None,
    still_works: bool = True,
) -> BaseException:
    """``call()`` raises ``exc_type`` (matching ``match``), leaves ``obj`` and
    ``blocks`` exactly as they were, and (unless ``still_works`` is False)
    the allocator keeps working.  Returns the exception."""
    blocks = list(blocks)
    before = snapshot(obj, blocks)
    with pytest.raises(exc_type, match=match) as info:
        call()
    after = snapshot(obj, blocks)
    if after != before:
        _fail(f"{exc_type.__name__} left the state changed: " + _diff(before, after))
    if still_works:
        check_still_works(obj)
    return info.value


def freed_or_unchanged(allocator: Any, block: Block) -> bool:
    """``allocator.free(block)`` is all or nothing: it works (True: ``block``
    is detached) or raises a CallerError and leaves ``allocator`` and
    ``block`` exactly as they were (False)."""
    before = snapshot(allocator, [block])
    try:
        allocator.free(block)
    except CallerError:
        after = snapshot(allocator, [block])
        if after != before:
            _fail("the refused free left the state changed: " + _diff(before, after))
        return False
    if block.block_id is not None:
        _fail(f"the freed Block still has id {block.block_id}")
    return True
