"""``prefixcache fuzz``: a fuzzing campaign of one target against the model.

The campaign searches (:mod:`~prefixcache.oracle.search`) until its budget
ends or ``--max-findings`` distinct findings are found, and reports every
distinct finding: shrunk, with its program, its own trace file (which
``prefixcache replay`` re-runs) and, where it exists only because of a
stricter option of the spec, that option.  ``--baseline REPORT.json`` makes
an earlier report's findings known: only new ones fail the run.
``--workers N`` runs N searches in processes that share one Hypothesis
example database (a directory, or ``redis://HOST:PORT``).

Exit codes: 0 no new finding, 1 a new finding, 2 a usage error (any bad
option, or a target that is not an allocator); the ``prefixcache`` command
exits 3 when the run breaks off on an exception (:data:`prefixcache.cli.INTERNAL_ERROR`).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Set

from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

from ..spec.semantics import DEFAULT, PRESETS, Semantics
from ..spec.v1_semantics import V1_PRESETS
from .findings import explain, read_baseline, write_traces
from .profiles import PROFILES, default_profile, profile_settings
from .search import Budget, Outcome, SearchOptions, search
from .targets import (
    DEFAULT_TARGET,
    KINDS,
    Target,
    TargetError,
    check_allocator,
    load_object,
    resolve_target,
)
from .v1_targets import V1_DEFAULT_TARGET, check_v1_pool, resolve_v1_target

#: The APIs a campaign can judge: v0's block allocators, v1's BlockPool.
APIS = ("v0", "v1")


class UsageError(ValueError):
    """An option of the command line cannot be used (exit code 2)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``prefixcache fuzz``."""
    parser.add_argument("--api", choices=APIS, default="v0",
                        help="v0: vLLM 0.8.5's block allocators (the default); v1: vLLM v1's "
                        "BlockPool (pinned releases 0.28.0 to 0.34.0)")
    parser.add_argument("--target", default=None, metavar="MODULE:CLASS",
                        help="the allocator to judge: MODULE:CLASS, or vllm==0.8.5 for vLLM's "
                        "own (default: prefixcache.impl; with --api v1: vllm==0.34.0, vLLM's "
                        "own BlockPool, or another pinned release from vllm==0.28.0)")
    parser.add_argument("--kind", choices=KINDS, default=None,
                        help="prefix, naive or cpu_gpu (default: guessed from the class)")
    parser.add_argument("--hash-algo", default=None, metavar="builtin|sha256|MODULE:FUNCTION",
                        help="the target's hash_algo constructor argument (default: its own)")
    parser.add_argument("--relaxed", action="store_true",
                        help="accept any free id the spec allows (default: vLLM's id order)")
    parser.add_argument("--semantics", choices=sorted(set(PRESETS) | set(V1_PRESETS)),
                        default=DEFAULT,
                        help="whose rule decides where the spec names two (default: "
                        "prefixcache; vllm-0.8.5 takes vLLM 0.8.5's, and with --api v1 "
                        "vllm-0.34.0 takes vLLM's, the same for every pinned release)")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--seconds", type=float, default=None,
                        help="time budget of the whole run, shrinking included")
    budget.add_argument("--examples", type=int, default=None, help="example budget")
    budget.add_argument("--steps", type=int, default=None,
                        help="step budget (whole batches of examples: a few more are run)")
    parser.add_argument("--max-findings", type=int, default=10, metavar="N",
                        help="stop after N distinct new findings (default 10)")
    parser.add_argument("--stop-at-first", action="store_true",
                        help="stop at the first finding (as --max-findings 1)")
    parser.add_argument("--baseline", default=None, metavar="REPORT.json",
                        help="an earlier --json report: its findings are known, only new "
                        "ones fail the run")
    parser.add_argument("--call-timeout", type=float, default=10.0, metavar="SECONDS",
                        help="a call of the target that runs longer is a hang (default 10; "
                        "0: no limit)")
    parser.add_argument("--seed", type=int, default=0, help="campaign seed (default 0)")
    parser.add_argument("--no-mistakes", action="store_true",
                        help="valid calls only: within the API's types, no row of the error table")
    parser.add_argument("--black-box", action="store_true",
                        help="compare results only, not internals and invariants")
    parser.add_argument("--workers", type=int, default=1, help="processes (default 1)")
    parser.add_argument("--database", default=None, metavar="PATH|redis://HOST:PORT",
                        help="the Hypothesis example database to share")
    parser.add_argument("--json", default=None, metavar="PATH", help="write a JSON report")
    parser.add_argument("--profile", choices=sorted(PROFILES), default=None,
                        help="Hypothesis profile (default: ci under CI, else dev)")
    parser.add_argument("--findings-dir", default="prefixcache-findings", metavar="DIR",
                        help="where each finding's trace is written (default "
                        "./prefixcache-findings)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--no-shrink", action="store_true",
                        help="report findings as found, unshrunk")


# -- checking the options -------------------------------------------------------


def target_options(args: argparse.Namespace) -> Dict[str, Any]:
    """The constructor options ``--hash-algo`` asks for: ``{}`` without it,
    else ``hash_algo`` as a name ("builtin", "sha256"), a function named
    ``MODULE:FUNCTION``, or a callable given directly (from Python).
    UsageError for any other value."""
    algo = getattr(args, "hash_algo", None)
    if algo is None:
        return {}
    if isinstance(algo, str) and ":" in algo:
        try:
            algo = load_object(algo)
        except TargetError as exc:
            raise UsageError(f"--hash-algo {args.hash_algo}: {exc}") from exc
        if not callable(algo):
            raise UsageError(f"--hash-algo {args.hash_algo} is not a function")
    elif isinstance(algo, str) and algo not in ("builtin", "sha256"):
        raise UsageError(f"--hash-algo must be builtin, sha256 or MODULE:FUNCTION, got {algo!r}")
    return {"hash_algo": algo}


def open_database(spec: Optional[str]) -> Optional[ExampleDatabase]:
    """The example database ``spec`` names: None, a directory, or
    ``redis://HOST:PORT[/DB]`` (needs the ``redis`` package; the server
    must answer).  UsageError when it cannot be used."""
    if spec is None:
        return None
    if spec.startswith("redis://"):
        try:
            import redis
            from hypothesis.extra.redis import RedisExampleDatabase
        except ImportError as exc:
            raise UsageError(f"--database {spec} needs the redis package "
                             "(pip install redis)") from exc
        client = redis.Redis.from_url(spec, socket_connect_timeout=3, socket_timeout=10)
        try:
            client.ping()
        except redis.RedisError as exc:
            raise UsageError(f"--database {spec}: cannot reach the Redis server "
                             f"({type(exc).__name__}: {exc})") from exc
        return RedisExampleDatabase(client, expire_after=datetime.timedelta(days=30))
    if Path(spec).exists() and not Path(spec).is_dir():
        raise UsageError(f"--database {spec} is a file, not a directory")
    return DirectoryBasedExampleDatabase(spec)


def _positive(args: argparse.Namespace) -> None:
    for name in ("seconds", "examples", "steps"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            raise UsageError(f"--{name} must be > 0, got {value:g}")
    if args.workers < 1:
        raise UsageError("--workers must be >= 1")
    if args.max_findings < 1:
        raise UsageError("--max-findings must be >= 1")
    if args.call_timeout < 0:
        raise UsageError("--call-timeout must be >= 0 (0: no limit)")


def _api(args: argparse.Namespace) -> str:
    return getattr(args, "api", None) or "v0"


def presets_of(args: argparse.Namespace) -> Dict[str, Semantics]:
    """The semantic presets of the campaign's API."""
    return V1_PRESETS if _api(args) == "v1" else PRESETS


