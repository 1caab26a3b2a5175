"""The mutation-testing campaign of impl/ (issue #7): does the oracle kill what
breaks the allocator?

    pip install -e ".[test,mutation]"
    python bench/mutation.py                 # the whole campaign, from scratch
    python bench/mutation.py --report        # the report of the last campaign only
    python bench/mutation.py --resume 'prefixcache.impl.evictor.*'   # run those not killed yet
    python bench/mutation.py --smoke        # CI: a few mutants, in a scratch copy, < 1 min

mutmut 3 (configured in pyproject.toml, ``[tool.mutmut]``) copies the tree into
./mutants/, mutates every function of impl/ and runs, for each mutant, the tests
that reach the mutated function (tests/conftest.py narrows and orders them: the
oracle's conformance tests first, in a short run, then the impl's unit tests,
the oracle's full runs, the differential test against vLLM 0.8.5 last).  Then
this script lists the survivors with their diffs, compares them with the
equivalent mutants listed in bench/MUTATION.md, and ends with
``mutation score: K/N killed``.

K counts only real kills: a test failed on the mutant, the tests ran past
their CPU limit (a mutant that makes the allocator loop) or the test process
died (one that makes it grow without end, stopped by a memory limit).  N counts every
mutant.  A mutant listed in bench/MUTATION.md as equivalent (with the reason)
is not a kill: it is not even run (it cannot be killed, and running every test
on it is the most expensive thing a campaign does; ``--all`` runs them too, to
check that they still survive) and is reported apart.  A survivor that is not
listed makes the exit code 1, as does a score under ``--min-score`` (0.95).

A listed mutant is matched by its function and its changed lines, not by its
number, so the list survives edits elsewhere in the function (an entry named
with a ``*`` and without a diff covers every mutant of the names it matches:
dead code, say); ``--skeleton`` prints an entry for each unexplained survivor,
ready to be completed with the reason and pasted into bench/MUTATION.md.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import io
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = ROOT / "mutants"
EQUIVALENTS = ROOT / "bench" / "MUTATION.md"
#: A kill: a test failed, the tests ran past their CPU limit (a mutant that makes
#: the allocator loop), or the test process died (a mutant that makes it grow
#: without end meets MEMORY_LIMIT and fails with MemoryError; mutmut calls a
#: process killed by a signal a "segfault").
KILLED = {"killed", "timeout", "segfault"}
#: The heap of every test process (RLIMIT_DATA): about ten times what the tests use.
MEMORY_LIMIT = 4 << 30
SKIPPED = 34  # mutmut's exit code for "skipped": how a listed equivalent is marked

#: The smoke: every mutant of the evictor's ordering key, judged by the oracle's
#: conformance tests of the prefix-caching allocator (both stages) and the
#: evictor's unit tests.
SMOKE_MUTANTS = "prefixcache.impl.evictor.xǁLRUEvictorǁ_push__mutmut_*"
SMOKE_SOURCE = "prefixcache/impl/evictor.py"
SMOKE_TESTS = ["tests/test_mutation_oracle.py::TestPrefixCachingFirst",
               "tests/test_mutation_oracle.py::TestPrefixCachingConformance",
               "tests/test_impl_evictor.py"]

#: An entry of bench/MUTATION.md: a ``### `name` `` heading, a ```diff block
#: with the changed lines, and the reason (the paragraph after it).
_ENTRY = re.compile(r"^### `(?P<name>[^`]+)`\s*\n+```diff\n(?P<diff>.*?)```\s*\n(?P<reason>.*?)"
                    r"(?=^### |^## |\Z)", re.S | re.M)


@dataclass(frozen=True)
class Mutant:
    name: str
    status: str
    path: str  # the source file, as mutmut names it (prefixcache/impl/x.py)


@dataclass
class Equivalent:
    name: str
    changes: Tuple[str, ...]
    reason: str
    matched: List[str] = field(default_factory=list)


def function_of(name: str) -> str:
    """``prefixcache.impl.m.xǁCǁf__mutmut_3`` -> ``prefixcache.impl.m.xǁCǁf``."""
    return name.partition("__mutmut_")[0]


def changed_lines(diff: str) -> Tuple[str, ...]:
    """The removed and added lines of a unified diff, stripped, in order."""
    return tuple(line[0] + " " + line[1:].strip() for line in diff.splitlines()
                 if line[:1] in "+-" and not line.startswith(("+++", "---")))


def load_equivalents(path: Path = EQUIVALENTS) -> List[Equivalent]:
    if not path.exists():
        return []
    return [Equivalent(name=m["name"], changes=changed_lines(m["diff"]),
                       reason=" ".join(m["reason"].split()))
            for m in _ENTRY.finditer(path.read_text(encoding="utf-8"))]


def equivalent_of(name: str, diff: str, equivalents: List[Equivalent]) -> Optional[Equivalent]:
    """The entry of ``equivalents`` that lists the mutant ``name`` with ``diff``."""
    changes = changed_lines(diff)
    for e in equivalents:
        if "*" in e.name and not e.changes:
            if fnmatch.fnmatchcase(name, e.name):
                return e
        elif function_of(e.name) == function_of(name) and e.changes == changes:
            return e
    return None


def load_results() -> List[Mutant]:
    """Every mutant of the last campaign with its status (mutmut's meta files)."""
    from mutmut.stats import status_by_exit_code

    found = []
    for meta in sorted(MUTANTS.rglob("*.py.meta")):
        source = str(meta.relative_to(MUTANTS))[: -len(".meta")]
        codes: Dict[str, Optional[int]] = json.loads(meta.read_text())["exit_code_by_key"]
        found += [Mutant(name, status_by_exit_code[code], source) for name, code in codes.items()]
    return found


def diff_of(mutant: Mutant) -> str:
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    return "\n".join(get_diff_for_mutant(mutant.name, path=mutant.path).splitlines()[2:])


def generate(max_children: int) -> None:
    """Copy the tree into ./mutants/ and write every mutant (mutmut run's
    first phase, so the listed equivalents can be marked before the run)."""
    from mutmut.__main__ import create_mutants
    from mutmut.utils.file_utils import copy_also_copy_files, copy_src_dir, setup_source_paths

    MUTANTS.mkdir(exist_ok=True)
    with contextlib.redirect_stdout(io.StringIO()):  # mutmut names every file it copies
        copy_src_dir()
        copy_also_copy_files()
        setup_source_paths()
        stats = create_mutants(max_children)
    print(f"mutants written for {stats.mutated} files of impl/", flush=True)


def mark_equivalents(equivalents: List[Equivalent], only_unchecked: bool = False) -> int:
    """Mark every mutant that bench/MUTATION.md lists (with ``only_unchecked``:
    and that has no result yet) as skipped, so mutmut leaves it alone; returns
    how many."""
    functions = {function_of(e.name) for e in equivalents}
    patterns = [e.name for e in equivalents if "*" in e.name]
    marked = 0
    for meta in sorted(MUTANTS.rglob("*.py.meta")):
        source = str(meta.relative_to(MUTANTS))[: -len(".meta")]
        data = json.loads(meta.read_text())
        codes = data["exit_code_by_key"]
        for name in codes:
            if only_unchecked and codes[name] is not None:
                continue
            if function_of(name) not in functions and not any(
                    fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
                continue
            if equivalent_of(name, diff_of(Mutant(name, "", source)), equivalents) is not None:
                codes[name] = SKIPPED
                marked += 1
        meta.write_text(json.dumps(data, indent=4))
    return marked


def limit_memory() -> None:
    """Cap this process's heap (RLIMIT_DATA) at MEMORY_LIMIT; its children inherit
    the cap (mutmut's process and every test process it forks, the vLLM campaign's
    judges), so a mutant that grows without end dies of MemoryError."""
    resource.setrlimit(resource.RLIMIT_DATA, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_mutmut(max_children: int, names: Sequence[str], log: Path) -> int:
    """``mutmut run`` in a child process; its output goes to ``log``, a
    progress line to stdout every 15 s.  Returns mutmut's exit code."""
    cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children), *names]
    shown = cmd if len(names) <= 3 else cmd[:-len(names)] + [f"<{len(names)} mutants>"]
    print("$", " ".join(shown), f"  (output: {log.relative_to(ROOT)})", flush=True)
    log.parent.mkdir(exist_ok=True)
    last_print, progress = time.monotonic(), ""
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                preexec_fn=limit_memory)
        assert proc.stdout is not None
        while True:
            chunk = proc.stdout.read1(4096)  # type: ignore[attr-defined]
            if not chunk:
                break
            out.write(chunk)
            lines = re.findall(r"\d+/\d+ [^\r\n]*", chunk.decode("utf-8", "replace"))
            progress = lines[-1].strip() if lines else progress
            if time.monotonic() - last_print > 15 and progress:
                print(f"  [{time.monotonic() - START:6.0f} s] {progress}", flush=True)
                last_print = time.monotonic()
        return proc.wait()


