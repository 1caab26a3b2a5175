"""vLLM v1's ``BlockPool``, obtained from a pinned release and importable
without torch or the rest of vLLM.

The v1 engine keeps its prefix cache in ``vllm/v1/core/block_pool.py``
(``BlockPool`` and ``BlockHashToBlockMap``) and ``vllm/v1/core/kv_cache_utils.py``
(``KVCacheBlock``, ``FreeKVCacheBlockQueue``, the block-hash helpers).  This
module pins the releases it can obtain (:data:`V1_PINS`), and :func:`load_v1`
imports those two files from the wheel, fetched, SHA-256 checked, cached and
rewritten under a private package name exactly as
:mod:`prefixcache.oracle.vllm_source` does for the v0 allocators (it shares
that module's machinery: only the :class:`~.vllm_source.Layout` differs).

What the two files import, and the stand-in each gets here (the same for
every pinned release; which names each imports differs, so most stand-ins
answer any name):

=========================================  =========================================
``vllm.distributed.kv_events``             ``MEDIUM_GPU``; the event classes record
                                           their keyword arguments
``vllm.logger``                            ``init_logger``: a stdlib logger
``vllm.utils.gc_utils``                    ``gc_untrack``: the identity
``vllm.utils.math_utils``                  ``cdiv``, ``round_up``
``vllm.envs``                              ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``
``vllm.v1.token_buffer``                   ``token_slice``: a list slice
``vllm.config``, ``vllm.v1.request``,      any name: a placeholder class for a
``vllm.v1.kv_cache_interface``,            capitalised one (annotations only: the
``vllm.v1.core.kv_cache_metrics``,         pool reads only ``request.block_hashes``),
``vllm.v1.kv_cache_spec_registry``,        else a function that raises (never
``vllm.v1.utils``, ``vllm.v1.hisparse``,   reached: no multi-modal requests, no
``vllm.multimodal.utils``,                 hash function of vLLM's, no KV-cache
``vllm.utils.hashing``, ``.mem_utils``,    configuration)
``.torch_utils``
=========================================  =========================================

The cache, its directory and environment variables are vllm_source's
(``PREFIXCACHE_VLLM_CACHE``, ``PREFIXCACHE_VLLM_WHEEL``, ...).

Command line::

    python -m prefixcache.oracle.vllm_v1_source --check [--version 0.34.0|0.33.0|...|0.28.0]
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import types
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from .vllm_source import (
    STUB_LOGGER,
    STUB_PACKAGE,
    Edits,
    Layout,
    Pin,
    load_pinned,
    pin_of,
    pinned_source_tree,
    report_check,
)

#: Bump when the stubs below change: trees and imported copies are rebuilt.
V1_STUB_VERSION = 2

#: The wheel members the tree takes.
V1_FILES = ("vllm/v1/core/block_pool.py", "vllm/v1/core/kv_cache_utils.py")

#: The modules load_v1() returns, by attribute name, as paths inside the package.
V1_MODULES = {
    "block_pool": "v1.core.block_pool",
    "kv_cache_utils": "v1.core.kv_cache_utils",
    "kv_events": "distributed.kv_events",
}

_PLACEHOLDERS = '''

def __getattr__(name):
    """Any name a release imports from here: a placeholder class for a
    capitalised name (annotations and isinstance only), else a function
    that raises (never reached from the calls prefixcache makes)."""
    if name.startswith("__"):
        raise AttributeError(name)
    if name[:1].isupper():
        return type(name, (), {"__doc__": "Placeholder (prefixcache stand-in)."})

    def stand_in(*args, **kwargs):
        raise NotImplementedError(f"{name} is a prefixcache stand-in")

    stand_in.__name__ = name
    return stand_in
'''


def _stand_in(module: str) -> str:
    """A stand-in module whose every name is a placeholder (the names each
    release imports from it differ)."""
    return f'"""Stand-in for {module} (prefixcache)."""\n' + _PLACEHOLDERS


def _v1_stubs(version: str) -> Dict[str, str]:
    """The stub modules of a v1 tree, by path inside the vllm package (the
    same for every pinned release)."""
    return {
        "__init__.py": f'''\
"""Stub ``vllm`` package written by prefixcache.oracle.vllm_v1_source.

