"""``prefixcache soak``: a long random serving workload against prefixcache.impl.

Requests share system prompts, decode one token at a time, fork for parallel
sampling, are preempted by swapping out and resumed, and finish.  Every
``--check-every`` operations the allocator's whole abstract state is read
through the spec's abstraction function and every invariant (ownership
included, from the Blocks the workload holds) is checked.  At the end every
sequence is freed and the soak verifies that every block is free or
evictable, nothing cached is in use, the cache resets to all-free, and the
memory the allocator's own code holds (tracemalloc, filtered to impl/) in
the second half did not grow over the first.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import tracemalloc
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..impl import errors as err
from ..impl.prefix_caching_block import PrefixCachingBlockAllocator
from ..spec.abstraction import ContentLedger, abstract_state, ownership
from ..spec.invariants import check_all

MAX_RUNNING = 48
MAX_BLOCKS_PER_SEQUENCE = 24


@dataclass
class SoakReport:
    """What a soak did and found."""

    ops: int = 0
    checks: int = 0
    seconds: float = 0.0
    ops_by_kind: Dict[str, int] = field(default_factory=dict)
    violations: List[str] = field(default_factory=list)
    memory_first_half_peak: int = 0
    memory_second_half_peak: int = 0
    memory_growth_ratio: float = 0.0
    final_free: int = 0
    total_blocks: int = 0

    @property
    def ok(self) -> bool:
        """No violation, and the second half's memory within 10% of the first's."""
        return not self.violations


class Soak:
    """The workload and its checks, on one allocator."""

    def __init__(self, num_blocks: int, block_size: int, seed: int) -> None:
        self.alloc = PrefixCachingBlockAllocator(num_blocks=num_blocks, block_size=block_size)
        self.size = block_size
        self.rng = random.Random(seed)
        self.running: List[List[Any]] = []
        self.swapped: List[List[Any]] = []
        self.systems = [[self.rng.randrange(50_000) for _ in range(block_size * k)]
                        for k in (1, 2, 4, 8)]
        self.now = 0.0
        self.ledger = ContentLedger()
        self.report = SoakReport(total_blocks=num_blocks)

    def _count(self, kind: str) -> None:
        self.report.ops_by_kind[kind] = self.report.ops_by_kind.get(kind, 0) + 1

    def admit(self) -> None:
        """A new request: a popular system prompt plus a user prompt."""
        rng = self.rng
        system = self.systems[min(int(rng.paretovariate(1.2)) - 1, len(self.systems) - 1)]
        prompt = system + [rng.randrange(50_000) for _ in range(rng.randrange(1, 4 * self.size))]
        cut = len(prompt) - len(prompt) % self.size
        chunks = [prompt[i:i + self.size] for i in range(0, cut, self.size)]
        if len(self.running) >= MAX_RUNNING or \
                self.alloc.get_num_free_blocks() < len(chunks) + 2:  # admission control
            return
        blocks = self.alloc.allocate_immutable_blocks(None, chunks)
        tail = prompt[cut:]
        if tail:
            last = self.alloc.allocate_mutable_block(blocks[-1] if blocks else None)
            last.append_token_ids(tail)
            blocks.append(last)
        self.running.append(blocks)
        self._count("admit")

    def decode(self) -> None:
        """One token for a running sequence (a new block when full)."""
        seq = self.rng.choice(self.running)
        if len(seq) >= MAX_BLOCKS_PER_SEQUENCE:
            self.running.remove(seq)
            self.finish(seq)
            return
        if seq[-1].is_full:
            seq.append(self.alloc.allocate_mutable_block(seq[-1]))
        seq[-1].append_token_ids([self.rng.randrange(50_000)])
        self._count("decode")

    def finish(self, seq: List[Any]) -> None:
        """Mark the sequence's blocks accessed now, then free them (the
        ledger learns their contents first: evictable ids have no Block)."""
        self.ledger.observe_blocks(seq)
        self.alloc.mark_blocks_as_accessed([b.block_id for b in seq], self.now)
        for block in seq:
            self.alloc.free(block)
        self._count("finish")

    def step(self) -> None:
        """One scheduler decision."""
        rng = self.rng
        self.now += 1
        roll = rng.random()
        try:
            if roll < 0.15 or not self.running:
                self.admit()
            elif roll < 0.80:
                self.decode()
            elif roll < 0.83 and len(self.running) < MAX_RUNNING:
                self.running.append(self.alloc.fork(rng.choice(self.running)[-1]))
                self._count("fork")
            elif roll < 0.86:
                seq = self.running.pop(rng.randrange(len(self.running)))
                self.ledger.observe_blocks(seq)
                self.alloc.swap_out(seq)
                self.swapped.append(seq)
                self._count("swap_out")
            elif roll < 0.89 and self.swapped:
                seq = self.swapped[0]
                self.alloc.swap_in(seq)
                self.running.append(self.swapped.pop(0))
                self._count("swap_in")
            elif roll < 0.99:
                self.finish(self.running.pop(rng.randrange(len(self.running))))
            else:
                seq = rng.choice(self.running)
                hashes = [b.content_hash for b in seq if b.content_hash is not None]
                self.alloc.find_cached_blocks_prefix(hashes)
                self.alloc.mark_blocks_as_computed([])
                self._count("query")
        except err.NoFreeBlocksError:
            # memory pressure: preempt the youngest running sequence
            if self.running:
                self.finish(self.running.pop())
                self._count("preempt")
        self.report.ops += 1

    def live_blocks(self) -> List[Any]:
        """Every Block the workload holds that has an id."""
        return [b for seq in self.running for b in seq]

    def check(self) -> None:
        """Read the abstract state and check every invariant."""
        live = self.live_blocks()
        state = abstract_state(self.alloc, ledger=self.ledger, live_blocks=live)
        broken = check_all(state, ownership(live))
        self.report.checks += 1
        if broken or self.ledger.collisions:
            self.report.violations.append(
                f"after {self.report.ops} ops: {broken} {self.ledger.anomalies()}")
        # keep only the names still needed: the hashes cached now
        kept = ContentLedger()
        for content_hash in self.alloc._cached_blocks:
            key = self.ledger.name(content_hash)
            if key is not None:
                kept.observe(content_hash, key)
        self.ledger = kept

    def drain(self) -> None:
        """Free everything and check that the allocator is back to empty
        (and that the cache resets to all-free)."""
        for seq in self.running:
            self.finish(seq)
        self.running = []
        for seq in self.swapped:  # detached Blocks go back to the pool only via an id
            self.alloc.swap_in(seq)
            self.finish(seq)
        self.swapped = []
        alloc = self.alloc
        self.check()
        self.report.final_free = alloc.get_num_free_blocks()
        if self.report.final_free != self.report.total_blocks:
            self.report.violations.append(
                f"after freeing everything {self.report.final_free} of "
                f"{self.report.total_blocks} blocks are free")
        in_use = [i for i, n in alloc._refcounter._refcounts.items() if n]
        if in_use:
            self.report.violations.append(f"ids still referenced: {in_use[:10]}")
        cached_in_use = [i for i in alloc._cached_blocks.values() if i not in alloc.evictor]
        if cached_in_use:
            self.report.violations.append(f"cached ids not evictable: {cached_in_use[:10]}")
        if not alloc.reset_prefix_cache() or alloc._cached_blocks or \
                len(alloc._hashless_allocator._free_block_indices) != self.report.total_blocks:
            self.report.violations.append("reset_prefix_cache did not free every block")


def soak(ops: int, *, num_blocks: int = 256, block_size: int = 16, seed: int = 0,
         check_every: int = 10_000) -> SoakReport:
    """Run the soak; return its report (``report.ok`` when nothing was found)."""
    runner = Soak(num_blocks, block_size, seed)
    impl_files = [tracemalloc.Filter(True, "*/impl/*.py")]
    tracemalloc.start()
    start = time.monotonic()
    peaks = [0, 0]
    for half, count in enumerate((ops // 2, ops - ops // 2)):
        for index in range(count):
            runner.step()
            if check_every and (index + 1) % check_every == 0:
                runner.check()
        runner.drain()  # the same empty state at the end of each half
        traced = tracemalloc.take_snapshot().filter_traces(impl_files)
        peaks[half] = sum(stat.size for stat in traced.statistics("filename"))
    tracemalloc.stop()
    report = runner.report
    report.seconds = time.monotonic() - start
    report.memory_first_half_peak, report.memory_second_half_peak = peaks
    if peaks[0]:
        report.memory_growth_ratio = peaks[1] / peaks[0]
        if peaks[1] > 1.10 * peaks[0] + 64 * 1024:
            report.violations.append(
                f"the allocator's memory grew from {peaks[0]} to {peaks[1]} bytes")
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``prefixcache soak``."""
    parser.add_argument("--ops", type=int, default=100_000, help="operations (default 100000)")
    parser.add_argument("--blocks", type=int, default=256, help="pool size (default 256)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per block")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check-every", type=int, default=10_000,
                        help="full invariant check period in operations (0: only at the end)")
    parser.add_argument("--json", default=None, metavar="PATH", help="write the report")


