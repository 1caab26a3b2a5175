"""The spec's own steps keep its invariants: checked by CrossHair.

:func:`spec_steps_keep_invariants` runs a few of the named steps of
:mod:`prefixcache.spec.contracts` (take, lookup, release, promote,
copy-on-write) from a new allocator's state and returns the state they
reach; its postcondition is that every invariant of
:mod:`prefixcache.spec.invariants` holds there, that the free count is the
ids not in use, and that an id can be taken exactly when it is positive.
``prefixcache verify`` runs CrossHair over this module.

The exploration bounds and the on/off switch are those of
:mod:`prefixcache.spec.pure`.  Every function is pure: it builds its own
state and returns a value.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence, Tuple

from . import contracts as C
from .invariants import check_all
from .pure import bound, chain_key, ensure, require, small
from .state import AbstractState, ContentKey


def token_key(token: int) -> ContentKey:
    """The spec's content key of a one-token first block without extra hash."""
    return chain_key((), None, (token,))


def initial_state(num_blocks: int, block_size: int = 1) -> AbstractState:
    """Return the state of a new allocator: ids ``0 .. num_blocks-1`` all
    free, in order; nothing cached; no query."""
    ids = tuple(range(num_blocks))
    return AbstractState(block_ids=ids, free=ids, blocks={}, cached={}, evictor=(),
                         touched=frozenset(), copy_on_writes=(), hits=0, misses=0,
                         reported_free=num_blocks, block_size=block_size)


Op = Tuple[int, int]
"""One step of :func:`spec_steps_keep_invariants`: (kind, argument)."""


def apply_step(s: AbstractState, op: Op) -> AbstractState:
    """Return ``s`` after one of the spec's named steps, applied only where
    its precondition holds (else ``s`` itself).  ``op = (kind, argument)``,
    kind taken mod 5: 0 take a mutable id; 1 allocate the one-token content
    ``argument`` (a hit or a miss); 2 release the ``argument``-th id in use;
    3 promote the first mutable id to the one-token content ``argument``;
    4 fork the ``argument``-th id in use (one more reference) and copy it
    on write."""
    kind, arg = op[0] % 5, op[1]
    if kind == 0:
        return C.take(s)[0] if C.pre_allocate_mutable_block(s) else s
    if kind == 1:
        key = token_key(arg)
        return C.lookup(s, key)[0] if C.pre_allocate_immutable_block(s, key) else s
    used = sorted(s.in_use())
    if not used:
        return s
    i = used[arg % len(used)]
    if kind == 2:
        return C.release(s, i)[0]
    if kind == 3:
        key = token_key(arg)
        mutable = [j for j in used if C.pre_promote_to_immutable_block(s, j, key)]
        return C.promote(s, mutable[0], key)[0] if mutable else s
    blocks = dict(s.blocks)
    blocks[i] = replace(s.blocks[i], refcount=s.blocks[i].refcount + 1)
    shared = replace(s, blocks=blocks)
    if not C.pre_cow_block_if_not_appendable(shared, i):
        return s
    return C.copy_on_write(shared, i)[0]


def _sound(s: AbstractState) -> bool:
    """Every invariant holds, the free count is the ids not in use, and an
    id can be taken exactly when that count is positive."""
    return (check_all(s) == []
            and s.reported_free == len(s.block_ids) - len(s.in_use())
            and (C.next_id(s) is None) == (s.reported_free == 0))


@require(lambda num_blocks: num_blocks >= 0, "a pool size")
@bound(lambda num_blocks, ops: small(num_blocks) and small(len(ops)), "a few steps, few ids")
@ensure(lambda result: _sound(result),
        "every invariant holds on the states the spec's own steps build; the free count "
        "is the ids not in use; an id can be taken exactly when it is positive")
def spec_steps_keep_invariants(num_blocks: int, ops: Sequence[Op]) -> AbstractState:
    """Return the state reached from a new allocator of ``num_blocks`` ids
    (block size 1) by the spec's own steps (take, lookup, release, promote,
    copy-on-write) as ``ops`` name them (see :func:`apply_step`)."""
    s = initial_state(num_blocks)
    for op in ops:
        s = apply_step(s, op)
    return s


__all__ = [
    "Op",
    "apply_step",
    "initial_state",
    "spec_steps_keep_invariants",
    "token_key",
]
