"""Noticing that the config file changed on disk (edited in place or replaced by a rename)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from lakefeed import log

DEBOUNCE_S = 0.5
_log = log.get(__name__)


class ConfigWatcher(FileSystemEventHandler):
    """Calls `on_change` once the file, or a file it names that describes data (a YAML data manifest, the
    manifests of a cdm_root tree), has been quiet for DEBOUNCE_S after a change somebody else made."""

    def __init__(self, path: Path, on_change: Callable[[], None], described_by: tuple[Path, ...] = (),
                 written_here: Callable[[Path], bool] = lambda path: False) -> None:
        self.path = path.resolve()
        self._on_change = on_change
        self._written_here = written_here  # a file lakefeed itself just wrote (a manifest of a tree) is no change
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()
        self._observer = Observer()
        self._observer.daemon = True
        self._files: set[str] = set()
        self._folders: set[str] = set()
        self.watch((self.path, *described_by))

    def watch(self, paths: tuple[Path, ...]) -> None:
        """Watch these files too (a reload may name new ones)."""
        with self._lock:
            for path in paths:
                path = path.resolve()
                self._files.add(str(path))
                # The folder, not the file: an editor or `mv` replaces the file, and its inode with it.
                if str(path.parent) not in self._folders and path.parent.is_dir():
                    self._folders.add(str(path.parent))
                    self._observer.schedule(self, str(path.parent), recursive=False)

    def start(self) -> None:
        self._observer.start()

    def on_any_event(self, event: FileSystemEvent) -> None:
        paths = {event.src_path, getattr(event, "dest_path", "")}
        if event.event_type in ("opened", "closed_no_write") or not paths & self._files:
            return
        if all(self._written_here(Path(str(p))) for p in paths & self._files):
            return
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = threading.Timer(DEBOUNCE_S, self._fire)
            self._timer.daemon = True
            self._timer.start()

    def _fire(self) -> None:
        _log.info("config.changed", path=str(self.path))
        self._on_change()

    def stop(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
        if self._observer.is_alive():
            self._observer.stop()
            self._observer.join(5)