def skeleton(m: Mutant, diff: str) -> str:
    body = "\n".join(line for line in diff.splitlines() if line[:1] in "+-")
    return f"### `{m.name}`\n\n```diff\n{body}\n```\n\nEquivalent: TODO (why no test can tell).\n"


def report(mutants: List[Mutant], args: argparse.Namespace, seconds: Optional[float]) -> int:
    if args.names:  # only the mutants asked about
        mutants = [m for m in mutants
                   if any(fnmatch.fnmatchcase(m.name, pattern) for pattern in args.names)]
    counts = Counter(m.status for m in mutants)
    total = len(mutants)
    killed = sum(counts[s] for s in KILLED)
    unchecked = [m for m in mutants if m.status == "not checked"]
    survivors = [m for m in mutants if m.status not in KILLED and m.status != "not checked"]
    diffs = {m.name: diff_of(m) for m in survivors}
    equivalents = load_equivalents()
    listed: Dict[str, Equivalent] = {}
    unexplained = []
    for m in survivors:
        e = equivalent_of(m.name, diffs[m.name], equivalents)
        if e is None:
            unexplained.append(m)
        else:
            e.matched.append(m.name)
            listed[m.name] = e

    print()
    print(f"mutants: {total}  " + ", ".join(f"{s} {n}" for s, n in counts.most_common()))
    by_file = Counter(m.path for m in mutants)
    kills_by_file = Counter(m.path for m in mutants if m.status in KILLED)
    for path in sorted(by_file):
        print(f"  {path:42} {kills_by_file[path]:5}/{by_file[path]:<5} killed")
    print()
    not_run = sum(1 for m in mutants if m.name in listed and m.status == "skipped")
    print(f"listed as equivalent in {EQUIVALENTS.relative_to(ROOT)}: {len(listed)} "
          f"({not_run} not run, {len(listed) - not_run} run and survived)")
    for name, e in sorted(listed.items()):
        print(f"  {name}  [{e.reason[:90]}]")
    stale = [e for e in equivalents if not e.matched]
    if stale and not args.names:
        print(f"\nlisted but not surviving now (killed, renamed or gone): {len(stale)}")
        for e in stale:
            print(f"  {e.name}")
    if unchecked:
        print(f"\nnot run yet (an interrupted or partial campaign): {len(unchecked)}")
    print(f"\nsurvivors not listed: {len(unexplained)}")
    for m in unexplained:
        print(f"\n# {m.name}: {m.status}")
        print(diffs[m.name])
    if args.skeleton and unexplained:
        print("\n-- entries for bench/MUTATION.md --\n")
        for m in unexplained:
            print(skeleton(m, diffs[m.name]))
    print()
    lines: List[str] = []
    if seconds is not None:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = usage.ru_utime + usage.ru_stime
        lines.append(f"campaign wall time: {seconds:.0f} s ({seconds / 60:.1f} min), "
                     f"--max-children {args.max_children}, load average "
                     f"{os.getloadavg()[0]:.2f}; CPU time {cpu:.0f} s (at least "
                     f"{cpu / args.max_children / 60:.1f} min on {args.max_children} idle cores)")
    if total:
        lines.append(f"score with the listed equivalents set aside: {killed}/"
                     f"{total - len(listed)} ({100 * killed / max(1, total - len(listed)):.1f}%); "
                     f"killed {100 * killed / total:.1f}% of all")
    lines.append(f"mutation score: {killed}/{total} killed")
    print("\n".join(lines))
    if seconds is not None and not args.names:  # a whole campaign: its figures are the file's
        write_figures(figures_text(
            lines, counts, [(p, kills_by_file[p], by_file[p]) for p in sorted(by_file)],
            len(listed), not_run, [m.name for m in unexplained],
            [e.name for e in stale], len(unchecked), args.resume))
        print(f"(written to {EQUIVALENTS.relative_to(ROOT)}, section '{FIGURES_HEADING}')")
    failed = bool(unexplained or unchecked) or not killed or killed < args.min_score * total
    return 1 if failed else 0


