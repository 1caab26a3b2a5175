"""The oracle drives vLLM's block-manager helpers (``ComputedBlocksTracker``,
``LastAccessBlocksTracker``) beside the allocator, and judges answers the
allocator's own API types: found by the mutation campaign over real vLLM
0.8.5 (bench/vllm_mutation.py), where every mutant of the helpers, a
``block_is_computed`` answering None, a ``get_common_computed_block_ids``
answering ``''`` and a warning logged without its argument survived."""

from __future__ import annotations

import logging
from typing import Any, List, Optional

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from prefixcache.impl.prefix_caching_block import (
    ComputedBlocksTracker,
    LastAccessBlocksTracker,
    PrefixCachingBlockAllocator,
)
from prefixcache.model import Model
from prefixcache.model.trackers import (
    CachedTokensModel,
    LastAccessModel,
    UnknownSequenceError,
    full_block_keys,
)
from prefixcache.oracle.machine import make_machine
from prefixcache.oracle.mistakes import OracleError
from prefixcache.oracle.profiles import profile_settings
from prefixcache.oracle.replay import replay
from prefixcache.oracle.targets import resolve_target
from prefixcache.oracle.trace import Step, Trace, render
from prefixcache.oracle.violations import Violation

# -- the models -----------------------------------------------------------------


def test_full_block_keys_name_each_full_block_by_its_whole_chain() -> None:
    assert full_block_keys([1, 2, 3, 4, 5], 7, 2) == [
        ((7, (1, 2)),), ((7, (1, 2)), (7, (3, 4)))]
    assert full_block_keys([1], None, 2) == []


def test_cached_tokens_stick_while_in_prefill() -> None:
    model = Model(4, 2)
    tracker = CachedTokensModel(model, 2)
    model.allocate_immutable_block(None, [1, 2])
    model.mark_blocks_as_computed([])
    assert tracker.get_num_cached_tokens(5, [1, 2, 3], None, is_prefill=True) == 2
    model.allocate_immutable_block(model.allocate_immutable_block(None, [1, 2]), [3, 4])
    model.mark_blocks_as_computed([])
    assert tracker.get_num_cached_tokens(5, [1, 2, 3, 4], None, is_prefill=True) == 2
    assert tracker.get_num_cached_tokens(5, [1, 2, 3, 4], None, is_prefill=False) == 4
    tracker.remove_seq(5)
    with pytest.raises(UnknownSequenceError):
        tracker.remove_seq(5)
    assert CachedTokensModel(model, 2, enable_caching=False).get_num_cached_tokens(
        1, [1, 2], None, False) == 0


def test_access_marks_wait_for_a_recorded_time() -> None:
    model = Model(4, 1)
    block = model.allocate_immutable_block(None, [1])
    tracker = LastAccessModel(model)
    tracker.add_seq(3)
    tracker.update_seq_blocks_last_access(3, [block.block_id])  # no time yet: nothing
    assert model.state().blocks[block.block_id].last_accessed == -1
    tracker.update_last_access(3, 2.0)
    tracker.update_seq_blocks_last_access(3, [block.block_id])
    assert model.state().blocks[block.block_id].last_accessed == 2.0
    with pytest.raises(UnknownSequenceError):
        tracker.add_seq(3)
    tracker.remove_seq(3)
    with pytest.raises(UnknownSequenceError):
        tracker.update_last_access(3, 1.0)


# -- planted faults, valid calls only ---------------------------------------------


class PrefillNotSticky(ComputedBlocksTracker):
    """Answers afresh during prefill (vLLM's stored count dropped)."""

    def get_num_cached_tokens(self, seq: Any) -> int:
        self._seq_id_to_num_tokens_computed.pop(seq.seq_id, None)  # FAULT
        return super().get_num_cached_tokens(seq)


class MarksAtTimeZero(LastAccessBlocksTracker):
    """Passes 0 instead of the sequence's recorded time."""

    def update_seq_blocks_last_access(self, seq_id: int, block_ids: List[int]) -> None:
        if self._seq_last_access[seq_id] is not None:
            self._allocator.mark_blocks_as_accessed(block_ids, 0)  # FAULT


