"""The oracle's conformance tests in the ``mutation`` profile: the first tests
mutmut runs against each mutant of impl/ (bench/mutation.py, issue #7).

One conformance test per allocator of impl/ (prefix-caching, the same with
``verify_content=True``, naive, the CPU/GPU pair), each derandomized with a
fixed budget and no shrinking, so a mutant's verdict is the same on every run.
In the normal suite they prove that the unmutated impl passes the profile the
campaign relies on.
"""

from __future__ import annotations

from prefixcache.impl.prefix_caching_block import PrefixCachingBlockAllocator
from prefixcache.oracle.conformance import conformance_test

PROFILE = "mutation"


def verifying(num_blocks: int, block_size: int) -> PrefixCachingBlockAllocator:
    """The prefix-caching allocator that compares the content of every hit."""
    return PrefixCachingBlockAllocator(num_blocks=num_blocks, block_size=block_size,
                                       verify_content=True)


TestPrefixCachingConformance = conformance_test(profile=PROFILE)
TestVerifyContentConformance = conformance_test(verifying, profile=PROFILE)
TestNaiveConformance = conformance_test(
    "prefixcache.impl.naive_block:NaiveBlockAllocator", profile=PROFILE)
TestCpuGpuConformance = conformance_test(
    "prefixcache.impl.cpu_gpu_block_allocator:CpuGpuBlockAllocator", profile=PROFILE)
