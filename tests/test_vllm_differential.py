"""Differential test: prefixcache.impl against vLLM 0.8.5's real allocators.

Both ``CpuGpuBlockAllocator.create("prefix_caching", ...)`` pairs are driven
side by side, in one process (so Python's seeded ``hash`` gives both the same
content hashes), with the same random *valid* call sequences on tiny pools
(2-8 GPU blocks, 1-4 CPU blocks, block size 1-4, tokens from ``{0, 1}`` so
that prefixes are shared all the time):

* new sequences: ``allocate_immutable_blocks`` / ``allocate_immutable_block``
  one at a time / ``allocate_mutable_block`` + ``append_token_ids`` of full
  blocks (promotion, incl. promotion onto an already cached id), then a
  mutable tail, with or without an ``extra_hash``;
* ``append_token_ids`` to a sequence's tail (filling it promotes it; on a
  forked tail it copies on write), a new mutable block after a full tail,
  or full blocks after it with ``allocate_immutable_block(s)``;
* ``fork``, ``free`` (in several orders), ``swap`` GPU->CPU and back;
* ``mark_blocks_as_accessed`` with timestamps 0..3 (many ties),
  ``mark_blocks_as_computed``, ``find_cached_blocks_prefix`` (on new lists
  and, as vLLM's ComputedBlocksTracker does, again on lists asked about
  before: unchanged, grown, shrunk or changed in place),
  ``get_num_full_blocks_touched`` (with repeated Blocks), ``reset_prefix_cache``,
  ``clear_copy_on_writes``, ``get_prefix_cache_hit_rate``,
  ``get_common_computed_block_ids``, ``get_physical_block_id``,
  ``get_and_reset_swaps``.

Every result is compared (block ids, swap mappings, CoW pairs, hit rates,
counts, prefixes), and after every call the state of both devices:
``_cached_blocks`` (with its order), ``_refcounter._refcounts``,
``_hashless_allocator._free_block_indices`` (with its order), the evictor's
``free_table`` (keys in order, and each entry), the trackers, the touched
set, ``metric_data``, and every live Block (id, tokens, hash, computed,
``num_tokens_total``).

Only calls that are valid for vLLM are generated: a call that needs ids is
made only when vLLM's free count covers what it takes (vLLM is not
all-or-nothing), so neither side ever raises.

Deliberate differences (where SPEC.md is stricter than vLLM 0.8.5),
tolerated or avoided here:

(a) ``cow_block_if_not_appendable`` called directly: vLLM leaves the Block
    detached (``block_id`` None) and relies on the caller to store the new
    id; ours moves the Block.  Copy-on-write is only exercised through
    ``append_token_ids``, where both end equal.
(b) A promoted block that is not yet marked computed (it is in
    ``_touched_blocks``): ours reports it not computed even once evictable,
    and a hit that restores it from the evictor keeps it not computed; vLLM
    reports an evictable id computed and restores it computed.  The harness
    checks ours is exactly vLLM's answer minus the touched ids, and compares
    ``find_cached_blocks_prefix`` results only when no touched id is involved.
(c) Ours drops an evicted id from ``_touched_blocks`` and
    ``reset_prefix_cache`` empties it; vLLM keeps stale ids there (and
    ``mark_blocks_as_computed`` then marks the trackers of whatever reuses
    them).  Checked: ours == vLLM's touched set restricted to cached ids;
    the computed flag is compared only for cached ids in use.  In vLLM this
    can report a block computed right after its promotion::

        alloc = PrefixCachingBlockAllocator(num_blocks=1, block_size=1)
        alloc.free(alloc.allocate_immutable_block(None, [0]))
        m = alloc.allocate_mutable_block(None)  # evicts id 0, still "touched"
        alloc.mark_blocks_as_computed([])       # marks the mutable block
        m.append_token_ids([5])                 # promoted, not yet computed
        alloc.find_cached_blocks_prefix([m.content_hash])
        # vLLM: [hash] (computed); ours: []
(d) A full block after a non-full block: vLLM hashes it with a ``None``
    parent; ours gives it no hash.  Never generated: a new block is only
    appended after a full tail.
(e) vLLM's LRU evictor is a lazy heap that goes wrong in two ways, both
    fixed in ours (SPEC.md: the eviction order is exactly the
    documented one at every moment).  Minimal examples, block size 1, run
    by ``test_vllm_evictor_bugs_are_fixed`` below:

    1. ``update`` does not push a heap entry, so a block marked accessed
       while evictable drops out of the heap::

           a = alloc.allocate_immutable_block(None, [0]); alloc.free(a)
           alloc.mark_blocks_as_accessed([0], 1)
           alloc.allocate_mutable_block(None)
           # vLLM: ValueError("No usable cache memory left") although
           #       get_num_free_blocks() == 1; ours: block 0

       and with two blocks it evicts in the wrong order::

           a = alloc.allocate_immutable_block(None, [0])   # id 0
           b = alloc.allocate_immutable_block(None, [1])   # id 1
           alloc.mark_blocks_as_accessed([1], 3)
           alloc.free(a); alloc.free(b)
           alloc.mark_blocks_as_accessed([0], 1)
           alloc.allocate_mutable_block(None)
           # vLLM: id 1 (accessed at 3); ours: id 0 (accessed at 1)

    2. ``remove`` leaves the entry in the heap; when the id is freed again
       with the same timestamp the heap holds a duplicate, which outlives
       the id's eviction and later matches the id's *next* content::

           pool of 3, block size 1
           for _ in range(2):                  # hit, so a stale duplicate
               for b in alloc.allocate_immutable_blocks(None, [[0], [1]]):
                   alloc.free(b)
           m = alloc.allocate_mutable_block(None)    # id 2
           m2 = alloc.allocate_mutable_block(None)   # evicts id 1
           m2.append_token_ids([7]); alloc.free(m2)  # id 1 cached anew
           alloc.allocate_mutable_block(None)
           # vLLM: AssertionError, or KeyError under python -O (it pops the
           #       stale entry of id 1, whose old hash is no longer cached);
           #       ours: id 0, the documented victim

    The generator does mark evictable ids (rarely), and the harness predicts
    vLLM's evictions from its heap (``_vllm_eviction_sequence``): while they
    differ from the documented order, calls that may evict on that device
    (and ``reset_prefix_cache``, which evicts everything) are not generated.
(f) ``find_cached_blocks_prefix``: vLLM bisects, which assumes the cached and
    computed hashes form a prefix of the list; after evictions that took an
    earlier block of a chain before a later one (timestamps make that
    possible) it can answer anything.  Ours returns the longest prefix::

        alloc = PrefixCachingBlockAllocator(num_blocks=3, block_size=1)
        s = alloc.allocate_immutable_blocks(None, [[0], [1]])  # ids 0, 1
        hashes = [b.content_hash for b in s]
        alloc.mark_blocks_as_computed([])
        alloc.mark_blocks_as_accessed([1], 3)
        for b in s: alloc.free(b)
        alloc.allocate_mutable_block(None)
        alloc.allocate_mutable_block(None)        # evicts id 0 (older)
        alloc.find_cached_blocks_prefix(hashes)
        # vLLM: both hashes (the first is gone); ours: []

    The harness compares vLLM's answer only when the predicate is monotone,
    and ours always against the linear scan of vLLM's state.

(g) vLLM returns a Block object to the pool of the allocator that frees it,
    and a swapped-out Block is a GPU pool object freed by the CPU allocator:
    the CPU pool then holds a GPU pool index, and its next ``init_block``
    raises IndexError (or re-initialises an unrelated object).  Minimal::

        alloc = CpuGpuBlockAllocator.create('prefix_caching', 6, 1, 1)
        a = alloc.allocate_immutable_blocks(None, [[0], [0]], device=GPU)
        b = alloc.allocate_immutable_blocks(None, [[0], [0]], device=GPU)
        c = alloc.allocate_mutable_block(None, device=GPU)   # pool slot 4
        for blk in b + a: alloc.free(blk)
        alloc.swap([c], GPU, CPU); alloc.free(c)   # slot 4 -> CPU pool of 4
        d = alloc.allocate_immutable_block(None, [0], device=GPU)
        alloc.swap([d], GPU, CPU)                  # vLLM: IndexError

    Swapped-out sequences are therefore freed with
    ``keep_block_object=True`` on the CPU allocator (both sides).

The wheel (~320 MB) is fetched once per machine by prefixcache.oracle.vllm_source
(``pip download``, into ``~/.cache/prefixcache/vllm-0.8.5`` or
``$PREFIXCACHE_VLLM_CACHE``); when it cannot be had the test fails.  Set
``PREFIXCACHE_DIFF_EXAMPLES=N`` for a longer, randomised run.
"""

