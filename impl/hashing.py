"""Content hashes: the key under which a full block is cached.

A content hash names a block's content: its tokens, its extra hash and,
through the parent's hash, every token before it.  Three choices:

* ``"builtin"`` (default): vLLM 0.8.5's value, Python's ``hash`` of
  ``(is_first_block, parent_hash, *tokens, extra_hash)`` with the parent of a
  first block written ``hash('None')``.  Seeded per process like vLLM (it
  differs between processes unless ``PYTHONHASHSEED`` is fixed) and 64-bit,
  so collisions can be constructed.
* ``"sha256"``: SHA-256 over an unambiguous encoding of the parent hash, the
  extra hash and the tokens; the same in every process; collision-resistant.
* any callable ``(parent_hash, token_ids, extra_hash) -> int`` where
  ``parent_hash`` is None for a first block.
"""

from __future__ import annotations

import hashlib
from array import array
from typing import Callable, Optional, Sequence, Union

from .errors import InvalidArgumentError

#: The parent hash vLLM uses for a first block, and its "no hash yet" sentinel.
NONE_HASH: int = hash("None")

HashFunction = Callable[[Optional[int], Sequence[int], Optional[int]], int]
HashAlgo = Union[str, HashFunction]


def builtin_hash(parent_hash: Optional[int], token_ids: Sequence[int],
                 extra_hash: Optional[int]) -> int:
    """vLLM 0.8.5's content hash (per-process seeded)."""
    if parent_hash is None:
        return hash((True, NONE_HASH, *token_ids, extra_hash))
    return hash((False, parent_hash, *token_ids, extra_hash))


def _encode_int(value: int) -> bytes:
    """A self-delimiting encoding of any int: sign byte, 8-byte length, magnitude."""
    magnitude = abs(value)
    raw = magnitude.to_bytes((magnitude.bit_length() + 7) // 8, "big")
    return (b"-" if value < 0 else b"+") + len(raw).to_bytes(8, "big") + raw


def _encode_optional(value: Optional[int]) -> bytes:
    return b"\x00" if value is None else b"\x01" + _encode_int(value)


def sha256_hash(parent_hash: Optional[int], token_ids: Sequence[int],
                extra_hash: Optional[int]) -> int:
    """SHA-256 of ``(parent, extra, tokens)`` as a 256-bit int.

    The encoding is unambiguous: the parent and the extra hash are tagged
    (absent / present) and length-prefixed, and the tokens are preceded by
    their count and encoded at a fixed width (8 bytes) or, for tokens outside
    the signed 64-bit range, each length-prefixed under a different tag."""
    digest = hashlib.sha256(b"prefixcache-block-v1")
    digest.update(_encode_optional(parent_hash))
    digest.update(_encode_optional(extra_hash))
    digest.update(len(token_ids).to_bytes(8, "big"))
    try:
        packed = array("q", token_ids).tobytes()
        digest.update(b"\x00" + packed)
    except OverflowError:
        digest.update(b"\x01" + b"".join(_encode_int(t) for t in token_ids))
    return int.from_bytes(digest.digest(), "big")


def resolve_hash_algo(hash_algo: HashAlgo) -> HashFunction:
    """The hash function that ``hash_algo`` names."""
    if isinstance(hash_algo, str):
        if hash_algo == "builtin":
            return builtin_hash
        if hash_algo == "sha256":
            return sha256_hash
        raise InvalidArgumentError(
            f"hash_algo must be 'builtin', 'sha256' or a callable, got {hash_algo!r}"
        )
    if callable(hash_algo):
        return hash_algo
    raise InvalidArgumentError(
        f"hash_algo must be 'builtin', 'sha256' or a callable, got {hash_algo!r}"
    )
