"""A time limit on one call of the target, so that a call that never returns
is a finding (category ``hang``) instead of a stalled job.

The limit is a real-time interval timer (``SIGALRM``): when it fires, the
running Python code of the target raises :class:`CallTimeout`.  It is a
``BaseException``, so that a target's ``except Exception`` cannot swallow
it.  It needs the main thread of a POSIX process; elsewhere (another thread,
Windows) calls run without a limit.  Code that blocks inside C without
returning to the interpreter is not interrupted.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator, Optional


class CallTimeout(BaseException):
    """A call of the target ran past its time limit."""


def _raise_timeout(signum: int, frame: Any) -> None:
    raise CallTimeout("the call ran past its time limit")


def can_limit() -> bool:
    """Whether a limit can be set here (the main thread of a POSIX process)."""
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def time_limit(seconds: Optional[float]) -> Iterator[None]:
    """Run the block with a limit of ``seconds`` (None or 0: no limit, nor
    where :func:`can_limit` is False): past it, :class:`CallTimeout` is
    raised inside the block.  The previous SIGALRM handler is put back."""
    if not seconds or not can_limit():
        yield
        return
    previous = signal.signal(signal.SIGALRM, _raise_timeout)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
