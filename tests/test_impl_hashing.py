"""prefixcache.impl.hashing: the builtin (vLLM) content hash, the SHA-256 one
(same in every process), custom callables, and that the choice reaches both
the blocks and ComputedBlocksTracker."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from typing import List, Optional, Sequence, Tuple

import pytest

from prefixcache.impl import errors as err
from prefixcache.impl.cpu_gpu_block_allocator import CpuGpuBlockAllocator
from prefixcache.impl.hashing import (
    NONE_HASH,
    builtin_hash,
    resolve_hash_algo,
    sha256_hash,
)
from prefixcache.impl.interfaces import Device
from prefixcache.impl.prefix_caching_block import (
    ComputedBlocksTracker,
    PrefixCachingBlock,
    PrefixCachingBlockAllocator,
)

H = PrefixCachingBlock.hash_block_tokens


def test_none_hash_is_vllms_sentinel() -> None:
    assert NONE_HASH == hash("None")
    assert PrefixCachingBlockAllocator._none_hash == NONE_HASH


def test_builtin_hash_equals_hash_block_tokens() -> None:
    for tokens, extra in (([1, 2, 3], None), ([0], 7), ([], None), ([-5, 10**12], -1)):
        first = builtin_hash(None, tokens, extra)
        assert first == H(True, None, tokens, extra) == hash((True, NONE_HASH, *tokens, extra))
        assert builtin_hash(first, tokens, extra) == H(False, first, tokens, extra)
    assert builtin_hash(None, [1, 2], 1) != builtin_hash(None, [1, 2], 2)


def test_sha256_hash_is_a_256_bit_int_and_deterministic() -> None:
    value = sha256_hash(None, [1, 2, 3], None)
    assert isinstance(value, int) and 0 <= value < 2**256
    assert value > 2**64  # not confined to the builtin hash's 64 bits
    assert sha256_hash(None, [1, 2, 3], None) == value
    assert sha256_hash(None, (1, 2, 3), None) == value


@pytest.mark.parametrize("left, right", [
    ((None, [1, 2], None), (0, [1, 2], None)),            # no parent vs parent 0
    ((None, [1, 2], None), (None, [1, 2], 0)),            # no extra vs extra 0
    ((None, [1, 2], None), (None, [1, 2, 0], None)),      # token count is encoded
    ((None, [1, 2], None), (None, [2, 1], None)),         # order matters
    ((5, [1], 6), (6, [1], 5)),                           # parent and extra not swappable
    ((None, [1], None), (None, [-1], None)),              # sign
    ((None, [2**63 - 1], None), (None, [2**63], None)),   # past signed 64 bits
    ((None, [2**63], None), (None, [-(2**63) - 1], None)),
    ((None, [2**64], None), (None, [0, 1], None)),
    ((2**300, [1], None), (2**300 + 1, [1], None)),        # big parents (sha256 hashes)
])
def test_sha256_hash_is_unambiguous(left: tuple, right: tuple) -> None:
    assert sha256_hash(*left) != sha256_hash(*right)


def _int_field(value: int) -> bytes:
    """The documented encoding of an int: sign, 8-byte big-endian length, magnitude."""
    magnitude = abs(value)
    raw = magnitude.to_bytes((magnitude.bit_length() + 7) // 8, "big")
    return (b"-" if value < 0 else b"+") + len(raw).to_bytes(8, "big") + raw


def _optional_field(value: Optional[int]) -> bytes:
    return b"\x00" if value is None else b"\x01" + _int_field(value)


@pytest.mark.parametrize("parent, tokens, extra", [
    (None, [1, 2, 3], None),
    (0, [0], 0),                          # zero: sign "+", no magnitude bytes
    (-1, [-2, 2**63 - 1], 255),            # negatives; 255 fits one byte, 256 needs two
    (2**300, [-(2**63)], 256),
    (7, [2**63, -(2**63) - 1, 0], -256),  # outside signed 64 bits: the tagged form
])
def test_sha256_hash_is_the_documented_encoding(parent: Optional[int], tokens: List[int],
                                                extra: Optional[int]) -> None:
    """The SHA-256 key is a versioned format ("prefixcache-block-v1") that must not
    drift, or hashes stored by one process stop matching another's."""
    head = (b"prefixcache-block-v1" + _optional_field(parent) + _optional_field(extra)
            + len(tokens).to_bytes(8, "big"))
    if all(-(2**63) <= t < 2**63 for t in tokens):
        body = b"\x00" + b"".join(t.to_bytes(8, sys.byteorder, signed=True) for t in tokens)
    else:
        body = b"\x01" + b"".join(_int_field(t) for t in tokens)
    expected = int.from_bytes(hashlib.sha256(head + body).digest(), "big")
    assert sha256_hash(parent, tokens, extra) == expected


def test_resolve_hash_algo() -> None:
    assert resolve_hash_algo("builtin") is builtin_hash
    assert resolve_hash_algo("sha256") is sha256_hash

    def mine(parent: Optional[int], tokens: Sequence[int], extra: Optional[int]) -> int:
        return 1

    assert resolve_hash_algo(mine) is mine
    for bad in ("md5", "SHA256", None, 3, [builtin_hash]):
        with pytest.raises(err.InvalidArgumentError):
            resolve_hash_algo(bad)  # type: ignore[arg-type]


