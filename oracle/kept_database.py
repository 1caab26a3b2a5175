"""The campaign's example database, which keeps its findings' examples.

Hypothesis deletes a stored failing example that no longer fails when it is
replayed.  To a campaign, an example whose violation is already a finding
(or in the baseline) halts instead of failing, so every batch after the one
that found it would delete the example of that finding from the database,
and a worker that shares the database would never replay it.
:class:`KeptFindings` wraps the database: :meth:`KeptFindings.keep` notes
what stands in the primary corpora after a batch and puts back what an
earlier batch noted.
"""

from __future__ import annotations

from typing import Iterable, Set, Tuple

from hypothesis.database import ExampleDatabase

#: Hypothesis's corpora besides the primary one, by their key's ending.
_NOT_PRIMARY = (b".secondary", b".pareto")


class KeptFindings(ExampleDatabase):
    """``inner``, whose primary corpora a campaign keeps from batch to batch."""

    def __init__(self, inner: ExampleDatabase) -> None:
        super().__init__()
        self.inner = inner
        self._keys: Set[bytes] = set()
        self._kept: Set[Tuple[bytes, bytes]] = set()

    def save(self, key: bytes, value: bytes) -> None:
        """Store ``value`` under ``key`` (noting a primary key)."""
        if not key.endswith(_NOT_PRIMARY):
            self._keys.add(key)
        self.inner.save(key, value)

    def fetch(self, key: bytes) -> Iterable[bytes]:
        """The values under ``key``."""
        return self.inner.fetch(key)

    def delete(self, key: bytes, value: bytes) -> None:
        """Remove ``value`` from ``key``."""
        self.inner.delete(key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        """Move ``value`` from ``src`` to ``dest``."""
        self.inner.move(src, dest, value)

    def keep(self) -> None:
        """Put back every primary example an earlier call noted, then note
        those that stand now."""
        for key, value in self._kept:
            self.inner.save(key, value)
        for key in self._keys:
            self._kept.update((key, value) for value in self.inner.fetch(key))
