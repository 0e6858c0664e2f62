"""The push spool: a write-ahead log of acknowledged record batches, one per push source.

A request's records are validated, encoded as one Arrow IPC stream and appended as a frame;
the HTTP response is sent only after the frame is fsynced. Concurrent requests share one
fsync (group commit, daemon/intake/group_commit.py); one process writes a spool at a time (a lock).
Frames get dense offsets; segment files are named after the offset of their first frame, so a
reader that starts late (segments before it deleted) still knows every offset. The spool's
streaming source (connectors/streams/spool_stream.py) hands Spark frame descriptors; the batch reads
the frames here. A segment is deleted once every frame in it belongs to a micro-batch Spark
has committed.

Frame: magic `LFS1`, u32 header length, u64 body length, u32 CRC-32 of header+body, the
header (JSON: offset, rows, received time, idempotency key, event time), the body.
"""

from __future__ import annotations

import errno
import json
import os
import struct
import threading
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa

from lakefeed import clock, log
from lakefeed.inbox.segments import DurableMark, SpoolWriteError, hold, read_mark, write_durably

MAGIC = b"LFS1"
_HEAD = struct.Struct(">4sIQI")
SUFFIX = ".spool"
_KEYS = "idempotency.log"
_WRITER_LOCK = "writer.lock"
_log = log.get(__name__)


@dataclass(frozen=True, slots=True)
class Entry:
    """One acknowledged request: where its frame is, and what the producer was told."""

    offset: int
    segment: str
    position: int
    length: int
    rows: int
    received_at: str
    key: str | None
    event_time: str | None

    def as_tuple(self) -> tuple:
        return (self.offset, self.segment, self.position, self.length, self.rows, self.received_at, self.key,
                self.event_time)


SPARK_SCHEMA = ("offset long, segment string, position long, length long, rows long, received_at string, "
                "key string, event_time string")