def _resolve(args: argparse.Namespace) -> Target:
    """The target the options name (``--target`` filled in with the API's default)."""
    if _api(args) == "v1":
        args.target = args.target or V1_DEFAULT_TARGET
        return resolve_v1_target(args.target)
    args.target = args.target or DEFAULT_TARGET
    return resolve_target(args.target, kind=args.kind, strict=not args.relaxed,
                          options=target_options(args))


def _check_api(args: argparse.Namespace) -> None:
    """The options that only one API takes; the semantics of the API's presets."""
    api = _api(args)
    if args.semantics not in presets_of(args):
        raise UsageError(f"--semantics {args.semantics} is not a preset of --api {api} "
                         f"(choose {', '.join(sorted(presets_of(args)))})")
    if api == "v1":
        given = [flag for flag, value in (("--kind", args.kind), ("--hash-algo",
                 getattr(args, "hash_algo", None)), ("--relaxed", args.relaxed or None))
                 if value is not None]
        if given:
            raise UsageError(f"{', '.join(given)} cannot be used with --api v1 (a v1 pool "
                             "takes the caller's hashes and hands out ids in its queue's order)")


def configure(args: argparse.Namespace) -> Target:
    """Check every option; return the target, built once to see that it is
    an allocator.  UsageError (exit code 2) for anything wrong."""
    _positive(args)
    _check_api(args)
    target_options(args)
    try:
        target = _resolve(args)
        if _api(args) == "v1":
            check_v1_pool(target)
        else:
            check_allocator(target)
    except TargetError as exc:
        raise UsageError(str(exc)) from exc
    open_database(args.database)
    if args.baseline is not None:
        try:
            read_baseline(Path(args.baseline))
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
    return target


