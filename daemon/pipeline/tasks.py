"""The row work of a batch, as tasks: where they run is the `Spread`'s (or the `Parts`') business: Spark's executors
in the daemon, this process without Spark.

Two stages, so that changelog offsets are dense and deterministic whatever order tasks finish in, and however
often one is retried:
1. stage: read the batch's rows and take them as a batch does (conformed, tagged, stamped; late rows and rows the
   table's constraints refuse set apart), and write them to the batch's staging folder (Arrow IPC) under a name
   their place in the batch fixes (a keyed entity's cut into buckets by key: daemon/pipeline/keyed.py). It returns
   counts, the schema and the latest event time (`Staged`); its bad rows it writes as a file of the quarantine
   table (daemon/pipeline/quarantine_files.py). `stage`: a run of landed files (daemon/batch/file_rows.py);
   `stage_frames`: a run of push frames; `stage_messages`: a partition of a Kafka batch, where it was read.
2. `write`, one task per run of staged parts in order: the driver has summed the counts, so each run knows
   its first changelog offset. It writes the changelog's and the table's Parquet files straight into their
   tables' folders and returns only their add actions (connectors/sinks/data_files.py).
The driver commits those actions; nothing a task wrote is in a table until then.
A batch that is one task anyway (a few push frames, one landed file) is one Spark job: its first changelog offset
is the entity's next one, known before its rows are read, so the task that stages them writes them too (`whole`).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Protocol, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from lakefeed import clock, failpoints, log
from lakefeed.batch import cdc, checks, event_time, frames, messages, positions
from lakefeed.batch.changelog import build_changelog, data_columns
from lakefeed.batch.checks import Checks
from lakefeed.batch.discovery import Partition
from lakefeed.batch.file_rows import read_file
from lakefeed.batch.read import BadRow, conform
from lakefeed.config.model import EntityConfig
from lakefeed.connectors.sinks import data_files
from lakefeed.connectors.sinks.data_files import DataFile
from lakefeed.inbox.files import InboxRecord
from lakefeed.inbox.spool import Entry
from lakefeed.inbox.storage import Storage
from lakefeed.odf import slices
from lakefeed.pipeline import quarantine_files, unstaged
from lakefeed.pipeline.quarantine_files import Quarantined
from lakefeed.pipeline.staged_files import read_staged, write_buckets, write_staged
from lakefeed.pipeline.verdict import data_fault

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


class Parts(Protocol):
    """A micro-batch's rows where they are, in parts: a Kafka batch's DataFrame partitions on the executors (Spark),
    or a table in this process."""

    def map(self, work: Callable[[pa.Table, int], Out], whole: bool, description: str) -> list[Out]:
        """`work(rows, part)` of every part that has rows, in the parts' order; `whole`: all rows in one part."""


class Here:
    """Rows in this process, as one part."""

    def __init__(self, rows: pa.Table) -> None:
        self._rows = rows

    def map(self, work: Callable[[pa.Table, int], Out], whole: bool, description: str) -> list[Out]:
        return [work(self._rows, 0)] if self._rows.num_rows else []


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
    buckets: int = 0  # a keyed entity's: how many buckets its rows are cut into by key (0: not cut)
    checks: Checks = ()  # the table's CHECK constraints, which its rows must pass


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
    checks: Checks = ()  # the CHECK constraints its rows passed
    worker: str = ""
    buckets: tuple[str, ...] = ()  # instead of `path`, cut by key: each bucket's rows ("": none)
    quarantined: Quarantined | None = None  # instead of `bad`: the task's bad rows, written (one unit carries them)

    @property
    def paths(self) -> tuple[str, ...]:  # every file of the staged rows
        return (self.path,) if self.path else tuple(b for b in self.buckets if b)


def stage(job: StageJob) -> list[Staged]:
    where, _ = worker()
    store = Storage(job.cfg.storage)
    return bad_written(job, [_stage_guarded(job, store, rec, partition, where) for rec, partition in job.files])


def bad_written(job: StageJob | FramesJob | MessagesJob, staged: list[Staged]) -> list[Staged]:
    """The stage task's bad rows (each unit's `bad`) written as one file of the quarantine table, which its first unit
    carries (daemon/pipeline/quarantine_files.py): a million bad rows returned as rows were 123 MB of pickled result,
    past Spark's maxResultSize at about eight million."""
    bad = [b for s in staged for b in s.bad]
    if not bad:
        return staged
    written = quarantine_files.of_task(job.cfg, bad, job.staging, job.checked_at, str(staged[0].offset), worker())
    return [replace(staged[0], bad=(), quarantined=written), *(replace(s, bad=()) for s in staged[1:])]

def _stage_guarded(job: StageJob, store: Storage, rec: InboxRecord, partition: Partition, where: str) -> Staged:
    """`_stage_one`, or the file quarantined by name for a data fault no check foresaw (daemon/pipeline/unstaged.py)."""
    try:
        return _stage_one(job, store, rec, partition, where)
    except Exception as exc:
        if not data_fault(exc):
            raise
        bad = unstaged.file_rows(partition.location, exc, _log.bind(entity=job.cfg.name, file=rec.path))
        return Staged(rec.offset, partition.location, True, bad=bad, worker=where)


