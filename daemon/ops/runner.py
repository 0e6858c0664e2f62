"""An entity at run time: its pipeline, its sources and one streaming query per source.

Each query's foreachBatch hands the batch to the entity's pipeline (which lets one commit run at a time), records
what it did in the daemon's metrics, and for push sources has the spool segments that earlier, committed batches
consumed released by their writer: the intake process (daemon/intake/process.py), or during a backfill, which has no
intake, the runner itself.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import tenacity
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from lakefeed import log
from lakefeed.batch.messages import columns as decoded_columns
from lakefeed.config.model import FILES, EntityConfig, S3Source
from lakefeed.connectors.sinks import cdm_manifest
from lakefeed.connectors.sources.base import Source
from lakefeed.connectors.sources.kafka_source import FORMAT as KAFKA
from lakefeed.connectors.sources.local_dir import LocalDirSource
from lakefeed.connectors.sources.s3_landing import S3Landing
from lakefeed.connectors.streams.inbox_stream import FORMAT as INBOX
from lakefeed.connectors.streams.spool_stream import FORMAT as SPOOL
from lakefeed.errors import Abandoned, LakefeedError
from lakefeed.inbox import storage
from lakefeed.inbox.files import Inbox, InboxCursor, InboxRecord
from lakefeed.inbox.spool import Entry, Spool, SpoolEnd
from lakefeed.intake.client import IntakeProcess
from lakefeed.manifests.folders import landing_manifest
from lakefeed.ops.metrics import Metrics
from lakefeed.ops.offsets_log import batch_range, committed_offset
from lakefeed.ops.spark import FrameParts, SparkSpread
from lakefeed.pipeline.commit import BatchResult
from lakefeed.pipeline.entity import EntityPipeline
from lakefeed.pipeline.sinks import Sinks
from lakefeed.pipeline.verdict import store_fault

_log = log.get(__name__)
_WAITING = ("Waiting for data to arrive", "Waiting for next trigger")


def _started(status: dict) -> bool:
    return status["message"] in _WAITING or (status["message"] == "Processing new data" and status["isDataAvailable"])


def _offsets(raw: object) -> dict[tuple[str, str], int]:
    """A Kafka source's offsets from a progress report (a JSON string or dict)."""
    doc = json.loads(raw) if isinstance(raw, str) else raw
    return {(t, p): int(n) for t, parts in doc.items() for p, n in parts.items()} if isinstance(doc, dict) else {}


def _cause(detail: str) -> str:
    """The innermost Python exception line of a Spark error (what to act on), else its first line."""
    causes = re.findall(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception): .+)$", detail, re.MULTILINE)
    return causes[-1] if causes else detail.strip().splitlines()[0] if detail.strip() else "stopped"