# -- running -----------------------------------------------------------------------


def search_with(args: argparse.Namespace, worker: int = 0,
                progress: Optional[Callable[[Outcome], None]] = None) -> Outcome:
    """One worker's search, as the options (checked by :func:`configure`) ask."""
    target = _resolve(args)
    budget = Budget(seconds=args.seconds, examples=args.examples, steps=args.steps,
                    max_findings=1 if args.stop_at_first else args.max_findings)
    if budget.seconds is None and budget.examples is None and budget.steps is None:
        budget.examples = profile_settings(args.profile or default_profile()).max_examples
    options = SearchOptions(
        mistakes=not args.no_mistakes, white_box=not args.black_box,
        semantics=presets_of(args)[args.semantics], call_timeout=args.call_timeout or None,
        base=profile_settings(args.profile or default_profile()),
        database=open_database(args.database), shrink=not args.no_shrink, seed=args.seed,
        worker=worker)
    known: Set[str] = read_baseline(Path(args.baseline)) if args.baseline else set()
    return search(target, budget, options, known=known, progress=progress)


@contextlib.contextmanager
def _progress_bar(args: argparse.Namespace,
                  workers: int = 1) -> Iterator[Callable[[int, int, int], None]]:
    """A progress bar (hidden by --quiet or off a terminal) and its update:
    steps, examples and findings so far."""
    from rich.progress import Progress

    with Progress(disable=args.quiet or not sys.stdout.isatty(), transient=True) as bar:
        task = bar.add_task("fuzzing", total=args.seconds or None)
        start = time.monotonic()

        def show(steps: int, examples: int, findings: int) -> None:
            elapsed = time.monotonic() - start
            who = f"{workers} workers: " if workers > 1 else ""
            bar.update(task, completed=min(elapsed, args.seconds or elapsed),
                       description=f"{who}{steps} steps, {steps / max(elapsed, 1e-9):.0f} "
                       f"steps/s, {examples} examples, {findings} findings")

        yield show


def _run_single(args: argparse.Namespace) -> Outcome:
    with _progress_bar(args) as show:
        return search_with(args, int(os.environ.get("PREFIXCACHE_WORKER", "0")), lambda outcome:
                           show(outcome.stats.steps, outcome.stats.examples,
                                len(outcome.findings)))


def _worker(args: argparse.Namespace, worker: int, queue: Any) -> None:
    def progress(outcome: Outcome) -> None:
        queue.put(("progress", worker, outcome.stats.steps, outcome.stats.examples,
                   len(outcome.findings)))

    try:
        queue.put(("done", worker, search_with(args, worker, progress)))
    except BaseException as exc:  # reported to the parent, which exits non-zero
        queue.put(("error", worker, f"{type(exc).__name__}: {exc}"))


def _run_workers(args: argparse.Namespace) -> Outcome:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(args, w, queue)) for w in range(args.workers)]
    for proc in procs:
        proc.start()
    total = Outcome()
    seen: Dict[int, tuple[int, int, int]] = {}
    pending = set(range(args.workers))
    errors: List[str] = []
    with _progress_bar(args, args.workers) as show:
        while pending:
            kind, worker, *payload = queue.get()
            if kind == "progress":
                seen[worker] = (payload[0], payload[1], payload[2])
                show(*(sum(v[k] for v in seen.values()) for k in range(3)))
            elif kind == "done":
                total.merge(payload[0])
                pending.discard(worker)
            else:
                pending.discard(worker)
                errors.append(f"worker {worker}: {payload[0]}")
    for proc in procs:
        proc.join()
    if errors:
        raise RuntimeError("; ".join(errors))
    return total


