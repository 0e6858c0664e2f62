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


# The main thread in a long C call that lets other threads run but checks no signals (SQLite's, as delta-rs's calls
# into Rust are): a Python handler runs only once the call returns; the `signals` thread runs at once.
BUSY = """
import os, signal, sqlite3, sys, threading, time
from lakefeed.ops import signals
taken = []
if sys.argv[1] == "route":
    signals.route([signal.SIGUSR2], lambda signum: taken.append(time.monotonic()))
else:
    signal.signal(signal.SIGUSR2, lambda signum, frame: taken.append(time.monotonic()))
query = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 10000000) SELECT count(*) FROM c"
db = sqlite3.connect(":memory:")


def send():  # once the main thread is in the query
    deadline = time.monotonic() + 60
    while sys._current_frames()[threading.main_thread().ident].f_lineno != IN_QUERY and time.monotonic() < deadline:
        time.sleep(0.001)
    os.kill(os.getpid(), signal.SIGUSR2)
IN_QUERY = sys._getframe().f_lineno + 2
threading.Thread(target=send).start()
db.execute(query).fetchone()
ended = time.monotonic()
print("during" if taken and ended - taken[0] > 0.5 else "after", flush=True)  # the query takes seconds
"""


def _taken(how: str) -> str:
    child = subprocess.Popen([sys.executable, "-c", BUSY, how], stdout=subprocess.PIPE, text=True)
    out, _ = child.communicate(timeout=120)
    assert child.returncode == 0
    return out.strip()


def test_a_routed_signal_is_taken_while_the_main_thread_is_in_a_long_c_call():
    assert _taken("handler") == "after"  # the way SIGUSR2's stacks were taken: only once the call returned
    assert _taken("route") == "during"
