"""``prefixcache fuzz``: a fuzzing campaign of one target against the model.

The campaign runs the oracle's state machine in batches of examples until
the time or example budget is spent or a violation is found.  Each batch
has its own seed, derived from ``--seed``, so a campaign is reproducible.
``--workers N`` runs N such campaigns in processes that share one Hypothesis
example database (a directory, or ``redis://HOST:PORT``): a failure one
worker finds is saved there and replayed first by every other worker and
every later campaign.

Exit codes: 0 no violation, 1 a violation, 2 a usage error.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import multiprocessing
import os
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import hypothesis.core
from hypothesis import Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase
from hypothesis.stateful import run_state_machine_as_test

from .machine import Stats, make_machine
from .profiles import PROFILES, default_profile, profile_settings
from .targets import DEFAULT_TARGET, KINDS, TargetError, _load, resolve_target
from .trace import render
from .violations import Violation

BATCH_EXAMPLES = 25


@dataclass
class Outcome:
    """What one campaign (one process) found."""

    steps: int = 0
    examples: int = 0
    seconds: float = 0.0
    coverage: Counter[str] = field(default_factory=Counter)
    violations: List[Dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> Dict[str, Any]:
        """The outcome as a JSON object (the ``--json`` report)."""
        return {
            "steps": self.steps,
            "examples": self.examples,
            "seconds": round(self.seconds, 3),
            "steps_per_second": round(self.steps / self.seconds, 1) if self.seconds else 0.0,
            "coverage": dict(sorted(self.coverage.items())),
            "violations": self.violations,
        }

    def merge(self, other: Outcome) -> None:
        """Add another worker's outcome (its time runs in parallel)."""
        self.steps += other.steps
        self.examples += other.examples
        self.seconds = max(self.seconds, other.seconds)
        self.coverage.update(other.coverage)
        self.violations += other.violations


