"""vLLM 0.8.5's real v0 block allocators, importable without torch.

prefixcache.impl is checked against the allocators of the released vLLM
0.8.5 wheel.  vLLM's code is never part of this repository: this module
obtains the wheel at run time (a path given by the caller, a copy already in
the cache directory, or ``pip download --no-deps vllm==0.8.5``), checks its
SHA-256 against the one PyPI publishes, and extracts only

* ``vllm/core/block/*.py``  (interfaces, common, naive_block,
  prefix_caching_block, cpu_gpu_block_allocator, block_table, utils)
* ``vllm/core/evictor.py``

into ``<cache_dir>/src``.  Everything else those files import (``vllm``,
``vllm.core``, ``vllm.logger``, ``vllm.platforms``, ``vllm.sequence``,
``vllm.utils``) is replaced by small stub modules written here, so importing
them pulls in neither torch nor the rest of vLLM.  ``<cache_dir>/src`` is then
put first on ``sys.path``; the package imported as ``vllm`` is that stub tree.

Library use::

    ref = load_vllm()            # SimpleNamespace of the modules
    alloc = ref.prefix_caching_block.PrefixCachingBlockAllocator(4, 2)

Command line::

    python bench/vllm_reference.py --check [--cache-dir DIR] [--wheel FILE]

Defaults: cache directory ``$PREFIXCACHE_VLLM_CACHE`` or
``~/.cache/prefixcache/vllm-0.8.5``; wheel ``$PREFIXCACHE_VLLM_WHEEL`` if set.
The wheel is about 320 MB; it is fetched once per machine and only the few
extracted files are kept in use (the wheel stays in the cache directory so a
changed stub version can be re-extracted without another download).
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import hashlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types
import zipfile
from pathlib import Path
from typing import Iterator, Optional, Union

VLLM_VERSION = "0.8.5"
WHEEL_FILENAME = "vllm-0.8.5-cp38-abi3-manylinux1_x86_64.whl"
# The digest PyPI publishes for WHEEL_FILENAME.
WHEEL_SHA256 = "74bfe92953bee1269c1e1c27827bc156777751cdd6a3457ee8e27dd8ebf1e247"

# Bump when the stubs below change: the extraction is redone.
_STUB_VERSION = 1
_STAMP_NAME = ".prefixcache-vllm-stamp.json"

CACHE_ENV = "PREFIXCACHE_VLLM_CACHE"
WHEEL_ENV = "PREFIXCACHE_VLLM_WHEEL"

#: The modules load_vllm() returns, by attribute name.
MODULES = {
    "interfaces": "vllm.core.block.interfaces",
    "common": "vllm.core.block.common",
    "naive_block": "vllm.core.block.naive_block",
    "prefix_caching_block": "vllm.core.block.prefix_caching_block",
    "cpu_gpu_block_allocator": "vllm.core.block.cpu_gpu_block_allocator",
    "block_table": "vllm.core.block.block_table",
    "evictor": "vllm.core.evictor",
    "utils": "vllm.utils",
}


class VllmReferenceError(RuntimeError):
    """vLLM 0.8.5 could not be obtained, verified, extracted or imported."""


# -- our stub modules (what the extracted files import) ------------------------

_STUBS = {
    "vllm/__init__.py": '''\
"""Stub ``vllm`` package written by prefixcache's bench/vllm_reference.py.

