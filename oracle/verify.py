"""``prefixcache verify``: CrossHair over the pure functions of the spec and the model.

By default it checks :mod:`prefixcache.spec.pure` (the cores: content-key
chaining, the prefix search, the eviction choice, the hit rate),
:mod:`prefixcache.spec.pure_checks` (the invariants on small states the
spec's own steps build) and
:mod:`prefixcache.model.pure_model` (the model's answers against the same
cores); any modules or functions named on the command line instead.

How.  A child process imports the targets and lists every function that
carries an icontract postcondition.  Then each function gets its own
``python -m crosshair check --analysis_kind=icontract
--per_condition_timeout=T [--max_uninteresting_iterations=N] --report_all
--verbose module.function`` (by module name), ``--jobs`` at a time, with
``PREFIXCACHE_EXPLORE=1`` (which installs the size bounds of the symbolic
search, see :mod:`prefixcache.spec.pure`) and contracts on.  ``T`` is CPU
seconds per postcondition; ``--max-seconds`` bounds the whole run: a function
not finished by then is reported as not reached.

It prints, per function, its postconditions, the outcome, how many
iterations (execution paths) CrossHair ran and how long it took, then a
summary.  Exit code 1 when
CrossHair found a counterexample (a postcondition false, or an exception
raised, on inputs that meet the preconditions), failed, or could not explore
a function at all (no input met its preconditions: the check would be
vacuous); 0 otherwise, including when the time bound cut the run short (it
says so); 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata
from typing import Dict, List, Optional, Sequence, Tuple

DEFAULT_TARGETS: Tuple[str, ...] = (
    "prefixcache.spec.pure",
    "prefixcache.spec.pure_checks",
    "prefixcache.model.pure_model",
)
"""What ``prefixcache verify`` checks when no target is named."""

CONFIRMED = "confirmed over all paths"
BOUNDED = "no counterexample"
COUNTEREXAMPLE = "COUNTEREXAMPLE"
ERROR = "CROSSHAIR ERROR"
UNEXPLORED = "NOT EXPLORED"
NOT_REACHED = "not reached (time bound)"

#: Outcomes that make the run fail.
FAILING: Tuple[str, ...] = (COUNTEREXAMPLE, ERROR, UNEXPLORED)

_REPORT_LINE = re.compile(r"^(?P<path>.+?):(?P<line>\d+): (?P<kind>error|info|warning): "
                          r"(?P<message>.*)$")
_ITERATIONS = re.compile(r"with (?P<status>[A-Z_]+) and \d+ messages\. "
                         r"Number of iterations:\s+(?P<n>\d+)")

# Run in a child process: list the functions of each target that carry an
# icontract postcondition, as JSON on stdout.
_DISCOVER = r"""
import importlib, inspect, json, sys

def contracts(fn):
    pre = [c.description or getattr(c.condition, "__name__", "") for group in
           getattr(fn, "__preconditions__", []) for c in group]
    post = [c.description or getattr(c.condition, "__name__", "")
            for c in getattr(fn, "__postconditions__", [])]
    return pre, post

def describe(module_name, name, fn):
    pre, post = contracts(fn)
    try:
        line = inspect.getsourcelines(inspect.unwrap(fn))[1]
    except (OSError, TypeError):
        line = 0
    return {"target": module_name + "." + name, "module": module_name, "name": name,
            "line": line, "preconditions": pre, "postconditions": post}

out = []
for target in sys.argv[1:]:
    entry = {"target": target, "functions": [], "error": None}
    try:
        module = importlib.import_module(target)
    except ImportError as exc:
        module_name, _, name = target.rpartition(".")
        try:
            module = importlib.import_module(module_name) if module_name else None
        except ImportError:
            module = None
        fn = getattr(module, name, None) if module is not None else None
        if fn is None or not callable(fn):
            entry["error"] = f"cannot import {target!r}: {exc}"
        else:
            entry["functions"].append(describe(module_name, name, fn))
    else:
        for name, fn in vars(module).items():
            if (inspect.isfunction(fn) and fn.__module__ == module.__name__
                    and getattr(fn, "__postconditions__", None)):
                entry["functions"].append(describe(module.__name__, name, fn))
        entry["functions"].sort(key=lambda f: f["line"])
    out.append(entry)
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Contracted:
    """One function CrossHair will check."""

    target: str
    line: int
    preconditions: Tuple[str, ...]
    postconditions: Tuple[str, ...]


