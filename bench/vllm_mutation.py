"""Mutation testing of real vLLM 0.8.5 (issue #20, point 5): does the oracle
alone kill what breaks vLLM's own prefix-caching allocator, and does it kill
more than vLLM's own block tests?

    pip install -e ".[test]"
    python bench/vllm_mutation.py --sample 200 --seed 0 --jobs 2   # the campaign
    python bench/vllm_mutation.py --resume --jobs 2                # continue it
    python bench/vllm_mutation.py --resume --rejudge-oracle all    # the oracle again, tests kept
    python bench/vllm_mutation.py --report                         # re-render the report
    python bench/vllm_mutation.py --smoke                          # CI: 4 mutants, < 90 s

The mutated code is vLLM 0.8.5's ``vllm/core/evictor.py`` and
``vllm/core/block/prefix_caching_block.py`` *after* the repairs of
bench/vllm_repaired.py (its ``EDITS``: vLLM's latent faults, fixed by
run-time edits), so that the unmutated code is clean under the oracle and a
finding on a mutant is the mutant's.  mutmut 3's mutation engine
(``mutmut.mutation.file_mutation.create_mutations``, used as a library; its
runner never sees the vLLM tree) lists every mutant of those two files, with
mutmut's names (``vllm.core.evictor.xǁLRUEvictorǁevict__mutmut_3``) and
mutmut's configuration of this project (``[tool.mutmut]``: no mutants of
error-message strings).  A seeded random sample of them is judged.  Each
mutant is one more (old, new) edit, on top of the repairs, of
:mod:`prefixcache.oracle.vllm_source`'s ``Edits``: its tree is
``source_tree(edits=repairs + mutant)``, built in the cache and removed after.

Each mutant is judged twice, each judge a subprocess with its own time limit
(a mutant that loops is a kill, not a stall):

* **the oracle alone**: ``prefixcache fuzz --target <the mutant tree's
  PrefixCachingBlockAllocator> --semantics vllm-0.8.5 --no-mistakes
  --stop-at-first --seconds B`` with the tree first on ``PYTHONPATH``, then,
  when that finds nothing, the same for ``B/2`` seconds on the tree's
  ``CpuGpuBlockAllocator`` (a device pair: two prefix-caching allocators with
  their own id ranges, and swaps between them).  Killed: a
  finding (exit 1; a hang under ``--call-timeout`` is one), a crash (any other
  exit code but 0: the mutant does not import or build) or the run passing its
  time limit;
* **vLLM's own tests**: its 910 ``tests/core/block`` unit tests
  (bench/vllm_block_tests.py) on the mutant's tree, with ``-x``.  Killed: a
  failure, an error or the run passing its time limit.

Before the campaign, the baseline: the repaired tree, unmutated, must be clean
under the oracle (both targets, for the longest budget a mutant gets) and pass
every test; otherwise the campaign stops and says which judge failed.

Mutants that cannot be killed (the equivalent ones) are listed by hand in
bench/VLLM_MUTATION.md, each with its reason, in bench/MUTATION.md's format
(matched by function and changed lines, not by number); they are set aside from
the denominator and not run (``--all`` runs them too).  The results are kept in
bench/vllm_mutation.json after every mutant (``--resume`` continues from it);
the script renders the generated sections of bench/VLLM_MUTATION.md from it
and keeps the hand-written rest.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from prefixcache.bench import (
    mutation,  # equivalents, the memory limit
    vllm_block_tests,
    vllm_repaired,
)
from prefixcache.oracle import vllm_source
from prefixcache.spec.render import fill_sections

BENCH = Path(__file__).resolve().parent

ROOT = BENCH.parent
RESULTS = BENCH / "vllm_mutation.json"
REPORT = BENCH / "VLLM_MUTATION.md"
VERSION = "0.8.5"
#: The mutated files, as paths inside the vllm package.
FILES = ("core/evictor.py", "core/block/prefix_caching_block.py")
PREFIX_TARGET = "vllm.core.block.prefix_caching_block:PrefixCachingBlockAllocator"
CPU_GPU_TARGET = "vllm.core.block.cpu_gpu_block_allocator:CpuGpuBlockAllocator"
#: Bump when a judge changes: results of another version are not resumed.
JUDGE_VERSION = 2
#: Seconds a judge may run past its budget (start-up, shrinking, teardown)
#: before it counts as a hang.
ORACLE_SLACK = 60.0
#: Classes of prefix_caching_block.py that are vLLM's block manager's helpers, not
#: the allocator: the oracle, which drives the allocator API, never calls them; the
#: report gives the kill rates over the allocator's own code apart.
HELPERS = ("ComputedBlocksTracker", "LastAccessBlocksTracker")
#: The smoke (CI): these mutants, a short budget, only the prefix-caching tests.
SMOKE_MUTANTS = (
    "vllm.core.evictor.xǁLRUEvictorǁevict__mutmut_1",
    "vllm.core.evictor.xǁLRUEvictorǁremove__mutmut_2",
    "vllm.core.block.prefix_caching_block.xǁPrefixCachingBlockAllocatorǁ"
    "get_num_free_blocks__mutmut_2",
)
#: A smoke mutant the oracle is known to kill (tests/test_vllm_mutation_smoke.py).
SMOKE_KILLABLE = SMOKE_MUTANTS[0]
SMOKE_TESTS = ("tests/core/block/test_prefix_caching_block.py",)


# -- the mutants ------------------------------------------------------------------------

@dataclass(frozen=True)
class VllmMutant:
    """One mutant: mutmut's ``name``, the file ``path`` inside the vllm
    package, the mutated ``function`` (mutmut's mangled name), the edit
    (``old`` -> ``new``, ``old`` occurring once in the repaired file) and
    the ``diff`` of the function, in mutmut's format (no file headers)."""

    name: str
    path: str
    function: str
    old: str
    new: str
    diff: str

    def edits(self, repairs: vllm_source.Edits) -> Dict[str, List[vllm_source.Edit]]:
        """The edits of this mutant's tree: ``repairs``, then the mutant's edit
        after those of its file."""
        edits = {path: list(changes) for path, changes in repairs.items()}
        edits.setdefault(self.path, []).append((self.old, self.new))
        return edits


def _unique_edit(text: str, before: str, after: str) -> Optional[Tuple[str, str]]:
    """The smallest run of whole lines of ``before`` (lines of ``text``) that
    holds every change from ``before`` to ``after`` and occurs once in
    ``text``, and what ``after`` has in its place; None when no run of
    ``before`` occurs once."""
    a, b = before.splitlines(keepends=True), after.splitlines(keepends=True)
    start = 0
    while start < min(len(a), len(b)) and a[start] == b[start]:
        start += 1
    end = 0
    while end < min(len(a), len(b)) - start and a[-1 - end] == b[-1 - end]:
        end += 1
    low, high_a, high_b = start, len(a) - end, len(b) - end
    while True:
        old = "".join(a[low:high_a])
        if old and text.count(old) == 1:
            return old, "".join(b[low:high_b])
        if low > 0:
            low -= 1
        elif high_a < len(a):
            high_a, high_b = high_a + 1, high_b + 1
        else:
            return None


def _function_diff(original: Any, mutated: Any) -> str:
    """The unified diff of two versions of a function, as mutmut shows it."""
    import libcst

    old, new = (libcst.Module(body=[f]).code.strip().split("\n") for f in (original, mutated))
    return "\n".join(list(difflib.unified_diff(old, new, lineterm=""))[2:])


def mutants_of(path: str, text: str) -> List[VllmMutant]:
    """Every mutant mutmut's engine makes of ``text`` (the file ``path``
    inside the vllm package), in mutmut's order and with its names.  Reads
    the project's ``[tool.mutmut]`` configuration (its cwd is changed to the
    repository root while it runs)."""
    import libcst
    from mutmut.mutation.file_mutation import create_mutations, deep_replace
    from mutmut.mutation.trampoline_templates import mangle_function_name
    from mutmut.utils.file_utils import change_cwd

    with change_cwd(ROOT):
        module, mutations, _, _ = create_mutations(f"vllm/{path}", text)
    if module.code != text:
        raise ValueError(f"libcst does not round-trip vllm/{path}")
    owners: Dict[Any, str] = {}  # function node -> mutmut's name of it
    classes: Dict[Any, Any] = {}  # method node -> its class node
    for statement in module.body:
        if isinstance(statement, libcst.FunctionDef):
            owners[statement] = mangle_function_name(name=statement.name.value, class_name=None)
        elif (isinstance(statement, libcst.ClassDef)
              and isinstance(statement.body, libcst.IndentedBlock)):
            for method in statement.body.body:
                if isinstance(method, libcst.FunctionDef):
                    owners[method] = mangle_function_name(name=method.name.value,
                                                          class_name=statement.name.value)
                    classes[method] = statement

    def edit(original: Any, changed: Any) -> Tuple[str, str]:
        """The edit of ``text`` that replaces the top-level function or
        method ``original`` by ``changed``: found in a rendering of that
        function alone (inside its class), else of the whole module."""
        owner = classes.get(original)

        def render(function: Any, whole: bool) -> str:
            if owner is None:
                top = function
            else:
                body = [function if s is original else s for s in owner.body.body] if whole \
                    else [function]
                top = owner.with_changes(body=owner.body.with_changes(body=body))
            if not whole:
                return str(module.code_for_node(top))
            return str(module.with_changes(body=[top if s is (owner or original) else s
                                                 for s in module.body]).code)

        found = _unique_edit(text, render(original, False), render(changed, False))
        if found is None:
            found = _unique_edit(text, text, render(changed, True))
        if found is None:
            raise ValueError(f"a mutant of {owners[original]} cannot be located in vllm/{path}")
        return found

    prefix = "vllm." + path[:-len(".py")].replace("/", ".")
    counts: Counter[str] = Counter()
    found = []
    for m in mutations:
        original = m.contained_by_top_level_function
        function = owners.get(original)
        if original is None or function is None:  # outside functions: mutmut makes no mutant
            continue
        counts[function] += 1
        changed = deep_replace(original, m.original_node, m.mutated_node)
        old, new = edit(original, changed)
        found.append(VllmMutant(name=f"{prefix}.{function}__mutmut_{counts[function]}",
                                path=path, function=function, old=old, new=new,
                                diff=_function_diff(original, changed)))
    return found


def sample(mutants: Sequence[VllmMutant], size: int, seed: int) -> List[VllmMutant]:
    """A seeded random sample of ``size`` mutants (all when there are fewer),
    in name order; the same for the same mutants, size and seed."""
    ordered = sorted(mutants, key=lambda m: m.name)
    if size >= len(ordered):
        return ordered
    chosen = random.Random(seed).sample(range(len(ordered)), size)
    return [ordered[i] for i in sorted(chosen)]


# -- the judges ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    """One judge's verdict on one tree: ``status`` is ``finding`` (the oracle),
    ``failed`` (the tests), ``crash``, ``timeout`` or ``survived``;
    ``detail`` the finding's signature, the first failing test or the end of
    the output; ``program`` the oracle's shrunk program, if any."""

    status: str
    detail: str
    seconds: float
    program: str = ""

    @property
    def killed(self) -> bool:
        """Whether the mutant was killed."""
        return self.status != "survived"


def _environment(tree: Path) -> Dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "PYTHONOPTIMIZE", "CI")}
    env["PYTHONPATH"] = str(tree)
    return env


