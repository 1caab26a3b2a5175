"""``prefixcache bench``: time an allocator on a realistic serving workload.

The workload (:mod:`prefixcache.bench.workload`) is generated once per pool
size, planned on prefixcache.impl, compiled into a flat program of allocator
calls (:mod:`prefixcache.bench.replayer`) and replayed on each target:

* throughput: the whole program, best of ``--repeats`` replays, each on a
  fresh allocator (construction not timed), without per-call timing, by
  wall time or (``--clock cpu``) by this process's CPU time; the garbage
  collector runs but the objects alive before the replay are frozen
  (``gc.freeze``), so a large pool does not make collections slower;
* latency: one more replay timing every call with ``perf_counter_ns``; the
  median cost of reading the clock twice is subtracted from each sample.
  Their sum, each kind's samples capped at its 99th percentile so that a
  call during which the process was descheduled does not count in full, is
  the time spent inside the allocator ("in-call calls/s": calls per second
  of it, without the driver's bookkeeping between calls, which the
  throughput figure includes);
* the hit rate (``get_prefix_cache_hit_rate()`` at the end), and the
  fingerprint: SHA-256 of every id the target handed out, in order.  A
  target's answers to the scheduler's queries must equal the planned ones,
  or the program would not be the one a scheduler would have issued to it
  (reported as "diverged").

``--against MODULE:CLASS`` times a second target in the same run,
interleaved with the first (``--against vllm``: vLLM 0.8.5's own allocator,
obtained by :mod:`prefixcache.oracle.vllm_source`).
``--workload access-heavy`` times the access-heavy workload instead of the
main one: every running sequence marks all its blocks accessed at every
scheduler step (``mark_blocks_as_accessed``), as a scheduler without vLLM's
deferral does.
``--scaling`` prints the per-call cost for pool sizes from 1,000 to
1,000,000 blocks on one and the same program (``--scaling-against``: the
second target's too, measured in the same rounds).  ``--soak`` replays the
roomy pool's program on the target, checked as it goes (:mod:`.soak`),
instead of timing it.

A benchmark is not a test: nothing here asserts a timing.  Exit code 0,
1 when a target raised or diverged, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from time import perf_counter_ns, process_time_ns
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..oracle import vllm_source
from ..oracle.targets import Target, TargetError, check_allocator, resolve_target
from .replayer import Machine, Plan, ReplayError, percentile, plan, timer_overhead_ns
from .soak import print_report, soak
from .workload import ACCESS_HEAVY, MAIN, WORKLOADS, WorkloadConfig

VLLM = "vllm"
VERIFY_CONTENT = "verify-content"
DEFAULT_SCALING_SIZES = (1_000, 10_000, 100_000, 1_000_000)

#: ``--clock``: wall time, or the CPU time of this process (steadier on a
#: machine that other jobs share: time spent descheduled does not count).
CLOCKS: Dict[str, Callable[[], int]] = {"wall": perf_counter_ns, "cpu": process_time_ns}


# -- results ------------------------------------------------------------------------


@dataclass
class KindLatency:
    """Latency of one kind of call, in nanoseconds, and the time spent in all
    calls of the kind, in milliseconds (each call capped at the p99, as for
    the in-call figure); timer overhead removed."""

    count: int
    p50_ns: int
    p99_ns: int
    total_ms: float = 0.0


@dataclass
class RunResult:
    """One target on one pool."""

    target: str
    pool: str
    num_blocks: int
    calls: int
    seconds: float = 0.0
    seconds_all: List[float] = field(default_factory=list)
    calls_per_s: float = 0.0
    ns_per_call: float = 0.0
    hit_rate: float = 0.0
    in_call_seconds: float = 0.0
    in_call_calls_per_s: float = 0.0
    fingerprint: str = ""
    answers_match: bool = True
    latency: Dict[str, KindLatency] = field(default_factory=dict)
    error: Optional[str] = None


@dataclass
class PoolReport:
    """One pool size: the workload's statistics and each target's result."""

    pool: str
    config: Dict[str, Any]
    workload: Dict[str, Any]
    calls: int
    calls_by_name: Dict[str, int]
    results: List[RunResult]
    ratio: Optional[float] = None
    paired_ratio: Optional[float] = None
    in_call_ratio: Optional[float] = None
    fingerprints_identical: Optional[bool] = None
    clock: str = "wall"
    workload_name: str = MAIN


@dataclass
class ScalingRow:
    """The target's per-call cost on one pool size."""

    num_blocks: int
    prefilled: int
    calls_per_s: float
    ns_per_call: float
    relative: float
    fingerprint: str
    error: Optional[str] = None


