"""How a step of the v1 profile reads as Python.

A v1 step names blocks by id and chains by their tokens: ``tokens`` (one
tuple per hash block) and ``salt`` stand for the request's block hashes,
which the driver computes as vLLM chains them.  An argument whose name
starts with ``_`` is the oracle's note (``_row``: the error-table row a
mistake provokes), shown as a comment.
"""

from __future__ import annotations

from typing import Any, Dict

#: argument names whose values are block ids (lists of them), shown as the pool's blocks
V1_BLOCK_LIST_ARGS = ("blocks", "ordered_blocks")


def v1_header(num_blocks: int, hash_block_size: int) -> str:
    """The line that builds the pool a v1 trace runs on."""
    return (f"a = BlockPool(num_gpu_blocks={num_blocks}, enable_caching=True, "
            f"hash_block_size={hash_block_size})")


def _request(args: Dict[str, Any]) -> str:
    return f"request(tokens={args['tokens']!r}, salt={args.get('salt')!r})"


def render_v1_step(op: str, args: Dict[str, Any]) -> str:
    """One v1 step as a line of Python (pool ``a``, ``request(...)`` a
    request with those tokens' chained hashes, ``hash_of(...)`` the last)."""
    notes = [f"{k[1:]}: {v}" for k, v in args.items() if k.startswith("_")]
    parts = []
    for name, value in args.items():
        if name.startswith("_") or name in ("tokens", "salt"):
            continue
        if name in V1_BLOCK_LIST_ARGS:
            parts.append(f"{name}=[{', '.join(f'a.blocks[{i}]' for i in value)}]")
        elif name == "block_ids":
            parts.append(f"{name}={set(value) if value else 'set()'}")
        else:
            parts.append(f"{name}={value!r}")
    if op == "cache_full_blocks":
        parts.insert(0, f"request={_request(args)}")
    elif op == "get_cached_block":
        parts.insert(0, f"block_hash=hash_of({_request(args)})")
    line = f"a.{op}({', '.join(parts)})"
    return line + (f"  # {'; '.join(notes)}" if notes else "")