from __future__ import annotations

import functools
import heapq
import os
import random
from collections import Counter
from typing import Any, Callable, List, Optional, Tuple

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from prefixcache.impl.cpu_gpu_block_allocator import CpuGpuBlockAllocator as OurCpuGpu
from prefixcache.impl.interfaces import Device
from prefixcache.impl.prefix_caching_block import PrefixCachingBlockAllocator as OurPrefix
from prefixcache.oracle import vllm_source

TOKENS = st.integers(0, 1)
TIMES = st.integers(0, 3)
GPU, CPU = "GPU", "CPU"


@functools.lru_cache(maxsize=1)
def _load() -> Tuple[Any, Optional[str]]:
    """vLLM's modules, or why they could not be had (tried once per process)."""
    try:
        return vllm_source.load("0.8.5"), None
    except Exception as exc:  # noqa: BLE001 - any failure to get vLLM fails the tests
        return None, f"{type(exc).__name__}: {exc}"


@pytest.fixture(scope="module")
def vllm() -> Any:
    ref, error = _load()
    if error is not None:
        pytest.fail(
            "the differential test needs vLLM 0.8.5's allocators, obtained by "
            f"prefixcache.oracle.vllm_source, and could not get them:\n{error}",
            pytrace=False,
        )
    return ref


# -- vLLM's evictor, predicted -----------------------------------------------------

