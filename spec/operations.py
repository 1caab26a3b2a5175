"""The table of operations: every call of the allocator API, once.

One row per operation of vLLM 0.8.5's block allocators (the ``BlockAllocator``
and ``DeviceAwareBlockAllocator`` interfaces, the ``Block``'s
``append_token_ids``, and the two operations of one class each that the spec
also covers): its name, its arguments with their kinds, the kind of its
result, the allocators that have it (``prefix_caching``, ``naive``,
``cpu_gpu``, as in the error table), and whether it is a Block's method or a
property rather than an allocator's method.

Everything that needs the list of operations reads it here: the checked
classes (:mod:`.checked`: one contract per row of their kind), SPEC.md's
operations section (:mod:`.render`), what a target must have to be an
allocator (:func:`missing`), and the oracle's traces, driver and recorder
(which arguments and results are Blocks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import FrozenSet, List, Tuple

from .error_table import ALL, BOTH, CPU_GPU, NAIVE, PREFIX

# Argument kinds.
BLOCK = "block"                # a Block of this allocator
PREV_BLOCK = "block or None"   # the previous block of a chain, None for a first block
BLOCKS = "blocks"              # a list of Blocks
TOKENS = "tokens"              # a list of token ids
TOKEN_LISTS = "token lists"    # a list of lists of token ids
EXTRA_HASH = "extra hash"      # an int or None
DEVICE = "device"              # a Device
ID = "id"                      # a block id
IDS = "ids"                    # a list of block ids
ID_LISTS = "id lists"          # a list of lists of block ids
HASHES = "hashes"              # a list of content hashes
TIME = "time"                  # a float
FLAG = "flag"                  # a bool

# Result kinds (besides the argument kinds, which a result may also have).
NEW_BLOCK = "a new Block"
NEW_BLOCKS = "new Blocks"
NOTHING = "None"
COUNT = "int"
RATE = "float"
ID_PAIRS = "(source, destination) id pairs"
ID_MAP = "id -> id"
ID_SET = "frozenset of ids"


@dataclass(frozen=True)
class Arg:
    """One argument: its name, its kind, and the allocators that take it
    (a device argument only on ``cpu_gpu``, for instance)."""

    name: str
    kind: str
    allocators: Tuple[str, ...] = ALL


@dataclass(frozen=True)
class Operation:
    """One operation: its name, arguments, result kind and allocators;
    ``owner`` is ``"allocator"`` or ``"Block"``; ``attribute`` marks a
    property; ``required`` marks the interface's operations, which every
    allocator of its kinds must have."""

    name: str
    args: Tuple[Arg, ...]
    result: str
    allocators: Tuple[str, ...] = ALL
    owner: str = "allocator"
    attribute: bool = False
    required: bool = True

    def args_for(self, allocator: str) -> Tuple[Arg, ...]:
        """The arguments an allocator of kind ``allocator`` takes."""
        return tuple(a for a in self.args if allocator in a.allocators)


_ON_DEVICE = Arg("device", DEVICE, (CPU_GPU,))
_ANY_DEVICE = Arg("device", DEVICE)  # ignored by a single-device allocator

OPERATIONS: Tuple[Operation, ...] = (
    Operation("allocate_mutable_block",
              (Arg("prev_block", PREV_BLOCK), Arg("extra_hash", EXTRA_HASH), _ANY_DEVICE),
              NEW_BLOCK),
    Operation("allocate_immutable_block",
              (Arg("prev_block", PREV_BLOCK), Arg("token_ids", TOKENS),
               Arg("extra_hash", EXTRA_HASH), _ANY_DEVICE), NEW_BLOCK),
    Operation("allocate_immutable_blocks",
              (Arg("prev_block", PREV_BLOCK), Arg("block_token_ids", TOKEN_LISTS),
               Arg("extra_hash", EXTRA_HASH), _ANY_DEVICE), NEW_BLOCKS),
    Operation("free", (Arg("block", BLOCK), Arg("keep_block_object", FLAG, BOTH)), NOTHING),
    Operation("free_block_id", (Arg("block_id", ID),), NOTHING, (NAIVE,), required=False),
    Operation("fork", (Arg("last_block", BLOCK),), NEW_BLOCKS),
    Operation("cow_block_if_not_appendable", (Arg("block", BLOCK),), ID, BOTH),
    Operation("append_token_ids", (Arg("token_ids", TOKENS),), NOTHING, owner="Block"),
    Operation("promote_to_immutable_block", (Arg("block", BLOCK),), ID, BOTH),
    Operation("clear_copy_on_writes", (), ID_PAIRS),
    Operation("mark_blocks_as_accessed", (Arg("block_ids", IDS), Arg("now", TIME)), NOTHING),
    Operation("mark_blocks_as_computed", (Arg("block_ids", IDS),), NOTHING),
    Operation("get_common_computed_block_ids", (Arg("computed_seq_block_ids", ID_LISTS),), IDS),
    Operation("get_num_full_blocks_touched", (Arg("blocks", BLOCKS), _ON_DEVICE), COUNT),
    Operation("find_cached_blocks_prefix",
              (Arg("block_hashes", HASHES), Arg("device", DEVICE, (CPU_GPU,))), HASHES),
    Operation("block_is_computed", (Arg("block_id", ID),), FLAG, (PREFIX,), required=False),
    Operation("is_block_cached", (Arg("block", BLOCK),), FLAG, (PREFIX,), required=False),
    Operation("get_prefix_cache_hit_rate", (_ON_DEVICE,), RATE),
    Operation("get_num_free_blocks", (Arg("device", DEVICE, (PREFIX, CPU_GPU)),), COUNT),
    Operation("get_num_total_blocks", (_ON_DEVICE,), COUNT),
    Operation("get_physical_block_id", (_ON_DEVICE, Arg("absolute_id", ID)), ID),
    Operation("all_block_ids", (), ID_SET, attribute=True),
    Operation("swap_out", (Arg("blocks", BLOCKS),), NOTHING, BOTH),
    Operation("swap_in", (Arg("blocks", BLOCKS),), NOTHING, BOTH),
    Operation("reset_prefix_cache", (Arg("device", DEVICE, (CPU_GPU,)),), FLAG),
    Operation("swap", (Arg("blocks", BLOCKS), Arg("src_device", DEVICE),
                       Arg("dst_device", DEVICE)), ID_MAP, (CPU_GPU,)),
    Operation("allocate_or_get_null_block", (), NEW_BLOCK, (CPU_GPU,)),
)
"""Every operation, in SPEC.md's order."""

BY_NAME = {op.name: op for op in OPERATIONS}
"""The operations by name."""


def operation(name: str) -> Operation:
    """The operation called ``name`` (KeyError otherwise)."""
    return BY_NAME[name]


def names_for(allocator: str, *, required_only: bool = False) -> List[str]:
    """The allocator's own operations (not the Block's) for kind
    ``allocator``: all of them, or only the interface's."""
    return [op.name for op in OPERATIONS if allocator in op.allocators
            and op.owner == "allocator" and (op.required or not required_only)]


def missing(obj: object, allocator: str) -> List[str]:
    """The interface's operations of kind ``allocator`` that ``obj`` (a class
    or an instance) does not have."""
    return [name for name in names_for(allocator, required_only=True) if not hasattr(obj, name)]


def argument_names(*kinds: str) -> FrozenSet[str]:
    """The names of the arguments, of any operation, of one of ``kinds``."""
    return frozenset(a.name for op in OPERATIONS for a in op.args if a.kind in kinds)


def returning(*kinds: str) -> FrozenSet[str]:
    """The operations whose result is of one of ``kinds``."""
    return frozenset(op.name for op in OPERATIONS if op.result in kinds)