Only vllm/core/block/*.py and vllm/core/evictor.py come from the vLLM 0.8.5
wheel; every other module here is a small stand-in."""

PREFIXCACHE_STUB = True
__version__ = "0.8.5"
''',
    "vllm/core/__init__.py": '"""Stub package (prefixcache)."""\n',
    "vllm/logger.py": '''\
"""Stand-in for vllm.logger: plain stdlib loggers."""

import logging


def init_logger(name):
    return logging.getLogger(name)
''',
    "vllm/platforms/__init__.py": '''\
"""Stand-in for vllm.platforms: a CPU-only platform that is not an HPU."""


class _StubPlatform:
    device_type = "cpu"

    def is_hpu(self):
        return False

    def is_cuda(self):
        return False


current_platform = _StubPlatform()
''',
    "vllm/sequence.py": '''\
"""Stand-in for vllm.sequence: only the names the block code imports."""


class Sequence:
    """Placeholder (used in type annotations only)."""


class SequenceGroup:
    """Placeholder (used in type annotations only)."""
''',
    "vllm/utils.py": '''\
"""Stand-in for vllm.utils: the few names the block code imports."""

import enum


class Device(enum.Enum):
    GPU = enum.auto()
    CPU = enum.auto()


def cdiv(a, b):
    """Ceiling of a / b for ints."""
    return -(-a // b)


def chunk_list(lst, chunk_size):
    """Consecutive slices of lst of length chunk_size (the last may be shorter)."""
    for start in range(0, len(lst), chunk_size):
        yield lst[start:start + chunk_size]


STR_NOT_IMPL_ENC_DEC_SWA = (
    "Sliding window attention is not supported for encoder/decoder models.")
STR_NOT_IMPL_ENC_DEC_PREFIX_CACHE = (
    "Prefix caching is not supported for encoder/decoder models.")
''',
}


def _wanted_member(name: str) -> bool:
    """The wheel members we extract."""
    if name == "vllm/core/evictor.py":
        return True
    head, _, tail = name.rpartition("/")
    return head == "vllm/core/block" and tail.endswith(".py")


# -- cache directory, wheel, extraction ------------------------------------------

def default_cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "prefixcache" / f"vllm-{VLLM_VERSION}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _verify_wheel(path: Path) -> Path:
    if not path.is_file():
        raise VllmReferenceError(f"vLLM wheel not found: {path}")
    actual = _sha256(path)
    if actual != WHEEL_SHA256:
        raise VllmReferenceError(
            f"{path} is not the vLLM {VLLM_VERSION} wheel from PyPI "
            f"(sha256 {actual}, expected {WHEEL_SHA256}); delete it and retry"
        )
    return path


def _download_wheel(dest: Path) -> Path:
    """``pip download --no-deps vllm==0.8.5`` into ``dest`` (for x86-64 Linux
    and CPython 3.11 whatever this machine is: the files we use are pure
    Python)."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
        "--only-binary=:all:", "--platform", "manylinux1_x86_64",
        "--python-version", "3.11", "--implementation", "cp",
        "--dest", str(dest), f"vllm=={VLLM_VERSION}",
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VllmReferenceError(
            f"could not run pip to download vLLM {VLLM_VERSION}: {exc}\n"
            f"command: {' '.join(cmd)}\n"
            f"Alternatively set {WHEEL_ENV}=/path/to/{WHEEL_FILENAME}"
        ) from exc
    wheel = dest / WHEEL_FILENAME
    if proc.returncode != 0 or not wheel.is_file():
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise VllmReferenceError(
            f"pip download of vLLM {VLLM_VERSION} failed (exit {proc.returncode}); "
            f"the reference allocators need the wheel {WHEEL_FILENAME} "
            f"(~320 MB, fetched once into {dest}).\n"
            f"command: {' '.join(cmd)}\n--- pip output (tail) ---\n{tail}\n"
            f"Alternatively set {WHEEL_ENV}=/path/to/{WHEEL_FILENAME}"
        )
    return wheel


def obtain_wheel(cache_dir: Path, wheel: Union[str, Path, None] = None) -> Path:
    """The verified wheel: ``wheel`` or ``$PREFIXCACHE_VLLM_WHEEL`` if given,
    else the copy in ``cache_dir``, else a fresh ``pip download``."""
    explicit = wheel if wheel is not None else os.environ.get(WHEEL_ENV)
    if explicit:
        return _verify_wheel(Path(explicit).expanduser())
    cached = cache_dir / WHEEL_FILENAME
    if cached.is_file():
        try:
            return _verify_wheel(cached)
        except VllmReferenceError:
            cached.unlink()  # a truncated or foreign file: fetch it again
    return _verify_wheel(_download_wheel(cache_dir))


@contextlib.contextmanager
def _locked(cache_dir: Path) -> Iterator[None]:
    """An exclusive lock on the cache directory (parallel test workers)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / ".lock", "w") as handle:
        try:
            import fcntl
        except ImportError:  # not POSIX: no locking
            yield
            return
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _expected_stamp() -> dict:
    return {"vllm": VLLM_VERSION, "sha256": WHEEL_SHA256, "stubs": _STUB_VERSION}


def _stamp_ok(src: Path) -> bool:
    try:
        return json.loads((src / _STAMP_NAME).read_text()) == _expected_stamp()
    except (OSError, ValueError):
        return False


def _extract(wheel_path: Path, src: Path) -> None:
    """Write the extracted files and the stubs into a fresh ``src``."""
    tmp = Path(tempfile.mkdtemp(prefix="src-", dir=src.parent))
    try:
        tmp.chmod(0o755)
        with zipfile.ZipFile(wheel_path) as archive:
            members = [name for name in archive.namelist() if _wanted_member(name)]
            names = {name.rsplit("/", 1)[1] for name in members}
            for needed in ("prefix_caching_block.py", "naive_block.py", "common.py",
                           "cpu_gpu_block_allocator.py", "interfaces.py", "evictor.py"):
                if needed not in names:
                    raise VllmReferenceError(f"{wheel_path} has no {needed}")
            for name in members:
                target = tmp / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.read(name))
        for name, text in _STUBS.items():
            target = tmp / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        (tmp / _STAMP_NAME).write_text(json.dumps(_expected_stamp()))
        if src.exists():
            shutil.rmtree(src)
        os.replace(tmp, src)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def prepare(cache_dir: Union[str, Path, None] = None,
            wheel: Union[str, Path, None] = None) -> Path:
    """Make sure ``<cache_dir>/src`` holds the extracted files and stubs;
    return that directory (not yet on ``sys.path``)."""
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    src = cache / "src"
    with _locked(cache):
        if not _stamp_ok(src):
            _extract(obtain_wheel(cache, wheel), src)
    return src.resolve()


# -- importing --------------------------------------------------------------------

def _is_under(path: Optional[str], root: Path) -> bool:
    if not path:
        return False
    try:
        Path(path).resolve().relative_to(root)
        return True
    except ValueError:
        return False


def load_vllm(cache_dir: Union[str, Path, None] = None,
              wheel: Union[str, Path, None] = None) -> types.SimpleNamespace:
    """Import vLLM 0.8.5's block allocators (against our stubs) and return
    them: attributes ``interfaces``, ``common``, ``naive_block``,
    ``prefix_caching_block``, ``cpu_gpu_block_allocator``, ``block_table``,
    ``evictor``, ``utils`` (the stub, with vLLM's ``Device``), plus
    ``Device``, ``path`` (the source directory on ``sys.path``) and the
    helpers ``to_vllm_device`` / ``from_vllm_device``.

    Raises VllmReferenceError when the wheel cannot be had, or when another
    ``vllm`` package is already imported in this process."""
    src = prepare(cache_dir, wheel)
    loaded = sys.modules.get("vllm")
    if loaded is not None and not _is_under(getattr(loaded, "__file__", None), src):
        raise VllmReferenceError(
            f"another vllm package is already imported ({getattr(loaded, '__file__', None)}); "
            "load_vllm() needs the stubbed reference tree instead"
        )
    if str(src) not in sys.path:
        sys.path.insert(0, str(src))
    importlib.invalidate_caches()
    modules = {}
    for attr, name in MODULES.items():
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise VllmReferenceError(f"cannot import {name} from {src}: {exc}") from exc
        if not _is_under(getattr(module, "__file__", None), src):
            raise VllmReferenceError(
                f"{name} was imported from {module.__file__}, not from {src}: "
                "another vllm shadows the reference tree"
            )
        modules[attr] = module
    device = modules["utils"].Device

    def to_vllm_device(value: object) -> enum.Enum:
        """vLLM's Device member of the same name as ``value`` (a Device of any
        enum, or the string ``"GPU"``/``"CPU"``)."""
        name = value if isinstance(value, str) else getattr(value, "name", None)
        try:
            return device[name]
        except KeyError:
            raise ValueError(f"no vLLM device for {value!r}") from None

    def from_vllm_device(value: enum.Enum, target: type[enum.Enum]) -> enum.Enum:
        """The member of the enum ``target`` named like vLLM's ``value``."""
        return target[value.name]

    return types.SimpleNamespace(
        **modules, Device=device, path=src,
        to_vllm_device=to_vllm_device, from_vllm_device=from_vllm_device,
    )


# -- command line --------------------------------------------------------------

def _smoke(ref: types.SimpleNamespace) -> None:
    gpu, cpu = ref.Device.GPU, ref.Device.CPU
    allocator = ref.cpu_gpu_block_allocator.CpuGpuBlockAllocator.create(
        "prefix_caching", num_gpu_blocks=4, num_cpu_blocks=3, block_size=2)
    first = allocator.allocate_immutable_blocks(None, [[1, 2], [3, 4]], device=gpu)
    tail = allocator.allocate_mutable_block(first[-1], device=gpu)
    tail.append_token_ids([5])
    second = allocator.allocate_immutable_blocks(None, [[1, 2], [3, 4]], device=gpu)
    print("first chain ids :", [b.block_id for b in first + [tail]])
    print("second chain ids:", [b.block_id for b in second], "(prefix cache hits)")
    print("GPU free blocks :", allocator.get_num_free_blocks(gpu))
    print("GPU hit rate    :", allocator.get_prefix_cache_hit_rate(gpu))
    mapping = allocator.swap(first + [tail], gpu, cpu)
    print("swap GPU->CPU   :", mapping)
    for block in second:
        allocator.free(block)
    print("GPU evictor     :", sorted(allocator._allocators[gpu].evictor.free_table))
    naive = ref.naive_block.NaiveBlockAllocator(
        create_block=ref.naive_block.NaiveBlock, num_blocks=3, block_size=2)
    block = naive.allocate_immutable_block(None, [7, 8])
    print("naive block id  :", block.block_id, "free", naive.get_num_free_blocks())


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="obtain and import vLLM, print where, run a smoke allocation")
    parser.add_argument("--cache-dir", default=None,
                        help=f"cache directory (default ${CACHE_ENV} or {default_cache_dir()})")
    parser.add_argument("--wheel", default=None,
                        help=f"use this wheel file instead of downloading (or ${WHEEL_ENV})")
    args = parser.parse_args(argv)
    try:
        ref = load_vllm(args.cache_dir, args.wheel)
    except VllmReferenceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"vLLM {VLLM_VERSION} block allocators: {ref.path}")
    if args.check:
        _smoke(ref)
    return 0


if __name__ == "__main__":
    sys.exit(main())
