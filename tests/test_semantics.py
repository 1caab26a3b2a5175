"""The semantic options: the model executes either rule of each, the presets
name the sets, and the oracle judges real vLLM 0.8.5 by them (its choices
are findings only under prefixcache's rules, its faults under every preset)."""

from __future__ import annotations

import pytest

from prefixcache.impl import errors as err
from prefixcache.model import DeviceModel, Model
from prefixcache.oracle.findings import Finding, explain
from prefixcache.oracle.replay import replay
from prefixcache.oracle.targets import DEFAULT_TARGET, resolve_target
from prefixcache.oracle.trace import Step, Trace
from prefixcache.spec.semantics import (
    OPTIONS,
    PREFIXCACHE,
    PRESETS,
    Semantics,
    option_named,
    preset,
)

VLLM = PRESETS["vllm-0.8.5"]


def test_presets_and_names() -> None:
    assert PRESETS["prefixcache"] == PREFIXCACHE == Semantics()
    assert all(VLLM.value(o) for o in OPTIONS) and not any(PREFIXCACHE.value(o) for o in OPTIONS)
    assert PREFIXCACHE.name == "prefixcache" and VLLM.name == "vllm-0.8.5"
    one = PREFIXCACHE.flipped(option_named("computed-on-release"))
    assert one.name == "prefixcache+computed-on-release"
    assert one.flipped(option_named("computed-on-release")) == PREFIXCACHE
    for s in (PREFIXCACHE, VLLM, one):
        assert Semantics.from_json(s.to_json()) == s
    assert Semantics.from_json("vllm-0.8.5") == VLLM
    for bad in ("nope", {"no-such-option": True}, {"lists-only": "yes"}, 3):
        with pytest.raises(ValueError):
            Semantics.from_json(bad)
    with pytest.raises(ValueError, match="prefixcache"):
        preset("vllm")
    assert [o.field for o in OPTIONS] == list(vars(Semantics()))


@pytest.mark.parametrize("semantics", [PREFIXCACHE, VLLM])
def test_computed_on_release(semantics: Semantics) -> None:
    m = Model(3, 1, semantics=semantics)
    a = m.allocate_immutable_block(None, [0])  # a miss: promoted, not computed yet
    key = a.content_key
    m.free(a)  # released before mark_blocks_as_computed
    on_release = semantics.computed_on_release
    assert m.state().blocks[0].computed is on_release
    assert m.find_cached_blocks_prefix([key]) == ([key] if on_release else [])
    b = m.allocate_immutable_block(None, [0])  # a hit restores it
    assert b.block_id == 0 and m.state().blocks[0].computed is on_release
    m.mark_blocks_as_computed([])
    assert m.state().blocks[0].computed


@pytest.mark.parametrize("semantics", [PREFIXCACHE, VLLM])
def test_failed_query_counted(semantics: Semantics) -> None:
    m = Model(2, 1, semantics=semantics)
    first = m.allocate_immutable_block(None, [0])
    m.allocate_mutable_block(None)
    m.free(first)  # id 0 evictable, id 1 in use
    with pytest.raises(err.NoFreeBlocksError):  # a hit on id 0, then a miss with no id left
        m.allocate_immutable_blocks(None, [[0], [1], [2]])
    s = m.state()
    counted = semantics.failed_query_counted
    assert (s.hits, s.misses) == ((1, 2) if counted else (0, 1))  # the refused one counts
    assert s.evictor[0].block_id == 0 and s.blocks[0].refcount == 0  # the rest rolled back


@pytest.mark.parametrize("semantics", [PREFIXCACHE, VLLM])
def test_failed_swap_counts_on_the_destination(semantics: Semantics) -> None:
    pair = DeviceModel(2, 1, 1, semantics=semantics)
    blocks = pair.allocate_immutable_blocks(None, [[0], [1]], "gpu")
    with pytest.raises(err.NoFreeBlocksError):
        pair.swap(blocks, "gpu", "cpu")
    assert pair.cpu.state().misses == (2 if semantics.failed_query_counted else 0)
    assert [b.block_id for b in blocks] == [0, 1]


def _trace(*steps: Step, semantics: Semantics = PREFIXCACHE) -> Trace:
    return Trace(num_blocks=2, block_size=1, target="vllm==0.8.5",
                 semantics=semantics.to_json(), steps=list(steps))


RELEASED_UNMARKED = (Step("allocate_immutable_block", {"prev_block": None, "token_ids": [0],
                                                       "extra_hash": None}),
                     Step("free", {"block": "b0"}))


def test_real_vllm_choice_is_a_finding_only_under_prefixcache_rules() -> None:
    target = resolve_target("vllm==0.8.5")
    strict = replay(_trace(*RELEASED_UNMARKED), target)
    assert strict.violation is not None
    assert strict.violation.signature == "conformance/free/state:blocks.computed"
    assert replay(_trace(*RELEASED_UNMARKED, semantics=VLLM), target).violation is None
    finding = Finding(strict.violation, shrunk=True)
    finding.violation.trace = _trace(*RELEASED_UNMARKED)
    explained = explain(finding, target, PREFIXCACHE, white_box=True, call_timeout=None)
    assert explained is not None
    assert explained.options == ["computed-on-release"]
    assert explained.accepted_by == ["vllm-0.8.5"]


