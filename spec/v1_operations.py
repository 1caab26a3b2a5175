"""The operations of vLLM v1's ``BlockPool`` (0.34.0) that the spec covers:
each one's arguments, its result, and its effect on the
:class:`~prefixcache.spec.v1_state.V1State`, in words.

A block is named by its id.  ``free_queue`` is ``q``; "cached" means "holds a
key".  Every operation keeps the v1 invariants; a caller mistake (a row of
:data:`~prefixcache.spec.v1_error_table.V1_ERROR_TABLE`) raises and changes
nothing.  The model (:class:`prefixcache.model.v1_model.V1Model`) has one
method per row, of the same name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple


@dataclass(frozen=True)
class V1Operation:
    """One operation: its name, its arguments, its result and its effect."""

    name: str
    arguments: Tuple[str, ...]
    result: str
    effect: str


V1_OPERATIONS: Tuple[V1Operation, ...] = (
    V1Operation("get_new_blocks", ("num_blocks",), "the ids taken, in queue order",
                "the first `num_blocks` ids of `q` leave it; each loses its key (the next "
                "id cached under that key, if any, becomes the first) and gets `ref_cnt` 1"),
    V1Operation("cache_full_blocks",
                ("request.block_hashes", "blocks", "num_cached_blocks", "num_full_blocks",
                 "block_size", "kv_cache_group_id"), "None",
                "each of `blocks[num_cached_blocks:num_full_blocks]` but the null block, "
                "block `k`, is cached under (the last request hash inside it, the group) "
                "after the ids already there, covering `(k + 1) * block_size` tokens; a block "
                "cached over fewer tokens loses its keys first (the next id under each becomes "
                "the first)"),
    V1Operation("get_cached_block", ("block_hash", "kv_cache_group_ids"),
                "one id per group, or None",
                "none: answers the first id cached under (hash, g) for every group g, or "
                "None if one group has none"),
    V1Operation("touch", ("blocks",), "None",
                "each id but the null block gets one more reference; one that was in `q` "
                "leaves it"),
    V1Operation("free_blocks", ("ordered_blocks", "evict_first"), "None",
                "each id but the null block loses one reference; those left with none "
                "join `q` in the order given: uncached ones (all, with `evict_first`) "
                "before its first id, cached ones after its last"),
    V1Operation("evict_blocks", ("block_ids",), "None",
                "each id loses its key (the next id under it becomes the first); "
                "references and `q` do not change"),
    V1Operation("reset_prefix_cache", (), "bool",
                "when every id but the null block is in `q`: every key goes, answers True; "
                "else none, answers False"),
    V1Operation("get_num_free_blocks", (), "int", "none: answers `reported_free`"),
    V1Operation("get_usage", (), "float",
                "none: answers 1 - `reported_free` / (ids - 1), or 0.0 for one id"),
)
"""Every operation, in the order SPEC.md presents them."""
