"""``prefixcache bench --soak``: the benchmark's workload, long, with the spec
checked along the way.

The workload of :mod:`.workload` (conversations sharing system prompts,
follow-ups, parallel sampling, preemption by swapping) is planned once and
its program (:mod:`.replayer`) replayed on the target, twice over on one and
the same allocator: after each replay every sequence still held is freed,
the prefix cache is reset, and the allocator must be back to all-free.

* Every ``check_every`` instructions, on a target with vLLM-shaped internals
  (``_refcounter``, ``_cached_blocks``, ``evictor``), the whole abstract
  state is read through the spec's abstraction function and every invariant
  is checked, ownership included (from the Blocks the replay holds); content
  hashes are named from the Blocks seen (a hash that names two contents is
  a collision).  Other targets get the black-box checks only.
* The answers to the scheduler's queries must be the planned ones (what a
  correct allocator answered), as in the benchmark.
* After each replay: every block free, none referenced, and after
  ``reset_prefix_cache()`` nothing cached.
* The memory the target's own code holds (tracemalloc, filtered to the files
  of the target's package) after the second replay must not exceed that
  after the first by more than 10% (plus 64 KiB): the same work twice must
  not leave more behind.

Exit code 0 clean, 1 a violation, 2 a usage error.
"""

from __future__ import annotations

import json
import sys
import time
import tracemalloc
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Set

from ..oracle.targets import Target
from ..spec.abstraction import AbstractionError, ContentLedger, abstract_state, ownership
from ..spec.invariants import check_all
from .replayer import FREE_SEQ, SWAP_IN, SWAP_OUT, Machine, Plan, ReplayError

#: The opcodes that detach or release a sequence's Blocks: the ledger reads their
#: contents first (an evictable or swapped-out id has no Block left to read).
_WATCHED = (FREE_SEQ, SWAP_OUT, SWAP_IN)


