"""Stand-in for ``vllm.sampling_params``, written by prefixcache for vLLM's
block unit tests: ``tests/core/utils.py`` builds sequence groups with
``SamplingParams()`` and ``SamplingParams(max_tokens=..., min_tokens=...)``;
nothing in the block code reads them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class SamplingParams:
    """The sampling parameters of a request: only the fields the tests set,
    with vLLM's defaults."""

    n: int = 1
    max_tokens: Optional[int] = 16
    min_tokens: int = 0
