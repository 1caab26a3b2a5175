"""A deliberately wrong prefix search, for ``tests/test_verify.py``.

:func:`bisect_ready_prefix` finds the longest prefix of ready keys by
bisection, which is right only if the ready keys always form a prefix of the
list.  They need not: a block can be cached while an earlier block of the
same sequence was evicted, and then bisection may count the ready key after
the gap.  It wears the very contract of the spec's
:func:`~prefixcache.spec.pure.longest_ready_prefix`
(:func:`~prefixcache.spec.pure.prefix_search_contract`), so ``prefixcache
verify`` run on this module must find a counterexample such as
``keys=(a, b)``, ``ready={b}``.
"""

from __future__ import annotations

from typing import FrozenSet, Sequence, TypeVar

from prefixcache.spec.pure import prefix_search_contract

K = TypeVar("K")


@prefix_search_contract
def bisect_ready_prefix(keys: Sequence[K], ready: FrozenSet[K]) -> int:
    """Return the index of the first key that is not ready, found by
    bisection (wrong unless the ready keys form a prefix of ``keys``)."""
    lo, hi = 0, len(keys)
    while lo < hi:
        mid = (lo + hi) // 2
        if keys[mid] in ready:
            lo = mid + 1
        else:
            hi = mid
    return lo
