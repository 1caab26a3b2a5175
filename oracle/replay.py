"""``prefixcache replay TRACE.json``: re-run a trace, step by step.

A trace saved by ``prefixcache fuzz`` re-runs deterministically against its
target (or ``--target``) and the model; a trace recorded in production by
:class:`~prefixcache.oracle.recorder.RecordingAllocator` is judged offline:
its recorded answers play the target.  Each step is printed as a line of
Python with ``ok`` or the place where target and model part.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

from ..spec.semantics import PRESETS, Semantics
from ..spec.v1_semantics import V1_PRESETS
from .driver import Driver
from .recorder import recorded_target
from .target_log import captured_logs
from .targets import DEFAULT_TARGET, KINDS, Target, TargetError, resolve_target
from .trace import Step, Trace, render_step
from .v1_driver import V1Driver
from .v1_targets import V1_DEFAULT_TARGET, V1_KIND, resolve_v1_target
from .v1_trace import render_v1_step
from .violations import Violation


@dataclass
class ReplayResult:
    """How far a replay got: the steps run, the violation that stopped it,
    and the steps of the caller mistakes the target refused while the oracle
    could not read its state (black-box)."""

    steps_run: int
    violation: Optional[Violation]
    refusals: Tuple[int, ...] = ()


def replay(trace: Trace, target: Optional[Target] = None, *, white_box: bool = True,
           semantics: Optional[Semantics] = None, call_timeout: Optional[float] = None,
           echo: Optional[List[str]] = None) -> ReplayResult:
    """Run ``trace`` against ``target`` (default: the trace's own target, or
    its recorded answers when it carries them) and the model, judged by
    ``semantics`` (default: the trace's own), each call of the target
    bounded by ``call_timeout`` seconds.  Appends one line per step to
    ``echo`` when given."""
    if target is None:
        if trace.steps and all(step.expect is not None for step in trace.steps):
            target = recorded_target(trace)
            white_box = False
        elif trace.kind == V1_KIND:
            target = resolve_v1_target(trace.target or V1_DEFAULT_TARGET)
        else:
            target = resolve_target(trace.target or DEFAULT_TARGET, kind=trace.kind,
                                    strict=trace.strict)
    if semantics is None:
        semantics = Semantics.from_json(trace.semantics) if trace.semantics else Semantics()
    make = V1Driver if target.kind == V1_KIND else Driver
    driver = make(target, trace.num_blocks, trace.block_size, white_box=white_box,
                    semantics=semantics, call_timeout=call_timeout)
    show = (lambda s: render_v1_step(s.op, s.args)) if trace.kind == V1_KIND else render_step
    with captured_logs():  # as in a campaign: counted, not printed, INFO included
        for index, original in enumerate(trace.steps):
            step = Step(op=original.op, args=dict(original.args), out=list(original.out),
                        expect=original.expect)
            try:
                driver.run(step)
            except Violation as violation:
                if echo is not None:
                    echo.append(f"{index:4d}  {show(step)}")
                    echo.append(f"      ^ {violation}")
                return ReplayResult(index, violation, tuple(driver.unseen_refusals))
            if echo is not None:
                verdict = f"refused: {driver.refused}" if driver.refused else "ok"
                echo.append(f"{index:4d}  {show(step):70s}  # {verdict}")
        return ReplayResult(len(trace.steps), None, tuple(driver.unseen_refusals))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``prefixcache replay``."""
    parser.add_argument("trace", metavar="TRACE.json", help="a prefixcache-trace/1 file")
    parser.add_argument("--target", default=None, metavar="MODULE:CLASS",
                        help="replay against this allocator instead of the trace's own")
    parser.add_argument("--kind", choices=KINDS, default=None)
    parser.add_argument("--relaxed", action="store_true",
                        help="accept any free id the spec allows")
    parser.add_argument("--black-box", action="store_true",
                        help="compare results only, not internals and invariants")
    parser.add_argument("--semantics", choices=sorted(set(PRESETS) | set(V1_PRESETS)),
                        default=None,
                        help="judge by this preset's rules (default: the trace's own)")
    parser.add_argument("--call-timeout", type=float, default=10.0, metavar="SECONDS",
                        help="a call of the target that runs longer is a hang (default 10; "
                        "0: no limit)")


def run(args: argparse.Namespace) -> int:
    """Replay, print each step; 0 when the trace runs clean, 1 on a violation."""
    try:
        trace = Trace.load(args.trace)
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as exc:
        print(f"prefixcache replay: cannot read {args.trace}: {exc}", file=sys.stderr)
        return 2
    target = None
    if args.target is not None:
        try:
            target = resolve_v1_target(args.target) if trace.kind == V1_KIND else \
                resolve_target(args.target, kind=args.kind or trace.kind,
                               strict=not args.relaxed)
        except TargetError as exc:
            print(f"prefixcache replay: {exc}", file=sys.stderr)
            return 2
    if args.call_timeout < 0:
        print("prefixcache replay: --call-timeout must be >= 0", file=sys.stderr)
        return 2
    lines: List[str] = []
    presets = V1_PRESETS if trace.kind == V1_KIND else PRESETS
    if args.semantics and args.semantics not in presets:
        print(f"prefixcache replay: --semantics must be one of {', '.join(sorted(presets))} "
              f"for a {trace.kind} trace", file=sys.stderr)
        return 2
    semantics = presets[args.semantics] if args.semantics else None
    result = replay(trace, target, white_box=not args.black_box, semantics=semantics,
                    call_timeout=args.call_timeout or None, echo=lines)
    print(f"# {Path(args.trace).name}: {len(trace.steps)} steps, "
          f"{trace.num_blocks} blocks of {trace.block_size} tokens, kind {trace.kind}")
    print("\n".join(lines))
    if result.violation is None:
        print(f"# all {result.steps_run} steps agree with the model")
        return 0
    print(f"# target and model part at step {result.steps_run}: "
          f"[{result.violation.category}] {result.violation.message}")
    print(f"# signature: {result.violation.signature}")
    return 1