class EntityRunner:
    """An entity's pipeline and one streaming query per source: its files and each push source."""

    def __init__(self, session: SparkSession, cfg: EntityConfig, trigger_interval_s: float,
                 excluded: tuple, metrics: Metrics, intake: IntakeProcess | None = None) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.intake = intake
        self._spark = session
        self._trigger = f"{int(trigger_interval_s * 1000)} milliseconds"
        self.pipeline = EntityPipeline(cfg, Sinks.of(cfg, session))
        self.pipeline.spread = SparkSpread(session)
        self.pipeline.halted = lambda: time.monotonic() >= self._halting.get(FILES, math.inf)
        if intake is not None:
            self.pipeline.on_schema = lambda schema: intake.schema(self.cfg.name, schema)
        self.inbox: Inbox | None = None
        self._cursor = InboxCursor(cfg.state / "inbox")  # a file batch's records, read here (_file_batch)
        self.pipeline.backlog = lambda end: self.inbox is not None and len(self.inbox) > end
        self.source: Source | None = None
        if isinstance(cfg.source, S3Source):
            self.inbox = Inbox(cfg.state / "inbox")
            outputs = tuple(str(loc) for loc in (cfg.table, cfg.changelog, cfg.quarantine, cfg.history,
                                                 cfg.tombstones, landing_manifest(cfg) or "")
                            if storage.is_s3(loc))
            self.source = S3Landing(cfg.name, cfg.source, self.inbox, self.pipeline.storage, cfg.state,
                                    excluded=outputs, on_found=metrics.missed.labels(cfg.name).inc)
        elif cfg.source is not None:
            self.inbox = Inbox(cfg.state / "inbox")
            own = landing_manifest(cfg)  # the landing folder's MSC manifest
            excluded = (*excluded, Path(own)) if own else excluded
            self.source = LocalDirSource(cfg.name, cfg.source.path, self.inbox, cfg.source.reconcile_interval_s,
                                         excluded=excluded, follow_symlinks=cfg.source.follow_symlinks,
                                         complete_marker=cfg.source.complete_marker)
        self.spools: dict[str, SpoolEnd] = {}  # a push stream's frames written so far (for its backlog)
        self._writers: dict[str, Spool] = {}  # without an intake: the push streams' spools, to release them
        self._counting = threading.Lock()
        self.queries: dict[str, StreamingQuery] = {}
        self.shutdown = threading.Event()
        self.failed_on: tuple[Path, tuple[int, ...] | None] | None = None  # the file at fault, and its version
        self._halting: dict[str, float] = {}  # streams being stopped -> when their running batch is given up
        self.consumed: dict[str, int] = {}
        self._unavailable: dict[str, bool] = {}  # what was last logged about each source's broker
        self.progress_at = time.monotonic()  # the last time a stream moved or was seen idle
        self.error: str | None = None
        self.terminal = False  # the error is one lakefeed reported (a restart would not mend it)

    def start(self, reconcile_first: bool = False, wait: bool = True) -> None:
        """Start sources and queries; `reconcile_first`: list the landing first (backfill); `wait`: `wait_started`."""
        self.pipeline.prepare()
        if self.source is not None:
            if reconcile_first:
                self.source.reconcile()
            self.source.start()
        self.start_streams(self.cfg.streams(), wait)
        _log.info("entity.started", entity=self.cfg.name, streams=list(self.queries))

    def start_streams(self, streams: list[str], wait: bool = True) -> None:
        for stream in streams:
            if (push := self.cfg.push_source(stream)) is not None:
                self.spools[stream] = SpoolEnd(self.cfg.spool(stream))
                if self.intake is None:
                    self._writers[stream] = Spool(self.cfg.spool(stream), push.segment_bytes, push.idempotency_ttl_s)
            if self.cfg.kafka_source(stream) is None:  # a Kafka stream's lag comes from Spark's progress
                self.consumed.setdefault(stream, committed_offset(self.cfg.stream_checkpoint(stream)) or 0)
            self.queries[stream] = self._start_query(stream)
        if wait:
            self.wait_started(streams)

    def wait_started(self, streams: list[str]) -> None:
        """Wait (2 minutes at most) until each of these queries has run its first trigger (a new query's first batch
        is an empty one), so the first file landing is not kept waiting behind start-up work; or is processing data:
        a backlog left by the last life, behind which it may never be seen waiting (pushes must not wait for it)."""
        deadline = time.monotonic() + 120
        for stream in streams:
            query = self.queries[stream]
            while query.isActive and not _started(query.status) and time.monotonic() < deadline:
                time.sleep(0.05)

    def stop_streams(self, streams: list[str], deadline: float) -> None:
        """Stop these streams' queries after their running batch."""
        self._halting.update(dict.fromkeys(streams, deadline))
        for stream in streams:
            query = self.queries.pop(stream, None)
            if query is not None:
                # Let a running batch finish: stop() would interrupt it (it would be replayed at restart).
                while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
                    time.sleep(0.05)
                query.stop()
            self.spools.pop(stream, None)
            writer = self._writers.pop(stream, None)
            if writer is not None:
                writer.close()
            self.consumed.pop(stream, None)
            self.pipeline.forget(stream)
            self._halting.pop(stream, None)

    def reconfigure(self, cfg: EntityConfig, streams: list[str], deadline: float) -> None:
        """Take a config that differs only in these record sources (push, Kafka): restart just them."""
        self.stop_streams([s for s in streams if s in self.queries], deadline)
        self.cfg = self.pipeline.cfg = cfg
        self.start_streams([s for s in streams if s in cfg.streams()])
        _log.info("entity.reconfigured", entity=cfg.name, streams=streams)

    def _start_query(self, stream: str) -> StreamingQuery:
        if stream == FILES:
            assert self.cfg.source is not None
            frame = (self._spark.readStream.format(INBOX).option("path", str(self.cfg.state / "inbox"))
                     .option("maxFilesPerTrigger", str(self.cfg.source.max_files_per_trigger)).load())
            handler = self._file_batch
        elif (push := self.cfg.push_source(stream)) is not None:
            frame = (self._spark.readStream.format(SPOOL).option("path", str(self.cfg.spool(stream)))
                     .option("maxRecordsPerTrigger", str(push.max_records_per_trigger)).load())
            handler = partial(self._push_batch, stream)
        else:
            kafka = self.cfg.kafka_source(stream)
            assert kafka is not None
            reader = (self._spark.readStream.format(KAFKA).option("bootstrap_servers", kafka.bootstrap_servers)
                      .option("startingOffsets", kafka.starting_offsets)
                      .option("maxOffsetsPerTrigger", str(kafka.max_offsets_per_trigger))
                      .option("retryTimeoutMs", str(int(kafka.retry_timeout_s * 1000))))
            reader = reader.option("pattern", kafka.pattern) if kafka.pattern else \
                reader.option("topics", ",".join(kafka.topics))
            if kafka.group_id:
                reader = reader.option("group_id", kafka.group_id)
            if kafka.min_partitions:
                reader = reader.option("minPartitions", str(kafka.min_partitions))
            reader = reader.option("statusPath", str(self._source_status(stream)))
            frame = reader.load()
            handler = partial(self._kafka_batch, stream)
        return (frame.writeStream.foreachBatch(handler)
                .option("checkpointLocation", str(self.cfg.stream_checkpoint(stream)))
                .queryName(f"lakefeed_{self.cfg.name}_{stream}")
                .trigger(processingTime=self._trigger)
                .start())

    def _file_batch(self, frame: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        # The batch's range, from Spark's offsets log, read from the inbox in the batch's work (a read error is
        # tried again as the store's are): no Spark job for a batch's list.
        if bounds := batch_range(self.cfg.stream_checkpoint(FILES), batch_id):
            records, end = partial(self._cursor.records, *bounds), bounds[1] if bounds[1] > bounds[0] else None
        else:
            collected = sorted((InboxRecord(*row) for row in frame.collect()), key=lambda r: r.offset)
            records, end = lambda: collected, collected[-1].offset + 1 if collected else None
        self._run(FILES, batch_id, lambda: self.pipeline.process(records(), batch_id), end, started)

    def _push_batch(self, stream: str, frame: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        entries = sorted((Entry(*row) for row in frame.collect()), key=lambda e: e.offset)
        if entries:
            # Batches before this one are in Spark's commit log: their frames are no longer needed.
            if self.intake is not None:
                self.intake.release(self.cfg.name, stream, entries[0].offset)
            elif stream in self._writers:
                self._writers[stream].release(entries[0].offset)
        self._run(stream, batch_id, lambda: self.pipeline.process_frames(stream, entries, batch_id),
                  entries[-1].offset + 1 if entries else None, started)

    def _kafka_batch(self, stream: str, frame: DataFrame, batch_id: int) -> None:
        source = self.cfg.kafka_source(stream)
        assert source is not None
        parts = FrameParts(frame.select(*decoded_columns(source)))  # decoded where Spark reads them
        self._run(stream, batch_id, lambda: self.pipeline.process_messages(stream, parts, batch_id), None)

    def _run(self, stream: str, batch_id: int, work: Callable[[], BatchResult], end: int | None,
             started: float | None = None) -> None:
        """`started`: when the batch's handler began (collecting the batch's records from Spark came first)."""
        began = time.monotonic()
        started = started or began
        try:
            result = self._until_stored(stream, batch_id, work)
        except Abandoned:
            _log.warning("batch.abandoned", entity=self.cfg.name, stream=stream, batch_id=batch_id,
                         reason="stopping: the shutdown timeout has passed; replayed at the next start")
            raise
        except LakefeedError as exc:
            self.stopped_by(exc)
            self.metrics.error(self.cfg.name, type(exc).__name__)
            _log.error("entity.failed", entity=self.cfg.name, stream=stream, batch_id=batch_id, error=str(exc))
            raise
        except Exception as exc:
            if self.shutdown.is_set() or stream in self._halting:  # the stop cancelled the batch's Spark jobs
                error = " ".join(f"{type(exc).__name__}: {exc}".splitlines()[:2])[:300]
                _log.warning("batch.abandoned", entity=self.cfg.name, stream=stream, batch_id=batch_id, error=error,
                             reason="stopping: the shutdown timeout has passed and its tasks were cancelled; "
                                    "replayed at the next start")
            else:
                self.metrics.error(self.cfg.name, type(exc).__name__)
            raise
        if end is not None:
            self.consumed[stream] = end
        if began > started:
            result.stages["collect"] = round(began - started, 4)
        self.metrics.batch_done(self.cfg.name, stream, result, time.monotonic() - started)
        self.progress_at = time.monotonic()

    def _until_stored(self, stream: str, batch_id: int, work: Callable[[], BatchResult]) -> BatchResult:
        """The batch, tried again while the store is at fault (a full disk, an unreachable bucket): the commit
        protocol makes a second try finish what the first began. A stop ends the waiting (the batch is then
        replayed from the checkpoint at the next start)."""

        def halted(_: object) -> bool:
            return self.shutdown.is_set() or stream in self._halting

        def waiting(state: tenacity.RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            self.metrics.error(self.cfg.name, type(exc).__name__)
            _log.warning("batch.retrying", entity=self.cfg.name, stream=stream, batch_id=batch_id,
                         attempt=state.attempt_number, error=str(exc)[:1000],
                         in_s=round(state.next_action.sleep, 1) if state.next_action else None)

        retrying = tenacity.Retrying(retry=tenacity.retry_if_exception(store_fault), stop=halted,
                                     wait=tenacity.wait_exponential(multiplier=0.5, max=10), before_sleep=waiting,
                                     sleep=self.shutdown.wait, reraise=True)
        return retrying(work)

    def backlog(self, stream: str) -> int:
        """Files, frames or messages waiting for the stream (not yet in a committed batch)."""
        if self.cfg.kafka_source(stream) is not None:
            return self._kafka_lag(stream)
        if stream == FILES:
            written = len(self.inbox) if self.inbox is not None else 0
        else:
            spool = self.spools.get(stream)
            if spool is None:
                return 0
            with self._counting:  # the supervisor's loop and the status route both ask
                written = spool()
        return max(0, written - self.consumed.get(stream, written))

    def _source_status(self, stream: str) -> Path:
        folder = self.cfg.state / "streams" / stream
        folder.mkdir(parents=True, exist_ok=True)
        return folder / "source_status.json"

    def source_status(self, stream: str) -> dict | None:
        """What a Kafka source last reported about its broker ({unavailable, retries, error})."""
        if self.cfg.kafka_source(stream) is None:
            return None
        try:
            return json.loads(self._source_status(stream).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def _kafka_lag(self, stream: str) -> int:
        """Messages on the broker after the last batch's end, as the query last saw them."""
        query = self.queries.get(stream)
        progress = query.lastProgress if query is not None else None
        if not progress or not progress.get("sources"):
            return 0
        source = progress["sources"][0]
        latest, end = _offsets(source.get("latestOffset")), _offsets(source.get("endOffset"))
        return sum(max(0, n - end.get(tp, 0)) for tp, n in latest.items())

    def healthy(self, stall_s: float) -> bool:
        """Each stream is making progress, or idle with nothing waiting. An entity stopped by an
        error lakefeed reported (`terminal`) counts as healthy: a restart would not mend it."""
        if self.error is not None:
            return self.terminal
        if not self.running():
            return False
        if self.pipeline.compactor.asked or all(self.backlog(s) == 0 for s in self.queries):
            self.progress_at = time.monotonic()  # idle, or its batches wait for a compaction the operator asked for
        return time.monotonic() - self.progress_at < stall_s

    def drained(self) -> bool:
        """Nothing waiting and no batch running (or the entity failed): backfill may stop."""
        if self.error is not None:
            return True
        return all(self.backlog(s) == 0 and not q.status["isTriggerActive"] for s, q in self.queries.items())

    def sample(self) -> None:
        for stream in self.cfg.streams():
            query = self.queries.get(stream)
            self.metrics.set_backlog(self.cfg.name, stream, self.backlog(stream),
                                     query is not None and query.isActive)
            status = self.source_status(stream)
            if status is not None:
                self.metrics.set_source(self.cfg.name, stream, status["unavailable"], status["retries"])
                if status["unavailable"] != self._unavailable.get(stream, False):
                    # The source reports from Spark's planner process; the daemon's log says it here.
                    event = _log.warning if status["unavailable"] else _log.info
                    event("source.unavailable" if status["unavailable"] else "source.available",
                          entity=self.cfg.name, stream=stream, retries=status["retries"], error=status["error"])
                    self._unavailable[stream] = status["unavailable"]

    def stop_intake(self) -> None:
        self.shutdown.set()  # a batch waiting out a store fault gives up: it is replayed at the next start
        if self.source is not None:
            self.source.stop()

    def stop(self, deadline: float) -> None:
        self.stop_streams(list(self.queries), deadline)
        try:
            self.pipeline.settle()
        except Exception as exc:  # noqa: BLE001 (the stop goes on: the next start's refresh applies every commit)
            _log.error("manifests.unsettled", entity=self.cfg.name, error=f"{type(exc).__name__}: {exc}",
                       reason="the manifests are brought current at the next start")
        if self.inbox is not None:
            self.inbox.close()
        for writer in self._writers.values():
            writer.close()  # a push source whose query never started
        self._writers.clear()
        _log.info("entity.stopped", entity=self.cfg.name)

    def stopped_by(self, error: LakefeedError) -> None:
        """An error lakefeed reported stops the entity. The manifest's version that failed (or, for other errors, the
        one there now) is kept: a change to it, a fix, starts the entity again (the supervisor's `_revive`)."""
        where = getattr(error, "path", None) or self.cfg.manifest  # a schema document, say, or the manifest
        self.failed_on = where, getattr(error, "stamp", None) or cdm_manifest.file_version(where)
        self.error, self.terminal = str(error), True

    def running(self) -> bool:
        return (self.error is None and not self.shutdown.is_set() and bool(self.queries)
                and all(q.isActive for q in list(self.queries.values())))  # asked from the HTTP thread too

    def check(self) -> None:
        """Report a query or a source that died (once)."""
        failure = self.source.failure() if self.source is not None else None
        if failure is not None and self.error is None:
            self.error = failure
            self.metrics.error(self.cfg.name, "source_stopped")
            _log.error("entity.failed", entity=self.cfg.name, stream=FILES, error=failure)
        for stream, query in self.queries.items():
            if not query.isActive and self.error is None:
                exc = query.exception()
                detail = str(exc) if exc else "stopped"
                self.error = _cause(detail)
                self.metrics.error(self.cfg.name, "query_stopped")
                _log.error("entity.failed", entity=self.cfg.name, stream=stream, error=self.error,
                           detail=detail[-4000:])
