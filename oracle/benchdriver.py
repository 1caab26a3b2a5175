"""The replay driver of ``prefixcache bench``: turns a workload's operations
into a flat program of allocator calls and runs it on any allocator with
vLLM's single-device API, using only the public API.

* :class:`Compiler` translates each workload operation (see
  :mod:`prefixcache.oracle.workload`) into the calls vLLM 0.8.5's block
  manager would make: ``BlockTable.allocate``'s immutable blocks plus a
  mutable tail, one ``append_token_ids`` per decoded token (a new mutable
  block when the last is full) followed by ``clear_copy_on_writes``,
  ``find_cached_blocks_prefix`` on the sequence's block hashes (computed the
  way vLLM's ``ComputedBlocksTracker`` does, and like it passed as one list
  per sequence that grows in place) and so on.  It needs no allocator: the
  program depends only on the operations.
* :class:`Machine` executes a program on one allocator, holding each
  sequence's Blocks and ids like a block table.  :meth:`Machine.run` is the
  timed loop (no per-call timing inside); :meth:`Machine.run_timed` times
  every call with ``perf_counter_ns`` for the latency percentiles.
* :func:`plan` generates a workload with a probe that compiles each
  operation and executes it on a planning allocator (prefixcache.impl's), so
  the scheduler's decisions come from a correct allocator's answers.

Each program instruction is one allocator call, except ``FREE_SEQ``, which
frees every block of a sequence (one ``free`` call per block).  The ids a
target hands out (every Block returned, and every Block's id after an
append) are kept in order; their SHA-256 is the run's fingerprint.
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..impl.hashing import builtin_hash
from .workload import Op, Workload, WorkloadConfig, generate

# Opcodes.  Instructions are 4-tuples (opcode, seq, x, y).
APPEND = 0
CLEAR_COW = 1
FIND_CACHED = 2
COMMON1 = 3
FREE_COUNT = 4
MARK_COMPUTED = 5
ALLOC_MUT = 6
FREE_SEQ = 7
MARK_ACCESSED = 8
ALLOC_IMM = 9
FORK = 10
COMMON = 11
TOUCHED = 12
SWAP_OUT = 13
SWAP_IN = 14

#: The allocator call (or Block method) each opcode stands for.
CALL_NAMES: Dict[int, str] = {
    APPEND: "append_token_ids",
    CLEAR_COW: "clear_copy_on_writes",
    FIND_CACHED: "find_cached_blocks_prefix",
    COMMON1: "get_common_computed_block_ids",
    COMMON: "get_common_computed_block_ids",
    FREE_COUNT: "get_num_free_blocks",
    MARK_COMPUTED: "mark_blocks_as_computed",
    ALLOC_MUT: "allocate_mutable_block",
    FREE_SEQ: "free",
    MARK_ACCESSED: "mark_blocks_as_accessed",
    ALLOC_IMM: "allocate_immutable_blocks",
    FORK: "fork",
    TOUCHED: "get_num_full_blocks_touched",
    SWAP_OUT: "swap_out",
    SWAP_IN: "swap_in",
}

Instruction = Tuple[int, int, Any, Any]


@dataclass
class Program:
    """A compiled workload: the instructions, how many allocator calls they
    make (in all and per call name), the answers a correct allocator gives
    to the decision queries, and the number of sequence slots."""

    instructions: List[Instruction] = field(default_factory=list)
    calls: int = 0
    calls_by_name: Dict[str, int] = field(default_factory=dict)
    expected: List[int] = field(default_factory=list)
    num_seqs: int = 0


class _SeqState:
    __slots__ = ("tokens", "hashes", "extra_hash", "num_blocks")

    def __init__(self, tokens: List[int], extra_hash: Optional[int]) -> None:
        self.tokens = tokens
        self.hashes: List[int] = []
        self.extra_hash = extra_hash
        self.num_blocks = 0


class Compiler:
    """Translates workload operations into instructions, keeping per
    sequence its tokens, block count and block hashes."""

    def __init__(self, block_size: int, program: Optional[Program] = None) -> None:
        self.block_size = block_size
        self.program = program if program is not None else Program()
        self.seqs: Dict[int, _SeqState] = {}

    def _emit(self, op: int, seq: int = 0, x: Any = None, y: Any = None, calls: int = 1) -> None:
        program = self.program
        program.instructions.append((op, seq, x, y))
        program.calls += calls
        name = CALL_NAMES[op]
        program.calls_by_name[name] = program.calls_by_name.get(name, 0) + calls
        if seq >= program.num_seqs:
            program.num_seqs = seq + 1

    def _refresh_hashes(self, state: _SeqState) -> None:
        """Extend the block hashes to the full blocks (ComputedBlocksTracker)."""
        size = self.block_size
        hashes = state.hashes
        tokens = state.tokens
        full = len(tokens) // size
        if full == len(hashes):
            return
        parent = hashes[-1] if hashes else None
        for index in range(len(hashes), full):
            parent = builtin_hash(parent, tokens[index * size:(index + 1) * size],
                                  state.extra_hash)
            hashes.append(parent)

    def compile(self, op: Op) -> int:
        """Append the instructions of ``op``; return how many were added."""
        before = len(self.program.instructions)
        args: Tuple[Any, ...] = op
        kind = args[0]
        size = self.block_size
        if kind == "append":
            seq, token = args[1], args[2]
            state = self.seqs[seq]
            if len(state.tokens) % size == 0:
                self._emit(ALLOC_MUT, seq, state.extra_hash)
                state.num_blocks += 1
            state.tokens.append(token)
            self._emit(APPEND, seq, [token])
            self._emit(CLEAR_COW)
        elif kind == "scheduled":
            seqs: Sequence[int] = args[1]
            for seq in seqs:
                state = self.seqs[seq]
                self._refresh_hashes(state)
                self._emit(FIND_CACHED, seq, state.hashes, len(state.hashes))
            if len(seqs) == 1:
                self._emit(COMMON1, seqs[0])
            else:
                self._emit(COMMON, 0, tuple(seqs))
        elif kind == "mark_computed":
            self._emit(MARK_COMPUTED)
        elif kind == "query_free":
            self._emit(FREE_COUNT)
            if args[1] is not None:
                self.program.expected.append(args[1])
        elif kind == "query_touched":
            self._emit(TOUCHED, 0, tuple(args[1]))
            if args[2] is not None:
                self.program.expected.append(args[2])
        elif kind == "admit":
            seq, tokens, extra_hash = args[1], args[2], args[3]
            state = _SeqState(list(tokens), extra_hash)
            self.seqs[seq] = state
            full = len(state.tokens) // size
            if full:
                chunks = [state.tokens[i * size:(i + 1) * size] for i in range(full)]
                self._emit(ALLOC_IMM, seq, chunks, extra_hash)
            tail = state.tokens[full * size:]
            if tail:
                self._emit(ALLOC_MUT, seq, extra_hash)
                self._emit(APPEND, seq, tail)
            state.num_blocks = full + (1 if tail else 0)
        elif kind == "fork":
            parent, child = args[1], args[2]
            source = self.seqs[parent]
            state = _SeqState(list(source.tokens), source.extra_hash)
            state.num_blocks = source.num_blocks
            self.seqs[child] = state
            self._emit(FORK, parent, child)
            self.program.num_seqs = max(self.program.num_seqs, child + 1)
        elif kind == "free":
            seq, now = args[1], args[2]
            state = self.seqs.pop(seq)
            self._emit(MARK_ACCESSED, seq, now)
            self._emit(FREE_SEQ, seq, calls=state.num_blocks)
        elif kind == "swap_out":
            seq, now = args[1], args[2]
            self._emit(MARK_ACCESSED, seq, now)
            self._emit(SWAP_OUT, seq)
        elif kind == "swap_in":
            self._emit(SWAP_IN, args[1])
        else:
            raise ValueError(f"unknown workload operation {kind!r}")
        return len(self.program.instructions) - before


def compile_workload(workload: Workload) -> Program:
    """The program of a whole workload."""
    compiler = Compiler(workload.config.block_size)
    for op in workload.ops:
        compiler.compile(op)
    compiler.program.num_seqs = max(compiler.program.num_seqs, workload.num_seqs)
    return compiler.program


class ReplayError(RuntimeError):
    """The target raised while executing instruction ``index``."""

    def __init__(self, index: int, instruction: Instruction, cause: BaseException) -> None:
        name = CALL_NAMES.get(instruction[0], "?")
        super().__init__(f"call #{index} ({name}) raised {type(cause).__name__}: {cause}")
        self.index = index
        self.cause = cause


def _position_of(cursor: Any, instructions: Sequence[Instruction]) -> int:
    """The index of the item a sequence iterator handed out last."""
    try:
        return max(0, int(cursor.__reduce__()[2]) - 1)
    except (AttributeError, IndexError, TypeError, ValueError):
        return 0


class Machine:
    """Executes programs on one allocator, like vLLM's block manager: per
    sequence slot its Blocks, their ids (refreshed after appends) and its
    cached-prefix length.  ``out_ids`` collects every id handed out,
    ``answers`` the answers to the decision queries."""

    def __init__(self, allocator: Any, num_seqs: int) -> None:
        self.allocator = allocator
        self.blocks: List[List[Any]] = [[] for _ in range(num_seqs)]
        self.ids: List[List[int]] = [[] for _ in range(num_seqs)]
        self.ncached: List[int] = [0] * num_seqs
        self.hashes: List[List[int]] = [[] for _ in range(num_seqs)]
        self.out_ids: List[int] = []
        self.answers: List[int] = []
        self.position = 0

    def ensure_seqs(self, num_seqs: int) -> None:
        """Grow the slot tables to ``num_seqs`` sequences."""
        while len(self.blocks) < num_seqs:
            self.blocks.append([])
            self.ids.append([])
            self.ncached.append(0)
            self.hashes.append([])

    def run(self, instructions: Sequence[Instruction]) -> None:
        """Execute ``instructions`` in order.  Raises ReplayError (with the
        target's exception as cause) when a call raises."""
        alloc = self.allocator
        num_free = alloc.get_num_free_blocks
        clear_cows = alloc.clear_copy_on_writes
        find_cached = alloc.find_cached_blocks_prefix
        common = alloc.get_common_computed_block_ids
        mark_computed = alloc.mark_blocks_as_computed
        alloc_mut = alloc.allocate_mutable_block
        alloc_imm = alloc.allocate_immutable_blocks
        free = alloc.free
        mark_accessed = alloc.mark_blocks_as_accessed
        blocks = self.blocks
        ids = self.ids
        ncached = self.ncached
        hashes = self.hashes
        out = self.out_ids.append
        out_many = self.out_ids.extend
        answer = self.answers.append
        nothing: List[int] = []
        cursor = iter(instructions)
        try:
            for op, seq, x, y in cursor:
                if op == APPEND:
                    block = blocks[seq][-1]
                    block.append_token_ids(x)
                    block_id = block.block_id
                    ids[seq][-1] = block_id
                    out(block_id)
                elif op == CLEAR_COW:
                    clear_cows()
                elif op == FIND_CACHED:
                    known = hashes[seq]
                    if len(known) != y:
                        known.extend(x[len(known):y])
                    ncached[seq] = len(find_cached(known))
                elif op == COMMON1:
                    common([ids[seq][:ncached[seq]]])
                elif op == FREE_COUNT:
                    answer(num_free())
                elif op == MARK_COMPUTED:
                    mark_computed(nothing)
                elif op == ALLOC_MUT:
                    chain = blocks[seq]
                    block = alloc_mut(chain[-1] if chain else None, x)
                    chain.append(block)
                    block_id = block.block_id
                    ids[seq].append(block_id)
                    out(block_id)
                elif op == FREE_SEQ:
                    for block in blocks[seq]:
                        free(block)
                    blocks[seq] = []
                    ids[seq] = []
                    hashes[seq] = []
                elif op == MARK_ACCESSED:
                    mark_accessed(ids[seq], x)
                elif op == ALLOC_IMM:
                    chain = blocks[seq]
                    new = alloc_imm(chain[-1] if chain else None, x, y)
                    chain.extend(new)
                    new_ids = [block.block_id for block in new]
                    ids[seq].extend(new_ids)
                    out_many(new_ids)
                else:
                    self._rare(op, seq, x, y)
        except Exception as exc:
            position = _position_of(cursor, instructions)
            raise ReplayError(self.position + position, instructions[position], exc) from exc
        self.position += len(instructions)

    def _rare(self, op: int, seq: int, x: Any, y: Any) -> None:
        """The instructions that are rare in a replay (fork, swaps, the
        touched count, a common prefix of several sequences)."""
        alloc = self.allocator
        blocks = self.blocks
        ids = self.ids
        if op == FORK:
            new = alloc.fork(blocks[seq][-1])
            blocks[x] = new
            self.hashes[x] = []
            ids[x] = [block.block_id for block in new]
            self.out_ids.extend(ids[x])
        elif op == COMMON:
            alloc.get_common_computed_block_ids([ids[s][:self.ncached[s]] for s in x])
        elif op == TOUCHED:
            self.answers.append(alloc.get_num_full_blocks_touched(
                [block for s in x for block in blocks[s]]))
        elif op == SWAP_OUT:
            alloc.swap_out(blocks[seq])
        elif op == SWAP_IN:
            alloc.swap_in(blocks[seq])
            ids[seq] = [block.block_id for block in blocks[seq]]
            self.out_ids.extend(ids[seq])
        else:
            raise ValueError(f"unknown opcode {op}")

    def run_timed(self, instructions: Sequence[Instruction],
                  clock: Callable[[], int] = perf_counter_ns) -> Dict[str, List[int]]:
        """Execute ``instructions`` timing every allocator call (each
        ``free`` of ``FREE_SEQ`` separately); return the raw durations in
        nanoseconds per call name, timer overhead included."""
        samples: Dict[int, List[int]] = {op: [] for op in CALL_NAMES}
        alloc = self.allocator
        blocks = self.blocks
        ids = self.ids
        ncached = self.ncached
        nothing: List[int] = []
        for position, (op, seq, x, y) in enumerate(instructions):
            lat = samples[op]
            try:
                if op == APPEND:
                    block = blocks[seq][-1]
                    t = clock()
                    block.append_token_ids(x)
                    block_id = block.block_id
                    lat.append(clock() - t)
                    ids[seq][-1] = block_id
                    self.out_ids.append(block_id)
                elif op == CLEAR_COW:
                    t = clock()
                    alloc.clear_copy_on_writes()
                    lat.append(clock() - t)
                elif op == FIND_CACHED:
                    known = self.hashes[seq]
                    if len(known) != y:
                        known.extend(x[len(known):y])
                    t = clock()
                    found = alloc.find_cached_blocks_prefix(known)
                    lat.append(clock() - t)
                    ncached[seq] = len(found)
                elif op == COMMON1:
                    arg = [ids[seq][:ncached[seq]]]
                    t = clock()
                    alloc.get_common_computed_block_ids(arg)
                    lat.append(clock() - t)
                elif op == FREE_COUNT:
                    t = clock()
                    count = alloc.get_num_free_blocks()
                    lat.append(clock() - t)
                    self.answers.append(count)
                elif op == MARK_COMPUTED:
                    t = clock()
                    alloc.mark_blocks_as_computed(nothing)
                    lat.append(clock() - t)
                elif op == FREE_SEQ:
                    for block in blocks[seq]:
                        t = clock()
                        alloc.free(block)
                        lat.append(clock() - t)
                    blocks[seq] = []
                    ids[seq] = []
                    self.hashes[seq] = []
                elif op == MARK_ACCESSED:
                    t = clock()
                    alloc.mark_blocks_as_accessed(ids[seq], x)
                    lat.append(clock() - t)
                else:
                    t = clock()
                    if op == ALLOC_MUT:
                        chain = blocks[seq]
                        block = alloc.allocate_mutable_block(chain[-1] if chain else None, x)
                        lat.append(clock() - t)
                        chain.append(block)
                        ids[seq].append(block.block_id)
                        self.out_ids.append(block.block_id)
                    elif op == ALLOC_IMM:
                        chain = blocks[seq]
                        new = alloc.allocate_immutable_blocks(chain[-1] if chain else None, x, y)
                        lat.append(clock() - t)
                        chain.extend(new)
                        new_ids = [b.block_id for b in new]
                        ids[seq].extend(new_ids)
                        self.out_ids.extend(new_ids)
                    else:
                        self._rare(op, seq, x, y)
                        lat.append(clock() - t)
            except Exception as exc:
                raise ReplayError(self.position + position, instructions[position], exc) from exc
        self.position += len(instructions)
        merged: Dict[str, List[int]] = {}
        for op, values in samples.items():
            if values:
                merged.setdefault(CALL_NAMES[op], []).extend(values)
        return merged

    def fingerprint(self) -> str:
        """SHA-256 (hex) of the ids handed out so far, in order."""
        return hashlib.sha256(array("q", self.out_ids).tobytes()).hexdigest()


def timer_overhead_ns(clock: Callable[[], int] = perf_counter_ns, rounds: int = 20001) -> int:
    """The median duration of an empty timed region (two clock reads)."""
    values = []
    for _ in range(rounds):
        t = clock()
        values.append(clock() - t)
    values.sort()
    return values[len(values) // 2]


def percentile(sorted_values: Sequence[int], fraction: float) -> int:
    """The ``fraction`` quantile (nearest rank) of an ascending sequence."""
    if not sorted_values:
        return 0
    rank = max(0, min(len(sorted_values) - 1, int(round(fraction * len(sorted_values))) - 1))
    return sorted_values[rank]


@dataclass
class Plan:
    """A generated workload and its program."""

    workload: Workload
    program: Program


def plan(config: WorkloadConfig,
         make_allocator: Optional[Callable[[int, int], Any]] = None) -> Plan:
    """Generate the workload of ``config`` with a probe that executes every
    operation on a fresh planning allocator (default: prefixcache.impl's
    PrefixCachingBlockAllocator), and compile it.  The program is the one
    the planning allocator ran."""
    if make_allocator is None:
        from ..impl.prefix_caching_block import PrefixCachingBlockAllocator

        def make_allocator(num_blocks: int, block_size: int) -> Any:
            return PrefixCachingBlockAllocator(num_blocks=num_blocks, block_size=block_size)

    allocator = make_allocator(config.num_blocks, config.block_size)
    compiler = Compiler(config.block_size)
    machine = Machine(allocator, 0)
    program = compiler.program

    def probe(op: Op) -> Optional[int]:
        start = len(program.instructions)
        answers_before = len(machine.answers)
        compiler.compile(op)
        machine.ensure_seqs(program.num_seqs)
        machine.run(program.instructions[start:])
        if len(machine.answers) > answers_before:
            program.expected.append(machine.answers[-1])
            return machine.answers[-1]
        return None

    workload = generate(config, probe)
    program.num_seqs = max(program.num_seqs, workload.num_seqs)
    return Plan(workload=workload, program=program)
