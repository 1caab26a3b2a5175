"""Degenerate content hashes, for ``hash_algo`` (``(parent_hash, token_ids,
extra_hash) -> int``): each makes two different contents share a hash, so a
prefix-caching allocator built with it hands one request another's cached
KV.  ``prefixcache fuzz --hash-algo helpers.degenerate_hashes:constant`` (with this
folder on ``PYTHONPATH``) shows the oracle flagging it."""

from __future__ import annotations

from typing import Optional, Sequence

from prefixcache.impl.hashing import sha256_hash

#: A Mersenne prime modulus and a base that is -1 modulo it: for the
#: polynomial hash below, B**2 == 1 (mod M).
MODULUS = 2**61 - 1
BASE = MODULUS - 1


def constant(parent: Optional[int], token_ids: Sequence[int], extra: Optional[int]) -> int:
    """Every content hashes to 42."""
    return 42


def eight_bit(parent: Optional[int], token_ids: Sequence[int], extra: Optional[int]) -> int:
    """SHA-256 truncated to 8 bits (256 values: two contents an example
    meets collide only now and then).  SHA-256, not the per-process builtin
    hash, so every run of a given seed sees the same collisions."""
    return sha256_hash(parent, token_ids, extra) & 0xFF


def polynomial(parent: Optional[int], token_ids: Sequence[int], extra: Optional[int]) -> int:
    """A polynomial (Horner) hash of the chain: the parent's hash, the extra
    hash, then the tokens, in base ``BASE`` modulo ``MODULUS``.

    The known algebraic collision: ``BASE = MODULUS - 1``, so for two equal
    tokens ``t * BASE + t = t * MODULUS == 0``; the blocks ``[0, 0]``,
    ``[1, 1]`` and ``[2, 2]`` (and ``[0, 1]`` and ``[1, 2]``, ...) collide
    under any parent; and with ``BASE**2 == 1`` the chain ``[t]`` then
    ``[0]`` (block size 1) has the hash of ``[t]`` alone.  All of them are
    spelled by the oracle's three tokens."""
    h = 0 if parent is None else parent
    for x in (0 if extra is None else extra, *token_ids):
        h = (h * BASE + x) % MODULUS
    return h
