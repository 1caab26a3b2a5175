"""prefixcache.impl: a drop-in for vLLM 0.8.5's ``vllm.core.block`` allocators.

``vllm.core.block.X`` becomes ``prefixcache.impl.X``; ``vllm.core.evictor``
becomes ``prefixcache.impl.evictor``.  Stricter than vLLM where
the spec says so (SPEC.md, and its semantic options): caller mistakes raise
:class:`prefixcache.impl.errors.CallerError` subclasses and change nothing.
"""
