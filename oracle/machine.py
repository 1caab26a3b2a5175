"""The Hypothesis state machine: random call sequences, judged step by step.

:class:`AllocatorMachine` is a ``RuleBasedStateMachine`` whose rules are the
operations of the allocator API (one rule per operation, and the caller
mistakes as a rule of their own, on only when mistakes are); each rule
builds a :class:`~prefixcache.oracle.trace.Step` and hands it to the
:class:`~prefixcache.oracle.driver.Driver`, which runs it on the target and
on the model and raises a Violation when they part.  :func:`make_machine`
gives the subclass that judges one target (its :class:`MachineConfig`).

Strategies aim at the hard states in a few steps: pools of mostly 1-6
blocks of 1-3 tokens (sometimes up to 32 blocks of up to 16 tokens, and now
and then a pool of more than a thousand blocks, where a rule builds a chain
longer than Python's recursion limit), tokens from {0, 1, 2}, prompts drawn
from three shared "system prompts", timestamps 0-3 (ties and out-of-order
times), two tenants (extra hashes None and 7).

Search: half the examples are *swarm* examples (Groce et al., ISSTA 2012):
each rule but ``new_sequence`` and ``caller_mistakes`` is switched off with
probability one half, so
that some examples never free and others never mark accesses.  Each example
reports how many distinct transitions it reached to Hypothesis's
``target()``, which then favours examples that reach more.

A Violation whose signature the campaign already knows (a baseline entry,
or a finding of an earlier batch) halts the example quietly: the rest of its
steps do nothing, so the search goes on past it.  A ``hang`` is recorded
with its trace at once and halts the example too (shrinking a call that
takes the whole call timeout to fail would take the rest of the budget).
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Dict, Generic, List, Optional, Sequence, TypeVar, cast

from hypothesis import event, target
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from ..spec.error_table import ErrorCase
from ..spec.semantics import Semantics
from .driver import Driver, Lockstep
from .held import Seq
from .mistakes import possible_rows, provoke, rows_for
from .targets import Target
from .trace import Step
from .trackers import COMPUTED, LAST_ACCESS
from .violations import Violation, as_finding

#: Shared prompt prefixes, so that different sequences share blocks.
PROMPTS = ((0,) * 9, (0, 1) * 5, (1, 2, 0) * 3)
TOKENS = st.integers(0, 2)
TIMES = st.integers(0, 3)
TENANTS = st.sampled_from([None, None, 7])
#: The pool of a long-chain example: room for a chain longer than Python's
#: default recursion limit (1,000), and a few blocks more.
LONG_POOL = 1_040
LONG_CHAIN = 1_010
_T = TypeVar("_T")
_D = TypeVar("_D", bound=Lockstep)


@dataclass
class Stats:
    """What every machine of one campaign has done, summed."""

    steps: int = 0
    #: of ``steps``, those run while Hypothesis shrank a failing example
    #: (after ``failing_since`` in a batch): not the search's checking
    shrink_steps: int = 0
    examples: int = 0
    coverage: Counter[str] = field(default_factory=Counter)
    #: signature -> how often a known finding halted an example
    known_seen: Counter[str] = field(default_factory=Counter)
    #: hangs recorded as they happened (they halt the example, unshrunk)
    hangs: List[Violation] = field(default_factory=list)
    #: the shortest violation seen of each new signature (the campaign
    #: empties it each batch): what a batch cut short while shrinking found
    seen: Dict[str, Violation] = field(default_factory=dict)
    #: when the first of them was seen (time.monotonic())
    failing_since: Optional[float] = None
    #: when one of them last got shorter (time.monotonic())
    improved_at: Optional[float] = None


@dataclass
class MachineConfig:
    """What one machine class judges and how."""

    target: Target
    mistakes: bool = True
    white_box: bool = True
    semantics: Semantics = field(default_factory=Semantics)
    call_timeout: Optional[float] = None
    stats: Stats = field(default_factory=Stats)
    #: signatures that halt an example instead of failing it (mutable:
    #: the campaign adds each finding between batches)
    known: set[str] = field(default_factory=set)
    #: time.monotonic() past which the next step ends the batch
    #: (:class:`OutOfTime`), shrinking or not: a campaign's time budget ends
    #: within one step
    deadline: Optional[float] = None
    #: seconds without a shorter failing example after which the next step
    #: ends Hypothesis's shrinking (:class:`OutOfTime`); None: no limit
    shrink_stall: Optional[float] = None


def _length(violation: Violation) -> int:
    return len(violation.trace.steps) if violation.trace is not None else 0


class _Halted(Exception):
    """The example met a known finding: its remaining steps do nothing."""


class OutOfTime(KeyboardInterrupt):
    """The campaign's time is up: raised through Hypothesis to end the batch
    at once.  A KeyboardInterrupt, the one exception Hypothesis passes on
    untouched (it neither takes it for a failure nor records the cut-off
    example, which would make later examples look inconsistent)."""


def machine_rule(*, when: Optional[Callable[[Any], Any]] = None, swarm: bool = True,
                 **strategies: Any) -> Callable[[Callable[..., None]], Any]:
    """``@rule(**strategies)`` whose body does nothing once the example is
    halted, which runs only ``when`` the machine's state allows it (a
    precondition) and (``swarm``) which a swarm example may switch off.
    Both tests are one precondition, a named function: Hypothesis pays per
    precondition at every rule choice, and more for a lambda's description."""

    def decorate(body: Callable[..., None]) -> Any:
        @functools.wraps(body)
        def run(self: AllocatorMachine, *args: Any, **kwargs: Any) -> None:
            if self.halted:
                return
            try:
                body(self, *args, **kwargs)
            except _Halted:
                pass

        made: Any = cast(Any, rule(**strategies))(run)
        name = body.__name__
        if not swarm and when is None:
            return made

        def allowed(self: AllocatorMachine) -> Any:
            if swarm and name in self.off:
                return False
            return True if when is None else when(self)

        return precondition(allowed)(made)

    return decorate


