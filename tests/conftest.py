"""Only for mutation testing (bench/mutation.py, issue #7): under ``mutmut run``
(which sets ``MUTANT_UNDER_TEST``) the tests that judge a mutant of impl/ are
the oracle's conformance tests (``test_mutation_oracle.py``, run first), the
impl's unit tests (``test_impl_*.py``) and the differential test against vLLM
0.8.5 (run last: the slowest), each group fastest first; every Hypothesis test
is derandomized, without an example database and without shrinking, so that a
mutant's verdict does not depend on earlier mutants.  Nothing changes in a
normal pytest run."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional

#: The test files that may kill a mutant, in the order they run.
MUTATION_TESTS = ("test_mutation_oracle.py", "test_impl_*.py", "test_vllm_differential.py")

if "MUTANT_UNDER_TEST" in os.environ:
    from hypothesis import Phase, settings

    settings.register_profile(
        "prefixcache-mutmut", derandomize=True, database=None,
        phases=[Phase.explicit, Phase.generate], report_multiple_bugs=False)
    settings.load_profile("prefixcache-mutmut")

    def _rank(path: Path) -> Optional[int]:
        for rank, pattern in enumerate(MUTATION_TESTS):
            if path.match(pattern):
                return rank
        return None

    def pytest_ignore_collect(collection_path: Path, config: Any) -> Optional[bool]:
        """Only the files of MUTATION_TESTS are collected."""
        if collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
            return True if _rank(collection_path) is None else None
        return None

    def _durations() -> Dict[str, float]:
        """Each test's duration in mutmut's stats run (cwd is ./mutants/)."""
        try:
            return dict(json.loads(Path("mutmut-stats.json").read_text())["duration_by_test"])
        except (OSError, ValueError, KeyError):
            return {}

    def pytest_collection_modifyitems(config: Any, items: List[Any]) -> None:
        """The oracle first, the differential test last; within each, the
        fastest first (mutmut stops at the first failure)."""
        durations = _durations()
        items.sort(key=lambda item: (_rank(Path(str(item.fspath))) or 0,
                                     durations.get(item.nodeid, 0.0)))
