"""Shrinking a finding by its trace: delete steps, and ids, while it still
fails the same way.

Hypothesis shrinks a stateful example through the choices that generated
it, which makes the big cuts in a second or two and then can spend tens of
seconds proving that no smaller example exists.  The campaign lets it run
until it stalls (:data:`~prefixcache.oracle.machine.MachineConfig.shrink_stall`)
and finishes here, on the trace itself: replaying a candidate costs
milliseconds.

:func:`minimise` deletes runs of steps, halving the run length down to single
steps (delta debugging), and lowers the pool size, keeping a candidate when
its replay breaks the same rule (same signature) as the finding.  A candidate
whose steps no longer make sense (a Block used before the step that made it
was deleted) is simply not kept.  The result is *1-minimal* when it returns
``True``: no single step can be deleted, and one id fewer does not fail.
A trace whose replay does not end in the same finding (a target that is
not deterministic) is returned as it is, not minimal.

Black-box, a finding after a refused caller mistake is put on that refusal
(``robustness/<operation>/after-refusal:<rule>``), since the oracle cannot
see that the refusal changed nothing.  :func:`without_refusals` deletes the
refused steps and replays: when the same difference stays at the same
operation, the refusals had no part in it, and the finding is the trace's
own, in its own category.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import List, Optional, Tuple

from ..spec.semantics import Semantics
from .replay import replay
from .targets import Target
from .trace import Step, Trace
from .violations import AFTER_REFUSAL, Violation


def _fails_alike(trace: Trace, target: Target, signature: str, semantics: Semantics,
                 white_box: bool, call_timeout: Optional[float]) -> Optional[Violation]:
    """The violation ``trace`` ends in if it has ``signature``, else None."""
    try:
        result = replay(trace, target, white_box=white_box, semantics=semantics,
                        call_timeout=call_timeout)
    except Exception:  # noqa: BLE001 -- a candidate whose steps refer to what is gone
        return None
    found = result.violation
    if found is None or found.signature != signature or found.trace is None:
        return None
    return found


def without_refusals(violation: Violation, target: Target, *, semantics: Semantics,
                     white_box: bool = True,
                     call_timeout: Optional[float] = None) -> Violation:
    """The finding of ``violation``'s trace with the refused caller mistakes
    deleted, when ``violation`` was put on them (``after-refusal:``) and that
    trace breaks the same rule at the same operation in a category of its
    own; otherwise ``violation`` itself."""
    trace: Optional[Trace] = violation.trace
    rule = violation.rule.removeprefix(AFTER_REFUSAL)
    if trace is None or rule == violation.rule or violation.category != "robustness":
        return violation
    try:
        refused = set(replay(trace, target, white_box=white_box, semantics=semantics,
                             call_timeout=call_timeout).refusals)
        if not refused:
            return violation
        steps = [step for k, step in enumerate(trace.steps) if k not in refused]
        found = replay(replace(trace, steps=steps), target, white_box=white_box,
                       semantics=semantics, call_timeout=call_timeout).violation
    except Exception:  # noqa: BLE001 -- steps that refer to what the refusals made
        return violation
    if found is None or found.trace is None or found.category == "robustness" \
            or (found.operation, found.rule) != (violation.operation, rule):
        return violation
    return found


def minimise(violation: Violation, target: Target, *, semantics: Semantics,
             white_box: bool = True, call_timeout: Optional[float] = None,
             deadline: Optional[float] = None) -> Tuple[Violation, bool]:
    """The shortest violation of the same signature found by deleting steps
    of ``violation``'s trace and lowering its pool size, and whether it is
    1-minimal (False when ``deadline``, a ``time.monotonic()`` value, cut
    the search short, or the violation has no trace to replay)."""
    trace: Optional[Trace] = violation.trace
    if trace is None or not trace.steps:
        return violation, False
    best = violation

    def attempt(candidate: Trace) -> bool:
        nonlocal best, trace
        found = _fails_alike(candidate, target, violation.signature, semantics, white_box,
                             call_timeout)
        if found is None:
            return False
        best, trace = found, found.trace
        return True

    def out_of_time() -> bool:
        return deadline is not None and time.monotonic() > deadline

    if out_of_time() or not attempt(trace):  # a trace that does not replay alike
        return violation, False

    while True:
        changed = False
        chunk = max(1, (len(trace.steps) - 1) // 2)
        while True:
            start = 0
            while start < len(trace.steps) - 1:  # the last step is where it fails
                if out_of_time():
                    return best, False
                steps: List[Step] = trace.steps
                end = min(start + chunk, len(steps) - 1)
                if attempt(replace(trace, steps=steps[:start] + steps[end:])):
                    changed = True
                else:
                    start = end
            if chunk == 1:
                break
            chunk //= 2
        while trace.num_blocks > 1:
            if out_of_time():
                return best, False
            if not attempt(replace(trace, num_blocks=trace.num_blocks - 1)):
                break
            changed = True
        if not changed:
            return best, True
