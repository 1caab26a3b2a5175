"""Hash integrity: the oracle names a block's content by its exact tokens
(the extra hash and the whole token prefix), never by a hash, so a cache hit
on an id that holds other content is an ``integrity`` violation.  An
allocator built with a degenerate ``hash_algo`` (tests/helpers/degenerate_hashes.py:
a constant, an 8-bit truncation, a polynomial hash with a known algebraic
collision) is flagged in every run (five seeds each, ``dev`` profile, at
most 1,500 examples: an example meets only a few contents, and two of them
must share one of 256 values; the five 8-bit seeds took 221 to 65,852 steps,
about 40 s in all, on 2026-12-05); with
``hash_algo="sha256"`` a short campaign finds nothing here; the long one,
``prefixcache fuzz --hash-algo sha256 --steps 100000 --seed 1``, ran 100,131
steps (1,990 examples, 772 cache hits) in 132 s on a shared 2-core machine,
with no violation."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from helpers import degenerate_hashes as dh

from prefixcache.impl.prefix_caching_block import PrefixCachingBlockAllocator
from prefixcache.oracle import campaign as fuzz
from prefixcache.oracle.search import Outcome

TESTS = Path(__file__).resolve().parent
SEEDS = range(5)


def campaign(tmp_path: Path, hash_algo: Any, seed: int, *options: str) -> Outcome:
    """One single-worker ``prefixcache fuzz`` search, as the CLI runs it, with
    ``options`` (a budget) and ``hash_algo`` (a name or a function)."""
    parser = argparse.ArgumentParser()
    fuzz.add_arguments(parser)
    args = parser.parse_args(["--profile", "dev", "--seed", str(seed), "--quiet",
                              "--no-shrink", "--findings-dir", str(tmp_path), *options])
    args.hash_algo = hash_algo
    return fuzz.search_with(args)


@pytest.fixture(autouse=True)
def _no_ci_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("CI", raising=False)
    yield


def test_the_polynomial_collision_is_algebraic() -> None:
    for a, b in (([0, 0], [1, 1]), ([1, 1], [2, 2]), ([0, 1], [1, 2])):
        assert a != b
        assert dh.polynomial(None, a, None) == dh.polynomial(None, b, None)
        assert dh.polynomial(5, a, 7) == dh.polynomial(5, b, 7)  # under any parent
    # the difference of the unreduced values is a multiple of the modulus
    assert (1 * dh.BASE + 1) - (0 * dh.BASE + 0) == dh.MODULUS
    first = dh.polynomial(None, [1], None)
    assert dh.polynomial(first, [0], None) == first  # the chain [1], [0] is [1]
    # and the allocator really shares the id between the two contents
    a = PrefixCachingBlockAllocator(num_blocks=4, block_size=2, hash_algo=dh.polynomial)
    zeros = a.allocate_immutable_block(None, [0, 0])
    ones = a.allocate_immutable_block(None, [1, 1])
    assert ones.block_id == zeros.block_id
    assert PrefixCachingBlockAllocator(num_blocks=4, block_size=2).allocate_immutable_block(
        None, [1, 1]).block_id == 0  # a sound hash: a miss, on id 0 of a fresh pool


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("hash_algo", [dh.constant, dh.eight_bit, dh.polynomial],
                         ids=["constant", "eight_bit", "polynomial"])
def test_a_degenerate_hash_is_flagged_in_every_run(
        tmp_path: Path, hash_algo: Callable[..., int], seed: int) -> None:
    outcome = campaign(tmp_path, hash_algo, seed, "--examples", "1500", "--stop-at-first")
    found = [f.violation for f in outcome.findings.in_order()]
    assert found, f"seed {seed}: no violation in {outcome.stats.steps} steps"
    assert [v.category for v in found] == ["integrity"], found
    print(f"\n{hash_algo.__name__} seed {seed}: caught after {outcome.stats.steps} steps: "
          f"{found[0].message[:120]}")


def test_sha256_runs_clean(tmp_path: Path) -> None:
    """The short CI version of the 100,000-step sha256 campaign."""
    outcome = campaign(tmp_path, "sha256", 0, "--steps", "3000")
    assert len(outcome.findings) == 0
    assert outcome.stats.steps >= 3_000
    assert outcome.stats.coverage["state:cache-hit-seen"] > 0  # hits happened, and were right


def test_the_cli_takes_a_hash_algo(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(TESTS))
    env.pop("CI", None)
    result = subprocess.run(
        [sys.executable, "-m", "prefixcache.cli", "fuzz", "--hash-algo",
         "helpers.degenerate_hashes:constant", "--examples", "50", "--quiet", "--seed", "3",
         "--no-shrink"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FINDING 1 integrity/" in result.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "prefixcache.cli", "fuzz", "--hash-algo", "nowhere:nothing",
         "--examples", "1", "--quiet"], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300)
    assert bad.returncode == 2, bad.stdout + bad.stderr
