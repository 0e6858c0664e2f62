"""The durable inbox: an append-only, fsynced log of files waiting to be ingested.

Sources append file events; the entity's streaming query reads them through a Spark Python
data source, so how far it has read lives in Spark's checkpoint. Offsets are dense (the
record's line number). A file is offered once per identity (path, size, mtime): the same
file seen again by a notification and a listing is not enqueued twice, while a rewritten
file (new size or mtime) is.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from lakefeed import clock

LOG_NAME = "inbox.log"


@dataclass(frozen=True, slots=True)
class FileEvent:
    path: str
    size: int
    mtime_ns: int

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

    def as_tuple(self) -> tuple[int, str, int, int, str]:
        return (self.offset, self.path, self.size, self.mtime_ns, self.enqueued_at)


SPARK_SCHEMA = "offset long, path string, size long, mtime_ns long, enqueued_at string"


def _parse(line: bytes) -> InboxRecord:
    d = json.loads(line)
    return InboxRecord(d["o"], d["p"], d["s"], d["m"], d["t"])


class Inbox:
    """The writing side; one per entity in the daemon process, safe across threads."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / LOG_NAME
        self._lock = threading.Lock()
        self._seen: set[tuple[str, int, int]] = set()
        self._count = 0
        self._repair_and_load()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

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
        for line in complete.splitlines():
            rec = _parse(line)
            self._seen.add((rec.path, rec.size, rec.mtime_ns))
        self._count = complete.count(b"\n")

    def offer(self, events: Iterable[FileEvent]) -> list[InboxRecord]:
        """Append the events not seen before, durably (one fsync), and return their records."""
        with self._lock:
            added: list[InboxRecord] = []
            lines = []
            stamp = clock.to_cdm(clock.now())
            for ev in events:
                ident = (ev.path, ev.size, ev.mtime_ns)
                if ident in self._seen:
                    continue
                rec = InboxRecord(self._count + len(added), ev.path, ev.size, ev.mtime_ns, stamp)
                lines.append(
                    json.dumps({"o": rec.offset, "p": rec.path, "s": rec.size, "m": rec.mtime_ns, "t": stamp})
                )
                added.append(rec)
                self._seen.add(ident)
            if lines:
                os.write(self._fd, ("\n".join(lines) + "\n").encode())
                os.fsync(self._fd)
                self._count += len(added)
            return added

    def __len__(self) -> int:
        return self._count

    def close(self) -> None:
        with self._lock:
            os.close(self._fd)


class InboxReader:
    """The reading side, used by the stream reader in Spark's planner process.

    It keeps the byte position of each record so that each trigger reads only what was
    appended since the last one.
    """

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / LOG_NAME
        self._starts: list[int] = []
        self._end = 0

    def refresh(self) -> int:
        """Index complete records appended since the last call; return how many there are."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._end)
                chunk = f.read()
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
        return [_parse(line) for line in data.splitlines()]
