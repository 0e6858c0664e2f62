"""What an entity's MSC manifests list, derived from committed state after every batch (as the CDM manifest is):

- the landing folder: every regular file the entity's inbox took in up to the batch, a later version of a file
  replacing the earlier, a removal removing it (keys relative to the folder; the manifests themselves excluded);
- each output table: the data files of its current Delta version, read from the Delta log commit by commit
  (adds and removes), with the files' own sizes and modification times.

A crash between a commit and the manifest write is repaired by the next batch: each manifest records how far it
applied (an inbox offset, a Delta version), and the next refresh applies the rest.
"""

from __future__ import annotations

import json
import os
import posixpath
from pathlib import Path
from urllib.parse import unquote  # noqa: F401 (tests use it as Delta does)

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable

from lakefeed import log
from lakefeed.config.model import EntityConfig
from lakefeed.config.sources import LocalDirSource
from lakefeed.inbox import storage as storage_
from lakefeed.inbox.files import InboxReader
from lakefeed.inbox.storage import Storage
from lakefeed.manifests.msc import MscWriter, Obj

_log = log.get(__name__)
_LOG = "_delta_log"


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
            fs, root = self._fs(self._landing_root)
            self.landing = MscWriter(fs, root, cfg.msc.landing)
        self.tables: dict[str, MscWriter] = {}
        if cfg.msc.tables.enabled:
            for location in (cfg.table, cfg.changelog, cfg.quarantine, cfg.history, cfg.tombstones):
                fs, root = self._fs(str(location))
                self.tables[str(location)] = MscWriter(fs, root, cfg.msc.tables)
        self._inbox = InboxReader(cfg.state / "inbox")

    def excluded(self) -> str | None:
        """The landing manifest's folder (the landing source must not take its files in)."""
        return posixpath.join(self._landing_root.rstrip("/"), self.cfg.msc.landing.path) if self.landing else None

    def _fs(self, location: str) -> tuple[pafs.FileSystem, str]:
        if storage_.is_s3(location):
            return self._storage.filesystem(), location.removeprefix("s3://").rstrip("/")
        return pafs.LocalFileSystem(), os.path.abspath(location)

    def refresh(self, inbox_end: int | None = None) -> None:
        """Bring every manifest up to the committed state: the landing one to inbox offset `inbox_end` (exclusive)
        when a file batch committed, the tables' ones to their latest Delta versions."""
        if self.landing is not None and inbox_end is not None:
            self._refresh_landing(inbox_end)
        for location, writer in self.tables.items():
            self._refresh_table(location, writer)

    def _refresh_landing(self, end: int) -> None:
        assert self.landing is not None
        start = self.landing.applied + 1
        if start >= end:
            return
        put: dict[str, Obj] = {}
        removed: set[str] = set()
        own = self.excluded() or ""
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
        fs, root = self._fs(location)
        applied = writer.applied
        latest = self._latest_version(fs, root, applied)
        if latest is None or latest <= applied:
            return
        put: dict[str, str] = {}  # key -> its path on the file system (to stat)
        removed: set[str] = set()
        commits = [posixpath.join(root, _LOG, f"{v:020d}.json") for v in range(applied + 1, latest + 1)]
        try:
            for commit in commits:
                with fs.open_input_stream(commit) as stream:
                    for line in stream.read().decode().splitlines():
                        action = json.loads(line) if line.strip() else {}
                        if "add" in action:
                            key = unquote(action["add"]["path"])
                            put[key] = posixpath.join(root, key)
                            removed.discard(key)
                        elif "remove" in action:
                            key = unquote(action["remove"]["path"])
                            removed.add(key)
                            put.pop(key, None)
            known = set(writer.listing()) if applied < 0 else set()
        except FileNotFoundError:  # the log was cleaned up past what the manifest has: list the snapshot whole
            known = set(writer.listing())
            table = DeltaTable(location, storage_options=self._storage.delta_options(location))
            put = {p: posixpath.join(root, p) for p in _files(table)}
            removed = known - put.keys()
        del known
        stats = fs.get_file_info(list(put.values())) if put else []
        objects = {key: Obj.of(info.size, info.mtime_ns) for key, info in zip(put, stats, strict=True)
                   if info.type == pafs.FileType.File}
        version = writer.update(objects, removed, latest)
        if version:
            _log.info("msc.written", entity=self.cfg.name, manifest=writer.base, version=version,
                      put=len(objects), removed=len(removed))

    def _latest_version(self, fs: pafs.FileSystem, root: str, after: int = -1) -> int | None:
        """The table's latest version: the commits after `after` probed one by one (O(new commits)); the log
        listed only when nothing is known yet."""
        if after < 0:
            infos = fs.get_file_info(pafs.FileSelector(posixpath.join(root, _LOG), allow_not_found=True))
            names = [i.base_name.removesuffix(".json") for i in infos if i.base_name.endswith(".json")]
            versions = [int(n) for n in names if n.isdigit()]
            return max(versions) if versions else None
        version = after
        while fs.get_file_info(posixpath.join(root, _LOG, f"{version + 1:020d}.json")).type == pafs.FileType.File:
            version += 1
        return version

    def check(self) -> list[str]:
        """Where a manifest disagrees with what it describes (for `lakefeed verify`)."""
        problems = []
        for location, writer in self.tables.items():
            fs, root = self._fs(location)
            if self._latest_version(fs, root) is None:
                continue
            table = DeltaTable(location, storage_options=self._storage.delta_options(location))
            wanted = set(_files(table))
            listed = writer.listing()
            if set(listed) != wanted:
                problems.append(f"MSC manifest {writer.base} lists {len(listed)} files, the table at version "
                                f"{table.version()} has {len(wanted)} ({len(set(listed) - wanted)} not in the "
                                f"table, {len(wanted - set(listed))} missing)")
        return problems


def _files(table: DeltaTable) -> list[str]:
    """The data files of the table's version, as keys relative to its root."""
    return [unquote(p) for p in pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()]