def fuzz_tree(tree: Path, target: str, seconds: float, seed: int,
              call_timeout: float) -> Verdict:
    """Run ``prefixcache fuzz`` (preset vllm-0.8.5, valid calls only, stop at
    the first finding, ``seconds`` of budget) on ``target`` imported from
    ``tree`` (first on PYTHONPATH), in a scratch directory, and return its
    verdict; past ``seconds + ORACLE_SLACK`` the run is killed (a timeout)."""
    with tempfile.TemporaryDirectory(prefix="vllm-mutant-fuzz-") as scratch:
        report = Path(scratch) / "report.json"
        cmd = [sys.executable, "-m", "prefixcache.cli", "fuzz", "--target", target,
               "--semantics", "vllm-0.8.5", "--no-mistakes", "--stop-at-first",
               "--seconds", f"{seconds:g}", "--seed", str(seed), "--profile", "dev",
               "--call-timeout", f"{call_timeout:g}", "--quiet",
               "--findings-dir", str(Path(scratch) / "findings"), "--json", str(report)]
        start = time.monotonic()
        code, output, timed_out = vllm_block_tests.run_process(
            cmd, Path(scratch), _environment(tree), seconds + ORACLE_SLACK)
        spent = time.monotonic() - start
        if timed_out:
            return Verdict("timeout", f"{target.rpartition(':')[2]}: no answer within "
                           f"{seconds + ORACLE_SLACK:g} s", spent)
        if code == 0:
            return Verdict("survived", "", spent)
        tail = " | ".join(output.strip().splitlines()[-2:])[-300:]
        findings: List[Dict[str, Any]] = []
        if code == 1 and report.is_file():
            findings = json.loads(report.read_text(encoding="utf-8")).get("findings", [])
        if findings:
            return Verdict("finding", f"{target.rpartition(':')[2]}: "
                           f"{findings[0]['signature']}", spent, findings[0].get("program", ""))
        return Verdict("crash", f"exit code {code}: {tail}", spent)


