"""A local landing folder as a source: inotify events through watchdog, plus listings.

Any event on a file (closed after writing, renamed into place, moved in from outside the
watched tree, created by a copy of a whole folder) puts it on a short wait; once it has been
quiet for `quiet_s` it is enqueued if nobody has it open for writing, which a read lease
tells (F_SETLEASE is refused exactly then). A file still being written waits for its close
event. Where leases are not available (another owner, a network file system) a file counts
as finished once its mtime is `settle_s` old. A file deleted or moved away is enqueued as a
removal, once the inbox holds it. A listing at start-up and every `reconcile_interval_s`
enqueues files whose events were missed or that landed while the daemon was down, and the
removal of each file the inbox holds that the listing no longer finds. Names starting with `.`
or `_` (files or folders), temporary suffixes and CDM documents are never data.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
import time
import warnings
from pathlib import Path

from watchdog.events import (
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer

from lakefeed import log
from lakefeed.connectors.sources.base import Source
from lakefeed.errors import TransientError
from lakefeed.inbox.files import FileEvent, Inbox, not_regular

_IGNORED_SUFFIXES = (".tmp", ".temp", ".partial", "._COPYING_", ".crc", ".cdm.json")
_log = log.get(__name__)
# When a tree is copied in, watchdog may add a new folder to its recursive watch twice (its create event and its
# own walk race); it keeps one callback, as intended, but says so with a RuntimeWarning in its thread.
warnings.filterwarnings("ignore", message="Callback with id", category=RuntimeWarning)


def shown(path: str) -> str:
    """The path as the inbox records it: valid UTF-8, so patterns still match it."""
    try:
        path.encode("utf-8")
        return path
    except UnicodeEncodeError:
        return os.fsencode(path).decode("utf-8", "replace")


def landed(path: str, root: str, follow_symlinks: bool) -> FileEvent:
    """The file as the inbox records it. One that cannot be taken (a name that is not UTF-8, a link, a FIFO, a
    socket, …) is recorded with the reason, and goes to quarantine unread: it is never opened here, since opening
    a FIFO blocks and a link may lead anywhere. Raises OSError (FileNotFoundError: gone)."""
    st = os.lstat(path)
    if (name := shown(path)) != path:
        return FileEvent(name, st.st_size, st.st_mtime_ns, problem="the file name is not valid UTF-8; rename it")
    problem = ""
    if stat.S_ISLNK(st.st_mode):
        real = os.path.realpath(path)
        if not follow_symlinks:
            problem = "a symbolic link; links are not followed (source.follow_symlinks takes those inside the folder)"
        elif os.path.commonpath([real, os.path.realpath(root)]) != os.path.realpath(root):
            problem = f"a symbolic link to {real}, outside the landing folder"
        else:
            st = os.stat(path)
    problem = problem or not_regular(st.st_mode)
    return FileEvent(path, st.st_size, st.st_mtime_ns, problem=problem)


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

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.is_directory:
            return
        if isinstance(event, FileMovedEvent):
            self._source.note(str(event.src_path))  # gone from there (a removal, if the inbox holds it)
            self._source.note(str(event.dest_path))
        elif isinstance(event, FileClosedEvent | FileCreatedEvent | FileDeletedEvent):
            self._source.note(str(event.src_path))
        elif isinstance(event, FileModifiedEvent):
            self._source.touch(str(event.src_path))


class LocalDirSource(Source):
    def __init__(self, entity: str, root: Path, inbox: Inbox, reconcile_interval_s: float,
                 excluded: tuple[Path, ...] = (), quiet_s: float = 0.2, settle_s: float = 2.0,
                 follow_symlinks: bool = False, complete_marker: str | None = None) -> None:
        self.entity = entity
        self.root = root
        self._marker = complete_marker
        self._held: dict[str, set[str]] = {}  # folder -> files waiting for its complete_marker
        self._follow = follow_symlinks
        self._inbox = inbox
        self._interval = reconcile_interval_s
        self._excluded = tuple(str(p) + os.sep for p in excluded)
        self._quiet_s = quiet_s
        self._settle_s = settle_s
        self._pending: dict[str, float] = {}  # path -> when it is due for a look
        self._blocked: set[str] = set()  # what the last listing could not look at
        self._reported: set[str] = set()  # what was logged as unlistable (again only after it could be looked at)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._observer = Observer()
        self._thread = threading.Thread(target=self._loop, name=f"source-{entity}", daemon=True)

    def _wanted(self, path: str) -> bool:
        if not is_data_file(path) or path.startswith(self._excluded):
            return False
        folders = os.path.relpath(os.path.dirname(path), self.root)
        return folders == "." or not any(f.startswith((".", "_")) for f in folders.split(os.sep))

    def note(self, path: str) -> None:
        """Something happened to a file: look at it once it has been quiet for quiet_s.

        The short wait lets `cp -p`, rsync and the like set the final mtime after closing the
        file, so one landing is one identity, not two.
        """
        if self._marker and os.path.basename(path) == self._marker:
            with self._lock:  # a folder's marker: what waited for it is looked at now
                for held in self._held.pop(os.path.dirname(path), ()):
                    self._pending[held] = time.monotonic() + self._quiet_s
        elif self._wanted(path):
            with self._lock:
                self._pending[path] = time.monotonic() + self._quiet_s

    def touch(self, path: str) -> None:
        """A write or attribute change: postpone the look at a file that is already due for one."""
        with self._lock:
            if path in self._pending:
                self._pending[path] = time.monotonic() + self._quiet_s

    def _gone(self, path: str) -> FileEvent | None:
        """The removal of a file that is gone, if the inbox holds it. A path that cannot be looked at (a folder on
        the way that may not be read) is not gone: its removal would have the file taken again once it can be."""
        try:
            os.lstat(path)
            return None
        except (FileNotFoundError, NotADirectoryError):
            pass
        except OSError as exc:
            self._unlistable(path, exc)
            return None
        if not self._inbox.present(shown(path)):
            return None
        return FileEvent(shown(path), 0, time.time_ns(), removed=True)

    def _unlistable(self, path: str, exc: OSError) -> None:
        """A path that cannot be looked at is neither taken nor removed until it can; said once, not per listing."""
        self._blocked.add(path)
        if path not in self._reported:
            self._reported.add(path)
            _log.warning("file.unlistable", entity=self.entity, file=os.fsencode(path).decode("utf-8", "replace"),
                         error=str(exc))

    def _unreadable_folder(self, exc: OSError) -> None:
        """os.walk could not list a folder: what the inbox holds under it is unknown, not gone."""
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR):  # removed while listed: its files are gone
            self._unlistable(str(exc.filename), exc)

    def _look(self, path: str) -> FileEvent | None:
        """The file if nobody writes it, or its removal; None if still written, or it must settle longer."""
        try:
            event = landed(path, str(self.root), self._follow)
        except FileNotFoundError:
            return self._gone(path)
        except OSError as exc:  # e.g. a name too long, a folder on the way that may not be read
            self._unlistable(path, exc)
            return None
        if event.problem:
            return event  # taken as it is, for the quarantine
        if self._marker and (folder := self._incomplete(path)) is not None:
            with self._lock:
                self._held.setdefault(folder, set()).add(path)
            return None
        try:
            writing = being_written(path)
        except FileNotFoundError:
            return self._gone(path)
        except OSError:
            writing = None  # e.g. no permission to open it: the batch says so in quarantine, once it settled
        if writing is None:  # no lease here: wait until size and mtime stood still for settle_s
            age_ns = time.time_ns() - event.mtime_ns
            if age_ns < self._settle_s * 1e9:
                with self._lock:
                    self._pending[path] = time.monotonic() + self._settle_s - age_ns / 1e9
                return None
        return event if not writing else None  # a writer still has it: its close event comes

    def _incomplete(self, path: str) -> str | None:
        """The folder (right under the root) a file is in, if it does not hold a non-empty marker yet."""
        relative = os.path.relpath(path, self.root)
        if os.sep not in relative:
            return None
        folder = os.path.join(str(self.root), relative.split(os.sep, 1)[0])
        try:
            return None if os.stat(os.path.join(folder, str(self._marker))).st_size > 0 else folder
        except OSError:
            return folder

    def _offer(self, events: list[FileEvent]) -> int:
        added = self._inbox.offer(events)
        for rec in added:
            _log.info("file.removed" if rec.removed else "file.enqueued", entity=self.entity, file=rec.path,
                      offset=rec.offset, size=rec.size)
        return len(added)

    def _due(self) -> None:
        now = time.monotonic()
        with self._lock:
            due = [p for p, t in self._pending.items() if t <= now]
            for path in due:
                del self._pending[path]
        events = [e for e in map(self._look, due) if e is not None]
        if events and not self._stop.is_set():
            self._offer(events)

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._observer.schedule(_Handler(self), str(self.root), recursive=True)
        self._observer.start()
        # After the observer is watching, so a file landing now is seen by one or the other.
        try:
            found = self.reconcile()
        except TransientError as exc:  # e.g. the inbox's disk is full: the next listing takes what this one found
            _log.warning("source.reconcile_failed", entity=self.entity, error=str(exc))
            found = 0
        _log.info("source.started", entity=self.entity, root=str(self.root), backlog_found=found)
        self._thread.start()

    def reconcile(self) -> int:
        """Enqueue finished files the inbox has not seen (files still being written wait for their close), and
        the removal of files it holds that are gone."""
        finished, there = [], set()
        self._blocked = set()
        for folder, dirs, files in os.walk(self.root, onerror=self._unreadable_folder):
            dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
            for name in files:
                path = os.path.join(folder, name)
                there.add(shown(path))
                if self._wanted(path) and (event := self._look(path)) is not None:
                    finished.append(event)
        finished.sort(key=lambda e: (e.mtime_ns, e.path))
        unknown = tuple(shown(folder) + os.sep for folder in self._blocked)
        missing = sorted(p for p in self._inbox.listed(str(self.root))
                         if p not in there and self._wanted(p) and not p.startswith(unknown))
        gone = [e for e in map(self._gone, missing) if e is not None]
        self._reported &= self._blocked  # what could be looked at again is said again should that change
        return self._offer(finished + gone)

    def failure(self) -> str | None:
        if self._stop.is_set() or not self._thread.is_alive() and self._thread.ident is None:
            return None  # stopping, or not started yet
        if not self._thread.is_alive():
            return "the landing folder's source thread has stopped"
        if not self._observer.is_alive():
            return "the landing folder's watch (inotify) has stopped"
        return None

    def _loop(self) -> None:
        next_listing = time.monotonic() + self._interval
        while not self._stop.wait(min(0.05, self._quiet_s / 2)):
            try:
                self._due()
            except Exception as exc:  # one file must not stop the folder's intake; what it was is logged
                _log.exception("source.look_failed", entity=self.entity, error=str(exc))
            if time.monotonic() < next_listing:
                continue
            next_listing = time.monotonic() + self._interval
            try:
                found = self.reconcile()
            except (OSError, TransientError) as exc:  # e.g. the inbox's disk is full: the next listing tries again
                _log.warning("source.reconcile_failed", entity=self.entity, error=str(exc))
                continue
            if found:
                _log.warning("source.missed_events", entity=self.entity, files=found)

    def stop(self) -> None:
        self._stop.set()
        if self._observer.is_alive():
            self._observer.stop()
            self._observer.join(timeout=10)