def open_database(spec: Optional[str]) -> Optional[ExampleDatabase]:
    """The example database ``spec`` names: None, a directory, or
    ``redis://HOST:PORT`` (needs the ``redis`` package)."""
    if spec is None:
        return None
    if spec.startswith("redis://"):
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase

        return RedisExampleDatabase(redis.Redis.from_url(spec),
                                    expire_after=datetime.timedelta(days=30))
    return DirectoryBasedExampleDatabase(spec)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``prefixcache fuzz``."""
    parser.add_argument("--target", default=DEFAULT_TARGET, metavar="MODULE:CLASS",
                        help="the allocator to judge (default: prefixcache.impl)")
    parser.add_argument("--kind", choices=KINDS, default=None,
                        help="prefix, naive or cpu_gpu (default: guessed from the class)")
    parser.add_argument("--hash-algo", default=None, metavar="builtin|sha256|MODULE:FUNCTION",
                        help="the target's hash_algo constructor argument (default: its own)")
    parser.add_argument("--relaxed", action="store_true",
                        help="accept any free id the spec allows (default: vLLM's id order)")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--seconds", type=float, default=None, help="time budget")
    budget.add_argument("--examples", type=int, default=None, help="example budget")
    budget.add_argument("--steps", type=int, default=None,
                        help="step budget (whole batches of examples: a few more are run)")
    parser.add_argument("--seed", type=int, default=0, help="campaign seed (default 0)")
    parser.add_argument("--no-mistakes", action="store_true",
                        help="generate valid call sequences only")
    parser.add_argument("--black-box", action="store_true",
                        help="compare results only, not internals and invariants")
    parser.add_argument("--workers", type=int, default=1, help="processes (default 1)")
    parser.add_argument("--database", default=None, metavar="PATH|redis://HOST:PORT",
                        help="the Hypothesis example database to share")
    parser.add_argument("--json", default=None, metavar="PATH", help="write a JSON report")
    parser.add_argument("--profile", choices=sorted(PROFILES), default=None,
                        help="Hypothesis profile (default: ci under CI, else dev)")
    parser.add_argument("--trace-out", default="prefixcache-failure.trace.json",
                        metavar="PATH", help="where to save the failing trace")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--no-shrink", action="store_true",
                        help="stop at the first violation, unshrunk (shrinking can take minutes)")


def target_options(args: argparse.Namespace) -> Dict[str, Any]:
    """The constructor options ``--hash-algo`` asks for: ``{}`` without it,
    else ``hash_algo`` as a name ("builtin", "sha256"), a function named
    ``MODULE:FUNCTION``, or a callable given directly (from Python)."""
    algo = getattr(args, "hash_algo", None)
    if algo is None:
        return {}
    if isinstance(algo, str) and ":" in algo:
        algo = _load(algo)
    return {"hash_algo": algo}


def _campaign(args: argparse.Namespace, worker: int, progress: Any = None) -> Outcome:
    """Run one worker's campaign; return what it found."""
    logging.getLogger("prefixcache").setLevel(logging.ERROR)  # refused resets are expected
    target = resolve_target(args.target, kind=args.kind, strict=not args.relaxed,
                            options=target_options(args))
    stats = Stats()
    machine = make_machine(target, mistakes=not args.no_mistakes,
                           white_box=not args.black_box, stats=stats)
    base = profile_settings(args.profile or default_profile())
    database = open_database(args.database)
    outcome = Outcome()
    start = time.monotonic()
    # Seed Hypothesis's own source of per-run seeds (what it uses when no seed
    # is forced), so a campaign is reproducible and still uses the database.
    hypothesis.core.threadlocal._hypothesis_global_random = random.Random(
        args.seed * 1_000_003 + worker)
    budget_steps = getattr(args, "steps", None)
    budget_examples = args.examples if args.examples is not None else (
        None if args.seconds is not None or budget_steps is not None else base.max_examples)
    while True:
        elapsed = time.monotonic() - start
        if args.seconds is not None and elapsed >= args.seconds:
            break
        if budget_steps is not None and stats.steps >= budget_steps:
            break
        if budget_examples is not None and stats.examples >= budget_examples:
            break
        size = BATCH_EXAMPLES
        if budget_examples is not None:
            size = max(1, min(size, budget_examples - stats.examples))
        run_settings = settings(base, max_examples=size, database=database, derandomize=False,
                                print_blob=False)
        if getattr(args, "no_shrink", False):
            run_settings = settings(run_settings, report_multiple_bugs=False, phases=[
                p for p in run_settings.phases if p not in (Phase.shrink, Phase.explain)])
        try:
            run_state_machine_as_test(machine, settings=run_settings)
        except Violation as violation:
            outcome.violations.append(_report(violation, args))
            break
        except Exception as exc:  # several distinct failures, or a bug of ours
            found = [e for e in getattr(exc, "exceptions", []) if isinstance(e, Violation)]
            if not found:
                raise
            outcome.violations += [_report(v, args) for v in found]
            break
        finally:
            if progress is not None:
                progress(stats)
    outcome.steps, outcome.examples = stats.steps, stats.examples
    outcome.coverage = stats.coverage
    outcome.seconds = time.monotonic() - start
    return outcome


def _report(violation: Violation, args: argparse.Namespace) -> Dict[str, Any]:
    trace = violation.trace
    entry = violation.to_json()
    if trace is not None:
        entry["trace"] = trace.to_json()
        entry["program"] = render(trace)
        path = Path(args.trace_out)
        trace.save(path)
        entry["trace_file"] = str(path)
    return entry


def _worker(args: argparse.Namespace, worker: int, queue: Any) -> None:
    def progress(stats: Stats) -> None:
        queue.put(("progress", worker, stats.steps, stats.examples))

    try:
        queue.put(("done", worker, _campaign(args, worker, progress)))
    except BaseException as exc:  # reported to the parent, which exits non-zero
        queue.put(("error", worker, f"{type(exc).__name__}: {exc}"))


