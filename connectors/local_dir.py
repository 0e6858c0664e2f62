"""A local landing folder as a source: inotify events through watchdog, plus listings.

A file is enqueued once nobody has it open for writing: at once when its writer closes it
(IN_CLOSE_WRITE) or when it is renamed into place, and, for a file that appears some other
way (moved in from outside the watched tree, or found by a listing), as soon as a read
lease shows no writer is left. Where leases are not available (another owner, a network
file system) a file counts as finished when its size and mtime have not changed for
`settle_s`. A listing at start-up and every `reconcile_interval_s` enqueues files whose
events were missed or that landed while the daemon was down. Names starting with `.` or
`_`, temporary suffixes and CDM documents are never data.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
from pathlib import Path

from watchdog.events import (
    FileClosedEvent,
    FileCreatedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer

from lakefeed import log
from lakefeed.connectors.base import Source
from lakefeed.inbox import FileEvent, Inbox

_IGNORED_SUFFIXES = (".tmp", ".temp", ".partial", "._COPYING_", ".crc", ".cdm.json")
_log = log.get(__name__)


def is_data_file(path: str) -> bool:
    name = os.path.basename(path)
    return not (name.startswith((".", "_")) or name.endswith(_IGNORED_SUFFIXES) or name == "model.json")


def being_written(path: str) -> bool | None:
    """True if some process has the file open for writing, False if not, None if we cannot tell.

    A read lease (F_SETLEASE) is refused with EAGAIN exactly when the file is open for writing.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        return False
    except OSError as exc:
        return True if exc.errno in (errno.EAGAIN, errno.EBUSY) else None
    finally:
        os.close(fd)


class _Handler(FileSystemEventHandler):
    def __init__(self, source: LocalDirSource) -> None:
        self._source = source

    def on_closed(self, event: FileSystemEvent) -> None:
        if isinstance(event, FileClosedEvent) and not event.is_directory:
            self._source.offer_path(str(event.src_path))

    def on_moved(self, event: FileSystemEvent) -> None:
        if isinstance(event, FileMovedEvent) and not event.is_directory:
            self._source.offer_path(str(event.dest_path))

    def on_created(self, event: FileSystemEvent) -> None:
        if isinstance(event, FileCreatedEvent) and not event.is_directory:
            self._source.offer_when_finished(str(event.src_path))


class LocalDirSource(Source):
    def __init__(self, entity: str, root: Path, inbox: Inbox, reconcile_interval_s: float,
                 excluded: tuple[Path, ...] = (), settle_s: float = 2.0) -> None:
        self.entity = entity
        self.root = root
        self._inbox = inbox
        self._interval = reconcile_interval_s
        self._excluded = tuple(str(p) + os.sep for p in excluded)
        self._settle_s = settle_s
        self._pending: dict[str, tuple[float, int, int]] = {}  # path -> (since, size, mtime_ns)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._observer = Observer()
        self._thread = threading.Thread(target=self._loop, name=f"source-{entity}", daemon=True)

    def _wanted(self, path: str) -> bool:
        return is_data_file(path) and not path.startswith(self._excluded)

    def offer_path(self, path: str) -> None:
        """The file is complete (closed after writing, or renamed into place)."""
        with self._lock:
            self._pending.pop(path, None)
        if self._stop.is_set() or not self._wanted(path):
            return
        try:
            event = FileEvent.of(path)
        except FileNotFoundError:
            return  # gone again before we looked; nothing to ingest
        for rec in self._inbox.offer([event]):
            _log.info("file.enqueued", entity=self.entity, file=rec.path, offset=rec.offset, size=rec.size)

    def offer_when_finished(self, path: str) -> None:
        """A file appeared without telling whether it is complete: take it once nobody writes it."""
        if self._stop.is_set() or not self._wanted(path):
            return
        if (event := self._finished(path)) is not None:
            self.offer_path(event.path)

    def _finished(self, path: str) -> FileEvent | None:
        """The file if nobody writes it; else None, after queueing it to settle when we cannot tell."""
        try:
            writing = being_written(path)
            event = FileEvent.of(path)
        except FileNotFoundError:
            return None
        if writing is None:
            with self._lock:
                self._pending.setdefault(path, (time.monotonic(), event.size, event.mtime_ns))
        # writing is True: its writer's close event will offer it
        return event if writing is False else None

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._observer.schedule(_Handler(self), str(self.root), recursive=True)
        self._observer.start()
        # After the observer is watching, so a file landing now is seen by one or the other.
        found = self.reconcile()
        _log.info("source.started", entity=self.entity, root=str(self.root), backlog_found=found)
        self._thread.start()

    def reconcile(self) -> int:
        """Enqueue finished files the inbox has not seen; files still being written wait for their close."""
        finished = []
        for folder, dirs, files in os.walk(self.root):
            dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
            for name in files:
                path = os.path.join(folder, name)
                if self._wanted(path) and (event := self._finished(path)) is not None:
                    finished.append(event)
        finished.sort(key=lambda e: (e.mtime_ns, e.path))
        return len(self._inbox.offer(finished))

    def _settle(self) -> None:
        """Offer pending files whose size and mtime stood still for settle_s."""
        now = time.monotonic()
        with self._lock:
            pending = list(self._pending.items())
        for path, (since, size, mtime_ns) in pending:
            try:
                st = os.stat(path)
            except FileNotFoundError:
                with self._lock:
                    self._pending.pop(path, None)
                continue
            if (st.st_size, st.st_mtime_ns) != (size, mtime_ns):
                with self._lock:
                    self._pending[path] = (now, st.st_size, st.st_mtime_ns)
            elif now - since >= self._settle_s:
                self.offer_path(path)

    def _loop(self) -> None:
        next_listing = time.monotonic() + self._interval
        while not self._stop.wait(min(0.25, self._settle_s / 4)):
            self._settle()
            if time.monotonic() < next_listing:
                continue
            next_listing = time.monotonic() + self._interval
            try:
                found = self.reconcile()
            except OSError as exc:
                _log.warning("source.reconcile_failed", entity=self.entity, error=str(exc))
                continue
            if found:
                _log.warning("source.missed_events", entity=self.entity, files=found)

    def stop(self) -> None:
        self._stop.set()
        if self._observer.is_alive():
            self._observer.stop()
            self._observer.join(timeout=10)
