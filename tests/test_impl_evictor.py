"""prefixcache.impl.evictor: the LRU evictor's order (every tie-break rule),
its table, its errors, and the order after arbitrary add/update/remove/evict
sequences against a sorted() reference."""

from __future__ import annotations

from typing import Dict, Tuple

import pytest
from helpers.impl_snapshot import eviction_key, expect_rejected, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixcache.impl import errors as err
from prefixcache.impl.evictor import (
    BlockMetaData,
    EvictionPolicy,
    Evictor,
    LRUEvictor,
    make_evictor,
)


def test_policy_enum_and_factory() -> None:
    assert [p.name for p in EvictionPolicy] == ["LRU"]
    first, second = make_evictor(EvictionPolicy.LRU), make_evictor(EvictionPolicy.LRU)
    assert isinstance(first, LRUEvictor) and first is not second
    assert first.num_blocks == 0 and first.free_table == {}
    for bad in ("LRU", None, 1):
        with pytest.raises(ValueError):
            make_evictor(bad)  # type: ignore[arg-type]
        with pytest.raises(err.InvalidArgumentError):
            make_evictor(bad)  # type: ignore[arg-type]


def test_evictor_is_abstract() -> None:
    with pytest.raises(TypeError):
        Evictor()  # type: ignore[abstract]
    assert issubclass(LRUEvictor, Evictor)


def test_block_metadata() -> None:
    meta = BlockMetaData(content_hash=123, num_hashed_tokens=16, last_accessed=2.5)
    assert (meta.content_hash, meta.num_hashed_tokens, meta.last_accessed) == (123, 16, 2.5)
    assert repr(meta) == (
        "BlockMetaData(content_hash=123, num_hashed_tokens=16, last_accessed=2.5)"
    )
    meta.last_accessed = 3.0
    assert meta.last_accessed == 3.0
    with pytest.raises(AttributeError):
        meta.other = 1  # type: ignore[attr-defined]


def test_add_contains_num_blocks_and_insertion_order() -> None:
    e = LRUEvictor()
    e.add(5, 50, 4, 1.0)
    e.add(2, 20, 8, 0.0)
    e.add(9, 90, 4, 1.0)
    assert 5 in e and 2 in e and 9 in e and 3 not in e
    assert e.num_blocks == 3
    assert list(e.free_table.keys()) == [5, 2, 9]
    meta = e.free_table[2]
    assert (meta.content_hash, meta.num_hashed_tokens, meta.last_accessed) == (20, 8, 0.0)


def test_add_of_a_present_id_overwrites_in_place() -> None:
    e = LRUEvictor()
    e.add(1, 10, 4, 5.0)
    e.add(2, 20, 4, 6.0)
    e.add(1, 11, 12, 7.0)
    assert list(e.free_table.keys()) == [1, 2]
    meta = e.free_table[1]
    assert (meta.content_hash, meta.num_hashed_tokens, meta.last_accessed) == (11, 12, 7.0)
    assert e.num_blocks == 2
    assert e.evict() == (2, 20)
    assert e.evict() == (1, 11)
    assert e.num_blocks == 0


def test_rule_1_oldest_access_first() -> None:
    e = LRUEvictor()
    e.add(0, 100, 4, 3.0)
    e.add(1, 101, 4, 1.0)
    e.add(2, 102, 4, 2.0)
    assert [e.evict() for _ in range(3)] == [(1, 101), (2, 102), (0, 100)]


def test_rule_2_on_equal_access_most_hashed_tokens_first() -> None:
    # a chain of three blocks freed together is evicted from its tail
    e = LRUEvictor()
    e.add(0, 100, 4, -1)
    e.add(1, 101, 8, -1)
    e.add(2, 102, 12, -1)
    assert [e.evict() for _ in range(3)] == [(2, 102), (1, 101), (0, 100)]


def test_rule_3_then_smallest_id() -> None:
    e = LRUEvictor()
    for block_id in (7, 3, 5, 0):
        e.add(block_id, 1000 - block_id, 4, -1)
    assert [e.evict()[0] for _ in range(4)] == [0, 3, 5, 7]


def test_rule_4_the_live_hash_wins_over_a_stale_one() -> None:
    # rule 4 (smallest hash) can only separate two entries of one id, and only
    # one of them is live: the evictor must return the live entry's hash
    e = LRUEvictor()
    e.add(1, 3, 4, 0.0)
    e.add(1, 5, 4, 0.0)
    assert e.evict() == (1, 5)
    assert e.num_blocks == 0
    e.add(1, 9, 4, 0.0)
    e.add(1, 2, 4, 0.0)
    assert e.evict() == (1, 2)


def test_all_rules_together() -> None:
    e = LRUEvictor()
    entries = [  # id, hash, tokens, last accessed
        (4, 44, 4, 2.0), (1, 11, 8, 2.0), (6, 66, 8, 2.0), (3, 33, 16, 5.0),
        (0, 10, 4, 1.0), (2, 22, 4, 2.0),
    ]
    for entry in entries:
        e.add(*entry)
    assert snapshot(e)["evict_order"] == [0, 1, 6, 2, 4, 3]
    assert [e.evict() for _ in range(6)] == [(0, 10), (1, 11), (6, 66), (2, 22), (4, 44),
                                             (3, 33)]


