"""prefixcache.impl: a drop-in for vLLM 0.8.5's ``vllm.core.block`` allocators.

``vllm.core.block.X`` becomes ``prefixcache.impl.X``; ``vllm.core.evictor``
becomes ``prefixcache.impl.evictor``.  Stricter than vLLM where
shared/API.md section 8 says so: caller mistakes raise
:class:`prefixcache.impl.errors.CallerError` subclasses and change nothing.
"""
