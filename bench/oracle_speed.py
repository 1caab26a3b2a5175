"""How fast the oracle checks steps, on prefixcache.impl and on vLLM 0.8.5
itself, and where its time goes.

For each target, runs one ``prefixcache fuzz`` campaign (one worker,
white-box checks on) for a fixed time and prints its steps per second:

* ``impl``: prefixcache.impl, mistakes included (``prefixcache fuzz``);
* ``vllm``: vLLM 0.8.5's own allocator judged by its own rules on valid
  calls (``prefixcache fuzz --target vllm==0.8.5 --semantics vllm-0.8.5
  --no-mistakes``).  It has findings, and the campaign shrinks each new one,
  so the time spent shrinking (from a batch's first failure to its end, and
  the trace minimiser) and the steps run while shrinking are reported apart: the
  checked steps per second of the search are its steps outside shrinking
  over its time outside shrinking.  ``--max-findings`` is set high, so the
  campaign searches for the whole time (a known finding met again is
  halted quietly, as in any campaign).

A campaign's budget is wall time, and on a machine other jobs share the
process does not have a core all the time: the CPU time of the campaign is
measured too, and beside each figure per wall second stands the same per
CPU second (for the checking part, its share of the CPU time taken in
proportion to its share of the wall time).

Then, unless ``--no-profile``, the same campaign again under cProfile, its
own time (tottime) grouped by the part of the system that spent it: the
target allocator, the model, the spec (abstraction function and
invariants), the driver's comparisons, the state machine's rules,
Hypothesis itself, and the rest::

    python bench/oracle_speed.py --seconds 30
    python bench/oracle_speed.py --targets vllm --seconds 30 --json speed.json
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from prefixcache.oracle import campaign
from prefixcache.oracle.search import Outcome

#: The targets by key: a label, and the options of ``prefixcache fuzz`` that
#: judge it (beside ``--seconds``, ``--seed``, ``--quiet`` and ``--max-findings``).
TARGETS: Dict[str, Tuple[str, Tuple[str, ...]]] = {
    "impl": ("prefixcache.impl", ()),
    "vllm": ("vLLM 0.8.5", ("--target", "vllm==0.8.5", "--semantics", "vllm-0.8.5",
                            "--no-mistakes")),
}

#: A campaign of the speed run stops at its time budget, not at a number of findings.
MAX_FINDINGS = 1000

#: (label, path fragment) in matching order: the first fragment found names the part.
PARTS: List[Tuple[str, str]] = [
    ("target (prefixcache.impl)", "/impl/"),
    ("target (vLLM 0.8.5)", "/_prefixcache_vllm_"),
    ("model", "/model/"),
    ("spec: abstraction + invariants", "/spec/"),
    ("oracle: driver comparisons", "/oracle/driver.py"),
    ("oracle: rules and strategies", "/oracle/"),
    ("hypothesis engine", "/hypothesis/"),
]


@dataclass
class Speed:
    """One campaign's figures (no profiler)."""

    target: str
    command: str
    seconds: float
    steps: int
    examples: int
    shrink_seconds: float
    shrink_steps: int
    findings: int
    known_met: int
    stopped_because: str
    #: steps per second over the whole campaign, shrinking included
    steps_per_s: float = 0.0
    #: steps outside shrinking per second outside shrinking: the search's checking
    checking_steps_per_s: float = 0.0
    #: this process's CPU time during the campaign
    cpu_seconds: float = 0.0
    #: steps per CPU second, shrinking included
    steps_per_cpu_s: float = 0.0
    #: checking steps per CPU second (CPU time apportioned by wall time)
    checking_steps_per_cpu_s: float = 0.0


@dataclass
class Profile:
    """One campaign under cProfile: own time by part and the dearest functions."""

    target: str
    steps: int
    seconds: float
    parts: Dict[str, float] = field(default_factory=dict)
    top: List[Tuple[float, float, str]] = field(default_factory=list)


def part_of(filename: str) -> str:
    """The part of the system a profiled function's file belongs to."""
    return next((label for label, fragment in PARTS if fragment in filename),
                "python and the rest")


def fuzz_args(key: str, seconds: float, seed: int) -> argparse.Namespace:
    """The ``prefixcache fuzz`` options of target ``key``'s speed campaign,
    parsed as ``prefixcache fuzz`` parses them."""
    parser = argparse.ArgumentParser()
    campaign.add_arguments(parser)
    return parser.parse_args([*TARGETS[key][1], "--seconds", str(seconds), "--seed", str(seed),
                              "--quiet", "--max-findings", str(MAX_FINDINGS)])


