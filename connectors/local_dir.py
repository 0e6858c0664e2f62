"""A local landing folder as a source: inotify events through watchdog, plus listings.

A file is enqueued when the writer closes it (IN_CLOSE_WRITE) or when it is renamed into
the folder, never at creation, so a half-written file is not read. A listing at start-up
and every `reconcile_interval_s` enqueues files whose events were missed (or that arrived
while the daemon was down); it leaves alone files modified within the last `settle_s`, which
a writer may still be writing. Names starting with `.` or `_`, temporary suffixes and CDM
documents are never data.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from lakefeed import log
from lakefeed.connectors.base import Source
from lakefeed.inbox import FileEvent, Inbox
from watchdog.events import FileClosedEvent, FileMovedEvent, FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

_IGNORED_SUFFIXES = (".tmp", ".temp", ".partial", "._COPYING_", ".crc", ".cdm.json")
_log = log.get(__name__)


def is_data_file(path: str) -> bool:
    name = os.path.basename(path)
    return not (name.startswith((".", "_")) or name.endswith(_IGNORED_SUFFIXES) or name == "model.json")


class _Handler(FileSystemEventHandler):
    def __init__(self, source: LocalDirSource) -> None:
        self._source = source

    def on_closed(self, event: FileSystemEvent) -> None:
        if isinstance(event, FileClosedEvent) and not event.is_directory:
            self._source.offer_path(str(event.src_path))

    def on_moved(self, event: FileSystemEvent) -> None:
        if isinstance(event, FileMovedEvent) and not event.is_directory:
            self._source.offer_path(str(event.dest_path))


class LocalDirSource(Source):
    def __init__(self, entity: str, root: Path, inbox: Inbox, reconcile_interval_s: float,
                 excluded: tuple[Path, ...] = (), settle_s: float = 2.0) -> None:
        self.entity = entity
        self.root = root
        self._inbox = inbox
        self._interval = reconcile_interval_s
        self._excluded = tuple(str(p) + os.sep for p in excluded)
        self._settle_ns = int(settle_s * 1e9)
        self._stop = threading.Event()
        self._observer = Observer()
        self._thread = threading.Thread(target=self._reconcile_loop, name=f"reconcile-{entity}", daemon=True)

    def _wanted(self, path: str) -> bool:
        return is_data_file(path) and not path.startswith(self._excluded)

    def offer_path(self, path: str) -> None:
        if self._stop.is_set() or not self._wanted(path):
            return
        try:
            event = FileEvent.of(path)
        except FileNotFoundError:
            return  # gone again before we looked; nothing to ingest
        for rec in self._inbox.offer([event]):
            _log.info("file.enqueued", entity=self.entity, file=rec.path, offset=rec.offset, size=rec.size)

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._observer.schedule(_Handler(self), str(self.root), recursive=True)
        self._observer.start()
        # After the observer is watching, so a file landing now is seen by one or the other.
        found = self.reconcile(settle=False)
        _log.info("source.started", entity=self.entity, root=str(self.root), backlog_found=found)
        self._thread.start()

    def reconcile(self, settle: bool = True) -> int:
        cutoff = _now_ns() - self._settle_ns if settle else None
        events = []
        for folder, dirs, files in os.walk(self.root):
            dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
            for name in files:
                path = os.path.join(folder, name)
                if not self._wanted(path):
                    continue
                try:
                    event = FileEvent.of(path)
                except FileNotFoundError:
                    continue
                if cutoff is None or event.mtime_ns <= cutoff:
                    events.append(event)
        events.sort(key=lambda e: (e.mtime_ns, e.path))
        return len(self._inbox.offer(events))

    def _reconcile_loop(self) -> None:
        while not self._stop.wait(self._interval):
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


def _now_ns() -> int:
    import time

    return time.time_ns()
