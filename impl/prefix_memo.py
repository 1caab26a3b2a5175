"""A memo that makes ``find_cached_blocks_prefix`` cost O(what changed)
instead of O(the list) for a caller that asks about the same list again
and again, as vLLM's ``ComputedBlocksTracker`` does: it passes each running
sequence's own list of block hashes every scheduler step, growing it by
appending.

Why remembering is exact: a hash that is cached and computed stays so until
it leaves the cache.  A cached id becomes "touched" (not computed) only at
the moment it is cached, never later while it stays cached, and a hash
leaves the cache only by eviction or ``reset_prefix_cache``.  So a prefix
found cached and computed is still so, except for the hashes evicted since;
the allocator reports every eviction here (:meth:`PrefixMemo.evicted`) and
forgets everything on a reset (:meth:`PrefixMemo.clear`).

A remembered list is recognised by identity and verified by content (a
list changed in place or shortened is examined afresh).  The memo keeps a
reference to at most ``capacity`` lists and at most ``log_limit`` evictions;
beyond either it starts over, which costs one full examination per list.
"""

from __future__ import annotations

from typing import AbstractSet, Dict, List, Mapping, Optional, Sequence


class _Entry:
    """What is remembered about one list: the list itself (held, so its id
    stays unique), a copy of its content, the length of its cached and
    computed prefix, the first index of each hash of that prefix, and how
    much of the eviction log had been read."""

    __slots__ = ("source", "snapshot", "length", "positions", "log_position")

    def __init__(self, source: List[int], length: int, log_position: int) -> None:
        self.source = source
        self.snapshot: List[int] = source[:]
        self.length = length
        prefix = source[:length]
        # the first occurrence wins: later (smaller) indices overwrite
        self.positions: Dict[int, int] = dict(zip(reversed(prefix),
                                                  range(length - 1, -1, -1)))
        self.log_position = log_position


class PrefixMemo:
    """The cached-and-computed prefix of hash lists, remembered per list.

    Costs: a remembered, unchanged list O(len) in C (a content comparison
    and the returned slice) plus O(1) per hash newly appended or evicted
    since; anything else O(len) dictionary lookups, like no memo."""

    __slots__ = ("_entries", "_log", "capacity", "log_limit")

    def __init__(self, capacity: int = 1024, log_limit: int = 16384) -> None:
        self._entries: Dict[int, _Entry] = {}
        self._log: List[int] = []
        self.capacity = capacity
        self.log_limit = log_limit

    def clear(self) -> None:
        """Forget every list and every eviction (after a cache reset)."""
        self._entries.clear()
        self._log.clear()

    def evicted(self, content_hash: int) -> None:
        """Record that ``content_hash`` left the cache."""
        log = self._log
        log.append(content_hash)
        if len(log) > self.log_limit:
            self.clear()

    def cut(self, entry: _Entry, evicted: List[int]) -> int:
        """Shorten ``entry``'s prefix before the first of ``evicted`` in it;
        return the new length."""
        length = entry.length
        positions = entry.positions
        for content_hash in evicted:
            found = positions.get(content_hash)
            if found is not None and found < length:
                length = found
        entry.length = length
        return length

    def catch_up(self, entry: _Entry) -> None:
        """Cut ``entry``'s prefix by the evictions logged since it last read
        the log."""
        log = self._log
        if entry.log_position != len(log):
            news = log[entry.log_position:]
            if not entry.positions.keys().isdisjoint(news):
                self.cut(entry, news)
            entry.log_position = len(log)

    def find(self, block_hashes: List[int], cached: Mapping[int, int],
             touched: AbstractSet[int]) -> List[int]:
        """The longest prefix of ``block_hashes`` (a slice of it) whose hashes
        are in ``cached`` with an id not in ``touched``.  Not a list (a
        tuple, say): examined afresh, and the slice is of its type."""
        if type(block_hashes) is not list:
            return block_hashes[:_scan(block_hashes, 0, cached, touched, None)]
        entry = self._entries.get(id(block_hashes))
        if entry is not None and entry.source is block_hashes:
            snapshot = entry.snapshot
            if block_hashes != snapshot:
                if len(block_hashes) <= len(snapshot) or block_hashes[:len(snapshot)] != snapshot:
                    return self._remember(block_hashes, cached, touched)
                entry.snapshot = block_hashes[:]
            self.catch_up(entry)
            return self.extend(entry, block_hashes, cached, touched)
        return self._remember(block_hashes, cached, touched)

    def extend(self, entry: _Entry, block_hashes: List[int], cached: Mapping[int, int],
               touched: AbstractSet[int]) -> List[int]:
        """``find`` for ``entry``'s own list, equal to its snapshot and caught
        up with the evictions: the remembered prefix, scanned on from its end."""
        length = entry.length
        if length < len(block_hashes):
            entry.length = length = _scan(block_hashes, length, cached, touched,
                                          entry.positions)
        return block_hashes[:length]

    def _remember(self, block_hashes: List[int], cached: Mapping[int, int],
                  touched: AbstractSet[int]) -> List[int]:
        """``find`` for a list examined afresh, remembered from now on."""
        length = _scan(block_hashes, 0, cached, touched, None)
        entries = self._entries
        if len(entries) >= self.capacity:
            entries.clear()
        entries[id(block_hashes)] = _Entry(block_hashes, length, len(self._log))
        return block_hashes[:length]


def _scan(block_hashes: Sequence[int], start: int, cached: Mapping[int, int],
          touched: AbstractSet[int], positions: Optional[Dict[int, int]]) -> int:
    """The end of the cached, untouched run of ``block_hashes`` from
    ``start``; its hashes are added to ``positions`` (first index wins)."""
    end = start
    stop = len(block_hashes)
    get = cached.get
    while end < stop:
        content_hash = block_hashes[end]
        block_id = get(content_hash)
        if block_id is None or block_id in touched:
            break
        if positions is not None:
            positions.setdefault(content_hash, end)
        end += 1
    return end
