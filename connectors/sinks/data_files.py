"""Parquet data files of a Delta table, written where a Spark task runs; committed later by the driver.

A task writes its rows straight into the table's folder (local or s3://) and returns only what a Delta add action
needs: path, size, partition values and statistics (numRecords, minValues, maxValues, nullCount). Nothing is in
the table until the driver commits those actions (`DeltaRsSink.commit_files`), so a file a failed attempt left
behind is never read; its name says which query, batch and attempt wrote it, and `sweep` removes it.
"""

from __future__ import annotations

import json
import os
import posixpath
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from lakefeed.inbox.storage import make_folder

_STAT_CHARS = 32  # string statistics longer than this are left out (Delta readers only prune with them)
_SAMPLE = 1024  # rows a column's first values are counted in, to choose its encoding
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"


@dataclass(frozen=True)
class DataFile:
    """One written file, as a Delta add action describes it (`path`: relative to the table, as on the file system;
    delta-rs encodes it as a URI in the log)."""

    path: str
    size: int
    partition_values: dict[str, str | None]
    modification_time: int  # ms
    stats: str
    rows: int


Seen = Callable[[DataFile, pa.Table, pa.Buffer], None]  # a written file, its rows, its bytes


def prefix(token: str, batch_id: int) -> str:
    """The start of every file name a batch of one query writes: what `sweep` looks for."""
    return f"part-{token}-b{batch_id}-"


def write(fs: pafs.FileSystem, root: str, data: pa.Table, name: str, partition_by: tuple[str, ...] = (),
          seen: Seen | None = None) -> list[DataFile]:
    """`data` as one Parquet file per partition under `root` (Hive-style folders), each named `name`-<n>-<uuid>,
    dictionary-encoding the columns whose values repeat (`dictionary_columns`). `seen` is given each file with its
    rows and its bytes (encoded in memory first then, not streamed), for a caller that hashes what it wrote."""
    groups = _partitions(data, partition_by) if partition_by else [({}, data)]
    files = []
    for n, (values, rows) in enumerate(groups):
        folder = "/".join(f"{k}={quote(NULL_PARTITION if v is None else v, safe='')}" for k, v in values.items())
        relative = posixpath.join(folder, f"{name}-{n}-{uuid.uuid4().hex}.parquet") if folder else \
            f"{name}-{n}-{uuid.uuid4().hex}.parquet"
        path = posixpath.join(root, relative)
        make_folder(fs, posixpath.dirname(path))
        dictionary = dictionary_columns(rows)
        encoded = None
        if seen is not None:
            sink = pa.BufferOutputStream()
            pq.write_table(rows, sink, use_dictionary=dictionary, compression="snappy")
            encoded = sink.getvalue()
        with fs.open_output_stream(path) as stream:
            if encoded is None:
                pq.write_table(rows, stream, use_dictionary=dictionary, compression="snappy")
            else:
                stream.write(encoded)
        info = fs.get_file_info(path)
        mtime = info.mtime.timestamp() if info.mtime is not None else time.time()
        file = DataFile(relative, info.size, values, int(mtime * 1000), statistics(rows), rows.num_rows)
        if seen is not None and encoded is not None:
            seen(file, rows, encoded)
        files.append(file)
    return files


def dictionary_columns(rows: pa.Table) -> list[str]:
    """The columns worth a Parquet dictionary: those with repeats among their first values. The writer's default,
    a dictionary for every column, builds one for columns of (nearly) distinct values too (offsets, ids, times)
    until the dictionary outgrows its page and it falls back to plain values: that doubled the time of writing a
    file and made it larger (docs/architecture.md, "What a row costs")."""
    out = []
    for name, column in zip(rows.column_names, rows.columns, strict=True):
        sample = column.slice(0, _SAMPLE)
        try:
            repeats = pc.count_distinct(sample, mode="all").as_py() * 2 <= len(sample)
        except pa.ArrowNotImplementedError:
            repeats = True  # a type the count has no kernel for (null, dictionary, nested): the writer's default
        if repeats:
            out.append(name)
    return out


def _partitions(data: pa.Table, columns: tuple[str, ...]) -> list[tuple[dict[str, str | None], pa.Table]]:
    """The rows of each combination of partition values (without the partition columns), with the values as Delta
    records them: strings, dates as YYYY-MM-DD, None for null."""
    keys = data.select(list(columns)).group_by(list(columns), use_threads=False).aggregate([])
    out = []
    for key in keys.to_pylist():
        mask = None
        for column, value in key.items():
            test = pc.is_null(data.column(column)) if value is None else pc.equal(data.column(column), value)
            mask = test if mask is None else pc.and_(mask, test)
        rows = data.filter(mask).drop_columns(list(columns))
        out.append(({c: _partition_value(v) for c, v in key.items()}, rows))
    return out


def _partition_value(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def statistics(rows: pa.Table) -> str:
    """Delta's file statistics of `rows`: min and max of the columns that have an order, null counts of all."""
    low: dict[str, Any] = {}
    high: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name, column in zip(rows.column_names, rows.columns, strict=True):
        t = column.type
        if pa.types.is_nested(t):
            continue
        nulls[name] = column.null_count
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_string(t) or
                pa.types.is_large_string(t) or pa.types.is_timestamp(t) or pa.types.is_date(t)):
            continue
        if column.null_count == len(column):
            continue
        if pa.types.is_floating(t) and pc.any(pc.is_nan(column)).as_py():
            continue  # NaN has no place in an order
        text = pa.types.is_string(t) or pa.types.is_large_string(t)
        try:
            bounds = pc.min_max(column).as_py()
            lo, hi = bounds["min"], bounds["max"]
            if not text:
                lo, hi = _stat_value(lo), _stat_value(hi)
        except (OverflowError, ValueError):
            continue  # a time Python cannot hold (before year 1, after 9999): no bounds, readers just do not skip
        if text:
            low[name] = lo[:_STAT_CHARS]  # a prefix is never greater
            if len(hi) <= _STAT_CHARS:
                high[name] = hi
            continue
        low[name], high[name] = lo, hi
    return json.dumps({"numRecords": rows.num_rows, "minValues": low, "maxValues": high, "nullCount": nulls},
                      ensure_ascii=False)


def _stat_value(value: Any) -> Any:
    if isinstance(value, datetime):  # to the millisecond, as Delta writers record them (readers allow for it)
        if value.tzinfo is not None:  # isoformat: a year of four digits, whatever the platform's strftime does
            return value.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"
        return value.isoformat(timespec="milliseconds")
    if isinstance(value, date):
        return value.isoformat()
    return value


def sweep(fs: pafs.FileSystem, root: str, start: str, kept: Iterable[str], folders: Iterable[str] = ("",)) -> int:
    """Remove the files under `root`'s `folders` whose names begin with `start` and that the table does not hold
    (`kept`: the relative paths of the files it holds); the number removed."""
    keep = set()
    for path in kept:  # as the log spells it (URI-encoded) or as a reader gives it back (decoded): either stays
        keep.update((path, unquote(path)))
    removed = 0
    for folder in folders:
        base = posixpath.join(root, folder) if folder else root
        try:
            infos = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
        except OSError:
            continue
        for info in infos:
            if info.type != pafs.FileType.File or not os.path.basename(info.path).startswith(start):
                continue
            if posixpath.relpath(info.path, root) not in keep:
                fs.delete_file(info.path)
                removed += 1
    return removed
