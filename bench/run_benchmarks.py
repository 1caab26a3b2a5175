"""Produce and record prefixcache's benchmark figures in bench/RESULTS.md.

Runs, each in a fresh Python process (``python -m prefixcache.bench.benchmark``,
the same code as ``prefixcache bench``):

1. prefixcache.impl against vLLM 0.8.5's own allocator on the default
   workload (roomy 1,024-block and tight 256-block pools, 12 running,
   block size 16), plus the flat-cost table from 1,000 to 1,000,000 blocks,
   timed by CPU time (``--clock cpu``: steadier on a shared machine);
1a. the same comparison on the access-heavy workload (``--workload
   access-heavy``: every running sequence marks all its blocks accessed at
   every step); both workloads' ratios are rendered side by side, and each
   latency table marks every kind of call slower than vLLM's at p50;
1o. the oracle's checked steps per second on prefixcache.impl and on
   vLLM 0.8.5, the shrinking apart (bench/oracle_speed.py);
1b. the same replay's instruction counts under valgrind
   (bench/count_instructions.py), when valgrind is installed: a figure
   that does not move with the machine's load;
1c. the driver's own share of the replay (bench/driver_cost.py): the same
   program on a stand-in target that only returns recorded answers;
2. the checked allocator (prefixcache.spec.checked) against the plain one
   with contracts off (``PREFIXCACHE_CONTRACTS=0``): the same cost expected,
   timed and, when valgrind is installed, counted in instructions
   (``bench/count_instructions.py --pair contracts-off``);
3. the same with contracts on in full mode (``PREFIXCACHE_CHECK=full``), on
   a small workload (a full check reads the whole abstract state, so its
   cost grows with the pool);
6. (in ``--short`` too) the checked allocator in its default, incremental
   mode against the plain one, side by side: the main workload's replay
   (40 requests, one round: the checked replays and the checked filling of
   the 1,000,000-block pool take most of the section's two minutes) and the
   per-call cost from 1,000 to 1,000,000 blocks, and icontract's own cost
   per call (a wrapper with trivial conditions);
4. ``verify_content=True`` against the default (off), side by side;
5. construction: the time and memory (tracemalloc peak and retained, RSS
   growth) of building a PrefixCachingBlockAllocator and a
   CpuGpuBlockAllocator pair, up to 1,000,000 blocks, each in a fresh process.

Usage::

    python bench/run_benchmarks.py [--quick] [--short] [--oracle-seconds S]
                                   [--out bench/RESULTS.md] [--keep-json DIR]
    python bench/run_benchmarks.py --render-only DIR [--out bench/RESULTS.md]

``--quick`` shrinks every workload (a smoke of this script, not figures to
record).  ``--short`` runs 1, 1a, 1o and 6 only, in full, when the whole does
not fit the time there is.  ``--render-only DIR`` runs nothing and writes the results file from
the JSON a ``--keep-json DIR`` run kept, dated by that run.  Exit code: 0, or 1
when a run failed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from prefixcache.bench.benchmark import round_ratios, spread_text
from prefixcache.oracle.targets import CHECKED_TARGET as CHECKED
from prefixcache.oracle.targets import DEFAULT_TARGET as PLAIN

ROOT = Path(__file__).resolve().parent.parent


def _run(command: Sequence[str], shown: str, json_path: Path, env: Dict[str, str],
         bench: bool) -> Optional[Dict[str, Any]]:
    """Run ``python COMMAND --json JSON_PATH`` (``env`` added to the environment);
    its JSON with the command shown and, for a ``prefixcache bench``, its exit
    code, kept for --render-only.  A bench that failed raises RuntimeError; a
    script that failed gives None."""
    print("$ " + shown, flush=True)
    proc = subprocess.run([sys.executable, *command, "--json", str(json_path)],
                          env={**os.environ, **env}, cwd=ROOT)
    if proc.returncode not in ((0, 1) if bench else (0,)) or not json_path.is_file():
        if bench:
            raise RuntimeError(f"the benchmark failed (exit {proc.returncode}): "
                               f"{[sys.executable, *command, '--json', str(json_path)]}")
        return None
    document: Dict[str, Any] = json.loads(json_path.read_text())
    if bench:
        document["exit_code"] = proc.returncode
    document["shown_command"] = shown.rstrip()
    json_path.write_text(json.dumps(document, indent=2) + "\n")
    return document


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in a fresh process, its output captured."""
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT)