# -- targets ---------------------------------------------------------------------------


def load_target(name: Optional[str], vllm_cache: Optional[str] = None) -> Target:
    """The target ``name`` names: ``vllm`` (vLLM 0.8.5's allocator, by
    vllm_source.load; ``vllm_cache``, if given, becomes this process's
    $PREFIXCACHE_VLLM_CACHE), ``verify-content`` (prefixcache.impl's with
    ``verify_content=True``), ``MODULE:CLASS`` or None for prefixcache.impl.
    Raises TargetError."""
    if name == VLLM:
        if vllm_cache:
            os.environ[vllm_source.CACHE_ENV] = vllm_cache
        return replace(resolve_target("vllm==0.8.5"),
                       name="vllm-0.8.5:PrefixCachingBlockAllocator")
    if name == VERIFY_CONTENT:
        from ..impl.prefix_caching_block import PrefixCachingBlockAllocator

        return Target(name="prefixcache.impl (verify_content=True)", kind="prefix",
                      build=lambda n, size: PrefixCachingBlockAllocator(
                          num_blocks=n, block_size=size, verify_content=True))
    target = resolve_target(name)
    check_allocator(target)
    if target.kind != "prefix":
        raise TargetError(f"bench times prefix-caching allocators with vLLM's single-device "
                          f"API; {target.name} looks like a {target.kind!r} allocator")
    return target


# -- measuring -----------------------------------------------------------------------


def _replay_once(target: Target, program_plan: Plan, num_blocks: int,
                 prefill: int = 0, clock: Callable[[], int] = perf_counter_ns
                 ) -> tuple[int, Machine]:
    """Replay the whole program on a fresh allocator; return (ns, machine)."""
    program = program_plan.program
    block_size = program_plan.workload.config.block_size
    allocator = target.make(num_blocks, block_size)
    if prefill:
        fill_cache(allocator, prefill, block_size)
    machine = Machine(allocator, program.num_seqs)
    gc.collect()
    gc.freeze()
    try:
        start = clock()
        machine.run(program.instructions)
        elapsed = clock() - start
    finally:
        gc.unfreeze()
    return elapsed, machine


def round_ratios(first: Sequence[float], second: Sequence[float]) -> List[float]:
    """Each complete round's ``second[i] / first[i]``, smallest first: how far
    apart they lie is the machine's noise on this comparison."""
    return sorted(b / a for a, b in zip(first, second) if a > 0)


def paired_ratio(first: Sequence[float], second: Sequence[float]) -> Optional[float]:
    """The median over the rounds of ``second[i] / first[i]``: the two
    targets' times of one round were taken seconds apart, so a drift
    of the machine's speed cancels out of each ratio, which it does not from
    the ratio of the two bests.  None without a complete round."""
    ratios = round_ratios(first, second)
    return statistics.median(ratios) if ratios else None


def spread_text(ratios: Sequence[float]) -> str:
    """``", from 2.1x to 2.7x"`` for the rounds' ratios; empty for fewer than two."""
    return f", from {ratios[0]:.3g}x to {ratios[-1]:.3g}x" if len(ratios) > 1 else ""


def fill_cache(allocator: Any, count: int, block_size: int, chain: int = 64) -> None:
    """Put ``count`` cached, evictable blocks in ``allocator`` (chains of
    distinct content, allocated then freed) without changing its free count.
    Each chain is marked computed before it is freed, as an engine marks
    the blocks of every step: the blocks are cached and computed, like those
    a server's evictor holds, and none is left touched (otherwise the first
    ``mark_blocks_as_computed`` of the timed replay would pay for all of
    them at once, a cost of this setup and not of the pool's size)."""
    first = 0
    done = 0
    while done < count:
        length = min(chain, count - done)
        # first tokens -2, -3, ...: never -1, whose hash is hash(-2), so that
        # no two chains' contents hash alike
        tokens = [[-2 - first] + [0] * (block_size - 1)] + [[0] * block_size] * (length - 1)
        blocks = allocator.allocate_immutable_blocks(None, tokens)
        allocator.mark_blocks_as_computed([])
        for block in blocks:
            allocator.free(block)
        first += 1
        done += length


