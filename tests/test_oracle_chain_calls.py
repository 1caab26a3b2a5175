"""The oracle calls ``allocate_immutable_blocks`` with a ``prev_block`` too,
continuing a chain (vLLM's block table only ever passes None, but the API
takes any chain's last block).  Found by the mutation campaign over real
vLLM 0.8.5 (bench/vllm_mutation.py): mutants that break the chain
continuation of ``allocate_immutable_blocks`` survived the oracle, which
only ever passed ``prev_block=None``."""

from __future__ import annotations

from typing import Any, List, Optional

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from prefixcache.impl.errors import NoFreeBlocksError
from prefixcache.impl.prefix_caching_block import PrefixCachingBlockAllocator
from prefixcache.oracle.machine import make_machine
from prefixcache.oracle.profiles import profile_settings
from prefixcache.oracle.targets import resolve_target
from prefixcache.oracle.violations import Violation


class ImmutableBlocksIgnorePrev(PrefixCachingBlockAllocator):
    """``allocate_immutable_blocks`` that starts a new chain whatever
    ``prev_block`` it is given: its blocks hash as first blocks, so they share
    ids with another request's prompt blocks of the same tokens."""

    FAULT = "allocate_immutable_blocks() drops prev_block"

    def allocate_immutable_blocks(self, prev_block: Any, block_token_ids: List[List[int]],
                                  extra_hash: Optional[int] = None,
                                  device: Any = None) -> List[Any]:
        return super().allocate_immutable_blocks(None, block_token_ids,  # FAULT
                                                 extra_hash=extra_hash, device=device)


def test_valid_calls_alone_continue_chains_with_allocate_immutable_blocks() -> None:
    """Without caller mistakes (as the campaign runs it: a mistake rule
    passes a mutable prev_block), the oracle still passes a chain's last
    block to allocate_immutable_blocks, and so sees the fault."""
    machine = make_machine(resolve_target(ImmutableBlocksIgnorePrev), mistakes=False)
    quick = settings(profile_settings("ci"), phases=[Phase.explicit, Phase.generate],
                     report_multiple_bugs=False)
    with pytest.raises(Violation) as caught:
        run_state_machine_as_test(machine, settings=quick)
    assert "allocate_immutable_blocks" in str(caught.value), caught.value


class AllHitsNeedFreeIds(PrefixCachingBlockAllocator):
    """A capacity check that counts every block of a batch as a miss: a
    second request for a running prompt is refused on a full pool, though
    every block is a hit and needs no id (vLLM 0.8.5's repaired capacity
    check, its chain hashes mutated, did this)."""

    FAULT = "allocate_immutable_blocks() wants a free id per block, hits included"

    def allocate_immutable_blocks(self, prev_block: Any, block_token_ids: List[List[int]],
                                  extra_hash: Optional[int] = None,
                                  device: Any = None) -> List[Any]:
        if len(block_token_ids) > self.get_num_free_blocks():  # FAULT
            raise NoFreeBlocksError("no room")
        return super().allocate_immutable_blocks(prev_block, block_token_ids,
                                                 extra_hash=extra_hash, device=device)


def test_valid_calls_alone_ask_for_a_running_prompt_on_a_full_pool() -> None:
    """The oracle requests a running sequence's prompt again in one call,
    sometimes on a pool it filled first: all hits, so no id is needed."""
    machine = make_machine(resolve_target(AllHitsNeedFreeIds), mistakes=False)
    quick = settings(profile_settings("ci"), phases=[Phase.explicit, Phase.generate],
                     report_multiple_bugs=False)
    with pytest.raises(Violation) as caught:
        run_state_machine_as_test(machine, settings=quick)
    assert caught.value.operation == "allocate_immutable_blocks", caught.value
