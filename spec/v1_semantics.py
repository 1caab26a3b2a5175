"""The semantic presets of the v1 profile: whose rule decides where the v1
spec is stricter than vLLM 0.34.0's pool on a call its API allows (every
pinned release, 0.28.0 to 0.34.0, answers the mistakes alike, so
``vllm-0.34.0`` is vLLM's rule for each).

The v1 spec takes one option of :mod:`~prefixcache.spec.semantics` over:
``any-mistake-exception``.  A caller mistake raises ``ValueError`` in the
spec; 0.34.0 raises what its code happens to meet (an ``assert``, an
``IndexError``) for the rows it checks at all.  The other options concern v0
operations that a v1 pool does not have.  A mistake the pool accepts without
raising, or a refusal that changes the state, is a finding under both presets.
"""

from __future__ import annotations

from typing import Dict

from .semantics import PREFIXCACHE, Semantics

#: The v1 profile's presets, by name (``--api v1 --semantics NAME``).
V1_PRESETS: Dict[str, Semantics] = {
    "prefixcache": PREFIXCACHE,
    "vllm-0.34.0": Semantics(any_mistake_exception=True),
}