@dataclass
class SoakReport:
    """What a soak did and found."""

    target: str = ""
    rounds: int = 0
    instructions: int = 0
    calls: int = 0
    checks: int = 0
    white_box: bool = False
    seconds: float = 0.0
    memory_after_round: List[int] = field(default_factory=list)
    memory_growth_ratio: float = 0.0
    violations: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether nothing was found."""
        return not self.violations


class _Round:
    """One replay of the program on ``allocator``, with its checks."""

    def __init__(self, allocator: Any, program_plan: Plan, report: SoakReport,
                 check_every: int, white_box: bool) -> None:
        self.alloc = allocator
        self.plan = program_plan
        self.report = report
        self.check_every = check_every
        self.white_box = white_box
        self.machine = Machine(allocator, program_plan.program.num_seqs)
        self.swapped: Set[int] = set()
        self.ledger = ContentLedger()
        self.collisions_seen = 0

    def live_blocks(self) -> List[Any]:
        """The Blocks the replay holds that have an id (not swapped out)."""
        return [b for seq, chain in enumerate(self.machine.blocks) if seq not in self.swapped
                for b in chain]

    def check(self, where: str) -> None:
        """Every invariant on the abstract state (white-box targets)."""
        if not self.white_box:
            return
        live = self.live_blocks()
        self.ledger.observe_blocks(live)
        self.report.checks += 1
        try:
            state = abstract_state(self.alloc, ledger=self.ledger, live_blocks=live)
        except AbstractionError as exc:
            self.report.violations.append(f"{where}: the state cannot be read: {exc}")
            return
        broken = check_all(state, ownership(live))
        if broken:
            self.report.violations.append(f"{where}: the state breaks {', '.join(broken)}")
        if len(self.ledger.collisions) > self.collisions_seen:
            self.collisions_seen = len(self.ledger.collisions)
            self.report.violations.append(f"{where}: {self.ledger.anomalies()}")

    def replay(self) -> bool:
        """Run the program, checking as it goes; False when the target raised."""
        machine = self.machine
        instructions = self.plan.program.instructions
        for index, instruction in enumerate(instructions):
            op, seq = instruction[0], instruction[1]
            if op in _WATCHED and self.white_box:
                self.ledger.observe_blocks(machine.blocks[seq])
            try:
                machine.run([instruction])
            except ReplayError as exc:
                self.report.violations.append(
                    f"round {self.report.rounds + 1}: instruction {index} raised "
                    f"{type(exc.__cause__).__name__}: {exc.__cause__}")
                return False
            if op == SWAP_OUT:
                self.swapped.add(seq)
            elif op in (SWAP_IN, FREE_SEQ):
                self.swapped.discard(seq)
            if self.check_every and (index + 1) % self.check_every == 0:
                self.check(f"round {self.report.rounds + 1}, after instruction {index}")
        self.report.instructions += len(instructions)
        self.report.calls += self.plan.program.calls
        if machine.answers != self.plan.program.expected:
            first = next((i for i, (a, b) in enumerate(
                zip(machine.answers, self.plan.program.expected)) if a != b),
                min(len(machine.answers), len(self.plan.program.expected)))
            self.report.violations.append(
                f"round {self.report.rounds + 1}: the answer to scheduler query {first} differs "
                f"from the planned one")
        return True

    def drain(self) -> None:
        """Free what is still held (swapped sequences back in first), check,
        and check that everything is free and the cache resets."""
        machine, alloc = self.machine, self.alloc
        for seq in sorted(self.swapped):
            alloc.swap_in(machine.blocks[seq])
        self.swapped.clear()
        for chain in machine.blocks:
            if self.white_box:
                self.ledger.observe_blocks(chain)
            for block in chain:
                alloc.free(block)
            chain.clear()
        where = f"round {self.report.rounds + 1}, drained"
        self.check(where)
        num_blocks = len(list(alloc.all_block_ids))
        free = alloc.get_num_free_blocks()
        if free != num_blocks:
            self.report.violations.append(f"{where}: {free} of {num_blocks} blocks free")
        if not alloc.reset_prefix_cache():
            self.report.violations.append(f"{where}: reset_prefix_cache() refused")
        elif self.white_box:
            state = abstract_state(alloc, ledger=self.ledger, live_blocks=[])
            cached = [i for i, b in state.blocks.items() if b.content is not None]
            if cached or state.reported_free != num_blocks:
                self.report.violations.append(
                    f"{where}: after reset_prefix_cache() ids {cached[:10]} still hold content")


def soak(target: Target, program_plan: Plan, num_blocks: int, block_size: int, *,
         rounds: int = 2, check_every: int = 10_000) -> SoakReport:
    """Replay ``program_plan`` ``rounds`` times on one allocator of
    ``target``, checking as the module says; return the report."""
    allocator = target.make(num_blocks, block_size)
    white_box = getattr(allocator, "_refcounter", None) is not None
    report = SoakReport(target=target.name, white_box=white_box)
    # the target's own code: the files beside its class's module, as imported
    # (the names tracemalloc records)
    module = sys.modules.get(type(allocator).__module__)
    package = Path(getattr(module, "__file__", "") or ".").parent
    files = [tracemalloc.Filter(True, f"{package}/*")]
    tracemalloc.start()
    start = time.monotonic()
    try:
        for _ in range(rounds):
            replay = _Round(allocator, program_plan, report, check_every, white_box)
            completed = replay.replay()
            if not completed:
                break
            replay.drain()
            report.rounds += 1
            snapshot = tracemalloc.take_snapshot().filter_traces(files)
            report.memory_after_round.append(sum(s.size for s in snapshot.statistics("filename")))
    finally:
        tracemalloc.stop()
    report.seconds = time.monotonic() - start
    memory = report.memory_after_round
    if len(memory) >= 2 and memory[0]:
        report.memory_growth_ratio = memory[-1] / memory[0]
        if memory[-1] > 1.10 * memory[0] + 64 * 1024:
            report.violations.append(f"the allocator's memory grew from {memory[0]} to "
                                     f"{memory[-1]} bytes over the same work again")
    return report


def print_report(report: SoakReport, json_path: Optional[str]) -> int:
    """Print the soak's report (and write it as JSON); the exit code."""
    rate = report.calls / max(report.seconds, 1e-9)
    print(f"soak: {report.target}: {report.rounds} rounds, {report.instructions} instructions, "
          f"{report.calls} calls in {report.seconds:.1f} s ({rate:.0f} calls/s), "
          f"{report.checks} full checks" + ("" if report.white_box else
                                            " (black-box target: no state checks)"))
    print(f"target's memory after each round (tracemalloc, its package's files): "
          f"{report.memory_after_round} B (ratio {report.memory_growth_ratio:.3f})")
    for violation in report.violations:
        print(f"VIOLATION: {violation}")
    print("no violation" if report.ok else f"{len(report.violations)} violation(s)")
    if json_path:
        data: Dict[str, Any] = dict(asdict(report), ok=report.ok, format="prefixcache-soak/1")
        Path(json_path).write_text(json.dumps(data, indent=1) + "\n")
    return 0 if report.ok else 1
