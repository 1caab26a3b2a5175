"""Hypothesis settings profiles for the oracle: ``dev``, ``ci`` and ``nightly``.

``ci`` is deterministic (derandomized, no example database) and is loaded
automatically when the ``CI`` environment variable is set; ``dev`` is the
default otherwise.  ``mutation`` is the short deterministic run that judges
each mutant of impl/ (bench/mutation.py): derandomized, no database, no
shrinking (a mutant is killed by the first failure; its shrunk form is not
needed), so every mutant sees the same examples and a verdict is reproducible.
``mutation-first`` is the same with a sixth of the examples: the campaign's
first judge, ahead of the unit tests (the oracle kills most mutants within
its first examples), with ``mutation`` again after them.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

#: A mutant's judge: the same examples every time, stopped at the first failure.
_JUDGE = dict(stateful_step_count=50, derandomize=True, database=None,
              phases=[Phase.explicit, Phase.generate], report_multiple_bugs=False)

PROFILES = {
    "dev": dict(max_examples=200, stateful_step_count=50),
    "ci": dict(max_examples=300, stateful_step_count=50, derandomize=True, database=None,
               print_blob=True),
    "nightly": dict(max_examples=20_000, stateful_step_count=100),
    "mutation": dict(max_examples=60, **_JUDGE),
    "mutation-first": dict(max_examples=10, **_JUDGE),
}

_COMMON = dict(deadline=None, suppress_health_check=list(HealthCheck))

for _name, _options in PROFILES.items():
    settings.register_profile(f"prefixcache-{_name}", **_COMMON, **_options)  # type: ignore[arg-type]


def profile_settings(name: str) -> settings:
    """The settings of profile ``name`` (one of :data:`PROFILES`)."""
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; choose one of {sorted(PROFILES)}")
    return settings.get_profile(f"prefixcache-{name}")


def default_profile() -> str:
    """``ci`` when the CI environment variable is set, else ``dev``."""
    return "ci" if os.environ.get("CI") else "dev"