def swarm_rules(machine: type, *always_on: str) -> tuple[str, ...]:
    """The rules of ``machine`` a swarm example may switch off: all but ``always_on``."""
    return tuple(sorted(name for name, value in vars(machine).items()
                        if hasattr(value, "hypothesis_stateful_rule") and name not in always_on))


class LockstepMachine(RuleBasedStateMachine, Generic[_D]):
    """What the machines of both profiles share: ``config``, the driver, the
    rules a swarm example switched off, halting on known findings, and the
    distinct transitions an example reached."""

    config: ClassVar[MachineConfig]

    def __init__(self) -> None:
        super().__init__()
        self.driver: Optional[_D] = None
        self.off: frozenset[str] = frozenset()
        self.halted = False
        self.reached: set[str] = set()
        self.config.stats.examples += 1

    @property
    def d(self) -> _D:
        """The driver (RuntimeError before ``begin``)."""
        if self.driver is None:
            raise RuntimeError("the machine has no driver before setup")
        return self.driver

    def draw_swarm(self, data: st.DataObject, rules: Sequence[str]) -> None:
        """Whether this is a swarm example and, if so, which of ``rules`` it switches off."""
        if data.draw(st.booleans(), label="swarm"):
            self.off = frozenset(name for name in rules
                                 if data.draw(st.booleans(), label=f"{name} off"))

    def run(self, op: str, **args: Any) -> Step:
        """Run one step through the driver; a Violation of a known
        signature halts the example, a hang is recorded and halts it, any
        other is raised as a finding of its own class."""
        if self.halted:
            raise _Halted()
        config = self.config
        now = time.monotonic()
        if config.deadline is not None and now > config.deadline:
            raise OutOfTime()
        improved = config.stats.improved_at
        if config.shrink_stall is not None and improved is not None \
                and now - improved > config.shrink_stall:
            raise OutOfTime()
        step = Step(op=op, args=args)
        found: Optional[Violation] = None
        stats = self.config.stats
        try:
            self.d.run(step)
        except Violation as violation:
            found = violation
        finally:
            stats.steps += 1
            if stats.failing_since is not None:
                stats.shrink_steps += 1
            for label in self.d.step_events:
                event(label)
                stats.coverage[label] += 1
                self.reached.add(label)
        if found is not None:
            self._judge(found)
        return step

    def _judge(self, violation: Violation) -> None:
        known = self.config.known
        if violation.signature in known or violation.category == "hang":
            self.halted = True
            if violation.signature in known:
                self.config.stats.known_seen[violation.signature] += 1
            else:
                known.add(violation.signature)
                self.config.stats.hangs.append(violation)
            raise _Halted()
        stats = self.config.stats
        if stats.failing_since is None:
            stats.failing_since = time.monotonic()
        old = stats.seen.get(violation.signature)
        if old is None or _length(violation) < _length(old):
            stats.seen[violation.signature] = violation
            stats.improved_at = time.monotonic()
        raise as_finding(violation)

    def teardown(self) -> None:
        """Tell Hypothesis how many distinct transitions this example reached."""
        if self.driver is not None:
            target(float(len(self.reached)), label="distinct transitions")