def test_update_reorders() -> None:
    e = LRUEvictor()
    e.add(0, 10, 4, 1.0)
    e.add(1, 11, 4, 2.0)
    e.update(0, 3.0)
    assert e.free_table[0].last_accessed == 3.0
    assert list(e.free_table.keys()) == [0, 1]
    assert e.evict() == (1, 11)
    e.update(0, 0.5)
    e.add(2, 12, 4, 1.0)
    assert e.evict() == (0, 10)
    assert e.evict() == (2, 12)


def test_remove() -> None:
    e = LRUEvictor()
    e.add(0, 10, 4, 1.0)
    e.add(1, 11, 4, 2.0)
    e.remove(0)
    assert 0 not in e and e.num_blocks == 1
    assert e.evict() == (1, 11)


def test_peek_does_not_remove() -> None:
    e = LRUEvictor()
    e.add(0, 10, 4, 2.0)
    e.add(1, 11, 4, 1.0)
    e.update(1, 5.0)
    assert e.peek() == (0, 10)
    assert e.peek() == (0, 10)
    assert e.num_blocks == 2
    assert e.evict() == (0, 10)


def test_evict_and_peek_on_empty() -> None:
    e = LRUEvictor()
    for call in (e.evict, e.peek):
        exc = expect_rejected(e, err.EvictorEmptyError, call, match="^No usable cache memory left$")
        assert isinstance(exc, ValueError)
    e.add(3, 30, 4, 0.0)
    e.remove(3)
    expect_rejected(e, ValueError, e.evict)


def test_remove_of_an_absent_id() -> None:
    e = LRUEvictor()
    e.add(0, 10, 4, 1.0)
    e.add(1, 11, 8, 1.0)
    exc = expect_rejected(e, err.NotInEvictorError, lambda: e.remove(7),
                          match="^Attempting to remove block that's not in the evictor$")
    assert isinstance(exc, ValueError)
    e.evict()
    expect_rejected(e, ValueError, lambda: e.remove(1))  # evicted already
    assert e.evict() == (0, 10)


def test_update_of_an_absent_id() -> None:
    e = LRUEvictor()
    e.add(0, 10, 4, 1.0)
    exc = expect_rejected(e, err.NotInEvictorError, lambda: e.update(5, 2.0))
    assert isinstance(exc, KeyError)
    e.remove(0)
    expect_rejected(e, KeyError, lambda: e.update(0, 2.0))
    e.add(0, 10, 4, 1.0)
    assert e.evict() == (0, 10)


def test_many_updates_keep_the_heap_small() -> None:
    e = LRUEvictor()
    e.add(0, 10, 4, 0.0)
    e.add(1, 11, 4, 0.5)
    for t in range(1, 5000):
        e.update(0, float(t))
        assert len(e.priority_queue) <= 2 * e.num_blocks + 64 + 1
    assert e.evict() == (1, 11)
    assert e.evict() == (0, 10)


# --------------------------------------------------------------------------
# property: the evictor agrees with a sorted() reference at every step

_ids = st.integers(min_value=0, max_value=12)
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), _ids, st.integers(0, 3), st.integers(0, 4), st.integers(-1, 4)),
        st.tuples(st.just("update"), _ids, st.integers(-1, 4)),
        st.tuples(st.just("remove"), _ids),
        st.tuples(st.just("evict")),
        st.tuples(st.just("peek")),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(_ops)
def test_order_matches_a_sorted_reference(ops: list) -> None:
    e = LRUEvictor()
    ref: Dict[int, Tuple[int, int, float]] = {}  # id -> (hash, tokens, last accessed)

    def ref_order() -> list:
        return sorted(ref, key=lambda i: (ref[i][2], -ref[i][1], i, ref[i][0]))

    for op in ops:
        kind = op[0]
        if kind == "add":
            _, block_id, content_hash, tokens, ts = op
            e.add(block_id, content_hash, tokens, ts)
            ref[block_id] = (content_hash, tokens, ts)
        elif kind == "update":
            _, block_id, ts = op
            if block_id in ref:
                e.update(block_id, ts)
                ref[block_id] = (ref[block_id][0], ref[block_id][1], ts)
            else:
                expect_rejected(e, KeyError, lambda b=block_id, t=ts: e.update(b, t))
        elif kind == "remove":
            block_id = op[1]
            if block_id in ref:
                e.remove(block_id)
                del ref[block_id]
            else:
                expect_rejected(e, ValueError, lambda b=block_id: e.remove(b))
        elif kind in ("evict", "peek"):
            if not ref:
                expect_rejected(e, ValueError, getattr(e, kind))
                continue
            victim = ref_order()[0]
            result = getattr(e, kind)()
            assert result == (victim, ref[victim][0])
            if kind == "evict":
                del ref[victim]
        assert e.num_blocks == len(ref)
        assert set(e.free_table) == set(ref)
        s = snapshot(e)
        assert s["evict_order"] == ref_order()
        assert [eviction_key(i, e.free_table[i]) for i in s["evict_order"]] == sorted(
            eviction_key(i, m) for i, m in e.free_table.items())
    drained = []
    while e.num_blocks:
        drained.append(e.evict())
    assert drained == [(i, ref[i][0]) for i in ref_order()]
