"""vLLM 0.8.5's block allocators with only their latent faults repaired (issue #20).

    python bench/vllm_repaired.py --tree     # build the repaired tree, print its path
    python bench/vllm_repaired.py --list     # the repairs, one a line
    prefixcache fuzz --target prefixcache.bench.vllm_repaired:PrefixCachingBlockAllocator \\
        --semantics vllm-0.8.5 --no-mistakes --seconds 30

The oracle, judging real vLLM 0.8.5 by vLLM's own semantics (``--semantics
vllm-0.8.5``) on valid calls only, finds faults: a lazy evictor heap that loses
or misorders entries, a bisecting prefix search that trusts an assumption the
evictor breaks, calls that fail half-way and leak, and so on.  This module names
one repair per fault (:data:`REPAIRS`): a few (old, new) text edits of one file
of the vllm package, applied at run time by
:func:`prefixcache.oracle.vllm_source.source_tree` to the released code (no vLLM
file is kept in this repository; each ``old`` is a line or two of it, each
``new`` is written here).  Every repair keeps vLLM 0.8.5's observable behaviour
on every valid call sequence on which vLLM is right (the same ids, the same
eviction order, the same results, the same hit-rate metric, a refused call's
queries included): what changes is only what vLLM gets wrong.  So the repaired
allocators must pass vLLM's own 910 block tests and a clean campaign of the
oracle under ``--semantics vllm-0.8.5 --no-mistakes``; bench/VLLM_REPAIRS.md
lists the repairs and the runs, tests/test_vllm_repaired.py shows each fault on
the original and its absence here.

The module is also a target of ``prefixcache fuzz``:
``prefixcache.bench.vllm_repaired:Class`` (or ``vllm_repaired:Class`` with
bench/ on ``PYTHONPATH``) is the repaired ``PrefixCachingBlockAllocator``,
``CpuGpuBlockAllocator`` or ``NaiveBlockAllocator``, loaded on first use
(:func:`load_repaired`).
"""

from __future__ import annotations

import argparse
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from prefixcache.oracle import vllm_source

VERSION = "0.8.5"

EVICTOR = "core/evictor.py"
COMMON = "core/block/common.py"
NAIVE = "core/block/naive_block.py"
PREFIX = "core/block/prefix_caching_block.py"
CPU_GPU = "core/block/cpu_gpu_block_allocator.py"


@dataclass(frozen=True)
class Repair:
    """One latent fault of vLLM 0.8.5 and its repair: ``edits`` are (old, new)
    text edits of ``path`` (inside the vllm package), applied in order, each
    ``old`` occurring exactly once in the file at its turn; ``why`` says in one
    line what vLLM gets wrong and why the repair keeps its behaviour otherwise."""

    name: str
    path: str
    edits: Tuple[vllm_source.Edit, ...]
    why: str


#: Methods added to PrefixCachingBlockAllocator: what a call would take, known before
#: it takes anything (for allocate_immutable_blocks and swap_in).
_PLAN_METHODS = '''\
    def _chain_hashes(self, prev_block: Optional[Block],
                      block_token_ids: List[List[int]],
                      extra_hash: Optional[int]) -> List[Optional[int]]:
        # prefixcache repair: the content hash of each block that
        # allocate_immutable_blocks would make, computed as the blocks do;
        # AssertionError (as vLLM's own check), before anything changes,
        # for a block that could have none.
        hashes: List[Optional[int]] = []
        prev_hash = None if prev_block is None else prev_block.content_hash
        is_first = prev_block is None
        for tokens in block_token_ids:
            if len(tokens) != self._block_size or (
                    not is_first and prev_hash in (None, self._none_hash)):
                raise AssertionError(
                    "an immutable block must be full, after blocks that are")
            prev_hash = PrefixCachingBlock.hash_block_tokens(
                is_first, prev_hash, tokens, extra_hash)
            hashes.append(prev_hash)
            is_first = False
        return hashes

    def _check_fits(self, hashes: List[Optional[int]]) -> None:
        # prefixcache repair: NoFreeBlocksError unless every request can be
        # served one after another (a content hash: a cache lookup, a
        # fresh id on a miss; None: a fresh id), as the allocator would
        # serve them: free ids first, then evictions in the evictor's order
        # (which may take an entry a later request would have hit).  On a
        # refusal nothing changes but the hit-rate metric, which counts the
        # lookups vLLM makes before it finds no id, the refused one too.
        free = self._hashless_allocator.get_num_free_blocks()
        if len(hashes) <= free:
            return
        table = self.evictor.free_table
        order = sorted(table, key=lambda i: (
            table[i].last_accessed, -table[i].num_hashed_tokens, i,
            table[i].content_hash))
        next_victim = 0
        restored: Set[BlockId] = set()
        gone: Set[PrefixHash] = set()
        new: Set[PrefixHash] = set()
        queries: List[bool] = []
        for content_hash in hashes:
            if content_hash is not None:
                hit = content_hash in new or (content_hash in self._cached_blocks
                                              and content_hash not in gone)
                queries.append(hit)
                if hit:
                    block_id = self._cached_blocks.get(content_hash)
                    if block_id in table:
                        restored.add(block_id)
                    continue
                new.add(content_hash)
            if free > 0:
                free -= 1
                continue
            while next_victim < len(order) and order[next_victim] in restored:
                next_victim += 1
            if next_victim == len(order):
                for hit in queries:
                    self.metric_data.query(hit=hit)
                raise BlockAllocator.NoFreeBlocksError()
            gone.add(table[order[next_victim]].content_hash)
            next_victim += 1

    def _check_swap_in(self, blocks: List[Block]) -> None:
        # prefixcache repair: NoFreeBlocksError, with nothing changed but the
        # metric (see _check_fits), unless swap_in(blocks) can serve them all
        self._check_fits([block.content_hash for block in blocks])

'''

