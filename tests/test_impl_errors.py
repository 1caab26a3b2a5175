"""prefixcache.impl.errors: the exception hierarchy, and one rejected call per
CallerError subclass showing the class, the unchanged state and that the
object keeps working."""

from __future__ import annotations

from typing import Callable, Dict, List, Tuple

import pytest
from helpers.impl_snapshot import expect_rejected

from prefixcache.impl import errors as err
from prefixcache.impl.common import RefCounter
from prefixcache.impl.cpu_gpu_block_allocator import CpuGpuBlockAllocator
from prefixcache.impl.evictor import LRUEvictor
from prefixcache.impl.interfaces import BlockAllocator, Device
from prefixcache.impl.naive_block import NaiveBlock, NaiveBlockAllocator
from prefixcache.impl.prefix_caching_block import PrefixCachingBlockAllocator


def all_subclasses(cls: type) -> List[type]:
    found: List[type] = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(all_subclasses(sub))
    return found


def test_the_module_exports_exactly_its_public_classes() -> None:
    assert sorted(err.__all__) == sorted([
        "BlockFullError", "BlockNotOnDeviceError", "CallerError", "DetachedBlockError",
        "EvictorEmptyError", "ForeignBlockError", "ImmutableBlockError", "InvalidArgumentError",
        "NoFreeBlocksError", "NotInEvictorError", "NullBlockWriteError", "PrefixCacheError",
        "ReadOnlyError", "RefCountError", "UnhashableBlockError", "UnknownBlockIdError",
        "WrongTypeError",
    ])
    for name in err.__all__:
        assert issubclass(getattr(err, name), err.PrefixCacheError)


def test_caller_errors_are_value_and_assertion_errors() -> None:
    assert issubclass(err.CallerError, ValueError)
    assert issubclass(err.CallerError, AssertionError)
    for sub in all_subclasses(err.CallerError):
        assert issubclass(sub, ValueError) and issubclass(sub, AssertionError), sub


def test_specific_bases_where_vllm_raised_them() -> None:
    assert issubclass(err.WrongTypeError, TypeError)
    assert issubclass(err.UnknownBlockIdError, KeyError)
    # vLLM: remove() of an absent id is a ValueError, update() a KeyError
    assert issubclass(err.NotInEvictorError, KeyError)
    assert issubclass(err.NotInEvictorError, ValueError)


def test_capacity_errors_are_not_caller_errors() -> None:
    for cls in (err.NoFreeBlocksError, err.EvictorEmptyError):
        assert issubclass(cls, ValueError)
        assert not issubclass(cls, err.CallerError)
        assert not issubclass(cls, AssertionError)
    assert BlockAllocator.NoFreeBlocksError is err.NoFreeBlocksError


def test_key_errors_print_their_message_plainly() -> None:
    assert str(err.UnknownBlockIdError("block id 7 is unknown")) == "block id 7 is unknown"
    assert str(err.NotInEvictorError("not there")) == "not there"
    assert str(err.UnknownBlockIdError()) == ""
    # a plain KeyError would have printed the repr, quotes included
    assert str(KeyError("x")) == "'x'"


def _naive() -> NaiveBlockAllocator:
    return NaiveBlockAllocator(create_block=NaiveBlock, num_blocks=4, block_size=2)


def _prefix() -> PrefixCachingBlockAllocator:
    return PrefixCachingBlockAllocator(num_blocks=4, block_size=2)


def _invalid_argument() -> Tuple[object, Callable[[], object]]:
    a = _naive()
    return a, lambda: a.allocate_mutable_block(None, device=Device.GPU)


def _wrong_type() -> Tuple[object, Callable[[], object]]:
    a = _prefix()
    return a, lambda: a.allocate_immutable_block(None, [1, "2"])  # type: ignore[list-item]


def _unknown_id() -> Tuple[object, Callable[[], object]]:
    a = _prefix()
    return a, lambda: a.mark_blocks_as_accessed([99], 1.0)


