"""The model of vLLM's two block-manager helpers around an allocator.

vLLM's block manager keeps, beside its allocator, a ``ComputedBlocksTracker``
(how many tokens of each sequence are cached, asked every scheduler step)
and a ``LastAccessBlocksTracker`` (each sequence's last run time, passed to
``mark_blocks_as_accessed`` only when asked: vLLM defers the marks).  Both
live in vLLM's ``prefix_caching_block.py`` and in
``prefixcache.impl.prefix_caching_block``.  Their models here answer
through a model of the allocator (:class:`~prefixcache.model.Model` or
``DeviceModel``, the GPU for a pair), by content: a sequence's full
blocks are named by their exact tokens and extra hash, never by a hash.

Using a sequence id the helper does not track (or one it already tracks,
for ``add_seq``) is the caller's mistake: vLLM asserts, the models raise
:class:`UnknownSequenceError`.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from ..spec.state import ContentKey


class UnknownSequenceError(ValueError):
    """A sequence id the helper does not track (or tracks already)."""


def full_block_keys(token_ids: Sequence[int], extra_hash: Optional[int],
                    block_size: int) -> List[ContentKey]:
    """The content key of every full block of the token stream, first
    block first: each key is the (extra_hash, tokens) pairs of the blocks
    from the first one to it."""
    pairs = [(extra_hash, tuple(token_ids[i:i + block_size]))
             for i in range(0, len(token_ids) - block_size + 1, block_size)]
    return [tuple(pairs[:n + 1]) for n in range(len(pairs))]


class CachedTokensModel:
    """``ComputedBlocksTracker``: per sequence id, the cached-token count it
    last answered (absent until it is first asked)."""

    def __init__(self, allocator: Any, block_size: int, enable_caching: bool = True) -> None:
        self.allocator = allocator
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.answered: Dict[int, int] = {}

    def get_num_cached_tokens(self, seq_id: int, token_ids: Sequence[int],
                              extra_hash: Optional[int], is_prefill: bool) -> int:
        """Tokens of the sequence's full blocks that form a cached, computed
        prefix (``find_cached_blocks_prefix`` times the block size); while
        the sequence is in prefill, an earlier answer stands.  Records the
        answer.  0 without caching."""
        if not self.enable_caching:
            return 0
        if is_prefill and seq_id in self.answered:
            return self.answered[seq_id]
        keys = full_block_keys(token_ids, extra_hash, self.block_size)
        tokens = len(self.allocator.find_cached_blocks_prefix(keys)) * self.block_size
        self.answered[seq_id] = tokens
        return tokens

    def remove_seq(self, seq_id: int) -> None:
        """Forget the sequence (asked about before: else UnknownSequenceError)."""
        if not self.enable_caching:
            return
        if seq_id not in self.answered:
            raise UnknownSequenceError(f"sequence {seq_id} was never asked about")
        del self.answered[seq_id]


class LastAccessModel:
    """``LastAccessBlocksTracker``: per tracked sequence id, its last run
    time (None until one is recorded)."""

    def __init__(self, allocator: Any) -> None:
        self.allocator = allocator
        self.times: Dict[int, Optional[float]] = {}

    def _known(self, seq_id: int) -> None:
        if seq_id not in self.times:
            raise UnknownSequenceError(f"sequence {seq_id} is not tracked")

    def add_seq(self, seq_id: int) -> None:
        """Track the sequence, with no time yet (tracked already: UnknownSequenceError)."""
        if seq_id in self.times:
            raise UnknownSequenceError(f"sequence {seq_id} is tracked already")
        self.times[seq_id] = None

    def remove_seq(self, seq_id: int) -> None:
        """Stop tracking the sequence."""
        self._known(seq_id)
        del self.times[seq_id]

    def update_last_access(self, seq_id: int, time: float) -> None:
        """Record that the sequence ran at ``time``."""
        self._known(seq_id)
        self.times[seq_id] = time

    def update_seq_blocks_last_access(self, seq_id: int, block_ids: List[int]) -> None:
        """Mark ``block_ids`` accessed at the sequence's recorded time, on
        the allocator; nothing when no time is recorded."""
        self._known(seq_id)
        time = self.times[seq_id]
        if time is not None:
            self.allocator.mark_blocks_as_accessed(block_ids, time)
