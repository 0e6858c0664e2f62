"""Crash points for the crash tests: `LAKEFEED_FAILPOINT=<name>` makes the process SIGKILL itself
the first time it reaches that point in a batch with data. Unset (always, in production), a
check is one dictionary lookup.

`LAKEFEED_FAILPOINT=hang:<name>` makes the batch hang there instead (a stuck query, for the
watchdog tests). `LAKEFEED_FAILPOINT=executor:<name>` in a Spark task SIGKILLs the executor the task runs in
(its JVM), once: the first task to get there creates the file `LAKEFEED_FAILPOINT_ONCE` names, later ones go on.
`LAKEFEED_FAILPOINT=poison:<name>:<text>` SIGKILLs the process each time it reaches that point for a unit whose
name holds <text>: an input a reader crashes on, as a C library may (daemon/pipeline/poison.py).

Points: `batch.discovered` (files matched and read, nothing committed), `commit.quarantine`,
`commit.table` (state committed, changelog not), `commit.changelog_written` (a keyed batch's changelog file
written, not committed), `commit.changelog` (both committed, manifest not written), `manifest.written`,
`odf.block_written` (a slice's block written, `refs/head` not moved), `compaction.committed` (a table compacted
after a batch, its manifests not written); in tasks (daemon/pipeline/tasks.py):
`task.written` (a write task's files written, not yet returned), `stage.file` (a landed file about to be read, by its
path), `stage.frame` (push frames about to be decoded, by their Idempotency-Key), `stage.message` (each Kafka message
of a task's part about to be decoded, by its value as text: UTF-8, bad bytes replaced); in the daemon's main loop
(daemon/ops/supervisor.py), hang only: `supervisor.tick` (each turn of the loop, once the daemon is ready).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterable

from lakefeed import log

_log = log.get(__name__)
_ARMED = os.environ.get("LAKEFEED_FAILPOINT")


def reached(name: str, unit: str = "") -> None:
    if _ARMED is None:
        return
    if _ARMED.startswith(f"poison:{name}:") and _ARMED.split(":", 2)[2] in unit:
        os.kill(os.getpid(), signal.SIGKILL)
    if _ARMED == name:
        os.kill(os.getpid(), signal.SIGKILL)
    if _ARMED == f"hang:{name}":
        _log.warning("failpoint.hanging", point=name)  # the tests wait for this, not for a guess at the time
        threading.Event().wait()
    if _ARMED == f"executor:{name}" and _first(name):
        os.kill(_executor(), signal.SIGKILL)


def reached_each(name: str, units: Callable[[], Iterable[str]]) -> None:
    """`reached` for each of `units()` (a task's messages), which is called only when a failpoint is armed: a step per
    message in production would cost a batch of 500,000 messages that many Python calls."""
    if _ARMED is not None:
        for unit in units():
            reached(name, unit)


def _first(name: str) -> bool:
    try:
        os.close(os.open(os.environ["LAKEFEED_FAILPOINT_ONCE"], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _executor() -> int:
    """The Spark executor's JVM this process descends from (a task's Python worker, under pyspark.daemon)."""
    pid = os.getpid()
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"CoarseGrainedExecutorBackend" in f.read():
                return pid
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    raise RuntimeError(f"failpoint executor:{_ARMED}: not in a Spark executor")
