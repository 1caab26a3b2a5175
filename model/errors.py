"""Exceptions that belong to the model itself (not to the allocator API).

The allocator's own vocabulary (``NoFreeBlocksError``, ``DetachedBlockError``,
...) is shared with the implementation and lives in
:mod:`prefixcache.impl.errors`; the model raises those for the same reasons.
"""

from __future__ import annotations


class ModelError(Exception):
    """Base class of the exceptions that only the model raises."""


class ChoiceNotAllowed(ModelError):
    """Relaxed mode: the chooser picked an id that the spec does not allow.

    ``chosen`` is the id the chooser returned, ``allowed`` the ids it could
    have returned.  The operation had no effect on the model."""

    def __init__(self, chosen: object, allowed: frozenset[int]) -> None:
        super().__init__(f"id {chosen!r} is not one of the allowed ids {sorted(allowed)}")
        self.chosen = chosen
        self.allowed = allowed


class ModelInvariantError(ModelError, AssertionError):
    """The model broke one of the spec's invariants: a bug in the model.

    ``names`` lists the violated invariants, as ``spec.invariants`` names them."""

    def __init__(self, names: list[str]) -> None:
        super().__init__("model state violates: " + ", ".join(names))
        self.names = names
