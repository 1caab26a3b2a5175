"""The distinct findings of a campaign: one per signature, each with its
shortest trace, its own trace file, and, where it exists only because of a
stricter option of the spec, that option and the presets that accept it.

A *baseline* is an earlier JSON report (``prefixcache fuzz --json``): the
signatures it lists are known, and a campaign fails only on new ones.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Set

from ..spec.semantics import OPTIONS, PRESETS, Semantics
from .replay import replay
from .targets import Target
from .trace import Trace, render
from .violations import Violation

#: The file name of a finding's trace: its number and its signature, slugged.
TRACE_NAME = "{index:02d}-{slug}.trace.json"
_TRACE_FILE = re.compile(r"^\d\d-.*\.trace\.json$")


@dataclass
class Explanation:
    """Why a finding exists only under some options: the options whose other
    rule makes it go away, and the presets that take those rules."""

    options: List[str]
    accepted_by: List[str]

    def to_json(self) -> Dict[str, Any]:
        return {"options": self.options, "accepted_by": self.accepted_by}

    def sentence(self) -> str:
        """One line for the summary."""
        presets = ", ".join(self.accepted_by) or "no preset"
        return (f"only under prefixcache's rule of {', '.join(self.options)}; "
                f"accepted by --semantics {presets}")


@dataclass
class Finding:
    """One distinct violation: the shortest seen, whether Hypothesis shrank
    it, and what explains it."""

    violation: Violation
    shrunk: bool
    explanation: Optional[Explanation] = None
    trace_file: Optional[str] = None

    @property
    def signature(self) -> str:
        return self.violation.signature

    @property
    def length(self) -> int:
        """Steps in its trace (how short the reproduction is)."""
        trace = self.violation.trace
        return len(trace.steps) if trace is not None else 0

    def to_json(self) -> Dict[str, Any]:
        """The finding as reported in JSON: the violation, its program and
        trace, its trace file, whether it was shrunk, its explanation."""
        data = self.violation.to_json()
        data["shrunk"] = self.shrunk
        data["explained_by"] = self.explanation.to_json() if self.explanation else None
        trace = self.violation.trace
        if trace is not None:
            data["steps_to_reproduce"] = len(trace.steps)
            data["program"] = render(trace)
            data["trace"] = trace.to_json()
        data["trace_file"] = self.trace_file
        return data

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> Finding:
        """The finding a ``to_json`` object holds (a worker's report)."""
        violation = Violation.from_json(data)
        if data.get("trace") is not None:
            violation.trace = Trace.from_json(data["trace"])
        explained = data.get("explained_by")
        return cls(violation, bool(data.get("shrunk")),
                   Explanation(**explained) if explained else None, data.get("trace_file"))


@dataclass
class Findings:
    """The findings of one campaign, by signature, and the known signatures
    (a baseline's, and every finding's once recorded)."""

    known: Set[str] = field(default_factory=set)
    found: Dict[str, Finding] = field(default_factory=dict)

    def add(self, finding: Finding) -> bool:
        """Record ``finding`` unless a shorter one of its signature is
        recorded; its signature becomes known.  Returns whether it is new."""
        new = finding.signature not in self.found
        old = self.found.get(finding.signature)
        if old is None or (finding.shrunk, -finding.length) > (old.shrunk, -old.length):
            self.found[finding.signature] = finding
        self.known.add(finding.signature)
        return new

    def __len__(self) -> int:
        return len(self.found)

    def in_order(self) -> List[Finding]:
        """The findings, in the order they were first recorded."""
        return list(self.found.values())


def read_baseline(path: Path) -> Set[str]:
    """The signatures an earlier JSON report lists (its findings and the
    known findings it met again).  ValueError when it is not such a report."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read the baseline {path}: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("findings"), list):
        raise ValueError(f"{path} is not a prefixcache fuzz --json report (no findings list)")
    entries: Iterable[Any] = list(data["findings"]) + list(data.get("known", []))
    return {entry["signature"] for entry in entries
            if isinstance(entry, dict) and isinstance(entry.get("signature"), str)}


def explain(finding: Finding, target: Target, semantics: Semantics, *, white_box: bool,
            call_timeout: Optional[float],
            presets: Optional[Dict[str, Semantics]] = None) -> Optional[Explanation]:
    """The options that alone explain ``finding``: replayed with one option
    switched to vLLM's rule, its trace runs past the failing step clean.
    If no single option does, all of prefixcache's rules switched together
    are tried.  None when the finding stands under every preset (a fault),
    or it has no trace to replay (a hang is not replayed: it would cost the
    whole call timeout again).  ``presets``: those to name (default: v0's)."""
    violation, trace = finding.violation, finding.violation.trace
    if trace is None or violation.category == "hang" or violation.step is None:
        return None
    strict = [o for o in OPTIONS if not semantics.value(o)]

    def clean_under(flipped: Semantics) -> bool:
        result = replay(trace, target, white_box=white_box, semantics=flipped,
                        call_timeout=call_timeout)
        return result.violation is None or result.steps_run > (violation.step or 0)

    alone = [o for o in strict if clean_under(semantics.flipped(o))]
    if not alone and len(strict) > 1:
        together = semantics
        for option in strict:
            together = together.flipped(option)
        if clean_under(together):
            alone = strict
    if not alone:
        return None
    accepted = [name for name, preset in (presets or PRESETS).items()
                if all(preset.value(o) for o in alone)]
    return Explanation([o.name for o in alone], accepted)


def slug(signature: str) -> str:
    """A file-name-safe form of a signature."""
    return re.sub(r"[^A-Za-z0-9_.]+", "-", signature).strip("-")


def write_traces(findings: List[Finding], directory: Path) -> None:
    """Write each finding's trace to ``directory`` (made if needed), named
    :data:`TRACE_NAME`, after removing the trace files an earlier campaign
    wrote there; set each finding's ``trace_file``."""
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.iterdir():
        if _TRACE_FILE.match(old.name):
            old.unlink()
    for index, finding in enumerate(findings, start=1):
        trace = finding.violation.trace
        if trace is None:
            continue
        path = directory / TRACE_NAME.format(index=index, slug=slug(finding.signature))
        trace.save(path)
        finding.trace_file = str(path)
