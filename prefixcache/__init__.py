"""prefixcache: a formally specified prefix-caching KV-cache block allocator.

* ``prefixcache.spec``   -- what must hold: abstract state, invariants, contracts.
* ``prefixcache.model``  -- the abstract model, usable as a reference oracle.
* ``prefixcache.impl``   -- a fast, strict drop-in for ``vllm.core.block``.
* ``prefixcache.oracle`` -- Hypothesis stateful conformance of any allocator.
"""

__version__ = "0.1.0"