def _vllm_eviction_sequence(evictor: Any) -> List[Optional[Tuple[int, int]]]:
    """What successive ``evict()`` calls of vLLM's heap evictor would return
    (None: it would raise although entries remain), without changing it."""
    heap = list(evictor.priority_queue)  # a copy of a heap is a heap
    live = {block_id: meta.last_accessed for block_id, meta in evictor.free_table.items()}
    out: List[Optional[Tuple[int, int]]] = []
    while live:
        if not heap:
            out.append(None)
            break
        last_accessed, _, block_id, content_hash = heapq.heappop(heap)
        if live.get(block_id, object()) == last_accessed:
            del live[block_id]
            out.append((block_id, content_hash))
    return out


def _documented_eviction_sequence(evictor: Any) -> List[Tuple[int, int]]:
    """The documented eviction order (SPEC.md), from the free table alone."""
    entries = sorted(
        (meta.last_accessed, -meta.num_hashed_tokens, block_id, meta.content_hash)
        for block_id, meta in evictor.free_table.items()
    )
    return [(block_id, content_hash) for _, _, block_id, content_hash in entries]


# -- the harness --------------------------------------------------------------------

class Seq:
    """One sequence: its vLLM Blocks and ours, in chain order."""

    def __init__(self, name: str, v: List[Any], o: List[Any], device: str,
                 extra_hash: Optional[int]) -> None:
        self.name, self.v, self.o, self.device, self.extra_hash = name, v, o, device, extra_hash


class Divergence(AssertionError):
    pass


