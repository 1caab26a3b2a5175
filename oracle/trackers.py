"""The target's block-manager helpers, driven beside its allocator.

vLLM's ``ComputedBlocksTracker`` and ``LastAccessBlocksTracker`` live in the
allocator's module (``prefix_caching_block.py``); a block manager builds one
of each around its allocator.  Where the target's classes publish them (the
allocator's class as attributes, or its module, or a module of a class in
its MRO, or of its device pair's allocators), the oracle builds them too, around the target, and
judges their answers and their effect on the allocator against the models
of :mod:`prefixcache.model.trackers`.  A target without them is judged
without these steps.

A step names the helper and the method, ``computed_blocks_tracker.get_num_cached_tokens``
or ``last_access_blocks_tracker.<method>``; a sequence is passed by its id,
with its tokens, extra hash and prefill flag in the step itself.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, List, Optional

from ..model.trackers import CachedTokensModel, LastAccessModel

COMPUTED = "computed_blocks_tracker"
LAST_ACCESS = "last_access_blocks_tracker"
#: The helpers' classes in the target's modules, by the name a step uses.
CLASSES = {COMPUTED: "ComputedBlocksTracker", LAST_ACCESS: "LastAccessBlocksTracker"}

TRACKER_OPS = frozenset(
    [f"{COMPUTED}.get_num_cached_tokens", f"{COMPUTED}.remove_seq"]
    + [f"{LAST_ACCESS}.{m}" for m in ("add_seq", "remove_seq", "update_last_access",
                                      "update_seq_blocks_last_access")])


class SequenceView:
    """What the helpers read of a vLLM ``Sequence``: its id, tokens, extra
    hash and whether it is in prefill."""

    def __init__(self, seq_id: int, token_ids: List[int], extra_hash: Optional[int],
                 is_prefill: bool) -> None:
        self.seq_id = seq_id
        self._token_ids = token_ids
        self._extra_hash = extra_hash
        self._is_prefill = is_prefill

    def get_token_ids(self) -> List[int]:
        return self._token_ids

    def extra_hash(self) -> Optional[int]:
        return self._extra_hash

    def is_prefill(self) -> bool:
        return self._is_prefill


def helper_classes(allocators: List[Any]) -> Optional[Dict[str, type]]:
    """Both helper classes: class attributes of that name of an allocator's
    class, or else those of the first module (of the allocators' classes,
    in MRO order) that defines or imports both; None without."""
    for allocator in allocators:
        for namespace in [vars(type(allocator))] + [
                vars(sys.modules.get(klass.__module__, object()))
                for klass in type(allocator).__mro__]:
            found = {step: namespace.get(name) for step, name in CLASSES.items()}
            if all(isinstance(c, type) for c in found.values()):
                return found
    return None


class Trackers:
    """One pair of helpers on each side: the target's, around the target
    allocator, and the models, around the model."""

    def __init__(self, classes: Dict[str, type], allocator: Any, model: Any,
                 block_size: int) -> None:
        self.sides: Dict[str, Dict[str, Any]] = {
            "target": {COMPUTED: classes[COMPUTED](allocator, block_size, True),
                       LAST_ACCESS: classes[LAST_ACCESS](allocator)},
            "model": {COMPUTED: CachedTokensModel(model, block_size, True),
                      LAST_ACCESS: LastAccessModel(model)},
        }


def make_trackers(kind: str, allocator: Any, parts: List[Any], model: Any,
                  block_size: int) -> Optional[Trackers]:
    """The helpers around ``allocator`` (found on it or on ``parts``, its
    device pair's allocators) and their models around ``model``; None when
    the classes publish none, or for a ``naive`` target (it does not cache)."""
    if kind == "naive":
        return None
    classes = helper_classes([allocator, *parts])
    if classes is None:
        return None
    return Trackers(classes, allocator, model, block_size)


def call_tracker(trackers: Trackers, side: str, op: str, args: Dict[str, Any]) -> Any:
    """Run the tracker step ``op`` with ``args`` on ``side``."""
    helper, _, method = op.partition(".")
    obj = trackers.sides[side][helper]
    if method == "get_num_cached_tokens":
        if side == "target":
            return obj.get_num_cached_tokens(SequenceView(
                args["seq_id"], list(args["token_ids"]), args["extra_hash"],
                args["is_prefill"]))
        return obj.get_num_cached_tokens(args["seq_id"], args["token_ids"],
                                         args["extra_hash"], args["is_prefill"])
    return getattr(obj, method)(**args)
