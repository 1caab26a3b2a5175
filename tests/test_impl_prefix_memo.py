"""find_cached_blocks_prefix with its memo (prefixcache.impl.prefix_memo)
answers exactly what the definition says, whatever happened between two
questions about the same list: evictions, hits, promotions, marking,
resets, and the list itself growing, shrinking or changing in place."""

from __future__ import annotations

import random
from typing import List

import pytest

from prefixcache.impl.prefix_caching_block import PrefixCachingBlockAllocator
from prefixcache.impl.prefix_memo import PrefixMemo


def _by_definition(allocator: PrefixCachingBlockAllocator, hashes: List[int]) -> List[int]:
    count = 0
    for content_hash in hashes:
        block_id = allocator._cached_blocks.get(content_hash)
        if block_id is None or not allocator.block_is_computed(block_id):
            break
        count += 1
    return hashes[:count]


def _chain_hashes(allocator: PrefixCachingBlockAllocator, chain: List[List[int]]) -> List[int]:
    hashes: List[int] = []
    parent = None
    for tokens in chain:
        parent = allocator.content_hash_function(parent, tokens, None)
        hashes.append(parent)
    return hashes


@pytest.mark.parametrize("seed", range(12))
def test_the_memo_answers_by_the_definition(seed: int) -> None:
    rng = random.Random(seed)
    size = 2
    allocator = PrefixCachingBlockAllocator(num_blocks=10, block_size=size)
    held: List[object] = []
    lists: List[List[int]] = []
    for _ in range(600):
        action = rng.random()
        chain = [[rng.randrange(3) for _ in range(size)] for _ in range(rng.randint(1, 4))]
        if action < 0.25 and allocator.get_num_free_blocks() >= len(chain) + 1:
            blocks = allocator.allocate_immutable_blocks(None, chain)
            held.extend(blocks)
            if rng.random() < 0.5:
                tail = allocator.allocate_mutable_block(blocks[-1])
                tail.append_token_ids([rng.randrange(3) for _ in range(size)])  # promotes
                held.append(tail)
        elif action < 0.45 and held:
            allocator.free(held.pop(rng.randrange(len(held))))  # type: ignore[arg-type]
        elif action < 0.55:
            allocator.mark_blocks_as_computed([])
        elif action < 0.57 and not held:
            assert allocator.reset_prefix_cache()
        elif action < 0.65:
            lists.append(_chain_hashes(allocator, chain))
        elif action < 0.72 and lists:
            target = lists[rng.randrange(len(lists))]
            change = rng.random()
            if change < 0.4:
                target.extend(_chain_hashes(allocator, chain))
            elif change < 0.7 and target:
                target[rng.randrange(len(target))] = _chain_hashes(allocator, chain)[0]
            elif target:
                del target[rng.randrange(len(target)):]
        for hashes in lists:
            assert allocator.find_cached_blocks_prefix(hashes) == _by_definition(
                allocator, hashes)
        if lists:
            as_tuple = tuple(lists[-1])
            assert allocator.find_cached_blocks_prefix(as_tuple) == tuple(  # type: ignore[arg-type]
                _by_definition(allocator, list(as_tuple)))


def test_the_answer_is_a_new_list_and_the_argument_is_untouched() -> None:
    allocator = PrefixCachingBlockAllocator(num_blocks=4, block_size=2)
    blocks = allocator.allocate_immutable_blocks(None, [[1, 2], [3, 4]])
    allocator.mark_blocks_as_computed([])
    hashes = [block.content_hash for block in blocks]
    for _ in range(2):  # the second time from the memo
        answer = allocator.find_cached_blocks_prefix(hashes)  # type: ignore[arg-type]
        assert answer == hashes and answer is not hashes
        answer.append(7)
        assert len(hashes) == 2


