"""The v1 fault corpus: single-fault variants of vLLM 0.34.0's real
``BlockPool``, made by run-time edits of its source (never committed), and
whether the v1 oracle catches each.

Each variant plants one fault of the kinds in vLLM's history (lost
decrements, the wrong end of the free queue, stale map entries, a duplicate
lookup that returns the wrong id, the null block freed, an inflated free
count, ...) into ``vllm/v1/core/block_pool.py`` or ``kv_cache_utils.py`` of
the pinned wheel (:func:`prefixcache.oracle.vllm_v1_source.load_v1` with
``edits``).  The oracle (``prefixcache fuzz --api v1 --no-mistakes``: valid
calls only, white-box) runs on each for at most ``--seconds`` (30), stopping
at its first finding; it also runs on the unmodified pool, where it must find
nothing.  ``--write`` puts the table into bench/V1_FINDINGS.md between its
markers.

    python bench/v1_corpus.py [--seconds 30] [--only NAME ...] [--write]

Exit code 0 when every variant is caught and the unmodified pool is clean.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from prefixcache.oracle.profiles import profile_settings
from prefixcache.oracle.search import Budget, SearchOptions, search
from prefixcache.oracle.trace import render
from prefixcache.oracle.v1_targets import resolve_v1_target
from prefixcache.oracle.vllm_source import Edits
from prefixcache.oracle.vllm_v1_source import load_v1

POOL = "v1/core/block_pool.py"
UTILS = "v1/core/kv_cache_utils.py"
FINDINGS_MD = Path(__file__).resolve().parent / "V1_FINDINGS.md"
BEGIN, END = "<!-- corpus table: begin -->", "<!-- corpus table: end -->"


@dataclass(frozen=True)
class Variant:
    """One planted fault: its name, what it does, and the edits that make it."""

    name: str
    fault: str
    edits: Tuple[Tuple[str, str, str], ...]  # (file, old, new)

    def as_edits(self) -> Edits:
        out: Dict[str, List[Tuple[str, str]]] = {}
        for path, old, new in self.edits:
            out.setdefault(path, []).append((old, new))
        return out


VARIANTS: Tuple[Variant, ...] = (
    Variant("free-lost-decrement", "free_blocks loses the decrement of a shared block",
            ((POOL, "            block.ref_cnt -= 1\n            if block.ref_cnt == 0:\n"
              "                if block.block_hash is None",
              "            block.ref_cnt -= 1 if block.ref_cnt == 1 else 0\n"
              "            if block.ref_cnt == 0:\n                if block.block_hash is None"),)),
    Variant("touch-lost-increment", "touch forgets the new reference",
            ((POOL, "            block.ref_cnt += 1\n            if self.metrics_collector:\n"
              "                self.metrics_collector.on_block_accessed(block)",
              "            pass\n            if self.metrics_collector:\n"
              "                self.metrics_collector.on_block_accessed(block)"),)),
    Variant("touch-keeps-queued", "touch of a free cached block leaves it in the free queue",
            ((POOL, "                self.free_block_queue.remove(block)\n",
              "                pass\n"),)),
    Variant("cached-freed-to-front", "freed cached blocks join the front of the queue "
            "(the wrong end: evicted first)",
            ((POOL, "self.free_block_queue.append_n(blocks_to_evict_last)",
              "self.free_block_queue.prepend_n(blocks_to_evict_last)"),)),
    Variant("uncached-freed-to-back", "freed uncached blocks join the back of the queue",
            ((POOL, "self.free_block_queue.prepend_n(blocks_to_evict_first)",
              "self.free_block_queue.append_n(blocks_to_evict_first)"),)),
    Variant("free-order-reversed", "cached blocks are queued in the reverse of the order "
            "given", ((POOL, "self.free_block_queue.append_n(blocks_to_evict_last)",
                       "self.free_block_queue.append_n(blocks_to_evict_last[::-1])"),)),
    Variant("evict-first-ignored", "free_blocks ignores evict_first",
            ((POOL, "if block.block_hash is None or not self.enable_caching or evict_first:",
              "if block.block_hash is None or not self.enable_caching:"),)),
    Variant("new-from-the-back", "get_new_blocks takes ids from the back of the free queue",
            ((POOL, "ret: list[KVCacheBlock] = self.free_block_queue.popleft_n(num_blocks)",
              "ret: list[KVCacheBlock] = self.free_block_queue.get_all_free_blocks()"
              "[::-1][:num_blocks]\n        for b in ret:\n"
              "            self.free_block_queue.remove(b)"),)),
    Variant("null-block-freed", "touch counts the null block's references again (as "
            "before 0.33.0) and free_blocks does not skip it",
            ((POOL, "            if block.is_null:\n                continue\n"
              "            # ref_cnt=0 means this block is in the free list (i.e. eviction\n"
              "            # candidate), so remove it.\n            if block.ref_cnt == 0:\n",
              "            # ref_cnt=0 means this block is in the free list (i.e. eviction\n"
              "            # candidate), so remove it.\n"
              "            if block.ref_cnt == 0 and not block.is_null:\n"),
             (POOL, "            if block.is_null:  # never pooled; its ref_cnt is not "
              "maintained\n                continue\n", ""))),
    Variant("duplicate-promotes-nothing", "removing the first of duplicate ids leaves the "
            "lookup on it (a stale map entry)",
            ((POOL, "self._cache[key] = next(iter(dup_ids))", "pass"),)),
    Variant("duplicate-lookup-last", "a duplicate takes over the lookup (it returns the "
            "last id cached, not the first)",
            ((POOL, "self._dup_ids.setdefault(key, {block_id: None})[block.block_id] = None",
              "self._dup_ids.setdefault(key, {block_id: None})[block.block_id] = None\n"
              "            self._cache[key] = block.block_id"),)),
    Variant("eviction-keeps-hash", "an evicted block keeps its block_hash (a stale hash)",
            ((POOL, "                removed_hashes.append(block_hash)\n"
              "        block.reset_hash()\n",
              "                removed_hashes.append(block_hash)\n"),)),
    Variant("reuse-keeps-map-entry", "get_new_blocks forgets a reused block's hash but "
            "leaves its map entry (a stale entry)",
            ((POOL, "                    if block.block_hash is not None:\n"
              "                        self._maybe_evict_cached_block(block)",
              "                    if block.block_hash is not None:\n"
              "                        block.reset_hash()"),)),
    Variant("recache-keeps-old-key", "caching a block over more tokens leaves its old key "
            "in the map", ((POOL, "                removed_hashes = "
                            "self._remove_cached_block_hashes(blk)",
                            "                removed_hashes = []\n"
                            "                blk.reset_hash()"),)),
    Variant("group-ignored", "cache_full_blocks files every block under group 0",
            ((POOL, 'group_suffix = make_block_hash_with_group_id(BlockHash(b""), '
              'kv_cache_group_id)',
              'group_suffix = make_block_hash_with_group_id(BlockHash(b""), 0)'),)),
    Variant("cache-skips-first", "cache_full_blocks skips the first new full block",
            ((POOL, "new_full_blocks = blocks[num_cached_blocks:num_full_blocks]",
              "new_full_blocks = [b if k else blocks[0] for k, b in enumerate("
              "blocks[num_cached_blocks:num_full_blocks])]"),)),
    Variant("free-count-inflated", "append_n counts one free block too many for two or more",
            ((UTILS, "        tail.prev_free_block = last_block\n\n"
              "        self.num_free_blocks += len(blocks)",
              "        tail.prev_free_block = last_block\n\n"
              "        self.num_free_blocks += len(blocks) + (len(blocks) > 1)"),)),
    Variant("popleft-n-lost-decrement", "popleft_n counts one block too few when taking "
            "two or more", ((UTILS, "        self.num_free_blocks -= n",
                             "        self.num_free_blocks -= n - (n > 1)"),)),
    Variant("remove-breaks-back-link", "remove leaves the next block's back link on the "
            "removed block", ((UTILS, "        next_block.prev_free_block = prev_block", ""),)),
    Variant("reset-while-in-use", "reset_prefix_cache resets with one block still in use",
            ((POOL, "if num_used_blocks != 1:", "if num_used_blocks > 2:"),)),
    Variant("usage-counts-null", "get_usage divides by every id, the null block included",
            ((POOL, "total_gpu_blocks = self.num_gpu_blocks - 1",
              "total_gpu_blocks = self.num_gpu_blocks"),)),
)


@dataclass
class Verdict:
    """What the oracle made of one pool: the finding (or None), its program,
    the seconds until it stopped."""

    name: str
    fault: str
    signature: Optional[str]
    program: str
    seconds: float
    steps: int


def judge(name: str, fault: str, edits: Optional[Edits], seconds: float, seed: int = 0,
          mistakes: bool = False) -> Verdict:
    """Run the v1 oracle on vLLM 0.34.0's pool with ``edits`` for at most
    ``seconds``, stopping at the first finding."""
    target = resolve_v1_target(load_v1(edits=edits).BlockPool)
    began = time.monotonic()
    outcome = search(target, Budget(seconds=seconds, max_findings=1),
                     SearchOptions(mistakes=mistakes, seed=seed, call_timeout=10.0,
                                   base=profile_settings("dev")))
    found = outcome.findings.in_order()
    trace = found[0].violation.trace if found else None
    return Verdict(name, fault, found[0].signature if found else None,
                   render(trace) if trace is not None else "", time.monotonic() - began,
                   outcome.stats.steps)


def table(verdicts: Sequence[Verdict], clean: Verdict, seconds: float) -> str:
    """The corpus table in Markdown."""
    caught = sum(v.signature is not None for v in verdicts)
    lines = [f"{caught} of {len(verdicts)} variants caught, each within {seconds:g} s "
             "(`--no-mistakes`, white-box, seed 0, stopped at the first finding); the "
             f"unmodified pool: {'no finding' if clean.signature is None else clean.signature}"
             f" in {clean.seconds:.0f} s ({clean.steps} steps).", "",
             "| variant | planted fault | caught as | seconds | steps |",
             "|---|---|---|---:|---:|"]
    for v in verdicts:
        lines.append(f"| `{v.name}` | {v.fault} | "
                     f"{'`' + v.signature + '`' if v.signature else '**not caught**'} | "
                     f"{v.seconds:.1f} | {v.steps} |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Judge every variant (or ``--only`` those) and the unmodified pool."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--clean-seconds", type=float, default=None,
                        help="budget for the unmodified pool (default: --seconds)")
    parser.add_argument("--only", nargs="*", default=None, metavar="NAME")
    parser.add_argument("--write", action="store_true", help="update bench/V1_FINDINGS.md")
    args = parser.parse_args(argv)
    if not args.seconds > 0:
        parser.error("--seconds must be > 0")
    names = {v.name for v in VARIANTS}
    unknown = sorted(set(args.only or ()) - names)
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {sorted(names)}")
    chosen = [v for v in VARIANTS if args.only is None or v.name in args.only]
    verdicts = []
    for variant in chosen:
        verdict = judge(variant.name, variant.fault, variant.as_edits(), args.seconds)
        verdicts.append(verdict)
        print(f"{variant.name:28s} {verdict.signature or 'NOT CAUGHT'}  "
              f"({verdict.seconds:.1f} s, {verdict.steps} steps)", flush=True)
    clean = judge("unmodified", "none", None, args.clean_seconds or args.seconds)
    print(f"{'unmodified':28s} {clean.signature or 'no finding'}  ({clean.seconds:.1f} s, "
          f"{clean.steps} steps)")
    if clean.signature:
        print(clean.program)
    text = table(verdicts, clean, args.seconds)
    if args.write:
        doc = FINDINGS_MD.read_text()  # the table between the corpus markers
        start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
        FINDINGS_MD.write_text(doc[:start] + "\n" + text + "\n" + doc[end:])
    ok = clean.signature is None and all(v.signature for v in verdicts)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
