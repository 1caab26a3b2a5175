"""Traces: a run of allocator calls as data.

A trace is the allocator's configuration plus a list of :class:`Step`.  A
step names an operation and its arguments; Blocks are named symbolically
(``"b0"``, ``"b1"``, ... in the order they were handed out), so a trace
replays against any target.  A step may carry what the allocator answered
when it was recorded (``expect``), so a trace recorded in production can be
judged offline.  The JSON form is ``prefixcache-trace/1``; :func:`render`
prints a trace as the short Python program it stands for.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from ..spec.operations import BLOCK, BLOCKS, PREV_BLOCK, argument_names
from .trackers import CLASSES, COMPUTED, LAST_ACCESS
from .v1_trace import render_v1_step, v1_header

FORMAT = "prefixcache-trace/1"

#: argument names whose values are block names (or lists of them), from the
#: spec's table of operations
BLOCK_ARGS = argument_names(BLOCK, PREV_BLOCK)
BLOCK_LIST_ARGS = argument_names(BLOCKS)


@dataclass
class Step:
    """One call.  ``op`` is the allocator method (``append_token_ids`` is the
    Block's method, with the block in ``args["block"]``); ``args`` holds
    JSON values with blocks by name; ``out`` names the Blocks the call
    returned; ``expect`` is the recorded answer, if any:
    ``{"result": ...}`` or ``{"raises": "ExceptionClass"}``."""

    op: str
    args: Dict[str, Any] = field(default_factory=dict)
    out: List[str] = field(default_factory=list)
    expect: Optional[Dict[str, Any]] = None


@dataclass
class Trace:
    """A configuration and the steps run on it: the target (``target`` as
    named to ``--target``, ``kind``, ``strict``, the constructor ``options``
    as JSON values) and the ``semantics`` it was judged by (option name ->
    value, as :meth:`~prefixcache.spec.semantics.Semantics.to_json` gives)."""

    num_blocks: int
    block_size: int
    kind: str = "prefix"
    target: Optional[str] = None
    strict: bool = True
    steps: List[Step] = field(default_factory=list)
    violation: Optional[Dict[str, Any]] = None
    semantics: Dict[str, bool] = field(default_factory=dict)
    options: Dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> Dict[str, Any]:
        """The JSON object of this trace."""
        data = asdict(self)
        data["format"] = FORMAT
        for step in data["steps"]:
            if not step["out"]:
                del step["out"]
            if step["expect"] is None:
                del step["expect"]
        return data

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> Trace:
        """The trace a JSON object holds (ValueError when it is not one)."""
        if data.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} trace (format={data.get('format')!r})")
        steps = [
            Step(op=s["op"], args=dict(s.get("args", {})), out=list(s.get("out", [])),
                 expect=s.get("expect"))
            for s in data["steps"]
        ]
        return cls(
            num_blocks=int(data["num_blocks"]), block_size=int(data["block_size"]),
            kind=data.get("kind", "prefix"), target=data.get("target"),
            strict=bool(data.get("strict", True)), steps=steps,
            violation=data.get("violation"), semantics=dict(data.get("semantics") or {}),
            options=dict(data.get("options") or {}),
        )

    def save(self, path: Union[str, Path]) -> None:
        """Write the trace as JSON to ``path``."""
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: Union[str, Path]) -> Trace:
        """Read a JSON trace from ``path``."""
        return cls.from_json(json.loads(Path(path).read_text()))


def _arg(value: Any) -> str:
    return "None" if value is None else repr(value) if not isinstance(value, str) else value


def render_step(step: Step) -> str:
    """One step as a line of Python (blocks by name, allocator ``a``)."""
    args = dict(step.args)
    lhs = "[" + ", ".join(step.out) + "] = " if step.out else ""
    if step.op == "append_token_ids":
        block = args.pop("block")
        return f"{block}.append_token_ids({args['token_ids']!r})"
    parts = []
    for name, value in args.items():
        if name in BLOCK_ARGS:
            parts.append(f"{name}={_arg(value)}")
        elif name in BLOCK_LIST_ARGS:
            parts.append(f"{name}=[{', '.join(_arg(v) for v in value)}]")
        else:
            parts.append(f"{name}={value!r}")
    owner = "" if "." in step.op else "a."  # a block-manager helper's step names it
    call = f"{owner}{step.op}({', '.join(parts)})"
    if step.expect and "raises" in step.expect:
        return f"{lhs}{call}  # raises {step.expect['raises']}"
    return lhs + call


def render(trace: Trace) -> str:
    """The whole trace as a short Python program (a v1 trace, kind ``v1``, as
    calls of a v1 BlockPool)."""
    if trace.kind == "v1":
        lines = [v1_header(trace.num_blocks, trace.block_size)]
        lines += [render_v1_step(step.op, step.args) for step in trace.steps]
        return "\n".join(lines)
    lines = [f"a = make_allocator(num_blocks={trace.num_blocks}, block_size={trace.block_size})"]
    helpers = {step.op.partition(".")[0] for step in trace.steps if "." in step.op}
    if COMPUTED in helpers:
        lines.append(f"{COMPUTED} = {CLASSES[COMPUTED]}(a, {trace.block_size}, "
                     f"enable_caching=True)")
    if LAST_ACCESS in helpers:
        lines.append(f"{LAST_ACCESS} = {CLASSES[LAST_ACCESS]}(a)")
    lines += [render_step(step) for step in trace.steps]
    return "\n".join(lines)
