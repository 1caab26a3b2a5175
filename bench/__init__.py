"""The benchmark room: ``prefixcache bench`` and what it needs.

* :mod:`.workload` -- the serving workload generator (conversations that
  share system prompts, admission, decoding, preemption by swapping);
* :mod:`.replayer` -- compiles a workload into a flat program of allocator
  calls, as vLLM 0.8.5's block manager would make them, and replays it on
  any allocator;
* :mod:`.benchmark` -- the ``bench`` verb: throughput, latency and scaling,
  side by side with another target (vLLM 0.8.5's own, fetched by
  :mod:`prefixcache.oracle.vllm_source`);
* :mod:`.soak` -- ``bench --soak``: the same workload, long, with the spec's
  invariants checked along the way and the allocator's memory watched.

The scripts beside them (``python bench/NAME.py``) are the project's own
measurements: bench/RESULTS.md, the mutation campaigns and their reports.
The oracle never imports this package; it uses the oracle.
"""