def _detached() -> Tuple[object, Callable[[], object]]:
    a = _naive()
    b = a.allocate_mutable_block(None)
    a.free(b, keep_block_object=True)
    return a, lambda: a.free(b)


def _refcount() -> Tuple[object, Callable[[], object]]:
    counter = RefCounter([0, 1])
    return counter, lambda: counter.decr(1)


def _foreign() -> Tuple[object, Callable[[], object]]:
    a, other = _prefix(), _prefix()
    b = other.allocate_mutable_block(None)
    return a, lambda: a.free(b)


def _block_full() -> Tuple[object, Callable[[], object]]:
    a = _naive()
    b = a.allocate_mutable_block(None)
    return a, lambda: b.append_token_ids([1, 2, 3])


def _immutable() -> Tuple[object, Callable[[], object]]:
    a = _prefix()
    b = a.allocate_immutable_block(None, [1, 2])
    return a, lambda: b.append_token_ids([3])


def _unhashable() -> Tuple[object, Callable[[], object]]:
    a = _prefix()
    return a, lambda: a.allocate_immutable_block(None, [1])


def _not_in_evictor() -> Tuple[object, Callable[[], object]]:
    e = LRUEvictor()
    e.add(1, 11, 2, 0.0)
    return e, lambda: e.remove(2)


def _not_on_device() -> Tuple[object, Callable[[], object]]:
    a = _prefix()
    return a, lambda: a.mark_blocks_as_accessed([0], 1.0)


def _read_only() -> Tuple[object, Callable[[], object]]:
    counter = RefCounter([0])
    view = counter.as_readonly()
    return counter, lambda: view.incr(0)


def _null_write() -> Tuple[object, Callable[[], object]]:
    a = CpuGpuBlockAllocator.create("prefix_caching", 2, 2, 2)
    null = a.allocate_or_get_null_block()
    return a, lambda: null.append_token_ids([1])


SCENARIOS: Dict[type, Callable[[], Tuple[object, Callable[[], object]]]] = {
    err.InvalidArgumentError: _invalid_argument,
    err.WrongTypeError: _wrong_type,
    err.UnknownBlockIdError: _unknown_id,
    err.DetachedBlockError: _detached,
    err.RefCountError: _refcount,
    err.ForeignBlockError: _foreign,
    err.BlockFullError: _block_full,
    err.ImmutableBlockError: _immutable,
    err.UnhashableBlockError: _unhashable,
    err.NotInEvictorError: _not_in_evictor,
    err.BlockNotOnDeviceError: _not_on_device,
    err.ReadOnlyError: _read_only,
    err.NullBlockWriteError: _null_write,
}


def test_every_caller_error_subclass_has_a_scenario() -> None:
    assert set(SCENARIOS) == set(all_subclasses(err.CallerError))


@pytest.mark.parametrize("cls", list(SCENARIOS), ids=lambda c: c.__name__)
def test_each_caller_error_rejects_and_changes_nothing(cls: type) -> None:
    obj, call = SCENARIOS[cls]()
    raised = expect_rejected(obj, cls, call)
    assert type(raised) is cls
    # the same call is caught by vLLM-era handlers too
    obj, call = SCENARIOS[cls]()
    expect_rejected(obj, AssertionError, call)
    obj, call = SCENARIOS[cls]()
    expect_rejected(obj, err.CallerError, call)


# --------------------------------------------------------------------------
# wrong-typed arguments: a CallerError (WrongTypeError, a TypeError), not an
# AttributeError or a bare TypeError from deep inside, and nothing changes


