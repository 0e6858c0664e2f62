"""One micro-batch of an entity, from a streaming query's foreachBatch (files, push frames, Kafka parts): discover,
tasks (read and stage, then write or reduce: daemon/pipeline/tasks.py, keyed.py), commit (commit.py), compaction,
manifests. An entity's streams take turns.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from lakefeed import clock, failpoints, log
from lakefeed.batch import cdc, positions
from lakefeed.batch.discovery import Discovery, Partition, Siblings, discover
from lakefeed.batch.provenance import file_schema
from lakefeed.config.model import FILES, EntityConfig
from lakefeed.connectors.sinks import cdm_manifest
from lakefeed.errors import Abandoned
from lakefeed.inbox.files import InboxRecord
from lakefeed.inbox.spool import Entry
from lakefeed.inbox.storage import Mirror, Storage
from lakefeed.manifests.base import manifests_of
from lakefeed.manifests.cdm import ManifestKeeper, declared_schema, ensure_entity, partition_record, schema_document
from lakefeed.odf.chain import OdfChain
from lakefeed.pipeline import keyed, poison, quarantine_files, snapshots, tasks
from lakefeed.pipeline.commit import SNAPSHOT_KEY, BatchResult, ChangelogOffsets, Committer
from lakefeed.pipeline.compaction import Compactor
from lakefeed.pipeline.faults import commit_or_park, park_staged
from lakefeed.pipeline.pace import ManifestPace
from lakefeed.pipeline.sinks import Sinks
from lakefeed.pipeline.verdict import data_fault

_log = log.get(__name__)
FRAME_ROWS_PER_TASK = 50_000  # fewer rows decode faster in this batch's one task than Spark starts another


class EntityPipeline:
    """One per entity, shared by its streams (one streaming query per source); commits take turns."""

    def __init__(self, cfg: EntityConfig, sinks: Sinks) -> None:
        self.cfg = cfg
        self.sinks = sinks
        self.root = cfg.manifest.parent
        self.storage = Storage(cfg.storage)
        # An S3 entity's manifests are worked on locally and published to its bucket folder.
        self.mirror = Mirror(self.storage, self.root, cfg.manifest_url.rsplit("/", 1)[0]) if cfg.manifest_url else None
        self.keeper = ManifestKeeper(cfg, sinks.table, self.mirror.publish if self.mirror else lambda paths: None)
        self.manifests = manifests_of(cfg, self.keeper, self.storage)
        self._offsets = ChangelogOffsets(sinks.changelog)
        chain = next(m for m in self.manifests if isinstance(m, OdfChain))
        self.compactor = Compactor(cfg, sinks, chain.reached)
        self._committers: dict[str, Committer] = {}
        self._lock = threading.Lock()
        # Told the schema pushes are checked against after each commit (the intake process, daemon/intake/client.py).
        self.on_schema: Callable[[pa.Schema | str | None], None] = lambda _: None
        # True once a stop's time is up (the runner's shutdown deadline): the file batch is given up between files.
        self.halted: Callable[[], bool] = lambda: False
        # Whether landed files wait beyond an inbox offset (the runner's inbox): the manifests' pace (pipeline/pace.py).
        self.backlog: Callable[[int], bool] = lambda end: False
        self.pace = ManifestPace()
        self._deferred = False  # a batch left the manifests for a later one
        # Where the row work of append file batches runs: Spark's executors in the daemon (daemon/ops/runner.py).
        self.spread: tasks.Spread = tasks.InProcess(cfg.name)

    def prepare(self) -> None:
        """Make sure the manifest declares the entity, and repair it if a crash left it behind."""
        if self.mirror is not None:
            self.mirror.pull(self.cfg.manifest)
        self.keeper.restore()  # a declaration deleted while the entity was down comes back with its partitions
        entity = ensure_entity(self.cfg)
        document = schema_document(self.root, entity)
        if self.mirror is not None and document is not None:
            self.mirror.pull(document)
        self._manifests()
        if self.mirror is not None:  # whatever a crash kept from the bucket
            self.mirror.publish([p for p in (document, self.cfg.manifest) if p is not None])

    def app_id(self, stream: str = FILES) -> str:
        return self.committer(stream).app_id

    def committer(self, stream: str = FILES) -> Committer:
        if stream not in self._committers:
            # Spark writes the query id into the checkpoint before the first batch; it survives restarts.
            meta = json.loads((self.cfg.stream_checkpoint(stream) / "metadata").read_text(encoding="utf-8"))
            app_id = f"lakefeed:{self.cfg.name}:{meta['id']}"
            self._committers[stream] = Committer(self.cfg, self.sinks, app_id, self._offsets)
        return self._committers[stream]

    def forget(self, stream: str) -> None:
        """A stream stopped: its committer is made afresh if it starts again (with its new config)."""
        with self._lock:
            self._committers.pop(stream, None)

    def push_schema(self) -> pa.Schema | str | None:
        """The schema pushed records are checked against, read afresh: the table's, else the one the manifest
        declares (None: neither yet); a str says why it cannot be read."""
        try:
            return self._read_schema()
        except Exception as exc:  # the intake answers pushes with 503 and the reason until a commit reads it
            return f"{type(exc).__name__}: {exc}"

    def _read_schema(self) -> pa.Schema | None:
        schema = self.sinks.table.schema()
        if schema is None:
            doc = cdm_manifest.load(self.cfg.manifest)
            schema = declared_schema(self.root, cdm_manifest.find_entity(doc, self.cfg.name) or {}, self.cfg.name)
        return file_schema(schema, {})

    def _table_changed(self) -> None:
        """A commit may have created or evolved the table: with push sources, its schema is read again here, in
        the batch's thread, and handed on to the intake, which checks requests against it."""
        if self.cfg.push:
            self.on_schema(self.push_schema())

    def process(self, records: list[InboxRecord], batch_id: int) -> BatchResult:
        """A micro-batch of the file source."""
        return self._in_turn(self._process_files, records, batch_id)

    def process_frames(self, stream: str, entries: list[Entry], batch_id: int) -> BatchResult:
        """A micro-batch of a push source: spool frames, validated when they were acknowledged."""
        return self._in_turn(self._process_frames, stream, entries, batch_id)

    def _in_turn(self, process: Callable[..., BatchResult], *args: Any) -> BatchResult:
        with self._lock:  # the streams' batches take turns
            try:
                return process(*args)
            finally:
                self._table_changed()

    def _process_frames(self, stream: str, entries: list[Entry], batch_id: int) -> BatchResult:
        result = BatchResult(batch_id)
        log_ = _log.bind(entity=self.cfg.name, stream=stream, batch_id=batch_id)
        committer = self.committer(stream)
        if not entries:
            return result
        if committer.all_done(batch_id):
            log_.info("batch.replay_skipped", frames=len(entries))
            result.skipped = True
            return result
        checked_at = clock.now()
        target = file_schema(self.sinks.table.schema(), {})
        # Tasks decode the frames (daemon/pipeline/tasks.py), a task per FRAME_ROWS_PER_TASK rows or so; without a
        # table yet, the first frame fixes the types the others must fit, so that batch is one task.
        rows = sum(e.rows for e in entries)
        runs = max(1, min(len(entries), 2 * self.spread.width, -(-rows // FRAME_ROWS_PER_TASK))) \
            if target is not None else 1
        size = -(-len(entries) // runs)
        watermark = committer.watermark_before(batch_id) if not self.cfg.cdc.keyed else None
        staging = committer.staging.url(batch_id)
        buckets, rules = self._buckets(), self.sinks.table.checks(target, self.cfg.cdc.keyed)  # once a batch
        jobs = [tasks.FramesJob(self.cfg, stream, tuple(entries[i:i + size]), target, checked_at, watermark, staging,
                                buckets, rules) for i in range(0, len(entries), size)]
        with result.timed("tasks"):
            staged, whole = self._read(committer, tasks.stage_frames, jobs, batch_id, stream)
        result.files += len(entries)
        result.source_state = positions.of_frames(stream, entries[-1].offset)
        self._go_on()
        with result.timed("commit"):
            if not self.cfg.cdc.keyed:
                park_staged(committer, self.spread, staged, result, checked_at, log_, whole)
            else:
                snapshot = snapshots.whole(f"push/{stream}/{entries[-1].offset}") \
                    if self.cfg.cdc.strategy == "snapshot" else None
                self._commit_keyed(committer, staged, result, checked_at, log_, snapshot, fused=whole)
        self._after(result)
        return result

    def process_messages(self, stream: str, parts: tasks.Parts, batch_id: int) -> BatchResult:
        """A micro-batch of a Kafka source: its messages (topic, partition, offset, key, value, …) where they are."""
        return self._in_turn(self._process_messages, stream, parts, batch_id)

    def _process_messages(self, stream: str, parts: tasks.Parts, batch_id: int) -> BatchResult:
        result = BatchResult(batch_id)
        log_ = _log.bind(entity=self.cfg.name, stream=stream, batch_id=batch_id)
        committer = self.committer(stream)
        if committer.all_done(batch_id):
            log_.info("batch.replay_skipped")
            result.skipped = True
            return result
        checked_at = clock.now()
        target = file_schema(self.sinks.table.schema(), {})
        watermark = committer.watermark_before(batch_id) if not self.cfg.cdc.keyed else None
        job = tasks.MessagesJob(self.cfg, stream, target, checked_at, watermark, committer.staging.url(batch_id),
                                self._buckets(), self.sinks.table.checks(target, self.cfg.cdc.keyed))
        # Tasks decode the messages where Spark read them; without a table yet, the first types found are the ones
        # the others must fit, so that batch is one part. A message a task dies on is quarantined (pipeline/poison.py).
        with result.timed("tasks"):
            outs = poison.messages(parts, job, target is None, f"lakefeed {self.cfg.name} {stream} batch {batch_id}")
        result.files = sum(o.messages for o in outs)
        if not result.files:
            return result
        if tombstones := sum(o.tombstones for o in outs):
            log_.info("kafka.tombstones_skipped", messages=tombstones)
        result.source_state = positions.of_messages(stream, [o.ends for o in outs])
        staged = [o.staged for o in outs]
        self._go_on()
        with result.timed("commit"):
            if not self.cfg.cdc.keyed:
                park_staged(committer, self.spread, staged, result, checked_at, log_)
            else:  # the batch's messages are one source, ordered by (topic, partition, offset)
                self._commit_keyed(committer, staged, result, checked_at, log_, None, numbered=True)
        self._after(result)
        return result

    def _process_files(self, records: list[InboxRecord], batch_id: int) -> BatchResult:
        result = BatchResult(batch_id)
        log_ = _log.bind(entity=self.cfg.name, batch_id=batch_id)
        if not records:
            return result
        committer = self.committer()
        if committer.all_done(batch_id):
            log_.info("batch.replay_skipped", files=len(records))
            result.skipped = True
            self._manifests()
            return result
        checked_at = clock.now()
        result.source_state = positions.of_files(FILES, [rec.offset for rec in records])
        with result.timed("discover"):
            target, matched, removed, also = self._discover_all(records, result, log_)
        # Tasks read the files (daemon/pipeline/tasks.py); an append batch's late rows are set apart there.
        watermark = committer.watermark_before(batch_id) if not self.cfg.cdc.keyed else None
        with result.timed("tasks"):
            staged, whole = self._stage(committer, matched, target, checked_at, watermark, batch_id)
        staged_of = {s.offset: s for s in staged if s.found}
        partition_of = {rec.offset: partition for rec, partition in matched}
        for rec in records:  # in inbox order: a removal and a new version of one object stay in order
            if rec.offset in removed:
                stamp = clock.to_cdm(clock.from_ns(rec.mtime_ns))
                result.partitions.append(partition_record(removed[rec.offset], stamp, removed=True))
            elif rec.offset in staged_of:
                result.files += 1
                mtime = clock.to_cdm(clock.from_ns(rec.mtime_ns))
                result.partitions.append(partition_record(partition_of[rec.offset], mtime))
                if rec.offset in also:
                    result.partitions.append(partition_record(also[rec.offset], mtime, also=True))
        found = [s for s in staged if s.found]
        failpoints.reached("batch.discovered")
        self._go_on()
        with result.timed("commit"):
            if not self.cfg.cdc.keyed:  # the tasks write the tables' files too; this process commits them
                park_staged(committer, self.spread, found, result, checked_at, log_, whole)
            else:
                snapshot, retracted = None, []
                if self.cfg.cdc.strategy == "snapshot":
                    read = {s.offset: partition_of[s.offset] for s in found}
                    recorded = self.sinks.table.latest_metadata(SNAPSHOT_KEY, "", 0)
                    snapshot, retracted = snapshots.of_batch(self.cfg.cdc, recorded, records, removed, read, log_)
                self._commit_keyed(committer, found, result, checked_at, log_, snapshot, retracted, fused=whole)
        self._after(result, records[-1].offset + 1)
        return result

    def _discover_all(self, records: list[InboxRecord], result: BatchResult, log_: Any) -> tuple[
            pa.Schema | None, list[tuple[InboxRecord, Partition]], dict[int, Partition], dict[int, Partition]]:
        """The table's schema, and each file's partition: the files to read, the removed ones (by inbox offset),
        and the partitions of the other list a file is also in (by inbox offset)."""
        self.keeper.restore()  # before discovery reads it: a deleted manifest comes back whole
        doc = self.keeper.document()
        entity = cdm_manifest.local_entity(doc, self.cfg.name, self.cfg.manifest) or {}
        discovery = Discovery.from_entity(entity, self.keeper.owned(), self.cfg.pattern_precedence,
                                          self.keeper.doubled())
        siblings = Siblings(doc, self.cfg.name)
        target = self.sinks.table.schema() or declared_schema(self.root, entity, self.cfg.name)
        matched, removed, also = [], {}, {}
        for rec in records:
            self._go_on()
            partition = discover(discovery, siblings, self._relative(rec.path), rec.path, log_)
            if partition is None:
                result.unmatched += 1
            elif rec.removed:
                removed[rec.offset] = partition
            else:
                matched.append((rec, partition))
                if (other := discovery.also(self._relative(rec.path), partition)) is not None:
                    also[rec.offset] = other  # listed in both lists, as the CDM SDK would (ingested once)
        return target, matched, removed, also

    def _commit_keyed(self, committer: Committer, staged: list[tasks.Staged], result: BatchResult,
                      checked_at: datetime, log_, snapshot: cdc.Snapshot | None, retracted: Sequence[str] = (),
                      numbered: bool = False, fused: keyed.Fused | None = None) -> None:
        """The keyed reduction runs as tasks, one per bucket of keys (daemon/pipeline/keyed.py; `fused`: the stage
        task's), and the MERGE where the writer runs it (delta-rs: here) on the reduced rows; `retracted`: files
        whose rows, read before the files went, are not the state either; `numbered`: a Kafka batch's parts."""
        batch_id = result.batch_id

        def commit() -> None:
            watermark = committer.watermark_before(batch_id)
            if fused is not None and fused.watermark == watermark:
                done, reducers = keyed.fused_reduction(self.cfg, fused)
            else:
                if fused is not None:  # reduced again: what the task's reduction wrote is no commit's
                    quarantine_files.discard(self.cfg, fused.quarantined(), log_,
                                             "bad rows of a reduction done again, the watermark having moved")
                done, reducers = keyed.reduce_staged(self.spread, self.cfg, staged, batch_id,
                                                     committer.staging.url(batch_id), checked_at, watermark, snapshot,
                                                     tuple(retracted), numbered)
            result.workers = sorted({*(s.worker for s in staged if s.worker), *reducers})
            result.reducers = sorted(set(reducers))
            committer.commit_reduced(done, [b for s in staged for b in s.bad], result, checked_at, log_, snapshot,
                                     watermark, staged)

        commit_or_park(committer, commit, staged, result, checked_at, log_, retracted)
        committer.staging.drop(batch_id)

    def _buckets(self) -> int:
        """How many buckets a keyed entity's staged rows are cut into by key: one reduction task each."""
        return self.spread.width if self.cfg.cdc.keyed else 0

    def _stage(self, committer: Committer, matched: list[tuple[InboxRecord, Partition]], target: pa.Schema | None,
               checked_at: datetime, watermark: datetime | None,
               batch_id: int) -> tuple[list[tasks.Staged], tasks.Whole | None]:
        staging = committer.staging.url(batch_id)
        buckets, rules = self._buckets(), self.sinks.table.checks(target, self.cfg.cdc.keyed)  # once a batch

        def jobs(items: list[tuple[InboxRecord, Partition]], schema: pa.Schema | None) -> list[tasks.StageJob]:
            runs = min(len(items), 2 * self.spread.width)  # a few runs per core: tasks are not free
            size = -(-len(items) // runs) if runs else 1
            return [tasks.StageJob(self.cfg, tuple(items[i:i + size]), schema, checked_at, watermark, staging,
                                   buckets, rules) for i in range(0, len(items), size)]

        if target is None and len(matched) > 1:  # the first file ever fixes the table's types; the others are read
            # so as to fit them
            first, _ = self._read(committer, tasks.stage, jobs(matched[:1], None), batch_id, whole=False)
            rest, _ = self._read(committer, tasks.stage, jobs(matched[1:], first[0].schema), batch_id, whole=False)
            return first + rest, None
        return self._read(committer, tasks.stage, jobs(matched, target), batch_id)

    def _read(self, committer: Committer, stage: Callable[[Any], list[tasks.Staged]], jobs: list[Any],
              batch_id: int, stream: str = "", whole: bool = True) -> tuple[list[tasks.Staged], Any]:
        """Tasks read and stage the batch's rows; a batch that is one task is written (append) or reduced (keyed,
        `keyed.in_one_task`) by it as well: a `tasks.Whole` or a `keyed.Fused` beside the staged parts."""
        self._go_on()
        description = f"lakefeed {self.cfg.name} {stream + ' ' if stream else ''}batch {batch_id}"
        if whole and len(jobs) == 1 and (one := keyed.in_one_task(self.cfg, stage, jobs[0], committer, batch_id)):
            work, job, what = one
            try:
                done = self.spread.map(work, [job], f"{description}: read and {what}")[0]
                return list(done.staged), done
            except Exception as exc:  # staged alone, the rows are written or reduced by the commit, which parks them
                if not data_fault(exc) and poison.died(exc) is None:
                    raise
                _log.warning("batch.unfused", entity=self.cfg.name, batch_id=batch_id, error=str(exc)[:500])
        staged = poison.staged(self.spread, stage, jobs, description)  # a unit a task dies on is quarantined
        return [s for run in staged for s in run], None

    def _relative(self, path: str) -> str:
        """A file's path below the entity's root (the manifest's folder, or its bucket folder)."""
        if self.mirror is not None:
            return path.removeprefix(self.mirror.url)
        return Path(os.path.relpath(path, self.root)).as_posix()

    def _after(self, result: BatchResult, end: int | None = None) -> None:
        """After a batch's commits: its tables compacted when due (pipeline/compaction.py), then the manifests; then
        the changelog, when due and once the ODF chain holds all of it, and if so the manifests again."""
        with result.timed("compaction"):
            self.compactor.run(self.halted)
        with result.timed("manifests"):
            self._manifests(end)
        with result.timed("compaction"):
            if self.compactor.run_changelog(self.halted):
                self._manifests()

    def compact_now(self, halted: Callable[[], bool]) -> dict[str, dict[str, Any]]:
        """Every table compacted now, due or not (`lakefeed compact`), between the entity's batches; from one table
        to the next only until `halted()`."""
        with self._lock:
            self._manifests()  # the ODF chain holds every committed slice before the changelog is looked at
            report = self.compactor.now(halted)
            if any(table.get("files_removed") for table in report.values()):
                self._manifests()  # they list the compacted files
            return report

    def _manifests(self, end: int | None = None) -> None:
        """After a batch (committed, or replayed and found committed): each manifest brought to committed state;
        `end`, the inbox offset after a file batch: while files wait beyond it, the pace may leave it for later."""
        if end is not None and not self.pace.due(self.backlog(end)):
            _log.debug("manifests.deferred", entity=self.cfg.name, reason="files wait for the next batch")
            self._deferred = True
            return

        def refresh() -> None:
            for manifest in self.manifests:
                manifest.refresh()
            self._deferred = False

        self.pace.timed(refresh)

    def settle(self) -> None:
        """The streams stopped, so no later batch comes: manifests left for one are brought current now."""
        if self._deferred:
            self._manifests()

    def _go_on(self) -> None:
        if self.halted():
            raise Abandoned("the daemon is stopping, and the time it gives a running batch is up")
