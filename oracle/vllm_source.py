"""vLLM's own block allocators, obtained from a pinned release and importable
without torch or the rest of vLLM.

prefixcache is checked against the allocators of released vLLM (0.8.5: the v0
``vllm/core/block`` code).  No vLLM code is part of this repository: this
module fetches the release at run time, checks its SHA-256 against the pin in
:data:`PINS`, and keeps what it needs in a cache directory:

* :func:`wheel` -- the release's wheel (``pip download --no-deps``, ~320 MB);
* :func:`sdist` -- its source archive ``vllm-<version>.tar.gz`` (~7 MB, the
  only place vLLM's own tests are published), fetched by the URL the package
  index lists for it (PEP 691 JSON);
* :func:`source_tree` -- a directory ``D`` whose ``D/vllm`` is an importable
  package: the wheel's ``vllm/core/block/*.py`` and ``vllm/core/evictor.py``,
  optionally edited (see :data:`Edits`), beside small stub modules written
  here for everything else they import (``vllm``, ``vllm.core``,
  ``vllm.logger``, ``vllm.platforms``, ``vllm.sequence``, ``vllm.utils``).
  Meant for a subprocess with ``D`` on ``sys.path``;
* :func:`load` -- those modules imported into this process under a private
  package name (``_prefixcache_vllm_0_8_5``, plus a digest of the edits), from
  a copy of the tree whose ``vllm`` imports are rewritten to that name: it
  never clashes with a real ``vllm``, and edited and unedited trees load side
  by side.

What a tree takes from the wheel and which stubs stand beside it is a pin's
:class:`Layout` (the v0 block allocators' by default);
:mod:`prefixcache.oracle.vllm_v1_source` pins vLLM v1's ``BlockPool`` with a
layout of its own and loads it through :func:`load_pinned`.

Files, below the cache directory (:func:`cache_dir`)::

    vllm-0.8.5-cp38-abi3-manylinux1_x86_64.whl   the wheel (kept: a new stub
                                                 version re-extracts from it)
    vllm-0.8.5.tar.gz                            the source archive
    trees/vllm-0.8.5-stubs2-<edits>/vllm/...     source_tree() directories
    imports/vllm-0.8.5-stubs2-<edits>/<package>/ the rewritten copies load() imports
    block-tests/...                              bench/vllm_block_tests.py's extraction
                                                 of the source archive (cached_directory)
    .lock                                        serialises parallel processes

``<edits>`` is ``unedited`` or 16 hex digits of the edits' SHA-256; each
directory carries a stamp of what it was built from and is rebuilt when the
stamp differs.

Environment:

* ``PREFIXCACHE_VLLM_CACHE`` -- the cache directory (default
  ``~/.cache/prefixcache/vllm-<version>``);
* ``PREFIXCACHE_VLLM_WHEEL`` -- a local wheel to use instead of the cache or a
  download (still SHA-256 checked);
* ``PREFIXCACHE_VLLM_SDIST`` -- the same for the source archive;
* ``PREFIXCACHE_INDEX_URL`` -- the package index's root (default
  ``https://pypi.org/simple/``): where the source archive is looked up, and
  pip's ``--index-url`` for the wheel when set.

Command line::

    python -m prefixcache.oracle.vllm_source --check [--version 0.8.5]

obtains and imports vLLM and runs a small allocation on it: exit code 0, or 1
with a one-line reason.
"""

from __future__ import annotations

import argparse
import ast
import collections.abc
import contextlib
import hashlib
import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import types
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple


@dataclass(frozen=True)
class Layout:
    """What a source tree takes from a wheel and what it stands in for: the
    stub modules (by path inside the vllm package, from the version), which
    wheel members it keeps, the members it must find, the modules an import
    returns (attribute -> dotted path inside the package), and the version of
    the stubs (a change rebuilds the trees)."""

    stubs: Callable[[str], Dict[str, str]]
    wanted: Callable[[str], bool]
    required: Tuple[str, ...]
    modules: Mapping[str, str]
    stub_version: int


@dataclass(frozen=True)
class Pin:
    """One pinned vLLM release: its version, the file names and SHA-256
    digests (as PyPI publishes them) of its wheel and source archive (empty
    when no source archive is pinned), the wheel's platform tag, and the
    :class:`Layout` of the tree built from it (None: the v0 block allocators)."""

    version: str
    wheel: str
    wheel_sha256: str
    sdist: str = ""
    sdist_sha256: str = ""
    platform: str = "manylinux1_x86_64"
    layout: Optional[Layout] = None