class Harness:
    def __init__(self, ref: Any, data: Any, num_gpu: int, num_cpu: int, block_size: int) -> None:
        self.ref = ref
        self.data = data
        self.bs = block_size
        self.v = ref.cpu_gpu_block_allocator.CpuGpuBlockAllocator.create(
            "prefix_caching", num_gpu, num_cpu, block_size)
        self.o = OurCpuGpu.create("prefix_caching", num_gpu, num_cpu, block_size)
        self.seqs: List[Seq] = []
        self.counter = 0
        self.trace: List[str] = []
        self.stats: Counter = Counter()
        self.history: List[Tuple[List[List[int]], Optional[int]]] = []
        self.queries: List[Tuple[List[List[int]], Optional[int], List[int]]] = []
        self.log(f"alloc = CpuGpuBlockAllocator.create('prefix_caching', {num_gpu}, "
                 f"{num_cpu}, {block_size})")

    # helpers ------------------------------------------------------------------

    def log(self, line: str) -> None:
        self.trace.append(line)
        note(line)

    def divergence(self, message: str) -> Divergence:
        """A Divergence saying ``message`` and the calls made so far."""
        return Divergence(f"{message}\n--- calls ---\n" + "\n".join(self.trace))

    def fail(self, what: str, vres: Any, ores: Any) -> None:
        raise self.divergence(f"{what}: vLLM {vres!r} != ours {ores!r}")

    def same(self, what: str, vres: Any, ores: Any) -> None:
        if vres != ores:
            self.fail(what, vres, ores)

    def vdev(self, device: str) -> Any:
        return self.ref.Device[device]

    def odev(self, device: str) -> Device:
        return Device[device]

    def va(self, device: str) -> Any:
        return self.v._allocators[self.vdev(device)]

    def oa(self, device: str) -> OurPrefix:
        return self.o._allocators[self.odev(device)]

    def draw(self, strategy: Any) -> Any:
        return self.data.draw(strategy)

    def both(self, label: str, fv: Callable[[], Any], fo: Callable[[], Any]) -> Tuple[Any, Any]:
        try:
            rv = fv()
        except Exception as exc:
            raise self.divergence(f"{label}: vLLM raised {type(exc).__name__}: {exc} on a "
                                  "call the generator considered valid") from exc
        try:
            ro = fo()
        except Exception as exc:
            raise self.divergence(f"{label}: ours raised {type(exc).__name__}: {exc}; "
                                  f"vLLM returned {rv!r}") from exc
        return rv, ro

    def hash_chain(self, blocks: List[List[int]], extra_hash: Optional[int]) -> List[int]:
        hash_tokens = self.ref.prefix_caching_block.PrefixCachingBlock.hash_block_tokens
        hashes: List[int] = []
        prev: Optional[int] = None
        for index, tokens in enumerate(blocks):
            prev = hash_tokens(index == 0, prev, tokens, extra_hash)
            hashes.append(prev)
        return hashes

    def in_use(self, device: str, content_hash: Optional[int]) -> bool:
        """vLLM caches ``content_hash`` on an id that is in use."""
        va = self.va(device)
        block_id = va._cached_blocks.get(content_hash)
        return block_id is not None and va._refcounter.get(block_id) > 0

    def can_take(self, device: str, peak: int, label: str) -> bool:
        """Whether a call that takes up to ``peak`` ids on ``device`` is valid
        for vLLM and evicts (if it does) in the documented order."""
        va = self.va(device)
        if peak > va.get_num_free_blocks():
            self.stats["skip: not enough free blocks"] += 1
            return False
        if peak > len(va._hashless_allocator._free_block_indices) and not self.evictor_ok(device):
            self.stats[f"skip: vLLM heap evictor diverged ({label})"] += 1
            return False
        return True

    def evictor_ok(self, device: str) -> bool:
        evictor = self.va(device).evictor
        return _vllm_eviction_sequence(evictor) == _documented_eviction_sequence(evictor)

    def gpu_seqs(self) -> List[Seq]:
        return [s for s in self.seqs if s.device == GPU and s.v]

    def pick(self, seqs: List[Seq]) -> Optional[Seq]:
        if not seqs:
            return None
        return seqs[self.draw(st.integers(0, len(seqs) - 1))]

    def draw_chain(self) -> Tuple[List[List[int]], Optional[int]]:
        """Full blocks of tokens and an extra hash: often a prefix of a chain
        seen before (so that prefixes are shared), extended at random."""
        if self.history and self.draw(st.integers(0, 2)):
            seen, extra = self.history[self.draw(st.integers(0, len(self.history) - 1))]
            blocks = [list(tokens) for tokens in seen[:self.draw(st.integers(0, len(seen)))]]
        else:
            blocks, extra = [], self.draw(st.sampled_from([None, None, 7]))
        more = self.draw(st.integers(0, 3 - min(len(blocks), 2)))
        blocks += [self.draw(st.lists(TOKENS, min_size=self.bs, max_size=self.bs))
                   for _ in range(more)]
        return blocks, extra

    def remember(self, seq: Seq) -> None:
        full = [list(b.token_ids) for b in seq.v if b.is_full]
        if full and (full, seq.extra_hash) not in self.history:
            self.history.append((full, seq.extra_hash))

    def new_name(self) -> str:
        self.counter += 1
        return f"s{self.counter}"

    # operations -------------------------------------------------------------

    def op_new_seq(self) -> None:
        full, extra = self.draw_chain()
        tail = self.draw(st.none() | st.lists(TOKENS, min_size=0, max_size=self.bs - 1))
        if not full and tail is None:
            return
        mode = self.draw(st.sampled_from(["blocks", "single", "mutable"])) if full else "-"
        hashes = self.hash_chain(full, extra)
        consumed = peak = 0
        for content_hash in hashes:
            if self.in_use(GPU, content_hash):
                if mode == "mutable":  # a fresh id first, released on promotion
                    peak = max(peak, consumed + 1)
            else:
                consumed += 1
                peak = max(peak, consumed)
        if tail is not None:
            peak = max(peak, consumed + 1)
        if not self.can_take(GPU, peak, "new seq"):
            return
        name = self.new_name()
        self.log(f"{name} = new_seq(full={full}, tail={tail}, extra_hash={extra}, mode={mode!r})")

        def build(alloc: Any, device: Any) -> List[Any]:
            blocks: List[Any] = []
            prev = None
            if mode == "blocks":
                blocks = alloc.allocate_immutable_blocks(None, full, device=device,
                                                         extra_hash=extra)
                prev = blocks[-1]
            elif mode == "single":
                for tokens in full:
                    prev = alloc.allocate_immutable_block(prev, tokens, device=device,
                                                          extra_hash=extra)
                    blocks.append(prev)
            elif mode == "mutable":
                for tokens in full:
                    prev = alloc.allocate_mutable_block(prev, device=device, extra_hash=extra)
                    prev.append_token_ids(list(tokens))
                    blocks.append(prev)
            if tail is not None:
                block = alloc.allocate_mutable_block(prev, device=device, extra_hash=extra)
                block.append_token_ids(list(tail))
                blocks.append(block)
            return blocks

        vb, ob = self.both("new_seq", lambda: build(self.v, self.vdev(GPU)),
                           lambda: build(self.o, self.odev(GPU)))
        self.seqs.append(Seq(name, vb, ob, GPU, extra))
        self.remember(self.seqs[-1])
        self.log(f"  # ids {[b.block_id for b in vb]}")

    def op_append(self) -> None:
        seq = self.pick(self.gpu_seqs())
        if seq is None:
            return
        tail = seq.v[-1]
        if tail.is_full:
            count = self.draw(st.integers(1, self.bs))
            peak, new_block = 1, True
        else:
            count = self.draw(st.integers(1, tail.num_empty_slots))
            shared = self.va(GPU)._refcounter.get(tail.block_id) > 1
            peak, new_block = (1 if shared else 0), False
        tokens = self.draw(st.lists(TOKENS, min_size=count, max_size=count))
        if not self.can_take(GPU, peak, "append"):
            return
        if peak and not new_block:
            self.stats["append: copy-on-write"] += 1
        self.log(f"append({seq.name}, {tokens})" + ("  # after a new mutable block"
                                                    if new_block else ""))

        def run(alloc: Any, device: Any, blocks: List[Any]) -> None:
            if new_block:
                blocks.append(alloc.allocate_mutable_block(blocks[-1], device=device,
                                                           extra_hash=seq.extra_hash))
            blocks[-1].append_token_ids(list(tokens))

        self.both("append", lambda: run(self.v, self.vdev(GPU), seq.v),
                  lambda: run(self.o, self.odev(GPU), seq.o))
        self.log(f"  # ids {[b.block_id for b in seq.v]}")
        self.remember(seq)

    def op_extend_immutable(self) -> None:
        """Append full blocks after a full tail with allocate_immutable_blocks
        (or one allocate_immutable_block), as vLLM's BlockTable does."""
        seq = self.pick([s for s in self.gpu_seqs() if s.v[-1].is_full])
        if seq is None:
            return
        prefix = [list(b.token_ids) for b in seq.v]
        count = self.draw(st.integers(1, 2))
        blocks = [self.draw(st.lists(TOKENS, min_size=self.bs, max_size=self.bs))
                  for _ in range(count)]
        single = count == 1 and self.draw(st.booleans())
        hashes = self.hash_chain(prefix + blocks, seq.extra_hash)[len(prefix):]
        peak = sum(1 for content_hash in hashes if not self.in_use(GPU, content_hash))
        if not self.can_take(GPU, peak, "extend"):
            return
        self.log(f"extend({seq.name}, {blocks}, single={single})")

        def run(alloc: Any, device: Any, chain: List[Any]) -> None:
            if single:
                chain.append(alloc.allocate_immutable_block(
                    chain[-1], blocks[0], device=device, extra_hash=seq.extra_hash))
            else:
                chain.extend(alloc.allocate_immutable_blocks(
                    chain[-1], blocks, device=device, extra_hash=seq.extra_hash))

        self.both("extend", lambda: run(self.v, self.vdev(GPU), seq.v),
                  lambda: run(self.o, self.odev(GPU), seq.o))
        self.log(f"  # ids {[b.block_id for b in seq.v]}")
        self.remember(seq)

    def op_fork(self) -> None:
        seq = self.pick(self.gpu_seqs())
        if seq is None:
            return
        name = self.new_name()
        self.log(f"{name} = fork({seq.name})")
        vb, ob = self.both("fork", lambda: self.v.fork(seq.v[-1]), lambda: self.o.fork(seq.o[-1]))
        self.seqs.append(Seq(name, vb, ob, GPU, seq.extra_hash))

    def op_free(self) -> None:
        seq = self.pick(self.seqs)
        if seq is None:
            return
        order = list(range(len(seq.v)))
        how = self.draw(st.sampled_from(["forward", "reverse", "shuffled"]))
        if how == "reverse":
            order.reverse()
        elif how == "shuffled":
            random.Random(self.draw(st.integers(0, 1000))).shuffle(order)
        self.log(f"free({seq.name}, order={order})")

        self.remember(seq)
        self.free_seq(seq, order)

    def free_seq(self, seq: Seq, order: List[int]) -> None:
        """Free ``seq``'s blocks in ``order``.  A swapped-out sequence is freed
        through the CPU allocator with ``keep_block_object=True``: see (g)."""
        device = seq.device

        def run(wrapper: Any, alloc: Any, blocks: List[Any]) -> None:
            for index in order:
                if device == CPU:
                    alloc.free(blocks[index], keep_block_object=True)
                else:
                    wrapper.free(blocks[index])

        self.both("free", lambda: run(self.v, self.va(device), seq.v),
                  lambda: run(self.o, self.oa(device), seq.o))
        self.seqs.remove(seq)

    def _swap_peak(self, seq: Seq, dst: str) -> int:
        return sum(1 for b in seq.v if not (b.is_full and self.in_use(dst, b.content_hash)))

    def op_swap(self) -> None:
        seq = self.pick([s for s in self.seqs if s.v])
        if seq is None:
            return
        src = seq.device
        dst = CPU if src == GPU else GPU
        if not self.can_take(dst, self._swap_peak(seq, dst), "swap"):
            return
        self.log(f"swap({seq.name}, {src} -> {dst})")
        rv, ro = self.both(
            "swap",
            lambda: self.v.swap(seq.v, self.vdev(src), self.vdev(dst)),
            lambda: self.o.swap(seq.o, self.odev(src), self.odev(dst)),
        )
        self.same("swap mapping", rv, ro)
        seq.device = dst
        self.log(f"  # mapping {rv}")

    def op_mark_accessed(self) -> None:
        ids = sorted({b.block_id for s in self.gpu_seqs() for b in s.v})
        evictable = self.draw(st.integers(0, 9)) == 0
        if evictable:
            ids += sorted(self.va(GPU).evictor.free_table)
        if not ids:
            return
        chosen = self.draw(st.lists(st.sampled_from(ids), min_size=1, max_size=4))
        now = self.draw(TIMES)
        self.log(f"mark_blocks_as_accessed({chosen}, {now})")
        self.both("mark_blocks_as_accessed",
                  lambda: self.v.mark_blocks_as_accessed(chosen, now),
                  lambda: self.o.mark_blocks_as_accessed(chosen, now))

    def op_mark_computed(self) -> None:
        self.log("mark_blocks_as_computed([])")
        self.both("mark_blocks_as_computed", lambda: self.v.mark_blocks_as_computed([]),
                  lambda: self.o.mark_blocks_as_computed([]))

    def op_find_prefix(self) -> None:
        device = self.draw(st.sampled_from([GPU, GPU, CPU]))
        # Chains whose cached-and-computed blocks are not a prefix (evicted
        # parents, touched blocks): rare, and where vLLM and ours differ.
        # Half the time ask again about a list asked about before, as vLLM's
        # ComputedBlocksTracker does (ours may remember lists by identity):
        # as it was, grown in place, or changed in place.
        if self.queries and self.draw(st.booleans()):
            blocks, extra, hashes = self.queries[self.draw(st.integers(0, len(self.queries) - 1))]
            how = self.draw(st.sampled_from(["same", "same", "grow", "grow", "shrink", "replace"]))
            if how == "grow":
                blocks.append(self.draw(st.lists(TOKENS, min_size=self.bs, max_size=self.bs)))
                hashes.append(self.hash_chain(blocks, extra)[-1])
            elif how == "shrink" and hashes:
                del blocks[-1], hashes[-1]
            elif how == "replace" and hashes:
                index = self.draw(st.integers(0, len(hashes) - 1))
                blocks[index] = self.draw(st.lists(TOKENS, min_size=self.bs, max_size=self.bs))
                hashes[:] = self.hash_chain(blocks, extra)
            what = f"the same list ({how})"
        else:
            # Chains whose cached-and-computed blocks are not a prefix (evicted
            # parents, touched blocks): rare, and where vLLM and ours differ.
            odd = [(blocks, extra) for blocks, extra in self.history
                   if not self._is_prefix(self._vllm_cached(device,
                                                            self.hash_chain(blocks, extra)))]
            if odd and self.draw(st.booleans()):
                blocks, extra = odd[self.draw(st.integers(0, len(odd) - 1))]
            else:
                blocks, extra = self.draw_chain()
            blocks = [list(tokens) for tokens in blocks]
            hashes = self.hash_chain(blocks, extra)
            self.queries.append((blocks, extra, hashes))
            what = f"q{len(self.queries)}"
        self.log(f"find_cached_blocks_prefix({what}: hashes of {blocks}, extra_hash={extra}, "
                 f"{device})")
        snapshot = list(hashes)
        rv, ro = self.both(
            "find_cached_blocks_prefix",
            lambda: self.v.find_cached_blocks_prefix(list(hashes), self.vdev(device)),
            lambda: self.o.find_cached_blocks_prefix(hashes, self.odev(device)),
        )
        self.same("find_cached_blocks_prefix leaves its argument alone", snapshot, hashes)
        va, oa = self.va(device), self.oa(device)
        touched = set(va._touched_blocks) & set(va._cached_blocks.values())
        pv = self._vllm_cached(device, hashes)
        expected = [hit and va._cached_blocks[content_hash] not in touched
                    for hit, content_hash in zip(pv, hashes)]
        po = [content_hash in oa._cached_blocks
              and oa.block_is_computed(oa._cached_blocks[content_hash]) for content_hash in hashes]
        self.same("cached-and-computed per hash (vLLM minus touched ids)", expected, po)
        linear = po.index(False) if False in po else len(po)
        self.same("find_cached_blocks_prefix is the longest prefix (expected from vLLM state)",
                  hashes[:linear], ro)
        if pv != expected:
            self.stats["find_cached_blocks_prefix: touched ids involved (b)"] += 1
        elif not self._is_prefix(pv):
            self.stats["find_cached_blocks_prefix: not a prefix, vLLM bisects (f)"] += 1
        else:
            self.same("find_cached_blocks_prefix", rv, ro)
            self.stats["find_cached_blocks_prefix compared"] += 1
        self.log(f"  # {len(ro)} cached")

    def _vllm_cached(self, device: str, hashes: List[int]) -> List[bool]:
        """Per hash: vLLM caches it on an id it says is computed."""
        va = self.va(device)
        return [content_hash in va._cached_blocks
                and va.block_is_computed(va._cached_blocks[content_hash])
                for content_hash in hashes]

    @staticmethod
    def _is_prefix(flags: List[bool]) -> bool:
        return flags == sorted(flags, reverse=True)

    def op_full_blocks_touched(self) -> None:
        seq = self.pick(self.seqs)
        if seq is None:
            return
        device = self.draw(st.sampled_from([GPU, CPU]))
        repeat = self.draw(st.integers(0, len(seq.v)))  # repeated Blocks count each time
        self.log(f"get_num_full_blocks_touched({seq.name} + {seq.name}[:{repeat}], {device})")
        rv, ro = self.both(
            "get_num_full_blocks_touched",
            lambda: self.v.get_num_full_blocks_touched(seq.v + seq.v[:repeat], self.vdev(device)),
            lambda: self.o.get_num_full_blocks_touched(seq.o + seq.o[:repeat], self.odev(device)),
        )
        self.same("get_num_full_blocks_touched", rv, ro)

    def op_reset(self) -> None:
        device = self.draw(st.sampled_from([GPU, CPU, None]))
        for name in ([GPU, CPU] if device is None else [device]):
            va = self.va(name)
            if va.get_num_free_blocks() == va.get_num_total_blocks() and not self.evictor_ok(name):
                self.stats["skip: vLLM heap evictor diverged (reset)"] += 1
                return
        self.log(f"reset_prefix_cache({device})")
        rv, ro = self.both(
            "reset_prefix_cache",
            lambda: self.v.reset_prefix_cache(None if device is None else self.vdev(device)),
            lambda: self.o.reset_prefix_cache(None if device is None else self.odev(device)),
        )
        self.same("reset_prefix_cache", rv, ro)

    def op_clear_cows(self) -> None:
        self.log("clear_copy_on_writes()")
        rv, ro = self.both("clear_copy_on_writes", self.v.clear_copy_on_writes,
                           self.o.clear_copy_on_writes)
        self.same("clear_copy_on_writes", rv, ro)

    def op_hit_rate(self) -> None:
        device = self.draw(st.sampled_from([GPU, CPU]))
        self.log(f"get_prefix_cache_hit_rate({device})")
        rv, ro = self.both(
            "get_prefix_cache_hit_rate",
            lambda: self.v.get_prefix_cache_hit_rate(self.vdev(device)),
            lambda: self.o.get_prefix_cache_hit_rate(self.odev(device)),
        )
        self.same("get_prefix_cache_hit_rate", rv, ro)

    def op_common_computed(self) -> None:
        picks = self.draw(st.lists(st.integers(0, 50), max_size=3))
        lists = []
        for pick in picks:
            if self.seqs:
                seq = self.seqs[pick % len(self.seqs)]
                ids = [b.block_id for b in seq.v]
                lists.append(ids[:self.draw(st.integers(0, len(ids)))])
            else:
                lists.append([])
        self.log(f"get_common_computed_block_ids({lists})")
        vlists = [list(ids) for ids in lists]
        olists = [list(ids) for ids in lists]
        rv, ro = self.both("get_common_computed_block_ids",
                           lambda: self.v.get_common_computed_block_ids(vlists),
                           lambda: self.o.get_common_computed_block_ids(olists))
        self.same("get_common_computed_block_ids", list(rv), ro)
        if len(lists) == 1:
            self.same("get_common_computed_block_ids returns the single list itself",
                      rv is vlists[0], ro is olists[0])

    def op_physical_id(self) -> None:
        device = self.draw(st.sampled_from([GPU, CPU]))
        ids = sorted(self.va(device).all_block_ids)
        absolute = ids[self.draw(st.integers(0, len(ids) - 1))]
        rv, ro = self.both(
            "get_physical_block_id",
            lambda: self.v.get_physical_block_id(self.vdev(device), absolute),
            lambda: self.o.get_physical_block_id(self.odev(device), absolute),
        )
        self.same(f"get_physical_block_id({device}, {absolute})", rv, ro)

    def op_swaps(self) -> None:
        self.log("get_and_reset_swaps()")
        rv, ro = self.both("get_and_reset_swaps", self.v.get_and_reset_swaps,
                           self.o.get_and_reset_swaps)
        self.same("get_and_reset_swaps", rv, ro)

    OPS = (["op_new_seq"] * 5 + ["op_append"] * 5 + ["op_extend_immutable"] * 2
           + ["op_fork"] * 2 + ["op_free"] * 4 + ["op_swap"] * 2
           + ["op_mark_accessed"] * 3 + ["op_mark_computed"] * 3 + ["op_find_prefix"] * 3
           + ["op_full_blocks_touched", "op_reset", "op_clear_cows", "op_hit_rate",
              "op_common_computed", "op_physical_id", "op_swaps"])

    # state comparison ----------------------------------------------------------

    def compare_state(self) -> None:
        for device in (GPU, CPU):
            va, oa = self.va(device), self.oa(device)
            d = device
            self.same(f"{d} get_num_free_blocks", self.v.get_num_free_blocks(self.vdev(d)),
                      self.o.get_num_free_blocks(self.odev(d)))
            self.same(f"{d} get_num_total_blocks", self.v.get_num_total_blocks(self.vdev(d)),
                      self.o.get_num_total_blocks(self.odev(d)))
            self.same(f"{d} _cached_blocks (ordered)", list(va._cached_blocks.items()),
                      list(oa._cached_blocks.items()))
            self.same(f"{d} refcounts", va._refcounter._refcounts, oa._refcounter._refcounts)
            self.same(f"{d} free list (ordered)",
                      list(va._hashless_allocator._free_block_indices),
                      list(oa._hashless_allocator._free_block_indices))
            self.same(
                f"{d} evictor free_table (ordered)",
                [(k, m.content_hash, m.num_hashed_tokens, m.last_accessed)
                 for k, m in va.evictor.free_table.items()],
                [(k, m.content_hash, m.num_hashed_tokens, m.last_accessed)
                 for k, m in oa.evictor.free_table.items()],
            )
            cached_ids = set(va._cached_blocks.values())
            vtouched = set(va._touched_blocks)
            self.same(f"{d} _touched_blocks (vLLM's restricted to cached ids, (c))",
                      vtouched & cached_ids, set(oa._touched_blocks))
            for block_id, vt in va._block_tracker.items():
                ot = oa._block_tracker[block_id]
                self.same(f"{d} tracker {block_id} active", vt.active, ot.active)
                if not vt.active:
                    continue
                self.same(f"{d} tracker {block_id} last_accessed", vt.last_accessed,
                          ot.last_accessed)
                if block_id in cached_ids:
                    want = False if block_id in vtouched else vt.computed
                    self.same(f"{d} tracker {block_id} computed (touched: not yet, (b))",
                              want, ot.computed)
            vm, om = va.metric_data, oa.metric_data
            self.same(f"{d} metric_data",
                      (vm.num_completed_blocks, vm.completed_block_cache_hit_rate,
                       vm.num_incompleted_block_queries, vm.num_incompleted_block_hit),
                      (om.num_completed_blocks, om.completed_block_cache_hit_rate,
                       om.num_incompleted_block_queries, om.num_incompleted_block_hit))
        for seq in self.seqs:
            for index, (vb, ob) in enumerate(zip(seq.v, seq.o)):
                where = f"{seq.name}[{index}]"
                self.same(f"{where} block_id", vb.block_id, ob.block_id)
                self.same(f"{where} token_ids", vb.token_ids, ob.token_ids)
                self.same(f"{where} content_hash", vb.content_hash, ob.content_hash)
                self.same(f"{where} computed", vb.computed, ob.computed)
                self.same(f"{where} num_tokens_total", vb.num_tokens_total, ob.num_tokens_total)
                self.same(f"{where} prev_block is the chain's previous block",
                          vb.prev_block is (seq.v[index - 1] if index else None),
                          ob.prev_block is (seq.o[index - 1] if index else None))

    def run(self, steps: int) -> None:
        for _ in range(steps):
            getattr(self, self.draw(st.sampled_from(self.OPS)))()
            self.compare_state()
        # Drain: free everything, compare, then every id must be free again.
        for seq in list(self.seqs):
            self.log(f"free({seq.name})")
            self.free_seq(seq, list(range(len(seq.v))))
            self.compare_state()
        self.op_clear_cows()
        self.op_swaps()


