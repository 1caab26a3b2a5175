"""How fast the oracle checks steps, and where its time goes.

Runs one ``prefixcache fuzz`` campaign (one worker, the default target,
mistakes included, white-box) for a fixed time under cProfile and prints the
checked steps per second, then the profile's own time (tottime) grouped by
the part of the system that spent it: the target allocator, the model, the
spec (abstraction function and invariants), the driver's comparisons, the
state machine's rules, Hypothesis itself, and the rest.  A second run
without the profiler gives the steps per second undisturbed::

    python bench/oracle_speed.py --seconds 30
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from collections import defaultdict
from typing import Dict, List, Tuple

from prefixcache.oracle import campaign

#: (label, path fragment) in matching order: the first fragment found names the part.
PARTS: List[Tuple[str, str]] = [
    ("target (prefixcache.impl)", "/impl/"),
    ("model", "/model/"),
    ("spec: abstraction + invariants", "/spec/"),
    ("oracle: driver comparisons", "/oracle/driver.py"),
    ("oracle: rules and strategies", "/oracle/"),
    ("hypothesis engine", "/hypothesis/"),
]


def part_of(filename: str) -> str:
    """The part of the system a profiled function's file belongs to."""
    for label, fragment in PARTS:
        if fragment in filename:
            return label
    return "python and the rest"


def fuzz_args(seconds: float, seed: int) -> argparse.Namespace:
    """The options of ``prefixcache fuzz --seconds S --seed N --quiet``."""
    parser = argparse.ArgumentParser()
    campaign.add_arguments(parser)
    return parser.parse_args(["--seconds", str(seconds), "--seed", str(seed), "--quiet"])


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--top", type=int, default=12, help="functions to list")
    args = parser.parse_args(argv)

    plain = campaign.search_with(fuzz_args(args.seconds, args.seed))
    steps, examples = plain.stats.steps, plain.stats.examples
    print(f"without profiler: {steps:,} steps in {plain.seconds:.1f} s = "
          f"{steps / plain.seconds:,.0f} checked steps/s ({examples:,} examples); "
          f"{plain.shrink_seconds:.1f} s of it shrinking")

    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    profiled = campaign.search_with(fuzz_args(args.seconds, args.seed))
    profiler.disable()
    wall = time.perf_counter() - start
    stats = pstats.Stats(profiler)
    by_part: Dict[str, float] = defaultdict(float)
    rows = []
    for (filename, line, name), (_, _, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        by_part[part_of(filename)] += tottime
        rows.append((tottime, cumtime, f"{filename.rsplit('/', 2)[-2:]}:{line} {name}"))
    total = sum(by_part.values())
    print(f"\nunder cProfile: {profiled.stats.steps:,} steps in {wall:.1f} s; own time by part:")
    print("| part | own time (s) | share |\n|---|---:|---:|")
    for label, seconds in sorted(by_part.items(), key=lambda kv: -kv[1]):
        print(f"| {label} | {seconds:.2f} | {100 * seconds / total:.1f}% |")
    print(f"\ntop {args.top} functions by own time:")
    print("| function | own (s) | cumulative (s) |\n|---|---:|---:|")
    for tottime, cumtime, where in sorted(rows, reverse=True)[: args.top]:
        print(f"| `{where}` | {tottime:.2f} | {cumtime:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
