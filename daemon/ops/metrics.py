"""What the daemon measures about itself: Prometheus metrics, the /status document, an hour of history.

Runners record each batch (`batch_done`) and errors; the supervisor samples backlog and
freshness every few seconds (`sample`). `/metrics` renders the Prometheus text format from
this daemon's own registry; `/status` and the status page read `snapshot()`. Files, rows, batches
and quarantined rows are counted per entity and, for `/status` and `lakefeed status`, per stream
(an entity's sources: its landing folder, each push source, each Kafka source) too.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from lakefeed import clock, log
from lakefeed.pipeline.commit import BatchResult

HISTORY_S = 3600.0
_log = log.get(__name__)


@dataclass
class Figures:
    """What was committed: by one stream (source), or by all of an entity's streams."""

    files: int = 0
    rows: int = 0
    batches: int = 0
    quarantined: int = 0
    last_commit: float | None = None  # epoch seconds

    def add(self, result: BatchResult, now: float) -> None:
        self.files += result.files
        self.rows += result.rows
        self.batches += 1
        self.quarantined += result.quarantined
        self.last_commit = now

    def snapshot(self, now: float, started: float) -> dict[str, Any]:
        return {"files": self.files, "rows": self.rows, "batches": self.batches, "quarantined": self.quarantined,
                "last_commit": clock.to_cdm(clock.from_ns(int(self.last_commit * 1e9))) if self.last_commit else None,
                "freshness_s": round(now - (self.last_commit or started), 3)}


@dataclass
class EntityStats(Figures):
    """The entity's totals, and each stream's own figures (an entity may have several sources)."""

    streams: dict[str, Figures] = field(default_factory=dict)
    watermark: datetime | None = None
    backlog: dict[str, int] = field(default_factory=dict)  # per stream: files/frames/messages waiting
    history: deque = field(default_factory=deque)
    _rows_at_sample: int = 0
    _sampled_at: float | None = None