#: Child program of the construction table: one allocator of each kind per
#: size, timed (best of 3) and traced; prints JSON rows.
_CONSTRUCTION_CHILD = r"""
import gc, json, resource, sys, time, tracemalloc
from prefixcache.impl.cpu_gpu_block_allocator import CpuGpuBlockAllocator
from prefixcache.impl.prefix_caching_block import PrefixCachingBlockAllocator
kinds = {
    "PrefixCachingBlockAllocator": lambda n: PrefixCachingBlockAllocator(num_blocks=n,
                                                                         block_size=16),
    "CpuGpuBlockAllocator.create (n GPU + n CPU)":
        lambda n: CpuGpuBlockAllocator.create("prefix_caching", n, n, 16),
}
kind, size = sys.argv[1], int(sys.argv[2])
make = kinds[kind]
rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
best = None
for _ in range(3):
    gc.collect()
    start = time.perf_counter()
    made = make(size)
    elapsed = time.perf_counter() - start
    best = elapsed if best is None else min(best, elapsed)
    del made
rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
gc.collect()
tracemalloc.start()
made = make(size)
retained, peak = tracemalloc.get_traced_memory()
tracemalloc.stop()
print(json.dumps({"kind": kind, "num_blocks": size, "seconds": best, "peak_bytes": peak,
                  "retained_bytes": retained, "max_rss_growth_kb": rss_after - rss_before}))
"""

CONSTRUCTION_KINDS = ("PrefixCachingBlockAllocator",
                      "CpuGpuBlockAllocator.create (n GPU + n CPU)")


#: Child program of the icontract row: a method plain, under icontract's
#: snapshot + postcondition + class invariant with trivial conditions, and
#: under a plain wrapper like the incremental mode's; ns per call, best of 5.
_WRAPPER_CHILD = r"""
import json, timeit, icontract
class Plain:
    depth = 0
    def f(self, x): return x
@icontract.invariant(lambda self: True)
class Contracted(Plain):
    @icontract.snapshot(lambda self, x: None, name="pc")
    @icontract.ensure(lambda self, OLD, result: True)
    def f(self, x): return x
def lean(fn):
    def checked(self, *args, **kwargs):
        if self.depth:
            return fn(self, *args, **kwargs)
        return fn(self, *args, **kwargs)
    return checked
class Lean(Plain): pass
Lean.f = lean(Plain.f)
n = 200000
print(json.dumps({name: min(timeit.repeat(lambda: o.f(1), number=n, repeat=5)) / n * 1e9
                  for name, o in (("plain", Plain()), ("icontract", Contracted()),
                                  ("lean", Lean()))}))
"""


def _checked_section(checked: Optional[Dict[str, Any]],
                     wrapper: Optional[Dict[str, float]]) -> List[str]:
    """The incremental checked mode against the plain allocator: the
    replay's ratio, the per-call cost by pool size side by side, and
    icontract's own cost per call."""
    lines = ["## Checked mode (incremental) against the plain allocator", ""]
    if checked is None:
        return lines + ["Not measured in this recording.", ""]
    lines += ["The checked allocator (`PREFIXCACHE_CHECK=incremental`, the default: each call "
              "checked at the elements it touched, see spec/checked.py) and the plain one, "
              "interleaved in one run.", "", *_fenced(checked["shown_command"])]
    lines += _pool_section(checked, ["checked (incremental)", "plain impl"])
    pool = checked["pools"][0]
    if pool.get("ratio") and pool.get("paired_ratio"):
        lines += [f"Checked over plain per call: **{1 / pool['ratio']:,.1f}x** (ratio of the "
                  f"bests; median of the rounds' ratios {1 / pool['paired_ratio']:,.1f}x).", ""]
    rows, plain = checked.get("scaling") or [], checked.get("scaling_against") or []
    if rows and len(rows) == len(plain):
        lines += [f"Per-call cost by pool size, one program on every size, "
                  f"{(checked.get('scaling_fill') or 0):.0%} of each pool cached, computed and "
                  f"evictable first; both allocators in the same rounds.", "",
                  "| blocks | checked ns/call | plain ns/call | checked / plain | "
                  "checked x smallest |", "|---:|---:|---:|---:|---:|"]
        for row, base in zip(rows, plain):
            if row.get("error") or base.get("error"):
                lines.append(f"| {row['num_blocks']:,} | - | - | - | "
                             f"{row.get('error') or base.get('error')} |")
                continue
            lines.append(f"| {row['num_blocks']:,} | {row['ns_per_call']:,.0f} | "
                         f"{base['ns_per_call']:,.0f} | "
                         f"{row['ns_per_call'] / base['ns_per_call']:,.1f}x | "
                         f"{row['relative']:.2f} |")
        costs = [row["relative"] for row in rows if not row.get("error")]
        if costs and min(costs) > 0:
            lines += ["", f"Checked mode's dearest pool size over its cheapest: "
                          f"**{max(costs) / min(costs):.2f}x**.", ""]
    if wrapper is not None:
        lines += ["icontract's own cost: a method with a snapshot, a postcondition and a class "
                  "invariant whose conditions are all `True` costs "
                  f"**{wrapper['icontract']:,.0f} ns** per call, against {wrapper['plain']:,.0f} "
                  f"ns plain and {wrapper['lean']:,.0f} ns under a plain wrapper like the "
                  "incremental mode's (hence that wrapper; the full mode keeps icontract).", ""]
    return lines


