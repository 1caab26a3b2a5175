"""The abstract state of a prefix-caching block allocator: an immutable value.

Everything the spec says is said about an :class:`AbstractState`.  The model
keeps one; the abstraction function (spec/abstraction.py) reads one out of
any allocator with vLLM-shaped internals.  Content is named by a
:data:`ContentKey` -- the extra hash and the exact tokens of every block from
the first one -- never by a hash, so two different contents can never look
equal here.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import (
    AbstractSet,
    Any,
    Container,
    Dict,
    FrozenSet,
    Iterable,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
    TypeVar,
)

from .pure import eviction_rank

BlockId = int
Tokens = Tuple[int, ...]
#: The exact content of a full block whose chain is hashed: the extra hash and
#: the exact tokens of every block from the first one, as a tuple of
#: ``(extra_hash, tokens)`` pairs, one per block, first block first, this
#: block last.  Two chains are the same content exactly when every block
#: carries the same extra hash and the same tokens (what a vLLM block hash,
#: which chains each block's own extra hash, distinguishes).  Never a hash.
ContentKey = Tuple[Tuple[Optional[int], Tokens], ...]


class HashedKey(tuple):  # type: ignore[type-arg]
    """A :data:`ContentKey` that computes its hash once, when made (a key is
    as long as its chain, and the checked allocators look keys up many
    times).  Equal to, and hashed like, the plain tuple of the same pairs."""

    _hash: int

    def __new__(cls, pairs: Iterable[Tuple[Optional[int], Tokens]]) -> HashedKey:
        """The key of ``pairs``, its hash computed (kept unset for a key
        with an unhashable part: hashing it raises, as the tuple's would)."""
        key = tuple.__new__(cls, pairs)
        try:
            key._hash = tuple.__hash__(key)
        except TypeError:
            pass
        return key

    def __hash__(self) -> int:
        """The tuple's hash, computed when the key was made."""
        try:
            return self._hash
        except AttributeError:
            return tuple.__hash__(self)


_S = TypeVar("_S")


def replace(obj: _S, **changes: Any) -> _S:
    """Return a copy of ``obj``, an instance of one of this module's frozen
    dataclasses, with ``changes`` to its fields: ``dataclasses.replace``
    (which it calls for a name that is not a field, to raise its
    TypeError) without running ``__init__``, which sets every field through
    ``object.__setattr__`` (the contracts' steps make many copies).  Values
    an AbstractState keeps of its fields (``free_counts``, ...) are not copied."""
    names = _FIELD_NAMES.get(type(obj))
    if names is None:
        names = _FIELD_NAMES[type(obj)] = frozenset(f.name for f in fields(obj))  # type: ignore[arg-type]
    if not names.issuperset(changes):
        return dataclasses.replace(obj, **changes)  # type: ignore[type-var]
    copy = object.__new__(type(obj))
    values = copy.__dict__
    values.update(obj.__dict__)
    values.update(changes)
    for name in _DERIVED:
        values.pop(name, None)
    return copy


_FIELD_NAMES: Dict[type, FrozenSet[str]] = {}


#: The ``last_accessed`` of an id that was never marked accessed since it was
#: (re)allocated: vLLM's ``_DEFAULT_LAST_ACCESSED_TIME``.
NEVER_ACCESSED: float = -1.0


@dataclass(frozen=True)
class BlockState:
    """What the allocator knows about one physical id that is not free.

    ``refcount`` 0 means evictable (it sits in the evictor and stays cached);
    ``content`` is None for a mutable (not yet full or unhashable) block.
    """

    refcount: int
    content: Optional[ContentKey]
    computed: bool
    last_accessed: float


@dataclass(frozen=True, order=True)
class EvictorEntry:
    """One evictable id, fields in the order that defines the eviction order
    except that ``num_hashed_tokens`` counts with the opposite sign.
    ``num_hashed_tokens`` is the number of tokens ``content`` covers: the
    tokens of every block of its chain."""

    last_accessed: float
    num_hashed_tokens: int
    block_id: BlockId
    content: ContentKey

    def eviction_rank(self) -> Tuple[float, int, BlockId]:
        """This entry's key in the eviction order (:func:`.pure.eviction_rank`)."""
        return eviction_rank(self.last_accessed, self.num_hashed_tokens, self.block_id)


@dataclass(frozen=True)
class AbstractState:
    """The whole observable state of one allocator (one device).

    * ``block_ids``: every physical id, sorted.
    * ``free``: the ids that hold no content and no reference, in the order
      in which they will be handed out (first = next).
    * ``blocks``: id -> :class:`BlockState` for every id that is in use
      (refcount > 0) or evictable (refcount 0, still cached).
    * ``cached``: content key -> id for every cached id, in use or evictable.
    * ``evictor``: the evictable ids in eviction order (first = next victim).
    * ``touched``: ids promoted since the last ``mark_blocks_as_computed``.
    * ``copy_on_writes``: the (source, destination) pairs recorded and not yet
      cleared, in order.
    * ``hits`` / ``misses``: cache queries since construction or the last
      successful ``reset_prefix_cache``.
    * ``reported_free``: what ``get_num_free_blocks()`` answers.
    * ``block_size``: tokens per block; 0 when not recorded (then the checks
      that need it are skipped).

    ``blocks[i].computed`` is what ``block_is_computed(i)`` answers: the
    tracked flag of an id in use; for an evictable id True unless it is
    touched (promoted, then released before ``mark_blocks_as_computed``; vLLM
    0.8.5 answers True for it too).  Hence a block with content is computed
    exactly when it is not touched, and a mutable id (``content`` None) never
    is.  ``blocks[i].last_accessed`` of an evictable id is its evictor entry's
    time.
    """

    block_ids: Sequence[BlockId]
    free: Tuple[BlockId, ...]
    blocks: Mapping[BlockId, BlockState] = field(hash=False)
    cached: Mapping[ContentKey, BlockId] = field(hash=False)
    evictor: Tuple[EvictorEntry, ...]
    touched: frozenset[BlockId]
    copy_on_writes: Tuple[Tuple[BlockId, BlockId], ...]
    hits: int
    misses: int
    reported_free: int
    block_size: int = 0

    def in_use(self) -> frozenset[BlockId]:
        """Ids with at least one reference."""
        return frozenset(i for i, b in self.blocks.items() if b.refcount > 0)

    def evictable(self) -> frozenset[BlockId]:
        """Ids with no reference that are still cached (in the evictor)."""
        return frozenset(i for i, b in self.blocks.items() if b.refcount == 0)

    # -- the elements the invariants quantify over -----------------------------

    def scope_ids(self) -> Iterable[BlockId]:
        """The ids the per-id invariants are checked at: every id the state
        names (its ids, its free list, its blocks)."""
        return set(self.block_ids) | set(self.free) | set(self.blocks)

    def scope_keys(self) -> Iterable[ContentKey]:
        """The content keys the per-key invariants are checked at: every
        cached key."""
        return self.cached.keys()

    def scope_positions(self) -> range:
        """The positions ``k`` of ``block_ids`` checked against ``k + 1``."""
        return range(len(self.block_ids) - 1)

    def scope_entries(self) -> Iterable[int]:
        """The positions of the evictor entries the per-entry invariants are
        checked at: all."""
        return range(len(self.evictor))

    def scope_touched(self) -> Iterable[BlockId]:
        """The touched ids the per-touched-id invariants are checked at: all."""
        return self.touched

    def count_free(self) -> int:
        """The number of free ids (the length of the free list)."""
        return len(self.free)

    def count_evictable(self) -> int:
        """The number of evictor entries."""
        return len(self.evictor)

    @cached_property
    def free_counts(self) -> Dict[BlockId, int]:
        """id -> how often it is listed in ``free``."""
        return Counter(self.free)

    @cached_property
    def cached_id_counts(self) -> Dict[BlockId, int]:
        """id -> how many cached keys map to it."""
        return Counter(self.cached.values())

    @cached_property
    def evictor_counts(self) -> Dict[BlockId, int]:
        """id -> how many evictor entries name it."""
        return Counter(e.block_id for e in self.evictor)

    @cached_property
    def known_ids(self) -> Container[BlockId]:
        """The ids of this allocator, as a container."""
        return self.block_ids if isinstance(self.block_ids, range) else frozenset(self.block_ids)


_DERIVED = tuple(name for name, value in vars(AbstractState).items()
                 if isinstance(value, cached_property))
"""The values an AbstractState computes from its fields once, when first read."""


@dataclass(frozen=True)
class PartialState(AbstractState):
    """An abstract state restricted to the elements one call touched: the
    ids ``ids`` and the content keys ``keys``, and of the rest only how
    many free ids, evictor entries and cached keys it holds.

    ``blocks``, ``cached``, ``touched`` and ``evictor`` hold exactly the
    entries of those ids and keys; ``free`` lists the free ids among
    ``ids`` in free-list order, and always the first ones of the whole free
    list that the call may take.  ``outside_free``, ``outside_evictable``
    and ``outside_cached`` count the free ids, evictor entries and cached
    keys not listed.  ``block_ids``, ``copy_on_writes``, ``hits``,
    ``misses`` and ``reported_free`` are the whole state's.  The contracts'
    steps change only listed elements, so they leave the ``outside`` counts
    alone: two partial states over the same elements are equal exactly when
    the whole states agree on those elements and on the three counts.  The
    invariants checked on a partial state are checked at its elements."""

    ids: AbstractSet[BlockId] = frozenset()
    keys: AbstractSet[ContentKey] = frozenset()
    outside_free: int = 0
    outside_evictable: int = 0
    outside_cached: int = 0

    def scope_ids(self) -> Iterable[BlockId]:
        """The ids this state lists."""
        return self.ids

    def scope_keys(self) -> Iterable[ContentKey]:
        """The keys this state lists."""
        return self.keys

    def scope_positions(self) -> range:
        """None: the ids of an allocator never change after construction,
        so they are checked once, on the first (whole) state."""
        return range(0)

    def scope_entries(self) -> Iterable[int]:
        """The positions of the entries of the ids this state lists."""
        return [k for k, e in enumerate(self.evictor) if e.block_id in self.ids]

    def scope_touched(self) -> Iterable[BlockId]:
        """The touched ids among those this state lists."""
        return self.touched & self.ids

    def narrowed(self, ids: AbstractSet[BlockId], keys: AbstractSet[ContentKey]) -> PartialState:
        """This state, listing only ``ids`` and ``keys`` of its elements as
        its own (the others stay readable: the invariants at the listed
        elements read them).  A cheap copy: the fields are shared."""
        copy = object.__new__(PartialState)
        copy.__dict__.update(self.__dict__, ids=ids, keys=keys)
        return copy

    def changed(self, old: PartialState) -> Tuple[AbstractSet[BlockId], AbstractSet[ContentKey]]:
        """The ids and keys at which this state differs from ``old`` (read at
        the same elements), with the keys those ids hold and the ids those
        keys name, before and after: the elements whose invariants a change
        from ``old`` to this state can break."""
        ids: Set[BlockId] = set()   # each part compared at its ids only where it differs
        if self.blocks != old.blocks:
            ids.update(i for i in self.ids if self.blocks.get(i) != old.blocks.get(i))
        if self.evictor != old.evictor:
            entries = {e.block_id: e for e in self.evictor}
            old_entries = {e.block_id: e for e in old.evictor}
            ids.update(i for i in self.ids if entries.get(i) != old_entries.get(i))
        if self.touched != old.touched:
            ids.update(i for i in self.ids if (i in self.touched) != (i in old.touched))
        if self.free != old.free:
            ids.update(i for i in self.ids if self.free_counts.get(i) != old.free_counts.get(i))
        keys: Set[ContentKey] = set() if self.cached == old.cached else {
            k for k in self.keys if self.cached.get(k) != old.cached.get(k)}
        for i in list(ids):
            keys.update(b.content for b in (self.blocks.get(i), old.blocks.get(i))
                        if b is not None and b.content is not None)
        for k in list(keys):
            ids.update(j for j in (self.cached.get(k), old.cached.get(k)) if j is not None)
        return ids, keys

    def count_free(self) -> int:
        """The number of free ids of the whole state."""
        return len(self.free) + self.outside_free

    def count_evictable(self) -> int:
        """The number of evictor entries of the whole state."""
        return len(self.evictor) + self.outside_evictable