def test_real_vllm_fault_stands_under_every_preset() -> None:
    """vLLM 0.8.5's allocate_immutable_blocks takes ids before it runs out."""
    target = resolve_target("vllm==0.8.5")
    steps = (Step("allocate_immutable_blocks", {"prev_block": None, "extra_hash": None,
                                                "block_token_ids": [[0], [1], [2]]}),)
    for semantics in PRESETS.values():
        result = replay(_trace(*steps), target, semantics=semantics)
        assert result.violation is not None and result.violation.category == "robustness"
    finding = Finding(result.violation, shrunk=True)
    finding.violation.trace = _trace(*steps)
    assert explain(finding, target, PREFIXCACHE, white_box=True, call_timeout=None) is None


def test_the_targets_own_no_free_blocks_error_plays_the_role() -> None:
    """vLLM's naive allocator refuses a full pool with its own
    BlockAllocator.NoFreeBlocksError, not prefixcache's: that is no finding."""
    target = resolve_target("vllm==0.8.5:NaiveBlockAllocator")
    trace = Trace(num_blocks=1, block_size=1, kind="naive", steps=[
        Step("allocate_mutable_block", {"prev_block": None}),
        Step("allocate_mutable_block", {"prev_block": None})])
    result = replay(trace, target, semantics=VLLM)
    assert result.violation is None, result.violation


@pytest.mark.parametrize("semantics", [PREFIXCACHE, VLLM])
def test_the_evictors_plain_value_error_plays_the_role(semantics: Semantics) -> None:
    """vLLM's LRUEvictor refuses evict() when empty with a plain ValueError
    (the API's), not prefixcache's EvictorEmptyError: that is no finding,
    under either preset; another exception is one."""
    trace = _trace(Step("LRUEvictor.evict", {}), semantics=semantics)
    assert replay(trace, resolve_target("vllm==0.8.5")).violation is None
    result = replay(trace, resolve_target("tests.helpers.oracle_faults:EvictorRaisesKeyError"))
    assert result.violation is not None
    assert result.violation.signature == "conformance/LRUEvictor.evict/not-EvictorEmptyError"


FORK_OF_A_FOREIGN_BLOCK = (Step("fork", {"last_block": "@foreign"}),
                           Step("allocate_mutable_block", {"prev_block": None,
                                                           "extra_hash": None}, out=["b0"]),
                           Step("free", {"block": "b0"}))


def test_black_box_puts_a_later_difference_on_the_refused_mistake() -> None:
    """vLLM's fork of another allocator's Block raises, but first takes a
    reference on the id of the same number.  White-box, the fork's own step
    shows it; black-box, only the free count after a later free does, and
    the finding says that it comes after a refused mistake."""
    target = resolve_target("prefixcache.bench.vllm_repaired:PrefixCachingBlockAllocator")
    trace = Trace(num_blocks=1, block_size=1, target=target.name,
                  semantics=VLLM.to_json(), steps=list(FORK_OF_A_FOREIGN_BLOCK))
    white = replay(trace, target).violation
    assert white is not None and white.step == 0
    assert white.signature == "robustness/fork/changed:blocks.presence"
    black = replay(trace, target, white_box=False).violation
    assert black is not None and black.step == 2
    assert black.signature == "robustness/free/after-refusal:free-count"
    assert "after a caller mistake refused at step 0:" in black.message
    assert "get_num_free_blocks() is 0 in the target" in black.message
    honest = replay(Trace(num_blocks=1, block_size=1, steps=list(FORK_OF_A_FOREIGN_BLOCK)),
                    resolve_target(DEFAULT_TARGET), white_box=False)
    assert honest.violation is None


def test_an_answer_to_a_refused_call_may_hit_its_own_content() -> None:
    """vLLM takes a token that is not an int.  Its answer to that refused
    call hits the id of the first block's own content, which is no integrity
    finding (only the mistake accepted is); a hit for ``['x']`` on the id of
    ``[0]`` is one (white-box a hash collision, black-box other content)."""
    filled = [Step("allocate_mutable_block", {"prev_block": None, "extra_hash": None},
                   out=["b0"]),
              Step("append_token_ids", {"block": "b0", "token_ids": [0]})]
    both = Step("allocate_immutable_blocks", {"prev_block": None, "extra_hash": None,
                                              "block_token_ids": [[0], ["x"]]})
    trace = Trace(num_blocks=2, block_size=1, target="vllm==0.8.5", semantics=VLLM.to_json(),
                  steps=[*filled, both])
    found = replay(trace, resolve_target("vllm==0.8.5")).violation
    assert found is not None
    assert found.signature == "robustness/allocate_immutable_blocks/no-WrongTypeError"
    other = Step("allocate_immutable_block", {"prev_block": None, "extra_hash": None,
                                              "token_ids": ["x"]})
    trace = Trace(num_blocks=2, block_size=1, steps=[*filled, other])
    target = resolve_target("tests.helpers.oracle_faults:HashesOtherTokensAsZero")
    white = replay(trace, target).violation
    assert white is not None and white.signature == "integrity/allocate_immutable_block/collision"
    black = replay(trace, target, white_box=False).violation
    assert black is not None
    assert black.signature == "integrity/allocate_immutable_block/other-content"
