"""Crash points for the crash tests: `LAKEFEED_FAILPOINT=<name>` makes the process SIGKILL itself
the first time it reaches that point in a batch with data. Unset (always, in production), a
check is one dictionary lookup.

`LAKEFEED_FAILPOINT=hang:<name>` makes the batch hang there instead (a stuck query, for the
watchdog tests).

Points: `batch.discovered` (files matched and read, nothing committed), `commit.quarantine`,
`commit.table` (state committed, changelog not), `commit.changelog` (both committed, manifest
not written), `manifest.written`, `odf.block_written` (a slice's block written, `refs/head` not moved).
"""

from __future__ import annotations

import os
import signal
import threading

_ARMED = os.environ.get("LAKEFEED_FAILPOINT")


def reached(name: str) -> None:
    if _ARMED == name:
        os.kill(os.getpid(), signal.SIGKILL)
    if _ARMED == f"hang:{name}":
        threading.Event().wait()
