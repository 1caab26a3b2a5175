"""Stand-in for the ``vllm`` package, written by prefixcache for vLLM's block
unit tests (bench/vllm_block_tests.py): the block code and the stand-in
modules beside it, with ``SamplingParams`` at the top as in vLLM.  Not vLLM."""

from vllm.sampling_params import SamplingParams

PREFIXCACHE_STUB = True

__all__ = ["SamplingParams"]
