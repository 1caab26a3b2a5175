"""The replay driver's own share of a ``prefixcache bench`` replay.

Every target's replay time includes the driver's bookkeeping between the
calls (the block tables, the hash lists, the ids kept for the fingerprint)
and the cost of making each call.  This script measures that part: it
records the answers prefixcache.impl gives on the roomy replay, then times
the same program on a stand-in target whose every call returns the next
recorded answer and does nothing else (its Blocks' ``append_token_ids``
does nothing either), side by side with prefixcache.impl and vLLM 0.8.5
(best CPU time of the repeats, the targets alternating).  The stand-in's
time is what no allocator can go below on this driver; a target's time
above it is, roughly, the time its own code takes beyond making the calls.

Usage::

    python bench/driver_cost.py [--blocks 1024] [--repeats 7] [--no-vllm] [--json PATH]

Exit code 0, or 1 when a replay failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional

from prefixcache.bench.benchmark import load_target, measure
from prefixcache.bench.replayer import CALL_NAMES, Machine, Plan, plan
from prefixcache.bench.workload import WorkloadConfig
from prefixcache.oracle.targets import Target


class StandInBlock:
    """A Block as the driver sees it: an id, and appends that do nothing."""

    __slots__ = ("block_id",)

    def __init__(self, block_id: Optional[int]) -> None:
        self.block_id = block_id

    def append_token_ids(self, token_ids: List[int]) -> None:
        """Nothing: the stand-in keeps no tokens."""


def _replayable(answer: Any) -> Any:
    """``answer`` with every Block in it replaced by a StandInBlock."""
    if isinstance(answer, list) and answer and hasattr(answer[0], "append_token_ids"):
        return [StandInBlock(block.block_id) for block in answer]
    if hasattr(answer, "append_token_ids"):
        return StandInBlock(answer.block_id)
    return answer


class _Recorder:
    """Forwards the driver's calls to ``allocator`` and records the answers."""

    def __init__(self, allocator: Any, answers: List[Any]) -> None:
        self._allocator = allocator
        self._answers = answers

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._allocator, name)
        answers = self._answers

        def recorded(*args: Any) -> Any:
            answer = method(*args)
            answers.append(_replayable(answer))
            return answer
        return recorded


def record_answers(program_plan: Plan, num_blocks: int) -> List[Any]:
    """The answers of prefixcache.impl to every call of the program, in order."""
    answers: List[Any] = []
    impl = load_target(None).make(num_blocks, program_plan.workload.config.block_size)
    Machine(_Recorder(impl, answers), program_plan.program.num_seqs).run(
        program_plan.program.instructions)
    return answers


class StandIn:
    """A target whose every call returns the next recorded answer.  Each
    instance hands out its own copies of the recorded lists (the driver
    extends the lists it gets)."""

    def __init__(self, answers: List[Any]) -> None:
        fresh: Iterator[Any] = iter([a[:] if isinstance(a, list) else a for a in answers])
        next_answer = fresh.__next__

        def answer(*args: Any) -> Any:
            return next_answer()
        for name in CALL_NAMES:
            setattr(self, name, answer)

    def get_prefix_cache_hit_rate(self) -> float:
        """Not recorded: 0.0."""
        return 0.0


def main(argv: Optional[List[str]] = None) -> int:
    """Record, time the three targets, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-vllm", action="store_true", help="leave vLLM 0.8.5 out")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the rows here")
    args = parser.parse_args(argv)
    config = WorkloadConfig(num_blocks=args.blocks)
    program_plan = plan(config)
    answers = record_answers(program_plan, args.blocks)
    targets = [Target(name="stand-in (recorded answers)", kind="prefix",
                      build=lambda num_blocks, block_size: StandIn(answers)),
               load_target(None)]
    labels = [targets[0].name, "prefixcache.impl"]
    if not args.no_vllm:
        targets.append(load_target("vllm"))
        labels.append("vLLM 0.8.5")
    results = measure(targets, program_plan, "roomy", args.blocks, args.repeats, latency=False)
    failed = [result for result in results if result.error is not None]
    for result in failed:
        print(f"{result.target}: {result.error}", file=sys.stderr)
    if failed:
        return 1
    driver = results[0].seconds
    rows = [{"target": label, "ms": result.seconds * 1e3,
             "stand_in_share": driver / result.seconds,
             "ms_above_stand_in": (result.seconds - driver) * 1e3}
            for label, result in zip(labels, results)]
    print(f"roomy replay: {args.blocks:,} blocks, {program_plan.program.calls:,} allocator "
          f"calls, {len(program_plan.program.instructions):,} instructions; best CPU time "
          f"of {args.repeats} repeats")
    print(f"  {'target':<28} {'ms':>8} {'stand-in share':>15} {'ms above it':>12}")
    for row in rows:
        print(f"  {row['target']:<28} {row['ms']:8.1f} {row['stand_in_share']:15.0%} "
              f"{row['ms_above_stand_in']:12.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "blocks": args.blocks, "repeats": args.repeats, "calls": program_plan.program.calls,
            "instructions": len(program_plan.program.instructions), "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
