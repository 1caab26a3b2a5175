"""One line gives a pytest user a conformance test for their allocator::

    TestMine = conformance_test("mypkg.alloc:MyAllocator")
    TestMyPool = conformance_test("mypkg.pool:MyBlockPool", api="v1")

The test runs the oracle's state machine against the target with the
profile ``ci`` when the ``CI`` environment variable is set, ``dev``
otherwise (or the one named).
"""

from __future__ import annotations

import unittest
from typing import Optional, Union

from hypothesis.stateful import RuleBasedStateMachine

from ..spec.semantics import DEFAULT, PRESETS, Semantics
from ..spec.v1_semantics import V1_PRESETS
from .machine import make_machine
from .profiles import default_profile, profile_settings
from .targets import Factory, resolve_target
from .v1_machine import make_v1_machine
from .v1_targets import check_v1_pool, resolve_v1_target


def conformance_test(
    target: Union[str, Factory, None] = None,
    *,
    api: str = "v0",
    kind: Optional[str] = None,
    strict: bool = True,
    mistakes: bool = True,
    white_box: bool = True,
    profile: Optional[str] = None,
    semantics: Union[str, Semantics] = DEFAULT,
    call_timeout: Optional[float] = 10.0,
) -> type[unittest.TestCase]:
    """A ``unittest.TestCase`` class (collected by pytest) whose one test
    fuzzes ``target`` against the model.  ``api="v1"`` judges a vLLM v1
    ``BlockPool`` (default target: vLLM 0.34.0's) against the v1 model
    instead of a v0 block allocator (default: prefixcache.impl's).
    ``strict=False`` (v0 only) accepts any free id the spec allows;
    ``mistakes=False`` for targets that only promise valid call sequences;
    ``semantics`` names a preset of the API (v0: ``"prefixcache"``,
    ``"vllm-0.8.5"``; v1: ``"prefixcache"``, ``"vllm-0.34.0"``) or gives the
    options' values; a call of the target that runs past ``call_timeout``
    seconds fails as a hang.  ValueError for an unknown ``api`` or preset,
    or ``kind``/``strict=False`` with ``api="v1"``; TargetError when the
    target cannot be loaded (or, for v1, is not a block pool)."""
    presets = {"v0": PRESETS, "v1": V1_PRESETS}.get(api)
    if presets is None:
        raise ValueError(f"api must be 'v0' or 'v1', not {api!r}")
    if isinstance(semantics, str):
        if semantics not in presets:
            raise ValueError(f"semantics {semantics!r} is not a preset of api {api!r} "
                             f"(one of {', '.join(sorted(presets))})")
        semantics = presets[semantics]
    if api == "v1":
        if kind is not None or not strict:
            raise ValueError("kind and strict=False concern v0 allocators, not api 'v1'")
        pool = resolve_v1_target(target)
        check_v1_pool(pool)
        machine: type[RuleBasedStateMachine] = make_v1_machine(
            pool, mistakes=mistakes, white_box=white_box, semantics=semantics,
            call_timeout=call_timeout)
    else:
        machine = make_machine(resolve_target(target, kind=kind, strict=strict),
                               mistakes=mistakes, white_box=white_box, semantics=semantics,
                               call_timeout=call_timeout)
    machine.TestCase.settings = profile_settings(profile or default_profile())
    return machine.TestCase