Only vllm/v1/core/block_pool.py and vllm/v1/core/kv_cache_utils.py come from
the vLLM {version} wheel; every other module here is a small stand-in."""

PREFIXCACHE_STUB = True
__version__ = "{version}"
''',
        "envs.py": '"""Stand-in for vllm.envs."""\n\nVLLM_KV_EVENTS_USE_INT_BLOCK_HASHES = False\n',
        "config.py": _stand_in("vllm.config"),
        "logger.py": STUB_LOGGER,
        "distributed/__init__.py": STUB_PACKAGE,
        "distributed/kv_events.py": '''\
"""Stand-in for vllm.distributed.kv_events: events that record their fields."""

MEDIUM_GPU = "GPU"


class KVCacheEvent:
    """An event: its keyword arguments as attributes."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    def __repr__(self):
        return f"{type(self).__name__}({self.__dict__!r})"


class BlockStored(KVCacheEvent):
    pass


class BlockRemoved(KVCacheEvent):
    pass


class AllBlocksCleared(KVCacheEvent):
    pass
''',
        "multimodal/__init__.py": STUB_PACKAGE,
        "multimodal/utils.py": _stand_in("vllm.multimodal.utils"),
        "utils/__init__.py": STUB_PACKAGE,
        "utils/gc_utils.py": '''\
"""Stand-in for vllm.utils.gc_utils."""


def gc_untrack(value):
    return value
''',
        "utils/hashing.py": _stand_in("vllm.utils.hashing"),
        "utils/math_utils.py": '''\
"""Stand-in for vllm.utils.math_utils."""