class TrackerPrefillNotSticky(PrefixCachingBlockAllocator):
    ComputedBlocksTracker = PrefillNotSticky
    LastAccessBlocksTracker = LastAccessBlocksTracker


class TrackerMarksAtTimeZero(PrefixCachingBlockAllocator):
    ComputedBlocksTracker = ComputedBlocksTracker
    LastAccessBlocksTracker = MarksAtTimeZero


class ComputedAnswersNone(PrefixCachingBlockAllocator):
    """``block_is_computed`` answers None for False."""

    def block_is_computed(self, block_id: int) -> bool:
        return super().block_is_computed(block_id) or None  # type: ignore[return-value]


class CommonPrefixOfNothingIsAString(PrefixCachingBlockAllocator):
    """``get_common_computed_block_ids([])`` answers ``''``, as
    ``os.path.commonprefix`` does (vLLM 0.8.5's own fault)."""

    def get_common_computed_block_ids(self, computed_seq_block_ids: List[List[int]]
                                      ) -> List[int]:
        if not computed_seq_block_ids:
            return ""  # type: ignore[return-value]
        return super().get_common_computed_block_ids(computed_seq_block_ids)


class WarnsWithoutItsArgument(PrefixCachingBlockAllocator):
    """A refused reset logs its count placeholder without the count."""

    def reset_prefix_cache(self) -> bool:
        done = super().reset_prefix_cache()
        if not done:
            logging.getLogger("broken").warning("%d blocks are not free")  # FAULT
        return done


def _first_violation(allocator: type) -> Violation:
    machine = make_machine(resolve_target(allocator), mistakes=False)
    quick = settings(profile_settings("ci"), phases=[Phase.explicit, Phase.generate],
                     report_multiple_bugs=False)
    with pytest.raises(Violation) as caught:
        run_state_machine_as_test(machine, settings=quick)
    return caught.value


@pytest.mark.parametrize("allocator, operation, rule", [
    (TrackerPrefillNotSticky, "computed_blocks_tracker.get_num_cached_tokens", "result"),
    (TrackerMarksAtTimeZero, "last_access_blocks_tracker.update_seq_blocks_last_access",
     "state:blocks.last_accessed"),
    (ComputedAnswersNone, None, "answer-type"),
    (CommonPrefixOfNothingIsAString, "get_common_computed_block_ids", "result"),
    (WarnsWithoutItsArgument, "reset_prefix_cache", "log-format"),
])
def test_valid_calls_alone_find_the_fault(allocator: type, operation: Optional[str],
                                          rule: str) -> None:
    found = _first_violation(allocator)
    assert found.rule == rule, found
    if operation is not None:
        assert found.operation == operation, found
    if found.trace is not None and "." in (operation or ""):
        assert f"{operation.partition('.')[0]} = " in render(found.trace)


def test_a_helper_finding_replays_from_its_trace() -> None:
    """The trace of a finding in a helper names its steps by helper and
    method and replays to the same signature."""
    found = _first_violation(TrackerPrefillNotSticky)
    assert found.trace is not None
    again = replay(Trace.from_json(found.trace.to_json()), resolve_target(TrackerPrefillNotSticky))
    assert again.violation is not None and again.violation.signature == found.signature


def test_a_target_without_helpers_is_judged_without_their_steps() -> None:
    """A trace with helper steps, replayed on a target without the helpers
    (a naive allocator does not cache), is the oracle's error, not a
    finding against the target."""
    trace = Trace(num_blocks=2, block_size=1, kind="naive", steps=[Step(
        op="computed_blocks_tracker.get_num_cached_tokens",
        args={"seq_id": 1, "token_ids": [0], "extra_hash": None, "is_prefill": False})])
    with pytest.raises(OracleError):
        replay(trace, resolve_target("prefixcache.impl.naive_block:NaiveBlockAllocator",
                                     kind="naive"))
