"""The distribution installs as one import root, ``prefixcache``.

Builds a wheel from this checkout, installs it into a fresh virtual
environment and imports it from another directory: ``prefixcache.impl`` and
friends import, and nothing named ``spec``, ``model``, ``impl`` or
``oracle`` lands in site-packages.  The default install is lean: what the
drop-in and ``fuzz``/``replay``/``bench`` need, no test tools and no solver
(CrossHair comes with the ``verify`` extra).
"""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_installs_only_the_prefixcache_import_root(tmp_path: Path) -> None:
    wheel_dir = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(wheel_dir), str(ROOT)],
        check=True,
    )
    (wheel,) = wheel_dir.glob("prefixcache-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
                   check=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    probe = (
        "import importlib.util, sysconfig, pathlib\n"
        "import prefixcache.impl.prefix_caching_block as p\n"
        "import prefixcache.impl.cpu_gpu_block_allocator\n"
        "a = p.PrefixCachingBlockAllocator(num_blocks=2, block_size=2)\n"
        "assert a.allocate_immutable_block(None, [1, 2]).block_id == 0\n"
        "site = pathlib.Path(sysconfig.get_paths()['purelib'])\n"
        "print(sorted(x.name for x in site.iterdir() if x.name in "
        "('spec', 'model', 'impl', 'oracle', 'tests', 'bench')))\n"
        "print([n for n in ('spec', 'model', 'impl', 'oracle') "
        "if importlib.util.find_spec(n) is not None])\n"
        "print(pathlib.Path(p.__file__).is_relative_to(site))\n"
    )
    out = subprocess.run([str(python), "-c", probe], cwd=elsewhere, check=True,
                         capture_output=True, text=True).stdout.split("\n")
    assert out[0] == "[]", out
    assert out[1] == "[]", out
    assert out[2] == "True", out
    files = subprocess.run(
        [str(python), "-c",
         "import importlib.metadata as m; "
         "print('\\n'.join(str(f) for f in m.files('prefixcache')))"],
        cwd=elsewhere, check=True, capture_output=True, text=True,
    ).stdout.split()
    top_level = {name.split("/")[0] for name in files}
    assert top_level <= {"prefixcache", "prefixcache-0.1.0.dist-info", "..", "bin"}, top_level
    for package in ("spec", "model", "impl", "oracle"):
        assert any(name.startswith(f"prefixcache/{package}/") for name in files), package
    requires = subprocess.run(
        [str(python), "-c",
         "import importlib.metadata as m; print('\\n'.join(m.requires('prefixcache')))"],
        cwd=elsewhere, check=True, capture_output=True, text=True,
    ).stdout.splitlines()
    default = {r.split(">")[0].split("=")[0].split("[")[0].strip()
               for r in requires if "extra ==" not in r}
    assert default == {"hypothesis", "icontract", "rich"}, default
    verify = [r for r in requires if "extra == \"verify\"" in r]
    assert any(r.startswith("crosshair-tool") for r in verify), verify
