"""What the daemon measures about itself: Prometheus metrics, the /status document, an hour of history.

Runners record each batch (`batch_done`) and errors; the supervisor samples backlog and
freshness every few seconds (`sample`). `/metrics` renders the Prometheus text format from
this daemon's own registry; `/status` and the status page read `snapshot()`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from lakefeed import clock
from lakefeed.pipeline.commit import BatchResult

HISTORY_S = 3600.0


@dataclass
class EntityStats:
    files: int = 0
    rows: int = 0
    batches: int = 0
    quarantined: int = 0
    last_commit: float | None = None  # epoch seconds
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
        self._lock = threading.Lock()
        self.entities: dict[str, EntityStats] = {}
        self.started = time.time()

    def stats(self, entity: str) -> EntityStats:
        with self._lock:
            if entity not in self.entities:
                history: deque = deque(maxlen=int(HISTORY_S / self.sample_every_s) + 1)
                self.entities[entity] = EntityStats(history=history)
            return self.entities[entity]

    def forget(self, entity: str) -> None:
        with self._lock:
            self.entities.pop(entity, None)

    def batch_done(self, entity: str, stream: str, result: BatchResult, seconds: float) -> None:
        s = self.stats(entity)
        self.duration.labels(entity, stream).observe(seconds)
        if result.skipped:
            return
        self.batches.labels(entity, stream).inc()
        self.files.labels(entity).inc(result.files)
        self.rows.labels(entity).inc(result.rows)
        self.quarantined.labels(entity).inc(result.quarantined)
        with self._lock:
            s.files += result.files
            s.rows += result.rows
            s.batches += 1
            s.quarantined += result.quarantined
            s.last_commit = time.time()
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
                "files": s.files, "rows": s.rows, "batches": s.batches, "quarantined": s.quarantined,
                "last_commit": clock.to_cdm(clock.from_ns(int(s.last_commit * 1e9))) if s.last_commit else None,
                "freshness_s": round(now - (s.last_commit or self.started), 3),
                "watermark": clock.to_cdm(s.watermark) if s.watermark else None,
                "backlog": dict(s.backlog),
                "history": list(s.history),
            } for name, s in self.entities.items()}