class Metrics:
    def __init__(self, sample_every_s: float = 10.0) -> None:
        self.sample_every_s = sample_every_s
        self.registry = CollectorRegistry()
        r = self.registry
        self.files = Counter("lakefeed_files", "Files ingested", ["entity"], registry=r)
        self.rows = Counter("lakefeed_rows", "Rows committed", ["entity"], registry=r)
        self.batches = Counter("lakefeed_batches", "Micro-batches committed", ["entity", "stream"], registry=r)
        self.duration = Histogram("lakefeed_batch_duration_seconds", "Micro-batch duration", ["entity", "stream"],
                                  buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120), registry=r)
        self.stage = Histogram("lakefeed_batch_stage_seconds", "Time in each stage of a micro-batch: collect (its "
                               "records from Spark), discover, tasks (read, decode, write), commit, manifests",
                               ["entity", "stream", "stage"],
                               buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60), registry=r)
        self.quarantined = Counter("lakefeed_quarantined_rows", "Rows sent to quarantine", ["entity"], registry=r)
        self.errors = Counter("lakefeed_errors", "Errors by kind", ["entity", "kind"], registry=r)
        self.backlog = Gauge("lakefeed_backlog", "Files, frames or messages waiting in a source",
                             ["entity", "stream"], registry=r)
        self.watermark = Gauge("lakefeed_watermark_seconds", "Event-time watermark (epoch seconds)", ["entity"],
                               registry=r)
        self.since_commit = Gauge("lakefeed_seconds_since_last_commit", "Freshness: seconds since the last commit",
                                  ["entity"], registry=r)
        self.running = Gauge("lakefeed_stream_running", "1 while a stream's query runs", ["entity", "stream"],
                             registry=r)
        self.missed = Counter("lakefeed_reconcile_found", "Objects found by listing that no notification "
                              "announced", ["entity"], registry=r)
        self.unavailable = Gauge("lakefeed_source_unavailable", "1 while a source's broker or store is being "
                                 "retried", ["entity", "stream"], registry=r)
        self.retries = Gauge("lakefeed_source_retries", "Retries of a source's broker calls since its query "
                             "started", ["entity", "stream"], registry=r)
        self._by_stream = (self.batches, self.duration, self.stage, self.backlog, self.running, self.unavailable,
                           self.retries)
        self._labelled = (*self._by_stream, self.files, self.rows, self.quarantined, self.errors, self.watermark,
                          self.since_commit, self.missed)
        self._lock = threading.Lock()
        self.entities: dict[str, EntityStats] = {}
        self.started = time.time()

    def stats(self, entity: str) -> EntityStats:
        with self._lock:
            if entity not in self.entities:
                history: deque = deque(maxlen=int(HISTORY_S / self.sample_every_s) + 1)
                self.entities[entity] = EntityStats(history=history)
            return self.entities[entity]

    def forget(self, entity: str, streams: Iterable[str] | None = None) -> None:
        """Drop an entity gone from the config (`streams`: only these of its sources), from /metrics and /status
        alike: its last backlog or `running` would otherwise be reported, and alerted on, for ever."""
        with self._lock:
            if streams is None:
                self.entities.pop(entity, None)
            elif (kept := self.entities.get(entity)) is not None:
                for stream in streams:
                    kept.streams.pop(stream, None)
                    kept.backlog.pop(stream, None)
        if streams is None:
            for metric in self._labelled:
                metric.remove_by_labels({"entity": entity})
            return
        for metric in self._by_stream:
            for stream in streams:
                metric.remove_by_labels({"entity": entity, "stream": stream})

    def batch_done(self, entity: str, stream: str, result: BatchResult, seconds: float) -> None:
        if result.files or result.rows or result.partitions:
            _log.info("batch.timed", entity=entity, stream=stream, batch_id=result.batch_id, seconds=round(seconds, 3),
                      stages=result.stages)
        s = self.stats(entity)
        self.duration.labels(entity, stream).observe(seconds)
        if result.skipped:
            return
        for stage, spent in result.stages.items():
            self.stage.labels(entity, stream, stage).observe(spent)
        self.batches.labels(entity, stream).inc()
        self.files.labels(entity).inc(result.files)
        self.rows.labels(entity).inc(result.rows)
        self.quarantined.labels(entity).inc(result.quarantined)
        now = time.time()
        with self._lock:
            s.add(result, now)
            s.streams.setdefault(stream, Figures()).add(result, now)
            if result.watermark is not None:
                s.watermark = result.watermark
        if result.watermark is not None:
            self.watermark.labels(entity).set(result.watermark.timestamp())

    def error(self, entity: str, kind: str) -> None:
        self.errors.labels(entity, kind).inc()

    def set_backlog(self, entity: str, stream: str, waiting: int, running: bool) -> None:
        self.backlog.labels(entity, stream).set(waiting)
        self.running.labels(entity, stream).set(1 if running else 0)
        s = self.stats(entity)
        with self._lock:
            s.backlog[stream] = waiting

    def set_source(self, entity: str, stream: str, unavailable: bool, retries: int) -> None:
        self.unavailable.labels(entity, stream).set(1 if unavailable else 0)
        self.retries.labels(entity, stream).set(retries)

    def sample(self, now: float | None = None) -> None:
        """Freshness gauges every call; a history point per entity every `sample_every_s`."""
        now = time.time() if now is None else now
        with self._lock:
            for name, s in self.entities.items():
                freshness = now - (s.last_commit or self.started)
                self.since_commit.labels(name).set(freshness)
                if s._sampled_at is not None and now - s._sampled_at < self.sample_every_s:
                    continue
                rate = (s.rows - s._rows_at_sample) / (now - s._sampled_at) if s._sampled_at else 0.0
                s.history.append({"t": round(now, 3), "freshness_s": round(freshness, 3),
                                  "backlog": sum(s.backlog.values()), "rows_per_s": round(rate, 3),
                                  "watermark": s.watermark.timestamp() if s.watermark else None})
                s._rows_at_sample, s._sampled_at = s.rows, now

    def prometheus(self) -> bytes:
        self.sample()
        return generate_latest(self.registry)

    def snapshot(self) -> dict[str, Any]:
        now = time.time()
        with self._lock:
            return {name: {
                **s.snapshot(now, self.started),
                "watermark": clock.to_cdm(s.watermark) if s.watermark else None,
                "backlog": dict(s.backlog),
                "history": list(s.history),
                # Streams sampled but without a commit yet too: their freshness counts from the start, as the entity's.
                "streams": {stream: s.streams.get(stream, Figures()).snapshot(now, self.started)
                            for stream in s.streams.keys() | s.backlog.keys()},
            } for name, s in self.entities.items()}
