"""Python's recursion limit lowered for a block: the tests that walk a 100k
chain at limit 1000 show the walk does not recurse."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def recursion_limit(limit: int) -> Iterator[None]:
    """The recursion limit is ``limit`` inside the block, as it was after."""
    saved = sys.getrecursionlimit()
    sys.setrecursionlimit(limit)
    try:
        yield
    finally:
        sys.setrecursionlimit(saved)
