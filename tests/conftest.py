"""Only for mutation testing (bench/mutation.py, issue #7): under ``mutmut run``
(which sets ``MUTANT_UNDER_TEST``) the tests that judge a mutant of impl/ are
the oracle's conformance tests (``test_mutation_oracle.py``), the impl's unit
tests (``test_impl_*.py``) and the differential test against vLLM 0.8.5, and
mutmut stops at the first failure.  The oracle's short runs (``Test*First``,
10 examples per allocator) go first; then every other test, fastest first:
the unit tests, the oracle's full runs (``Test*Conformance``, 60 examples),
the few slow unit tests and the differential test.  The oracle kills most
mutants within its first examples, and a mutant that only a unit test kills
no longer pays the oracle's full runs first; a mutant that survives has met
every test.  Every Hypothesis test is derandomized, without an example
database and without shrinking, so that a mutant's verdict does not depend
on earlier mutants.  Nothing changes in a normal pytest run."""

from __future__ import annotations

import fnmatch
import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

#: The test files that may kill a mutant.
MUTATION_TESTS = ("test_mutation_oracle.py", "test_impl_*.py", "test_vllm_differential.py")
#: The tests that run first (the oracle's short runs); the others follow, fastest first.
MUTATION_FIRST = "tests/test_mutation_oracle.py::Test*First::*"

if "MUTANT_UNDER_TEST" in os.environ:
    from hypothesis import Phase, settings

    settings.register_profile(
        "prefixcache-mutmut", derandomize=True, database=None,
        phases=[Phase.explicit, Phase.generate], report_multiple_bugs=False)
    settings.load_profile("prefixcache-mutmut")

    def pytest_ignore_collect(collection_path: Path, config: Any) -> Optional[bool]:
        """Only the files of MUTATION_TESTS are collected."""
        if collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
            return None if any(collection_path.match(p) for p in MUTATION_TESTS) else True
        return None

    _read: Dict[Tuple[float, int], Dict[str, float]] = {}

    def _durations() -> Dict[str, float]:
        """Each test's duration in mutmut's stats run (cwd is ./mutants/),
        read once per version of the file (the forked runs inherit it)."""
        try:
            stat = os.stat("mutmut-stats.json")
            version = (stat.st_mtime, stat.st_size)
            if version not in _read:
                _read.clear()
                _read[version] = dict(json.loads(Path("mutmut-stats.json").read_text())[
                    "duration_by_test"])
            return _read[version]
        except (OSError, ValueError, KeyError):
            return {}

    def pytest_collection_modifyitems(config: Any, items: List[Any]) -> None:
        """The oracle's short runs first, then the other tests, fastest
        first (by their duration in mutmut's stats run)."""
        durations = _durations()
        items.sort(key=lambda item: (not fnmatch.fnmatchcase(item.nodeid, MUTATION_FIRST),
                                     durations.get(item.nodeid, 0.0)))
