"""The daemon's handle on its intake process (daemon/intake/client.py): a lost intake is logged once, whether a
call or the periodic check finds it gone first (CI once saw a call find it first, and no `intake.exited`)."""

from __future__ import annotations

import os
import signal

from structlog.testing import capture_logs

from lakefeed.config.model import HttpConfig
from lakefeed.intake.client import IntakeProcess


def test_a_lost_intake_is_logged_once_whichever_operation_finds_it_gone():
    client = IntakeProcess(HttpConfig(port=0), "\0lakefeed-test-upstream", "INFO")  # no upstream: not called
    client.start()
    first = client.pid
    try:
        with capture_logs() as logs:
            os.kill(first, signal.SIGKILL)
            client.accepting(True)  # a call finds it gone first (skipped, logged)
            client.check()  # then the check starts it again
        events = [e["event"] for e in logs]
        assert events.count("intake.exited") == 1, events
        assert [e["returncode"] for e in logs if e["event"] == "intake.exited"] == [-signal.SIGKILL]
        assert client.pid not in (None, first) and "intake.started" in events
    finally:
        client.stop()
