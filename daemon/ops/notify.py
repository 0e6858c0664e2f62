"""The sd_notify protocol: datagrams to $NOTIFY_SOCKET telling systemd how the service is."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator

from lakefeed import log

_log = log.get(__name__)
_failed: set[str] = set()  # sockets already reported unreachable


def notify(**fields: str) -> bool:
    """Send e.g. notify(READY="1", STATUS="…"); False (and nothing sent) when not under systemd, or when the
    socket cannot be reached (logged once)."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # an abstract socket
    message = "\n".join(f"{k}={v}" for k, v in fields.items()).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message)
    except OSError as exc:  # as sd_notify(3) does: the service goes on; systemd's timeouts tell of it
        if address not in _failed:
            _failed.add(address)
            _log.warning("notify.failed", socket=os.environ["NOTIFY_SOCKET"], error=str(exc))
        return False
    return True


@contextlib.contextmanager
def watchdog_fed() -> Iterator[None]:
    """Ping the watchdog from a thread of its own while the block runs: the main loop, which pings it otherwise,
    waits there for something that is progress, not a hang (a reload, an entity started again)."""
    interval = watchdog_interval()
    done = threading.Event()
    if interval:
        threading.Thread(target=_feed, args=(done, interval), name="watchdog", daemon=True).start()
    try:
        yield
    finally:
        done.set()


def _feed(done: threading.Event, interval: float) -> None:
    while not done.wait(interval):
        notify(WATCHDOG="1")


def watchdog_interval() -> float:
    """Half of systemd's WatchdogSec (WATCHDOG_USEC), when the watchdog is meant for this process."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return 0.0
    return int(usec) / 2e6
