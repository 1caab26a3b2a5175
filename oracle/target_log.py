"""The target's own log lines during a campaign: counted and summarised, not
printed (vLLM 0.8.5 logs "Failed to reset prefix cache ..." each time a
reset is refused, which a campaign does thousands of times).

:func:`captured_logs` routes every log record of level INFO and above, and
every Python warning, to a counting handler for the length of the block,
then puts the logging configuration back as it was.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Tuple

#: (logger name, level name, message template): the template, not the
#: formatted line, so that lines that differ only in numbers count together.
LineKind = Tuple[str, str, str]


@dataclass
class LogTally:
    """How many log lines of each kind the target wrote."""

    counts: Counter[LineKind] = field(default_factory=Counter)

    @property
    def lines(self) -> int:
        """Every line counted."""
        return sum(self.counts.values())

    def merge(self, other: LogTally) -> None:
        """Add another tally's counts (another worker's)."""
        self.counts.update(other.counts)

    def to_json(self, most: int = 10) -> Dict[str, Any]:
        """The total and the ``most`` most frequent kinds of line."""
        kinds: List[Dict[str, Any]] = [
            {"logger": name, "level": level, "message": message, "count": count}
            for (name, level, message), count in self.counts.most_common(most)]
        return {"lines": self.lines, "kinds": kinds}

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> LogTally:
        """The tally a ``to_json`` object holds (its listed kinds only)."""
        tally = cls()
        for kind in data.get("kinds", []):
            tally.counts[(kind["logger"], kind["level"], kind["message"])] += kind["count"]
        return tally


class _Counting(logging.Handler):
    def __init__(self, tally: LogTally) -> None:
        super().__init__(logging.INFO)
        self.tally = tally

    def emit(self, record: logging.LogRecord) -> None:
        self.tally.counts[(record.name, record.levelname, str(record.msg))] += 1


@contextlib.contextmanager
def captured_logs() -> Iterator[LogTally]:
    """Count, instead of printing, every log record of level INFO and above
    that reaches the root logger, and every warning, inside the block."""
    tally = LogTally()
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    root.handlers = [_Counting(tally)]
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)
    try:
        yield tally
    finally:
        logging.captureWarnings(False)
        root.handlers, level = saved
        root.setLevel(level)