def measure(targets: Sequence[Target], program_plan: Plan, pool: str, num_blocks: int,
            repeats: int, latency: bool, progress: Any = None,
            clock: Callable[[], int] = perf_counter_ns) -> List[RunResult]:
    """Time each target on the program (repeats interleaved across targets;
    ``clock`` for the throughput, ``perf_counter_ns`` for the latencies)."""
    program = program_plan.program
    results = [RunResult(target=t.name, pool=pool, num_blocks=num_blocks, calls=program.calls)
               for t in targets]
    for _ in range(max(1, repeats)):
        for target, result in zip(targets, results):
            if result.error is not None:
                continue
            if progress is not None:
                progress(f"{pool}: {target.name}")
            try:
                elapsed, machine = _replay_once(target, program_plan, num_blocks, 0, clock)
            except ReplayError as exc:
                result.error = str(exc)
                continue
            result.seconds_all.append(elapsed / 1e9)
            fingerprint = machine.fingerprint()
            if result.fingerprint and result.fingerprint != fingerprint:
                result.error = "the ids differ between two replays of the same program"
            result.fingerprint = fingerprint
            result.answers_match = machine.answers == program.expected
            result.hit_rate = float(machine.allocator.get_prefix_cache_hit_rate())
            del machine
    for result in results:
        if result.seconds_all and result.calls:
            result.seconds = min(result.seconds_all)
            result.calls_per_s = result.calls / result.seconds
            result.ns_per_call = result.seconds * 1e9 / result.calls
    if latency:
        overhead = timer_overhead_ns()
        for target, result in zip(targets, results):
            if result.error is not None:
                continue
            if progress is not None:
                progress(f"{pool}: {target.name} (latency)")
            allocator = target.make(num_blocks, program_plan.workload.config.block_size)
            machine = Machine(allocator, program.num_seqs)
            gc.collect()
            gc.freeze()
            try:
                samples = machine.run_timed(program.instructions)
            except ReplayError as exc:
                result.error = str(exc)
                continue
            finally:
                gc.unfreeze()
            inside = 0
            for name, values in sorted(samples.items()):
                values.sort()
                cap = percentile(values, 0.99)  # winsorised: a descheduled call counts as p99
                spent = sum(min(v, cap) for v in values) - overhead * len(values)
                inside += spent
                result.latency[name] = KindLatency(
                    count=len(values),
                    p50_ns=max(0, percentile(values, 0.50) - overhead),
                    p99_ns=max(0, percentile(values, 0.99) - overhead),
                    total_ms=max(0, spent) / 1e6,
                )
            if inside > 0:
                result.in_call_seconds = inside / 1e9
                result.in_call_calls_per_s = result.calls * 1e9 / inside
    return results


def scaling(targets: Sequence[Target], config: WorkloadConfig, sizes: Sequence[int],
            fill: float, repeats: int, progress: Any = None,
            clock: Callable[[], int] = perf_counter_ns) -> List[List[ScalingRow]]:
    """Each target's per-call cost on each pool size (one list of rows per
    target), all running the program planned for the smallest size (which
    is valid for every larger pool); ``fill`` of each pool is made cached,
    computed and evictable first.  The targets take turns on each size of
    each round, so that they are measured side by side."""
    sizes = sorted(sizes)
    small = WorkloadConfig(**{**asdict(config), "num_blocks": sizes[0]})
    program_plan = plan(small)
    best: Dict[tuple[int, int], int] = {}
    fingerprints: Dict[tuple[int, int], str] = {}
    errors: Dict[tuple[int, int], str] = {}
    for round_number in range(max(1, repeats)):
        # rounds over the sizes, so that a drift in speed hits them all, in a
        # serpentine order: every other round the smallest pool's replay does
        # not follow the largest one's teardown (whose freed memory costs the
        # next replay page faults)
        for size in sizes if round_number % 2 == 0 else sizes[::-1]:
            for t, target in enumerate(targets):
                if (t, size) in errors:
                    continue
                if progress is not None:
                    progress(f"scaling: {target.name}, {size:,} blocks")
                try:
                    elapsed, machine = _replay_once(target, program_plan, size,
                                                    int(size * fill), clock)
                except ReplayError as exc:
                    errors[t, size] = str(exc)
                    continue
                fingerprints[t, size] = machine.fingerprint()
                del machine
                best[t, size] = min(best.get((t, size), elapsed), elapsed)
                gc.collect()
    tables: List[List[ScalingRow]] = []
    for t in range(len(targets)):
        rows: List[ScalingRow] = []
        base: Optional[float] = None
        for size in sizes:
            prefilled = int(size * fill)
            if (t, size) not in best:
                rows.append(ScalingRow(size, prefilled, 0.0, 0.0, 0.0, "",
                                       errors.get((t, size))))
                continue
            ns_per_call = best[t, size] / program_plan.program.calls
            if base is None:
                base = ns_per_call
            rows.append(ScalingRow(size, prefilled,
                                   program_plan.program.calls * 1e9 / best[t, size],
                                   ns_per_call, ns_per_call / base, fingerprints[t, size],
                                   errors.get((t, size))))
        tables.append(rows)
    return tables


