"""The replay driver of ``prefixcache bench``: turns a workload's operations
into a flat program of allocator calls and runs it on any allocator with
vLLM's single-device API, using only the public API.

* :class:`Compiler` translates each workload operation (see
  :mod:`prefixcache.bench.workload`) into the calls vLLM 0.8.5's block
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

An instruction makes the allocator calls :data:`CALLS` names for its
opcode: one, or two that the block manager always makes back to back (an
append and ``clear_copy_on_writes``; the cached prefix of a one-sequence
group and its common computed ids), or, for ``FREE_SEQ``, one ``free`` per
block of the sequence.  :func:`fuse` then merges instructions that follow
each other (a free count and a decode; a run of ``mark_blocks_as_computed``)
so that the driver's own dispatch costs less of the replay; the calls and
their order stay the same.  ``ACCESS`` (the access-heavy workload's
per-step marks) passes the sequence's ids as the machine holds them, which
every instruction that may change an id has refreshed.  The ids a target
hands out (every Block returned, every Block's id after an append that may
change it, a sequence's ids when it is freed or swapped out) are kept in
order; their SHA-256 is the run's fingerprint.
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass, field
from operator import attrgetter
from time import perf_counter_ns
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..impl.hashing import builtin_hash
from .workload import Op, Workload, WorkloadConfig, generate

# Opcodes.  Instructions are 4-tuples (opcode, seq, x, y).
DECODE = 0         # seq, [token], whether the id may change: append, clear CoWs
SCHED1 = 1         # seq, its hash list, its length: cached prefix, common ids
FREE_COUNT = 2
MARK_COMPUTED = 3  # 0, how many calls in a row
ALLOC_MUT = 4      # seq, extra hash
APPEND = 5         # seq, tokens (a prompt's tail)
FREE_SEQ = 6       # seq
MARK_ACCESSED = 7  # seq, now
ALLOC_IMM = 8      # seq, token lists, extra hash
FIND_CACHED = 9    # seq, its hash list, its length (a group of several)
COMMON = 10        # 0, the group's seqs
FORK = 11          # parent, child
TOUCHED = 12       # 0, the group's seqs
SWAP_OUT = 13      # seq
SWAP_IN = 14       # seq
FREE_DECODE = 15   # FREE_COUNT then DECODE (made by fuse)
ACCESS = 16        # seq, now: its blocks' current ids marked accessed (access-heavy)

#: The allocator calls (``append_token_ids`` is the Block's) of each opcode.
CALLS: Dict[int, Tuple[str, ...]] = {
    DECODE: ("append_token_ids", "clear_copy_on_writes"),
    SCHED1: ("find_cached_blocks_prefix", "get_common_computed_block_ids"),
    FREE_COUNT: ("get_num_free_blocks",),
    MARK_COMPUTED: ("mark_blocks_as_computed",),
    ALLOC_MUT: ("allocate_mutable_block",),
    APPEND: ("append_token_ids",),
    FREE_SEQ: ("free",),
    MARK_ACCESSED: ("mark_blocks_as_accessed",),
    ALLOC_IMM: ("allocate_immutable_blocks",),
    FIND_CACHED: ("find_cached_blocks_prefix",),
    COMMON: ("get_common_computed_block_ids",),
    FORK: ("fork",),
    TOUCHED: ("get_num_full_blocks_touched",),
    SWAP_OUT: ("swap_out",),
    SWAP_IN: ("swap_in",),
    FREE_DECODE: ("get_num_free_blocks", "append_token_ids", "clear_copy_on_writes"),
    ACCESS: ("mark_blocks_as_accessed",),
}

#: Every call name a program can make.
CALL_NAMES: Tuple[str, ...] = tuple(sorted({name for names in CALLS.values() for name in names}))

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
    __slots__ = ("tokens", "hashes", "extra_hash", "num_blocks", "shared_tail")

    def __init__(self, tokens: List[int], extra_hash: Optional[int]) -> None:
        self.tokens = tokens
        self.hashes: List[int] = []
        self.extra_hash = extra_hash
        self.num_blocks = 0
        self.shared_tail = False  # forked since its last append: the tail may be copied


class Compiler:
    """Translates workload operations into instructions, keeping per
    sequence its tokens, block count and block hashes."""

    def __init__(self, block_size: int, program: Optional[Program] = None) -> None:
        self.block_size = block_size
        self.program = program if program is not None else Program()
        self.seqs: Dict[int, _SeqState] = {}

    def _emit(self, op: int, seq: int = 0, x: Any = None, y: Any = None, each: int = 1) -> None:
        program = self.program
        program.instructions.append((op, seq, x, y))
        by_name = program.calls_by_name
        for name in CALLS[op]:
            program.calls += each
            by_name[name] = by_name.get(name, 0) + each
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
            may_change = state.shared_tail or len(state.tokens) % size == 0
            state.shared_tail = False
            self._emit(DECODE, seq, [token], may_change)
        elif kind == "scheduled":
            seqs: Sequence[int] = args[1]
            for seq in seqs:
                self._refresh_hashes(self.seqs[seq])
            if len(seqs) == 1:
                state = self.seqs[seqs[0]]
                self._emit(SCHED1, seqs[0], state.hashes, len(state.hashes))
            else:
                for seq in seqs:
                    state = self.seqs[seq]
                    self._emit(FIND_CACHED, seq, state.hashes, len(state.hashes))
                self._emit(COMMON, 0, tuple(seqs))
        elif kind == "mark_computed":
            self._emit(MARK_COMPUTED, 0, 1)
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
            state.shared_tail = source.shared_tail = True
            self.seqs[child] = state
            self._emit(FORK, parent, child)
            self.program.num_seqs = max(self.program.num_seqs, child + 1)
        elif kind == "free":
            seq, now = args[1], args[2]
            state = self.seqs.pop(seq)
            self._emit(MARK_ACCESSED, seq, now)
            self._emit(FREE_SEQ, seq, each=state.num_blocks)
        elif kind == "swap_out":
            seq, now = args[1], args[2]
            self._emit(MARK_ACCESSED, seq, now)
            self._emit(SWAP_OUT, seq)
        elif kind == "swap_in":
            self.seqs[args[1]].shared_tail = False  # every block gets its own id back
            self._emit(SWAP_IN, args[1])
        elif kind == "access":
            self._emit(ACCESS, args[1], args[2])
        else:
            raise ValueError(f"unknown workload operation {kind!r}")
        return len(self.program.instructions) - before


def compile_workload(workload: Workload) -> Program:
    """The program of a whole workload, fused."""
    compiler = Compiler(workload.config.block_size)
    for op in workload.ops:
        compiler.compile(op)
    compiler.program.num_seqs = max(compiler.program.num_seqs, workload.num_seqs)
    compiler.program.instructions = fuse(compiler.program.instructions)
    return compiler.program


def fuse(instructions: Sequence[Instruction]) -> List[Instruction]:
    """The same calls in fewer instructions, so that the driver's own share
    of a replay shrinks: a FREE_COUNT followed by a DECODE becomes one
    FREE_DECODE, and a run of MARK_COMPUTED one with their total count.
    The result is laid out in memory in execution order (new tuples, and
    new token lists for the decodes, made one after the other), as an
    engine's freshly made arguments would be: a program assembled while
    planning is scattered among the planner's objects, and reading it
    would cost every target cache misses that are not the allocator's."""
    fused: List[Instruction] = []
    for instruction in instructions:
        op = instruction[0]
        if fused:
            last = fused[-1]
            if op == DECODE and last[0] == FREE_COUNT:
                fused[-1] = (FREE_DECODE,) + instruction[1:]
                continue
            if op == MARK_COMPUTED and last[0] == MARK_COMPUTED:
                fused[-1] = (MARK_COMPUTED, 0, last[2] + instruction[2], None)
                continue
        fused.append(instruction)
    return [(op, seq, [*x] if op == DECODE or op == FREE_DECODE else x, y)
            for op, seq, x, y in fused]


