"""Kartothek dataset metadata of an entity's table (seed 003), kept current after every commit (docs/manifests.md).

The default layout `<lake_dir>/<entity>/table/` is Kartothek's `<store>/<dataset uuid>/<table>/`:

    <store>/<uuid>.by-dataset-metadata.json    dataset_metadata_version 4, one partition per data file of the
                                               table's current Delta version, partition_keys, indices, metadata
    <store>/<uuid>/<table>/_common_metadata    an empty Parquet file with the table's schema
    <store>/<uuid>/indices/<col>/<time>.by-dataset-index.parquet   <col> -> partition: list<string> (labels)

A partition's label is its data file's key under the table, without `.parquet`; every file is a partition. The
table's Delta partition columns (`partition_by`) are the partition keys: Delta writes them `col=value` into the
paths, escaped as Kartothek decodes them (`/` as `%2F`), and not into the files. Everything is derived from the
Delta log (the version applied is in `metadata`), written in the order a reader needs: schema, then new index
files, then the metadata (atomically), so a reader never sees an index older than its metadata; index files are
kept one generation back for readers that loaded the previous metadata.
"""

from __future__ import annotations

import json
import posixpath
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable

from lakefeed import failpoints, log
from lakefeed.config.model import EntityConfig
from lakefeed.connectors.sinks import delta_log
from lakefeed.inbox.storage import Storage

VERSION_KEY = "lakefeed.table_version"
_log = log.get(__name__)
_VIEWS = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}  # Kartothek's pyarrow (6) cannot read them


def label(key: str) -> str:
    return key.removesuffix(".parquet")


def readable(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.with_type(_VIEWS.get(f.type, f.type)) for f in schema], metadata=schema.metadata)


