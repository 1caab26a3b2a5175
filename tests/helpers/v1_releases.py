"""The pinned vLLM v1 releases the tests build real pools of: the oldest
pinned (0.28.0: the old hash map, the null block's references counted), the
newest without ``free_blocks(..., evict_first)`` (0.33.0) and the default
(0.34.0).  The other pinned releases are judged by the campaigns recorded in
bench/V1_FINDINGS.md, so that the test suite fetches three wheels, not all."""

TESTED_RELEASES = ("0.28.0", "0.33.0", "0.34.0")