def _construction(sizes: Sequence[int]) -> List[Dict[str, Any]]:
    """The construction rows, each measured in a fresh Python process."""
    rows: List[Dict[str, Any]] = []
    print("$ construction of " + ", ".join(CONSTRUCTION_KINDS), flush=True)
    for kind in CONSTRUCTION_KINDS:
        for size in sizes:
            proc = _python("-c", _CONSTRUCTION_CHILD, kind, str(size))
            if proc.returncode != 0:
                raise RuntimeError(f"construction of {kind} ({size}) failed: {proc.stderr}")
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return rows


def _construction_section(rows: Optional[List[Dict[str, Any]]]) -> List[str]:
    if not rows:
        return []
    lines = [
        "## Construction",
        "",
        "Building one allocator (block size 16), each size in a fresh process: best of 3 "
        "wall times; memory by tracemalloc (peak during construction, and what the "
        "allocator keeps) and growth of the process's maximum RSS.  One tracker per id "
        "is made up front (as vLLM does, and its tests count them); the rank table of "
        "`get_physical_block_id` and the Block objects of the pool are made when first "
        "needed, so construction holds the free list, the reference counts, the id set "
        "and the trackers.",
        "",
        *_fenced("python bench/run_benchmarks.py   # the construction step"),
        "| allocator | blocks | seconds | tracemalloc peak (MB) | retained (MB) | "
        "max RSS growth (MB) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(f"| {row['kind']} | {row['num_blocks']:,} | {row['seconds']:.3f} | "
                     f"{row['peak_bytes'] / 1e6:,.1f} | {row['retained_bytes'] / 1e6:,.1f} | "
                     f"{row['max_rss_growth_kb'] / 1e3:,.1f} |")
    return lines + [""]


def _checked_available() -> bool:
    try:
        import prefixcache.spec.checked  # noqa: F401
    except Exception:
        return False
    return True


# -- rendering -------------------------------------------------------------------------


def _fenced(command: str) -> List[str]:
    """``command`` as a code block, then a blank line."""
    return ["```", command, "```", ""]


def slower_at_p50(pool: Dict[str, Any]) -> List[str]:
    """The call kinds whose p50 is higher for the pool's first target than for
    its second, most frequent first."""
    results = pool["results"]
    if len(results) != 2:
        return []
    first, second = results[0]["latency"], results[1]["latency"]
    return [name for name in sorted(first, key=lambda n: (-pool["calls_by_name"].get(n, 0), n))
            if name in second and first[name]["p50_ns"] > second[name]["p50_ns"]]


def _p50_cell(pool: Dict[str, Any], call: str) -> str:
    """The second target's p50 over the first's, marked when the first is slower."""
    first = pool["results"][0]["latency"].get(call)
    second = pool["results"][1]["latency"].get(call)
    if not first or not second:
        return "-"
    if first["p50_ns"] <= 0:
        return "-" if second["p50_ns"] <= 0 else "faster"
    ratio = second["p50_ns"] / first["p50_ns"]
    return f"{ratio:.2f}x" + (" **slower**" if first["p50_ns"] > second["p50_ns"] else "")


