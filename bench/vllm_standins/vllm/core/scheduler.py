"""Stand-in for ``vllm.core.scheduler``, written by prefixcache for vLLM's
block unit tests: ``tests/core/utils.py`` imports these two names, which only
vLLM's scheduler tests (not run here) use.  Placeholders."""


class Scheduler:
    """Placeholder: vLLM's scheduler is not part of the block tests."""


class SchedulerOutputs:
    """Placeholder: vLLM's scheduler output is not part of the block tests."""
