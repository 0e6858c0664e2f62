"""The commit protocol: a read batch into the quarantine, changelog and current-state tables, once.

Every commit carries the application transaction (app_id, batch id); each table is skipped
when it already recorded the batch, so a batch Spark replays after a crash completes what
was missing and repeats nothing. Append entities write the changelog and the table side by
side; keyed entities MERGE into the table first and derive the changelog from what that
commit changed (its change data feed), so a replay finds the same changes again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakefeed import clock, failpoints
from lakefeed.batch import cdc, event_time
from lakefeed.batch.changelog import QUARANTINE_SCHEMA, build_changelog, data_columns
from lakefeed.batch.positions import SOURCE_STATE_KEY
from lakefeed.batch.read import BadRow
from lakefeed.batch.schema import delta_compatible
from lakefeed.config.data_manifest import TextFileFormat
from lakefeed.config.model import EntityConfig
from lakefeed.connectors.sinks.base import TableSink
from lakefeed.inbox.storage import Storage
from lakefeed.manifests.cdm import METADATA_KEY
from lakefeed.odf import slices
from lakefeed.pipeline import keyed, quarantine_files, tasks
from lakefeed.pipeline.quarantine_files import Quarantined
from lakefeed.pipeline.sinks import Sinks
from lakefeed.pipeline.staging import Staging, write_jobs
from lakefeed.pipeline.tasks import Spread, Staged

DATA_MANIFEST_KEY = "lakefeed.data_manifest"
SNAPSHOT_KEY = "lakefeed.snapshot"  # commit metadata: the snapshot file the table's state is (of each scope)


@dataclass
class BatchResult:
    batch_id: int
    files: int = 0
    rows: int = 0
    quarantined: int = 0
    unmatched: int = 0
    changes: int = 0
    late: int = 0
    deletes_of_absent: int = 0
    stale: int = 0
    skipped: bool = False
    watermark: datetime | None = None
    partitions: list[dict[str, Any]] = field(default_factory=list)
    source_state: dict[str, str] | None = None  # where the batch ends in its source (the ODF chain records it)
    workers: list[str] = field(default_factory=list)  # host:pid of the tasks that read its rows
    reducers: list[str] = field(default_factory=list)  # host:pid of the tasks that reduced a keyed batch
    stages: dict[str, float] = field(default_factory=dict)  # seconds spent in each stage of the batch

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.stages[stage] = round(self.stages.get(stage, 0.0) + time.perf_counter() - started, 4)


class ChangelogOffsets:
    """The next changelog offset, shared by every stream committing to one entity (one at a time)."""

    def __init__(self, changelog: TableSink) -> None:
        self._changelog = changelog
        self.next: int | None = None

    def start(self) -> int:
        if self.next is None:
            last = self._changelog.max_of("offset")
            self.next = 0 if last is None else int(last) + 1
        return self.next


class Committer:
    def __init__(self, cfg: EntityConfig, sinks: Sinks, app_id: str, offsets: ChangelogOffsets) -> None:
        self.cfg = cfg
        self.sinks = sinks
        self.app_id = app_id
        self._offsets = offsets
        self.staging = Staging(cfg, app_id)

    def done(self, sink: TableSink, batch_id: int) -> bool:
        version = sink.committed_version(self.app_id)
        return version is not None and version >= batch_id

    def all_done(self, batch_id: int) -> bool:
        """Every table a batch ends in has it, so a replay has nothing left to do."""
        sinks = (self.sinks.table, self.sinks.changelog, self.sinks.history)
        return all(self.done(sink, batch_id) for sink in sinks if sink is not None)

    def watermark_before(self, batch_id: int) -> datetime | None:
        """The watermark as it stood before this batch (a replay must see what the first run saw)."""
        value = self.sinks.table.latest_metadata(event_time.WATERMARK_KEY, self.app_id, batch_id)
        return clock.from_cdm(value) if value else None

    def commit(self, data: pa.Table | None, bad: list[tuple[str, BadRow]], result: BatchResult,
               checked_at: datetime, log_: Any, snapshot: cdc.Snapshot | None = None) -> None:
        """Commit a keyed batch whose rows are in this process (bench/cdc_merge.py); the daemon's are reduced by
        tasks (daemon/pipeline/keyed.py)."""
        watermark = self.watermark_before(result.batch_id)
        done = keyed.reduction(data, self.cfg, watermark, snapshot, self.sinks.tombstones)
        self.commit_reduced(done, bad, result, checked_at, log_, snapshot, watermark)

    def commit_reduced(self, done: keyed.Reduction, bad: list[tuple[str, BadRow]], result: BatchResult,
                       checked_at: datetime, log_: Any, snapshot: cdc.Snapshot | None,
                       watermark: datetime | None, staged: Sequence[Staged] = ()) -> None:
        """Commit a keyed batch reduced to one change per key (`bad`: the rows its stage tasks set apart);
        `snapshot`: the state its files make, for snapshot entities; `watermark`: as it stood before the batch."""
        batch_id = result.batch_id
        meta = self._meta(batch_id)
        if snapshot is not None:
            meta[SNAPSHOT_KEY] = snapshot.current
        if result.workers:
            meta["lakefeed.workers"] = json.dumps(result.workers)
        if result.reducers:
            meta["lakefeed.reducers"] = json.dumps(result.reducers)
        bad = [*bad, *done.bad]
        result.late = done.late
        if done.late and self.cfg.event_time.late_policy == "drop":
            log_.info("rows.late_dropped", rows=done.late, watermark=clock.to_cdm(watermark))  # type: ignore[arg-type]
        new_watermark = event_time.advance_to(watermark, done.latest, self.cfg.event_time)
        result.watermark = new_watermark
        result.stale = done.stale
        reduced = done.rows if done.rows is not None or snapshot is None else self._nothing(checked_at)
        if reduced is not None:
            reduced, absent = self._settled(reduced, batch_id)
            bad = [*bad, *absent]
        written = [*(s.quarantined for s in staged if s.quarantined is not None), *done.quarantined]
        result.quarantined = self._quarantine(bad, batch_id, meta, checked_at, log_, written)
        result.rows = done.kept
        if done.rows is None and not result.partitions:
            log_.info("batch.empty", unmatched=result.unmatched)
            return
        table_meta, changelog_meta = self._metas(meta, result, checked_at, new_watermark)
        try:
            self._merge(reduced, batch_id, table_meta, changelog_meta, checked_at, result, snapshot, log_)
        except BaseException:
            self._offsets.next = None  # unknown whether the changelog committed: re-read it next time
            raise
        log_.info("batch.committed", files=result.files, rows=result.rows, changes=result.changes,
                  quarantined=result.quarantined, unmatched=result.unmatched, late=result.late,
                  deletes_of_absent=result.deletes_of_absent, stale=result.stale, workers=result.workers or None,
                  watermark=clock.to_cdm(new_watermark) if new_watermark else None)

    def _meta(self, batch_id: int) -> dict[str, str]:
        return {"lakefeed.entity": self.cfg.name, "lakefeed.batch_id": str(batch_id), "lakefeed.app_id": self.app_id}

    def _quarantine(self, bad: list[tuple[str, BadRow]], batch_id: int, meta: dict[str, str], checked_at: datetime,
                    log_: Any, written: Sequence[Quarantined] = ()) -> int:
        """The batch's bad rows put in quarantine, once: the files its tasks wrote (`written`), and `bad`, found
        here; how many they are."""
        parts = list(written)
        if self.done(self.sinks.quarantine, batch_id):
            quarantine_files.discard(self.cfg, parts, log_)  # this replay's copies
            return sum(part.rows for part in parts) + len(bad)
        files = [f for part in parts for f in part.files]
        if bad:
            name = self.staging.quarantine_name(batch_id)
            parts.append(quarantine_files.write(self.cfg, bad, batch_id, checked_at, name))
            files += parts[-1].files
        if not files:
            return 0
        if workers := sorted({part.worker for part in parts if part.worker}):
            meta = {**meta, "lakefeed.workers": json.dumps(workers)}
        self.sinks.quarantine.commit_files(files, QUARANTINE_SCHEMA, self.app_id, batch_id, meta)
        quarantine_files.log_rows(log_, parts)
        self.staging.sweep(batch_id, any(part.retried for part in parts),
                           ((self.sinks.quarantine, str(self.cfg.quarantine), files),), log_)
        failpoints.reached("commit.quarantine")
        return sum(part.rows for part in parts)

    def _metas(self, meta: dict[str, str], result: BatchResult, checked_at: datetime,
               watermark: datetime | None) -> tuple[dict[str, str], dict[str, str]]:
        """The commit metadata of the table (partitions, watermark, data manifest) and of the changelog
        (watermark, source position)."""
        table_meta = {**meta, METADATA_KEY: json.dumps({"checked": clock.to_cdm(checked_at),
                                                        "partitions": result.partitions})}
        if watermark is not None:
            table_meta[event_time.WATERMARK_KEY] = clock.to_cdm(watermark)
        changelog_meta = {**meta, **({event_time.WATERMARK_KEY: clock.to_cdm(watermark)} if watermark else {}),
                          **({SOURCE_STATE_KEY: json.dumps(result.source_state)} if result.source_state else {})}
        if isinstance(self.cfg.format, TextFileFormat):  # what the data manifest says of the data, every commit
            table_meta[DATA_MANIFEST_KEY] = json.dumps({"metadata": self.cfg.format.metadata,
                                                        "ids": list(self.cfg.format.ids)})
        return table_meta, changelog_meta

    def plan_whole(self, batch_id: int) -> tasks.Then:
        """The write of an append batch that is one task, for that task to do."""
        changelog_due = not self.done(self.sinks.changelog, batch_id)
        return tasks.Then(self._offsets.start() if changelog_due else None, not self.done(self.sinks.table, batch_id),
                          batch_id, self.staging.name(batch_id, 0))

    def commit_staged(self, spread: Spread, staged: list[Staged], result: BatchResult, checked_at: datetime,
                      log_: Any, whole: tasks.Whole | None = None) -> None:
        """Commit an append batch whose files tasks read and staged (daemon/pipeline/tasks.py): tasks write the
        changelog's and the table's files (`whole`: the batch's only task wrote them already), this process commits
        them, each table once."""
        batch_id = result.batch_id
        meta = self._meta(batch_id)
        watermark = self.watermark_before(batch_id)
        latest = max((s.latest for s in staged if s.latest is not None), default=None)
        new_watermark = event_time.advance_to(watermark, latest, self.cfg.event_time)
        result.watermark = new_watermark
        result.late = sum(s.late for s in staged)
        result.quarantined = self._quarantine([b for s in staged for b in s.bad], batch_id, meta, checked_at, log_,
                                              [s.quarantined for s in staged if s.quarantined is not None])
        result.rows = sum(s.rows for s in staged)
        if not result.rows and not result.partitions:
            log_.info("batch.empty", unmatched=result.unmatched)
            return
        table_meta, changelog_meta = self._metas(meta, result, checked_at, new_watermark)
        try:
            workers = self._write_staged(spread, [s for s in staged if s.rows], batch_id, table_meta, changelog_meta,
                                         checked_at, log_, whole)
        except BaseException:
            self._offsets.next = None  # unknown whether the changelog committed: re-read it next time
            raise
        log_.info("batch.committed", files=result.files, rows=result.rows, changes=result.changes,
                  quarantined=result.quarantined, unmatched=result.unmatched, late=result.late, workers=workers,
                  watermark=clock.to_cdm(new_watermark) if new_watermark else None)

    def _write_staged(self, spread: Spread, staged: list[Staged], batch_id: int, table_meta: dict[str, str],
                      changelog_meta: dict[str, str], checked_at: datetime, log_: Any,
                      whole: tasks.Whole | None) -> list[str]:
        table_due = whole.then.table if whole is not None else not self.done(self.sinks.table, batch_id)
        if not staged:  # files without rows: the table still records their partitions
            schema = self.sinks.table.schema()
            if table_due and schema is not None:
                self.sinks.table.append(schema.empty_table(), self.app_id, batch_id, table_meta)
            elif table_due:
                log_.warning("batch.nothing_to_commit", reason="no rows and no table yet; partitions not recorded")
            return []
        schema = pa.unify_schemas([s.schema for s in staged if s.schema is not None], promote_options="permissive")
        if whole is not None:
            first = whole.then.first_offset
            written = [whole.written] if whole.written is not None else []
        else:
            first = self._offsets.start() if not self.done(self.sinks.changelog, batch_id) else None
            jobs = write_jobs(self.cfg, self.staging, staged, spread.width, schema, first, table_due, batch_id,
                              checked_at)
            written = spread.map(tasks.write, jobs, f"lakefeed {self.cfg.name} batch {batch_id}: write")
        workers = sorted({*(s.worker for s in staged), *(w.worker for w in written)})
        placed = {"lakefeed.workers": json.dumps(workers)}
        empty = schema.empty_table()
        checked = next((s.checks for s in staged if s.rows), ())  # the CHECK constraints the tasks evaluated
        if table_due and first is not None:  # refused before the changelog takes a batch the table would not
            self.sinks.table.check_files([f for w in written for f in w.table], checked)
        if first is not None:
            files = [f for w in written for f in w.changelog]
            shape = build_changelog(empty, first, batch_id, checked_at).schema
            described = {slices.KEY: json.dumps(dict(s for w in written for s in w.slices))}
            self.sinks.changelog.commit_files(files, shape, self.app_id, batch_id,
                                              {**changelog_meta, **placed, **described})
            self._offsets.next = first + sum(s.rows for s in staged)
            failpoints.reached("commit.changelog")
        if table_due:
            files = [f for w in written for f in w.table]
            self.sinks.table.commit_files(files, data_columns(empty).schema, self.app_id, batch_id,
                                          {**table_meta, **placed}, checked)
        self.staging.tidy(batch_id, written, self.sinks.changelog, self.sinks.table, log_)
        return workers

    def _nothing(self, checked_at: datetime) -> pa.Table | None:
        """A snapshot without rows still says what the state is: nothing (once the table is there)."""
        schema = self.sinks.table.schema()
        if schema is None:
            return None
        data = schema.empty_table()
        for name, column in ((cdc.KIND, pa.array([], pa.string())), (cdc.ORDER, pa.array([], pa.int64())),
                             ("source_file", pa.array([], pa.string())),
                             (event_time.EVENT_TIME, event_time.constant(checked_at, 0))):
            data = data.append_column(name, column)
        return data

    def _settled(self, reduced: pa.Table, batch_id: int) -> tuple[pa.Table, list[tuple[str, BadRow]]]:
        """The rows whose outcome depends on the table (whether it held their key before the batch, its stored
        row's sequence: `keyed.settled`), settled by looking the keys up."""
        return keyed.settled(reduced, self.cfg.cdc, lambda keys, columns: self._stored(keys, columns, batch_id),
                             lambda rows, columns: self._may_hold_newer(rows, columns, batch_id))

    def _may_hold_newer(self, rows: pa.Table, columns: tuple[str, ...], batch_id: int) -> np.ndarray:
        """Whether the table may have held a row newer than each row (in `columns`) before the batch: by its files'
        statistics, which tell of the table as it is, so once the batch's merge committed (a replay), of what it
        left: True for every row then."""
        if self.done(self.sinks.table, batch_id):
            return np.ones(rows.num_rows, dtype=bool)
        return self.sinks.table.may_hold_newer(rows, columns)

    def _stored(self, keys: pa.Table, columns: tuple[str, ...], batch_id: int) -> pa.Table:
        """The table's rows of `keys` (their keys and `columns`) as they stood before the batch. Once the batch's
        merge committed (a replay), those it changed are what it changed them from (none for those it inserted),
        the others as they still are: what the lookup found the first time."""
        names = keys.column_names
        table = self.sinks.table
        version = table.version_of(self.app_id, batch_id) if self.done(table, batch_id) else None
        if version is None:
            return table.lookup(keys, columns)
        changes = table.changes(version)
        old = pc.is_in(changes.column("_change_type"), value_set=pa.array(["update_preimage", "delete"]))
        touched = changes.select(names).group_by(names).aggregate([])
        parts = [changes.filter(old).select([*names, *columns])]
        untouched = keys.join(touched, keys=names, join_type="left anti")
        now = table.lookup(untouched, columns) if untouched.num_rows else untouched
        parts += [now.select([*names, *columns])] if now.num_rows else []
        return pa.concat_tables(parts, promote_options="permissive")

    def _bury(self, reduced: pa.Table, batch_id: int) -> None:
        """Record the sequence of every deletion of the batch (newest per key wins)."""
        tombstones = self.sinks.tombstones
        if tombstones is None or self.done(tombstones, batch_id):
            return
        keys, seq = self.cfg.cdc.primary_key, self.cfg.cdc.sequence_by
        deletes = reduced.filter(pc.equal(reduced.column(cdc.KIND), "delete")).select([*keys, *seq])
        deletes = deletes.append_column(cdc.KIND, pa.array(np.full(deletes.num_rows, "upsert", dtype=object),
                                                           pa.string()))
        plan = cdc.MergePlan(keys, seq, seq, snapshot=False, insert_updates_of_absent=True)
        tombstones.merge(deletes, plan, self.app_id, batch_id, {"lakefeed.batch_id": str(batch_id)})

    def _merge(self, reduced: pa.Table | None, batch_id: int, table_meta: dict[str, str],
               changelog_meta: dict[str, str], checked_at: datetime, result: BatchResult,
               snapshot: cdc.Snapshot | None, log_: Any) -> None:
        keys = self.cfg.cdc.primary_key
        if self.done(self.sinks.table, batch_id):
            version = self.sinks.table.version_of(self.app_id, batch_id)
        elif reduced is not None:
            source = data_columns(reduced).append_column(cdc.KIND, reduced.column(cdc.KIND))
            plan = cdc.plan(self.cfg.cdc, [c for c in source.column_names if c != cdc.KIND], snapshot)
            version = self.sinks.table.merge(source, plan, self.app_id, batch_id, table_meta)
            failpoints.reached("commit.table")
        else:
            schema = self.sinks.table.schema()  # files without rows: still record their partitions
            if schema is not None:
                self.sinks.table.append(schema.empty_table(), self.app_id, batch_id, table_meta)
            return
        if reduced is not None:
            self._bury(reduced, batch_id)
        history = self.sinks.history
        history_due = history is not None and not self.done(history, batch_id)
        if version is None or reduced is None or (self.done(self.sinks.changelog, batch_id) and not history_due):
            return
        changes = self.sinks.table.changes(version)
        result.changes = changes.num_rows
        if self.cfg.cdc.strategy != "snapshot":
            deletes = pc.sum(pc.equal(reduced.column(cdc.KIND), "delete")).as_py() or 0
            retracted = pc.sum(pc.equal(changes.column("_change_type"), "delete")).as_py() or 0
            result.deletes_of_absent = max(0, deletes - retracted)  # counted, not errors
        if not changes.num_rows:
            return
        first = self._offsets.start()
        rows = cdc.changelog_rows(changes, reduced, keys, first, batch_id, checked_at)
        if not self.done(self.sinks.changelog, batch_id):
            self._append_changelog(rows, batch_id, changelog_meta, log_)
            self._offsets.next = first + rows.num_rows
            failpoints.reached("commit.changelog")
        if history is not None and history_due:
            history.apply_history(cdc.history_rows(rows), keys, self.app_id, batch_id)

    def _append_changelog(self, rows: pa.Table, batch_id: int, meta: dict[str, str], log_: Any) -> None:
        """A keyed batch's changelog rows, written here as the append path's tasks write theirs: its file named
        after the batch (what a crash before the commit leaves is swept) and described as the ODF slice it is, so
        the chain does not read it back to hash it."""
        rows = rows.cast(delta_compatible(rows.schema))
        files, described = tasks.write_changelog(Storage(self.cfg.storage), self.cfg, rows,
                                                 self.staging.name(batch_id, 0))
        failpoints.reached("commit.changelog_written")
        self.sinks.changelog.commit_files(files, rows.schema, self.app_id, batch_id,
                                          {**meta, slices.KEY: json.dumps(dict(described))})
        self.staging.sweep(batch_id, False, ((self.sinks.changelog, str(self.cfg.changelog), files),), log_)
