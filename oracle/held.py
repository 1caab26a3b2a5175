"""What the oracle's state machine holds between steps: sequences of the
Blocks it was handed, by name."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import List, Optional

#: Sequence ids, unique in this process (the block-manager helpers key on them).
_SERIALS = itertools.count()


@dataclass
class Seq:
    """A sequence the machine holds: its blocks' names, first to last, the
    extra hash they were allocated with, their device ("GPU", or "CPU"
    after a swap out) and the sequence id the block-manager helpers know it by."""

    names: List[str]
    extra_hash: Optional[int]
    device: str = "GPU"
    serial: int = field(default_factory=lambda: next(_SERIALS))