REPAIRS: List[Repair] = [
    # -- core/evictor.py ------------------------------------------------------------------
    Repair(
        "evictor-exact-order", EVICTOR,
        (
            ("            last_accessed, _, block_id, content_hash = heapq.heappop(",
             "            last_accessed, neg_tokens, block_id, content_hash = heapq.heappop("),
            ("                    self.free_table[block_id].last_accessed == last_accessed):",
             "                    self.free_table[block_id].last_accessed == last_accessed\n"
             "                    # prefixcache repair: an entry is live only if it is the\n"
             "                    # block's current one, all fields alike (a stale entry of an\n"
             "                    # id removed and added again may share its timestamp)\n"
             "                    and self.free_table[block_id].num_hashed_tokens\n"
             "                    == -neg_tokens and\n"
             "                    self.free_table[block_id].content_hash == content_hash):"),
            ("        self.free_table[block_id].last_accessed = last_accessed",
             "        self.free_table[block_id].last_accessed = last_accessed\n"
             "        # prefixcache repair: the block's entry under its new timestamp (the\n"
             "        # old one is stale now and is skipped by evict())\n"
             "        meta = self.free_table[block_id]\n"
             "        heapq.heappush(self.priority_queue,\n"
             "                       (last_accessed, -meta.num_hashed_tokens, block_id,\n"
             "                        meta.content_hash))\n"
             "        self._cleanup_if_necessary()"),
        ),
        "update() pushed no heap entry and evict() took a stale entry by its timestamp alone, so "
        "an evictable id dropped out of the heap (evict() raised with num_blocks > 0) or the "
        "wrong id went first; now every live entry has a heap entry and only an exact one is "
        "popped, which is the documented order whenever vLLM's heap was right",
    ),

    # -- core/block/common.py ---------------------------------------------------------------
    Repair(
        "fork-iterative", COMMON,
        (
            ("        if block.prev_block is not None:\n"
             "            recurse(block.prev_block, lst)",
             "        # prefixcache repair: the earlier blocks by a loop, not one Python\n"
             "        # frame per block (a chain longer than the recursion limit forks)\n"
             "        earlier: List[Block] = []\n"
             "        walk = block.prev_block\n"
             "        while walk is not None:\n"
             "            earlier.append(walk)\n"
             "            walk = walk.prev_block\n"
             "        lst.extend(reversed(earlier))"),
        ),
        "get_all_blocks_recursively (fork's walk of the chain) recursed once per block, so fork "
        "of a chain longer than the recursion limit raised RecursionError; a loop gives the same "
        "list",
    ),
    Repair(
        "pool-home", COMMON,
        (
            ("            allocator=block._allocator,  # type: ignore[attr-defined] ",
             "            # prefixcache repair: the pool's own allocator (a swapped Block is\n"
             "            # re-pointed to the allocator that holds it, not to this pool's)\n"
             "            allocator=self._allocator,"),
            ("        block.pool_id = pool_id  # type: ignore[attr-defined]",
             "        block.pool_id = pool_id  # type: ignore[attr-defined]\n"
             "        block.home_pool = self"),
            ("        self._free_ids.appendleft(block.pool_id)  # type: ignore[attr-defined]",
             "        # prefixcache repair: back to the pool the object came from, whichever\n"
             "        # allocator frees it (a Block swapped to the other device)\n"
             "        home = getattr(block, 'home_pool', self)\n"
             "        home._free_ids.appendleft(block.pool_id)  # type: ignore[attr-defined]"),
        ),
        "a Block freed by the allocator of the other device (after a swap) was put into that "
        "allocator's pool under its own pool's index (IndexError or an unrelated object reused "
        "later); it now goes back to the pool it came from, which is where it went whenever "
        "vLLM was right",
    ),

    # -- core/block/naive_block.py ----------------------------------------------------------
    Repair(
        "naive-all-or-nothing", NAIVE,
        (
            ("        block_ids = []\n",
             "        if num_blocks > len(self._free_block_indices):\n"
             "            # prefixcache repair: refuse before taking any id\n"
             "            raise BlockAllocator.NoFreeBlocksError()\n"
             "        block_ids = []\n"),
            ("    def swap_in(self, blocks: List[Block]) -> None:\n",
             "    def _check_swap_in(self, blocks: List[Block]) -> None:\n"
             "        # prefixcache repair: NoFreeBlocksError, with nothing changed, unless\n"
             "        # swap_in(blocks) can give every block an id\n"
             "        if len(blocks) > len(self._free_block_indices):\n"
             "            raise BlockAllocator.NoFreeBlocksError()\n"
             "\n"
             "    def swap_in(self, blocks: List[Block]) -> None:\n"
             "        self._check_swap_in(blocks)\n"),
        ),
        "allocate_immutable_blocks and swap_in that ran out half-way kept the ids taken so far "
        "(and swap_in left the first blocks attached); both now refuse before taking any, with "
        "the same NoFreeBlocksError",
    ),
    Repair(
        "naive-cow-atomic", NAIVE,
        (
            ("        self._free_block_id(block)\n"
             "        trg_block_id = self._allocate_block_id()",
             "        # prefixcache repair: the new id first, so that a refusal leaves the\n"
             "        # block attached (the shared source id cannot be the one handed out)\n"
             "        trg_block_id = self._allocate_block_id()\n"
             "        self._free_block_id(block)"),
            ("            self._block_id = (self._allocator.cow_block_if_not_appendable(\n"
             "                self._cow_target))",
             "            try:\n"
             "                self._block_id = (\n"
             "                    self._allocator.cow_block_if_not_appendable(\n"
             "                        self._cow_target))\n"
             "            except BaseException:\n"
             "                # prefixcache repair: a refused copy-on-write appends nothing\n"
             "                del self._token_ids[len(self._token_ids) - len(token_ids):]\n"
             "                raise"),
        ),
        "a copy-on-write that found no free id had already released the shared id (the Block "
        "was left detached) and the append had already added its tokens; now the new id is "
        "taken first and a refused append is undone, and a successful one is unchanged",
    ),
    Repair(
        "naive-swap-repoints", NAIVE,
        (
            ("            block.block_id = block_id  # Assign block_id",
             "            block.block_id = block_id  # Assign block_id\n"
             "            # prefixcache repair: the Block now belongs to this allocator\n"
             "            block._allocator = self"),
        ),
        "a Block swapped in kept pointing at the allocator it came from, so its next "
        "copy-on-write asked the other device's allocator about this one's id",
    ),

    # -- core/block/prefix_caching_block.py ---------------------------------------------------
    Repair(
        "prefix-all-or-nothing", PREFIX,
        (
            ("    def _incr_refcount_cached_block(self, block: Block) -> None:\n",
             _PLAN_METHODS
             + "    def _incr_refcount_cached_block(self, block: Block) -> None:\n"),
            ("        for token_ids in block_token_ids:\n",
             "        # prefixcache repair: all of them or none\n"
             "        self._check_fits(\n"
             "            self._chain_hashes(prev_block, block_token_ids, extra_hash))\n"
             "        for token_ids in block_token_ids:\n"),
            ("            blocks: List of blocks to be swapped in.\n"
             '        """\n',
             "            blocks: List of blocks to be swapped in.\n"
             '        """\n'
             "        # prefixcache repair: all of them or none\n"
             "        self._check_swap_in(blocks)\n"),
        ),
        "allocate_immutable_blocks and swap_in that ran out half-way kept the ids (hits and "
        "misses) taken so far; both now work out first, by the same rules, whether every block "
        "gets an id, and refuse before taking any, counting in the hit-rate metric exactly the "
        "lookups vLLM counts",
    ),
    Repair(
        "prefix-cow-atomic", PREFIX,
        (
            ("        self._free_block_id(block)\n"
             "        trg_block_id = self._allocate_block_id()",
             "        # prefixcache repair: the new id first, so that a refusal leaves the\n"
             "        # block attached (the shared source id cannot be the one handed out,\n"
             "        # nor become evictable, so the same id is taken)\n"
             "        trg_block_id = self._allocate_block_id()\n"
             "        self._free_block_id(block)"),
        ),
        "a copy-on-write that found no free id had already released the shared id, leaving the "
        "Block detached; taking the new id first changes nothing else, since the released id "
        "stays in use",
    ),
    Repair(
        "prefix-linear-scan", PREFIX,
        (
            ("        # Look for the first block that's not cached, and returns the prefix\n",
             "        def _first_index(a, x, key: Callable[[PrefixHash], bool]) -> int:\n"
             "            # prefixcache repair: the first element whose key is x, by a\n"
             "            # linear scan (the evictor can take an earlier block of a chain\n"
             "            # before a later one, so the keys need not be sorted)\n"
             "            for index, element in enumerate(a):\n"
             "                if key(element) == x:\n"
             "                    return index\n"
             "            return len(a)\n"
             "\n"
             "        # Look for the first block that's not cached, and returns the prefix\n"),
            ("        idx = _bisect_left(block_hashes,",
             "        idx = _first_index(block_hashes,"),
        ),
        "find_cached_blocks_prefix bisected on 'cached and computed', which is not monotone once "
        "the evictor took an earlier block of a chain before a later one; a linear scan returns "
        "the longest such prefix, the bisection's answer whenever it was right",
    ),
    Repair(
        "common-ids-list", PREFIX,
        (
            ("        if len(computed_seq_block_ids) == 1:\n",
             "        if len(computed_seq_block_ids) != 1 and not any(computed_seq_block_ids):\n"
             "            # prefixcache repair: commonprefix of no list is '', not a list\n"
             "            return []\n"
             "        if len(computed_seq_block_ids) == 1:\n"),
        ),
        "get_common_computed_block_ids returned os.path.commonprefix([]) == '' when no list or "
        "only empty lists were given; it now returns [] there and is unchanged elsewhere",
    ),
    Repair(
        "no-hash-after-unhashed", PREFIX,
        (
            ("        if prev_block_hash == self._none_hash and not is_first_block:",
             "        # prefixcache repair: nor when the previous block has no hash at all\n"
             "        # (it is not full), else this block would be hashed with None as its\n"
             "        # parent and shared with any other block after an unhashed one\n"
             "        if not is_first_block and prev_block_hash in (None, self._none_hash):"),
            ("            if block.is_full:\n",
             "            # prefixcache repair: a full block without a hash comes back mutable\n"
             "            if block.content_hash is not None:\n"),
            ("            if block.is_full and (not self.is_block_cached(block) or \\\n",
             "            if block.is_full and (block.content_hash is None or \\\n"
             "                                  not self.is_block_cached(block) or \\\n"),
        ),
        "a full block after a non-full block was hashed with a None parent hash, so it shared its "
        "id with the same tokens after any other non-full block; it now has no hash (swap_in and "
        "get_num_full_blocks_touched treat it as the mutable block it is)",
    ),
    Repair(
        "hash-iterative", PREFIX,
        (
            ("        is_first_block = self._prev_block is None\n",
             "        # prefixcache repair: hash the earlier unhashed blocks first, oldest\n"
             "        # first, so that a long chain (a fork's) is not walked by one Python\n"
             "        # frame per block\n"
             "        pending = []\n"
             "        earlier = self._prev_block\n"
             "        while (type(earlier) is PrefixCachingBlock and earlier.is_full\n"
             "               and earlier._cached_content_hash is None):\n"
             "            pending.append(earlier)\n"
             "            earlier = earlier._prev_block\n"
             "        for earlier in reversed(pending):\n"
             "            earlier.content_hash  # computes and caches it\n"
             "\n"
             "        is_first_block = self._prev_block is None\n"),
        ),
        "a block's content hash asked its previous block's, recursively, so the hash of the last "
        "block of a long chain of not yet hashed blocks (a fork's) raised RecursionError; the "
        "earlier hashes are now computed first, the same values",
    ),
    Repair(
        "touched-not-stale", PREFIX,
        (
            ("        self._cached_blocks.pop(content_hash_to_evict)\n",
             "        self._cached_blocks.pop(content_hash_to_evict)\n"
             "        # prefixcache repair: it no longer holds what was promoted\n"
             "        self._touched_blocks.discard(block_id)\n"),
            ("        assert not self._cached_blocks\n",
             "        assert not self._cached_blocks\n"
             "        # prefixcache repair: nothing is promoted any more\n"
             "        self._touched_blocks.clear()\n"),
        ),
        "an evicted id stayed in _touched_blocks (and reset_prefix_cache kept them all), so the "
        "next mark_blocks_as_computed marked whatever reused the id computed, even a block "
        "promoted after it; an id that still holds its content is treated as before",
    ),
    Repair(
        "prefix-swap-repoints", PREFIX,
        (
            ("            block.block_id = block_id  # Assign block_id\n",
             "            block.block_id = block_id  # Assign block_id\n"
             "            # prefixcache repair: the Block now belongs to this allocator\n"
             "            block._allocator = self\n"
             "            block._block._allocator = self\n"),
        ),
        "a Block swapped in kept pointing at the allocator it came from, so its next append "
        "(copy-on-write, promotion) asked the other device's allocator about this one's id "
        "(an assert, or under -O the wrong refcount)",
    ),

    # -- core/block/cpu_gpu_block_allocator.py -------------------------------------------------
    Repair(
        "device-swap-all-or-nothing", CPU_GPU,
        (
            ("        self._allocators[src_device].swap_out(blocks)\n",
             "        # prefixcache repair: refuse before any block leaves the source\n"
             "        check = getattr(self._allocators[dst_device], '_check_swap_in', None)\n"
             "        if check is not None and src_device != dst_device:\n"
             "            check(blocks)\n"
             "        self._allocators[src_device].swap_out(blocks)\n"),
        ),
        "a swap whose destination could not fit the blocks had already freed them on the source "
        "(and left them detached or half moved); the destination is now asked first and the "
        "swap refused with nothing moved",
    ),
]
"""Every repair, in the order their edits are applied (per file)."""