def cdiv(a, b):
    """Ceiling of a / b for ints."""
    return -(-a // b)


def round_up(x, y):
    """The least multiple of y that is x or more."""
    return -(-x // y) * y
''',
        "utils/mem_utils.py": _stand_in("vllm.utils.mem_utils"),
        "utils/torch_utils.py": _stand_in("vllm.utils.torch_utils"),
        "v1/__init__.py": STUB_PACKAGE,
        "v1/core/__init__.py": STUB_PACKAGE,
        "v1/core/kv_cache_metrics.py": _stand_in("vllm.v1.core.kv_cache_metrics"),
        "v1/request.py": _stand_in("vllm.v1.request"),
        "v1/kv_cache_interface.py": _stand_in("vllm.v1.kv_cache_interface"),
        "v1/kv_cache_spec_registry.py": _stand_in("vllm.v1.kv_cache_spec_registry"),
        "v1/hisparse/__init__.py": STUB_PACKAGE,
        "v1/hisparse/layout.py": _stand_in("vllm.v1.hisparse.layout"),
        "v1/token_buffer.py": '''\
"""Stand-in for vllm.v1.token_buffer."""


def token_slice(tokens, start, end):
    return list(tokens[start:end])
''',
        "v1/utils.py": _stand_in("vllm.v1.utils"),
    }


#: The v1 BlockPool's tree.
V1_LAYOUT = Layout(stubs=_v1_stubs, wanted=V1_FILES.__contains__, required=V1_FILES,
                   modules=V1_MODULES, stub_version=V1_STUB_VERSION)

#: The SHA-256 of each pinned release's x86-64 Linux wheel, by version.
_V1_WHEELS = {
    "0.28.0": "addb0ffdaafd8155d75e9b3f5ddb3da28fdee9e8a7097ede91f7db2e9e1a3889",
    "0.29.0": "09d48617fc2be9c6cdcd5db480651ab0d84817b257204f2cc2e3ecbb70bbb635",
    "0.30.0": "ef52ee58c410ead0b8afb190838fa4cbcb52075596f67862a03859d984966ac4",
    "0.31.0": "39132b433967f0962d03d8a5f633b9bee6b32708f566c7d5637b79f8d0ef3433",
    "0.32.0": "5e2ecdc5b0baf72921c288486417ca82778456a448e4fe60b62ee43c0dfc8611",
    "0.33.0": "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa",
    "0.34.0": "79ca4b3cd74aec08c4bf476bdf0cb15735b605ae5368526a2faae1e30f044ca2",
}

#: The v1 releases this module can obtain, by version.  Their pools differ
#: where the v1 profile looks only in ``free_blocks``' ``evict_first`` (new in
#: 0.34.0), in the hash map's internals (which the abstraction reads in either
#: shape) and in the null block's reference count (counted before 0.33.0, not
#: maintained since; the abstraction reads it as 0).
V1_PINS: Dict[str, Pin] = {
    version: Pin(version=version, wheel=f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl",
                 wheel_sha256=digest, platform="manylinux_2_28_x86_64", layout=V1_LAYOUT)
    for version, digest in _V1_WHEELS.items()
}

#: The release the v1 model is written against.
V1_DEFAULT = "0.34.0"


def _v1_pin(version: str) -> Pin:
    return pin_of(version, V1_PINS, " for the v1 BlockPool")


def repr_sha256(value: Any) -> bytes:
    """The hash function the loaded pool's ``NONE_HASH`` is made with: SHA-256
    of ``repr(value)`` (vLLM's own ``sha256`` pickles; any fixed function
    serves, since prefixcache supplies the block hashes itself)."""
    return hashlib.sha256(repr(value).encode()).digest()


def _extra(modules: Dict[str, types.ModuleType]) -> Dict[str, Any]:
    utils = modules["kv_cache_utils"]
    if not hasattr(utils, "NONE_HASH"):
        utils.init_none_hash(repr_sha256)
    return {"BlockPool": modules["block_pool"].BlockPool}


def v1_source_tree(version: str = V1_DEFAULT, edits: Optional[Edits] = None) -> Path:
    """A directory ``D`` such that ``D/vllm`` is importable: the stubs plus the
    wheel's v1 ``block_pool.py`` and ``kv_cache_utils.py``, with ``edits``
    applied (as :func:`.vllm_source.source_tree`).  Raises VllmSourceError."""
    return pinned_source_tree(_v1_pin(version), edits)


def load_v1(version: str = V1_DEFAULT, edits: Optional[Edits] = None) -> types.SimpleNamespace:
    """vLLM ``version``'s v1 ``block_pool`` and ``kv_cache_utils`` modules (with
    ``edits`` applied), imported under a private package name, with
    ``kv_cache_utils.NONE_HASH`` initialised (by :func:`repr_sha256`).
    Attributes: ``block_pool``, ``kv_cache_utils``, ``kv_events`` (the
    stand-in), ``BlockPool``, ``package``, ``path``.  Memoised per (version,
    edits).  Raises VllmSourceError when the wheel cannot be had, an edit does
    not apply, or a module does not import."""
    return load_pinned(_v1_pin(version), edits, _extra)


# -- command line ---------------------------------------------------------------------

def _smoke(ref: types.SimpleNamespace) -> List[str]:
    """A few calls on a real BlockPool: allocate, cache, look up, free, reuse."""
    utils = ref.kv_cache_utils
    pool = ref.BlockPool(num_gpu_blocks=5, enable_caching=True, hash_block_size=2)
    first = utils.hash_block_tokens(repr_sha256, None, (1, 2))
    request = types.SimpleNamespace(block_hashes=[first])
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(request, blocks, 0, 1, 2, 0)
    hit = pool.get_cached_block(first, [0])
    pool.free_blocks(reversed(blocks))
    return [
        f"new block ids  : {[b.block_id for b in blocks]}",
        f"lookup         : {[b.block_id for b in hit or []]}",
        f"free queue     : {[b.block_id for b in pool.free_block_queue.get_all_free_blocks()]}",
        f"free blocks    : {pool.get_num_free_blocks()} usage {pool.get_usage():.2f}",
    ]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line: obtain and import the v1 pool, print where, and with
    ``--check`` make a few calls on it.  Returns 0, or 1 after one line saying why."""
    parser = argparse.ArgumentParser(
        prog="python -m prefixcache.oracle.vllm_v1_source",
        description="Obtain, verify and import vLLM v1's BlockPool (a pinned release).")
    parser.add_argument("--check", action="store_true", help="also make a few calls on it")
    parser.add_argument("--version", default=V1_DEFAULT, choices=sorted(V1_PINS))
    args = parser.parse_args(argv)
    return report_check(lambda: load_v1(args.version), _smoke if args.check else None,
                        f"vLLM {args.version} v1 BlockPool")


if __name__ == "__main__":
    sys.exit(main())
