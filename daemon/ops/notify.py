"""The sd_notify protocol: datagrams to $NOTIFY_SOCKET telling systemd how the service is."""

from __future__ import annotations

import os
import socket


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