def test_the_memo_starts_over_past_its_limits() -> None:
    """Past ``capacity`` lists or ``index_limit`` indexed hashes the memo
    forgets everything, and still answers by the definition."""
    memo = PrefixMemo(capacity=2, index_limit=2)
    cached = {1: 0, 2: 1, 3: 2}
    lists = [[1, 2], [2, 3], [3, 1]]
    for hashes in lists:
        assert memo.find(hashes, cached, set()) == hashes
    # the third list found the memo at capacity: only it is remembered
    assert list(memo._entries) == [id(lists[2])] and memo._indexed == 2
    lists[2].append(2)  # extended in place, within the index limit
    assert memo.find(lists[2], cached, set()) == [3, 1, 2]
    assert memo._indexed == 3
    lists[2].append(3)  # past the index limit: examined afresh
    assert memo.find(lists[2], cached, set()) == [3, 1, 2, 3]
    assert list(memo._entries) == [id(lists[2])] and memo._indexed == 4
    assert sorted(memo._holders) == [1, 2, 3] and memo._holders[3][1::2] == [0, 3]
    for content_hash in (1, 2, 3, 1):
        del cached[content_hash]
        memo.evicted(content_hash)
        cached[content_hash] = 9
    del cached[2]
    memo.evicted(2)
    assert memo.find(lists[0], cached, set()) == [1]
    assert memo.find(lists[1], cached, set()) == []
    assert memo.find(lists[2], cached, {9}) == []
    memo.clear()
    assert not memo._entries and not memo._holders and memo._indexed == 0


def test_an_eviction_cuts_every_prefix_holding_the_hash_at_its_first_index() -> None:
    """Two remembered lists hold hash 2 (one of them twice): evicting it cuts
    each before its first 2, at once; other hashes cut nothing."""
    memo = PrefixMemo()
    cached = {1: 0, 2: 1, 3: 2}
    first, second = [1, 2, 3], [3, 2, 1, 2]
    assert memo.find(first, cached, set()) == first
    assert memo.find(second, cached, set()) == second
    memo.evicted(7)  # held by no prefix
    assert memo._entries[id(first)].length == 3
    memo.evicted(2)
    assert memo._entries[id(first)].length == 1
    assert memo._entries[id(second)].length == 1
    assert 2 not in memo._holders
    memo.evicted(3)
    assert memo._entries[id(first)].length == 1  # 3 was past its cut
    assert memo._entries[id(second)].length == 0


def test_an_eviction_cuts_a_remembered_prefix() -> None:
    """Hash 2 leaves the cache and comes back under an id not yet computed
    (touched): a remembered list is cut there, not answered from memory."""
    memo = PrefixMemo()
    cached = {1: 0, 2: 1}
    hashes = [1, 2]
    assert memo.find(hashes, cached, set()) == [1, 2]
    memo.evicted(2)
    cached[2] = 5
    assert memo.find(hashes, cached, {5}) == [1]


def test_an_unchanged_complete_list_is_answered_from_memory() -> None:
    """The same list, all cached and computed, asked twice of the memo
    itself: the second answer is the remembered prefix, nothing rescanned."""
    memo = PrefixMemo()
    cached = {1: 0, 2: 1}
    hashes = [1, 2]
    assert memo.find(hashes, cached, set()) == [1, 2]
    cached.clear()  # not looked at again: no eviction was logged
    answer = memo.find(hashes, cached, set())
    assert answer == [1, 2] and answer is not hashes


def test_an_unhashable_hash_reached_on_a_remembered_list_is_a_wrong_type() -> None:
    """A list whose scan stopped before an unhashable element is remembered;
    once the stopper is cached the scan reaches the element: WrongTypeError,
    the same as for a list examined afresh."""
    from prefixcache.impl.errors import WrongTypeError

    a = PrefixCachingBlockAllocator(num_blocks=4, block_size=2)
    first = a.allocate_immutable_blocks(None, [[1, 2]])
    a.mark_blocks_as_computed([])
    second_hash = a.content_hash_function(first[0].content_hash, [3, 4], None)
    hashes = [first[0].content_hash, second_hash, [5]]
    assert a.find_cached_blocks_prefix(hashes) == hashes[:1]  # type: ignore[arg-type]
    a.allocate_immutable_blocks(first[0], [[3, 4]])
    a.mark_blocks_as_computed([])
    with pytest.raises(WrongTypeError):
        a.find_cached_blocks_prefix(hashes)  # type: ignore[arg-type]
    with pytest.raises(WrongTypeError):
        a.find_cached_blocks_prefix(list(hashes))  # type: ignore[arg-type]


