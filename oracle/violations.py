"""How the oracle reports a target that parts from the spec.

A :class:`Violation` names its category, the operation of the step where
target and model parted, and the rule it breaks (an invariant's name, the
part of the state or the result that differs, the exception expected, ...).
Those three, with no ids or numbers, are its :attr:`~Violation.signature`:
findings with the same signature are one finding, and a baseline lists
known findings by signature.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

#: Every violation category, with what it means.
CATEGORIES: Dict[str, str] = {
    "conformance": "an observable result differs from the model's",
    "invariant": "the target's abstract state breaks an invariant of the spec",
    "integrity": "a cache hit handed out an id that holds other content",
    "robustness": "a caller mistake was accepted, answered with the wrong exception, "
    "or changed the state",
    "crash": "a valid call raised an exception outside the API's vocabulary",
    "hang": "a call of the target did not return within the call timeout",
}

#: The rule prefix of a finding put on refused caller mistakes (black-box:
#: ``robustness/<operation>/after-refusal:<rule>``).
AFTER_REFUSAL = "after-refusal:"


class Violation(AssertionError):
    """The target broke the spec at ``step`` (an index into the trace), in
    the call ``operation``, breaking ``rule``.

    An AssertionError, so that Hypothesis and pytest report it as a failed
    test and shrink it."""

    def __init__(self, category: str, message: str, step: Optional[int] = None, *,
                 operation: str = "", rule: str = "") -> None:
        if category not in CATEGORIES:
            raise ValueError(f"unknown violation category {category!r}")
        super().__init__(f"[{category}] {message}" + ("" if step is None else f" (step {step})"))
        self.category = category
        self.message = message
        self.step = step
        self.operation = operation
        self.rule = rule
        #: the trace that led here (a prefixcache.oracle.trace.Trace), once known
        self.trace: Optional[Any] = None

    def __reduce__(self) -> Any:
        """Pickled (to another process) as a plain Violation with its trace."""
        return (_rebuild, (self.category, self.message, self.step, self.operation, self.rule,
                           self.trace))

    @property
    def signature(self) -> str:
        """``category/operation/rule``: what the finding is, without ids or numbers."""
        return f"{self.category}/{self.operation or '-'}/{self.rule or '-'}"

    def to_json(self) -> Dict[str, Any]:
        """The violation as a JSON object (without its trace)."""
        return {"category": self.category, "operation": self.operation, "rule": self.rule,
                "signature": self.signature, "message": self.message, "step": self.step}

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> Violation:
        """The violation a JSON object describes (``to_json``'s inverse)."""
        return cls(data["category"], data["message"], data.get("step"),
                   operation=data.get("operation", ""), rule=data.get("rule", ""))


def _rebuild(category: str, message: str, step: Optional[int], operation: str, rule: str,
             trace: Any, cls: type = Violation) -> Violation:
    violation: Violation = cls(category, message, step, operation=operation, rule=rule)
    violation.trace = trace
    return violation


_FINDING_CLASSES: Dict[str, type] = {}


def as_finding(violation: Violation) -> Violation:
    """The same violation as an instance of a class of its own signature.

    Hypothesis tells failures apart by exception class and place, and
    shrinks each apart: raised from one place as one class per signature,
    two different findings are never merged, and a finding is never shrunk
    into another."""
    cls = _FINDING_CLASSES.get(violation.signature)
    if cls is None:
        cls = _FINDING_CLASSES[violation.signature] = type(
            f"Finding[{violation.signature}]", (Violation,), {"__module__": __name__})
    return _rebuild(violation.category, violation.message, violation.step, violation.operation,
                    violation.rule, violation.trace, cls)
