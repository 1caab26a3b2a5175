"""What the oracle's state machine holds between steps: sequences of the
Blocks it was handed, by name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional


@dataclass
class Seq:
    """A sequence the machine holds: its blocks' names, first to last, the
    extra hash they were allocated with and their device ("GPU", or "CPU"
    after a swap out)."""

    names: List[str]
    extra_hash: Optional[int]
    device: str = "GPU"
