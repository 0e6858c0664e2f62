"""What a batch's tasks leave behind them, and its removal: the rows they staged (beside the changelog, where
every executor reaches) and files of attempts that were never committed (named after the query, batch and attempt
that wrote them: connectors/sinks/data_files.py)."""

from __future__ import annotations

import contextlib
import hashlib
import posixpath
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import pyarrow as pa

from lakefeed.config.model import EntityConfig
from lakefeed.connectors.sinks import data_files
from lakefeed.connectors.sinks.base import TableSink
from lakefeed.connectors.sinks.data_files import DataFile
from lakefeed.inbox.storage import Storage
from lakefeed.pipeline import staged_files
from lakefeed.pipeline.tasks import Staged, WriteJob, Written


class Staging:
    """One query's (app_id's) staging folders and file names."""

    def __init__(self, cfg: EntityConfig, app_id: str) -> None:
        self.cfg = cfg
        self.token = hashlib.sha256(app_id.encode()).hexdigest()[:10]  # in the names of the files its tasks write
        self._swept: set[str] = set()  # the tables swept since the start
        self._failed: set[int] = set()  # batches whose commit failed here: their files may lie beside the tables

    def url(self, batch_id: int) -> str:
        """Where a batch's tasks stage the rows they read."""
        return staged_files.folder(str(self.cfg.changelog).rstrip("/").rsplit("/", 1)[0], self.token, batch_id)

    def name(self, batch_id: int, run: int) -> str:
        return f"{data_files.prefix(self.token, batch_id)}r{run}"

    def quarantine_name(self, batch_id: int) -> str:
        """Of the quarantine's file of the bad rows the driver found (a task's are named after its first unit)."""
        return f"{data_files.prefix(self.token, batch_id)}q-driver"

    def drop(self, batch_id: int) -> None:
        """The batch's staged rows are no longer needed."""
        fs, folder = Storage(self.cfg.storage).fs_of(self.url(batch_id))
        fs.delete_dir_contents(folder, missing_dir_ok=True)
        with contextlib.suppress(FileNotFoundError):
            fs.delete_dir(folder)

    def tidy(self, batch_id: int, written: list[Written], changelog: TableSink, table: TableSink, log_: Any) -> None:
        """After the batch's commits: its staging folder goes, and `sweep` looks for what earlier attempts left."""
        self.drop(batch_id)
        self.sweep(batch_id, any(w.retried for w in written),
                   ((changelog, str(self.cfg.changelog), [f for w in written for f in w.changelog]),
                    (table, str(self.cfg.table), [f for w in written for f in w.table])), log_)

    def failed(self, batch_id: int) -> None:
        """The batch's commit failed (a store fault: it is tried again): what its tasks wrote is looked for when
        it commits."""
        self._failed.add(batch_id)

    def sweep(self, batch_id: int, retried: bool, written: Iterable[tuple[TableSink, str, list[DataFile]]],
              log_: Any) -> None:
        """Files of the batch that an earlier attempt of it wrote and no table holds (a task retried, a crash
        before the commit, a commit that failed) go: looked for on the first batch after a start, and after a batch
        with a retried task or a failed commit (`written`: each table, where it is, and the files the batch
        committed to it)."""
        retried = retried or batch_id in self._failed
        self._failed = {b for b in self._failed if b >= batch_id}  # batches before this one are committed
        store = Storage(self.cfg.storage)
        start = data_files.prefix(self.token, batch_id)
        for sink, location, files in written:
            if location in self._swept and not retried:
                continue
            self._swept.add(location)
            out, root = store.fs_of(location)
            folders = {posixpath.dirname(f.path) for f in files} or {""}
            removed = data_files.sweep(out, root, start, sink.paths(), sorted(folders))
            if removed:
                log_.info("files.orphans_removed", table=location, files=removed,
                          reason="written by an attempt of this batch that was not committed")


def runs(staged: list[Staged], width: int) -> list[list[Staged]]:
    """Staged files in at most `width` runs of about equal rows, in order: each run is one task's changelog file,
    one ODF slice."""
    total = sum(s.rows for s in staged)
    out: list[list[Staged]] = [[]]
    filled = 0
    for s in staged:
        if out[-1] and filled >= total * len(out) / width:
            out.append([])
        out[-1].append(s)
        filled += s.rows
    return out


def write_jobs(cfg: EntityConfig, staging: Staging, staged: list[Staged], width: int, schema: pa.Schema,
               first: int | None, table: bool, batch_id: int, checked_at: datetime) -> list[WriteJob]:
    """The write tasks of a batch's staged files: a run each (`runs`), each knowing its first changelog offset from
    the rows of the runs before it (`first`: the batch's; None: the changelog has the batch already)."""
    jobs, offset = [], first
    for n, run in enumerate(runs(staged, width)):
        jobs.append(WriteJob(cfg, tuple(s.path for s in run if s.path), schema, offset, table, batch_id, checked_at,
                             staging.name(batch_id, n)))
        if offset is not None:
            offset += sum(s.rows for s in run)
    return jobs