_PROBE = """
import json
from prefixcache.impl.hashing import sha256_hash, builtin_hash
from prefixcache.impl.prefix_caching_block import PrefixCachingBlockAllocator
out = {}
for algo in ("sha256", "builtin"):
    a = PrefixCachingBlockAllocator(num_blocks=4, block_size=2, hash_algo=algo)
    chain = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]], extra_hash=5)
    out[algo] = [str(b.content_hash) for b in chain]
    out[algo + "_cached"] = [str(h) for h in a._cached_blocks]
print(json.dumps(out))
"""


def _probe(seed: str) -> dict:
    env = dict(os.environ, PYTHONHASHSEED=seed)
    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                          text=True, check=True, timeout=60)
    return json.loads(done.stdout)


def test_sha256_is_the_same_in_processes_with_different_hash_seeds() -> None:
    one, two = _probe("1"), _probe("4242")
    h1 = sha256_hash(None, [1, 2], 5)
    expected = [str(h1), str(sha256_hash(h1, [3, 4], 5))]
    assert one["sha256"] == two["sha256"] == expected
    assert one["sha256_cached"] == two["sha256_cached"] == expected
    # the builtin hash is seeded per process (through hash('None')), like vLLM's
    assert one["builtin"] != two["builtin"]
    assert one["builtin"] == one["builtin_cached"]


def test_sha256_allocator_shares_identical_prefixes() -> None:
    a = PrefixCachingBlockAllocator(num_blocks=4, block_size=2, hash_algo="sha256")
    x = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]])
    y = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]])
    assert [b.block_id for b in x] == [b.block_id for b in y] == [0, 1]
    h1 = sha256_hash(None, [1, 2], None)
    assert list(a._cached_blocks.items()) == [(h1, 0), (sha256_hash(h1, [3, 4], None), 1)]
    assert a.metric_data.num_incompleted_block_hit == 2


class Recorder:
    """A custom hash: deterministic, and it records every call."""

    def __init__(self) -> None:
        self.calls: List[Tuple[Optional[int], Tuple[int, ...], Optional[int]]] = []

    def __call__(self, parent: Optional[int], tokens: Sequence[int],
                 extra: Optional[int]) -> int:
        self.calls.append((parent, tuple(tokens), extra))
        value = 17 if parent is None else parent
        for t in tokens:
            value = value * 1_000_003 + t + 1
        return value * 31 + (0 if extra is None else extra + 1)

    @staticmethod
    def expected_chain(lists: List[List[int]], extra: Optional[int] = None) -> List[int]:
        fn = Recorder()
        out: List[int] = []
        parent: Optional[int] = None
        for tokens in lists:
            parent = fn(parent, tokens, extra)
            out.append(parent)
        return out


def test_custom_hash_is_used_by_the_blocks() -> None:
    fn = Recorder()
    a = PrefixCachingBlockAllocator(num_blocks=4, block_size=2, hash_algo=fn)
    assert a.content_hash_function is fn
    chain = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]], extra_hash=7)
    expected = Recorder.expected_chain([[1, 2], [3, 4]], extra=7)
    assert [b.content_hash for b in chain] == expected
    assert list(a._cached_blocks) == expected
    assert fn.calls[:2] == [(None, (1, 2), 7), (expected[0], (3, 4), 7)]
    # a block filled by appends is hashed (and promoted) with the same function
    m = a.allocate_mutable_block(chain[-1], extra_hash=7)
    m.append_token_ids([5, 6])
    assert m.content_hash == Recorder.expected_chain([[1, 2], [3, 4], [5, 6]], extra=7)[-1]
    assert a._cached_blocks[m.content_hash] == m.block_id == 2
    detached = PrefixCachingBlock(None, [1, 2], 2, a, extra_hash=7)
    assert detached.content_hash == expected[0]


def test_custom_hash_is_the_only_key() -> None:
    # a constant "hash" makes every first full block the same content
    a = PrefixCachingBlockAllocator(num_blocks=4, block_size=2,
                                    hash_algo=lambda parent, tokens, extra: 99)
    x = a.allocate_immutable_block(None, [1, 2])
    y = a.allocate_immutable_block(None, [3, 4])
    assert x.block_id == y.block_id == 0
    assert a._cached_blocks == {99: 0}


def test_custom_hash_is_used_by_computed_blocks_tracker() -> None:
    fn = Recorder()
    allocator = CpuGpuBlockAllocator.create("prefix_caching", 4, 0, 2, hash_algo=fn)
    assert allocator.content_hash_function is fn
    allocator.allocate_immutable_blocks(None, [[1, 2], [3, 4]], Device.GPU)
    allocator.mark_blocks_as_computed([])

    class Seq:
        seq_id = 1

        def get_token_ids(self) -> List[int]:
            return [1, 2, 3, 4, 5]

        def extra_hash(self) -> Optional[int]:
            return None

        def is_prefill(self) -> bool:
            return True

    tracker = ComputedBlocksTracker(allocator, 2, True)
    assert tracker.get_num_cached_tokens(Seq()) == 4
    assert tracker._seq_id_to_blocks_hashes[1] == Recorder.expected_chain([[1, 2], [3, 4]])
    # an allocator with the default hash gives the tracker vLLM's builtin hash
    builtin_tracker = ComputedBlocksTracker(
        CpuGpuBlockAllocator.create("prefix_caching", 4, 0, 2), 2, True)
    assert builtin_tracker._hash_fn is builtin_hash