def judge_oracle(tree: Path, budget: float, seed: int, call_timeout: float) -> Verdict:
    """The oracle's verdict on ``tree``: its prefix-caching allocator for
    ``budget`` seconds, then, when that finds nothing, its device pair
    (``CpuGpuBlockAllocator``, which builds the prefix-caching allocators with
    their own id ranges and swaps between them) for ``budget / 2``."""
    plan = [(PREFIX_TARGET, budget), (CPU_GPU_TARGET, budget / 2)]
    spent = 0.0
    verdict = Verdict("survived", "", 0.0)
    for target, seconds in plan:
        verdict = fuzz_tree(tree, target, seconds, seed, call_timeout)
        spent += verdict.seconds
        if verdict.killed:
            break
    return Verdict(verdict.status, verdict.detail, spent, verdict.program)


def judge_tests(tree: Path, timeout: float, tests: Sequence[str] = ()) -> Verdict:
    """vLLM's block tests' verdict on ``tree`` (``-x``; only ``tests`` when
    given); past ``timeout`` seconds the run is killed (a timeout)."""
    result = vllm_block_tests.run_block_tests(tree, pytest_args=["-x", *tests],
                                              timeout=timeout, version=VERSION)
    if result.timed_out:
        return Verdict("timeout", f"no answer within {timeout:g} s", result.seconds)
    if result.ok:
        return Verdict("survived", "", result.seconds)
    if result.failures:
        return Verdict("failed", result.failures[0], result.seconds)
    tail = " | ".join(result.output.strip().splitlines()[-2:])[-300:]
    return Verdict("crash", f"exit code {result.returncode}: {tail}", result.seconds)


