"""The oracle's conformance tests that judge each mutant of impl/
(bench/mutation.py, issue #7), in two stages.

One conformance test per allocator of impl/ (prefix-caching, the same with
``verify_content=True``, naive, the CPU/GPU pair), each derandomized with a
fixed budget and no shrinking, so a mutant's verdict is the same on every run:

* ``Test*First`` (profile ``mutation-first``, 10 examples): what mutmut runs
  first against every mutant, ahead of the unit tests;
* ``Test*Conformance`` (profile ``mutation``, 60 examples): with the other
  tests, fastest first (after nearly every unit test), for the mutants that
  nothing before killed.

tests/conftest.py orders them so under mutmut.  In the normal suite they prove
that the unmutated impl passes the profiles the campaign relies on.
"""

from __future__ import annotations

from prefixcache.impl.prefix_caching_block import PrefixCachingBlockAllocator
from prefixcache.oracle.conformance import conformance_test

FIRST, FULL = "mutation-first", "mutation"
NAIVE = "prefixcache.impl.naive_block:NaiveBlockAllocator"
CPU_GPU = "prefixcache.impl.cpu_gpu_block_allocator:CpuGpuBlockAllocator"


def verifying(num_blocks: int, block_size: int) -> PrefixCachingBlockAllocator:
    """The prefix-caching allocator that compares the content of every hit."""
    return PrefixCachingBlockAllocator(num_blocks=num_blocks, block_size=block_size,
                                       verify_content=True)


TestPrefixCachingFirst = conformance_test(profile=FIRST)
TestVerifyContentFirst = conformance_test(verifying, profile=FIRST)
TestNaiveFirst = conformance_test(NAIVE, profile=FIRST)
TestCpuGpuFirst = conformance_test(CPU_GPU, profile=FIRST)

TestPrefixCachingConformance = conformance_test(profile=FULL)
TestVerifyContentConformance = conformance_test(verifying, profile=FULL)
TestNaiveConformance = conformance_test(NAIVE, profile=FULL)
TestCpuGpuConformance = conformance_test(CPU_GPU, profile=FULL)