def report(outcome: Outcome, args: argparse.Namespace) -> Dict[str, Any]:
    """The JSON report of a campaign."""
    data: Dict[str, Any] = {"api": _api(args), "target": args.target,
                            "semantics": args.semantics,
                            "mistakes": not args.no_mistakes, "seed": args.seed,
                            "workers": args.workers, "baseline": args.baseline}
    data.update(outcome.to_json())
    data["findings"] = [f.to_json() for f in outcome.findings.in_order()]
    data["known"] = [{"signature": sig, "seen": n}
                     for sig, n in sorted(outcome.stats.known_seen.items())]
    return data


def _print_summary(outcome: Outcome, args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    # in a log file or a pipe, lines are not folded: paths and programs stay whole
    console = Console(stderr=False, highlight=False, soft_wrap=not sys.stdout.isatty())
    data = outcome.to_json()
    algo = getattr(args, "hash_algo", None)
    console.print("[bold]prefixcache fuzz[/] "
                  + ("api=v1 " if _api(args) == "v1" else "")
                  + f"target={escape(args.target)} "
                  + (f"hash_algo={escape(str(algo))} " if algo else "")
                  + f"semantics={args.semantics} "
                  + ("no-mistakes " if args.no_mistakes else "")
                  + f"workers={args.workers} seed={args.seed}")
    console.print(f"steps: {data['steps']}  examples: {data['examples']}  "
                  f"seconds: {data['seconds']} (shrinking {data['shrink_seconds']})  "
                  f"steps/s: {data['steps_per_second']}  stopped: {data['stopped_because']}")
    table = Table(title="coverage (transitions and states reached)")
    table.add_column("label")
    table.add_column("count", justify="right")
    for label, count in sorted(outcome.stats.coverage.items()):
        table.add_row(escape(label), str(count))
    console.print(table)
    log = outcome.log
    if log.lines:
        kinds = "; ".join(f"{n} x {level} {name}: {message!r}"
                          for (name, level, message), n in log.counts.most_common(3))
        console.print(f"target log: {log.lines} lines, not printed ({escape(kinds)})")
    for signature, count in sorted(outcome.stats.known_seen.items()):
        times = "once" if count == 1 else f"{count} times"
        console.print(f"known finding met again {times}: {escape(signature)}")
    findings = outcome.findings.in_order()
    if not findings:
        console.print("[green]no new finding[/]")
    if outcome.left_out:
        console.print(f"stopped at --max-findings {args.max_findings}: {outcome.left_out} more "
                      "distinct findings of the last batch are left out")
    for number, finding in enumerate(findings, start=1):
        v = finding.violation
        console.print(f"[red]FINDING {number}[/] {escape(finding.signature)}")
        console.print(f"  {escape(v.message)}", highlight=False)
        if finding.explanation is not None:
            console.print(f"  {escape(finding.explanation.sentence())}")
        if v.trace is not None:
            from .trace import render

            state = "shrunk" if finding.shrunk else (
                "a hang: not shrunk" if v.category == "hang" else "not shrunk: --no-shrink"
                if args.no_shrink else "shrinking cut short by the time budget")
            steps = len(v.trace.steps)
            console.print(f"  the program ({steps} step{'s' if steps != 1 else ''}, {state}):")
            console.print("    " + render(v.trace).replace("\n", "\n    "), markup=False)
        if finding.trace_file:
            console.print(f"  trace: {finding.trace_file}; re-run it with "
                          f"`prefixcache replay {finding.trace_file}`")


def run(args: argparse.Namespace) -> int:
    """Run the campaign; print the summary; 0 no new finding, 1 a new
    finding, 2 a usage error."""
    try:
        target = configure(args)
    except UsageError as exc:
        print(f"prefixcache fuzz: {exc}", file=sys.stderr)
        return 2
    outcome = _run_single(args) if args.workers == 1 else _run_workers(args)
    findings = outcome.findings.in_order()
    for finding in findings:
        finding.explanation = explain(finding, target, presets_of(args)[args.semantics],
                                      white_box=not args.black_box,
                                      call_timeout=args.call_timeout or None,
                                      presets=presets_of(args))
    write_traces(findings, Path(args.findings_dir))
    _print_summary(outcome, args)
    if args.json:
        Path(args.json).write_text(json.dumps(report(outcome, args), indent=1) + "\n")
    return 1 if findings else 0