#: The releases this module can obtain, by version (the v0 block allocators;
#: oracle/vllm_v1_source.py pins the releases of the v1 BlockPool).
PINS: Dict[str, Pin] = {
    "0.8.5": Pin(
        version="0.8.5",
        wheel="vllm-0.8.5-cp38-abi3-manylinux1_x86_64.whl",
        wheel_sha256="74bfe92953bee1269c1e1c27827bc156777751cdd6a3457ee8e27dd8ebf1e247",
        sdist="vllm-0.8.5.tar.gz",
        sdist_sha256="c7e04d1046304397b4580334038b558fe491af155fdea508224f140172cf9a82",
    ),
}

CACHE_ENV = "PREFIXCACHE_VLLM_CACHE"
WHEEL_ENV = "PREFIXCACHE_VLLM_WHEEL"
SDIST_ENV = "PREFIXCACHE_VLLM_SDIST"
INDEX_ENV = "PREFIXCACHE_INDEX_URL"
DEFAULT_INDEX_URL = "https://pypi.org/simple/"

#: (old, new): ``old`` must occur exactly once in the file it edits.
Edit = Tuple[str, str]
#: A path inside the vllm package ("core/evictor.py") -> its edits, applied in order.
Edits = Mapping[str, Sequence[Edit]]

#: Bump when the stubs below change: trees and imported copies are rebuilt.
STUB_VERSION = 2
_STAMP = ".prefixcache-vllm-stamp.json"
_TIMEOUT_S = 60

#: The modules load() returns, by attribute name, as paths inside the package.
MODULES = {
    "interfaces": "core.block.interfaces",
    "common": "core.block.common",
    "naive_block": "core.block.naive_block",
    "prefix_caching_block": "core.block.prefix_caching_block",
    "cpu_gpu_block_allocator": "core.block.cpu_gpu_block_allocator",
    "block_table": "core.block.block_table",
    "evictor": "core.evictor",
    "utils": "utils",
}

#: Files the wheel must hold.
_REQUIRED = tuple(f"vllm/core/{name}" for name in (
    "block/prefix_caching_block.py", "block/naive_block.py", "block/common.py",
    "block/cpu_gpu_block_allocator.py", "block/interfaces.py", "evictor.py"))


class VllmSourceError(RuntimeError):
    """vLLM could not be fetched, verified, extracted or imported; the message
    says why and what to do."""


# -- the stub modules (what the extracted files import) ------------------------------

#: The stubs of a package with nothing of its own, and of ``vllm.logger`` (every layout's).
STUB_PACKAGE = '"""Stub package (prefixcache)."""\n'
STUB_LOGGER = '''\
"""Stand-in for vllm.logger: plain stdlib loggers."""

import logging


def init_logger(name):
    return logging.getLogger(name)
'''