def _stage_one(job: StageJob, store: Storage, rec: InboxRecord, partition: Partition, where: str) -> Staged:
    log_ = _log.bind(entity=job.cfg.name)
    read = read_file(job.cfg, store, rec, partition, job.target, job.checked_at, log_)
    if read is None:
        return Staged(rec.offset, partition.location, False, worker=where)
    location, table, file_bad = read
    return _staged(job, store, rec.offset, location, table, [(location, b) for b in file_bad], where,
                   log_.bind(file=rec.path))


@dataclass(frozen=True)
class FramesJob:
    cfg: EntityConfig
    stream: str
    entries: tuple[Entry, ...]  # a run of the batch's push frames (spool entries), in offset order
    target: pa.Schema | None
    checked_at: datetime
    watermark: datetime | None
    staging: str
    buckets: int = 0
    checks: Checks = ()


def stage_frames(job: FramesJob) -> list[Staged]:
    """A run of push frames, decoded from the spool, conformed, tagged and stamped (daemon/batch/frames.py) and staged
    under its first frame's offset (each frame under its own if one fails to: daemon/pipeline/unstaged.py)."""
    where, _ = worker()
    if len(job.entries) > 1:  # a run of one frame is tried once, below
        try:
            return bad_written(job, [_frames_staged(job, job.entries, where)])
        except Exception as exc:
            if not data_fault(exc):
                raise
    out = []
    for entry in job.entries:  # one frame at a time: only the frames at fault are quarantined
        try:
            out.append(_frames_staged(job, (entry,), where))
        except Exception as exc:
            if not data_fault(exc):
                raise
            location = f"push/{job.stream}/{entry.offset}"
            bad = unstaged.frame_rows(job.cfg.spool(job.stream), location, entry, exc,
                                      _log.bind(entity=job.cfg.name, stream=job.stream, frame=entry.offset))
            out.append(Staged(entry.offset, location, True, bad=bad, worker=where))
    return bad_written(job, out)


def _frames_staged(job: FramesJob, entries: tuple[Entry, ...], where: str) -> Staged:
    first = entries[0].offset
    table, bad = frames.rows_of(job.cfg, job.stream, entries, job.target, job.checked_at)
    return _staged(job, Storage(job.cfg.storage), first, f"push/{job.stream}/{first}", table, bad, where,
                   _log.bind(entity=job.cfg.name, stream=job.stream))


@dataclass(frozen=True)
class MessagesJob:
    cfg: EntityConfig
    stream: str
    target: pa.Schema | None
    checked_at: datetime
    watermark: datetime | None
    staging: str
    buckets: int = 0
    checks: Checks = ()


@dataclass(frozen=True)
class StagedMessages:
    staged: Staged
    messages: int
    tombstones: int
    ends: dict[str, dict[str, int]]  # positions.message_ends of the part


def stage_messages(job: MessagesJob, batch: pa.Table, part: int) -> StagedMessages:
    """A part of a Kafka batch: values decoded and conformed, event time stamped, a keyed entity's rows tagged
    (numbered within the part: the reduction orders the parts), staged under the part's number (without the
    messages at fault if it fails to: daemon/pipeline/unstaged.py)."""
    where, _ = worker()
    log_ = _log.bind(entity=job.cfg.name, stream=job.stream, part=part)

    def stage(rows: pa.Table, bad: unstaged.Bad = ()) -> Staged:  # `rows`' messages, and `bad` quarantined too
        data, found = messages_rows(job, rows)
        return _staged(job, Storage(job.cfg.storage), part, f"kafka/{job.stream}", data, [*bad, *found], where, log_)
    try:
        staged = stage(batch)
    except Exception as exc:
        if not data_fault(exc):
            raise
        staged = unstaged.part_without_faulty(batch, exc, lambda rows: messages_rows(job, rows), stage, log_)
    return StagedMessages(bad_written(job, [staged])[0], batch.num_rows, batch.column("value").null_count,
                          positions.message_ends(batch))


def messages_rows(job: MessagesJob, batch: pa.Table) -> tuple[pa.Table | None, list[tuple[str, BadRow]]]:
    """Messages decoded, conformed, stamped, tagged: where one may crash the task (daemon/pipeline/poison.py)."""
    failpoints.reached_each("stage.message", lambda: (bytes(v or b"").decode("utf-8", "replace")
                                                      for v in batch.column("value").to_pylist()))
    cfg, source = job.cfg, job.cfg.kafka_source(job.stream)
    assert source is not None
    rows, bad, _ = messages.decode(batch, source, cfg.cdc.debezium)
    if rows is None:
        return None, bad
    read = conform(rows, job.target)
    assert read.table is not None
    data, bad_times = event_time.stamp(read.table, cfg.event_time, "", 0, job.checked_at)
    bad.extend((f"kafka/{job.stream}", b) for b in [*read.bad, *bad_times])
    if cfg.cdc.keyed:  # the batch's messages are one source, ordered by (topic, partition, offset)
        data = cdc.tag(data, cdc.file_kind(cfg.cdc, None), 0)
    return data, bad