def test_the_capacity_and_the_index_limit_are_exact() -> None:
    """``capacity`` lists are remembered and the next one starts over; the
    index may hold ``index_limit`` hashes (counted over every list) and
    starts over only past it."""
    cached = {n: n for n in range(10)}
    memo = PrefixMemo(capacity=2, index_limit=100)
    lists = [[1], [2], [3]]
    memo.find(lists[0], cached, set())
    memo.find(lists[1], cached, set())
    assert len(memo._entries) == 2 and memo._indexed == 2  # counted over both lists
    memo.find(lists[2], cached, set())
    assert list(memo._entries) == [id(lists[2])] and memo._indexed == 1
    memo = PrefixMemo(capacity=100, index_limit=2)
    lists = [[1, 2], [3, 4], [5]]
    memo.find(lists[0], cached, set())
    memo.find(lists[1], cached, set())  # 2 indexed before it: at the limit, not past
    assert len(memo._entries) == 2 and memo._indexed == 4
    memo.find(lists[2], cached, set())  # 4 indexed: past it
    assert list(memo._entries) == [id(lists[2])] and memo._indexed == 1


def test_a_list_changed_in_place_and_grown_is_examined_afresh() -> None:
    """A remembered list whose old part changed is not an extension, even
    when it grew: its remembered prefix does not stand."""
    memo = PrefixMemo()
    cached = {1: 0, 2: 1, 3: 2}
    hashes = [1, 2]
    assert memo.find(hashes, cached, set()) == [1, 2]
    hashes[:] = [7, 2, 3]
    assert memo.find(hashes, cached, set()) == []
    hashes[:] = [1]  # shortened
    assert memo.find(hashes, cached, set()) == [1]
    hashes.extend([2, 3])  # grown: the prefix stands and extends
    assert memo.find(hashes, cached, set()) == [1, 2, 3]


def test_the_allocator_answers_a_remembered_list_from_memory() -> None:
    """Asked again about an unchanged list, the allocator answers from its
    memo, not by looking the hashes up again (white-box: the cached map is
    emptied behind its back, which no API call can do)."""
    allocator = PrefixCachingBlockAllocator(num_blocks=4, block_size=2)
    blocks = allocator.allocate_immutable_blocks(None, [[1, 2], [3, 4]])
    allocator.mark_blocks_as_computed([])
    hashes = [block.content_hash for block in blocks]
    assert allocator.find_cached_blocks_prefix(hashes) == hashes  # type: ignore[arg-type]
    saved = dict(allocator._cached_blocks)
    allocator._cached_blocks.clear()
    try:
        assert allocator.find_cached_blocks_prefix(hashes) == hashes  # type: ignore[arg-type]
        assert allocator.find_cached_blocks_prefix(list(hashes)) == []  # type: ignore[arg-type]
    finally:
        allocator._cached_blocks.update(saved)


@pytest.mark.parametrize("argument", ["ab", {1, 2}, {1: 2}, 7, None])
def test_anything_but_a_list_or_tuple_is_a_wrong_type(argument: object) -> None:
    from prefixcache.impl.errors import WrongTypeError

    allocator = PrefixCachingBlockAllocator(num_blocks=4, block_size=2)
    with pytest.raises(WrongTypeError):
        allocator.find_cached_blocks_prefix(argument)  # type: ignore[arg-type]


def test_an_unhashable_hash_at_the_remembered_end_is_a_wrong_type_every_time() -> None:
    """A list whose scan reaches an unhashable element raises WrongTypeError
    each time it is asked about (the memo starts over, so nothing is left
    half-remembered), and once the element is replaced the answer is the
    definition's; so is a remembered list whose next hash is not cached,
    touched, or cached and computed."""
    from prefixcache.impl.errors import WrongTypeError

    a = PrefixCachingBlockAllocator(num_blocks=4, block_size=2)
    first = a.allocate_immutable_blocks(None, [[1, 2]])
    a.mark_blocks_as_computed([])
    second_hash = a.content_hash_function(first[0].content_hash, [3, 4], None)
    hashes = [first[0].content_hash, [5]]
    for _ in range(2):
        with pytest.raises(WrongTypeError):
            a.find_cached_blocks_prefix(hashes)  # type: ignore[arg-type]
    hashes[1] = second_hash
    assert a.find_cached_blocks_prefix(hashes) == hashes[:1]  # type: ignore[arg-type]
    assert a.find_cached_blocks_prefix(hashes) == hashes[:1]  # type: ignore[arg-type]
    second = a.allocate_immutable_blocks(first[0], [[3, 4]])
    assert second[0].content_hash == second_hash
    assert a.find_cached_blocks_prefix(hashes) == hashes[:1]  # type: ignore[arg-type]  # touched
    a.mark_blocks_as_computed([])
    assert a.find_cached_blocks_prefix(hashes) == hashes  # type: ignore[arg-type]
    assert a.find_cached_blocks_prefix(hashes) == hashes  # type: ignore[arg-type]