def _wrong_type_calls() -> Dict[str, Callable[[], Tuple[object, Callable[[], object]]]]:
    def naive() -> NaiveBlockAllocator:
        a = _naive()
        a.allocate_immutable_block(None, [1, 2])
        return a

    def prefix() -> PrefixCachingBlockAllocator:
        a = _prefix()
        a.allocate_immutable_block(None, [1, 2])
        return a

    def pair() -> CpuGpuBlockAllocator:
        a = CpuGpuBlockAllocator.create("prefix_caching", 3, 3, 2)
        a.allocate_immutable_block(None, [1, 2], Device.GPU)
        return a

    def case(make: Callable[[], object], call: Callable[[object], object]) -> Callable[[], Tuple[object, Callable[[], object]]]:  # noqa: E501
        def build() -> Tuple[object, Callable[[], object]]:
            obj = make()
            return obj, lambda: call(obj)
        return build

    return {
        "naive.swap_in([str])": case(naive, lambda a: a.swap_in(["x"])),
        "naive.swap_in(None)": case(naive, lambda a: a.swap_in(None)),
        "naive.swap_out(None)": case(naive, lambda a: a.swap_out(None)),
        "naive.allocate_immutable_blocks(None)": case(
            naive, lambda a: a.allocate_immutable_blocks(None, None)),
        "naive.get_num_full_blocks_touched([str])": case(
            naive, lambda a: a.get_num_full_blocks_touched(["x"])),
        "naive.get_physical_block_id([1])": case(naive, lambda a: a.get_physical_block_id([1])),
        "prefix.swap_in(None)": case(prefix, lambda a: a.swap_in(None)),
        "prefix.swap_out(None)": case(prefix, lambda a: a.swap_out(None)),
        "prefix.allocate_immutable_blocks(None)": case(
            prefix, lambda a: a.allocate_immutable_blocks(None, None)),
        "prefix.allocate_immutable_blocks(int, ...)": case(
            prefix, lambda a: a.allocate_immutable_blocks(5, [[1, 2]])),
        "prefix.allocate_immutable_block(int, ...)": case(
            prefix, lambda a: a.allocate_immutable_block(5, [1, 2])),
        "prefix.get_num_full_blocks_touched([str])": case(
            prefix, lambda a: a.get_num_full_blocks_touched(["x"])),
        "prefix.get_physical_block_id([1])": case(prefix, lambda a: a.get_physical_block_id([1])),
        "prefix.is_block_cached(str)": case(prefix, lambda a: a.is_block_cached("x")),
        "prefix.block_is_computed([1])": case(prefix, lambda a: a.block_is_computed([1])),
        "prefix.mark_blocks_as_accessed(None)": case(
            prefix, lambda a: a.mark_blocks_as_accessed(None, 1.0)),
        "prefix.mark_blocks_as_accessed([[0]])": case(
            prefix, lambda a: a.mark_blocks_as_accessed([[0]], 1.0)),
        "prefix.find_cached_blocks_prefix(None)": case(
            prefix, lambda a: a.find_cached_blocks_prefix(None)),
        "prefix.get_common_computed_block_ids(None)": case(
            prefix, lambda a: a.get_common_computed_block_ids(None)),
        "prefix.get_common_computed_block_ids([int])": case(
            prefix, lambda a: a.get_common_computed_block_ids([5])),
        "cpu_gpu.swap(None)": case(pair, lambda a: a.swap(None, Device.GPU, Device.CPU)),
        "cpu_gpu.get_num_full_blocks_touched([str])": case(
            pair, lambda a: a.get_num_full_blocks_touched(["x"], Device.GPU)),
    }


WRONG_TYPE_CALLS = _wrong_type_calls()


@pytest.mark.parametrize("name", list(WRONG_TYPE_CALLS))
def test_wrong_typed_arguments_raise_caller_errors(name: str) -> None:
    obj, call = WRONG_TYPE_CALLS[name]()
    expect_rejected(obj, err.CallerError, call)


def test_cpu_gpu_init_with_non_allocators_raises_a_caller_error() -> None:
    with pytest.raises(err.CallerError):
        CpuGpuBlockAllocator(None, None)  # type: ignore[arg-type]
    naive = NaiveBlockAllocator(create_block=NaiveBlock, num_blocks=2, block_size=2)
    with pytest.raises(err.CallerError):
        CpuGpuBlockAllocator(naive, "gpu")  # type: ignore[arg-type]