def _run_workers(args: argparse.Namespace) -> Outcome:
    from rich.progress import Progress

    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(args, w, queue)) for w in range(args.workers)]
    for proc in procs:
        proc.start()
    total = Outcome()
    seen: Dict[int, Tuple[int, int]] = {}
    pending = set(range(args.workers))
    with Progress(disable=args.quiet, transient=True) as bar:
        task = bar.add_task("fuzzing", total=args.seconds or None)
        start = time.monotonic()
        while pending:
            kind, worker, *payload = queue.get()
            if kind == "progress":
                seen[worker] = tuple(payload)
                steps = sum(s for s, _ in seen.values())
                examples = sum(e for _, e in seen.values())
                elapsed = time.monotonic() - start
                bar.update(task, completed=min(elapsed, args.seconds or elapsed),
                           description=f"{args.workers} workers: {steps} steps, "
                           f"{steps / max(elapsed, 1e-9):.0f} steps/s, {examples} examples, "
                           f"{len(total.violations)} violations")
            elif kind == "done":
                total.merge(payload[0])
                pending.discard(worker)
            else:
                pending.discard(worker)
                total.violations.append({"category": "crash", "message": payload[0],
                                         "trace": None})
    for proc in procs:
        proc.join()
    return total


def _print_summary(outcome: Outcome, args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(stderr=False)
    data = outcome.to_json()
    algo = getattr(args, "hash_algo", None)
    console.print(f"[bold]prefixcache fuzz[/] target={args.target} "
                  + (f"hash_algo={algo} " if algo else "")
                  + f"workers={args.workers} seed={args.seed}")
    console.print(f"steps: {data['steps']}  examples: {data['examples']}  "
                  f"seconds: {data['seconds']}  steps/s: {data['steps_per_second']}")
    table = Table(title="coverage (transitions and states reached)")
    table.add_column("label")
    table.add_column("count", justify="right")
    for label, count in sorted(outcome.coverage.items()):
        table.add_row(label, str(count))
    console.print(table)
    if not outcome.violations:
        console.print("[green]no violation[/]")
    for violation in outcome.violations:
        console.print(f"[red]VIOLATION[/] {escape(violation['category'])}: "
                      f"{escape(violation['message'])}")
        if violation.get("program"):
            console.print("shortest failing program found:")
            console.print(violation["program"], markup=False, highlight=False)
        if violation.get("trace_file"):
            console.print(f"trace saved to {violation['trace_file']}; re-run it with "
                          f"`prefixcache replay {violation['trace_file']}`")


def run(args: argparse.Namespace) -> int:
    """Run the campaign; print the summary; 0 clean, 1 violation, 2 usage error."""
    if args.workers < 1:
        print("prefixcache fuzz: --workers must be >= 1", file=sys.stderr)
        return 2
    try:
        resolve_target(args.target, kind=args.kind, options=target_options(args))
    except TargetError as exc:
        print(f"prefixcache fuzz: {exc}", file=sys.stderr)
        return 2
    if args.workers == 1:
        outcome = _run_single(args)
    else:
        outcome = _run_workers(args)
    _print_summary(outcome, args)
    if args.json:
        Path(args.json).write_text(json.dumps(outcome.to_json(), indent=1) + "\n")
    return 1 if outcome.violations else 0


def _run_single(args: argparse.Namespace) -> Outcome:
    from rich.progress import Progress

    with Progress(disable=args.quiet or not sys.stdout.isatty(), transient=True) as bar:
        task = bar.add_task("fuzzing", total=args.seconds or None)
        start = time.monotonic()

        def progress(stats: Stats) -> None:
            elapsed = time.monotonic() - start
            bar.update(task, completed=min(elapsed, args.seconds or elapsed),
                       description=f"{stats.steps} steps, "
                       f"{stats.steps / max(elapsed, 1e-9):.0f} steps/s, "
                       f"{stats.examples} examples, 0 violations")

        return _campaign(args, int(os.environ.get("PREFIXCACHE_WORKER", "0")), progress)
