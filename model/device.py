"""The model of a CPU + GPU allocator pair (vLLM's ``CpuGpuBlockAllocator``
built by ``create("prefix_caching", ...)``): two :class:`Model` objects and
the routing between them."""

from __future__ import annotations

from typing import Any, Optional, Sequence, cast

from ..impl import errors as err
from ..spec.state import ContentKey
from .handles import Handle
from .model import Extra, Model, Prev


class DeviceModel:
    """GPU ids ``0 .. g-1`` then CPU ids ``g .. g+c-1``; ``gpu`` and ``cpu``
    are the two :class:`Model` objects.  A ``device`` argument is "gpu" or
    "cpu" in any case, or anything whose ``name`` is (vLLM's ``Device``).
    Allocations and counts go to the named device; ``free``, ``fork`` and
    ``append_token_ids`` to the handle's own device; copy-on-write records,
    access and computed marks and common-prefix queries to the GPU.
    ``options`` (``strict``, ``chooser``, ``check_invariants``, ``semantics``) go to both."""

    def __init__(
        self, num_gpu_blocks: int, num_cpu_blocks: int, block_size: int, **options: Any
    ) -> None:
        """Both devices with every id free; no swap recorded; no null block yet."""
        g, c = num_gpu_blocks, num_cpu_blocks
        if not all(type(n) is int and n >= 0 for n in (g, c)):
            raise err.InvalidArgumentError("the block counts must be ints >= 0")
        self.gpu = Model(g, block_size, range(g), **options)
        self.cpu = Model(c, block_size, range(g, g + c), **options)
        self._swaps: dict[int, int] = {}
        self._null: Optional[Handle] = None

    def device(self, device: object) -> Model:
        """The model of the named device."""
        name = str(getattr(device, "name", device)).lower()
        if name not in ("gpu", "cpu"):
            raise err.InvalidArgumentError(f"unknown device {device!r}")
        return self.gpu if name == "gpu" else self.cpu

    def _owner(self, handle: object) -> Model:
        if not isinstance(handle, Handle):
            raise err.WrongTypeError(f"not a block handle: {handle!r}")
        if handle.owner is not self.gpu and handle.owner is not self.cpu:
            raise err.ForeignBlockError("not a block of this allocator pair")
        return handle.owner

    def allocate_mutable_block(
        self, prev_block: Prev, device: object, extra_hash: Extra = None
    ) -> Handle:
        """``Model.allocate_mutable_block`` on ``device``."""
        return self.device(device).allocate_mutable_block(prev_block, extra_hash)

    def allocate_immutable_block(
        self, prev_block: Prev, token_ids: Sequence[int], device: object, extra_hash: Extra = None
    ) -> Handle:
        """``Model.allocate_immutable_block`` on ``device``."""
        return self.device(device).allocate_immutable_block(prev_block, token_ids, extra_hash)

    def allocate_immutable_blocks(
        self,
        prev_block: Prev,
        block_token_ids: Sequence[Sequence[int]],
        device: object,
        extra_hash: Extra = None,
    ) -> list[Handle]:
        """``Model.allocate_immutable_blocks`` on ``device``."""
        return self.device(device).allocate_immutable_blocks(
            prev_block, block_token_ids, extra_hash
        )

    def allocate_or_get_null_block(self) -> Handle:
        """The one null block: a GPU mutable block taken on the first call."""
        if self._null is None:
            self._null = self.gpu.allocate_mutable_block(None)
        return self._null

    def append_token_ids(self, block: Handle, token_ids: Sequence[int]) -> None:
        """``Model.append_token_ids`` on the handle's device; the null block
        cannot be written (NullBlockWriteError)."""
        if self._null is not None and block is self._null:
            raise err.NullBlockWriteError("null block should not be modified")
        self._owner(block).append_token_ids(block, token_ids)

    def free(self, block: Handle) -> None:
        """``Model.free`` on the handle's device; freeing the null block does nothing."""
        if self._null is None or block is not self._null:
            self._owner(block).free(block)

    def fork(self, last_block: Handle) -> list[Handle]:
        """``Model.fork`` on the handle's device; the null block cannot be forked."""
        if self._null is not None and last_block is self._null:
            raise err.InvalidArgumentError("the null block cannot be forked")
        return self._owner(last_block).fork(last_block)

    def swap(
        self, blocks: Sequence[Handle], src_device: object, dst_device: object
    ) -> dict[int, int]:
        """``swap_out`` from the source, then ``swap_in`` on the destination
        (the handles change device), all or nothing; returns and records
        (for ``get_and_reset_swaps``) source id -> destination id."""
        src, dst, hs = self.device(src_device), self.device(dst_device), list(blocks)
        if self._null is not None and any(h is self._null for h in hs):
            raise err.NullBlockWriteError("null block should not be modified")
        before = [h.block_id for h in hs]
        saved = src._save((hs,)), dst._save((hs,))  # the pair's own all-or-nothing
        try:
            src.swap_out(hs)
            dst.swap_in(hs)
        except BaseException as exc:
            dst._rollback(saved[1], exc)
            src._rollback(saved[0], exc)
            raise
        pairs = {cast(int, s): cast(int, h.block_id) for s, h in zip(before, hs)}
        self._swaps.update(pairs)
        return pairs

    def get_and_reset_swaps(self) -> list[tuple[int, int]]:
        """Every recorded (source, destination) pair, the latest per source
        id, in first-recorded order; the record is emptied."""
        pairs, self._swaps = list(self._swaps.items()), {}
        return pairs

    def get_num_free_blocks(self, device: object) -> int:
        """Free plus evictable ids on ``device``."""
        return self.device(device).get_num_free_blocks()

    def get_num_total_blocks(self, device: object) -> int:
        """How many ids ``device`` owns."""
        return self.device(device).get_num_total_blocks()

    def get_num_full_blocks_touched(self, blocks: Sequence[Handle], device: object) -> int:
        """``Model.get_num_full_blocks_touched`` on ``device``."""
        return self.device(device).get_num_full_blocks_touched(blocks)

    def get_physical_block_id(self, device: object, absolute_id: int) -> int:
        """The rank of ``absolute_id`` among ``device``'s ids."""
        return self.device(device).get_physical_block_id(absolute_id)

    def get_prefix_cache_hit_rate(self, device: object) -> float:
        """``device``'s hit rate."""
        return self.device(device).get_prefix_cache_hit_rate()

    def reset_prefix_cache(self, device: object = None) -> bool:
        """Reset ``device``; with None the CPU, then (only if that worked) the GPU."""
        if device is not None:
            return self.device(device).reset_prefix_cache()
        return self.cpu.reset_prefix_cache() and self.gpu.reset_prefix_cache()

    def find_cached_blocks_prefix(
        self, keys: Sequence[ContentKey], device: object = "gpu"
    ) -> list[ContentKey]:
        """``Model.find_cached_blocks_prefix`` on ``device`` (the GPU by default)."""
        return self.device(device).find_cached_blocks_prefix(keys)

    @property
    def all_block_ids(self) -> frozenset[int]:
        """Every id of both devices."""
        return self.gpu.all_block_ids | self.cpu.all_block_ids

    def clear_copy_on_writes(self) -> list[tuple[int, int]]:
        """The GPU's recorded copy-on-writes, emptied."""
        return self.gpu.clear_copy_on_writes()

    def mark_blocks_as_accessed(self, block_ids: Sequence[int], now: float) -> None:
        """``Model.mark_blocks_as_accessed`` on the GPU."""
        self.gpu.mark_blocks_as_accessed(block_ids, now)

    def mark_blocks_as_computed(self, block_ids: Sequence[int]) -> None:
        """``Model.mark_blocks_as_computed`` on the GPU."""
        self.gpu.mark_blocks_as_computed(block_ids)

    def get_common_computed_block_ids(self, computed_seq_block_ids: list[list[int]]) -> list[int]:
        """``Model.get_common_computed_block_ids`` on the GPU."""
        return self.gpu.get_common_computed_block_ids(computed_seq_block_ids)
