"""The durable inbox: an append-only, fsynced log of files waiting to be ingested.

Sources append file events; the entity's streaming query reads them through a Spark Python
data source, so how far it has read lives in Spark's checkpoint. Offsets are dense (the
record's line number). A file is offered once per identity (path, size, mtime, etag, removed):
the same file seen again by a notification and a listing is not enqueued twice, while a
rewritten file (new size, mtime or ETag) is, and so is a file that comes back after its
removal. Removals (object-store notifications, a local delete or move, a listing that no longer
finds a file) travel the same way (`removed`), so the manifests learn of them in commit order.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from lakefeed import clock, log
from lakefeed.inbox.segments import DurableMark, read_mark, write_durably

_log = log.get(__name__)
LOG_NAME = "inbox.log"
DAMAGED = "\0damaged inbox line "  # the path of a damaged line's record: no file has it, no pattern matches it
_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFDIR: "a folder", stat.S_IFLNK: "a symbolic link"}


def not_regular(mode: int) -> str:
    """Why a file of this mode is not taken ("" for a regular file)."""
    if stat.S_ISREG(mode):
        return ""
    return f"{_KINDS.get(stat.S_IFMT(mode), 'a special file')}, not a regular file"


@dataclass(frozen=True, slots=True)
class FileEvent:
    path: str
    size: int
    mtime_ns: int
    etag: str = ""  # objects only
    removed: bool = False
    problem: str = ""  # why the source already knows the file cannot be read (it goes to quarantine unread)

    @property
    def identity(self) -> tuple[str, int, int, str, bool]:
        return (self.path, self.size, self.mtime_ns, self.etag, self.removed)

    @classmethod
    def of(cls, path: str | Path) -> FileEvent:
        st = os.stat(path)
        return cls(str(path), st.st_size, st.st_mtime_ns)


@dataclass(frozen=True, slots=True)
class InboxRecord:
    offset: int
    path: str
    size: int
    mtime_ns: int
    enqueued_at: str
    etag: str = ""
    removed: bool = False
    problem: str = ""

    def as_tuple(self) -> tuple[int, str, int, int, str, str, bool, str]:
        return (self.offset, self.path, self.size, self.mtime_ns, self.enqueued_at, self.etag, self.removed,
                self.problem)

    @property
    def identity(self) -> tuple[str, int, int, str, bool]:
        return (self.path, self.size, self.mtime_ns, self.etag, self.removed)


SPARK_SCHEMA = ("offset long, path string, size long, mtime_ns long, enqueued_at string, etag string, "
                "removed boolean, problem string")


_RECORD = b'{"o": '  # how `_line` starts every record


def _parse(line: bytes, offset: int) -> InboxRecord:
    """The record on the line with that offset. A damaged line (a tear an earlier lakefeed left inside the log, or
    the disk's doing) is the record written after the tear when one is there, with the line's offset; else a
    record of the damage, which no pattern matches (the file it named is offered again by the next listing)."""
    try:
        return _record(json.loads(line))
    except (ValueError, KeyError, TypeError):
        pass
    if (start := line.rfind(_RECORD)) > 0:
        try:
            if (rec := _record(json.loads(line[start:]))).offset == offset:
                return rec
        except (ValueError, KeyError, TypeError):
            pass
    problem = f"inbox line {offset} is damaged: {line[:200].decode('utf-8', 'backslashreplace')}"
    return InboxRecord(offset, f"{DAMAGED}{offset}", 0, 0, "", problem=problem)


def _lines(data: bytes) -> list[bytes]:
    """The complete lines of log bytes, each ended by \n alone, as the offsets count records (InboxCursor reads a
    file's lines the same way): not splitlines(), which also ends one at \r, which a damaged line may hold."""
    return data.split(b"\n")[:-1]


def _record(d: dict) -> InboxRecord:
    return InboxRecord(d["o"], d["p"], d["s"], d["m"], d["t"], d.get("e", ""), d.get("r", False), d.get("x", ""))


def _line(rec: InboxRecord) -> str:
    d: dict[str, object] = {"o": rec.offset, "p": rec.path, "s": rec.size, "m": rec.mtime_ns, "t": rec.enqueued_at}
    if rec.etag:
        d["e"] = rec.etag
    if rec.removed:
        d["r"] = True
    if rec.problem:
        d["x"] = rec.problem
    return json.dumps(d)


class Inbox:
    """The writing side; one per entity in the daemon process, safe across threads."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / LOG_NAME
        self._lock = threading.Lock()
        self._seen: set[tuple[str, int, int, str, bool]] = set()
        self._removed: dict[str, bool] = {}  # path -> whether its last record is a removal
        self._count = 0
        self._bytes = 0  # the log's durable length: a failed append is cut back to it
        self._repair_and_load()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._mark = DurableMark(folder)  # what readers may read
        self._mark.set(LOG_NAME, self._bytes)

    def _repair_and_load(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        complete = data[: data.rfind(b"\n") + 1]
        if len(complete) != len(data):
            # A crash mid-append left a torn last line; it was never acknowledged, so drop it.
            with open(self.path, "r+b") as f:
                f.truncate(len(complete))
                os.fsync(f.fileno())
        for offset, line in enumerate(_lines(complete)):
            rec = _parse(line, offset)
            if rec.path.startswith(DAMAGED):
                _log.error("inbox.line_damaged", inbox=str(self.path), offset=offset, problem=rec.problem)
                continue
            self._seen.add(rec.identity)
            self._removed[rec.path] = rec.removed
        self._count = complete.count(b"\n")
        self._bytes = len(complete)

    def present(self, path: str) -> bool:
        """Whether the path's last record says the file is there."""
        with self._lock:
            return self._removed.get(path) is False

    def listed(self, under: str) -> list[str]:
        """The paths under a folder whose last record says the file is there."""
        prefix = under.rstrip(os.sep) + os.sep
        with self._lock:
            return [p for p, removed in self._removed.items() if not removed and p.startswith(prefix)]

    def offer(self, events: Iterable[FileEvent]) -> list[InboxRecord]:
        """Append the events not seen before, durably (one fsync), and return their records.

        Raises SpoolWriteError (transient) when they could not be made durable (disk full, I/O error): the log is
        cut back and none of them counts as seen, so the next listing, notification or redelivery offers them again.
        """
        with self._lock:
            added = self._unseen(events)
            if not added:
                return added
            data = "".join(_line(rec) + "\n" for rec in added).encode()
            write_durably(self._fd, [data], self._bytes, what=f"the inbox {self.path}")
            self._bytes += len(data)
            self._mark.set(LOG_NAME, self._bytes)
            self._count += len(added)
            for rec in added:
                self._seen.add(rec.identity)
                self._removed[rec.path] = rec.removed
            return added

    def _unseen(self, events: Iterable[FileEvent]) -> list[InboxRecord]:
        """Records for the events not seen before, in order; the inbox's state changes only once they are durable."""
        stamp = clock.to_cdm(clock.now())
        seen: set[tuple[str, int, int, str, bool]] = set()
        removed: dict[str, bool] = {}  # this call's events over the inbox's: path -> whether the last is a removal
        added: list[InboxRecord] = []
        for ev in events:
            was_removed = removed[ev.path] if ev.path in removed else self._removed.get(ev.path)
            if (ev.identity in seen or ev.identity in self._seen) and (ev.removed or not was_removed):
                continue  # seen (a removal seen again is a duplicate; a file back after its removal is not)
            added.append(InboxRecord(self._count + len(added), ev.path, ev.size, ev.mtime_ns, stamp, ev.etag,
                                     ev.removed, ev.problem))
            seen.add(ev.identity)
            removed[ev.path] = ev.removed
        return added

    def __len__(self) -> int:
        return self._count

    def close(self) -> None:
        with self._lock:
            os.close(self._fd)
            self._mark.close()
            self._fd = -1  # an offer after close fails (EBADF) rather than cut a file that reused the number


class InboxReader:
    """The reading side, used by the stream reader in Spark's planner process.

    It keeps the byte position of each record so that each trigger reads only what was
    appended since the last one.
    """

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / LOG_NAME
        self._starts: list[int] = []
        self._end = 0
        self._mark: tuple[str, int] | None = None  # the writer's durable mark (segments.DurableMark)

    def refresh(self) -> int:
        """Index complete, durable records appended since the last call; return how many there are."""
        self._mark = read_mark(self.path.parent, self._mark)
        try:
            with open(self.path, "rb") as f:
                f.seek(self._end)
                chunk = f.read() if self._mark is None else f.read(max(0, self._mark[1] - self._end))
        except FileNotFoundError:
            return 0
        pos = 0
        while (nl := chunk.find(b"\n", pos)) != -1:
            self._starts.append(self._end + pos)
            pos = nl + 1
        self._end += pos
        return len(self._starts)

    def records(self, start: int, end: int) -> list[InboxRecord]:
        if end > len(self._starts):
            self.refresh()
        if start >= end:
            return []
        with open(self.path, "rb") as f:
            f.seek(self._starts[start])
            stop = self._starts[end] if end < len(self._starts) else self._end
            data = f.read(stop - self._starts[start])
        return [_parse(line, offset) for offset, line in enumerate(_lines(data), start)]


class InboxCursor:
    """The reading side in the daemon's process: the records of a micro-batch's range, read on from where the last
    range ended (each batch's follows the one before), without InboxReader's index of every record's position. A
    range before the last one (a batch run again) is read from the start of the log."""

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / LOG_NAME
        self._next, self._at = 0, 0  # record `_next` starts at byte `_at`

    def records(self, start: int, end: int) -> list[InboxRecord]:
        """Records `start` to `end` (exclusive), which must be durable: a range a query planned."""
        if start >= end:
            return []
        if start < self._next:
            self._next, self._at = 0, 0
        found: list[InboxRecord] = []
        with open(self.path, "rb") as f:
            f.seek(self._at)
            for line in f:
                if self._next >= start:
                    found.append(_parse(line.rstrip(b"\n"), self._next))
                self._next, self._at = self._next + 1, self._at + len(line)
                if self._next == end:
                    break
        if len(found) != end - start:
            raise OSError(f"the inbox {self.path} ends before record {end - 1}: it was cut or replaced")
        return found