def run(args: argparse.Namespace) -> int:
    """Soak, print the report; 0 clean, 1 a violation, 2 a usage error."""
    if args.ops < 1 or args.blocks < 8 or args.block_size < 1 or args.check_every < 0:
        print("prefixcache soak: need --ops >= 1, --blocks >= 8, --block-size >= 1",
              file=sys.stderr)
        return 2
    report = soak(args.ops, num_blocks=args.blocks, block_size=args.block_size, seed=args.seed,
                  check_every=args.check_every)
    data = dict(asdict(report), ok=report.ok)
    print(f"soak: {report.ops} ops in {report.seconds:.1f} s "
          f"({report.ops / max(report.seconds, 1e-9):.0f} ops/s), {report.checks} full checks")
    print(f"ops: {json.dumps(report.ops_by_kind, sort_keys=True)}")
    print(f"allocator memory (tracemalloc, impl/ only, drained): after the first half "
          f"{report.memory_first_half_peak} B, after the second "
          f"{report.memory_second_half_peak} B (ratio {report.memory_growth_ratio:.3f})")
    print(f"after draining: {report.final_free}/{report.total_blocks} blocks free; reset ok")
    for violation in report.violations:
        print(f"VIOLATION: {violation}")
    print("no violation" if report.ok else f"{len(report.violations)} violation(s)")
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1) + "\n")
    return 0 if report.ok else 1


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m prefixcache.oracle.soak``."""
    parser = argparse.ArgumentParser(prog="prefixcache soak")
    add_arguments(parser)
    return run(parser.parse_args(argv))