@dataclass
class Outcome:
    """What CrossHair said about one function."""

    function: Contracted
    status: str
    seconds: float = 0.0
    iterations: List[int] = field(default_factory=list)
    messages: List[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        """Whether this outcome fails the run."""
        return self.status in FAILING


@dataclass(frozen=True)
class Options:
    """How each CrossHair run is bounded, and where it imports from."""

    per_condition_timeout: float
    max_uninteresting_iterations: Optional[int]
    paths: Tuple[str, ...] = ()


class UsageError(ValueError):
    """A target that does not exist or has nothing to check."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``prefixcache verify`` to ``parser``."""
    parser.add_argument("targets", nargs="*", metavar="TARGET",
                        help="modules or module.function names to check (default: "
                        + ", ".join(DEFAULT_TARGETS) + ")")
    parser.add_argument("--per-condition-timeout", type=float, default=2.0, metavar="SECONDS",
                        help="CPU seconds CrossHair spends on each postcondition (default 2)")
    parser.add_argument("--max-uninteresting-iterations", type=int, default=None, metavar="N",
                        help="also stop a postcondition after N iterations in a row that "
                        "find no new path (default: time only)")
    parser.add_argument("--max-seconds", type=float, default=150.0, metavar="SECONDS",
                        help="wall-clock bound of the whole run (default 150)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), metavar="N",
                        help="CrossHair processes at a time (default: 2, or 1 on one core)")
    parser.add_argument("--path", action="append", default=[], metavar="DIR",
                        help="a directory to import targets from (repeatable)")
    parser.add_argument("--list", action="store_true",
                        help="list the functions and postconditions, check nothing")


def child_env(paths: Sequence[str]) -> Dict[str, str]:
    """Return the environment of the child processes: the exploration
    bounds on, contracts on, not optimized, ``paths`` first on the import path."""
    env = dict(os.environ)
    env["PREFIXCACHE_EXPLORE"] = "1"
    env["PREFIXCACHE_CONTRACTS"] = "1"
    env.pop("PYTHONOPTIMIZE", None)
    extra = [os.path.abspath(p) for p in paths]
    if env.get("PYTHONPATH"):
        extra.append(env["PYTHONPATH"])
    if extra:
        env["PYTHONPATH"] = os.pathsep.join(extra)
    return env


def discover(targets: Sequence[str], paths: Sequence[str] = ()) -> List[Contracted]:
    """Return every function with a postcondition in ``targets`` (modules,
    or module.function names), in source order, read by a child process
    with the same environment as the CrossHair runs.  Raises UsageError for
    a target that cannot be imported or has no such function."""
    proc = subprocess.run([sys.executable, "-c", _DISCOVER, *targets], env=child_env(paths),
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise UsageError(f"cannot list the targets:\n{proc.stderr.strip()}")
    found: List[Contracted] = []
    for entry in json.loads(proc.stdout):
        if entry["error"]:
            raise UsageError(entry["error"])
        if not entry["functions"]:
            raise UsageError(f"{entry['target']}: no function with an icontract "
                             "postcondition")
        for f in entry["functions"]:
            found.append(Contracted(f["target"], f["line"], tuple(f["preconditions"]),
                                    tuple(f["postconditions"])))
    return found


def crosshair_command(target: str, options: Options) -> List[str]:
    """Return the CrossHair command line that checks ``target``."""
    cmd = [sys.executable, "-m", "crosshair", "check", "--analysis_kind=icontract",
           f"--per_condition_timeout={options.per_condition_timeout:g}"]
    if options.max_uninteresting_iterations is not None:
        cmd.append(f"--max_uninteresting_iterations={options.max_uninteresting_iterations}")
    return cmd + ["--report_all", "--verbose", target]


def parse(function: Contracted, returncode: Optional[int], stdout: str, stderr: str,
          seconds: float) -> Outcome:
    """Read one CrossHair run's report (``--report_all``) and verbose log
    into an :class:`Outcome`; ``returncode`` None means the run was cut
    short by the time bound."""
    outcome = Outcome(function, BOUNDED, seconds)
    outcome.iterations = [int(m.group("n")) for m in _ITERATIONS.finditer(stderr)]
    infos: List[str] = []
    for line in stdout.splitlines():
        m = _REPORT_LINE.match(line.strip())
        if m is None:
            if line.strip():
                infos.append(line.strip())
            continue
        if m.group("kind") == "error":
            outcome.messages.append(f"line {m.group('line')}: {m.group('message')}")
        else:
            infos.append(m.group("message"))
    if outcome.messages:
        outcome.status = COUNTEREXAMPLE
    elif returncode is None:
        outcome.status = NOT_REACHED
    elif returncode != 0:
        outcome.status = ERROR
        tail = (stderr.strip().splitlines() or ["(no output)"])[-1]
        outcome.messages.append(f"crosshair exited {returncode}: {tail}")
    elif any("Unable to meet precondition" in i or "no checkable" in i for i in infos) \
            or not infos:
        outcome.status = UNEXPLORED
        outcome.messages.extend(infos or ["CrossHair reported nothing"])
    elif all("Confirmed over all paths" in i for i in infos):
        outcome.status = CONFIRMED
    return outcome


def check(function: Contracted, options: Options, deadline: float) -> Outcome:
    """Run CrossHair on one function, stopping at ``deadline``
    (``time.monotonic()``); return what it found."""
    start = time.monotonic()
    if start >= deadline:
        return Outcome(function, NOT_REACHED)
    proc = subprocess.Popen(crosshair_command(function.target, options),
                            env=child_env(options.paths), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=max(0.1, deadline - start))
        code: Optional[int] = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        code = None
    return parse(function, code, stdout, stderr, time.monotonic() - start)


def check_all(functions: Sequence[Contracted], options: Options, max_seconds: float,
              jobs: int, report: Optional[List[str]] = None) -> List[Outcome]:
    """Check ``functions``, ``jobs`` at a time, within ``max_seconds`` of
    wall-clock time; return their outcomes in order, appending (and
    printing) one report block per function as soon as it and every one
    before it is done."""
    deadline = time.monotonic() + max_seconds
    outcomes: List[Outcome] = []
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures: List[Future[Outcome]] = [pool.submit(check, f, options, deadline)
                                          for f in functions]
        for future in futures:
            outcome = future.result()
            outcomes.append(outcome)
            text = describe(outcome)
            if report is not None:
                report.append(text)
            print(text, flush=True)
    return outcomes


def describe(outcome: Outcome) -> str:
    """One function's block of the report: the outcome line, its
    postconditions, and any message."""
    mark = "FAIL" if outcome.failed else ("skip" if outcome.status == NOT_REACHED else "ok")
    paths = sum(outcome.iterations)
    lines = [f"[{mark:>4}] {outcome.function.target}: {outcome.status}"
             + (f" ({paths} iterations, {outcome.seconds:.1f} s)" if outcome.seconds else "")]
    lines += [f"         ensures: {post}" for post in outcome.function.postconditions]
    lines += [f"         {message}" for message in outcome.messages]
    return "\n".join(lines)


def summary(outcomes: Sequence[Outcome], seconds: float) -> str:
    """The closing lines of the report."""
    posts = sum(len(o.function.postconditions) for o in outcomes)
    counts = Counter(o.status for o in outcomes)
    parts = ", ".join(f"{n} {status}" for status, n in counts.items())
    line = (f"checked {posts} postconditions of {len(outcomes)} functions in "
            f"{seconds:.1f} s: {parts}")
    if counts.get(NOT_REACHED):
        line += "\nwarning: the time bound (--max-seconds) cut the run short"
    return line


def crosshair_version() -> Optional[str]:
    """The installed crosshair-tool version, or None when it is missing."""
    try:
        return metadata.version("crosshair-tool")
    except metadata.PackageNotFoundError:
        return None


def run(args: argparse.Namespace) -> int:
    """Run ``prefixcache verify``: print what was checked and how it went;
    return 1 on a counterexample (or a CrossHair failure, or a function it
    could not explore), 0 otherwise, 2 on a usage error."""
    if args.per_condition_timeout <= 0 or args.max_seconds <= 0 or args.jobs < 1 or (
            args.max_uninteresting_iterations is not None
            and args.max_uninteresting_iterations < 1):
        print("prefixcache verify: timeouts must be > 0, --jobs and "
              "--max-uninteresting-iterations >= 1", file=sys.stderr)
        return 2
    version = crosshair_version()
    if version is None:
        print("prefixcache verify: CrossHair is not installed; install the verify extra: "
              "pip install 'prefixcache[verify]' (or -e '.[verify]' in a clone)", file=sys.stderr)
        return 2
    targets = list(args.targets) or list(DEFAULT_TARGETS)
    try:
        functions = discover(targets, args.path)
    except UsageError as exc:
        print(f"prefixcache verify: {exc}", file=sys.stderr)
        return 2
    if args.list:
        for f in functions:
            print(f"{f.target} (line {f.line})")
            for post in f.postconditions:
                print(f"    ensures: {post}")
        return 0
    print(f"CrossHair {version} (icontract) over {len(functions)} functions of "
          f"{', '.join(targets)}: {args.per_condition_timeout:g} CPU s per postcondition"
          + (f" or {args.max_uninteresting_iterations} uninteresting iterations"
             if args.max_uninteresting_iterations else "")
          + f", {args.jobs} at a time, at most {args.max_seconds:g} s", flush=True)
    options = Options(args.per_condition_timeout, args.max_uninteresting_iterations,
                      tuple(args.path))
    start = time.monotonic()
    outcomes = check_all(functions, options, args.max_seconds, args.jobs)
    print(summary(outcomes, time.monotonic() - start), flush=True)
    return 1 if any(o.failed for o in outcomes) else 0


__all__ = [
    "DEFAULT_TARGETS",
    "Contracted",
    "Options",
    "Outcome",
    "UsageError",
    "add_arguments",
    "check",
    "check_all",
    "crosshair_command",
    "discover",
    "parse",
    "run",
]
