"""Count the machine instructions a replay costs, per target, under valgrind.

Wall-clock figures on a shared machine move with whatever else runs; the
number of instructions a replay executes does not.  This script plans the
``prefixcache bench`` workload once, then for each target runs a child
Python under ``valgrind --tool=cachegrind --cache-sim=no`` twice: once up to
(and including) building the allocator and compiling the program, once also
replaying it.  The difference is the replay's instructions: the driver's
bookkeeping plus the allocator calls, the same driver for every target.

Usage::

    python bench/count_instructions.py [--blocks 1024] [--requests 400] [--seed 0]
                                       [--pair vllm|contracts-off] [--json PATH]

``--pair contracts-off`` counts the checked allocator (prefixcache.spec.checked)
with contracts off (``PREFIXCACHE_CONTRACTS=0``) against the plain one,
instead of prefixcache.impl against vLLM 0.8.5.  Needs valgrind on PATH and,
for vLLM 0.8.5, prefixcache.oracle.vllm_source's wheel.  Exit code 0, 1 when a
child failed, 2 without valgrind.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from prefixcache.oracle.targets import CHECKED_TARGET
from prefixcache.oracle.targets import DEFAULT_TARGET as PLAIN

ROOT = Path(__file__).resolve().parent.parent
#: The pairs of targets counted (label -> target), the first the reference, and
#: the environment of their children.
PAIRS: Dict[str, Tuple[Dict[str, str], Dict[str, str]]] = {
    "vllm": ({"prefixcache.impl": PLAIN, "vLLM 0.8.5": "vllm"}, {}),
    "contracts-off": ({"checked (contracts off)": CHECKED_TARGET, "plain impl": PLAIN},
                      {"PREFIXCACHE_CONTRACTS": "0"}),
}


def child(workload_path: str, target: str, replay: bool) -> int:
    """In the child: build the target, compile the workload, maybe replay it;
    print the call count and fingerprint."""
    import gc

    from prefixcache.bench.benchmark import load_target
    from prefixcache.bench.replayer import Machine, compile_workload

    with open(workload_path, "rb") as handle:
        workload = pickle.load(handle)
    program = compile_workload(workload)
    built = load_target(target).make(workload.config.num_blocks, workload.config.block_size)
    machine = Machine(built, program.num_seqs)
    gc.collect()
    gc.freeze()
    if replay:
        machine.run(program.instructions)
        print(f"calls={program.calls} fingerprint={machine.fingerprint()}")
    return 0


def _count(workload_path: str, target: str, replay: bool,
           env: Optional[Dict[str, str]] = None) -> Tuple[int, str]:
    """Instructions of one child run under cachegrind (``env`` added to its
    environment), and its output."""
    command = ["valgrind", "--tool=cachegrind", "--cache-sim=no",
               "--cachegrind-out-file=/dev/null", sys.executable, __file__, "--child",
               workload_path, target, "replay" if replay else "setup"]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {}), "PYTHONHASHSEED": "0"})
    match = re.search(r"I\s+refs:\s+([\d,]+)", proc.stderr)
    if proc.returncode != 0 or match is None:
        raise RuntimeError(f"child failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return int(match.group(1).replace(",", "")), proc.stdout.strip()


def main(argv: Optional[List[str]] = None) -> int:
    """Plan, count each target, print (and maybe write) the figures."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[1], argv[2], argv[3] == "replay")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=1024)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--running", type=int, default=12)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pair", choices=sorted(PAIRS), default="vllm",
                        help="what to count: prefixcache.impl against vLLM 0.8.5 (vllm), or "
                             "the checked allocator with contracts off against the plain one")
    parser.add_argument("--json", default=None, metavar="PATH")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind is not on PATH", file=sys.stderr)
        return 2
    from prefixcache.bench.replayer import plan
    from prefixcache.bench.workload import WorkloadConfig

    config = WorkloadConfig(num_blocks=args.blocks, block_size=args.block_size,
                            max_running=args.running, num_requests=args.requests,
                            seed=args.seed)
    workload = plan(config).workload
    rows: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "workload.pickle")
        with open(path, "wb") as handle:
            pickle.dump(workload, handle)
        targets, env = PAIRS[args.pair]
        for label, target in targets.items():
            print(f"counting {label} ...", flush=True)
            try:
                setup, _ = _count(path, target, False, env)
                total, output = _count(path, target, True, env)
            except RuntimeError as exc:
                print(f"{label}: {exc}", file=sys.stderr)
                return 1
            fields = dict(part.split("=", 1) for part in output.split())
            rows.append({"target": label, "instructions": total - setup,
                         "calls": int(fields["calls"]), "fingerprint": fields["fingerprint"]})
    base = rows[0]["instructions"]
    print(f"\nreplay of {rows[0]['calls']:,} allocator calls ({args.blocks} blocks of "
          f"{args.block_size}, {args.running} running, {args.requests} requests, seed "
          f"{args.seed}):")
    for row in rows:
        row["per_call"] = row["instructions"] / row["calls"]
        row["relative"] = row["instructions"] / base
        print(f"  {row['target']:<24} {row['instructions'] / 1e6:9.0f} M instructions "
              f"{row['per_call']:8.0f} per call   {row['relative']:5.2f}x the first   "
              f"fingerprint {row['fingerprint'][:16]}")
    same = len({row["fingerprint"] for row in rows}) == 1
    print(f"  id fingerprints {'identical' if same else 'DIFFERENT'}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "pair": args.pair,
            "config": {"blocks": args.blocks, "block_size": args.block_size,
                       "running": args.running, "requests": args.requests, "seed": args.seed},
            "rows": rows, "fingerprints_identical": same}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
