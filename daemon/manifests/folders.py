"""What an entity's MSC manifests list, derived from committed state after every batch (as the CDM manifest is):

- the landing folder: every regular file the entity's inbox took in (durably, before any batch reads it), a later
  version of a file replacing the earlier, a removal removing it (keys relative to the folder; the manifests
  themselves excluded);
- each output table: the data files of its current Delta version, read from the Delta log commit by commit
  (adds and removes), with the files' own sizes and modification times.

A crash between a commit and the manifest write is repaired by the next refresh: each manifest records how far it
applied (an inbox offset, a Delta version), and the next refresh applies the rest.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

import pyarrow.fs as pafs
from deltalake import DeltaTable

from lakefeed import log
from lakefeed.config.model import EntityConfig
from lakefeed.config.sources import LocalDirSource
from lakefeed.connectors.sinks import delta_log
from lakefeed.inbox import storage as storage_
from lakefeed.inbox.files import InboxReader
from lakefeed.inbox.storage import Storage
from lakefeed.manifests.msc import MscWriter, Obj

_log = log.get(__name__)


def landing_manifest(cfg: EntityConfig) -> str | None:
    """The landing folder's MSC manifest folder, if kept (the landing source must not take its files in)."""
    if not cfg.msc.landing.enabled or cfg.source is None:
        return None
    root = str(cfg.source.path) if isinstance(cfg.source, LocalDirSource) else cfg.source.url
    return posixpath.join(root.rstrip("/"), cfg.msc.landing.path)


class FolderManifests:
    """The MSC manifests an entity's config asks for (`msc.landing`, `msc.tables`)."""

    def __init__(self, cfg: EntityConfig, storage: Storage) -> None:
        self.cfg, self._storage = cfg, storage
        self.landing: MscWriter | None = None
        self._landing_root = ""
        if cfg.msc.landing.enabled and cfg.source is not None:
            if isinstance(cfg.source, LocalDirSource):
                self._landing_root = str(cfg.source.path)
            else:
                self._landing_root = cfg.source.url
            fs, root = self._storage.fs_of(self._landing_root)
            self.landing = MscWriter(fs, root, cfg.msc.landing)
        self.tables: dict[str, MscWriter] = {}
        if cfg.msc.tables.enabled:
            for location in (cfg.table, cfg.changelog, cfg.quarantine, cfg.history, cfg.tombstones):
                fs, root = self._storage.fs_of(str(location))
                self.tables[str(location)] = MscWriter(fs, root, cfg.msc.tables)
        self._inbox = InboxReader(cfg.state / "inbox")


    def refresh(self) -> None:
        """Bring every manifest up to what is committed: the landing one to the inbox's records (each durable
        before any batch takes it), the tables' ones to their latest Delta versions."""
        if self.landing is not None:
            self._refresh_landing(self._inbox.refresh())
        for location, writer in self.tables.items():
            self._refresh_table(location, writer)

    def _refresh_landing(self, end: int) -> None:
        assert self.landing is not None
        start = self.landing.applied + 1
        if start >= end:
            return
        put: dict[str, Obj] = {}
        removed: set[str] = set()
        own = landing_manifest(self.cfg) or ""
        for rec in self._inbox.records(start, end):
            key = self._key(rec.path)
            if key is None or rec.path.startswith(own + "/") or (rec.problem and not rec.removed):
                continue  # outside the folder, a manifest of lakefeed's, or not a regular file
            if rec.removed:
                removed.add(key)
                put.pop(key, None)
            else:
                put[key] = Obj.of(rec.size, rec.mtime_ns)
                removed.discard(key)
        version = self.landing.update(put, removed, end - 1)
        if version:
            _log.info("msc.written", entity=self.cfg.name, manifest=self.landing.base, version=version,
                      put=len(put), removed=len(removed))

    def _key(self, path: str) -> str | None:
        root = self._landing_root.rstrip("/") + "/"
        if storage_.is_s3(path):
            return path[len(root):] if path.startswith(root) else None
        relative = os.path.relpath(path, self._landing_root)
        return None if relative.startswith("..") else Path(relative).as_posix()

    def _refresh_table(self, location: str, writer: MscWriter) -> None:
        fs, root = self._storage.fs_of(location)
        changes = delta_log.changes_after(fs, root, writer.applied, self._storage.delta_options(location), location)
        if changes is None:
            return
        removed = set(writer.listing()) - changes.added.keys() if changes.whole else changes.removed
        stats = fs.get_file_info(list(changes.added.values())) if changes.added else []
        objects = {key: Obj.of(info.size, info.mtime_ns) for key, info in zip(changes.added, stats, strict=True)
                   if info.type == pafs.FileType.File}
        version = writer.update(objects, removed, changes.latest)
        if version:
            _log.info("msc.written", entity=self.cfg.name, manifest=writer.base, version=version,
                      put=len(objects), removed=len(removed))

    def check(self) -> list[str]:
        """Where a table's manifest disagrees with the table's current version (for `lakefeed verify`)."""
        problems = []
        for location, writer in self.tables.items():
            fs, root = self._storage.fs_of(location)
            if delta_log.latest_version(fs, root) is None:
                continue
            table = DeltaTable(location, storage_options=self._storage.delta_options(location))
            wanted = set(delta_log.table_files(table))
            listed = set(writer.listing())
            if listed != wanted:
                problems.append(f"MSC manifest {writer.base} lists {len(listed)} files, the table at version "
                                f"{table.version()} has {len(wanted)} ({len(listed - wanted)} not in the table, "
                                f"{len(wanted - listed)} missing)")
        return problems