# -- output -----------------------------------------------------------------------------


def _console() -> Any:
    from rich.console import Console

    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=max(console.width, 150))
    return console


def _short(fingerprint: str) -> str:
    return fingerprint[:16] if fingerprint else "-"


def print_pool(console: Any, report: PoolReport) -> None:
    """The throughput table of one pool, then its latency table."""
    from rich.table import Table

    stats = report.workload
    title = (f"{report.workload_name} workload, "
             f"{report.pool} pool: {report.config['num_blocks']:,} blocks of "
             f"{report.config['block_size']}, {report.config['max_running']} running, "
             f"{stats['turns']} requests, {stats['steps']:,} steps, "
             f"{stats['recompute_preemptions'] + stats['swap_preemptions']} preemptions")
    table = Table(title=title, title_justify="left")
    for column in ("#", "target", "calls", f"best s ({report.clock})", "calls/s", "ns/call",
                   "in-call calls/s", "hit rate", "fingerprint", "answers"):
        table.add_column(column, justify="left" if column in ("target", "fingerprint")
                         else "right")
    for number, result in enumerate(report.results, 1):
        if result.error is not None and not result.seconds_all:
            table.add_row(str(number), result.target, f"{result.calls:,}", "-", "-", "-", "-",
                          "-", "-", f"[red]{result.error}[/red]")
            continue
        table.add_row(
            str(number), result.target, f"{result.calls:,}", f"{result.seconds:.3f}",
            f"{result.calls_per_s:,.0f}", f"{result.ns_per_call:,.0f}",
            f"{result.in_call_calls_per_s:,.0f}" if result.in_call_calls_per_s else "-",
            f"{result.hit_rate:.4f}", _short(result.fingerprint),
            "ok" if result.answers_match else "[red]diverged[/red]",
        )
    console.print(table)
    if report.ratio is not None:
        same = "identical" if report.fingerprints_identical else "[red]DIFFERENT[/red]"
        inside = (f", [bold]{report.in_call_ratio:.2f}x[/bold] in-call"
                  if report.in_call_ratio else "")
        paired = (f" (median of the rounds' ratios: {report.paired_ratio:.3g}x"
                  f"{spread_text(round_ratios(*(r.seconds_all for r in report.results)))})"
                  if report.paired_ratio is not None else "")
        console.print(f"  #1 / #2: [bold]{report.ratio:.3g}x[/bold] calls/s{paired}{inside}; "
                      f"id fingerprints {same}")
    for result in report.results:
        if result.error is not None:
            console.print(f"  [red]{result.target}: {result.error}[/red]")
    if any(result.latency for result in report.results):
        latency = Table(title=f"{report.workload_name} workload, {report.pool} pool: latency "
                              f"per call (ns) and time in all "
                              f"calls of a kind (ms), timer overhead removed",
                        title_justify="left")
        latency.add_column("call")
        latency.add_column("count", justify="right")
        for number, _ in enumerate(report.results, 1):
            latency.add_column(f"p50 #{number}", justify="right")
            latency.add_column(f"p99 #{number}", justify="right")
            latency.add_column(f"ms #{number}", justify="right")
        names = sorted({name for r in report.results for name in r.latency},
                       key=lambda n: -report.calls_by_name.get(n, 0))
        for name in names:
            row = [name, f"{report.calls_by_name.get(name, 0):,}"]
            for result in report.results:
                kind = result.latency.get(name)
                row += ([f"{kind.p50_ns:,}", f"{kind.p99_ns:,}", f"{kind.total_ms:.1f}"]
                        if kind else ["-", "-", "-"])
            latency.add_row(*row)
        console.print(latency)


