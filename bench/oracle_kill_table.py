"""How fast the oracle catches deliberately broken allocators: bench/ORACLE_KILLS.md.

Runs the oracle's state machine with the ``ci`` settings profile (derandomized:
the same examples, hence the same figures, on every run) against every broken
allocator of tests/helpers/broken_allocators.py -- the same runs as
tests/test_oracle_catches_broken.py -- and records, for each, the steps until
the first Violation (``Stats.steps`` at that moment, every earlier example
included), the example it came in, its category and the spec invariants broken
at that moment.  Then the faults the profile misses (``MISSED``, each run to
the end of the profile's budget) and prefixcache.impl's own prefix-caching
and naive allocators (no violation expected).  Writes the table and the
median steps to catch.

Usage::

    python bench/oracle_kill_table.py [--out bench/ORACLE_KILLS.md] [--json PATH]
                                      [--profile ci] [--shrink] [--no-missed]

``--shrink`` also lets Hypothesis shrink each failure and records the length
of the shortest failing program (much slower: tens of seconds of CPU per
allocator; the steps to the catch are the same).  Exit code: 0, or 1 when a
broken allocator was not caught or one of prefixcache.impl's was flagged.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import hypothesis  # noqa: E402
from helpers.broken_allocators import (  # noqa: E402
    BROKEN,
    INVARIANT_COVERAGE,
    MISSED,
    Kill,
    hunt,
)

from prefixcache.impl.naive_block import NaiveBlockAllocator  # noqa: E402
from prefixcache.impl.prefix_caching_block import PrefixCachingBlockAllocator  # noqa: E402


def _cell(value: Any) -> str:
    if value is None or value == []:
        return "-"
    if isinstance(value, (list, tuple, set, frozenset)):
        return ", ".join(str(v) for v in sorted(value))
    return str(value).replace("|", "\\|")


def _run(target: Any, profile: str, shrink: bool, quiet: bool) -> Kill:
    kill = hunt(target, profile=profile, shrink=shrink, quiet=True)
    if not quiet:
        outcome = (f"caught at step {kill.steps} (example {kill.examples}) as {kill.category}"
                   if kill.caught else f"not caught ({kill.total_examples} examples, "
                   f"{kill.total_steps} steps){': ' + kill.error if kill.error else ''}")
        print(f"{kill.name:36} {outcome}  [{kill.seconds:.1f} s]", file=sys.stderr, flush=True)
    return kill


def render(kills: List[Kill], missed: List[Kill], reals: List[Kill], reasons: Dict[str, str],
           profile: str, shrink: bool, seconds: float, cpu_seconds: float) -> str:
    caught = [k for k in kills if k.caught]
    steps = [k.steps for k in caught if k.steps is not None]
    examples = [k.examples for k in caught if k.examples is not None]
    lines = [
        "# The oracle against deliberately broken allocators",
        "",
        "Produced by `python bench/oracle_kill_table.py"
        + (" --shrink" if shrink else "") + "` "
        f"({datetime.date.today().isoformat()}, Python {platform.python_version()}, "
        f"Hypothesis {hypothesis.__version__}, profile `{profile}`: "
        "derandomized, so every figure is the same on every run).",
        "The allocators and their faults are in `tests/helpers/broken_allocators.py`; "
        "`tests/test_oracle_catches_broken.py` runs the same hunts.",
        "",
        "**Steps to catch** is `Stats.steps` when the first Violation was raised: "
        "every step of every example run before it, the failing one included "
        "(**ex.** is the example it came in).  **Invariants at the catch** are "
        "the spec invariants the target's abstract state broke at that moment "
        "(the driver compares ids and free counts before it checks invariants, "
        "so a `conformance` catch can break invariants too).",
        "",
        f"**Median steps to catch: {statistics.median(steps) if steps else '-'}** "
        f"over {len(caught)} of {len(kills)} broken allocators "
        f"(median example {statistics.median(examples) if examples else '-'}; "
        f"min {min(steps) if steps else '-'}, max {max(steps) if steps else '-'}).",
        "",
        "| # | allocator | fault | expected | caught | steps to catch | ex. | category "
        "reported | invariants at the catch |"
        + (" shortest failing program |" if shrink else ""),
        "|---|---|---|---|---|---:|---:|---|---|" + ("---:|" if shrink else ""),
    ]
    for n, k in enumerate(kills, 1):
        row = (f"| {n} | `{k.name}` | {_cell(k.fault)} | {_cell(k.expected)} | "
               f"{'yes' if k.caught else '**NO**'} | {_cell(k.steps)} | {_cell(k.examples)} | "
               f"{_cell(k.category)} | {_cell(k.invariants_at_catch)} |")
        if shrink:
            row += f" {_cell(k.final_steps)} |"
        lines.append(row)
    lines += [
        "",
        "## Invariant coverage",
        "",
        "Each spec invariant, the broken allocators designed to break it, and "
        "those whose state broke it at the catch.",
        "",
        "| invariant | designed to break it | broken at the catch |",
        "|---|---|---|",
    ]
    for name, designed in INVARIANT_COVERAGE.items():
        seen = [k.name for k in kills if name in k.invariants_at_catch]
        lines.append(f"| `{name}` | {_cell(designed)} | {_cell(seen)} |")
    lines += [
        "",
        "## Faults the profile misses",
        "",
        "| allocator | fault | outcome | why |",
        "|---|---|---|---|",
    ]
    for k in missed:
        outcome = (f"caught at step {k.steps} as {k.category}" if k.caught else
                   f"not caught in {k.total_examples} examples / {k.total_steps} steps"
                   + (f" ({_cell(k.error)})" if k.error else ""))
        lines.append(f"| `{k.name}` | {_cell(k.fault)} | {outcome} | "
                     f"{_cell(reasons.get(k.name))} |")
    if not missed:
        lines.append("| (not run: `--no-missed`) | | | |")
    lines += ["", "## prefixcache.impl's own allocators (no false alarm expected)", ""]
    for real in reals:
        outcome = ("no violation" if not real.caught and real.error is None else
                   f"**{real.category or 'error'}**: {_cell(real.message or real.error)}")
        lines.append(f"- `{real.name}` under the same profile: {outcome} in "
                     f"{real.total_examples} examples / {real.total_steps} steps "
                     f"({real.cpu_seconds:.1f} s CPU).")
    catch_cpu = sum(k.cpu_seconds for k in kills)
    lines += [
        "",
        f"Time: the {len(kills)} hunts took {catch_cpu:.0f} s of CPU (they stop at "
        f"the first Violation, no shrinking{' except with --shrink' if shrink else ''}); "
        f"the whole run {cpu_seconds:.0f} s of CPU, {seconds:.0f} s wall.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "bench" / "ORACLE_KILLS.md"))
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the records")
    parser.add_argument("--profile", default="ci", choices=["ci", "dev", "nightly"])
    parser.add_argument("--shrink", action="store_true",
                        help="shrink each failure (records the shortest failing program)")
    parser.add_argument("--no-missed", action="store_true", help="skip the MISSED faults")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    logging.getLogger("prefixcache").setLevel(logging.ERROR)

    start, cpu_start = time.monotonic(), time.process_time()
    kills = [_run(cls, args.profile, args.shrink, args.quiet) for cls, _ in BROKEN]
    missed = [] if args.no_missed else [
        _run(cls, args.profile, False, args.quiet) for cls, _ in MISSED]
    reals = [_run(cls, args.profile, args.shrink, args.quiet)
             for cls in (PrefixCachingBlockAllocator, NaiveBlockAllocator)]
    seconds, cpu_seconds = time.monotonic() - start, time.process_time() - cpu_start

    reasons = {cls.__name__: why for cls, why in MISSED}
    text = render(kills, missed, reals, reasons, args.profile, args.shrink, seconds,
                  cpu_seconds)
    Path(args.out).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"profile": args.profile, "kills": [k.to_json() for k in kills],
             "missed": [k.to_json() for k in missed], "real": [k.to_json() for k in reals]},
            indent=1) + "\n")
    print(text)
    ok = all(k.caught and k.category in set(expected)
             for k, (_, expected) in zip(kills, BROKEN))
    clean = all(not k.caught and k.error is None for k in reals)
    return 0 if ok and clean else 1


if __name__ == "__main__":
    sys.exit(main())
