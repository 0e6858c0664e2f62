"""The sd_notify protocol: datagrams to $NOTIFY_SOCKET telling systemd how the service is."""

from __future__ import annotations

import os
import socket
import threading


def notify(**fields: str) -> bool:
    """Send e.g. notify(READY="1", STATUS="…"); False (and nothing sent) when not under systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # an abstract socket
    message = "\n".join(f"{k}={v}" for k, v in fields.items()).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.connect(address)
        sock.sendall(message)
    return True


def feed_watchdog(done: threading.Event, interval: float) -> None:
    """Ping the watchdog every `interval` seconds until `done` (while a reload blocks the main loop)."""
    while not done.wait(interval):
        notify(WATCHDOG="1")


def watchdog_interval() -> float:
    """Half of systemd's WatchdogSec (WATCHDOG_USEC), when the watchdog is meant for this process."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return 0.0
    return int(usec) / 2e6
