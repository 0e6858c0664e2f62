"""The spool's segment files: appends made durable or undone, and the one-writer lock."""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path

from lakefeed import log
from lakefeed.errors import TerminalError, TransientError

_log = log.get(__name__)
_IOV_MAX = os.sysconf("SC_IOV_MAX")


class SpoolWriteError(TransientError):
    """Frames could not be made durable (disk full, I/O error): nothing of them is acknowledged, and the
    segment is cut back to its last durable frame so later frames never sit behind a torn one."""

    def __init__(self, message: str, no_space: bool) -> None:
        super().__init__(message)
        self.no_space = no_space


def write_durably(fd: int, frames: list[bytes], start: int, what: str = "the spool") -> None:
    """Append `frames` to a file that holds `start` durable bytes, and fsync.

    A short write is continued; a failure cuts the file back to `start` and raises SpoolWriteError (`what`
    names the file in its message). Bytes a failed write or fsync left behind (the cut itself may have
    failed) are cut before writing."""
    try:
        if os.fstat(fd).st_size != start:
            os.ftruncate(fd, start)
        for first in range(0, len(frames), _IOV_MAX):  # writev takes at most IOV_MAX buffers a call
            _write_all(fd, frames[first:first + _IOV_MAX])
        os.fsync(fd)
    except OSError as exc:
        try:
            os.ftruncate(fd, start)
        except OSError as cut:
            _log.error("spool.cut_failed", file=what, error=str(cut))  # cut again before the next write
        no_space = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        raise SpoolWriteError(f"{what} could not store the records: {exc.strerror or exc}", no_space) from exc


def _write_all(fd: int, frames: list[bytes]) -> None:
    written = os.writev(fd, frames)
    if written < sum(map(len, frames)):
        rest = memoryview(b"".join(frames))[written:]
        while rest:
            n = os.write(fd, rest)
            if n == 0:
                raise OSError(errno.ENOSPC, "the disk took no more bytes")
            rest = rest[n:]


def hold(path: Path, timeout_s: float) -> int:
    """An exclusive lock on the spool: one writer at a time, across processes too (an intake
    process that outlives its daemon for a moment must not append behind the next one's back)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o640)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise TerminalError(f"the spool {path.parent} is held by another writer for over {timeout_s:g} s "
                                    "(is an older lakefeed still running on this state_dir? stop it first)") from None
            time.sleep(0.02)