def encode(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _frame(header: dict, body: bytes) -> bytes:
    head = json.dumps(header, separators=(",", ":")).encode()
    crc = zlib.crc32(body, zlib.crc32(head))
    return _HEAD.pack(MAGIC, len(head), len(body), crc) + head + body


def _scan(path: Path, start: int, limit: float = float("inf")) -> Iterator[tuple[int, int, dict]]:
    """(position, frame length, header) of each complete frame from `start` ending by `limit`; stops at a torn tail."""
    with open(path, "rb") as f:
        f.seek(start)
        pos = start
        while True:
            raw = f.read(_HEAD.size)
            if len(raw) < _HEAD.size:
                return
            magic, head_len, body_len, _ = _HEAD.unpack(raw)
            if magic != MAGIC:
                return
            head = f.read(head_len)
            if len(head) < head_len:
                return
            f.seek(body_len, os.SEEK_CUR)
            total = _HEAD.size + head_len + body_len
            if f.tell() > os.fstat(f.fileno()).st_size or pos + total > limit:
                return
            yield pos, total, json.loads(head)
            pos += total


def _segments(folder: Path) -> list[Path]:
    return sorted(folder.glob(f"*{SUFFIX}"))


class DamagedFrame(ValueError):
    """Frame bytes that no longer match their CRC: the same on every read, so the data's fault (quarantined)."""


def read_entry(folder: Path, entry: Entry) -> pa.Table:
    """The records of one frame (checked against its CRC)."""
    data = frame_bytes(folder, entry)
    magic, head_len, body_len, crc = _HEAD.unpack_from(data) if len(data) >= _HEAD.size else (b"", 0, -1, 0)
    head = data[_HEAD.size:_HEAD.size + head_len]
    body = data[_HEAD.size + head_len:]
    if magic != MAGIC or len(body) != body_len or zlib.crc32(body, zlib.crc32(head)) != crc:
        raise DamagedFrame(f"spool frame {entry.offset} in {folder / entry.segment} is damaged (its CRC does not "
                           "match)")
    return pa.ipc.open_stream(body).read_all()


def frame_bytes(folder: Path, entry: Entry) -> bytes:
    """A frame as it is on disk, header and all."""
    with open(folder / entry.segment, "rb") as f:
        f.seek(entry.position)
        return f.read(entry.length)


@dataclass(frozen=True, slots=True)
class Pending:
    body: bytes
    rows: int
    key: str | None
    event_time: str | None


class Spool:
    """The writing side (daemon process): appended by `GroupCommit`, released by the batch."""

    def __init__(self, folder: Path, segment_bytes: int, ttl_s: float, lock_timeout_s: float = 10.0) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self._lock_fd: int | None = hold(folder / _WRITER_LOCK, lock_timeout_s)
        self._segment_bytes = segment_bytes
        self._ttl_s = ttl_s
        self.keys: dict[str, Entry] = {}  # in the order the requests came
        self._segment_keys: dict[str, list[Entry]] = {}  # the keyed entries of each segment on disk
        self._sizes: dict[str, tuple[int, int]] = {}  # segment -> (first offset, bytes)
        self._next = 0
        self._fd: int | None = None
        self._current: Path | None = None
        self._lock = threading.Lock()
        self._bytes = 0
        self._mark = DurableMark(folder)
        self._load()

    def _load(self) -> None:
        self._load_keys()
        for path in _segments(self.folder):
            first = int(path.stem)
            good = 0
            count = 0
            for pos, length, head in _scan(path, 0):
                good = pos + length
                count += 1
                if head.get("k"):
                    self._remember(_entry(path.name, pos, length, head))
            if good != path.stat().st_size:
                # A crash mid-append left a torn frame: it was never acknowledged, so drop it.
                with open(path, "r+b") as f:
                    f.truncate(good)
                    os.fsync(f.fileno())
                _log.warning("spool.torn_tail_dropped", segment=str(path), bytes=good)
            self._sizes[path.name] = (first, good)
            self._bytes += good
            self._next = first + count
            self._current = path
        if self._current is not None:
            self._fd = os.open(self._current, os.O_WRONLY | os.O_APPEND)
        self._mark.set(*((self._current.name, self._sizes[self._current.name][1]) if self._current else ("", 0)))

    def _load_keys(self) -> None:
        path = self.folder / _KEYS
        if not path.exists():
            return
        horizon = clock.now().timestamp() - self._ttl_s
        kept = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                item = json.loads(line)
            except ValueError:
                continue  # a torn last line
            if clock.from_cdm(item["received_at"]).timestamp() >= horizon:
                self.keys[item["key"]] = Entry(**item)
                kept.append(line)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
        os.replace(tmp, path)

    @property
    def next_offset(self) -> int:
        return self._next

    def bytes(self) -> int:
        """Bytes in the spool's segments (read without waiting for a write in progress)."""
        return self._bytes

    def known(self, key: str) -> Entry | None:
        """The entry of an earlier request with this Idempotency-Key."""
        with self._lock:
            return self.keys.get(key)

    def append(self, items: list[Pending]) -> list[Entry]:
        """Append frames and fsync once; return their entries (the acknowledgement).

        One writer (GroupCommit): the write and fsync run outside the lock, so idempotency
        lookups and releases never wait for the disk."""
        with self._lock:
            if self._current is None or self._sizes[self._current.name][1] >= self._segment_bytes:
                self._rotate()
            assert self._current is not None and self._fd is not None
            name, fd = self._current.name, self._fd
            first, position = self._sizes[name]
        start = position
        stamp = clock.to_cdm(clock.now())
        frames, entries = [], []
        for item in items:
            header = {"o": self._next + len(entries), "n": item.rows, "t": stamp, "k": item.key, "e": item.event_time}
            frame = _frame(header, item.body)
            entries.append(_entry(name, position, len(frame), header))
            frames.append(frame)
            position += len(frame)
        write_durably(fd, frames, start)
        self._mark.set(name, position)
        with self._lock:
            self._bytes += position - self._sizes[name][1]
            self._sizes[name] = (first, position)
            self._next += len(entries)
            for entry in entries:
                if entry.key:
                    self._remember(entry)
        return entries

    def _remember(self, entry: Entry) -> None:
        assert entry.key is not None
        self.keys[entry.key] = entry
        self._segment_keys.setdefault(entry.segment, []).append(entry)

    def _rotate(self) -> None:
        """Start the next segment. Nothing changes unless it is created and its name made durable: a full disk
        is a SpoolWriteError (the request a 507), and the next append tries again."""
        path = self.folder / f"{self._next:020d}{SUFFIX}"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        except OSError as exc:
            raise _write_error(exc) from exc
        try:
            size = os.fstat(fd).st_size
            dir_fd = os.open(self.folder, os.O_RDONLY)
            try:
                os.fsync(dir_fd)  # the new segment's name is durable before anything in it is acknowledged
            finally:
                os.close(dir_fd)
        except OSError as exc:
            os.close(fd)
            raise _write_error(exc) from exc
        if self._fd is not None:
            os.close(self._fd)
        self._current, self._fd = path, fd
        self._sizes.setdefault(path.name, (self._next, size))

    def release(self, below: int) -> int:
        """Delete segments whose frames all have offsets below `below`; return how many.

        Their idempotency keys move to the key log first, so a retry still finds them. The lock is
        held only to take the segments off the books: appends never wait for the files' deletion.
        """
        with self._lock:
            self._expire()
            names = sorted(self._sizes)
            gone = []
            for name, following in zip(names, [*names[1:], None], strict=True):
                if following is None or self._sizes[following][0] > below:
                    break  # the segment being written, or one holding frames not yet committed
                gone.append(name)
                self._bytes -= self._sizes.pop(name)[1]
            keys = [e for name in gone for e in self._segment_keys.pop(name, [])]
        if keys:
            with open(self.folder / _KEYS, "a", encoding="utf-8") as f:
                f.write("".join(json.dumps(asdict(e)) + "\n" for e in keys))
                f.flush()
                os.fsync(f.fileno())
        for name in gone:
            (self.folder / name).unlink()
        return len(gone)

    def _expire(self) -> None:
        """Forget keys remembered long enough (a retry this late is a new request). Keys are in the order they
        came, so the expired ones are a prefix: this looks at them and one more, not at every key."""
        horizon = clock.now().timestamp() - self._ttl_s
        expired = []
        for key, entry in self.keys.items():
            if entry.segment in self._sizes or clock.from_cdm(entry.received_at).timestamp() >= horizon:
                break
            expired.append(key)
        for key in expired:
            del self.keys[key]

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._lock_fd is not None:
            self._mark.close()
            os.close(self._lock_fd)  # releases the lock
            self._lock_fd = None


def _write_error(exc: OSError) -> SpoolWriteError:
    no_space = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return SpoolWriteError(f"the spool could not start a segment: {exc.strerror or exc}", no_space)


def _entry(segment: str, position: int, length: int, head: dict) -> Entry:
    return Entry(head["o"], segment, position, length, head["n"], head["t"], head.get("k"), head.get("e"))


class _Tail:
    """Follows a spool's segments as they grow (released ones skipped): `_new_frames` yields the frames
    appended since the last call."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self._first: int | None = None  # the first offset of the first segment seen
        self._segment: str | None = None
        self._position = 0
        self._mark: tuple[str, int] | None = None  # the writer's durable mark (segments.DurableMark)

    def _new_frames(self) -> Iterator[tuple[str, int, int, dict]]:
        self._mark = read_mark(self.folder, self._mark)
        for path in _segments(self.folder):
            if self._segment is not None and path.name < self._segment:
                continue
            if self._mark is not None and path.name > self._mark[0]:
                return  # nothing in it is durable yet
            if path.name != self._segment:
                self._segment, self._position = path.name, 0
                if self._first is None:
                    self._first = int(path.stem)
            try:
                limit = self._mark[1] if self._mark is not None and path.name == self._mark[0] else float("inf")
                for pos, length, head in _scan(path, self._position, limit):
                    self._position = pos + length
                    yield path.name, pos, length, head
            except FileNotFoundError:
                continue  # released meanwhile


class SpoolEnd(_Tail):
    """The offset after a spool's last complete frame: each call reads only the headers of frames appended
    since the last one, and keeps nothing of them."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self._end = 0

    def __call__(self) -> int:
        for _, _, _, head in self._new_frames():
            self._end = head["o"] + 1
        # A segment starts at the offset after the frames before it (it may hold none yet).
        return max(self._end, int(Path(self._segment).stem) if self._segment else 0)


class SpoolReader(_Tail):
    """The reading side, in Spark's planner process: indexes frames appended since the last call."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self._entries: list[Entry] = []  # consecutive offsets from self._first (moved on by forget)

    def refresh(self) -> int:
        """Index what was appended; return the offset after the last complete frame."""
        self._entries.extend(_entry(name, pos, length, head) for name, pos, length, head in self._new_frames())
        return self.end()

    def end(self) -> int:
        return (self._first or 0) + len(self._entries)

    def start(self) -> int:
        return self._first or 0

    def entries(self, start: int, end: int) -> list[Entry]:
        if end > self.end():
            self.refresh()
        base = self._first or 0
        return self._entries[max(0, start - base):max(0, end - base)]

    def forget(self, below: int) -> None:
        """Drop index entries Spark will not ask for again."""
        if self._first is not None and below > self._first:
            drop = min(below - self._first, len(self._entries))
            del self._entries[:drop]
            self._first += drop