def merged_edits(repairs: Sequence[Repair]) -> Dict[str, Tuple[vllm_source.Edit, ...]]:
    """The edits of ``repairs`` by path, each path's in the repairs' order (what
    :func:`vllm_source.source_tree` takes).  Pure."""
    merged: Dict[str, List[vllm_source.Edit]] = {}
    for repair in repairs:
        merged.setdefault(repair.path, []).extend(repair.edits)
    return {path: tuple(edits) for path, edits in merged.items()}


#: All repairs merged by path, in order.
EDITS: vllm_source.Edits = merged_edits(REPAIRS)


def repaired_tree() -> Path:
    """The directory ``D`` whose ``D/vllm`` is vLLM 0.8.5's block code with
    every repair applied (built once in vllm_source's cache, then reused).
    Raises VllmSourceError when vLLM cannot be had or an edit does not apply."""
    return vllm_source.source_tree(VERSION, edits=EDITS)


def load_repaired() -> types.SimpleNamespace:
    """The repaired modules, imported into this process under a private
    package name (see :func:`vllm_source.load`; memoised)."""
    return vllm_source.load(VERSION, edits=EDITS)


#: The names this module exposes lazily: class name -> its module in load_repaired().
EXPORTS = {
    "PrefixCachingBlockAllocator": "prefix_caching_block",
    "CpuGpuBlockAllocator": "cpu_gpu_block_allocator",
    "NaiveBlockAllocator": "naive_block",
}


def __getattr__(name: str) -> Any:
    """``vllm_repaired.PrefixCachingBlockAllocator`` and the others of
    :data:`EXPORTS`: the repaired class (loading the repaired tree on first use)."""
    module = EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(getattr(load_repaired(), module), name)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line: ``--tree`` builds the repaired tree and prints its
    path, ``--list`` prints the repairs.  Returns 0, or 1 after one line on
    stderr when vLLM cannot be had or a repair does not apply."""
    parser = argparse.ArgumentParser(
        prog="python bench/vllm_repaired.py",
        description="vLLM 0.8.5's block allocators with their latent faults repaired.")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--tree", action="store_true",
                       help="build the repaired source tree and print its path")
    group.add_argument("--list", action="store_true", help="list the repairs")
    args = parser.parse_args(argv)
    if args.list:
        width = max(len(repair.name) for repair in REPAIRS)
        for repair in REPAIRS:
            print(f"{repair.name:<{width}}  vllm/{repair.path}  {len(repair.edits)} edit(s)")
            print(f"{'':<{width}}  {repair.why}")
        return 0
    try:
        print(repaired_tree())
    except vllm_source.VllmSourceError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