# -- the campaign ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Settings:
    """What a campaign's results depend on; a resumed campaign must match."""

    sample: int
    seed: int
    budget: float
    call_timeout: float
    repairs: str  # the digest of the repairs' edits
    tests: Tuple[str, ...]
    judge_version: int = JUDGE_VERSION


def edits_digest(edits: vllm_source.Edits) -> str:
    """A short digest of ``edits`` (which repairs a campaign ran on)."""
    import hashlib

    canonical = json.dumps({path: [list(e) for e in changes]
                            for path, changes in sorted(edits.items())})
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def load_results(path: Path) -> Dict[str, Any]:
    """The campaign's results file, or an empty campaign when there is none."""
    if not path.is_file():
        return {"settings": None, "baseline": None, "sessions": [], "population": 0,
                "mutants": {}}
    data: Dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def save_results(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically (a crash never leaves half a file)."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def baseline(repaired: Path, settings: Settings, test_timeout: float) -> Dict[str, Any]:
    """Judge the unmutated repaired tree: the oracle on both targets for the
    whole budget, and the tests.  Returns the verdicts; raises SystemExit
    with a message when either judge finds something."""
    verdicts = {
        "oracle": fuzz_tree(repaired, PREFIX_TARGET, settings.budget, settings.seed,
                            settings.call_timeout),
        "oracle_cpu_gpu": fuzz_tree(repaired, CPU_GPU_TARGET, settings.budget, settings.seed,
                                    settings.call_timeout),
        "tests": judge_tests(repaired, test_timeout, settings.tests),
    }
    failed = {name: v for name, v in verdicts.items() if v.killed}
    for name, v in verdicts.items():
        print(f"baseline {name}: {v.status} in {v.seconds:.1f} s {v.detail}", flush=True)
    if failed:
        lines = [f"  {name}: {v.status}: {v.detail}\n{v.program}" for name, v in failed.items()]
        raise SystemExit("the repaired, unmutated vLLM tree is not clean, so no mutant can be "
                         "judged (fix bench/vllm_repaired.py's EDITS first):\n"
                         + "\n".join(lines))
    return {name: asdict(v) for name, v in verdicts.items()}


def judge(mutant: VllmMutant, repairs: vllm_source.Edits, settings: Settings,
          test_timeout: float, previous: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """Both verdicts on ``mutant`` (its tree built, judged, removed), as the
    results file keeps them; with ``previous`` (an earlier entry), only the
    oracle judges again and the tests' verdict is kept."""
    tree = vllm_source.source_tree(VERSION, mutant.edits(repairs))
    try:
        oracle = asdict(judge_oracle(tree, settings.budget, settings.seed,
                                     settings.call_timeout))
        tests = (dict(previous["tests"]) if previous is not None
                 else asdict(judge_tests(tree, test_timeout, settings.tests)))
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    return {**asdict(mutant), "oracle": oracle, "tests": tests,
            "judge_version": settings.judge_version}


def run_campaign(chosen: Sequence[VllmMutant], data: Dict[str, Any], repairs: vllm_source.Edits,
                 settings: Settings, jobs: int, test_timeout: float, results: Path,
                 skip: Callable[[VllmMutant], bool], rejudge: Optional[str] = None) -> None:
    """Judge every mutant of ``chosen`` not in ``data["mutants"]`` yet and not
    ``skip``-ped, ``jobs`` at a time, saving ``data`` to ``results`` after each;
    with ``rejudge`` ``"survivors"`` (``"all"``), the oracle also judges again
    each mutant it did not kill (each mutant judged already), and the tests'
    verdict is kept."""
    done = data["mutants"]
    again = [m for m in chosen if rejudge and m.name in done and not skip(m)
             and (rejudge == "all" or done[m.name]["oracle"]["status"] == "survived")]
    todo = [m for m in chosen if m.name not in done and not skip(m)]
    print(f"{len(todo)} mutants to judge, {len(again)} to judge again by the oracle, "
          f"{len(chosen) - len(todo) - len(again)} done or set aside; {jobs} at a time",
          flush=True)
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(judge, m, repairs, settings, test_timeout,
                               done[m.name] if m.name in done else None): m
                   for m in again + todo}
        for count, future in enumerate(as_completed(futures), 1):
            m = futures[future]
            entry = future.result()
            data["mutants"][m.name] = entry  # in this thread only: no lock
            save_results(results, data)
            print(f"[{time.monotonic() - start:6.0f} s] {count}/{len(futures)} {m.name}: "
                  f"oracle {entry['oracle']['status']}, tests {entry['tests']['status']}",
                  flush=True)


# -- the report -------------------------------------------------------------------------------

def wilson(k: int, n: int, z: float = 1.96) -> Tuple[float, float]:
    """The Wilson score interval (95 % by default) of ``k`` successes in
    ``n`` trials, as fractions; (0, 1) when ``n`` is 0."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _rate(k: int, n: int) -> str:
    low, high = wilson(k, n)
    share = 100 * k / n if n else 0.0
    return f"**{k}/{n} = {share:.1f} %** (95 % Wilson CI {100 * low:.1f}-{100 * high:.1f} %)"


def _short(name: str) -> str:
    return name.replace("vllm.core.block.prefix_caching_block.", "pcb.").replace(
        "vllm.core.evictor.", "evictor.")


def _entry(name: str, entry: Mapping[str, Any], verdicts: Sequence[str]) -> List[str]:
    said = "; ".join(f"{judge}: {entry[judge]['status']}"
                     + (f" (`{entry[judge]['detail']}`)" if entry[judge]["detail"] else "")
                     for judge in verdicts)
    return [f"#### `{_short(name)}`", "", said, "", "```diff", entry["diff"], "```", ""]


def _session(session: Mapping[str, Any]) -> str:
    again = session.get("rejudge_oracle")
    what = f"the oracle again on {again}" if again else "a run"
    return f"{what}: {session['seconds'] / 60:.0f} min, jobs {session['jobs']}"


def _counts(mutants: Mapping[str, Mapping[str, Any]], judge: str) -> str:
    found = Counter(m[judge]["status"] for m in mutants.values())
    return ", ".join(f"{status} {count}" for status, count in sorted(found.items()))


def render(data: Mapping[str, Any], equivalents: List[mutation.Equivalent],
           command: str) -> Dict[str, str]:
    """The generated sections of the report (name -> Markdown body), from
    the results ``data`` and the listed ``equivalents``."""
    mutants: Dict[str, Dict[str, Any]] = data["mutants"]
    settings = data["settings"] or {}
    listed = {name: e for name, e in ((n, mutation.equivalent_of(n, m["diff"], equivalents))
                                      for n, m in mutants.items()) if e is not None}
    judged = {n: m for n, m in mutants.items() if n not in listed}
    allocator = {n for n in judged if not any(f"ǁ{cls}ǁ" in n for cls in HELPERS)}
    oracle = {k for k, m in judged.items() if m["oracle"]["status"] != "survived"}
    tests = {k for k, m in judged.items() if m["tests"]["status"] != "survived"}
    wall = sum(s["seconds"] for s in data["sessions"])
    suite = (", ".join(f"`{s}`" for s in settings["tests"]) + " only"
             if settings.get("tests") else "all 910 of `tests/core/block`")
    helpers = " and ".join(f"`{c}`" for c in HELPERS)
    summary = [
        f"- Population: {data['population']} mutants of `vllm/core/evictor.py` and "
        f"`vllm/core/block/prefix_caching_block.py` (after the repairs "
        f"`{settings.get('repairs')}`); sample of {settings.get('sample')} with seed "
        f"{settings.get('seed')}; {len(mutants)} judged, {len(listed)} of them listed as "
        f"equivalent below: **{len(judged)} non-equivalent**, {len(allocator)} of them in the "
        f"allocator's own code and {len(judged) - len(allocator)} in {helpers} (vLLM's block "
        "manager's helpers, which live in the same file and which the oracle drives beside "
        "the allocator).",
        f"- **The oracle alone** (`--seconds {settings.get('budget'):g}` on the "
        f"prefix-caching allocator, then {settings.get('budget', 0) / 2:g} on the device pair "
        "if need be): "
        f"{_rate(len(oracle), len(judged))} of all non-equivalent mutants killed "
        f"({_counts(judged, 'oracle')}); in the allocator's own code "
        f"{_rate(len(oracle & allocator), len(allocator))}.",
        f"- **vLLM's own block tests** ({suite}, `-x`): {_rate(len(tests), len(judged))} "
        f"killed ({_counts(judged, 'tests')}); in the allocator's own code "
        f"{_rate(len(tests & allocator), len(allocator))}.",
        f"- Killed by both: {len(oracle & tests)}; only by the oracle: {len(oracle - tests)}; "
        f"only by vLLM's tests: {len(tests - oracle)} ({len((tests - oracle) & allocator)} in "
        f"the allocator's own code); by neither: {len(judged) - len(oracle | tests)}.",
        f"- Wall time: {wall:.0f} s ({wall / 60:.1f} min) over {len(data['sessions'])} "
        f"session(s) ({', '.join(_session(s) for s in data['sessions'])}); judge time: "
        f"oracle {sum(m['oracle']['seconds'] for m in mutants.values()):.0f} s, tests "
        f"{sum(m['tests']['seconds'] for m in mutants.values()):.0f} s.",
        "",
        "Reproduce:",
        "",
        "```",
        command,
        "```",
        "",
    ]

    def listing(names: Sequence[str]) -> str:
        if not names:
            return "None.\n"
        lines: List[str] = []
        for title, part in (("In the allocator's own code", [k for k in names if k in allocator]),
                            (f"In {helpers}", [k for k in names if k not in allocator])):
            if part:
                lines += [f"**{title}** ({len(part)}):", ""]
                lines += [line for k in sorted(part)
                          for line in _entry(k, judged[k], ("oracle", "tests"))]
        return "\n".join(lines)

    only_oracle = sorted(oracle - tests)
    oracle_rows = ["| mutant | the oracle's finding | vLLM's tests |", "|---|---|---|"]
    oracle_rows += [f"| `{_short(k)}` | `{judged[k]['oracle']['detail']}` | survived |"
                    for k in only_oracle]
    stale = [e.name for e in equivalents if not any(v is e for v in listed.values())]
    killed_listed = [k for k in listed if mutants[k]["oracle"]["status"] != "survived"
                     or mutants[k]["tests"]["status"] != "survived"]
    checks = [f"- Listed as equivalent and killed all the same (the entry is wrong): "
              f"{', '.join(f'`{_short(k)}`' for k in killed_listed) or 'none'}.",
              f"- Listed but not in this sample: {len(stale)}."]
    return {
        "summary": "\n".join(summary),
        "only-oracle": ("\n".join(oracle_rows) + "\n") if only_oracle else "None.\n",
        "only-tests": listing(sorted(tests - oracle)),
        "oracle-survivors": listing(sorted(set(judged) - oracle)),
        "equivalence-checks": "\n".join(checks) + "\n",
    }


_TEMPLATE = """\
# Mutation testing of vLLM 0.8.5's prefix-caching allocator

Rendered by `python bench/vllm_mutation.py` from bench/vllm_mutation.json; the text
outside the generated sections (and the list of equivalent mutants) is written by hand.

## Summary

<!-- generated: summary -->
<!-- end generated -->

## Killed only by the oracle

<!-- generated: only-oracle -->
<!-- end generated -->

## Killed only by vLLM's own tests

<!-- generated: only-tests -->
<!-- end generated -->

## Not killed by the oracle

<!-- generated: oracle-survivors -->
<!-- end generated -->

## Equivalent mutants

Each entry: the mutant, its changed lines, and why no test can tell it from vLLM's code.

<!-- generated: equivalence-checks -->
<!-- end generated -->

"""


def write_report(data: Mapping[str, Any], report: Path, command: str) -> None:
    """Fill the generated sections of ``report`` (made from a template when
    missing) from ``data``; the hand-written text is kept."""
    text = report.read_text(encoding="utf-8") if report.exists() else _TEMPLATE
    sections = render(data, mutation.load_equivalents(report), command)
    report.write_text(fill_sections(text, sections, report.name), encoding="utf-8")


# -- command line -------------------------------------------------------------------------------

def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line: run (or resume) the campaign, then render the report.
    Returns 0, or 2 when the campaign cannot run."""
    parser = argparse.ArgumentParser(prog="python bench/vllm_mutation.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, default=200, help="mutants to judge (200)")
    parser.add_argument("--seed", type=int, default=0,
                        help="the sample's and the oracle's seed (0)")
    parser.add_argument("--budget", type=float, default=10.0,
                        help="the oracle's seconds per mutant (10)")
    parser.add_argument("--call-timeout", type=float, default=2.0,
                        help="a call of the mutant longer than this is a hang (2 s)")
    parser.add_argument("--jobs", type=int, default=2, help="mutants judged at once (2)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the campaign in the results file")
    parser.add_argument("--rejudge-oracle", choices=("survivors", "all"), default=None,
                        help="with --resume: the oracle judges again the mutants it did not "
                             "kill, or all of them, and the tests' verdicts are kept (after a "
                             "change of the oracle or of its judge; a campaign of an older "
                             "judge version is accepted)")
    parser.add_argument("--report", action="store_true", help="no run: render the report")
    parser.add_argument("--all", action="store_true",
                        help="judge the mutants listed as equivalent too")
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="the results file (bench/vllm_mutation.json)")
    parser.add_argument("--output", type=Path, default=REPORT,
                        help="the report (bench/VLLM_MUTATION.md)")
    parser.add_argument("--smoke", action="store_true",
                        help=f"CI: {len(SMOKE_MUTANTS)} mutants, a 3 s budget, only "
                             f"{SMOKE_TESTS[0]}; results and report in a scratch directory "
                             "unless --results/--output are given")
    args = parser.parse_args(argv)
    if args.smoke:
        return smoke(args)
    command = (f"python bench/vllm_mutation.py --sample {args.sample} --seed {args.seed} "
               f"--budget {args.budget:g} --jobs {args.jobs}")
    if args.report:
        write_report(load_results(args.results), args.output, command)
        print(f"report: {args.output}")
        return 0
    return campaign(args, command, names=(), tests=())


def campaign(args: argparse.Namespace, command: str, names: Sequence[str],
             tests: Sequence[str]) -> int:
    """Run the campaign ``args`` describe (only the mutants ``names`` when
    given, only the tests ``tests`` when given) and write its report."""
    mutation.limit_memory()  # inherited by every judge
    started = time.monotonic()
    repairs: vllm_source.Edits = vllm_repaired.EDITS
    settings = Settings(sample=args.sample, seed=args.seed, budget=args.budget,
                        call_timeout=args.call_timeout, repairs=edits_digest(repairs),
                        tests=tuple(tests))
    data = load_results(args.results) if args.resume else load_results(Path("/nonexistent"))
    wanted = json.loads(json.dumps(asdict(settings)))
    if args.rejudge_oracle and data["settings"] is not None:  # another judge is fine
        wanted["judge_version"] = data["settings"]["judge_version"]
    if args.resume and data["settings"] not in (None, wanted):
        print(f"error: {args.results} holds a campaign with other settings "
              f"({data['settings']}); run without --resume to start afresh", file=sys.stderr)
        return 2
    repaired = vllm_source.source_tree(VERSION, repairs)
    population = [mutant for path in FILES for mutant in
                  mutants_of(path, (repaired / "vllm" / path).read_text(encoding="utf-8"))]
    chosen = ([m for m in population if m.name in names] if names
              else sample(population, args.sample, args.seed))
    print(f"{len(population)} mutants of {', '.join(FILES)}; {len(chosen)} chosen", flush=True)
    test_timeout = 120.0
    if data["baseline"] is None or args.rejudge_oracle:  # a new oracle: a new baseline
        data["baseline"] = baseline(repaired, settings, test_timeout)
    test_timeout = max(test_timeout, 5 * data["baseline"]["tests"]["seconds"])
    data["settings"] = asdict(settings)
    data["population"] = len(population)
    equivalents = mutation.load_equivalents(args.output)
    skip = (lambda m: False) if args.all else (
        lambda m: mutation.equivalent_of(m.name, m.diff, equivalents) is not None)
    session = {"seconds": 0.0, "jobs": args.jobs, "judge_version": JUDGE_VERSION,
               "rejudge_oracle": args.rejudge_oracle}
    data["sessions"].append(session)
    try:
        run_campaign(chosen, data, repairs, settings, args.jobs, test_timeout, args.results,
                     skip, args.rejudge_oracle)
    finally:
        session["seconds"] = round(time.monotonic() - started, 1)
        save_results(args.results, data)
        write_report(data, args.output, command)
    print(f"report: {args.output}", flush=True)
    return 0


def smoke(args: argparse.Namespace) -> int:
    """The CI smoke: :data:`SMOKE_MUTANTS` with a 3 s budget, judged by the
    oracle and by :data:`SMOKE_TESTS`, results and report in a scratch
    directory (or where ``--results``/``--output`` say)."""
    with tempfile.TemporaryDirectory(prefix="vllm-mutation-smoke-",
                                     ignore_cleanup_errors=True) as tmp:
        scratch = Path(tmp)
        if args.results == RESULTS:
            args.results = scratch / "vllm_mutation.json"
        if args.output == REPORT:
            args.output = scratch / "VLLM_MUTATION.md"
        args.budget, args.sample, args.resume = 3.0, len(SMOKE_MUTANTS), False
        code = campaign(args, "python bench/vllm_mutation.py --smoke", SMOKE_MUTANTS,
                        SMOKE_TESTS)
        print(args.output.read_text(encoding="utf-8"))
        return code


if __name__ == "__main__":
    sys.exit(main())