def _staged(job: StageJob | FramesJob | MessagesJob, store: Storage, offset: int, location: str,
            table: pa.Table | None, bad: list[tuple[str, BadRow]], where: str, log_) -> Staged:
    """Rows read by a task: late ones set apart (an append entity's; a keyed one's are the reduction's), the rest
    written to the batch's staging folder (a keyed entity's by bucket)."""
    cfg, watermark = job.cfg, job.watermark
    late = 0
    if table is not None:  # what the table's constraints refuse: quarantined before any table takes it
        table, refused = checks.refused(table, job.target, job.checks, cfg.cdc)
        bad.extend(refused)
    if table is not None and cfg.event_time.late_policy != "apply":
        mask = event_time.late_mask(table, watermark)
        if mask.any():
            late = int(mask.sum())
            if cfg.event_time.late_policy == "quarantine":
                reason = f"late: event time behind the watermark {clock.to_cdm(watermark)}"  # type: ignore[arg-type]
                bad.extend(cdc.bad_rows(table.filter(pa.array(mask)), reason))
            else:
                log_.info("rows.late_dropped", rows=late, watermark=clock.to_cdm(watermark))  # type: ignore[arg-type]
            table = table.filter(pa.array(~mask))
    common = {"found": True, "bad": tuple(bad), "late": late, "worker": where, "checks": job.checks}
    if table is None:
        return Staged(offset, location, **common)
    done = {"rows": table.num_rows, "schema": table.schema,
            "latest": pc.max(table.column(event_time.EVENT_TIME)).as_py() if table.num_rows else None}
    if not job.buckets:
        return Staged(offset, location, path=write_staged(store, f"{job.staging}/{offset}.arrow", table), **done,
                      **common)
    return Staged(offset, location, buckets=write_buckets(store, f"{job.staging}/{offset}", table,
                                                          cfg.cdc.primary_key, job.buckets), **done, **common)


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
    slices: tuple[tuple[str, dict], ...] = ()  # each changelog file's ODF slice (odf/slices.py), by its path


def write(job: WriteJob) -> Written:
    where, attempt = worker()
    cfg = job.cfg
    store = Storage(cfg.storage)
    parts = [shaped(read_staged(cfg, path), job.schema) for path in job.staged]
    rows = pa.concat_tables(parts)
    name = f"{job.name}-a{attempt}"
    changelog: list[DataFile] = []
    table: list[DataFile] = []
    described: list[tuple[str, dict]] = []
    if job.first_offset is not None:
        changelog, described = write_changelog(store, cfg, build_changelog(rows, job.first_offset, job.batch_id,
                                                                           job.checked_at), name)
    if job.table:
        out, root = store.fs_of(cfg.table)
        table = data_files.write(out, root, data_columns(rows), name, partition_by=cfg.partition_by)
    failpoints.reached("task.written")  # files written, not returned: a retry writes others, these are swept
    return Written(tuple(changelog), tuple(table), where, attempt > 0, tuple(described))


def write_changelog(store: Storage, cfg: EntityConfig, rows: pa.Table,
                    name: str) -> tuple[list[DataFile], list[tuple[str, dict]]]:
    """Changelog rows as data files, each with the ODF slice it is (by its path), hashed from the rows and bytes
    just written: nothing reads a file back to hash it, neither the writer nor the chain (odf/slices.py)."""
    out, root = store.fs_of(cfg.changelog)
    described: list[tuple[str, dict]] = []

    def seen(file: DataFile, written: pa.Table, data: pa.Buffer) -> None:
        if (description := slices.describe(written, data)) is not None:
            described.append((file.path, description))

    return data_files.write(out, root, rows, name, seen=seen), described


@dataclass(frozen=True)
class Then:
    """The write of a batch that is one task, planned before its rows are read."""
    first_offset: int | None  # the entity's next changelog offset; None: the changelog has the batch already
    table: bool  # whether the table's files are written
    batch_id: int
    name: str  # of the batch's only run


@dataclass(frozen=True)
class WholeJob:
    stage: Callable[[StageJob | FramesJob], list[Staged]]
    job: StageJob | FramesJob
    then: Then


@dataclass(frozen=True)
class Whole:
    then: Then
    staged: tuple[Staged, ...]
    written: Written | None  # None: no rows to write


def whole(job: WholeJob) -> Whole:
    """Stage the batch's rows, then write them as the batch's only run."""
    staged = job.stage(job.job)
    rows = [s for s in staged if s.rows]
    if not rows:
        return Whole(job.then, tuple(staged), None)
    schema = pa.unify_schemas([s.schema for s in rows if s.schema is not None], promote_options="permissive")
    then = job.then
    written = write(WriteJob(job.job.cfg, tuple(s.path for s in rows if s.path), schema, then.first_offset,
                             then.table, then.batch_id, job.job.checked_at, then.name))
    return Whole(then, tuple(staged), written)


def shaped(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """`rows` with the batch's columns in its order (null where a file lacks one) and types."""
    columns = [rows.column(f.name).cast(f.type) if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type)
               for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)