def print_scaling(console: Any, target: str, rows: Sequence[ScalingRow], fill: float) -> None:
    """The flat-cost table."""
    from rich.table import Table

    table = Table(title=f"flat cost: {target}, one program on every pool size, "
                        f"{fill:.0%} of each pool cached, computed and evictable first",
                  title_justify="left")
    for column in ("blocks", "prefilled", "calls/s", "ns/call", "x smallest", "fingerprint"):
        table.add_column(column, justify="left" if column == "fingerprint" else "right")
    for row in rows:
        if row.error:
            table.add_row(f"{row.num_blocks:,}", f"{row.prefilled:,}", "-", "-", "-",
                          f"[red]{row.error}[/red]")
            continue
        table.add_row(f"{row.num_blocks:,}", f"{row.prefilled:,}", f"{row.calls_per_s:,.0f}",
                      f"{row.ns_per_call:,.0f}", f"{row.relative:.2f}", _short(row.fingerprint))
    console.print(table)


# -- the verb -------------------------------------------------------------------------------


def _sizes(text: str) -> List[int]:
    try:
        sizes = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated ints, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError("pool sizes must be >= 1")
    return sizes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``prefixcache bench``."""
    parser.add_argument("--target", default=None, metavar="MODULE:CLASS",
                        help="the allocator to time (default: prefixcache.impl's "
                             "PrefixCachingBlockAllocator; 'verify-content': the same with "
                             "verify_content=True)")
    parser.add_argument("--against", default=None, metavar="MODULE:CLASS",
                        help="a second allocator timed in the same run ('vllm': vLLM 0.8.5; "
                             "'verify-content' as for --target)")
    parser.add_argument("--workload", choices=WORKLOADS, default=MAIN,
                        help="the main workload, or the access-heavy one: every running "
                             "sequence marks all its blocks accessed at every step (main)")
    parser.add_argument("--blocks", type=int, default=1024,
                        help="blocks of the roomy pool (default 1024)")
    parser.add_argument("--tight-blocks", type=int, default=256,
                        help="blocks of the tight pool, where preemption happens "
                             "(default 256; 0 skips it)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per block (16)")
    parser.add_argument("--running", type=int, default=12,
                        help="most sequences running at once (12)")
    parser.add_argument("--requests", type=int, default=400,
                        help="requests (conversation turns) in the workload (400)")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (0)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed replays per target; the best counts (3)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="time the replays by wall time or by this process's CPU time "
                             "(steadier on a shared machine) (wall)")
    parser.add_argument("--no-latency", action="store_true",
                        help="skip the per-call latency replay")
    parser.add_argument("--scaling", action="store_true",
                        help="also print the per-call cost from 1,000 to 1,000,000 blocks")
    parser.add_argument("--scaling-against", action="store_true",
                        help="--scaling: measure the --against target too, side by side")
    parser.add_argument("--scaling-sizes", type=_sizes, default=list(DEFAULT_SCALING_SIZES),
                        metavar="N,N,...", help="pool sizes of --scaling")
    parser.add_argument("--scaling-fill", type=float, default=0.5,
                        help="fraction of each --scaling pool made cached, computed and evictable "
                             "before timing (0.5)")
    parser.add_argument("--soak", action="store_true",
                        help="replay the workload --rounds times on one allocator with the "
                        "spec's invariants checked, instead of timing it")
    parser.add_argument("--rounds", type=int, default=2,
                        help="--soak: replays of the program on one allocator (2)")
    parser.add_argument("--check-every", type=int, default=10_000, metavar="N",
                        help="--soak: full invariant check every N instructions "
                        "(10000; 0: after each round only)")
    parser.add_argument("--vllm-cache", default=None, metavar="DIR",
                        help="cache directory of the vLLM 0.8.5 wheel (for --against vllm; "
                             "default $PREFIXCACHE_VLLM_CACHE or ~/.cache/prefixcache/vllm-0.8.5)")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also write every figure as JSON to PATH")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark the options describe; print it; 0, 1 or 2."""
    console = _console()
    try:
        targets = [load_target(args.target)]
        if args.against:
            targets.append(load_target(args.against, args.vllm_cache))
        pools = [("roomy", args.blocks)]
        if args.tight_blocks:
            pools.append(("tight", args.tight_blocks))
        configs = [(name, WorkloadConfig(
            num_blocks=blocks, block_size=args.block_size, max_running=args.running,
            num_requests=args.requests, seed=args.seed,
            access_heavy=args.workload == ACCESS_HEAVY)) for name, blocks in pools]
        for _, config in configs:
            config.validate()
        if args.repeats < 1:
            raise ValueError("--repeats must be >= 1")
        if not 0.0 <= args.scaling_fill < 1.0:
            raise ValueError("--scaling-fill must be in [0, 1)")
        if args.rounds < 1 or args.check_every < 0:
            raise ValueError("--rounds must be >= 1 and --check-every >= 0")
    except (TargetError, ValueError) as exc:
        print(f"prefixcache bench: {exc}", file=sys.stderr)
        return 2

    if args.soak:
        config = configs[0][1]
        return print_report(soak(targets[0], plan(config), config.num_blocks,
                                 config.block_size, rounds=args.rounds,
                                 check_every=args.check_every), args.json)
    status = console.status("planning")
    progress = status.update if console.is_terminal else None
    reports: List[PoolReport] = []
    rows: List[ScalingRow] = []
    against_rows: List[ScalingRow] = []
    started = time.time()
    with status if console.is_terminal else contextlib.nullcontext():
        for name, config in configs:
            if progress is not None:
                progress(f"{name}: planning the workload")
            program_plan = plan(config)
            results = measure(targets, program_plan, name, config.num_blocks, args.repeats,
                              not args.no_latency, progress, CLOCKS[args.clock])
            report = PoolReport(
                pool=name, config=asdict(config), workload=asdict(program_plan.workload.stats),
                calls=program_plan.program.calls,
                calls_by_name=dict(program_plan.program.calls_by_name), results=results,
                clock=args.clock, workload_name=config.workload_name)
            if len(results) == 2 and results[0].calls_per_s and results[1].calls_per_s:
                report.ratio = results[0].calls_per_s / results[1].calls_per_s
                report.paired_ratio = paired_ratio(results[0].seconds_all,
                                                   results[1].seconds_all)
                report.fingerprints_identical = results[0].fingerprint == results[1].fingerprint
                if results[0].in_call_seconds and results[1].in_call_seconds:
                    report.in_call_ratio = (results[1].in_call_seconds
                                            / results[0].in_call_seconds)
            reports.append(report)
            print_pool(console, report)
        if args.scaling:
            scaled = targets if args.scaling_against else targets[:1]
            tables = scaling(scaled, configs[0][1], args.scaling_sizes, args.scaling_fill,
                             args.repeats, progress, CLOCKS[args.clock])
            for target, table in zip(scaled, tables):
                print_scaling(console, target.name, table, args.scaling_fill)
            rows = tables[0]
            against_rows = tables[1] if len(tables) > 1 else []
    if args.json:
        document = {
            "format": "prefixcache-bench/1",
            "command": " ".join(["prefixcache", "bench"] + sys.argv[2:])
            if sys.argv[1:2] == ["bench"] else " ".join(sys.argv),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "processor": platform.processor(),
            "seconds": round(time.time() - started, 1),
            "clock": args.clock,
            "workload": configs[0][1].workload_name,
            "pools": [asdict(report) for report in reports],
            "scaling": [asdict(row) for row in rows],
            "scaling_against": [asdict(row) for row in against_rows],
            "scaling_fill": args.scaling_fill if args.scaling else None,
        }
        Path(args.json).write_text(json.dumps(document, indent=2) + "\n")
    failed = any(r.error is not None or not r.answers_match
                 for report in reports for r in report.results[:1])
    failed = failed or any(row.error for row in rows + against_rows)
    return 1 if failed else 0


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m prefixcache.bench.benchmark [options]``: the verb on its own."""
    parser = argparse.ArgumentParser(prog="prefixcache bench", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
