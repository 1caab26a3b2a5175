"""``prefixcache``: the command line.

Each verb lives in its own module, which provides ``add_arguments(parser)``
and ``run(args) -> int`` (the exit code).  Exit codes: 0 clean, 1 a
violation or failed check, 2 a usage error, 3 an internal error of
prefixcache itself (the ``prefixcache`` command prints its traceback), so
that a job never reads a crash of the checker as a finding.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from typing import List, NoReturn, Optional, Tuple

#: The exit code of a run that prefixcache itself broke off with an exception.
INTERNAL_ERROR = 3

#: verb -> (module that implements it, one line of help)
VERBS: Tuple[Tuple[str, str, str], ...] = (
    ("fuzz", "prefixcache.oracle.campaign",
     "stateful fuzzing of an allocator against the model (the main job)"),
    ("replay", "prefixcache.oracle.replay",
     "re-run a JSON trace against a target, step by step against the model"),
    ("verify", "prefixcache.oracle.verify",
     "CrossHair over the pure functions of the spec and the model"),
    ("bench", "prefixcache.bench.benchmark",
     "time an allocator on a realistic serving workload (--soak: check it, long)"),
)


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one sub-command per available verb."""
    parser = _Parser(
        prog="prefixcache",
        description="A formally specified prefix-caching KV-cache block allocator: "
        "its spec, reference model, vLLM-compatible implementation and conformance oracle.",
    )
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    verbs.required = True
    for verb, module_name, help_text in VERBS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        sub = verbs.add_parser(verb, help=help_text, description=help_text)
        module.add_arguments(sub)
        sub.set_defaults(_run=module.run)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``), run the verb, return its code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    code: int = args._run(args)
    return code


def entry() -> NoReturn:
    """The ``prefixcache`` command: run :func:`main`, flush the output and
    leave without tearing the interpreter down.  After a long campaign that
    teardown (Hypothesis's caches, the example trees) took seconds, past the
    ``--seconds`` the user gave; every file has been written and closed.
    An exception that escapes the verb is printed and exits with
    :data:`INTERNAL_ERROR` (Python's own exit code for it, 1, is the code of
    a finding)."""
    try:
        code = main()
    except Exception:  # not a finding, so not exit code 1
        traceback.print_exc()
        print(f"prefixcache: internal error (exit code {INTERNAL_ERROR}): the run broke off "
              "on the exception above; it is not a finding", file=sys.stderr)
        code = INTERNAL_ERROR
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
