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
from functools import partial
from types import FrameType

from aiohttp import web
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from lakefeed import log, openapi, spark
from lakefeed.commit import Sinks
from lakefeed.config import FILES, EntityConfig, LakefeedConfig
from lakefeed.connectors.inbox_stream import FORMAT as INBOX
from lakefeed.connectors.local_dir import LocalDirSource
from lakefeed.connectors.spool_stream import FORMAT as SPOOL
from lakefeed.errors import LakefeedError
from lakefeed.http_server import HttpServer
from lakefeed.inbox import Inbox, InboxRecord
from lakefeed.notify import notify
from lakefeed.pipeline import EntityPipeline
from lakefeed.push_api import Endpoint, PushApi
from lakefeed.spool import Entry

_log = log.get(__name__)
_WAITING = ("Waiting for data to arrive", "Waiting for next trigger")


class EntityRunner:
    """An entity's pipeline and one streaming query per source: its files and each push source."""

    def __init__(self, session: SparkSession, cfg: EntityConfig, trigger_interval_s: float,
                 excluded: tuple) -> None:
        self.cfg = cfg
        self._spark = session
        self._trigger = f"{int(trigger_interval_s * 1000)} milliseconds"
        self.pipeline = EntityPipeline(cfg, Sinks.delta_rs(cfg))
        self.inbox: Inbox | None = None
        self.source: LocalDirSource | None = None
        if cfg.source is not None:
            self.inbox = Inbox(cfg.state / "inbox")
            self.source = LocalDirSource(cfg.name, cfg.source.path, self.inbox, cfg.source.reconcile_interval_s,
                                         excluded=excluded)
        self.endpoints = {p.name: Endpoint.open(cfg, p, self.pipeline) for p in cfg.push}
        self.queries: dict[str, StreamingQuery] = {}
        self.error: str | None = None

    def start(self) -> None:
        self.pipeline.prepare()
        if self.source is not None:
            self.source.start()
        for stream in self.cfg.streams():
            self.queries[stream] = self._start_query(stream)
        # Ready means each query has run its first trigger (a new query's first batch is always an
        # empty one), so the first file landing is not kept waiting behind start-up work.
        deadline = time.monotonic() + 120
        for query in self.queries.values():
            while query.isActive and query.status["message"] not in _WAITING and time.monotonic() < deadline:
                time.sleep(0.05)
        _log.info("entity.started", entity=self.cfg.name, streams=list(self.queries))

    def _start_query(self, stream: str) -> StreamingQuery:
        if stream == FILES:
            assert self.cfg.source is not None
            frame = (self._spark.readStream.format(INBOX).option("path", str(self.cfg.state / "inbox"))
                     .option("maxFilesPerTrigger", str(self.cfg.source.max_files_per_trigger)).load())
            handler = self._file_batch
        else:
            push = self.cfg.push_source(stream)
            assert push is not None
            frame = (self._spark.readStream.format(SPOOL).option("path", str(self.cfg.spool(stream)))
                     .option("maxRecordsPerTrigger", str(push.max_records_per_trigger)).load())
            handler = partial(self._push_batch, stream)
        return (frame.writeStream.foreachBatch(handler)
                .option("checkpointLocation", str(self.cfg.stream_checkpoint(stream)))
                .queryName(f"lakefeed_{self.cfg.name}_{stream}")
                .trigger(processingTime=self._trigger)
                .start())

    def _file_batch(self, frame: DataFrame, batch_id: int) -> None:
        records = sorted((InboxRecord(*row) for row in frame.collect()), key=lambda r: r.offset)
        self._guarded(lambda: self.pipeline.process(records, batch_id), batch_id)

    def _push_batch(self, stream: str, frame: DataFrame, batch_id: int) -> None:
        entries = sorted((Entry(*row) for row in frame.collect()), key=lambda e: e.offset)
        if entries:
            # Batches before this one are in Spark's commit log: their frames are no longer needed.
            self.endpoints[stream].spool.release(entries[0].offset)
        self._guarded(lambda: self.pipeline.process_frames(stream, entries, batch_id), batch_id)

    def _guarded(self, work, batch_id: int) -> None:
        try:
            work()
        except LakefeedError as exc:
            self.error = str(exc)
            _log.error("entity.failed", entity=self.cfg.name, batch_id=batch_id, error=str(exc))
            raise

    def stop_intake(self) -> None:
        if self.source is not None:
            self.source.stop()

    def stop(self, deadline: float) -> None:
        for query in self.queries.values():
            # Let a running batch finish: stop() would interrupt it (it would be replayed at restart).
            while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
                time.sleep(0.05)
            query.stop()
        if self.inbox is not None:
            self.inbox.close()
        for endpoint in self.endpoints.values():
            endpoint.close()
        _log.info("entity.stopped", entity=self.cfg.name)

    def running(self) -> bool:
        return self.error is None and bool(self.queries) and all(q.isActive for q in self.queries.values())

    def check(self) -> None:
        """Report a query that died (once)."""
        for stream, query in self.queries.items():
            if not query.isActive and self.error is None:
                exc = query.exception()
                self.error = str(exc) if exc else "stopped"
                _log.error("entity.failed", entity=self.cfg.name, stream=stream, error=self.error[:2000])


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
            self.runners = [EntityRunner(session, entity, self.cfg.spark.trigger_interval_s, excluded)
                            for entity in self.cfg.entities]
            api = PushApi([e for r in self.runners for e in r.endpoints.values()], self.cfg.http.max_body_bytes)
            http = HttpServer(self.cfg.http, self.cfg.state_dir, [*api.routes(), *self._routes()])
            try:
                http.start()
            except LakefeedError:
                for runner in self.runners:
                    runner.stop(time.monotonic())
                raise
            for runner in self.runners:
                try:
                    runner.start()
                except LakefeedError as exc:
                    runner.error = str(exc)
                    runner.stop_intake()
                    _log.error("entity.failed", entity=runner.cfg.name, error=str(exc))
            running = [r.cfg.name for r in self.runners if r.error is None]
            _log.info("daemon.ready", entities=running, http=http.url)
            failed = len(self.runners) - len(running)
            notify(READY="1", STATUS=f"{len(running)} entities running" + (f", {failed} failed" if failed else ""))
            while not self._stop.wait(0.5):
                for runner in self.runners:
                    runner.check()
            _log.info("daemon.stopping")
            notify(STOPPING="1", STATUS="stopping: finishing running batches")
            api.accepting = False  # pushes get 503 from now on; acknowledged ones are in the spools
            for runner in self.runners:
                runner.stop_intake()
            http.stop()
            api.close()
            deadline = time.monotonic() + self.cfg.shutdown_timeout_s
            for runner in self.runners:
                runner.stop(deadline)
        _log.info("daemon.stopped")
        return 0

    def _routes(self) -> list[web.RouteDef]:
        async def healthz(_: web.Request) -> web.Response:
            return web.json_response({"status": "alive"})

        async def readyz(_: web.Request) -> web.Response:
            down = [r.cfg.name for r in self.runners if not r.running()]
            return web.json_response({"ready": not down, "not_running": down}, status=503 if down else 200)

        async def openapi_json(_: web.Request) -> web.Response:
            return web.json_response(openapi.document())

        return [web.get("/healthz", healthz), web.get("/readyz", readyz), web.get("/openapi.json", openapi_json)]
