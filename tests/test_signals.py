"""Signals reach the daemon through a thread (daemon/ops/signals.py): a handler that set an Event could wait for
ever on the lock the main thread held inside `Event.wait` (a daemon that did not stop on SIGTERM)."""

from __future__ import annotations

import signal
import subprocess
import sys

# The daemon's main loop, at its tightest: always in Event.wait, mostly holding the event's lock. With the handler
# setting the event itself (`signal.signal(SIGTERM, lambda *_: stop.set())`), 12 of 20 such processes hung.
CHILD = """
import signal, sys, threading
from lakefeed.ops import signals
stop = threading.Event()
signals.route([signal.SIGTERM], lambda signum: stop.set())
print("ready", flush=True)
while not stop.wait(0):
    pass
print("stopped", flush=True)
"""


def test_sigterm_ends_a_main_loop_that_waits_on_the_event_it_sets():
    children = [subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True) for _ in range(10)]
    for child in children:
        assert child.stdout.readline() == "ready\n"
    for child in children:
        child.send_signal(signal.SIGTERM)
    hung = 0
    for child in children:
        try:
            out, _ = child.communicate(timeout=20)
            assert child.returncode == 0 and out == "stopped\n", out
        except subprocess.TimeoutExpired:
            hung += 1
            child.kill()
            child.wait()
    assert hung == 0, f"{hung} of {len(children)} did not stop"