class ReplayError(RuntimeError):
    """The target raised while executing instruction ``index``."""

    def __init__(self, index: int, instruction: Instruction, cause: BaseException) -> None:
        names = "/".join(CALLS.get(instruction[0], ("?",)))
        super().__init__(f"instruction #{index} ({names}) raised {type(cause).__name__}: {cause}")
        self.index = index
        self.cause = cause


def _position_of(cursor: Any) -> int:
    """The index of the item a list iterator handed out last."""
    try:
        return max(0, int(cursor.__reduce__()[2]) - 1)
    except (AttributeError, IndexError, TypeError, ValueError):
        return 0


class Machine:
    """Executes programs on one allocator, like vLLM's block manager: per
    sequence slot its Blocks, their ids (refreshed after appends that may
    change them), its hash list and its cached-prefix length.  ``out_ids``
    collects the ids handed out, ``answers`` the answers to the decision
    queries."""

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
        (num_free, clear_cows, find_cached, common, mark_computed, mark_accessed, alloc_mut,
         free) = attrgetter(
            "get_num_free_blocks", "clear_copy_on_writes", "find_cached_blocks_prefix",
            "get_common_computed_block_ids", "mark_blocks_as_computed", "mark_blocks_as_accessed",
            "allocate_mutable_block", "free")(self.allocator)
        blocks, ids, hashes, ncached = self.blocks, self.ids, self.hashes, self.ncached
        out = self.out_ids.append
        answer = self.answers.append
        nothing: List[int] = []
        cursor = iter(instructions)
        # the opcodes as locals (a local costs less to read than a global), and
        # the branches in the order of how often a replay takes them
        free_decode, decode, sched1, access, find, free_count, mark, common_op = (
            FREE_DECODE, DECODE, SCHED1, ACCESS, FIND_CACHED, FREE_COUNT, MARK_COMPUTED,
            COMMON)
        alloc_mut_op, free_seq = ALLOC_MUT, FREE_SEQ
        try:
            for op, seq, x, y in cursor:
                if op == free_decode or op == decode:
                    if op == free_decode:
                        answer(num_free())
                    block = blocks[seq][-1]
                    block.append_token_ids(x)
                    if y:
                        block_id = block.block_id
                        ids[seq][-1] = block_id
                        out(block_id)
                    clear_cows()
                elif op == sched1:
                    known = hashes[seq]
                    if len(known) != y:
                        known.extend(x[len(known):y])
                    common([ids[seq][:len(find_cached(known))]])
                elif op == access:
                    mark_accessed(ids[seq], x)
                elif op == find:
                    known = hashes[seq]
                    if len(known) != y:
                        known.extend(x[len(known):y])
                    ncached[seq] = len(find_cached(known))
                elif op == free_count:
                    answer(num_free())
                elif op == mark:
                    for _ in range(x):
                        mark_computed(nothing)
                elif op == common_op:
                    common([ids[s][:ncached[s]] for s in x])
                elif op == alloc_mut_op:
                    chain = blocks[seq]
                    block = alloc_mut(chain[-1] if chain else None, x)
                    chain.append(block)
                    block_id = block.block_id
                    ids[seq].append(block_id)
                    out(block_id)
                elif op == free_seq:
                    for block in blocks[seq]:
                        free(block)
                    blocks[seq] = []
                    ids[seq] = []
                    hashes[seq] = []
                else:
                    self._step(op, seq, x, y)
        except Exception as exc:
            position = _position_of(cursor)
            raise ReplayError(self.position + position, instructions[position], exc) from exc
        self.position += len(instructions)

    def _step(self, op: int, seq: int, x: Any, y: Any) -> None:
        """The instructions that are rare in a replay."""
        alloc = self.allocator
        blocks = self.blocks
        ids = self.ids
        if op == APPEND:
            block = blocks[seq][-1]
            block.append_token_ids(x)
            ids[seq][-1] = block.block_id
            self.out_ids.append(ids[seq][-1])
        elif op == MARK_ACCESSED:
            ids[seq] = [block.block_id for block in blocks[seq]]
            self.out_ids.extend(ids[seq])
            alloc.mark_blocks_as_accessed(ids[seq], x)
        elif op == ALLOC_IMM:
            chain = blocks[seq]
            new = alloc.allocate_immutable_blocks(chain[-1] if chain else None, x, y)
            chain.extend(new)
            new_ids = [block.block_id for block in new]
            ids[seq].extend(new_ids)
            self.out_ids.extend(new_ids)
        elif op == FORK:
            new = alloc.fork(blocks[seq][-1])
            blocks[x] = new
            self.hashes[x] = []
            ids[x] = [block.block_id for block in new]
            self.out_ids.extend(ids[x])
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
            raise ValueError(f"opcode {op} is not one of the rare ones")

    def _timed_prefix(self, seq: int, x: Any, y: int, samples: Dict[str, List[int]],
                      clock: Callable[[], int]) -> List[int]:
        """The sequence's hash list grown to its first ``y`` hashes of ``x``,
        then ``find_cached_blocks_prefix`` on it, timed into ``samples``."""
        known = self.hashes[seq]
        if len(known) != y:
            known.extend(x[len(known):y])
        t = clock()
        found = self.allocator.find_cached_blocks_prefix(known)
        samples["find_cached_blocks_prefix"].append(clock() - t)
        return list(found)

    def run_timed(self, instructions: Sequence[Instruction],
                  clock: Callable[[], int] = perf_counter_ns) -> Dict[str, List[int]]:
        """Execute ``instructions`` timing every allocator call separately
        (each ``free`` of ``FREE_SEQ`` too); return the raw durations in
        nanoseconds per call name, timer overhead included."""
        samples: Dict[str, List[int]] = {name: [] for name in CALL_NAMES}
        alloc = self.allocator
        blocks = self.blocks
        ids = self.ids
        nothing: List[int] = []
        for position, (op, seq, x, y) in enumerate(instructions):
            try:
                if op == FREE_DECODE or op == FREE_COUNT:
                    t = clock()
                    count = alloc.get_num_free_blocks()
                    samples["get_num_free_blocks"].append(clock() - t)
                    self.answers.append(count)
                    if op == FREE_COUNT:
                        continue
                if op == FREE_DECODE or op == DECODE:
                    block = blocks[seq][-1]
                    t = clock()
                    block.append_token_ids(x)
                    samples["append_token_ids"].append(clock() - t)
                    if y:
                        ids[seq][-1] = block.block_id
                        self.out_ids.append(ids[seq][-1])
                    t = clock()
                    alloc.clear_copy_on_writes()
                    samples["clear_copy_on_writes"].append(clock() - t)
                elif op == SCHED1:
                    found = self._timed_prefix(seq, x, y, samples, clock)
                    arg = [ids[seq][:len(found)]]
                    t = clock()
                    alloc.get_common_computed_block_ids(arg)
                    samples["get_common_computed_block_ids"].append(clock() - t)
                elif op == MARK_COMPUTED:
                    for _ in range(x):
                        t = clock()
                        alloc.mark_blocks_as_computed(nothing)
                        samples["mark_blocks_as_computed"].append(clock() - t)
                elif op == FREE_SEQ:
                    lat = samples["free"]
                    for block in blocks[seq]:
                        t = clock()
                        alloc.free(block)
                        lat.append(clock() - t)
                    blocks[seq] = []
                    ids[seq] = []
                    self.hashes[seq] = []
                elif op == ALLOC_MUT:
                    chain = blocks[seq]
                    prev = chain[-1] if chain else None
                    t = clock()
                    block = alloc.allocate_mutable_block(prev, x)
                    samples["allocate_mutable_block"].append(clock() - t)
                    chain.append(block)
                    ids[seq].append(block.block_id)
                    self.out_ids.append(block.block_id)
                elif op == MARK_ACCESSED:
                    ids[seq] = [block.block_id for block in blocks[seq]]
                    self.out_ids.extend(ids[seq])
                    t = clock()
                    alloc.mark_blocks_as_accessed(ids[seq], x)
                    samples["mark_blocks_as_accessed"].append(clock() - t)
                elif op == ALLOC_IMM:
                    chain = blocks[seq]
                    prev = chain[-1] if chain else None
                    t = clock()
                    new = alloc.allocate_immutable_blocks(prev, x, y)
                    samples["allocate_immutable_blocks"].append(clock() - t)
                    chain.extend(new)
                    ids[seq].extend([block.block_id for block in new])
                    self.out_ids.extend(ids[seq][-len(new):] if new else [])
                elif op == FIND_CACHED:
                    self.ncached[seq] = len(self._timed_prefix(seq, x, y, samples, clock))
                elif op == COMMON:
                    arg = [ids[s][:self.ncached[s]] for s in x]
                    t = clock()
                    alloc.get_common_computed_block_ids(arg)
                    samples["get_common_computed_block_ids"].append(clock() - t)
                elif op == ACCESS:
                    held = ids[seq]
                    t = clock()
                    alloc.mark_blocks_as_accessed(held, x)
                    samples["mark_blocks_as_accessed"].append(clock() - t)
                else:
                    # the rare ones: timed with the driver's bookkeeping around them
                    t = clock()
                    self._step(op, seq, x, y)
                    samples[CALLS[op][0]].append(clock() - t)
            except Exception as exc:
                raise ReplayError(self.position + position, instructions[position], exc) from exc
        self.position += len(instructions)
        return {name: values for name, values in samples.items() if values}

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
    the planning allocator ran, fused."""
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
    program.instructions = fuse(program.instructions)
    return Plan(workload=workload, program=program)
