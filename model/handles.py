"""The model's stand-in for a vLLM ``Block``: one link of a sequence of blocks.

A :class:`Handle` is never recycled: once freed it stays detached
(``block_id is None``) unless ``swap_in`` attaches it again.  Its content is
named by an exact key, never by a hash.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..spec.state import ContentKey

#: The exact content of a full block whose chain is hashed: one
#: (extra_hash, tokens) pair per block, from the first block to this one.
#: Exactly the spec's :data:`~prefixcache.spec.state.ContentKey`.
ChainKey = ContentKey


@dataclass(eq=False)
class Handle:
    """One block of a sequence, as the caller sees it.

    ``key`` is fixed once, when the block becomes full: the block's exact
    content if every earlier block had one then, else None for ever (a
    block after a non-full block has no content and shares with nothing).
    ``computed`` is the flag on the object (set by a cache hit), not the
    allocator's per-id flag."""

    owner: object = field(repr=False)
    block_size: int
    prev_block: Optional[Handle] = field(repr=False)
    token_ids: list[int]
    extra_hash: Optional[int] = None
    block_id: Optional[int] = None
    computed: bool = False
    key: Optional[ChainKey] = None

    @property
    def is_full(self) -> bool:
        """No empty slot left."""
        return len(self.token_ids) == self.block_size

    @property
    def num_empty_slots(self) -> int:
        """Slots still free in this block."""
        return self.block_size - len(self.token_ids)

    @property
    def num_tokens_total(self) -> int:
        """Tokens in this block and every earlier block of the chain."""
        return sum(len(h.token_ids) for h in chain(self))

    @property
    def content_key(self) -> Optional[ContentKey]:
        """The spec's name of this block's content, or None without content."""
        return self.key


def chain(last: Handle) -> list[Handle]:
    """The blocks from the first one to ``last``, first block first."""
    out: list[Handle] = []
    h: Optional[Handle] = last
    while h is not None:
        out.append(h)
        h = h.prev_block
    return out[::-1]