def _pool_section(document: Dict[str, Any], names: Sequence[str],
                  compare_p50: bool = False) -> List[str]:
    """The throughput and latency tables of each pool of a bench run; with
    ``compare_p50``, a column of the second target's p50 over the first's,
    marking each call kind where the first is slower at p50."""
    lines: List[str] = []
    for pool in document["pools"]:
        config = pool["config"]
        stats = pool["workload"]
        preemptions = stats["recompute_preemptions"] + stats["swap_preemptions"]
        lines += [
            f"**{pool['pool']} pool**: {config['num_blocks']:,} blocks of "
            f"{config['block_size']} tokens, {config['max_running']} running, "
            f"{stats['turns']} requests ({stats['conversations']} conversations, "
            f"{stats['forks']} forks), {stats['steps']:,} scheduler steps, "
            f"{preemptions} preemptions ({stats['swap_preemptions']} by swap), "
            f"{pool['calls']:,} allocator calls.",
            "",
            "| target | best of repeats (s) | calls/s | ns/call | in-call calls/s | hit rate |"
            " id fingerprint | answers |",
            "|---|---:|---:|---:|---:|---:|---|---|",
        ]
        for name, result in zip(names, pool["results"]):
            if result["error"] and not result["seconds_all"]:
                lines.append(f"| {name} | - | - | - | - | - | - | {result['error']} |")
                continue
            inside = result.get("in_call_calls_per_s") or 0
            lines.append(
                f"| {name} | {result['seconds']:.3f} | {result['calls_per_s']:,.0f} | "
                f"{result['ns_per_call']:,.0f} | {f'{inside:,.0f}' if inside else '-'} | "
                f"{result['hit_rate']:.4f} | `{result['fingerprint'][:16]}` | "
                f"{'as planned' if result['answers_match'] else 'DIVERGED'} |")
        if pool.get("ratio") is not None:
            same = "identical" if pool["fingerprints_identical"] else "**different**"
            inside_ratio = pool.get("in_call_ratio")
            inside_text = f", **{inside_ratio:.3g}x** in-call" if inside_ratio else ""
            paired = pool.get("paired_ratio")
            rounds = round_ratios(*(result["seconds_all"] for result in pool["results"]))
            paired_text = (f" (median of the rounds' ratios: **{paired:.3g}x**"
                           f"{spread_text(rounds)})" if paired is not None else "")
            lines += ["", f"Ratio {names[0]} / {names[1]}: **{pool['ratio']:.3g}x** calls/s"
                          f"{paired_text}{inside_text}; id fingerprints {same}."]
        latency_names = sorted({n for r in pool["results"] for n in r["latency"]},
                               key=lambda n: (-pool["calls_by_name"].get(n, 0), n))
        compare = compare_p50 and len(pool["results"]) == 2
        if latency_names:
            header = "| call | count | " + " | ".join(
                f"{name} p50 | {name} p99 | {name} ms"
                for name in names[:len(pool["results"])]) + " |"
            note = ""
            if compare:
                header += f" {names[1]} p50 / {names[0]} p50 |"
                slower = slower_at_p50(pool)
                note = (f"; the last column is {names[1]}'s p50 over {names[0]}'s, marked "
                        f"**slower** where {names[0]}'s is higher ("
                        + (", ".join(f"`{name}`" for name in slower) if slower else "none")
                        + ")")
            lines += ["", "Latency per call, ns, and time in all calls of a kind, ms (each "
                          "call capped at the p99; timer overhead removed)" + note + ":", "",
                      header,
                      "|---|---:|" + "---:|" * (3 * len(pool["results"]) + int(compare))]
            for call in latency_names:
                cells = [call, f"{pool['calls_by_name'].get(call, 0):,}"]
                for result in pool["results"]:
                    kind = result["latency"].get(call)
                    cells += ([f"{kind['p50_ns']:,}", f"{kind['p99_ns']:,}",
                               f"{kind.get('total_ms', 0.0):.1f}"]
                              if kind else ["-", "-", "-"])
                if compare:
                    cells.append(_p50_cell(pool, call))
                lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def _scaling_section(document: Dict[str, Any]) -> List[str]:
    rows = document.get("scaling") or []
    if not rows:
        return []
    fill = document.get("scaling_fill") or 0.0
    lines = [
        f"One program (planned for the smallest pool) on every pool size; before timing, "
        f"{fill:.0%} of each pool is filled with cached, computed, evictable blocks, so the cache "
        f"map, the evictor and the per-id tables have the pool's size.",
        "",
        "| blocks | prefilled | calls/s | ns/call | x smallest |",
        "|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        if row.get("error"):
            lines.append(f"| {row['num_blocks']:,} | {row['prefilled']:,} | - | - | "
                         f"{row['error']} |")
            continue
        lines.append(f"| {row['num_blocks']:,} | {row['prefilled']:,} | "
                     f"{row['calls_per_s']:,.0f} | {row['ns_per_call']:,.0f} | "
                     f"{row['relative']:.2f} |")
    costs = [row["relative"] for row in rows if not row.get("error")]
    worst = max(costs, default=0.0)
    spread = worst / min(costs) if costs and min(costs) > 0 else 0.0
    lines += ["", f"Largest per-call cost relative to the smallest pool: **{worst:.2f}x**; "
                  f"the dearest pool size over the cheapest: **{spread:.2f}x**.", ""]
    return lines


def _instructions_section(counted: Optional[Dict[str, Any]]) -> List[str]:
    if counted is None:
        return ["valgrind is not installed: not measured.", ""]
    rows = counted["rows"]
    config = counted["config"]
    lines = [
        f"The roomy-pool replay ({config['blocks']:,} blocks of {config['block_size']}, "
        f"{config['running']} running, {config['requests']} requests, seed {config['seed']}) "
        "under `valgrind --tool=cachegrind`: instructions of the replay (driver included, the "
        "same for both), counted as a child run with the replay minus one without it.",
        "", *_fenced("python bench/count_instructions.py"),
        "| target | instructions | per call | fingerprint |", "|---|---:|---:|---|",
    ]
    for row in rows:
        lines.append(f"| {row['target']} | {row['instructions'] / 1e6:,.0f} M | "
                     f"{row['per_call']:,.0f} | `{row['fingerprint'][:16]}` |")
    if len(rows) == 2:
        times = rows[1]["instructions"] / rows[0]["instructions"]
        same = "identical" if counted["fingerprints_identical"] else "DIFFERENT"
        lines += ["", f"vLLM 0.8.5 executes **{times:.2f}x** the instructions of "
                      f"prefixcache.impl on this replay; id fingerprints {same}."]
    return lines + [""]


def _contracts_off_instructions(counted: Optional[Dict[str, Any]]) -> List[str]:
    """The contracts-off comparison counted in instructions, which this
    machine's noise does not move."""
    if counted is None or len(counted["rows"]) != 2:
        return []
    checked, plain = counted["rows"]
    same = "identical" if counted["fingerprints_identical"] else "DIFFERENT"
    return [
        "Contracts off, counted in instructions (the roomy replay under valgrind, as above):",
        "", *_fenced("python bench/count_instructions.py --pair contracts-off"),
        f"checked (contracts off) {checked['instructions']:,}, plain impl "
        f"{plain['instructions']:,}: **{checked['instructions'] / plain['instructions']:.4f}x**;"
        f" id fingerprints {same}.", ""]


def _driver_section(driver: Optional[Dict[str, Any]]) -> List[str]:
    if driver is None:
        return []
    lines = [
        "## The driver's own share", "",
        f"The roomy replay ({driver['calls']:,} allocator calls in "
        f"{driver['instructions']:,} instructions) on a stand-in target whose every call "
        "returns the answer prefixcache.impl gave, recorded beforehand, and does nothing "
        f"else; best CPU time of {driver['repeats']} repeats, the targets alternating.  The "
        "stand-in's time is the driver's bookkeeping plus the cost of making the calls: no "
        "target can go below it.", "",
        *_fenced("python bench/driver_cost.py"),
        "| target | ms | stand-in's share | ms above the stand-in |", "|---|---:|---:|---:|",
    ]
    for row in driver["rows"]:
        lines.append(f"| {row['target']} | {row['ms']:,.1f} | {row['stand_in_share']:.0%} | "
                     f"{row['ms_above_stand_in']:,.1f} |")
    if len(driver["rows"]) == 3:
        above = driver["rows"][2]["ms_above_stand_in"] / driver["rows"][1]["ms_above_stand_in"]
        lines += ["", f"Above the stand-in, vLLM 0.8.5 takes **{above:.2f}x** the time of "
                      "prefixcache.impl."]
    return lines + [""]


def _verify_section(verify: Optional[Dict[str, Any]]) -> List[str]:
    if verify is None:
        return []
    lines = ["## verify_content", "",
             "`verify_content=True` (each cached id's exact content compared on every hit) "
             "against the default, both prefixcache.impl, in one run; the hash is the "
             "default one, so no collision happens and the ids must be the same.", "",
             *_fenced(verify["shown_command"])]
    lines += _pool_section(verify, ["verify_content=True", "verify_content=False"])
    ratios = [pool.get("ratio") for pool in verify["pools"] if pool.get("ratio")]
    if ratios:
        lines += ["Cost of verify_content: " + ", ".join(
            f"{pool['pool']} pool **{1 / pool['ratio']:.3f}x** the time"
            for pool in verify["pools"] if pool.get("ratio")) + ".", ""]
    return lines


def _workloads_summary(documents: Sequence[Optional[Dict[str, Any]]]) -> List[str]:
    """Both workloads side by side: per pool, each target's calls/s, their
    ratio and the rounds' ratios, the fingerprints, and the call kinds
    slower than vLLM's at p50."""
    lines = [
        "## Both workloads side by side (issue #23)", "",
        "The main workload, and the access-heavy one: the same requests, and every running "
        "sequence marks all its blocks accessed (`mark_blocks_as_accessed`) at every "
        "scheduler step, as a scheduler without vLLM's deferral does.  Each row is one run of "
        "`prefixcache bench --against vllm`, the two targets timed in alternating rounds "
        "(their commands are in the sections below).", "",
        "| workload | pool | calls | prefixcache.impl calls/s | vLLM 0.8.5 calls/s | ratio | "
        "median of the rounds' ratios | id fingerprints | slower than vLLM's at p50 |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for document in documents:
        if document is None:
            continue
        workload = document.get("workload", "main")
        for pool in document["pools"]:
            results = pool["results"]
            if len(results) != 2 or pool.get("ratio") is None:
                lines.append(f"| {workload} | {pool['pool']} | {pool['calls']:,} | - | - | - |"
                             " - | - | - |")
                continue
            rounds = round_ratios(*(result["seconds_all"] for result in results))
            paired = pool.get("paired_ratio")
            slower = slower_at_p50(pool)
            latency = any(result["latency"] for result in results)
            lines.append(
                f"| {workload} | {pool['pool']} | {pool['calls']:,} | "
                f"{results[0]['calls_per_s']:,.0f} | {results[1]['calls_per_s']:,.0f} | "
                f"**{pool['ratio']:.3g}x** | "
                + (f"{paired:.3g}x" if paired is not None else "-")
                + (f" ({rounds[0]:.3g}x to {rounds[-1]:.3g}x)" if len(rounds) > 1 else "")
                + f" | {'identical' if pool['fingerprints_identical'] else '**different**'} | "
                + (", ".join(f"`{name}`" for name in slower) if slower
                   else ("none" if latency else "not measured")) + " |")
    return lines + [""]


def _oracle_section(speed: Optional[Dict[str, Any]], skipped: str = "") -> List[str]:
    """The oracle's checked steps per second on each target, the shrinking
    apart, and its profile's own time by part."""
    lines = ["## Oracle speed (issue #23)", ""]
    if speed is None:
        return lines + [skipped or "bench/oracle_speed.py failed: not measured.", ""]
    lines += [
        "One `prefixcache fuzz` campaign per target, one worker, white-box checks on, "
        f"{speed['seconds']:g} s each: prefixcache.impl with caller mistakes included, and "
        "vLLM 0.8.5 judged by its own rules on valid calls.  vLLM's campaign has findings and "
        "shrinks each new one: the time and the steps spent shrinking are apart, and the "
        "checked steps/s of the search are its steps outside shrinking over its time outside "
        "shrinking.  The budget is wall time; the CPU time of the campaign is measured too, "
        "and the figures per CPU second say what a core of its own would give (the checking "
        "part's CPU time taken in proportion to its wall time).",
        "", *_fenced(speed.get("shown_command", speed.get("command", ""))),
        "| target | campaign | steps | s | shrinking s | shrinking steps | steps/s | "
        "checked steps/s | CPU share | steps per CPU s | checked steps per CPU s | findings |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in speed["speeds"]:
        share = row["cpu_seconds"] / row["seconds"] if row["seconds"] else 0.0
        lines.append(
            f"| {row['target']} | `{row['command']}` | {row['steps']:,} | {row['seconds']:.1f} | "
            f"{row['shrink_seconds']:.1f} | {row['shrink_steps']:,} | "
            f"{row['steps_per_s']:,.0f} | **{row['checking_steps_per_s']:,.0f}** | "
            f"{share:.0%} | {row['steps_per_cpu_s']:,.0f} | "
            f"**{row['checking_steps_per_cpu_s']:,.0f}** | {row['findings']} |")
    profiles = speed.get("profiles") or []
    if profiles:
        parts = sorted({part for profile in profiles for part in profile["parts"]},
                       key=lambda part: -max(p["parts"].get(part, 0.0) for p in profiles))
        lines += ["", "Own time by part under cProfile (a second campaign of each, the same "
                      "budget; shrinking included):", "",
                  "| part | " + " | ".join(p["target"] for p in profiles) + " |",
                  "|---|" + "---:|" * len(profiles)]
        totals = [sum(p["parts"].values()) or 1.0 for p in profiles]
        for part in parts:
            lines.append(f"| {part} | " + " | ".join(
                f"{100 * p['parts'].get(part, 0.0) / total:.1f}%"
                for p, total in zip(profiles, totals)) + " |")
    return lines + [""]


def render(docs: Dict[str, Any], quick: bool, short: bool = False,
           recorded: Optional[datetime.datetime] = None) -> str:
    """The text of RESULTS.md from a run's documents, each by the name of the
    file a run keeps it in (``impl_vs_vllm``, ``contracts_off``, ...; one
    missing was not measured), for a run made at ``recorded`` (now by
    default); ``short``: a ``--short`` run, which left out the sections after
    the checked mode."""
    main, access, checked = docs["impl_vs_vllm"], docs.get("access_heavy_vs_vllm"), \
        docs.get("checked")
    off, on = docs.get("contracts_off"), docs.get("contracts_on")
    recorded = recorded or datetime.datetime.now(datetime.timezone.utc)
    now = recorded.astimezone(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Benchmark results",
        "",
        "Recorded by `python bench/run_benchmarks.py" + (" --quick" if quick else "")
        + (" --short" if short else "") + "`"
        + f" on {now}: Python {platform.python_version()}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs.  A benchmark is not a test; these figures are what this "
        "machine measured, with whatever else was running on it.",
        "",
        "How to read them: calls/s is the number of allocator calls of the replay divided by "
        f"the best {'CPU' if main.get('clock') == 'cpu' else 'wall'} time of the repeats "
        "(each repeat a fresh allocator; the driver's own bookkeeping between calls is "
        "included, the same for every target).  The repeats run in rounds, each target once "
        "a round; beside the ratio of the two bests stands the median of the rounds' "
        "ratios, which a drift of the machine's speed between rounds does not move, and how far "
        "the rounds' ratios lie apart, which is this machine's noise on the comparison.  In-call "
        "calls/s divides the calls by the time "
        "spent inside them: the sum of the latency replay's per-call wall times, each kind's "
        "capped at its p99.  The latencies are wall time per call, so on a busy machine their "
        "p99 includes moments the process was descheduled.  The id "
        "fingerprint is the SHA-256 of every id the target handed out, in order; equal "
        "fingerprints mean the same ids in the same order.  'as planned' means the target "
        "answered the scheduler's queries (free blocks, full blocks touched) exactly as the "
        "planning allocator did, so the replay is the program a scheduler would have issued "
        "to it.",
        "",
    ]
    lines += _workloads_summary([main, access])
    lines += ["## prefixcache.impl against vLLM 0.8.5", "", *_fenced(main["shown_command"])]
    lines += _pool_section(main, ["prefixcache.impl", "vLLM 0.8.5"], compare_p50=True)
    if access is not None:
        lines += ["## The access-heavy workload against vLLM 0.8.5", "",
                  "The main workload's requests, with every running sequence marking all its "
                  "blocks accessed at every scheduler step.", "",
                  *_fenced(access["shown_command"])]
        lines += _pool_section(access, ["prefixcache.impl", "vLLM 0.8.5"], compare_p50=True)
    lines += _oracle_section(docs.get("oracle_speed"))
    if not short:
        lines += ["## Instructions (independent of the machine's load)", ""]
        lines += _instructions_section(docs.get("instructions"))
        lines += _driver_section(docs.get("driver"))
    if main.get("scaling"):
        lines += ["## Flat cost from 1,000 to 1,000,000 blocks (prefixcache.impl)", "",
                  *_fenced(main["shown_command"])]
        lines += _scaling_section(main)
    lines += _checked_section(checked, docs.get("wrapper"))
    if short:
        lines += ["## Not run in this recording", "",
                  "`--short` runs the two workloads against vLLM (and the flat-cost table), "
                  "the oracle's speed and the checked mode only: the instruction counts, the "
                  "driver's share, the contracts off and in full mode, verify_content and "
                  "construction were not measured.", ""]
        return "\n".join(lines)
    lines += ["## Contracts", ""]
    if off is None and on is None:
        lines += ["prefixcache.spec.checked was not importable: not measured.", ""]
    if off is not None:
        lines += ["Contracts off: the checked allocator's names are the impl's classes "
                  "themselves.", "", *_fenced(off["shown_command"])]
        lines += _pool_section(off, ["checked (contracts off)", "plain impl"])
    if off is not None and on is None:
        lines += ["Contracts on: not measured in this recording (see the notes).", ""]
    if on is not None:
        lines += ["Contracts on in full mode (`PREFIXCACHE_CHECK=full`; a smaller workload: "
                  "each check reads the whole abstract state, so its cost grows with the pool):",
                  "", *_fenced(on["shown_command"])]
        lines += _pool_section(on, ["checked (full mode)", "plain impl"])
    if off is not None and on is not None:
        ratio_on = on["pools"][0].get("ratio")
        ratio_off = off["pools"][0].get("ratio")
        if ratio_on and ratio_off:
            lines += [f"Cost of the checked allocator relative to the plain one: contracts off "
                      f"**{1 / ratio_off:.3f}x**, full mode **{1 / ratio_on:,.0f}x**.", ""]
    lines += _contracts_off_instructions(docs.get("instructions_contracts_off"))
    lines += _verify_section(docs.get("verify_content"))
    lines += _construction_section((docs.get("construction") or {}).get("rows"))
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the benchmarks and write the results file; 0 or 1."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small workloads (a smoke)")
    parser.add_argument("--short", action="store_true",
                        help="only the two workloads against vLLM (with the flat-cost table) "
                             "and the oracle's speed, in full")
    parser.add_argument("--oracle-seconds", type=float, default=None, metavar="S",
                        help="each oracle speed campaign's budget (30; --quick: 3)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "RESULTS.md"),
                        help="where to write the results (bench/RESULTS.md)")
    parser.add_argument("--keep-json", default=None, metavar="DIR",
                        help="also keep the JSON of every run in DIR")
    parser.add_argument("--render-only", default=None, metavar="DIR",
                        help="run nothing: write the results file from the JSON a "
                             "--keep-json DIR run kept")
    args = parser.parse_args(argv)
    if args.render_only:
        kept = Path(args.render_only)
        docs: Dict[str, Any] = {path.stem: json.loads(path.read_text())
                                for path in kept.glob("*.json")}
        if "impl_vs_vllm" not in docs:
            print(f"{kept} holds no impl_vs_vllm.json", file=sys.stderr)
            return 1
        run_kept = docs.get("run") or {}
        newest = max(path.stat().st_mtime for path in kept.iterdir())  # the results' time
        Path(args.out).write_text(render(
            docs, run_kept.get("quick", args.quick), run_kept.get("short", args.short),
            datetime.datetime.fromtimestamp(newest, datetime.timezone.utc)) + "\n")
        print(f"wrote {args.out}")
        return 0
    quick = ["--requests", "40", "--repeats", "1", "--scaling-sizes", "1000,10000"] \
        if args.quick else []
    counted_quick = ["--requests", "40"] if args.quick else []  # the instruction counts' workload
    docs = {}
    with tempfile.TemporaryDirectory() as scratch:
        out_dir = Path(args.keep_json) if args.keep_json else Path(scratch)
        out_dir.mkdir(parents=True, exist_ok=True)

        def bench(name: str, bench_args: List[str], env: Optional[Dict[str, str]] = None) -> None:
            shown = " ".join([*(f"{key}={value}" for key, value in (env or {}).items()),
                              "prefixcache bench", *bench_args])
            docs[name] = _run(["-m", "prefixcache.bench.benchmark", *bench_args], shown,
                              out_dir / f"{name}.json", env or {}, bench=True)

        def script(name: str, script_args: List[str], kept_as: str = "") -> None:
            docs[kept_as or name] = _run([str(ROOT / "bench" / f"{name}.py"), *script_args],
                                         f"python bench/{name}.py " + " ".join(script_args),
                                         out_dir / f"{kept_as or name}.json", {}, bench=False)

        def keep(name: str, document: Any) -> None:
            docs[name] = document
            (out_dir / f"{name}.json").write_text(json.dumps(document) + "\n")

        keep("run", {"quick": args.quick, "short": args.short})
        bench("impl_vs_vllm", ["--against", "vllm", "--scaling", "--repeats", "7", "--clock",
                               "cpu", *quick])
        bench("access_heavy_vs_vllm", ["--workload", "access-heavy", "--against", "vllm",
                                       "--repeats", "7", "--clock", "cpu", *quick])
        seconds = args.oracle_seconds or (3.0 if args.quick else 30.0)
        script("oracle_speed", ["--seconds", f"{seconds:g}"])
        if _checked_available():
            pools = "1000,10000" if args.quick else "1000,10000,100000,1000000"
            bench("checked", ["--target", CHECKED, "--against", PLAIN, "--requests",
                              "10" if args.quick else "40", "--tight-blocks", "0",
                              "--repeats", "1", "--no-latency", "--clock", "cpu", "--scaling",
                              "--scaling-against", "--scaling-sizes", pools],
                  {"PREFIXCACHE_CONTRACTS": "1", "PREFIXCACHE_CHECK": "incremental"})
            proc = _python("-c", _WRAPPER_CHILD)
            if proc.returncode != 0:
                print(proc.stderr, file=sys.stderr)
            else:
                keep("wrapper", json.loads(proc.stdout))
        if not args.short:
            valgrind = shutil.which("valgrind") is not None
            if valgrind:
                script("count_instructions", counted_quick, "instructions")
            script("driver_cost", ["--repeats", "1"] if args.quick else [], "driver")
            if _checked_available():
                bench("contracts_off", ["--target", CHECKED, "--against", PLAIN,
                                        "--tight-blocks", "0", "--repeats", "7", "--no-latency",
                                        "--clock", "cpu", *quick], {"PREFIXCACHE_CONTRACTS": "0"})
                bench("contracts_on", [
                    "--target", CHECKED, "--against", PLAIN, "--requests",
                    "4" if args.quick else "10", "--blocks", "256", "--tight-blocks", "0",
                    "--repeats", "1", "--no-latency", "--clock", "cpu"],
                    {"PREFIXCACHE_CONTRACTS": "1", "PREFIXCACHE_CHECK": "full"})
                if valgrind:
                    script("count_instructions", ["--pair", "contracts-off", *counted_quick],
                           "instructions_contracts_off")
            bench("verify_content", ["--target", "verify-content", "--against", PLAIN,
                                     "--repeats", "5", "--no-latency", "--clock", "cpu", *quick])
            sizes = (1_000, 10_000) if args.quick else (1_000, 10_000, 100_000, 1_000_000)
            keep("construction", {"rows": _construction(sizes)})
    Path(args.out).write_text(render(docs, args.quick, args.short) + "\n")
    print(f"wrote {args.out}")
    failed = any(doc is not None and doc.get("exit_code", 0) != 0 for doc in docs.values())
    return 1 if failed or docs["oracle_speed"] is None else 0


if __name__ == "__main__":
    sys.exit(main())
