"""The target's own log lines during a campaign: counted and summarised, not
printed (vLLM 0.8.5 logs "Failed to reset prefix cache ..." each time a
reset is refused, which a campaign does thousands of times).

A record whose arguments do not fit its message is the target's fault (the
logging module prints "--- Logging error ---" and a traceback in the middle
of the engine's output, or, with no arguments at all, the bare placeholder):
:func:`watch_log_formatting` formats every record as it is made, and
:func:`take_unformattable` hands the driver those that could not be, after
each call.

:func:`captured_logs` routes every log record of level INFO and above, and
every Python warning, to a counting handler for the length of the block,
then puts the logging configuration back as it was.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Tuple

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


#: A printf-style placeholder (``%d``, ``%s``, ``%.2f``, ...).
_PLACEHOLDER = re.compile(r"%[-+ #0]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa]")

#: Records that could not be formatted since the last take: (logger, message, error).
_UNFORMATTABLE: List[Tuple[str, str, str]] = []


def _checking(make: Callable[..., logging.LogRecord]) -> Callable[..., logging.LogRecord]:
    def make_checked(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        if record.msg is None:
            _UNFORMATTABLE.append((record.name, "None", "no message"))
        elif not record.args:  # logging prints the message as it is, placeholders and all
            if isinstance(record.msg, str) and _PLACEHOLDER.search(record.msg.replace("%%", "")):
                _UNFORMATTABLE.append((record.name, record.msg, "a placeholder, no argument"))
            return record
        try:
            record.getMessage()
        except Exception as exc:  # the message and its arguments do not fit
            _UNFORMATTABLE.append((record.name, str(record.msg), f"{type(exc).__name__}: {exc}"))
        return record

    make_checked.checks_formatting = True  # type: ignore[attr-defined]
    return make_checked


def watch_log_formatting() -> None:
    """Format every log record as it is made (once per process; idempotent)."""
    factory = logging.getLogRecordFactory()
    if not getattr(factory, "checks_formatting", False):
        logging.setLogRecordFactory(_checking(factory))


def take_unformattable() -> List[Tuple[str, str, str]]:
    """The records that could not be formatted since the last call (then none)."""
    taken = _UNFORMATTABLE[:]
    _UNFORMATTABLE.clear()
    return taken
