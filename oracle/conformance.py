"""One line gives a pytest user a conformance test for their allocator::

    TestMine = conformance_test("mypkg.alloc:MyAllocator")

The test runs the oracle's state machine against the target with the
profile ``ci`` when the ``CI`` environment variable is set, ``dev``
otherwise (or the one named).
"""

from __future__ import annotations

import unittest
from typing import Optional, Union

from ..spec.semantics import DEFAULT, Semantics, preset
from .machine import make_machine
from .profiles import default_profile, profile_settings
from .targets import Factory, resolve_target


def conformance_test(
    target: Union[str, Factory, None] = None,
    *,
    kind: Optional[str] = None,
    strict: bool = True,
    mistakes: bool = True,
    white_box: bool = True,
    profile: Optional[str] = None,
    semantics: Union[str, Semantics] = DEFAULT,
    call_timeout: Optional[float] = 10.0,
) -> type[unittest.TestCase]:
    """A ``unittest.TestCase`` class (collected by pytest) whose one test
    fuzzes ``target`` against the model.  ``strict=False`` accepts any free
    id the spec allows; ``mistakes=False`` for targets that only promise
    valid call sequences; ``semantics`` names a preset (``"prefixcache"``,
    ``"vllm-0.8.5"``) or gives the options' values; a call of the target
    that runs past ``call_timeout`` seconds fails as a hang."""
    resolved = resolve_target(target, kind=kind, strict=strict)
    machine = make_machine(resolved, mistakes=mistakes, white_box=white_box,
                           semantics=preset(semantics) if isinstance(semantics, str)
                           else semantics, call_timeout=call_timeout)
    machine.TestCase.settings = profile_settings(profile or default_profile())
    return machine.TestCase
