"""The supervisor: one streaming query per entity, their sources, and the process lifecycle.

Signal handlers only set flags; the main loop does the work. Shutdown stops intake first
(sources stop enqueueing), lets each running micro-batch finish within the timeout, then
stops the queries. Whatever a stop interrupts is replayed exactly once from the checkpoint
at the next start.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import ExitStack
from types import FrameType

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from lakefeed import log, spark
from lakefeed.commit import Sinks
from lakefeed.config import EntityConfig, LakefeedConfig
from lakefeed.connectors.inbox_stream import FORMAT
from lakefeed.connectors.local_dir import LocalDirSource
from lakefeed.errors import LakefeedError
from lakefeed.inbox import Inbox, InboxRecord
from lakefeed.notify import notify
from lakefeed.pipeline import EntityPipeline

_log = log.get(__name__)
_WAITING = ("Waiting for data to arrive", "Waiting for next trigger")


class EntityRunner:
    def __init__(self, session: SparkSession, cfg: EntityConfig, trigger_interval_s: float,
                 excluded: tuple) -> None:
        self.cfg = cfg
        self._spark = session
        self._trigger = f"{int(trigger_interval_s * 1000)} milliseconds"
        self.pipeline = EntityPipeline(cfg, Sinks.delta_rs(cfg))
        self.inbox = Inbox(cfg.state / "inbox")
        self.source = LocalDirSource(cfg.name, cfg.source.path, self.inbox, cfg.source.reconcile_interval_s,
                                     excluded=excluded)
        self.query: StreamingQuery | None = None
        self.error: str | None = None

    def start(self) -> None:
        self.pipeline.prepare()
        self.source.start()
        frame = (self._spark.readStream.format(FORMAT)
                 .option("path", str(self.cfg.state / "inbox"))
                 .option("maxFilesPerTrigger", str(self.cfg.source.max_files_per_trigger))
                 .load())
        self.query = (frame.writeStream.foreachBatch(self._batch)
                      .option("checkpointLocation", str(self.cfg.checkpoint))
                      .queryName(f"lakefeed_{self.cfg.name}")
                      .trigger(processingTime=self._trigger)
                      .start())
        # Ready means the query has run its first trigger (a new query's first batch is always an
        # empty one), so the first file landing is not kept waiting behind start-up work.
        deadline = time.monotonic() + 120
        while (self.query.isActive and self.query.status["message"] not in _WAITING
               and time.monotonic() < deadline):
            time.sleep(0.05)
        _log.info("entity.started", entity=self.cfg.name, query_id=str(self.query.id))

    def _batch(self, frame: DataFrame, batch_id: int) -> None:
        records = sorted((InboxRecord(*row) for row in frame.collect()), key=lambda r: r.offset)
        try:
            self.pipeline.process(records, batch_id)
        except LakefeedError as exc:
            self.error = str(exc)
            _log.error("entity.failed", entity=self.cfg.name, batch_id=batch_id, error=str(exc))
            raise

    def stop_intake(self) -> None:
        self.source.stop()

    def stop(self, deadline: float) -> None:
        if self.query is None:
            return
        # Let a running batch finish: stop() would interrupt it (it would be replayed at restart).
        while self.query.isActive and self.query.status["isTriggerActive"] and time.monotonic() < deadline:
            time.sleep(0.05)
        self.query.stop()
        self.inbox.close()
        _log.info("entity.stopped", entity=self.cfg.name)

    def check(self) -> None:
        """Report a query that died (once)."""
        if self.query is not None and not self.query.isActive and self.error is None:
            exc = self.query.exception()
            self.error = str(exc) if exc else "stopped"
            _log.error("entity.failed", entity=self.cfg.name, error=self.error[:2000])


class Supervisor:
    def __init__(self, cfg: LakefeedConfig) -> None:
        self.cfg = cfg
        self._stop = threading.Event()
        self._signals = 0
        self.runners: list[EntityRunner] = []

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals > 1:
            os._exit(128 + signum)  # a second signal: the operator does not want to wait
        self._stop.set()

    def run(self) -> int:
        session = spark.session(self.cfg.spark)
        # After the SparkContext exists: it installs a SIGINT handler of its own that raises
        # KeyboardInterrupt, which would skip the graceful stop.
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._on_signal)
        spark.warm_up(session)
        excluded = (self.cfg.lake_dir, self.cfg.state_dir)
        with ExitStack() as stack:
            stack.callback(session.stop)
            for entity in self.cfg.entities:
                runner = EntityRunner(session, entity, self.cfg.spark.trigger_interval_s, excluded)
                try:
                    runner.start()
                except LakefeedError as exc:
                    runner.error = str(exc)
                    runner.stop_intake()
                    _log.error("entity.failed", entity=entity.name, error=str(exc))
                self.runners.append(runner)
            running = [r.cfg.name for r in self.runners if r.error is None]
            _log.info("daemon.ready", entities=running)
            failed = len(self.runners) - len(running)
            notify(READY="1", STATUS=f"{len(running)} entities running" + (f", {failed} failed" if failed else ""))
            while not self._stop.wait(0.5):
                for runner in self.runners:
                    runner.check()
            _log.info("daemon.stopping")
            notify(STOPPING="1", STATUS="stopping: finishing running batches")
            for runner in self.runners:
                runner.stop_intake()
            deadline = time.monotonic() + self.cfg.shutdown_timeout_s
            for runner in self.runners:
                runner.stop(deadline)
        _log.info("daemon.stopped")
        return 0