def _stubs(version: str) -> Dict[str, str]:
    """The stub modules of the tree, by path inside the vllm package."""
    return {
        "__init__.py": f'''\
"""Stub ``vllm`` package written by prefixcache.oracle.vllm_source.

Only vllm/core/block/*.py and vllm/core/evictor.py come from the vLLM
{version} wheel; every other module here is a small stand-in."""

PREFIXCACHE_STUB = True
__version__ = "{version}"
''',
        "core/__init__.py": STUB_PACKAGE,
        "logger.py": STUB_LOGGER,
        "platforms/__init__.py": '''\
"""Stand-in for vllm.platforms: a CPU-only platform that is not an HPU."""


class _StubPlatform:
    device_type = "cpu"

    def is_hpu(self):
        return False

    def is_cuda(self):
        return False


current_platform = _StubPlatform()
''',
        "sequence.py": '''\
"""Stand-in for vllm.sequence: only the names the block code imports."""


class Sequence:
    """Placeholder (used in type annotations only)."""


class SequenceGroup:
    """Placeholder (used in type annotations only)."""
''',
        "utils.py": '''\
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
    """The wheel members the tree takes."""
    if name == "vllm/core/evictor.py":
        return True
    head, _, tail = name.rpartition("/")
    return head == "vllm/core/block" and tail.endswith(".py")


#: The v0 block allocators' tree.
V0_LAYOUT = Layout(stubs=_stubs, wanted=_wanted_member, required=_REQUIRED, modules=MODULES,
                   stub_version=STUB_VERSION)


def layout_of(pin: Pin) -> Layout:
    """The layout of the tree built from ``pin``'s wheel."""
    return pin.layout or V0_LAYOUT


def _write_stubs(layout_stubs: Mapping[str, str], into: Path) -> None:
    """Write the stub modules ``layout_stubs`` (path inside the vllm package ->
    text) below ``into/vllm``."""
    for name, text in layout_stubs.items():
        dest = into / "vllm" / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text, encoding="utf-8")


# -- pins, cache directory, locking ------------------------------------------------------

def pin_of(version: str, pins: Mapping[str, Pin] = PINS, what: str = "") -> Pin:
    """The pin of ``version`` in ``pins`` (v0's by default; ``what`` says of
    what, in the error); VllmSourceError naming the pinned versions otherwise."""
    pin = pins.get(version)
    if pin is None:
        raise VllmSourceError(f"vLLM {version!r} is not pinned{what}; pinned versions: "
                              f"{', '.join(sorted(pins))}")
    return pin


def cache_dir(version: str = "0.8.5") -> Path:
    """The cache directory of vLLM ``version``: ``$PREFIXCACHE_VLLM_CACHE`` if
    set, else ``~/.cache/prefixcache/vllm-<version>``.  Creates nothing.
    Raises VllmSourceError for a version not in :data:`PINS`."""
    return pinned_cache_dir(pin_of(version))


def pinned_cache_dir(pin: Pin) -> Path:
    """:func:`cache_dir` of any pinned release (for the v1 pins too)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "prefixcache" / f"vllm-{pin.version}"


_held = threading.local()


def _flock(handle: Any, exclusive: bool) -> None:
    try:
        import fcntl
    except ImportError:  # not POSIX: no locking between processes
        return
    fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_UN)


@contextlib.contextmanager
def _locked(cache: Path) -> Iterator[None]:
    """An exclusive lock on ``cache`` against other processes and threads;
    re-entered freely by the thread that holds it."""
    held: Set[str] = _held.__dict__.setdefault("dirs", set())
    try:
        cache.mkdir(parents=True, exist_ok=True)
        key = str(cache.resolve())
        handle = open(cache / ".lock", "a")
    except OSError as exc:
        raise VllmSourceError(f"cannot use the cache directory {cache}: {exc}; set "
                              f"${CACHE_ENV} to a writable directory") from exc
    with handle:
        if key in held:
            yield
            return
        _flock(handle, True)
        held.add(key)
        try:
            yield
        finally:
            held.discard(key)
            _flock(handle, False)


# -- the wheel and the source archive -------------------------------------------------

def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _verified(path: Path, expected: str, name: str, env: str) -> Path:
    """``path`` if it is a file with SHA-256 ``expected``; else VllmSourceError."""
    if not path.is_file():
        raise VllmSourceError(f"{name} not found at {path}; fix or unset ${env}")
    actual = _sha256(path)
    if actual != expected:
        raise VllmSourceError(f"{path} is not the published {name} (sha256 {actual}, expected "
                              f"{expected}); delete it or fix ${env}, and retry")
    return path


def _cached(cache: Path, name: str, expected: str) -> Optional[Path]:
    """The verified copy of ``name`` in ``cache``, or None (a foreign or
    truncated copy is deleted)."""
    path = cache / name
    if not path.is_file():
        return None
    if _sha256(path) == expected:
        return path
    path.unlink()
    return None


def _index_root() -> str:
    return os.environ.get(INDEX_ENV) or DEFAULT_INDEX_URL


def _pip_download(pin: Pin, dest: Path) -> None:
    """``pip download --no-deps vllm==<version>`` of the x86-64 Linux wheel into
    ``dest`` (whatever this machine is: the files the tree takes are pure Python)."""
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
        "--only-binary=:all:", "--platform", pin.platform,
        "--python-version", "3.11", "--implementation", "cp",
        "--dest", str(dest), f"vllm=={pin.version}",
    ]
    if os.environ.get(INDEX_ENV):
        cmd[4:4] = ["--index-url", _index_root()]
    advice = f"or set ${WHEEL_ENV}=/path/to/{pin.wheel}"
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VllmSourceError(f"could not run pip to download {pin.wheel}: {exc}; "
                              f"command: {' '.join(cmd)}; {advice}") from exc
    if proc.returncode != 0 or not (dest / pin.wheel).is_file():
        tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
        raise VllmSourceError(f"pip download of {pin.wheel} (~320 MB, fetched once into {dest}) "
                              f"failed with exit code {proc.returncode}: {tail}; command: "
                              f"{' '.join(cmd)}; check the network {advice}")


def _obtain(pin: Pin, name: str, expected: str, env: str,
            fetch: Callable[[Pin, Path], None]) -> Path:
    """The verified file ``name``: ``$env`` if set, else the copy in the cache
    directory, else one ``fetch`` puts there."""
    explicit = os.environ.get(env)
    if explicit:
        return _verified(Path(explicit).expanduser(), expected, name, env)
    cache = pinned_cache_dir(pin)
    with _locked(cache):
        found = _cached(cache, name, expected)
        if found is None:
            fetch(pin, cache)
            found = _verified(cache / name, expected, name, CACHE_ENV)
        return found


def wheel(version: str = "0.8.5") -> Path:
    """The verified wheel of vLLM ``version``: ``$PREFIXCACHE_VLLM_WHEEL`` if
    set, else the copy in :func:`cache_dir`, else one downloaded there with
    pip.  Raises VllmSourceError when it cannot be had or its SHA-256 is not
    the pinned one."""
    return pinned_wheel(pin_of(version))


def pinned_wheel(pin: Pin) -> Path:
    """:func:`wheel` of any pinned release (for the v1 pins too)."""
    return _obtain(pin, pin.wheel, pin.wheel_sha256, WHEEL_ENV, _pip_download)


def _index_url(filename: str) -> str:
    """The URL of ``filename`` in the index's PEP 691 JSON page of the ``vllm`` project."""
    page = urllib.parse.urljoin(_index_root().rstrip("/") + "/", "vllm/")
    request = urllib.request.Request(
        page, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:
        kind = response.headers.get("Content-Type", "")
        if "json" not in kind:
            raise VllmSourceError(f"the package index at {page} answered {kind!r}, not PEP 691 "
                                  f"JSON; set ${INDEX_ENV} to an index that speaks it")
        listing = json.load(response)
    for entry in listing.get("files", []):
        if entry.get("filename") == filename:
            return urllib.parse.urljoin(page, str(entry["url"]))
    raise VllmSourceError(f"the package index at {page} does not list {filename}; "
                          f"set ${SDIST_ENV}=/path/to/{filename}")


def _download(url: str, dest: Path, expected: str) -> None:
    """Fetch ``url`` into ``dest``, which appears only if its SHA-256 is ``expected``."""
    digest = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(prefix=".download-", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as out, \
                urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response:
            for chunk in iter(lambda: response.read(1 << 20), b""):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != expected:
            raise VllmSourceError(f"{url} has sha256 {digest.hexdigest()}, not the pinned "
                                  f"{expected}; the index or the pin is wrong")
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _fetch_sdist(pin: Pin, dest: Path) -> None:
    """Download the source archive into ``dest`` by the URL the index lists."""
    try:
        _download(_index_url(pin.sdist), dest / pin.sdist, pin.sdist_sha256)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        # URLError and timeouts are OSErrors; the others: a malformed index page.
        raise VllmSourceError(f"could not fetch {pin.sdist} from {_index_root()}: "
                              f"{type(exc).__name__}: {exc}; check the network or set "
                              f"${SDIST_ENV}=/path/to/{pin.sdist}") from exc


def sdist(version: str = "0.8.5") -> Path:
    """The verified source archive of vLLM ``version`` (``vllm-0.8.5.tar.gz``):
    ``$PREFIXCACHE_VLLM_SDIST`` if set, else the copy in :func:`cache_dir`, else
    one downloaded there by the URL the package index lists for it.  Raises
    VllmSourceError when it cannot be had or its SHA-256 is not the pinned one."""
    pin = pin_of(version)
    if not pin.sdist:
        raise VllmSourceError(f"no source archive of vLLM {version} is pinned")
    return _obtain(pin, pin.sdist, pin.sdist_sha256, SDIST_ENV, _fetch_sdist)


# -- edits --------------------------------------------------------------------------------

_Normal = Tuple[Tuple[str, Tuple[Edit, ...]], ...]


def _normalise(edits: Optional[Edits]) -> _Normal:
    """``edits`` checked and in a canonical order (by path; files without
    edits dropped).  Raises TypeError or ValueError for malformed edits."""
    if edits is None:
        return ()
    if not isinstance(edits, collections.abc.Mapping):
        raise TypeError(f"edits must map paths to sequences of (old, new), got {edits!r}")
    out = []
    for path, seq in edits.items():
        if not isinstance(path, str) or not path.endswith(".py"):
            raise ValueError(f"an edited path is a .py file inside the vllm package, "
                             f"got {path!r}")
        parts = path.split("/")
        if path.startswith("/") or any(part in ("", ".", "..") for part in parts):
            raise ValueError(f"an edited path is relative to the vllm package, got {path!r}")
        if isinstance(seq, (str, bytes)) or not isinstance(seq, collections.abc.Sequence):
            raise TypeError(f"the edits of {path} must be a sequence of (old, new) pairs")
        pairs = []
        for edit in seq:
            if (not isinstance(edit, (tuple, list)) or len(edit) != 2
                    or not all(isinstance(part, str) for part in edit)):
                raise TypeError(f"an edit of {path} is a pair of strings, got {edit!r}")
            if not edit[0]:
                raise ValueError(f"an edit of {path} replaces an empty string")
            pairs.append((edit[0], edit[1]))
        if pairs:
            out.append((path, tuple(pairs)))
    return tuple(sorted(out))


def _digest(normal: _Normal) -> Optional[str]:
    if not normal:
        return None
    return hashlib.sha256(json.dumps(normal).encode()).hexdigest()


def _apply(root: Path, path: str, edits: Sequence[Edit]) -> None:
    """Apply ``edits`` in order to ``root/path`` (a file of the vllm package)."""
    target = root / path
    if not target.is_file():
        present = sorted(str(p.relative_to(root)) for p in root.rglob("*.py"))
        raise VllmSourceError(f"vllm/{path}: no such file to edit; the tree has "
                              f"{', '.join(present)}")
    text = target.read_text(encoding="utf-8")
    for number, (old, new) in enumerate(edits, 1):
        first = text.find(old)
        if first < 0 or text.find(old, first + 1) >= 0:
            times = "nowhere" if first < 0 else "more than once"
            raise VllmSourceError(f"vllm/{path}: edit {number} of {len(edits)} "
                                  f"({_short(old)} -> {_short(new)}) matches {times}; "
                                  "it must match exactly once")
        text = text[:first] + new + text[first + len(old):]
    _parse(text, f"vllm/{path} after its edits")
    target.write_text(text, encoding="utf-8")


def _short(text: str, limit: int = 60) -> str:
    shown = repr(text)
    return shown if len(shown) <= limit else shown[:limit - 4] + "...'"


def _parse(text: str, label: str) -> ast.Module:
    try:
        return ast.parse(text)
    except SyntaxError as exc:
        raise VllmSourceError(f"{label} does not parse: {exc}") from exc


# -- trees on disk ----------------------------------------------------------------------

def _key(pin: Pin, digest: Optional[str]) -> str:
    stubs = layout_of(pin).stub_version
    return f"vllm-{pin.version}-stubs{stubs}-{digest[:16] if digest else 'unedited'}"


def _stamp(pin: Pin, digest: Optional[str], **extra: str) -> Dict[str, Any]:
    return {"vllm": pin.version, "wheel_sha256": pin.wheel_sha256,
            "stubs": layout_of(pin).stub_version, "edits": digest, **extra}


def _built(target: Path, stamp: Dict[str, Any], fill: Callable[[Path], None]) -> Path:
    """``target``, built by ``fill`` into a fresh directory unless it already
    carries ``stamp``; replaced atomically.  The caller holds the lock."""
    try:
        if json.loads((target / _STAMP).read_text()) == stamp:
            return target
    except (OSError, ValueError):
        pass
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    except OSError as exc:
        raise VllmSourceError(f"cannot write below {target.parent}: {exc}; set ${CACHE_ENV} "
                              "to a writable directory") from exc
    try:
        tmp.chmod(0o755)
        fill(tmp)
        (tmp / _STAMP).write_text(json.dumps(stamp))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except OSError as exc:
        raise VllmSourceError(f"cannot write {target}: {exc}; set ${CACHE_ENV} to a "
                              "writable directory") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def cached_directory(version: str, relative: str, stamp: Mapping[str, Any],
                     fill: Callable[[Path], None]) -> Path:
    """``cache_dir(version)/relative``, built by ``fill(into)`` into a fresh
    directory and moved into place unless it already carries ``stamp`` (a
    JSON-able mapping saying what it was built from); under the cache's lock,
    so parallel processes build it once.  For other tools that keep files
    derived from a release (bench/vllm_block_tests.py).  Raises
    VllmSourceError when it cannot be written, and whatever ``fill`` raises."""
    cache = cache_dir(version)
    with _locked(cache):
        return _built(cache / relative, dict(stamp), fill)


def _extract(pin: Pin, into: Path) -> None:
    """The wheel's files the layout wants and its stubs, as ``into/vllm``."""
    layout = layout_of(pin)
    source = pinned_wheel(pin)
    try:
        with zipfile.ZipFile(source) as archive:
            members = [name for name in archive.namelist() if layout.wanted(name)]
            missing = [name for name in layout.required if name not in members]
            if missing:
                raise VllmSourceError(f"{source} has no {missing[0]}")
            for name in members:
                dest = into / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(archive.read(name))
    except (zipfile.BadZipFile, KeyError) as exc:
        raise VllmSourceError(f"cannot read {source}: {exc}; delete it and retry") from exc
    _write_stubs(layout.stubs(pin.version), into)


def _tree(pin: Pin, cache: Path, normal: _Normal) -> Path:
    """The source tree of ``pin`` with the edits ``normal``; the caller holds the lock."""
    digest = _digest(normal)
    if not normal:
        return _built(cache / "trees" / _key(pin, None), _stamp(pin, None),
                      lambda into: _extract(pin, into))
    base = _tree(pin, cache, ())

    def fill(into: Path) -> None:
        shutil.copytree(base / "vllm", into / "vllm",
                        ignore=shutil.ignore_patterns("__pycache__"))
        for path, edits in normal:
            _apply(into / "vllm", path, edits)

    return _built(cache / "trees" / _key(pin, digest), _stamp(pin, digest), fill)


def source_tree(version: str = "0.8.5", edits: Optional[Edits] = None) -> Path:
    """A directory ``D`` such that ``D/vllm`` is an importable package: the stub
    modules plus the wheel's ``vllm/core/block/*.py`` and ``vllm/core/evictor.py``,
    with ``edits`` applied (each ``old`` must occur exactly once in its file at
    its turn).  Built once per (version, stub version, edits) in the cache
    directory, under its lock, and reused.  Raises VllmSourceError when the
    wheel cannot be had, an edit does not apply or an edited file does not
    parse; TypeError or ValueError for malformed ``edits``."""
    return pinned_source_tree(pin_of(version), edits)


def pinned_source_tree(pin: Pin, edits: Optional[Edits] = None) -> Path:
    """:func:`source_tree` of any pinned release (for the v1 pins too)."""
    normal = _normalise(edits)
    cache = pinned_cache_dir(pin)
    with _locked(cache):
        return _tree(pin, cache, normal)


# -- importing under a private name -----------------------------------------------------

def _is_vllm(name: Optional[str]) -> bool:
    return name is not None and (name == "vllm" or name.startswith("vllm."))


def _rewrite_imports(text: str, package: str, label: str) -> str:
    """``text`` with every absolute import of ``vllm`` rewritten to ``package``
    (binding the same names), line numbers unchanged."""
    module = _parse(text, label)
    starts = [0] + [m.end() for m in re.finditer(r"\r\n|\r|\n", text)]

    def offset(lineno: int, col: int) -> int:  # col counts UTF-8 bytes
        line = text[starts[lineno - 1]:]
        return starts[lineno - 1] + len(line.encode()[:col].decode())

    changes: List[Tuple[int, int, str]] = []
    for node in ast.walk(module):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and _is_vllm(node.module):
            span = re.compile(r"\bvllm\b").search(
                text, offset(node.lineno, node.col_offset),
                offset(node.end_lineno or node.lineno, node.end_col_offset or 0))
            if span is not None:
                changes.append((span.start(), span.end(), package))
        elif isinstance(node, ast.Import):
            rebind = False
            for alias in node.names:
                if not _is_vllm(alias.name):
                    continue
                start = offset(alias.lineno, alias.col_offset)
                if text[start:start + 4] != "vllm":
                    raise VllmSourceError(f"{label}: cannot place the import of {alias.name} "
                                          f"at line {alias.lineno}")
                bare = alias.name == "vllm" and alias.asname is None
                changes.append((start, start + 4, f"{package} as vllm" if bare else package))
                rebind = rebind or (alias.asname is None and not bare)
            if rebind:  # `import vllm.x` binds the top package as `vllm`
                end = offset(node.end_lineno or node.lineno, node.end_col_offset or 0)
                changes.append((end, end, f"; import {package} as vllm"))
    for start, end, new in sorted(changes, reverse=True):
        text = text[:start] + new + text[end:]
    for node in ast.walk(_parse(text, f"{label} with its imports rewritten")):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        if any(_is_vllm(name) for name in names):
            raise VllmSourceError(f"{label}: an import of vllm at line {node.lineno} was not "
                                  "rewritten")
    return text


def _package(pin: Pin, digest: Optional[str]) -> str:
    name = "_prefixcache_vllm_" + re.sub(r"\W", "_", pin.version)
    return f"{name}_{digest[:10]}" if digest else name


def _rewritten_copy(pin: Pin, cache: Path, tree: Path, digest: Optional[str],
                    package: str) -> Path:
    """A directory holding ``package``: ``tree/vllm`` with its imports rewritten."""
    def fill(into: Path) -> None:
        for source in sorted((tree / "vllm").rglob("*.py")):
            relative = source.relative_to(tree / "vllm")
            dest = into / package / relative
            dest.parent.mkdir(parents=True, exist_ok=True)
            text = _rewrite_imports(source.read_text(encoding="utf-8"), package,
                                    f"vllm/{relative.as_posix()}")
            dest.write_text(text, encoding="utf-8")

    return _built(cache / "imports" / _key(pin, digest),
                  _stamp(pin, digest, package=package), fill)


def _import(package: str, root: Path, version: str,
            wanted: Mapping[str, str]) -> Dict[str, types.ModuleType]:
    """Import ``root/package`` as ``package`` (without touching sys.path) and
    the modules ``wanted`` (attribute -> dotted path) from it."""
    init = root / package / "__init__.py"
    existing = sys.modules.get(package)
    if existing is not None:
        where = getattr(existing, "__file__", None)
        if where is None or Path(where).resolve() != init.resolve():
            raise VllmSourceError(f"a module {package} is already imported from {where}, "
                                  f"not from {root}")
    else:
        spec = importlib.util.spec_from_file_location(
            package, init, submodule_search_locations=[str(init.parent)])
        if spec is None or spec.loader is None:
            raise VllmSourceError(f"cannot import {init}")
        top = importlib.util.module_from_spec(spec)
        sys.modules[package] = top
        try:
            spec.loader.exec_module(top)
        except BaseException:
            del sys.modules[package]
            raise
    modules = {}
    for attr, relative in wanted.items():
        try:
            modules[attr] = importlib.import_module(f"{package}.{relative}")
        except Exception as exc:  # an edit may make a module raise anything
            raise VllmSourceError(f"cannot import vllm.{relative} of vLLM {version} from "
                                  f"{root}: {type(exc).__name__}: {exc}") from exc
    return modules


_loaded: Dict[Tuple[str, Optional[str]], types.SimpleNamespace] = {}
_loading = threading.Lock()


def load(version: str = "0.8.5", edits: Optional[Edits] = None) -> types.SimpleNamespace:
    """vLLM ``version``'s block modules (with ``edits`` applied, as in
    :func:`source_tree`), imported into this process under a private package
    name, from a copy of the tree whose ``vllm`` imports name that package:
    no clash with a real ``vllm``, and trees with different edits load side by
    side.  Attributes: ``interfaces``, ``common``, ``naive_block``,
    ``prefix_caching_block``, ``cpu_gpu_block_allocator``, ``block_table``,
    ``evictor``, ``utils`` (the stub, with vLLM's Device enum), ``Device``,
    ``package`` (the private name), ``path`` (the directory holding that
    package).  Memoised per (version, edits) for the life of the process.
    Raises VllmSourceError as :func:`source_tree` does, or when a module does
    not import."""
    return load_pinned(pin_of(version), edits, lambda modules: {"Device": modules["utils"].Device})


def load_pinned(pin: Pin, edits: Optional[Edits] = None,
                extra: Optional[Callable[[Dict[str, types.ModuleType]], Dict[str, Any]]] = None,
                ) -> types.SimpleNamespace:
    """:func:`load` of any pinned release: the modules of its layout as
    attributes, plus what ``extra(modules)`` adds, ``package`` and ``path``.
    Memoised per (version, edits)."""
    normal = _normalise(edits)
    digest = _digest(normal)
    with _loading:
        found = _loaded.get((pin.version, digest))
        if found is not None:
            return found
        package = _package(pin, digest)
        cache = pinned_cache_dir(pin)
        with _locked(cache):
            root = _rewritten_copy(pin, cache, _tree(pin, cache, normal), digest, package)
        modules = _import(package, root, pin.version, layout_of(pin).modules)
        found = types.SimpleNamespace(**modules, **(extra(modules) if extra else {}),
                                      package=package, path=root)
        _loaded[(pin.version, digest)] = found
        return found


# -- command line ---------------------------------------------------------------------

def _smoke(ref: types.SimpleNamespace) -> List[str]:
    """A few allocations on the loaded modules ``ref`` (both devices, prefix
    hits, a swap, an eviction, a naive allocator); the lines to print."""
    gpu, cpu = ref.Device.GPU, ref.Device.CPU
    allocator = ref.cpu_gpu_block_allocator.CpuGpuBlockAllocator.create(
        "prefix_caching", num_gpu_blocks=4, num_cpu_blocks=3, block_size=2)
    first = allocator.allocate_immutable_blocks(None, [[1, 2], [3, 4]], device=gpu)
    tail = allocator.allocate_mutable_block(first[-1], device=gpu)
    tail.append_token_ids([5])
    second = allocator.allocate_immutable_blocks(None, [[1, 2], [3, 4]], device=gpu)
    lines = [
        f"first chain ids : {[b.block_id for b in first + [tail]]}",
        f"second chain ids: {[b.block_id for b in second]} (prefix cache hits)",
        f"GPU free blocks : {allocator.get_num_free_blocks(gpu)}",
        f"GPU hit rate    : {allocator.get_prefix_cache_hit_rate(gpu)}",
        f"swap GPU->CPU   : {allocator.swap(first + [tail], gpu, cpu)}",
    ]
    for block in second:
        allocator.free(block)
    lines.append(f"GPU evictor     : {sorted(allocator._allocators[gpu].evictor.free_table)}")
    naive = ref.naive_block.NaiveBlockAllocator(
        create_block=ref.naive_block.NaiveBlock, num_blocks=3, block_size=2)
    block = naive.allocate_immutable_block(None, [7, 8])
    lines.append(f"naive block id  : {block.block_id} free {naive.get_num_free_blocks()}")
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line: obtain and import vLLM, print where, and with
    ``--check`` run a small allocation on it.  Returns 0, or 1 after printing one line
    saying why it failed."""
    parser = argparse.ArgumentParser(
        prog="python -m prefixcache.oracle.vllm_source",
        description="Obtain, verify and import vLLM's block allocators (a pinned release).")
    parser.add_argument("--check", action="store_true",
                        help="also run a small allocation on the imported allocators")
    parser.add_argument("--version", default="0.8.5", choices=sorted(PINS),
                        help="the vLLM release (0.8.5)")
    args = parser.parse_args(argv)
    return report_check(lambda: load(args.version), _smoke if args.check else None,
                        f"vLLM {args.version} block allocators")


def report_check(loader: Callable[[], types.SimpleNamespace],
                 smoke: Optional[Callable[[types.SimpleNamespace], List[str]]],
                 label: str) -> int:
    """A ``--check`` command's body: ``loader()``, then ``smoke`` on what it
    loaded if given; prints where it was loaded from (after ``label``) and the
    smoke's lines.  Returns 0, or 1 after printing one line saying why it failed."""
    try:
        ref = loader()
        lines = smoke(ref) if smoke is not None else []
    except Exception as exc:  # noqa: BLE001 - any failure is reported in one line
        reason = " ".join(str(exc).split()) or type(exc).__name__
        print(f"error: {reason}", file=sys.stderr)
        return 1
    print(f"{label}: {ref.path / ref.package} ({ref.package})")
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