def speed_of(key: str, outcome: Outcome, cpu_seconds: float) -> Speed:
    """The figures of a finished campaign on target ``key`` that took
    ``cpu_seconds`` of this process's CPU time."""
    stats = outcome.stats
    share = cpu_seconds / outcome.seconds if outcome.seconds > 0 else 0.0
    checking_seconds = outcome.seconds - outcome.shrink_seconds
    checking_steps = stats.steps - stats.shrink_steps
    return Speed(
        target=TARGETS[key][0],
        command=" ".join(("prefixcache", "fuzz", *TARGETS[key][1])),
        seconds=outcome.seconds, steps=stats.steps, examples=stats.examples,
        shrink_seconds=outcome.shrink_seconds, shrink_steps=stats.shrink_steps,
        findings=len(outcome.findings), known_met=sum(stats.known_seen.values()),
        stopped_because=outcome.stopped_because,
        steps_per_s=stats.steps / outcome.seconds if outcome.seconds > 0 else 0.0,
        checking_steps_per_s=(checking_steps / checking_seconds
                              if checking_seconds > 0 else 0.0),
        cpu_seconds=cpu_seconds,
        steps_per_cpu_s=stats.steps / cpu_seconds if cpu_seconds > 0 else 0.0,
        checking_steps_per_cpu_s=(checking_steps / (checking_seconds * share)
                                  if checking_seconds > 0 and share > 0 else 0.0))


def measure(key: str, seconds: float, seed: int) -> Speed:
    """One campaign on target ``key`` without the profiler."""
    args = fuzz_args(key, seconds, seed)
    campaign.configure(args)  # the target loaded and built once, outside the timing
    start = time.process_time()
    outcome = campaign.search_with(args)
    return speed_of(key, outcome, time.process_time() - start)


def profile(key: str, seconds: float, seed: int, top: int) -> Profile:
    """One campaign on target ``key`` under cProfile, its own time by part."""
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    outcome = campaign.search_with(fuzz_args(key, seconds, seed))
    profiler.disable()
    wall = time.perf_counter() - start
    stats = pstats.Stats(profiler)
    by_part: Dict[str, float] = defaultdict(float)
    rows = []
    for (filename, line, name), (_, _, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        by_part[part_of(filename)] += tottime
        rows.append((tottime, cumtime, f"{filename.rsplit('/', 2)[-2:]}:{line} {name}"))
    return Profile(target=TARGETS[key][0], steps=outcome.stats.steps, seconds=wall,
                   parts=dict(sorted(by_part.items(), key=lambda kv: -kv[1])),
                   top=sorted(rows, reverse=True)[:top])


def print_speed(speed: Speed) -> None:
    """The figures of one campaign, one paragraph."""
    print(f"{speed.target} ({speed.command}), one worker, white-box:")
    print(f"  {speed.steps:,} steps in {speed.seconds:.1f} s = {speed.steps_per_s:,.0f} steps/s "
          f"({speed.examples:,} examples, {speed.findings} findings, a known one met again "
          f"{speed.known_met:,} times; stopped: {speed.stopped_because})")
    print(f"  shrinking: {speed.shrink_seconds:.1f} s and {speed.shrink_steps:,} steps; "
          f"checking outside it: {speed.steps - speed.shrink_steps:,} steps in "
          f"{speed.seconds - speed.shrink_seconds:.1f} s = "
          f"{speed.checking_steps_per_s:,.0f} checked steps/s")
    print(f"  CPU time: {speed.cpu_seconds:.1f} s ({speed.cpu_seconds / speed.seconds:.0%} of "
          f"the wall time): {speed.steps_per_cpu_s:,.0f} steps per CPU second, "
          f"{speed.checking_steps_per_cpu_s:,.0f} checked steps per CPU second outside "
          "shrinking")


def print_profile(result: Profile) -> None:
    """The profile's own time by part, then the dearest functions."""
    total = sum(result.parts.values()) or 1.0
    print(f"\n{result.target} under cProfile: {result.steps:,} steps in {result.seconds:.1f} s;"
          " own time by part:")
    print("| part | own time (s) | share |\n|---|---:|---:|")
    for label, seconds in result.parts.items():
        print(f"| {label} | {seconds:.2f} | {100 * seconds / total:.1f}% |")
    print(f"\ntop {len(result.top)} functions by own time:")
    print("| function | own (s) | cumulative (s) |\n|---|---:|---:|")
    for tottime, cumtime, where in result.top:
        print(f"| `{where}` | {tottime:.2f} | {cumtime:.2f} |")


def _keys(text: str) -> List[str]:
    keys = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [key for key in keys if key not in TARGETS]
    if not keys or unknown:
        raise argparse.ArgumentTypeError(f"targets are {', '.join(TARGETS)}; got {text!r}")
    return keys


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Measure each target, print the figures (and profiles); 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=_keys, default=list(TARGETS),
                        metavar="impl,vllm", help="which targets (both)")
    parser.add_argument("--seconds", type=float, default=30.0,
                        help="each campaign's time budget (30)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--top", type=int, default=12, help="functions to list")
    parser.add_argument("--no-profile", action="store_true",
                        help="skip the campaigns under cProfile")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also write the figures as JSON to PATH")
    args = parser.parse_args(argv)
    speeds = []
    for key in args.targets:
        speeds.append(measure(key, args.seconds, args.seed))
        print_speed(speeds[-1])
    profiles = []
    if not args.no_profile:
        for key in args.targets:
            profiles.append(profile(key, args.seconds, args.seed, args.top))
            print_profile(profiles[-1])
    if args.json:
        Path(args.json).write_text(json.dumps({
            "format": "prefixcache-oracle-speed/1", "seconds": args.seconds, "seed": args.seed,
            "command": "python bench/oracle_speed.py " + " ".join(
                sys.argv[1:] if argv is None else argv),
            "speeds": [asdict(speed) for speed in speeds],
            "profiles": [asdict(result) for result in profiles]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
