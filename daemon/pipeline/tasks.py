"""The row work of a file batch, as tasks: where they run is the `Spread`'s business (Spark's executors in the
daemon, threads of this process without Spark).

Two stages, so that changelog offsets are dense and deterministic whatever order tasks finish in, and however
often one is retried:
1. `stage`, one task per run of landed files: read each and take its rows as a batch does (daemon/batch/file_rows.py),
   late rows set apart, and write its rows to the batch's staging folder (Arrow IPC, beside the changelog) under a
   name the file's inbox offset fixes. It returns counts, bad rows, the schema and the latest event time.
2. `write`, one task per run of staged files in inbox order: the driver has summed the counts, so each run knows
   its first changelog offset. It writes the changelog's and the table's Parquet files straight into their
   tables' folders and returns only their add actions (connectors/sinks/data_files.py).
The driver commits those actions; nothing a task wrote is in a table until then.
"""

from __future__ import annotations

import os
import posixpath
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from lakefeed import clock, failpoints, log
from lakefeed.batch import cdc, event_time
from lakefeed.batch.changelog import build_changelog, data_columns
from lakefeed.batch.discovery import Partition
from lakefeed.batch.file_rows import read_file
from lakefeed.batch.read import BadRow
from lakefeed.config.model import EntityConfig
from lakefeed.connectors.sinks import data_files
from lakefeed.connectors.sinks.data_files import DataFile
from lakefeed.inbox.files import InboxRecord
from lakefeed.inbox.storage import Storage

_log = log.get(__name__)
Job = TypeVar("Job")
Out = TypeVar("Out")


class Spread(Protocol):
    width: int  # how many tasks run at once

    def map(self, work: Callable[[Job], Out], jobs: list[Job], description: str) -> list[Out]:
        """`work` of every job, in the jobs' order."""


class InProcess:
    """Tasks as threads of this process (pyarrow parses and encodes without the GIL)."""

    def __init__(self, name: str) -> None:
        self.width = os.cpu_count() or 2
        self._pool = ThreadPoolExecutor(max_workers=self.width, thread_name_prefix=f"tasks-{name}")

    def map(self, work: Callable[[Job], Out], jobs: list[Job], description: str) -> list[Out]:
        return list(self._pool.map(work, jobs))


def worker() -> tuple[str, int]:
    """Where a task runs (host:pid) and which attempt of it this is (0 outside Spark)."""
    from pyspark import TaskContext  # noqa: PLC0415 - a task in Spark, or not

    context = TaskContext.get()
    log.configure_once()
    return f"{socket.gethostname()}:{os.getpid()}", context.attemptNumber() if context is not None else 0


@dataclass(frozen=True)
class StageJob:
    cfg: EntityConfig
    files: tuple[tuple[InboxRecord, Partition], ...]  # a run of the batch's files, each staged on its own
    target: pa.Schema | None
    checked_at: datetime
    watermark: datetime | None
    staging: str  # the batch's staging folder (a local path or s3:// URL)


@dataclass(frozen=True)
class Staged:
    offset: int
    location: str
    found: bool  # False: gone or superseded before it was read (no partition record)
    rows: int = 0
    bad: tuple[tuple[str, BadRow], ...] = ()
    late: int = 0
    schema: pa.Schema | None = None
    path: str | None = None  # the staged rows (a local path or s3:// URL)
    latest: datetime | None = None  # the latest event time of its rows
    worker: str = ""


def stage(job: StageJob) -> list[Staged]:
    where, _ = worker()
    store = Storage(job.cfg.storage)
    return [_stage_one(job, store, rec, partition, where) for rec, partition in job.files]


def _stage_one(job: StageJob, store: Storage, rec: InboxRecord, partition: Partition, where: str) -> Staged:
    cfg = job.cfg
    log_ = _log.bind(entity=cfg.name)
    read = read_file(cfg, store, rec, partition, job.target, job.checked_at, log_)
    if read is None:
        return Staged(rec.offset, partition.location, False, worker=where)
    location, table, file_bad = read
    bad = [(location, b) for b in file_bad]
    late = 0
    if table is not None and cfg.event_time.late_policy != "apply":
        mask = event_time.late_mask(table, job.watermark)
        if mask.any():
            late = int(mask.sum())
            if cfg.event_time.late_policy == "quarantine":
                reason = f"late: event time behind the watermark {clock.to_cdm(job.watermark)}"  # type: ignore[arg-type]
                bad.extend(cdc.bad_rows(table.filter(pa.array(mask)), reason))
            else:
                log_.info("rows.late_dropped", file=rec.path, rows=late,
                          watermark=clock.to_cdm(job.watermark))  # type: ignore[arg-type]
            table = table.filter(pa.array(~mask))
    if table is None:
        return Staged(rec.offset, location, True, bad=tuple(bad), late=late, worker=where)
    url = f"{job.staging}/{rec.offset}.arrow"
    fs, path = store.fs_of(url)
    fs.create_dir(posixpath.dirname(path), recursive=True)
    with fs.open_output_stream(path) as stream, pa.ipc.new_file(stream, table.schema) as writer:
        writer.write_table(table)
    latest = pc.max(table.column(event_time.EVENT_TIME)).as_py() if table.num_rows else None
    return Staged(rec.offset, location, True, table.num_rows, tuple(bad), late, table.schema, url, latest, where)


@dataclass(frozen=True)
class WriteJob:
    cfg: EntityConfig
    staged: tuple[str, ...]  # staged rows, in inbox order
    schema: pa.Schema  # of the batch's rows (every staged file's, unified)
    first_offset: int | None  # the run's first changelog offset; None: the changelog has the batch already
    table: bool  # whether the table's files are written (False: the table has the batch already)
    batch_id: int
    checked_at: datetime
    name: str  # the start of the files' names (data_files.prefix and the run)


@dataclass(frozen=True)
class Written:
    changelog: tuple[DataFile, ...]
    table: tuple[DataFile, ...]
    worker: str
    retried: bool  # an earlier attempt of the task failed (and may have left files)


def write(job: WriteJob) -> Written:
    where, attempt = worker()
    cfg = job.cfg
    store = Storage(cfg.storage)
    parts = [_shaped(read_staged(cfg, path), job.schema) for path in job.staged]
    rows = pa.concat_tables(parts)
    name = f"{job.name}-a{attempt}"
    changelog: list[DataFile] = []
    table: list[DataFile] = []
    if job.first_offset is not None:
        out, root = store.fs_of(cfg.changelog)
        changelog = data_files.write(out, root, build_changelog(rows, job.first_offset, job.batch_id, job.checked_at),
                                     name, unique_columns=("offset",))
    if job.table:
        out, root = store.fs_of(cfg.table)
        table = data_files.write(out, root, data_columns(rows), name, partition_by=cfg.partition_by)
    failpoints.reached("task.written")  # files written, not returned: a retry writes others, these are swept
    return Written(tuple(changelog), tuple(table), where, attempt > 0)


def read_staged(cfg: EntityConfig, path: str) -> pa.Table:
    fs, where = Storage(cfg.storage).fs_of(path)
    with fs.open_input_file(where) as source:
        return pa.ipc.open_file(source).read_all()


def _shaped(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """`rows` with the batch's columns in its order (null where a file lacks one) and types."""
    columns = [rows.column(f.name).cast(f.type) if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type)
               for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)