class AllocatorMachine(LockstepMachine[Driver]):
    """Drives a target and the model in lockstep (``config`` says which
    target and how; :func:`make_machine` makes the subclass)."""

    def __init__(self) -> None:
        super().__init__()
        self.seqs: List[Seq] = []
        self.swapped: List[Seq] = []
        self.detached: List[str] = []
        self.history: List[List[str]] = []
        self.mistake_order: Optional[List[ErrorCase]] = None  # the rows, this example's order
        self.asked: set[int] = set()  # sequence ids the ComputedBlocksTracker knows
        self.access_tracked: set[int] = set()  # and the LastAccessBlocksTracker
        self.decoding: set[int] = set()  # sequence ids appended to (out of prefill)

    # -- plumbing ----------------------------------------------------------

    def ok(self) -> bool:
        return self.d.refused is None

    def handle(self, name: str) -> Any:
        return self.d.handles[name]

    def block_size(self) -> int:
        return self.d.trace.block_size

    def pick(self, data: st.DataObject, items: List[_T], label: str = "which") -> _T:
        return items[data.draw(st.integers(0, len(items) - 1), label=label)]

    def markable(self, seqs: List[Seq]) -> List[Seq]:
        """The sequences of ``seqs`` whose ids ``mark_blocks_as_accessed``
        takes: those on the GPU (a device pair passes every id to its GPU
        allocator, so the ids of a sequence swapped to the CPU are a caller
        mistake there)."""
        return [s for s in seqs if s.device == "GPU"]

    def ids(self, seq: Seq) -> List[int]:
        return [self.handle(n).block_id for n in seq.names]

    def model_state(self, device: str) -> Any:
        """The model's abstract state of ``device`` ("GPU" or "CPU"; the
        one device of a single allocator)."""
        return self.d.model_states()[device if self.d.kind == "cpu_gpu" else ""]

    def alloc_args(self, seq_device: str) -> Dict[str, Any]:
        return {"device": seq_device} if self.d.kind == "cpu_gpu" else {}

    # -- setup ---------------------------------------------------------------

    @initialize(data=st.data())
    def begin(self, data: st.DataObject) -> None:
        """Draw the pool (mostly tiny), the block size and, in a swarm
        example, the rules switched off; then build the target and model."""
        size_class = data.draw(st.integers(0, 63), label="pool size class")
        if size_class == 63:
            num_blocks = LONG_POOL
        elif size_class >= 48:
            num_blocks = data.draw(st.integers(7, 32), label="num_blocks")
        else:
            num_blocks = data.draw(st.integers(1, 6), label="num_blocks")
        large = num_blocks != LONG_POOL and data.draw(st.integers(0, 7), label="size class") == 7
        block_size = data.draw(st.integers(4, 16) if large else st.integers(1, 3),
                               label="block_size")
        self.draw_swarm(data, SWARM_RULES)
        self.setup(num_blocks, block_size)

    def setup(self, num_blocks: int, block_size: int) -> None:
        """A fresh target and model of ``num_blocks`` ids of ``block_size`` tokens."""
        config = self.config
        self.driver = Driver(config.target, num_blocks, block_size,
                             white_box=config.white_box, semantics=config.semantics,
                             mistakes=config.mistakes, call_timeout=config.call_timeout)

    # -- valid operations -------------------------------------------------------

    @machine_rule(swarm=False, data=st.data())
    def new_sequence(self, data: Any) -> None:
        """A request: full prompt blocks (allocate_immutable_block one by
        one, or allocate_immutable_blocks for all of them or, continuing the
        chain, for those after the first few), then a mutable tail block that
        gets the rest of the prompt."""
        size = self.block_size()
        prompt = data.draw(st.sampled_from(PROMPTS), label="prompt")
        full = data.draw(st.integers(0, 3), label="full blocks")
        tail = data.draw(st.lists(TOKENS, max_size=size - 1), label="tail")
        extra = data.draw(TENANTS, label="extra_hash")
        device = data.draw(st.sampled_from(["GPU", "GPU", "CPU"])) \
            if self.d.kind == "cpu_gpu" else "GPU"
        tokens = list((prompt * (1 + (full * size) // len(prompt)))[: full * size])
        chunks = [tokens[i:i + size] for i in range(0, len(tokens), size)]
        seq = Seq([], extra, device)
        kw = self.alloc_args(device)
        try:
            # the first `cut` blocks one by one; the rest, if any, in one call
            # that continues the chain (prev_block: the last of them)
            cut = len(chunks)
            if chunks and data.draw(st.booleans(), label="one call"):
                cut = data.draw(st.integers(0, len(chunks) - 1), label="one call from")
            for chunk in chunks[:cut]:
                prev = seq.names[-1] if seq.names else None
                step = self.run("allocate_immutable_block", prev_block=prev,
                                token_ids=chunk, extra_hash=extra, **kw)
                if not self.ok():
                    break
                seq.names += step.out
            if cut < len(chunks) and len(seq.names) == cut:
                step = self.run("allocate_immutable_blocks",
                                prev_block=seq.names[-1] if seq.names else None,
                                block_token_ids=chunks[cut:], extra_hash=extra, **kw)
                if self.ok():
                    seq.names += step.out
            if (tail or not chunks) and len(seq.names) == len(chunks):
                prev = seq.names[-1] if seq.names else None
                step = self.run("allocate_mutable_block", prev_block=prev, extra_hash=extra,
                                **kw)
                if self.ok():
                    seq.names += step.out
                    if tail:
                        self.run("append_token_ids", block=step.out[0], token_ids=tail)
        finally:
            self._hold(seq)

    def _hold(self, seq: Seq) -> None:
        if seq.names:
            self.seqs.append(seq)
            self.history.append(seq.names)

    @machine_rule(when=lambda self: self.d.trace.num_blocks >= LONG_POOL, data=st.data())
    def long_chain(self, data: st.DataObject) -> None:
        """A chain longer than Python's recursion limit, in one call (a long
        document), forked, counted and asked about: every call that walks a
        whole chain meets one too long to walk by recursion.  These steps
        are checked black-box (results, ids, free counts: reading a state of
        a thousand chained keys every step would cost seconds), and the
        example ends there."""
        size = self.block_size()
        first = data.draw(TOKENS, label="first token")
        chunks = [[first] + [0] * (size - 1)] + [[1] * size for _ in range(LONG_CHAIN - 1)]
        kw = self.alloc_args("GPU")
        self.d.state_checks = False
        step = self.run("allocate_immutable_blocks", prev_block=None, block_token_ids=chunks,
                        extra_hash=None, **kw)
        if self.ok():
            self.run("fork", last_block=step.out[-1])
            self.run("get_num_full_blocks_touched", blocks=step.out, **kw)
            self.run("mark_blocks_as_computed", block_ids=[])
            self.ask_cached_prefix([n for n in step.out if n in self.d.keys], None)
            self.run("free", block=step.out[-1])
        self.halted = True

    @machine_rule(when=lambda self: self.seqs, data=st.data())
    def append(self, data: st.DataObject) -> None:
        """Decode: append tokens to a sequence's last block (a new mutable
        block first when it is full); filling a block promotes it, a
        shared block is copied first."""
        seq = self.pick(data, self.seqs)
        last = self.handle(seq.names[-1])
        if last.is_full:
            step = self.run("allocate_mutable_block", prev_block=seq.names[-1],
                            extra_hash=seq.extra_hash, **self.alloc_args(seq.device))
            if not self.ok():
                return
            seq.names += step.out
            last = self.handle(seq.names[-1])
        room = last.num_empty_slots
        tokens = data.draw(st.lists(TOKENS, min_size=1, max_size=room), label="tokens")
        self.run("append_token_ids", block=seq.names[-1], token_ids=tokens)
        self.decoding.add(seq.serial)

    @machine_rule(data=st.data(),
                  when=lambda self: any(not self.handle(s.names[-1]).is_full for s in self.seqs))
    def block_after_partial(self, data: st.DataObject) -> None:
        """A new block after a block that is not full, then filled: it has no
        content hash and shares with nothing, whatever its tokens (vLLM
        0.8.5 hashed it with None for its parent, so that two different
        prefixes shared it)."""
        seq = self.pick(data, [s for s in self.seqs if not self.handle(s.names[-1]).is_full])
        step = self.run("allocate_mutable_block", prev_block=seq.names[-1],
                        extra_hash=seq.extra_hash, **self.alloc_args(seq.device))
        if not self.ok():
            return
        seq.names += step.out
        size = self.block_size()
        tokens = data.draw(st.lists(TOKENS, min_size=size, max_size=size), label="tokens")
        self.run("append_token_ids", block=step.out[0], token_ids=tokens)

    @machine_rule(when=lambda self: self.seqs, data=st.data())
    def fork(self, data: st.DataObject) -> None:
        """Parallel sampling: a new sequence sharing every block."""
        seq = self.pick(data, self.seqs)
        step = self.run("fork", last_block=seq.names[-1])
        if self.ok():
            self._hold(Seq(step.out, seq.extra_hash, seq.device))

    @machine_rule(when=lambda self: self.seqs, data=st.data())
    def free(self, data: st.DataObject) -> None:
        """A sequence ends: free its blocks (first to last, or the reverse);
        sometimes keep the Block objects (they stay detached)."""
        seq = self.pick(data, self.seqs)
        self.seqs.remove(seq)
        names = seq.names if data.draw(st.booleans(), label="forward") else seq.names[::-1]
        keep = (self.config.mistakes and self.d.kind != "cpu_gpu"
                and data.draw(st.booleans(), label="keep_block_object"))
        for name in names:
            if keep:
                self.run("free", block=name, keep_block_object=True)
                self.detached.append(name)
            else:
                self.run("free", block=name)

    @machine_rule(when=lambda self: self.seqs, data=st.data())
    def mark_accessed(self, data: st.DataObject) -> None:
        """Record an access time for a sequence's blocks (ties and
        out-of-order times on purpose)."""
        markable = self.markable(self.seqs)
        if not markable:
            return
        seq = self.pick(data, markable)
        self.run("mark_blocks_as_accessed", block_ids=self.ids(seq),
                 now=data.draw(TIMES, label="now"))

    @machine_rule(data=st.data())
    def mark_evictable_accessed(self, data: st.DataObject) -> None:
        """Touch cached blocks that wait in the evictor: the evictor must
        reorder exactly (vLLM's heap once did not)."""
        waiting = [e.block_id for e in self.model_state("GPU").evictor]
        if not waiting:
            return
        ids = data.draw(st.lists(st.sampled_from(waiting), min_size=1, max_size=3,
                                 unique=True), label="evictable ids")
        self.run("mark_blocks_as_accessed", block_ids=ids, now=data.draw(TIMES, label="now"))

    @machine_rule(data=st.data())
    def reuse_cached(self, data: st.DataObject) -> None:
        """A cached prompt asked for again: a waiting first block hit and
        released many times (``churn``), or a running sequence's prompt in
        one call (``same_prompt_again``)."""
        if data.draw(st.booleans(), label="churn"):
            self.churn(data)
        else:
            self.same_prompt_again(data)

    def churn(self, data: st.DataObject) -> None:
        """A cached first block that waits in the evictor is hit and
        released again, a few times or up to two hundred: every release
        re-enters the evictor, so a lazy evictor's stale entries pile up
        until it rebuilds itself (vLLM's heap does past 50 per entry); then,
        sometimes, new blocks until one is evicted."""
        firsts = [e.content for e in self.model_state("GPU").evictor
                  if e.content is not None and len(e.content) == 1]
        if not firsts:
            return
        (extra, tokens), = data.draw(st.sampled_from(firsts), label="cached first block")
        times = data.draw(st.one_of(st.integers(1, 3), st.integers(51, 200)), label="times")
        for _ in range(times):
            step = self.run("allocate_immutable_block", prev_block=None, token_ids=list(tokens),
                            extra_hash=extra, **self.alloc_args("GPU"))
            if not self.ok():
                return
            self.run("free", block=step.out[0])
        if data.draw(st.booleans(), label="then evict"):
            self.fill("GPU", 1)

    def fill(self, device: str, evictions: int) -> None:
        """New one-block sequences on ``device`` until every id that is
        free without an eviction is taken, and ``evictions`` more."""
        state = self.model_state(device)
        for _ in range(state.reported_free - len(state.evictor) + evictions):
            step = self.run("allocate_mutable_block", prev_block=None, extra_hash=None,
                            **self.alloc_args(device))
            if not self.ok():
                return
            self._hold(Seq(step.out, None, device))

    def same_prompt_again(self, data: st.DataObject) -> None:
        """A second request with a running one's prompt: its full blocks in
        one allocate_immutable_blocks call, every block a hit, so that the
        call needs no free id, even on a pool filled first (sometimes: every
        free id, evictable ones included, taken by new blocks)."""
        cached = [s for s in self.seqs if self.handle(s.names[0]).content_key is not None]
        if not cached:
            return
        seq = self.pick(data, cached)
        prompt: List[List[int]] = []
        for name in seq.names:
            handle = self.handle(name)
            if handle.content_key is None:
                break
            prompt.append(list(handle.token_ids))
        if data.draw(st.booleans(), label="full pool"):
            self.fill(seq.device, len(self.model_state(seq.device).evictor))
        step = self.run("allocate_immutable_blocks", prev_block=None, block_token_ids=prompt,
                        extra_hash=seq.extra_hash, **self.alloc_args(seq.device))
        if self.ok():
            self._hold(Seq(step.out, seq.extra_hash, seq.device))

    @machine_rule(data=st.data(),
                  when=lambda self: any(not self.handle(s.names[-1]).is_full for s in self.seqs))
    def fork_and_diverge(self, data: st.DataObject) -> None:
        """Parallel sampling that diverges at once: fork a sequence whose
        last block is partial and append to the copy (copy-on-write)."""
        seq = self.pick(data, [s for s in self.seqs if not self.handle(s.names[-1]).is_full])
        step = self.run("fork", last_block=seq.names[-1])
        if not self.ok():
            return
        copy = Seq(step.out, seq.extra_hash, seq.device)
        self._hold(copy)
        room = self.handle(copy.names[-1]).num_empty_slots
        tokens = data.draw(st.lists(TOKENS, min_size=1, max_size=room), label="tokens")
        self.run("append_token_ids", block=copy.names[-1], token_ids=tokens)

    @machine_rule(data=st.data(),
                  when=lambda self: any(self.handle(s.names[0]).is_full for s in self.seqs))
    def duplicate_by_append(self, data: st.DataObject) -> None:
        """Fill a new mutable block with the tokens of a cached first block:
        promotion onto an already cached block (the new id is released)."""
        seq = self.pick(data, [s for s in self.seqs if self.handle(s.names[0]).is_full])
        tokens = list(self.handle(seq.names[0]).token_ids)
        step = self.run("allocate_mutable_block", prev_block=None, extra_hash=seq.extra_hash,
                        **self.alloc_args(seq.device))
        if not self.ok():
            return
        copy = Seq(step.out, seq.extra_hash, seq.device)
        self._hold(copy)
        self.run("append_token_ids", block=copy.names[0], token_ids=tokens)

    @machine_rule(when=lambda self: self.seqs, data=st.data())
    def mark_accessed_then_free(self, data: st.DataObject) -> None:
        """vLLM's order at the end of a request: mark accessed, then free."""
        self.mark_accessed(data)
        self.free(data)

    @machine_rule(when=lambda self: any(len(s.names) > 1 for s in self.seqs), data=st.data())
    def age_a_prefix(self, data: st.DataObject) -> None:
        """Give the first blocks of a sequence an older access time than
        the rest, then free it: its prefix is evicted before its tail, so
        a chain can be uncached in front and cached behind."""
        longer = self.markable([s for s in self.seqs if len(s.names) > 1])
        if not longer:
            return
        seq = self.pick(data, longer)
        cut = data.draw(st.integers(1, len(seq.names) - 1), label="cut")
        ids = self.ids(seq)
        self.run("mark_blocks_as_accessed", block_ids=ids[:cut], now=0)
        self.run("mark_blocks_as_accessed", block_ids=ids[cut:], now=3)
        self.seqs.remove(seq)
        for name in seq.names:
            self.run("free", block=name)

    @machine_rule()
    def mark_computed(self) -> None:
        """The scheduled batch ran: touched blocks become computed."""
        self.run("mark_blocks_as_computed", block_ids=[])

    @machine_rule(when=lambda self: self.history, data=st.data())
    def find_cached_prefix(self, data: st.DataObject) -> None:
        """Ask how much of a chain (live or long freed) is cached and
        computed; sometimes in a list reused for other chains, rewritten
        in place (the driver's ``_reused_query``)."""
        names = [n for n in self.pick(data, self.history, "chain") if n in self.d.keys]
        slot = data.draw(st.sampled_from([None, 0]), label="reused list")
        self.ask_cached_prefix(names, slot)

    def ask_cached_prefix(self, names: List[str], slot: Optional[int]) -> None:
        """find_cached_blocks_prefix of the chain ``names``: in the
        chain's own list (``slot`` None) or in the list of ``slot``."""
        args: Dict[str, Any] = {"names": names}
        if slot is not None:
            args["reused_list"] = slot
        self.run("find_cached_blocks_prefix", **args, **self.alloc_args("GPU"))

    @machine_rule(when=lambda self: self.history, data=st.data())
    def scheduler_step(self, data: st.DataObject) -> None:
        """As vLLM's scheduler does every step: ask how much of each recent
        sequence (running, or preempted and waiting) is cached and computed,
        with the sequence's own hash list, grown in place (the driver keeps
        one list per chain), so a target that remembers the lists it was
        asked about must see every eviction and promotion since.  Or, as a
        scheduler that keeps one list per queue position (the newest
        sequence first), in the list of the sequence's position: as a
        sequence arrives, every list is rewritten with another chain."""
        per_position = data.draw(st.booleans(), label="a list per position")
        for position, chain in enumerate(reversed(self.history[-6:])):
            names = [n for n in chain if n in self.d.keys]
            self.ask_cached_prefix(names, position if per_position else None)

    @machine_rule(data=st.data(),
                  when=lambda self: self.d.trackers is not None and (self.seqs or self.swapped))
    def block_manager(self, data: st.DataObject) -> None:
        """vLLM's block manager's helpers around the allocator: cached-token
        counts (``cached_tokens``) or deferred access marks
        (``deferred_access``)."""
        if data.draw(st.booleans(), label="cached tokens"):
            self.cached_tokens(data)
        else:
            self.deferred_access(data)

    def cached_tokens(self, data: st.DataObject) -> None:
        """As vLLM's scheduler does every step: ask the ComputedBlocksTracker
        how many tokens of each recent sequence (running, or swapped out and
        waiting) are cached; the answer sticks while the sequence is in
        prefill (until it first decodes, or as drawn).  Sometimes a second
        step follows the batch's run (``mark_blocks_as_computed``), where a
        count in prefill must not move.  A sequence asked about before may
        first be forgotten (its request was recomputed) and is then asked
        about from scratch."""
        drawn = data.draw(st.booleans(), label="prefill as drawn")
        for step_no in range(data.draw(st.integers(1, 2), label="scheduler steps")):
            if step_no:
                self.run("mark_blocks_as_computed", block_ids=[])  # the batch ran
            for seq in (self.seqs + self.swapped)[-6:]:
                if seq.serial in self.asked and data.draw(st.integers(0, 7), label="forget") == 0:
                    self.run(f"{COMPUTED}.remove_seq", seq_id=seq.serial)
                    self.asked.discard(seq.serial)
                prefill = data.draw(st.booleans(), label="in prefill") if drawn \
                    else seq.serial not in self.decoding
                tokens = [t for name in seq.names for t in self.handle(name).token_ids]
                self.run(f"{COMPUTED}.get_num_cached_tokens", seq_id=seq.serial,
                         token_ids=tokens, extra_hash=seq.extra_hash, is_prefill=prefill)
                self.asked.add(seq.serial)

    def deferred_access(self, data: st.DataObject) -> None:
        """vLLM's deferred access marks (LastAccessBlocksTracker): a running
        sequence is tracked, its run times are recorded, its blocks are
        marked at the last of them when asked (as vLLM does when it frees
        the sequence), and it may stop being tracked."""
        markable = self.markable(self.seqs)
        if not markable:
            return
        seq = self.pick(data, markable)
        if seq.serial not in self.access_tracked:
            self.run(f"{LAST_ACCESS}.add_seq", seq_id=seq.serial)
            self.access_tracked.add(seq.serial)
        for action in data.draw(st.lists(st.sampled_from(["time", "mark", "remove"]),
                                         min_size=1, max_size=3), label="actions"):
            if action == "time":
                self.run(f"{LAST_ACCESS}.update_last_access", seq_id=seq.serial,
                         time=data.draw(TIMES, label="time"))
            elif action == "mark":
                self.run(f"{LAST_ACCESS}.update_seq_blocks_last_access", seq_id=seq.serial,
                         block_ids=self.ids(seq))
            else:
                self.run(f"{LAST_ACCESS}.remove_seq", seq_id=seq.serial)
                self.access_tracked.discard(seq.serial)
                return

    @machine_rule(data=st.data())
    def common_computed(self, data: st.DataObject) -> None:
        """The common prefix of some sequences' id lists.  When mistakes are
        on and the semantics accept any sequence (not ``lists_only``), some
        of them are tuples: the argument may mix the two."""
        tuples = self.config.mistakes and not self.config.semantics.lists_only
        k = data.draw(st.integers(0, min(3, len(self.seqs))), label="how many")
        lists: List[Sequence[int]] = []
        for _ in range(k):
            ids = self.ids(self.pick(data, self.seqs))
            ids = ids[: data.draw(st.integers(0, len(ids)), label="cut")]
            lists.append(tuple(ids) if tuples and data.draw(st.booleans(), label="a tuple")
                         else ids)
        self.run("get_common_computed_block_ids", computed_seq_block_ids=lists)

    @machine_rule(when=lambda self: self.seqs, data=st.data())
    def full_blocks_touched(self, data: st.DataObject) -> None:
        """How many of a sequence's full blocks would need an id."""
        seq = self.pick(data, self.seqs)
        names = seq.names + data.draw(st.lists(st.sampled_from(seq.names), max_size=2))
        self.run("get_num_full_blocks_touched", blocks=names, **self.alloc_args(seq.device))

    def pick_group(self, data: st.DataObject, seqs: List[Seq]) -> List[Seq]:
        """One sequence of ``seqs`` and up to two more on its device: a
        group swapped in one call, chain after chain (so a partial block
        may come before full ones, and forks repeat content)."""
        first = self.pick(data, seqs)
        others = [s for s in seqs if s is not first and s.device == first.device]
        if not others:
            return [first]
        more = data.draw(st.lists(st.sampled_from(range(len(others))), max_size=2,
                                  unique=True), label="with")
        return [first] + [others[i] for i in more]

    @machine_rule(when=lambda self: self.seqs, data=st.data())
    def swap(self, data: st.DataObject) -> None:
        """Preemption by swapping: out of the device (kept, detached), or,
        for a device pair, across to the other device; one sequence or a
        group of them (``pick_group``)."""
        group = self.pick_group(data, self.seqs)
        names = [n for seq in group for n in seq.names]
        if self.d.kind == "cpu_gpu":
            src = group[0].device
            dst = "CPU" if src == "GPU" else "GPU"
            self.run("swap", blocks=names, src_device=src, dst_device=dst)
            if self.ok():
                for seq in group:
                    seq.device = dst
            return
        self.run("swap_out", blocks=names)
        if self.ok():
            for seq in group:
                self.seqs.remove(seq)
                self.swapped.append(seq)

    @machine_rule(when=lambda self: self.swapped, data=st.data())
    def swap_in(self, data: st.DataObject) -> None:
        """Resume swapped-out sequences, one or a group in one call: every
        block gets an id again."""
        group = self.pick_group(data, self.swapped)
        self.run("swap_in", blocks=[n for seq in group for n in seq.names])
        if self.ok():
            for seq in group:
                self.swapped.remove(seq)
                self.seqs.append(seq)

    def _writable(self, seq: Seq) -> bool:
        """Whether the sequence's last block may be copied on write: it has
        no content, or it is not shared (a shared block with content is
        never written: a row of the error table)."""
        handle = self.handle(seq.names[-1])
        if handle.content_key is None:
            return True
        block = self.model_state(seq.device).blocks.get(handle.block_id)
        return block is None or block.refcount <= 1

    @machine_rule(when=lambda self: self.seqs and self.d.kind != "cpu_gpu", data=st.data())
    def copy_on_write(self, data: st.DataObject) -> None:
        """Ask for a writable id for a sequence's last block (a device
        pair has no such call: its Blocks copy on append)."""
        writable = [s for s in self.seqs if self._writable(s)]
        if writable:
            self.run("cow_block_if_not_appendable", block=self.pick(data, writable).names[-1])

    @machine_rule(when=lambda self: self.seqs)
    def drain(self) -> None:
        """Every sequence ends; then the whole cache can be reset."""
        for seq in list(self.seqs):
            self.seqs.remove(seq)
            for name in seq.names:
                self.run("free", block=name)
        self.run("reset_prefix_cache")

    @machine_rule()
    def clear_copy_on_writes(self) -> None:
        """Take the recorded copy-on-write pairs."""
        self.run("clear_copy_on_writes")

    @machine_rule()
    def reset(self) -> None:
        """Try to drop the whole cache (refused while blocks are in use)."""
        self.run("reset_prefix_cache")

    @machine_rule(data=st.data())
    def query(self, data: st.DataObject) -> None:
        """The read-only questions: hit rate, counts, ids."""
        op = data.draw(st.sampled_from([
            "get_prefix_cache_hit_rate", "get_num_free_blocks", "get_num_total_blocks",
            "all_block_ids", "get_physical_block_id"]), label="query")
        if op == "all_block_ids":
            self.run(op)
        elif op == "get_physical_block_id":
            ids = sorted(self.d.model.all_block_ids)
            if not ids:
                return
            absolute_id = data.draw(st.sampled_from(ids), label="id")
            gpu = self.d.kind != "cpu_gpu" or absolute_id in self.d.model.gpu.all_block_ids
            self.run(op, **self.alloc_args("GPU" if gpu else "CPU"), absolute_id=absolute_id)
        elif self.d.kind == "cpu_gpu":
            self.run(op, device=data.draw(st.sampled_from(["GPU", "CPU"])))
        else:
            self.run(op)

    # -- caller mistakes ------------------------------------------------------------

    @machine_rule(swarm=False, data=st.data(),
                  when=lambda self: self.config.mistakes and self.d.trace.num_blocks < LONG_POOL)
    def caller_mistakes(self, data: st.DataObject) -> None:
        """Caller mistakes, one to twelve different ones in a row (the
        catalogue has dozens of rows, every other rule is one operation):
        each a row of the error table that applies to the target's kind and
        can be made now (oracle/mistakes.py).  The rows are drawn from an
        order drawn once per example (a permutation), so that the rows
        Hypothesis favours differ between examples.  (A shuffle seeded by one
        drawn integer did not do that: Hypothesis draws a few integers again
        and again, so most examples of a campaign shared one order, and a
        ``ci`` campaign made some rows three times or never, by the
        Hypothesis release.)  Not in a long-chain example: some mistakes first
        fill the pool, one step per id."""
        if self.mistake_order is None:  # each example favours other rows
            table_rows = rows_for(self.d.kind)
            self.mistake_order = data.draw(st.permutations(table_rows), label="order of the rows")
        left = self.mistake_order  # the rows not made yet in this call, in order
        for _ in range(data.draw(st.integers(1, 12), label="how many")):
            rows = possible_rows(self, left)
            if not rows:
                return
            row = data.draw(st.sampled_from(rows), label="mistake")
            left = [r for r in left if r is not row]
            label = provoke(self, row, data)
            if label is not None:
                event(label)
                self.config.stats.coverage[label] += 1


#: The rules a swarm example may switch off: every rule but new_sequence
#: (something must always be possible) and caller_mistakes (the mistakes need
#: every example they can get: dozens of rows share one rule).
SWARM_RULES = swarm_rules(AllocatorMachine, "new_sequence", "caller_mistakes")


def make_machine(target: Target, *, mistakes: bool = True, white_box: bool = True,
                 stats: Optional[Stats] = None, semantics: Optional[Semantics] = None,
                 call_timeout: Optional[float] = None,
                 known: Optional[set[str]] = None) -> type[AllocatorMachine]:
    """The machine class that judges ``target`` against the model.

    ``mistakes`` adds the caller-mistake rule; ``white_box`` compares the
    abstract state and the invariants where the target allows;
    ``semantics`` (default: prefixcache's) picks each option's rule;
    ``call_timeout`` bounds each call of the target (a ``hang`` past it);
    ``stats`` (optional) accumulates steps, examples and coverage across
    runs; ``known`` is the set of signatures that halt an example instead
    of failing it (the caller may add to it between runs)."""
    config = MachineConfig(target=target, mistakes=mistakes, white_box=white_box,
                           semantics=semantics if semantics is not None else Semantics(),
                           call_timeout=call_timeout,
                           stats=stats if stats is not None else Stats(),
                           known=known if known is not None else set())
    return type(f"AllocatorMachine_{target.kind}", (AllocatorMachine,), {"config": config})