_EXAMPLES = int(os.environ.get("PREFIXCACHE_DIFF_EXAMPLES", "0"))


@settings(
    max_examples=_EXAMPLES or 200,
    deadline=None,
    derandomize=not _EXAMPLES,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_prefix_caching_matches_vllm(vllm: Any, data: Any) -> None:
    num_gpu = data.draw(st.integers(2, 8), label="num_gpu_blocks")
    num_cpu = data.draw(st.integers(1, 4), label="num_cpu_blocks")
    block_size = data.draw(st.integers(1, 4), label="block_size")
    harness = Harness(vllm, data, num_gpu, num_cpu, block_size)
    harness.run(data.draw(st.integers(5, 60), label="steps"))


# -- the documented vLLM evictor bugs (e), pinned ----------------------------------------

def _evictor_bug_1a(mod: Any) -> Any:
    alloc = mod.PrefixCachingBlockAllocator(num_blocks=1, block_size=1)
    alloc.free(alloc.allocate_immutable_block(None, [0]))
    alloc.mark_blocks_as_accessed([0], 1)
    free = alloc.get_num_free_blocks()
    try:
        return free, alloc.allocate_mutable_block(None).block_id
    except ValueError as exc:
        return free, f"ValueError: {exc}"


def _evictor_bug_1b(mod: Any) -> Any:
    alloc = mod.PrefixCachingBlockAllocator(num_blocks=2, block_size=1)
    a = alloc.allocate_immutable_block(None, [0])
    b = alloc.allocate_immutable_block(None, [1])
    alloc.mark_blocks_as_accessed([1], 3)
    alloc.free(a)
    alloc.free(b)
    alloc.mark_blocks_as_accessed([0], 1)
    return alloc.allocate_mutable_block(None).block_id


def _evictor_bug_2(mod: Any) -> Any:
    alloc = mod.PrefixCachingBlockAllocator(num_blocks=3, block_size=1)
    for _ in range(2):
        for block in alloc.allocate_immutable_blocks(None, [[0], [1]]):
            alloc.free(block)
    alloc.allocate_mutable_block(None)
    m2 = alloc.allocate_mutable_block(None)
    m2.append_token_ids([7])
    alloc.free(m2)
    try:
        return alloc.allocate_mutable_block(None).block_id
    except (AssertionError, KeyError):  # KeyError under python -O (no assert)
        return "crash"


def test_vllm_evictor_bugs_are_fixed(vllm: Any) -> None:
    """The examples of (e) in the module docstring: vLLM 0.8.5 goes wrong,
    ours evicts the documented victim.  (Checked without ``assert`` so that
    it still checks under ``python -O``.)"""
    from prefixcache.impl import prefix_caching_block as ours

    theirs = vllm.prefix_caching_block
    for example, fn, want_vllm, want_ours in (
        ("1a", _evictor_bug_1a, (1, "ValueError: No usable cache memory left"), (1, 0)),
        ("1b", _evictor_bug_1b, 1, 0),
        ("2", _evictor_bug_2, "crash", 0),
    ):
        got = (fn(theirs), fn(ours))
        if got != (want_vllm, want_ours):
            raise Divergence(f"example {example}: (vLLM, ours) = {got}, "
                             f"expected {(want_vllm, want_ours)}")
