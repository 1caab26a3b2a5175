"""One worker's search: batches of Hypothesis examples until the budget ends,
collecting every distinct finding.

Each batch runs the oracle's state machine for a few examples with its own
seed, derived from the campaign's seed, so a campaign is reproducible.  The
first violation ends the batch's generation and Hypothesis shrinks it alone,
never into another signature (see
:func:`~prefixcache.oracle.violations.as_finding`); the shrunk finding is
recorded and its signature becomes *known*, so from the next batch on an
example that meets it again is halted quietly and the search goes on
looking for others.  When Hypothesis's shrinking stalls
(:data:`SHRINK_STALL`), :func:`~prefixcache.oracle.minimise.minimise`
finishes it on the trace.  A black-box finding put on a refused caller
mistake is first replayed without the refused steps, and recorded in its
own category when it stays (:func:`~prefixcache.oracle.minimise.without_refusals`).
One finding per batch, not Hypothesis's multi-bug mode:
that mode shrinks every failure of a batch together, and on real vLLM 0.8.5
(two dozen distinct findings in the first batch) it shrank none to the end in
120 s; one at a time, each takes seconds.  A hang is recorded as it happens,
unshrunk.

The time budget bounds everything: past it the next step of any example ends
the batch, shrinking included (a batch cut short while shrinking reports
the shortest example of each finding it had seen), and the time spent
shrinking is reported on its own.
"""

from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Dict, List, Optional

import hypothesis.core
from hypothesis import Phase, Verbosity, settings
from hypothesis.database import ExampleDatabase
from hypothesis.stateful import run_state_machine_as_test

from ..spec.semantics import Semantics
from .findings import Finding, Findings
from .kept_database import KeptFindings
from .machine import OutOfTime, Stats, make_machine
from .minimise import minimise, without_refusals
from .target_log import LogTally, captured_logs
from .targets import Target
from .v1_machine import make_v1_machine
from .v1_targets import V1_KIND
from .violations import Violation

#: Examples per batch: small, so that a known finding stops being searched
#: for soon after it is found, and the budget is checked often.
BATCH_EXAMPLES = 25

#: Seconds without a shorter failing example after which Hypothesis's
#: shrinking is ended and :func:`~prefixcache.oracle.minimise.minimise`
#: finishes the job on the trace.
SHRINK_STALL = 2.0


@dataclass
class Budget:
    """When a search stops: the first of ``seconds``, ``examples``,
    ``steps`` (whole batches: a few more are run) and ``max_findings`` new
    findings.  A ``None`` is no bound."""

    seconds: Optional[float] = None
    examples: Optional[int] = None
    steps: Optional[int] = None
    max_findings: Optional[int] = 10


@dataclass
class SearchOptions:
    """How to search: the rules' switches, the settings and the database."""

    mistakes: bool = True
    white_box: bool = True
    semantics: Semantics = field(default_factory=Semantics)
    call_timeout: Optional[float] = 10.0
    base: Optional[settings] = None
    database: Optional[ExampleDatabase] = None
    shrink: bool = True
    seed: int = 0
    worker: int = 0


@dataclass
class Outcome:
    """What one search (one worker) did and found."""

    stats: Stats = field(default_factory=Stats)
    findings: Findings = field(default_factory=Findings)
    seconds: float = 0.0
    #: of ``seconds``, those from each batch's first failure to its end
    #: (Hypothesis shrinking it) and in :func:`_shrunk`
    shrink_seconds: float = 0.0
    log: LogTally = field(default_factory=LogTally)
    stopped_because: str = "budget"
    #: findings of the last batch past ``max_findings``, left out of the report
    left_out: int = 0

    def merge(self, other: Outcome) -> None:
        """Add another worker's outcome (its time runs in parallel)."""
        self.stats.steps += other.stats.steps
        self.stats.shrink_steps += other.stats.shrink_steps
        self.stats.examples += other.stats.examples
        self.stats.coverage.update(other.stats.coverage)
        self.stats.known_seen.update(other.stats.known_seen)
        for finding in other.findings.in_order():
            self.findings.add(finding)
        self.seconds = max(self.seconds, other.seconds)
        self.shrink_seconds += other.shrink_seconds
        self.log.merge(other.log)
        self.left_out += other.left_out
        if other.stopped_because != "budget":
            self.stopped_because = other.stopped_because

    def to_json(self) -> Dict[str, Any]:
        """Everything but the findings' and the known signatures' entries."""
        return {
            "steps": self.stats.steps,
            "examples": self.stats.examples,
            "seconds": round(self.seconds, 3),
            "shrink_seconds": round(self.shrink_seconds, 3),
            "steps_per_second": round(self.stats.steps / self.seconds, 1) if self.seconds else 0.0,
            "stopped_because": self.stopped_because,
            "findings_left_out": self.left_out,
            "coverage": dict(sorted(self.stats.coverage.items())),
            "target_log": self.log.to_json(),
        }


def violations_in(exc: BaseException) -> List[Violation]:
    """The Violations an exception is or holds (an ExceptionGroup of several
    findings, Hypothesis's report of a flaky one)."""
    if isinstance(exc, Violation):
        return [exc]
    found: List[Violation] = []
    for inner in getattr(exc, "exceptions", ()):
        found += violations_in(inner)
    return found


