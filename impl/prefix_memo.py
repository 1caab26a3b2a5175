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
the allocator reports every eviction here (:meth:`PrefixMemo.evicted`), which
cuts at once every remembered prefix that holds the hash, and a reset
forgets everything (:meth:`PrefixMemo.clear`).

A remembered list is recognised by identity and verified by content (a
list changed in place or shortened, or a new list that took a dead one's
id, is examined afresh).  The memo holds a copy of each list, not the list
itself, for at most ``capacity`` lists, and at most ``index_limit`` entries
in its index of which prefix holds which hash; beyond either it starts
over, which costs one full examination per list.
"""

from __future__ import annotations

from typing import AbstractSet, Any, Dict, Iterator, List, Mapping, Optional, Sequence


class _Entry:
    """What is remembered about one list: a copy of its content and the
    length of its cached and computed prefix."""

    __slots__ = ("snapshot", "length")

    length: int  # set by the scan that follows the construction

    def __init__(self, source: List[int]) -> None:
        self.snapshot: List[int] = source[:]


#: hash -> the remembered prefixes holding it, as a flat list ``[entry,
#: index, entry, index, ...]`` (no tuple per pair: fewer objects for the
#: garbage collector to count).
_Holders = Dict[int, List[Any]]


class PrefixMemo:
    """The cached-and-computed prefix of hash lists, remembered per list.

    Costs: a remembered, unchanged list O(len) in C (a content comparison
    and the returned slice) plus O(1) per hash appended since; an eviction
    O(1) plus O(1) per remembered prefix it cuts; anything else O(len)
    dictionary lookups, like no memo."""

    __slots__ = ("_entries", "_holders", "_indexed", "capacity", "index_limit")

    def __init__(self, capacity: int = 1024, index_limit: int = 65536) -> None:
        self._entries: Dict[int, _Entry] = {}
        self._holders: _Holders = {}
        self._indexed = 0  # how many (entry, index) pairs _holders has had since a clear
        self.capacity = capacity
        self.index_limit = index_limit

    def clear(self) -> None:
        """Forget every list (after a cache reset, or past the limits)."""
        self._entries.clear()
        self._holders.clear()
        self._indexed = 0

    def evicted(self, content_hash: int) -> None:
        """``content_hash`` left the cache: cut every remembered prefix that
        holds it before its first occurrence there."""
        held: Iterator[Any] = iter(self._holders.pop(content_hash, ()))
        entry: _Entry
        index: int
        for entry, index in zip(held, held):
            if index < entry.length:
                entry.length = index

    def find(self, block_hashes: List[int], cached: Mapping[int, int],
             touched: AbstractSet[int]) -> List[int]:
        """The longest prefix of ``block_hashes`` (a slice of it) whose hashes
        are in ``cached`` with an id not in ``touched``.  Not a list (a
        tuple, say): examined afresh, and the slice is of its type."""
        if type(block_hashes) is not list:
            return block_hashes[:_scan(block_hashes, 0, cached, touched)]
        entry = self._entries.get(id(block_hashes))  # it holds its list: the id is its list's
        if entry is None:
            return self._remember(block_hashes, cached, touched)
        snapshot = entry.snapshot
        if block_hashes != snapshot:
            if block_hashes[:len(snapshot)] != snapshot:  # shortened or changed in place
                return self._remember(block_hashes, cached, touched)
            entry.snapshot = block_hashes[:]  # grown by appending: the prefix stands
        return self.extend(entry, block_hashes, cached, touched)

    def extend(self, entry: _Entry, block_hashes: List[int], cached: Mapping[int, int],
               touched: AbstractSet[int]) -> List[int]:
        """``find`` for ``entry``'s own list, equal to its snapshot: the
        remembered prefix, scanned on from its end."""
        length = entry.length
        if length < len(block_hashes):
            if self._indexed > self.index_limit:
                return self._remember(block_hashes, cached, touched)
            end = _scan(block_hashes, length, cached, touched, entry, self._holders)
            self._indexed += end - length
            entry.length = length = end
        return block_hashes[:length]

    def _remember(self, block_hashes: List[int], cached: Mapping[int, int],
                  touched: AbstractSet[int]) -> List[int]:
        """``find`` for a list examined afresh, remembered from now on."""
        entries = self._entries
        if len(entries) >= self.capacity or self._indexed > self.index_limit:
            self.clear()
        entry = _Entry(block_hashes)
        entries[id(block_hashes)] = entry
        entry.length = _scan(block_hashes, 0, cached, touched, entry, self._holders)
        self._indexed += entry.length
        return block_hashes[:entry.length]


def _scan(block_hashes: Sequence[int], start: int, cached: Mapping[int, int],
          touched: AbstractSet[int], entry: Optional[_Entry] = None,
          holders: Optional[_Holders] = None) -> int:
    """The end of the cached, untouched run of ``block_hashes`` from
    ``start``; with an ``entry``, each hash of the run is indexed in
    ``holders`` as held by ``entry`` at its index."""
    end = start
    stop = len(block_hashes)
    get = cached.get
    while end < stop:
        content_hash = block_hashes[end]
        block_id = get(content_hash)
        if block_id is None or block_id in touched:
            break
        if entry is not None:
            held = holders.get(content_hash)  # type: ignore[union-attr]
            if held is None:
                holders[content_hash] = [entry, end]  # type: ignore[index]
            else:
                held.append(entry)
                held.append(end)
        end += 1
    return end
