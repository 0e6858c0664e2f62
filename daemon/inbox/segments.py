"""The spool's segment files: appends made durable or undone, and the one-writer lock."""

from __future__ import annotations

import errno
import fcntl
import os
import time
import zlib
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


class DurableMark:
    """How far a log is durable (a segment's name, a byte position in it), for its readers in other processes. The
    writer moves it after each fsync and sets it when it opens the log; readers take nothing beyond it. So bytes a
    failed append leaves for a moment (written, then not made durable, then cut back) are never read, and an offset
    a reader took is never given to other records. Not fsynced: the writer sets it again whenever it starts."""

    NAME = "durable.mark"
    _SIZE = 128

    def __init__(self, folder: Path) -> None:
        self._fd = os.open(folder / self.NAME, os.O_RDWR | os.O_CREAT, 0o640)

    def set(self, segment: str, position: int) -> None:
        text = f"{segment} {position}"
        line = f"{text} {zlib.crc32(text.encode())}\n".encode()
        os.pwrite(self._fd, line.ljust(self._SIZE), 0)  # one write of a fixed size: no stale tail

    def close(self) -> None:
        os.close(self._fd)


def read_mark(folder: Path, last: tuple[str, int] | None) -> tuple[str, int] | None:
    """The log's durable mark; `last` (the one read before) while the writer is moving it; None: the writer has
    set none (an older lakefeed's log, or a writer not started yet), and the log's complete records are all read."""
    try:
        with open(folder / DurableMark.NAME, "rb") as f:
            raw = f.read(DurableMark._SIZE)
    except FileNotFoundError:
        return last
    text, _, crc = raw.decode("ascii", "replace").strip().rpartition(" ")
    if not crc.isdigit() or zlib.crc32(text.encode()) != int(crc):
        return last  # read while it was written (or empty: created, not yet set)
    segment, _, position = text.rpartition(" ")
    return segment, int(position)
