"""Each invariant accepts a valid state and rejects a hand-made violation."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Dict

import pytest

from prefixcache.spec import invariants as inv
from prefixcache.spec.state import AbstractState, BlockState, EvictorEntry

A12 = ((None, (1, 2)),)
A1234 = ((None, (1, 2)), (None, (3, 4)))
B78 = ((None, (7, 8)),)
C56 = ((None, (5, 6)),)


def valid() -> AbstractState:
    """Ids 0..5, block size 2: 0 immutable computed, 1 immutable shared and
    touched, 2 mutable, 3 evictable, 4 and 5 free."""
    return AbstractState(
        block_ids=(0, 1, 2, 3, 4, 5),
        free=(4, 5),
        blocks={
            0: BlockState(1, A12, True, -1.0),
            1: BlockState(2, A1234, False, -1.0),
            2: BlockState(1, None, False, 4.0),
            3: BlockState(0, B78, True, 3.0),
        },
        cached={A12: 0, A1234: 1, B78: 3},
        evictor=(EvictorEntry(3.0, 2, 3, B78),),
        touched=frozenset({1}),
        copy_on_writes=((2, 4),),
        hits=1,
        misses=3,
        reported_free=3,
        block_size=2,
    )


OWNERS = {0: 1, 1: 2, 2: 1}


def _blocks(s: AbstractState, **changes: BlockState) -> Dict[int, BlockState]:
    out = dict(s.blocks)
    for k, v in changes.items():
        out[int(k[1:])] = v
    return out


def _with_second_evictable(s: AbstractState) -> AbstractState:
    blocks = dict(s.blocks)
    blocks[4] = BlockState(0, C56, True, 1.0)
    return replace(
        s, free=(5,), blocks=blocks, cached={**s.cached, C56: 4},
        evictor=(EvictorEntry(3.0, 2, 3, B78), EvictorEntry(1.0, 2, 4, C56)),
    )


BREAKERS: Dict[str, Callable[[AbstractState], AbstractState]] = {
    "ids_well_formed": lambda s: replace(s, block_ids=(0, 2, 1, 3, 4, 5)),
    "partition": lambda s: replace(s, free=(4, 5, 0)),
    "refcounts_non_negative": lambda s: replace(
        s, blocks=_blocks(s, b2=BlockState(-1, None, False, -1.0))),
    "counting": lambda s: replace(s, reported_free=4),
    "cached_content_matches": lambda s: replace(s, cached={**s.cached, A12: 2}),
    "cached_ids_distinct": lambda s: replace(s, cached={**s.cached, ((None, (9, 9)),): 0}),
    "content_is_cached": lambda s: replace(
        s, cached={k: v for k, v in s.cached.items() if k != A12}),
    "content_whole_blocks": lambda s: replace(
        s, blocks=_blocks(s, b0=BlockState(1, ((None, (1,)),), True, -1.0)),
        cached={((None, (1,)),): 0, A1234: 1, B78: 3}),
    "evictable_hold_content": lambda s: replace(
        s, free=(4,), blocks=_blocks(s, b5=BlockState(0, None, True, -1.0))),
    "evictor_is_evictable": lambda s: replace(s, evictor=(), reported_free=2),
    "evictor_entries_match": lambda s: replace(s, evictor=(EvictorEntry(3.0, 3, 3, B78),)),
    "eviction_order": _with_second_evictable,
    "mutable_not_computed": lambda s: replace(
        s, blocks=_blocks(s, b2=BlockState(1, None, True, 4.0))),
    "touched_hold_content": lambda s: replace(s, touched=frozenset({1, 2})),
    "touched_not_computed": lambda s: replace(
        s, blocks=_blocks(s, b1=BlockState(2, A1234, True, -1.0))),
    "untouched_content_computed": lambda s: replace(
        s, blocks=_blocks(s, b0=BlockState(1, A12, False, -1.0))),
    "copy_on_writes_well_formed": lambda s: replace(s, copy_on_writes=((2, 2),)),
    "hit_counts_non_negative": lambda s: replace(s, misses=-1),
}


def test_every_invariant_has_a_breaker() -> None:
    assert {i.name for i in inv.INVARIANTS} == set(BREAKERS)


def test_registry_entries_are_named_and_explained() -> None:
    for i in inv.INVARIANTS:
        assert i.check is getattr(inv, i.name)
        assert i.meaning and i.meaning.endswith(".")
        assert inv.group_of(i.name) != "other"
    assert inv.group_of(inv.OWNERSHIP.name) == "ownership"


@pytest.mark.parametrize("name", sorted(BREAKERS))
def test_invariant_accepts_valid_state(name: str) -> None:
    assert getattr(inv, name)(valid()) is True


@pytest.mark.parametrize("name", sorted(BREAKERS))
def test_invariant_rejects_violation(name: str) -> None:
    bad = BREAKERS[name](valid())
    assert getattr(inv, name)(bad) is False
    assert name in inv.check_all(bad)


def test_the_second_evictable_in_order_is_valid() -> None:
    s = _with_second_evictable(valid())
    ordered = replace(s, evictor=tuple(sorted(s.evictor, key=EvictorEntry.eviction_rank)))
    assert inv.check_all(ordered) == []


def test_eviction_order_ties_break_on_depth_then_id() -> None:
    deep = EvictorEntry(1.0, 4, 7, A1234)
    shallow = EvictorEntry(1.0, 2, 5, A12)
    same_depth = EvictorEntry(1.0, 2, 6, ((None, (3, 4)),))
    assert sorted([same_depth, shallow, deep], key=EvictorEntry.eviction_rank) == [
        deep, shallow, same_depth]


@pytest.mark.parametrize("key", [
    (),                                    # names no block
    ((None, (1, 2, 3)), (None, (4,))),     # 4 tokens, but not one block each
    ((None, (1, 2)), (None, ())),          # an empty block
])
def test_content_whole_blocks_checks_every_block_of_the_key(key: object) -> None:
    s = valid()
    bad = replace(s, blocks=_blocks(s, b0=BlockState(1, key, True, -1.0)),  # type: ignore[arg-type]
                  cached={key: 0, A1234: 1, B78: 3})  # type: ignore[dict-item]
    assert not inv.content_whole_blocks(bad)
    assert inv.cached_content_matches(bad) and inv.content_is_cached(bad)


def test_evictor_tokens_count_every_block_of_the_key() -> None:
    s = valid()
    deep = replace(s, blocks=_blocks(s, b3=BlockState(0, A1234, True, 3.0)))
    assert not inv.evictor_entries_match(replace(deep, evictor=(EvictorEntry(3.0, 2, 3, A1234),)))
    assert inv.evictor_entries_match(replace(deep, evictor=(EvictorEntry(3.0, 4, 3, A1234),)))


def test_check_all_on_valid_state() -> None:
    assert inv.check_all(valid()) == []
    assert inv.check_all(valid(), OWNERS) == []


def test_ownership_accepts_matching_owners() -> None:
    assert inv.ownership_matches(valid(), OWNERS)


@pytest.mark.parametrize("owners", [
    {0: 1, 1: 1, 2: 1},           # a reference without an owner
    {0: 1, 1: 2, 2: 1, 3: 1},     # an evictable id with an owner
    {0: 1, 1: 2, 2: 1, 4: 1},     # a free id with an owner
    {0: 1, 1: 2, 2: 1, 99: 1},    # an unknown id
    {0: 2, 1: 2, 2: 1},           # a double owner
])
def test_ownership_rejects_mismatch(owners: Dict[int, int]) -> None:
    assert not inv.ownership_matches(valid(), owners)
    assert inv.check_all(valid(), owners) == ["ownership_matches"]


def test_unknown_block_size_skips_whole_block_check() -> None:
    s = BREAKERS["content_whole_blocks"](valid())
    assert inv.content_whole_blocks(replace(s, block_size=0))


def test_in_use_and_evictable_views() -> None:
    s = valid()
    assert s.in_use() == {0, 1, 2}
    assert s.evictable() == {3}
