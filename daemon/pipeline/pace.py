"""How often the manifests are brought current while a backlog of landed files drains.

Each batch's commit is followed by the manifests' refresh, so readers see its files at once. While more files
wait for the next batch, a large manifest's rewrite after every batch would take a share of the time that grows
with the manifest (it is rewritten whole); then the refresh waits for a later batch, so that it takes at most
`SHARE` of the time. The batch that drains the backlog always brings them current, and nothing is lost by
waiting: the manifests are derived from committed state (`manifests/base.py`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

SHARE = 0.1  # of the time while a backlog drains, at most, for the manifests' upkeep


class ManifestPace:
    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now
        self._last_end = -float("inf")
        self._last_cost = 0.0

    def due(self, backlog: bool) -> bool:
        """Whether the manifests are to be brought current after this batch (`backlog`: more files wait)."""
        return not backlog or self._now() - self._last_end >= self._last_cost / SHARE - self._last_cost

    def timed(self, refresh: Callable[[], None]) -> None:
        started = self._now()
        refresh()
        self._last_end = self._now()
        self._last_cost = self._last_end - started