class KartothekDataset:
    """The entity's table as a Kartothek dataset (`kartothek.enabled`)."""

    def __init__(self, cfg: EntityConfig, storage: Storage) -> None:
        self.cfg, self._storage = cfg, storage
        self.location = str(cfg.table)
        self.fs, self.root = storage.fs_of(self.location)
        self.table_name = posixpath.basename(self.root)
        self.uuid = posixpath.basename(posixpath.dirname(self.root))
        self.store = posixpath.dirname(posixpath.dirname(self.root))
        self.metadata_path = posixpath.join(self.store, f"{self.uuid}.by-dataset-metadata.json")
        self._local = isinstance(self.fs, pafs.LocalFileSystem)
        self._meta: dict[str, Any] | None = None

    def metadata(self) -> dict[str, Any] | None:
        """The dataset's metadata as last written (read once: it lists every file, so it is kept in memory)."""
        if self._meta is None:
            try:
                with self.fs.open_input_stream(self.metadata_path) as stream:
                    self._meta = json.loads(stream.read())
            except FileNotFoundError:
                return None
        return self._meta

    def refresh(self) -> None:
        if not self.cfg.kartothek.enabled:
            return
        meta = self.metadata()
        applied = int(meta["metadata"][VERSION_KEY]) if meta else -1
        options = self._storage.delta_options(self.location)
        changes = delta_log.changes_after(self.fs, self.root, applied, options, self.location)
        if changes is None:
            return
        whole = changes.whole or meta is None
        partitions = {} if whole else dict(meta["partitions"])  # type: ignore[index]
        gone = set(partitions) - {label(k) for k in changes.added} if whole else {label(k) for k in changes.removed}
        for key in changes.removed:
            partitions.pop(label(key), None)
        for key in changes.added:
            partitions[label(key)] = {"files": {self.table_name: f"{self.uuid}/{self.table_name}/{key}"}}
        table = DeltaTable(self.location, version=changes.latest, storage_options=options)
        schema = readable(pa.schema(table.schema().to_arrow()))
        keys = list(table.metadata().partition_columns)  # in the files' paths (col=value), not in the files
        self._common_metadata(schema)
        prefix = f"{self.uuid}/{self.table_name}/"
        files = {p["files"][self.table_name].removeprefix(prefix): "" for p in partitions.values()}
        every = {key: posixpath.join(self.root, key) for key in files}
        indices = {}
        for column in self.cfg.kartothek.indices:
            if column not in schema.names or column in keys:
                _log.warning("kartothek.index_skipped", entity=self.cfg.name, column=column,
                             reason="a partition key: Kartothek prunes by its folders" if column in keys else
                             "the table has no such column (yet)")
                continue
            previous = None if whole or meta is None else meta.get("indices", {}).get(column)
            indices[column] = self._index(schema.field(column), previous, gone, changes.added, every)
        self._warn_of_views(changes.added)
        failpoints.reached("kartothek.indices_written")
        written = {"dataset_metadata_version": 4, "dataset_uuid": self.uuid, "partitions": partitions,
                   "partition_keys": keys, "indices": indices,
                   "metadata": {VERSION_KEY: str(changes.latest), "lakefeed.entity": self.cfg.name}}
        self._write_json(written)
        self._meta = written
        for column, path in indices.items():
            self._prune(column, path, (meta or {}).get("indices", {}).get(column))
        _log.info("kartothek.written", entity=self.cfg.name, dataset=self.metadata_path, partitions=len(partitions),
                  indices=sorted(indices), table_version=changes.latest)

    def _warn_of_views(self, added: dict[str, str]) -> None:
        """delta-rs (1.6) MERGE writes string columns as string_view into a file's Arrow schema, which pyarrow
        before 15, and so kartothek 5.3 (pyarrow < 7), cannot read: say so, as those files come."""
        viewed = [key for key, path in added.items()
                  if any(f.type in _VIEWS for f in pq.read_schema(path, filesystem=self.fs))]
        if viewed:
            _log.warning("kartothek.unreadable_files", entity=self.cfg.name, files=len(viewed), example=viewed[0],
                         reason="the Delta writer's MERGE stored string_view columns, which kartothek (pyarrow < 15) "
                                "cannot read; readers with pyarrow >= 15 can")

    def _common_metadata(self, schema: pa.Schema) -> None:
        path = posixpath.join(self.root, "_common_metadata")
        try:
            if pq.read_schema(path, filesystem=self.fs).equals(schema):
                return
        except (FileNotFoundError, OSError, pa.ArrowInvalid):
            pass
        self._atomically(path, lambda out: pq.write_table(schema.empty_table(), out))

    def _index(self, field: pa.Field, previous: str | None, gone: set[str], added: dict[str, str],
               every: dict[str, str]) -> str:
        """Write the column's index anew: the previous one without the partitions gone, plus the added files'
        distinct values (O(changed data)); with no previous index (new, or lost), from every file. Returns its
        path relative to the store."""
        labels: dict[Any, set[str]] = {}
        try:
            old = pq.read_table(posixpath.join(self.store, previous), filesystem=self.fs) if previous else None
        except FileNotFoundError:
            old = None
        if old is None:
            added = every
        else:
            for value, partitions in zip(old.column(field.name).to_pylist(), old.column("partition").to_pylist(),
                                         strict=True):
                labels[value] = set(partitions) - gone
        for key, path in added.items():
            column = pq.read_table(path, columns=[field.name], filesystem=self.fs).column(field.name)
            for value in pc.unique(column.drop_null()).to_pylist():
                labels.setdefault(value, set()).add(label(key))
        values = sorted((v for v, p in labels.items() if p), key=lambda v: (str(type(v)), v))
        table = pa.table({field.name: pa.array(values, field.type),
                          "partition": pa.array([sorted(labels[v]) for v in values], pa.list_(pa.string()))})
        now = datetime.now(UTC).replace(tzinfo=None).isoformat(timespec="microseconds")
        relative = f"{self.uuid}/indices/{quote(field.name)}/{quote(now)}.by-dataset-index.parquet"
        self._atomically(posixpath.join(self.store, relative), lambda out: pq.write_table(table, out))
        return relative

    def _prune(self, column: str, current: str, previous: str | None) -> None:
        """Index files of the column other than the current and the previous generation (and leftovers of a
        write a crash cut short) are removed."""
        folder = posixpath.join(self.store, self.uuid, "indices", quote(column))
        keep = {posixpath.basename(p) for p in (current, previous) if p}
        for info in self.fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True)):
            if info.base_name not in keep:
                self.fs.delete_file(info.path)

    def _write_json(self, doc: dict[str, Any]) -> None:
        data = json.dumps(doc, sort_keys=True).encode()
        self._atomically(self.metadata_path, lambda out: out.write(data))

    def _atomically(self, path: str, write: Any) -> None:
        """Whole or not at all: a temporary name renamed on a local disk; one PUT on S3."""
        if self._local:  # S3 has no folders (pyarrow would write marker objects)
            self.fs.create_dir(posixpath.dirname(path), recursive=True)
        target = posixpath.join(posixpath.dirname(path), f".{posixpath.basename(path)}.tmp") if self._local else path
        with self.fs.open_output_stream(target) as out:
            write(out)
        if self._local:
            self.fs.move(target, path)

    def check(self) -> list[str]:
        """The dataset lists exactly the table's files, its schema is the table's, and every index maps each
        value to exactly the partitions holding it (recomputed from the files: O(data), for `lakefeed verify`)."""
        self._meta = None
        meta = self.metadata() if self.cfg.kartothek.enabled else None
        if meta is None or delta_log.latest_version(self.fs, self.root) is None:
            return []
        table = DeltaTable(self.location, storage_options=self._storage.delta_options(self.location))
        problems = []
        if meta["metadata"].get(VERSION_KEY) != str(table.version()):
            problems.append(f"Kartothek metadata {self.metadata_path} is of table version "
                            f"{meta['metadata'].get(VERSION_KEY)}; the table is at {table.version()}")
        files = delta_log.table_files(table)
        if set(meta["partitions"]) != {label(k) for k in files}:
            problems.append(f"Kartothek metadata {self.metadata_path} lists {len(meta['partitions'])} partitions; "
                            f"the table has {len(files)} files")
        for column, path in meta.get("indices", {}).items():
            stored = pq.read_table(posixpath.join(self.store, path), filesystem=self.fs).to_pylist()
            wanted: dict[Any, set[str]] = {}
            for key in files:
                values = pq.read_table(posixpath.join(self.root, key), columns=[column], filesystem=self.fs)
                for value in pc.unique(values.column(column).drop_null()).to_pylist():
                    wanted.setdefault(value, set()).add(label(key))
            if {r[column]: set(r["partition"]) for r in stored} != wanted:
                problems.append(f"Kartothek index {path} does not map each {column!r} value to the files holding it")
        return problems