def _batch_settings(options: SearchOptions, examples: int) -> settings:
    base = options.base if options.base is not None else settings()
    # no explain phase: it varies the shrunk example to say which parts do not
    # matter, which is unbounded by the shrinking limit (minutes per finding)
    phases = [p for p in base.phases if p is not Phase.explain]
    if not options.shrink:
        phases = [p for p in phases if p is not Phase.shrink]
    return settings(base, max_examples=examples, database=options.database, derandomize=False,
                    print_blob=False, verbosity=Verbosity.quiet, phases=phases,
                    report_multiple_bugs=False)


def search(target: Target, budget: Budget, options: SearchOptions, *,
           known: Collection[str] = (),
           progress: Optional[Callable[[Outcome], None]] = None) -> Outcome:
    """Search ``target`` until ``budget`` ends; return what was done and found.

    Signatures in ``known`` (a baseline's) are not findings: an example that
    meets one is halted and counted in ``stats.known_seen``."""
    outcome = Outcome()
    findings = outcome.findings
    findings.known.update(known)
    kept = None if options.database is None else KeptFindings(options.database)
    if kept is not None:
        options = dataclasses.replace(options, database=kept)
    make = make_v1_machine if target.kind == V1_KIND else make_machine
    machine = make(target, mistakes=options.mistakes, white_box=options.white_box,
                           stats=outcome.stats, semantics=options.semantics,
                           call_timeout=options.call_timeout, known=findings.known)
    start = time.monotonic()
    # Seed Hypothesis's own source of per-run seeds (what it uses when no seed
    # is forced), so a campaign is reproducible and still uses the database.
    hypothesis.core.threadlocal._hypothesis_global_random = random.Random(
        options.seed * 1_000_003 + options.worker)
    stats = outcome.stats
    hangs_seen = 0
    with captured_logs() as log:
        outcome.log = log
        while True:
            left = None if budget.seconds is None else budget.seconds - (time.monotonic() - start)
            reason = _exhausted(budget, stats, len(findings), left)
            if reason:
                outcome.stopped_because = reason
                break
            size = BATCH_EXAMPLES
            if budget.examples is not None:
                size = max(1, min(size, budget.examples - stats.examples))
            stats.seen, stats.failing_since, stats.improved_at = {}, None, None
            deadline = None if budget.seconds is None else start + budget.seconds
            machine.config.deadline = deadline
            machine.config.shrink_stall = SHRINK_STALL if options.shrink else None
            found: List[Violation] = []
            try:
                run_state_machine_as_test(machine, settings=_batch_settings(options, size))
            except OutOfTime:  # the budget ended or shrinking stalled: keep what it reached
                found = list(stats.seen.values())
            except BaseException as exc:  # findings, or a bug of ours (re-raised)
                found = violations_in(exc)
                if not found:
                    raise
            finally:
                if kept is not None:
                    kept.keep()
                # from a batch's first failure on, Hypothesis shrinks it (and
                # replays the shortest): counted once, however the batch ended
                if stats.failing_since is not None:
                    outcome.shrink_seconds += time.monotonic() - stats.failing_since
                if progress is not None:
                    outcome.seconds = time.monotonic() - start
                    progress(outcome)
            found = _own(found, target, options, findings, stats)
            new = [_shrunk(v, target, options, deadline, outcome) if options.shrink
                   else Finding(v, shrunk=False) for v in found]
            new += [Finding(v, shrunk=False) for v in stats.hangs[hangs_seen:]]
            hangs_seen = len(stats.hangs)
            for finding in new:
                if (budget.max_findings is not None and finding.signature not in findings.found
                        and len(findings) >= budget.max_findings):
                    outcome.left_out += 1
                    continue
                findings.add(finding)
    outcome.seconds = time.monotonic() - start
    return outcome


def _own(found: List[Violation], target: Target, options: SearchOptions,
         findings: Findings, stats: Stats) -> List[Violation]:
    """The findings of ``found``, each put on refused caller mistakes
    replaced by the one its trace shows without them
    (:func:`.minimise.without_refusals`); the signature it had becomes known,
    so later batches halt on it, and one the baseline knows is counted as
    met again, not found."""
    own: List[Violation] = []
    for violation in found:
        finding = without_refusals(violation, target, semantics=options.semantics,
                                   white_box=options.white_box,
                                   call_timeout=options.call_timeout)
        if finding is not violation:
            findings.known.add(violation.signature)
            if finding.signature in findings.known and finding.signature not in findings.found:
                stats.known_seen[finding.signature] += 1
                continue
        own.append(finding)
    return own


def _shrunk(violation: Violation, target: Target, options: SearchOptions,
            deadline: Optional[float], outcome: Outcome) -> Finding:
    """The finding of ``violation`` once its trace is minimised (the time
    it takes counts as shrinking)."""
    began = time.monotonic()
    try:
        shortest, minimal = minimise(violation, target, semantics=options.semantics,
                                     white_box=options.white_box,
                                     call_timeout=options.call_timeout, deadline=deadline)
    finally:
        outcome.shrink_seconds += time.monotonic() - began
    return Finding(shortest, shrunk=minimal)


def _exhausted(budget: Budget, stats: Stats, found: int, left: Optional[float]) -> str:
    """Why the search must stop now, or ''."""
    if budget.max_findings is not None and found >= budget.max_findings:
        return "max-findings"
    if left is not None and left <= 0:
        return "budget"
    if budget.steps is not None and stats.steps >= budget.steps:
        return "budget"
    if budget.examples is not None and stats.examples >= budget.examples:
        return "budget"
    return ""