#: The section of bench/MUTATION.md that a whole campaign rewrites, up to the next heading.
FIGURES_HEADING = "## The latest whole campaign"


def figures_text(lines: Sequence[str], counts: Counter[str],
                 files: Sequence[Tuple[str, int, int]], listed: int, not_run: int,
                 unexplained: Sequence[str], stale: Sequence[str], unchecked: int,
                 resumed: bool) -> str:
    """The section FIGURES_HEADING for a campaign's results: when and on what
    it ran, the printed summary ``lines``, the statuses, the kills per file,
    the listed equivalents and the survivors not listed."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    command = "python bench/mutation.py" + (" --resume" if resumed else "")
    out = [FIGURES_HEADING, "",
           f"Written by `{command}` at its end ({when}); the tree it copied at its start was "
           f"{TREE_AT_START}.  A whole campaign rewrites this section, up to the next heading.",
           ""]
    out += [f"- {line}" for line in lines]
    out += ["", "| status | mutants |", "|---|---:|"]
    out += [f"| {status} | {n:,} |" for status, n in counts.most_common()]
    out += ["", "| file | killed / mutants |", "|---|---:|"]
    out += [f"| {Path(path).name} | {kills:,}/{n:,} |" for path, kills, n in files]
    out += ["", f"Listed as equivalent below and matched: {listed} ({not_run} not run). "
            f"Survivors not listed: {len(unexplained)}"
            + (": " + ", ".join(f"`{name}`" for name in unexplained) if unexplained else "")
            + "."]
    if stale:
        out += ["", f"Listed below but not surviving now (killed, renamed or gone): {len(stale)}: "
                + ", ".join(f"`{name}`" for name in stale) + "."]
    if unchecked:
        out += ["", f"Not run (an interrupted campaign): {unchecked}."]
    return "\n".join(out) + "\n"


def write_figures(text: str, path: Path = EQUIVALENTS) -> None:
    """Put ``text`` in ``path`` in place of its FIGURES_HEADING section (up to
    the next ``## `` heading), or before ``## Equivalent mutants`` if it has none."""
    document = path.read_text(encoding="utf-8") if path.exists() else ""
    section = re.compile(rf"^{re.escape(FIGURES_HEADING)}\n.*?(?=^## |\Z)", re.S | re.M)
    if section.search(document):
        document = section.sub(lambda _: text + "\n", document, count=1)
    elif "\n## Equivalent mutants" in document:
        head, _, tail = document.partition("\n## Equivalent mutants")
        document = head + "\n" + text + "\n## Equivalent mutants" + tail
    else:
        document += "\n" + text
    path.write_text(document, encoding="utf-8")


def smoke(args: argparse.Namespace) -> int:
    """A scratch copy of the project in which only SMOKE_SOURCE is mutated and
    only SMOKE_TESTS judge; runs the mutants SMOKE_MUTANTS there, reports them."""
    with tempfile.TemporaryDirectory(prefix="prefixcache-mutation-smoke-",
                                     ignore_cleanup_errors=True) as tmp:
        scratch = Path(tmp)
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
        for name in ("impl", "spec", "model", "oracle", "prefixcache", "tests", "bench"):
            shutil.copytree(ROOT / name, scratch / name, symlinks=True, ignore=ignore)
        config = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
        config = re.sub(r"^source_paths = .*$", f'source_paths = ["{SMOKE_SOURCE}"]', config,
                        flags=re.M)
        config = re.sub(r"^pytest_add_cli_args_test_selection = .*$",
                        f"pytest_add_cli_args_test_selection = {json.dumps(SMOKE_TESTS)}",
                        config, flags=re.M)
        config = re.sub(r"^also_copy = \[", 'also_copy = [\n    "prefixcache/impl",', config,
                        flags=re.M)
        (scratch / "pyproject.toml").write_text(config, encoding="utf-8")
        cmd = [sys.executable, str(scratch / "bench" / "mutation.py"),
               "--max-children", str(args.max_children), "--min-score", "0", SMOKE_MUTANTS]
        return subprocess.call(cmd, cwd=scratch)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*",
                        help="only the mutants of these names or globs (with --resume: those "
                             "not killed yet)")
    parser.add_argument("--max-children", type=int, default=2, help="parallel workers (2)")
    for flag, text in (
            ("--resume", "keep ./mutants/ and the results there (default: start afresh)"),
            ("--report", "no run: report the results in ./mutants/"),
            ("--all", "run the mutants listed as equivalent too (check they survive)"),
            ("--skeleton", "print a bench/MUTATION.md entry for each survivor not listed"),
            ("--smoke", f"only the mutants {SMOKE_MUTANTS}, in a scratch copy (CI)")):
        parser.add_argument(flag, action="store_true", help=text)
    parser.add_argument("--min-score", type=float, default=0.95,
                        help="exit 1 below this share of killed mutants (0.95)")
    args = parser.parse_args(argv)
    if args.smoke:
        return smoke(args)
    os.chdir(ROOT)  # mutmut reads ./pyproject.toml and works in ./mutants/
    seconds = None
    if not args.report:
        names: List[str] = list(args.names)
        if not args.resume:
            if MUTANTS.exists():
                shutil.rmtree(MUTANTS)
            generate(args.max_children)
        if not args.all:
            marked = mark_equivalents(load_equivalents(), only_unchecked=args.resume)
            print(f"{marked} {'more ' if args.resume else ''}mutants listed as equivalent in "
                  "bench/MUTATION.md: not run")
        if names:  # mutmut re-runs every mutant it is named: name only those not killed yet
            names = [m.name for m in load_results() if m.status not in KILLED | {"skipped"}
                     and any(fnmatch.fnmatchcase(m.name, pattern) for pattern in names)]
        if names or not args.names:
            code = run_mutmut(args.max_children, names, MUTANTS / "campaign.log")
            if code != 0:
                print(f"mutmut run failed (exit code {code}); see mutants/campaign.log")
                return 2
        seconds = time.monotonic() - START
    return report(load_results(), args, seconds)


def tree_version() -> str:
    """The commit of the working tree, and whether impl/ or tests/ differ from
    it ("unknown" without git)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "impl", "tests"],
                               cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"
    return (commit or "unknown") + (" with changes to impl/ or tests/" if dirty else "")


START = time.monotonic()
#: What the campaign copies into ./mutants/: the tree as it is when the script starts.
TREE_AT_START = tree_version()

if __name__ == "__main__":
    sys.exit(main())
