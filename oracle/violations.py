"""How the oracle reports a target that parts from the spec."""

from __future__ import annotations

from typing import Any, Dict, Optional

#: Every category, with what it means.
CATEGORIES: Dict[str, str] = {
    "conformance": "an observable result differs from the model's",
    "invariant": "the target's abstract state breaks an invariant of the spec",
    "integrity": "a cache hit handed out an id that holds other content",
    "robustness": "a caller mistake was accepted, answered with the wrong exception, "
    "or changed the state",
    "crash": "a valid call raised an exception outside the API's vocabulary",
}


class Violation(AssertionError):
    """The target broke the spec at ``step`` (an index into the trace).

    An AssertionError, so that Hypothesis and pytest report it as a failed
    test and shrink it."""

    def __init__(self, category: str, message: str, step: Optional[int] = None) -> None:
        if category not in CATEGORIES:
            raise ValueError(f"unknown violation category {category!r}")
        super().__init__(f"[{category}] {message}" + ("" if step is None else f" (step {step})"))
        self.category = category
        self.message = message
        self.step = step
        #: the trace that led here (a prefixcache.oracle.trace.Trace), once known
        self.trace: Optional[Any] = None

    def to_json(self) -> Dict[str, Any]:
        """The violation as a JSON object (without its trace)."""
        return {"category": self.category, "message": self.message, "step": self.step}
