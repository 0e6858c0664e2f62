"""Signals taken by a thread of their own, not in a signal handler.

Python runs a signal handler in the main thread between two bytecodes, wherever that thread is. Inside
`Event.wait`, it holds the event's lock; a handler that sets that event then waits for the lock for ever. A
daemon did not stop on SIGTERM that way (the CI of f2a73d9: its main loop was in `_stop.wait(0.25)`). Here the
handler does nothing: Python's C-level handler writes the signal's number to a socket (`signal.set_wakeup_fd`),
and a thread that reads it calls `on_signal`, which may take any lock.
"""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Callable, Iterable


def route(signums: Iterable[int], on_signal: Callable[[int], None]) -> None:
    """From now on, each of `signums` calls `on_signal(signum)` in the thread `signals`. Call from the main thread,
    once; other signals with handlers of their own still run them."""
    wanted = set(signums)
    read, write = socket.socketpair()
    write.setblocking(False)  # set_wakeup_fd's condition: a signal never blocks on a full socket
    signal.set_wakeup_fd(write.fileno(), warn_on_full_buffer=False)
    for signum in wanted:
        signal.signal(signum, _nothing)
    threading.Thread(target=_take, args=(read, write, wanted, on_signal), name="signals", daemon=True).start()


def _nothing(_signum: int, _frame: object) -> None:
    """The Python-level handler: the number was written to the socket before it runs."""


def _take(read: socket.socket, write: socket.socket, wanted: set[int],
          on_signal: Callable[[int], None]) -> None:
    with read, write:  # `write` lives as long as the route: its number is the wakeup fd
        while data := read.recv(64):
            for signum in data:
                if signum in wanted:
                    on_signal(signum)
