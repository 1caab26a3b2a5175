"""A seeded serving workload for timing allocators: what a scheduler asks of
the KV-cache block allocator, as plain data.

:func:`generate` runs a small continuous-batching scheduler, modelled on
vLLM 0.8.5's v0 scheduler and block manager, over a seeded stream of
requests and returns the operations it issued, sequence by sequence:

* requests share system prompts drawn with Zipf popularity; some carry an
  extra hash (a LoRA adapter), so equal tokens under different adapters do
  not share blocks;
* conversations have several turns: a follow-up arrives a few steps after
  the previous turn finished and its prompt is the earlier prompt, the
  answer and a new user turn;
* some requests sample ``n > 1`` answers in parallel: the prompt is
  allocated once and forked ``n - 1`` times;
* decoding appends one token per running sequence per step;
* admission control asks ``get_num_free_blocks`` (and, to resume a swapped
  group, ``get_num_full_blocks_touched``) before admitting; under memory
  pressure the youngest running group is preempted (a single sequence by
  recompute: freed and re-queued; a parallel group by swap-out);
* every step does the block manager's bookkeeping: the cached prefix of
  every scheduled sequence, the common computed prefix of its group, and
  ``mark_blocks_as_computed``;
* with ``access_heavy`` (the *access-heavy* workload), every running
  sequence also marks all its blocks accessed at every step, as a scheduler
  without vLLM's deferral does (vLLM 0.8.5 records a sequence's access time
  only when the sequence is freed or swapped out).

The requests depend only on the seed.  Which operations follow depends on
the allocator's answers to those queries, and only on them: the scheduler
asks them through a *probe* (a callable that executes each operation on some
allocator and returns the answer of a query), and each query operation
records the answer it got.  Every correct allocator gives the same answers,
so the same list of operations is valid for all of them; a replay can check
its target's answers against the recorded ones.

Operations are tuples whose first item is the kind (see :data:`OP_KINDS`)::

    ("query_free", expected)                 get_num_free_blocks()
    ("query_touched", (seq, ...), expected)  get_num_full_blocks_touched(their blocks)
    ("admit", seq, tokens, extra_hash)       the prompt's blocks for a new sequence
    ("fork", parent_seq, child_seq)          the child shares the parent's blocks
    ("append", seq, token)                   one decoded token
    ("scheduled", (seq, ...))                cached prefixes + common computed ids
    ("mark_computed",)                       mark_blocks_as_computed([])
    ("free", seq, now)                       record access time, free every block
    ("swap_out", seq, now)                   record access time, swap the blocks out
    ("swap_in", seq)                         swap the sequence's blocks back in
    ("access", seq, now)                     mark every block accessed (access_heavy)

``expected`` is None in the operation the scheduler passes to the probe and
the probe's answer in the operation it keeps.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Deque, Dict, List, Optional, Tuple

Op = Tuple[object, ...]
Probe = Callable[[Op], Optional[int]]

OP_KINDS = (
    "query_free", "query_touched", "admit", "fork", "append", "scheduled",
    "mark_computed", "free", "swap_out", "swap_in", "access",
)

#: The workloads by name (``prefixcache bench --workload NAME``): the main
#: one, and the access-heavy one (:attr:`WorkloadConfig.access_heavy`).
MAIN = "main"
ACCESS_HEAVY = "access-heavy"
WORKLOADS = (MAIN, ACCESS_HEAVY)


@dataclass(frozen=True)
class WorkloadConfig:
    """The knobs of a workload.  ``num_blocks`` and ``block_size`` are the
    allocator's; ``max_running`` caps the running sequences (vLLM's
    ``max_num_seqs``); ``num_requests`` counts turns, follow-ups included.
    ``access_heavy``: every running sequence marks all its blocks accessed
    at every scheduler step (the access-heavy workload)."""

    num_blocks: int = 1024
    block_size: int = 16
    max_running: int = 12
    num_requests: int = 400
    seed: int = 0
    num_system_prompts: int = 48
    zipf_s: float = 1.1
    system_prompt_tokens: Tuple[int, int] = (16, 480)
    user_tokens: Tuple[int, int] = (4, 160)
    output_tokens: Tuple[int, int] = (8, 256)
    followup_prob: float = 0.4
    max_turns: int = 4
    think_steps: Tuple[int, int] = (1, 12)
    parallel_prob: float = 0.1
    parallel_n: Tuple[int, ...] = (2, 3, 4)
    extra_hash_prob: float = 0.1
    num_extra_hashes: int = 3
    vocab_size: int = 32000
    arrival_rate: float = 0.12
    max_batched_tokens: int = 2048
    watermark: float = 0.01
    access_heavy: bool = False

    @property
    def workload_name(self) -> str:
        """``"access-heavy"`` or ``"main"``: which workload this is."""
        return ACCESS_HEAVY if self.access_heavy else MAIN

    def validate(self) -> None:
        """Raise ValueError when a knob is out of range."""
        if self.num_blocks < 1 or self.block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        if self.max_running < 1 or self.num_requests < 0:
            raise ValueError("max_running must be >= 1 and num_requests >= 0")
        for low, high in (self.system_prompt_tokens, self.user_tokens, self.output_tokens,
                          self.think_steps):
            if low < 0 or high < low:
                raise ValueError(f"bad range ({low}, {high})")
        if self.output_tokens[0] < 1:
            raise ValueError("every request generates at least one token")
        if not 0 < self.arrival_rate:
            raise ValueError("arrival_rate must be > 0")


@dataclass
class WorkloadStats:
    """What the scheduler did while generating."""

    steps: int = 0
    turns: int = 0
    conversations: int = 0
    admitted: int = 0
    forks: int = 0
    decoded_tokens: int = 0
    recompute_preemptions: int = 0
    swap_preemptions: int = 0
    swap_ins: int = 0
    dropped: int = 0
    peak_running: int = 0


@dataclass
class Workload:
    """The generated operations, with the configuration and statistics."""

    config: WorkloadConfig
    ops: List[Op]
    stats: WorkloadStats
    num_seqs: int


# -- the requests (a function of the seed only) ---------------------------------------


@dataclass
class _Turn:
    """One request: a turn of a conversation."""

    conversation: int
    index: int
    user: List[int]
    samples: List[List[int]]  # the tokens each parallel sample generates


@dataclass
class _Conversation:
    system: List[int]
    extra_hash: Optional[int]
    turns: List[_Turn]
    arrival: int


def _tokens(rng: random.Random, vocab: int, bounds: Tuple[int, int]) -> List[int]:
    return [rng.randrange(vocab) for _ in range(rng.randint(*bounds))]


def _conversations(config: WorkloadConfig) -> List[_Conversation]:
    """The seeded conversations, ``num_requests`` turns in all, in arrival order."""
    rng = random.Random(config.seed)
    vocab = config.vocab_size
    systems = [_tokens(rng, vocab, config.system_prompt_tokens)
               for _ in range(config.num_system_prompts)]
    weights = list(itertools.accumulate(
        1.0 / (rank + 1) ** config.zipf_s for rank in range(len(systems))))
    conversations: List[_Conversation] = []
    turns_left = config.num_requests
    clock = 0.0
    while turns_left > 0:
        clock += rng.expovariate(config.arrival_rate)
        system = systems[bisect.bisect_left(weights, rng.random() * weights[-1])]
        extra_hash = None
        if rng.random() < config.extra_hash_prob:
            extra_hash = 1 + rng.randrange(config.num_extra_hashes)
        num_turns = 1
        while num_turns < config.max_turns and rng.random() < config.followup_prob:
            num_turns += 1
        num_turns = min(num_turns, turns_left)
        turns = []
        for index in range(num_turns):
            n = 1
            if rng.random() < config.parallel_prob:
                n = min(rng.choice(config.parallel_n), config.max_running)
            samples = [_tokens(rng, vocab, config.output_tokens) for _ in range(n)]
            turns.append(_Turn(len(conversations), index,
                               _tokens(rng, vocab, config.user_tokens), samples))
        conversations.append(_Conversation(list(system), extra_hash, turns, int(clock)))
        turns_left -= num_turns
    return conversations


# -- the scheduler --------------------------------------------------------------------


@dataclass
class _Seq:
    seq_id: int
    output: List[int]
    generated: int = 0
    last_scheduled: float = -1.0
    freed: bool = False


@dataclass
class _Group:
    """A request being served: its sequences (one per parallel sample)."""

    turn: _Turn
    prompt: List[int]  # the original prompt of the turn
    extra_hash: Optional[int]
    seqs: List[_Seq] = field(default_factory=list)
    resume: Optional[List[int]] = None  # after a recompute preemption: the tokens so far

    @property
    def live(self) -> List[_Seq]:
        """The sequences still generating (not yet freed)."""
        return [seq for seq in self.seqs if not seq.freed]


class _Scheduler:
    """The scheduler loop; every operation goes through ``emit``."""

    def __init__(self, config: WorkloadConfig, probe: Probe) -> None:
        self.config = config
        self.probe = probe
        self.ops: List[Op] = []
        self.stats = WorkloadStats()
        self.next_seq = 0
        self.watermark = int(config.watermark * config.num_blocks)
        self.running: List[_Group] = []
        self.waiting: Deque[_Group] = deque()
        self.swapped: Deque[_Group] = deque()
        self.arrivals: List[Tuple[int, int, _Group]] = []  # (step, order, group), a heap
        self.order = itertools.count()
        self.conversations: Dict[int, _Conversation] = {}
        self.rng = random.Random(config.seed ^ 0x5EED)

    # -- emitting operations ------------------------------------------------------

    def emit(self, op: Op) -> None:
        self.probe(op)
        self.ops.append(op)

    def query(self, op: Op) -> int:
        answer = self.probe(op)
        if answer is None:
            raise RuntimeError(f"the probe gave no answer to {op[0]}")
        self.ops.append(op[:-1] + (answer,))
        return answer

    def free_blocks(self) -> int:
        return self.query(("query_free", None))

    # -- arrivals -------------------------------------------------------------------

    def arrive(self, step: int, group: _Group) -> None:
        heapq.heappush(self.arrivals, (step, next(self.order), group))

    def new_group(self, conversation: _Conversation, turn: _Turn, history: List[int]) -> _Group:
        prompt = history + turn.user
        group = _Group(turn, prompt, conversation.extra_hash)
        for output in turn.samples:
            group.seqs.append(_Seq(self.next_seq, output))
            self.next_seq += 1
        return group

    # -- the phases of a step ---------------------------------------------------------

    def preempt(self, group: _Group, now: float) -> None:
        """Take the youngest running group off the GPU: recompute a single
        sequence (free it, re-queue it first), swap out a parallel group."""
        self.running.remove(group)
        live = group.live
        if len(live) == 1:
            seq = live[0]
            self.emit(("free", seq.seq_id, seq.last_scheduled))
            group.resume = group.prompt + seq.output[:seq.generated]
            self.waiting.appendleft(group)
            self.stats.recompute_preemptions += 1
        else:
            for seq in live:
                self.emit(("swap_out", seq.seq_id, seq.last_scheduled))
            self.swapped.append(group)
            self.stats.swap_preemptions += 1

    def decode(self, now: float) -> None:
        """Each running group, oldest first: make room for one token per live
        sequence (preempting the youngest while the free count is short),
        then append the tokens."""
        index = 0
        while index < len(self.running):
            group = self.running[index]
            live = group.live
            while self.free_blocks() < len(live):
                victim = self.running[-1]
                self.preempt(victim, now)
                if victim is group:
                    break
            if group not in self.running:
                continue
            for seq in live:
                self.emit(("append", seq.seq_id, seq.output[seq.generated]))
                seq.generated += 1
                self.stats.decoded_tokens += 1
            index += 1

    def running_seqs(self) -> int:
        return sum(len(group.live) for group in self.running)

    def swap_in(self) -> None:
        """Resume swapped groups, first swapped first, while they fit."""
        total = self.config.num_blocks
        while self.swapped:
            group = self.swapped[0]
            live = group.live
            if self.running_seqs() + len(live) > self.config.max_running:
                return
            seq_ids = tuple(seq.seq_id for seq in live)
            touched = self.query(("query_touched", seq_ids, None))
            needed = touched + 2 * len(live)
            if needed > total - self.watermark:
                self.swapped.popleft()  # can never fit: abandoned (its blocks are detached)
                self.stats.dropped += 1
                continue
            if self.free_blocks() - needed < self.watermark:
                return
            self.swapped.popleft()
            for seq_id in seq_ids:
                self.emit(("swap_in", seq_id))
            self.running.append(group)
            self.stats.swap_ins += 1

    def admit(self) -> None:
        """Admit waiting groups, first come first served, within the token
        budget and the running-sequence cap, while the prompt fits above the
        watermark (vLLM's ``can_allocate``)."""
        size = self.config.block_size
        budget = self.config.max_batched_tokens
        admitted = 0
        while self.waiting and not self.swapped:
            group = self.waiting[0]
            tokens = group.resume if group.resume is not None else group.prompt
            live = group.live
            if self.running_seqs() + len(live) > self.config.max_running:
                return
            if admitted and len(tokens) > budget:
                return
            needed = -(-len(tokens) // size)
            if self.config.num_blocks - needed < self.watermark:
                self.waiting.popleft()  # can never fit: dropped, the conversation ends
                self.stats.dropped += 1
                continue
            if self.free_blocks() - needed < self.watermark:
                return
            self.waiting.popleft()
            first = live[0]
            self.emit(("admit", first.seq_id, list(tokens), group.extra_hash))
            for seq in live[1:]:
                self.emit(("fork", first.seq_id, seq.seq_id))
                self.stats.forks += 1
            self.running.append(group)
            self.stats.admitted += 1
            budget -= len(tokens)
            admitted += 1

    def bookkeeping(self, now: float) -> None:
        """The block manager's per-step queries for every scheduled group
        (and, access-heavy, every running sequence's access marks)."""
        access_heavy = self.config.access_heavy
        for group in self.running:
            live = group.live
            for seq in live:
                seq.last_scheduled = now
            if live:
                self.emit(("scheduled", tuple(seq.seq_id for seq in live)))
            if access_heavy:
                for seq in live:
                    self.emit(("access", seq.seq_id, now))
        for _ in self.running:
            self.emit(("mark_computed",))

    def finish(self, step: int, now: float) -> None:
        """Free the sequences that generated their last token; a group with
        none left is done and its conversation's next turn arrives later."""
        for group in list(self.running):
            for seq in group.live:
                if seq.generated == len(seq.output):
                    self.emit(("free", seq.seq_id, now))
                    seq.freed = True
            if not group.live:
                self.running.remove(group)
                self.next_turn(group, step)

    def next_turn(self, group: _Group, step: int) -> None:
        """Schedule the arrival of the conversation's next turn, if any."""
        conversation = self.conversations[group.turn.conversation]
        following = group.turn.index + 1
        if following < len(conversation.turns):
            history = group.prompt + group.seqs[0].output
            nxt = self.new_group(conversation, conversation.turns[following], history)
            self.arrive(step + self.rng.randint(*self.config.think_steps), nxt)

    # -- the loop -----------------------------------------------------------------------

    def run(self) -> None:
        conversations = _conversations(self.config)
        for number, conversation in enumerate(conversations):
            self.conversations[number] = conversation
            self.arrive(conversation.arrival,
                        self.new_group(conversation, conversation.turns[0], conversation.system))
        self.stats.conversations = len(conversations)
        self.stats.turns = sum(len(c.turns) for c in conversations)
        step = 0
        idle_limit = 10_000
        idle = 0
        while self.arrivals or self.waiting or self.swapped or self.running:
            step += 1
            now = float(step)
            while self.arrivals and self.arrivals[0][0] <= step:
                self.waiting.append(heapq.heappop(self.arrivals)[2])
            before = len(self.ops)
            self.decode(now)
            self.swap_in()
            self.admit()
            self.stats.peak_running = max(self.stats.peak_running, self.running_seqs())
            self.bookkeeping(now)
            self.finish(step, now)
            idle = idle + 1 if len(self.ops) == before and not self.arrivals else 0
            if idle > idle_limit:
                raise RuntimeError("the scheduler made no progress (a request can never fit)")
        self.stats.steps = step


def generate(config: WorkloadConfig, probe: Probe) -> Workload:
    """Run the scheduler over the seeded requests of ``config``.

    ``probe(op)`` is called with every operation, in order, before it is
    recorded; it must execute it on an allocator of ``config``'s size and
    return the answer for the query kinds (``query_free``,
    ``query_touched``).  Raises ValueError for a bad config and whatever
    the probe raises."""
    config.validate()
    scheduler = _Scheduler(config, probe)
    scheduler.run()
    return Workload(config=config, ops=scheduler.ops, stats=scheduler.stats,
                    num_seqs=scheduler.next_seq)
