"""The daemon's CPU priority: Spark's side runs `spark.nice` nicer than the intake process, which answers pushes.

daemon/ops/supervisor.py calls both once at start, before Spark starts.
"""

from __future__ import annotations

import os
from pathlib import Path

from lakefeed import log

_log = log.get(__name__)
_AUTOGROUP = Path("/proc/self/autogroup")  # this session's scheduler autogroup (Linux with CONFIG_SCHED_AUTOGROUP)


def leads_own_session() -> bool:
    """Whether this process leads a session of its own (systemd, setsid) on a kernel with scheduler autogroups.

    Such a kernel shares the CPU fairly between sessions first and applies nice values only within one: the
    whole session (intake, JVM, Python workers) then competed as one with every other session, and the
    intake got the CPU it needs only as long as Spark left the session's share unused. Leading its own
    session, the daemon gives the intake a session (an autogroup) of its own and makes its own autogroup
    `spark.nice` nicer. A daemon in someone else's session (a terminal's, a test runner's) leaves that
    session's autogroup alone: lowering it would lower the terminal's priority too, for as long as it lives."""
    if os.getsid(0) != os.getpid():
        return False
    try:
        # Empty in the root group (init's session, and every process that never left it): no nice to set.
        return bool(_AUTOGROUP.read_text(encoding="ascii").strip())
    except OSError:  # a kernel without autogroups
        return False


def lower(nice: int, autogroup: bool) -> None:
    """Make this thread, and every thread and process it starts from now on (Spark's JVM and Python workers,
    the batches), `nice` nicer; with `autogroup`, this session's scheduler autogroup too. Threads started
    before keep their priority: the intake's launcher among them."""
    if not nice:
        return
    try:
        os.nice(nice)
    except OSError as exc:  # a sandbox may forbid it: everything runs alike then
        _log.warning("priority.unchanged", nice=nice, error=str(exc))
    if autogroup:
        try:
            _AUTOGROUP.write_text(str(nice), encoding="ascii")
        except OSError as exc:  # e.g. a read-only /proc: sessions then share the CPU as equals
            _log.warning("priority.autogroup_unchanged", nice=nice, error=str(exc))
