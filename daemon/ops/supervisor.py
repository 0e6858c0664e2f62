"""The supervisor: the entities' runners, the HTTP servers, the intake process and the lifecycle.

The daemon's port is served by the intake process (daemon/intake/process.py: push requests and their
spools); the rest of what the port offers (health, metrics, status, webhooks) is served here on
a unix socket the intake passes those requests to.

Signal handlers only set flags; the main loop does the work (uvicorn's pattern). SIGTERM and SIGINT stop: intake
first (pushes get 503, sources stop), then each running micro-batch finishes and commits, then the queries stop; a
second signal exits at once. A file batch still running when `shutdown_timeout_s` is up is given up between files;
if the stop is still not done `stop_grace_s` later (a batch stuck where it cannot be given up), the daemon exits (as
on a second signal). SIGHUP, or the config file changing on disk, reloads: the new config is validated whole, and
only entities whose config changed are restarted (their checkpoints and spools intact); the others keep running
untouched. Whatever a stop interrupts is replayed exactly once at the next start.

systemd (sd_notify): READY=1 once every query runs, STATUS= a one-line summary,
RELOADING=1 + MONOTONIC_USEC= then READY=1 around a reload, STOPPING=1, and WATCHDOG=1 only
while every stream is healthy (running, and making progress or idle with nothing waiting) and the
intake process serves the port.
"""

from __future__ import annotations

import gc
import os
import secrets
import signal
import sys
import threading
import time
from pathlib import Path

from pyspark.sql import SparkSession

from lakefeed import failpoints, log
from lakefeed.config import model as config
from lakefeed.config.model import EntityConfig, LakefeedConfig
from lakefeed.config.sources import WebhookNotifications
from lakefeed.config.watch import ConfigWatcher
from lakefeed.connectors.sinks import cdm_manifest
from lakefeed.connectors.sources.s3_landing import S3Landing
from lakefeed.errors import ConfigError, LakefeedError
from lakefeed.intake import http_server
from lakefeed.intake.client import IntakeProcess
from lakefeed.intake.http_server import HttpServer
from lakefeed.intake.s3_webhook import Webhooks
from lakefeed.ops import priority, signals, spark, status_api, writers
from lakefeed.ops.compactions import Compactions
from lakefeed.ops.metrics import Metrics
from lakefeed.ops.notify import notify, watchdog_fed, watchdog_interval
from lakefeed.ops.runner import EntityRunner

_log = log.get(__name__)
# Changing these needs a restart: they shape the process (Spark session, listening socket, folders).
RESTART_FIELDS = ("lake_dir", "state_dir", "spark", "http")


class Supervisor:
    def __init__(self, cfg: LakefeedConfig, config_path: Path | None = None, drain: bool = False) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.drain = drain  # backfill: process what is pending, then stop
        self._watcher: ConfigWatcher | None = None  # the config file and the data manifests it names
        self.metrics = Metrics(cfg.status_sample_s)
        self.runners: dict[str, EntityRunner] = {}
        self.config_problems: list[str] = []
        self.needs_restart: list[str] = []
        self.ready = False
        self.url = ""
        self._stop = threading.Event()
        self._reload = threading.Event()
        self._signals = 0
        self._session: SparkSession | None = None
        self._excluded: tuple = ()
        self.intake: IntakeProcess | None = None  # none in a backfill: it serves no HTTP
        self.webhooks = Webhooks()
        self.compactions = Compactions(lambda: self.runners, secrets.token_urlsafe(32), self._stop.is_set)

    def _on_signal(self, signum: int) -> None:
        """In the thread `signals` (daemon/ops/signals.py), never in a handler: it may wait for any lock, and answers
        while the main thread is in C (a Spark call), where a Python handler would wait for it."""
        if signum == signal.SIGUSR2:
            log.print_stacks(signum, None)
            return
        if signum == signal.SIGHUP:
            self._reload.set()
            return
        self._signals += 1
        if self._signals > 1:
            os._exit(128 + signum)  # a second signal: the operator does not want to wait
        self._stop.set()  # the backstop's clock starts now, wherever the main loop is

    def request_stop(self) -> None:
        self._stop.set()

    def run(self) -> int:
        # An abstract unix socket: no path to clean up, and only this host's processes reach it.
        local = HttpServer(self.cfg.http, [*self.webhooks.routes(), *status_api.routes(self),
                                           *self.compactions.routes()],
                           unix=f"\0lakefeed-{os.getpid()}-{secrets.token_hex(4)}")
        own_session = priority.leads_own_session()
        try:
            if not self.drain:
                local.start()
                self.intake = IntakeProcess(self.cfg.http, local.unix or "", self.cfg.log_level,
                                            own_session=own_session)
                self.url = self.intake.start()  # before the priority drops: the intake keeps the higher one
                http_server.publish(self.cfg.state_dir, self.url, self.compactions.token)
            priority.lower(self.cfg.spark.nice, autogroup=own_session)
            self._run_spark()
        finally:
            if self.intake is not None:  # last: until here pushes get 503 and /healthz, /status answer
                self.intake.stop()
                http_server.publish(self.cfg.state_dir, None)
            local.stop()
        _log.info("daemon.stopped")
        return 0

    def _run_spark(self) -> None:
        session = self._session = spark.session(self.cfg.spark, packages=writers.spark_packages(self.cfg))
        threading.Thread(target=self._backstop, name="stop-backstop", daemon=True).start()
        # After the SparkContext exists: it installs a SIGINT handler of its own that raises
        # KeyboardInterrupt, which would skip the graceful stop.
        if threading.current_thread() is threading.main_thread():
            signals.route((signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2), self._on_signal)
        try:
            writers.warm_up(self.cfg, session)
            self._excluded = (self.cfg.lake_dir, self.cfg.state_dir)
            watcher = ConfigWatcher(self.config_path, self._reload.set, self.cfg.described_by,
                                    cdm_manifest.written_here) \
                if self.config_path and not self.drain else None
            self._watcher = watcher
            try:
                for entity in self.cfg.entities:  # their queries' first triggers run side by side
                    self._start(entity, wait=False)
                for runner in self.runners.values():
                    runner.wait_started(list(runner.queries))
                self._serve(watcher)
            finally:
                self._stop.set()  # a backfill drained, or an error: the backstop times this stop too
                if self.intake is not None:
                    self.intake.accepting(False)  # pushes get 503 from now on; acknowledged ones are in the spools
                _log.info("daemon.stopping")  # after the intake has answered: no push is acknowledged from here on
                notify(STOPPING="1", STATUS="stopping: finishing running batches")
                if watcher is not None:
                    watcher.stop()
                for runner in self.runners.values():
                    runner.stop_intake()
                deadline = time.monotonic() + self.cfg.shutdown_timeout_s
                for runner in self.runners.values():
                    runner.stop(deadline)
        finally:
            session.stop()

    def _backstop(self) -> None:
        """A thread of its own, started with the session: exit when a stop is not done in time (under systemd,
        TimeoutStopSec would SIGKILL the daemon and say less). Its clock starts when the stop is asked for, so a
        main loop stuck in a call is timed too, and the signal handler starts no thread. Whatever a stop
        interrupts is replayed at the next start, as after a SIGKILL."""
        self._stop.wait()
        after_s = self.cfg.shutdown_timeout_s + self.cfg.stop_grace_s
        time.sleep(after_s)
        running = sorted(n for n, r in self.runners.items() if r.queries)
        log.print_stacks(0, None)  # what the stop waited on
        _log.error("daemon.stop_forced", after_s=after_s, entities=running,
                   reason="the running batches did not end in time; they are replayed at the next start")
        sys.stderr.flush()
        os._exit(128 + signal.SIGTERM)

    def _serve(self, watcher: ConfigWatcher | None) -> None:
        running = [n for n, r in self.runners.items() if r.error is None]
        # What start-up made (PySpark, pyarrow, pandas, the config…) lives as long as the daemon. Frozen, a full
        # cyclic collection no longer walks it: unfrozen, one walks ~150k objects (~0.1 s on an idle core)
        # holding the GIL that the HTTP loop shares, a pause every push request in flight waits out.
        gc.freeze()
        if self.intake is not None:
            self.intake.started()  # pushes to unknown targets were 503 (starting) until now; 404 from here on
        self.ready = True
        _log.info("daemon.ready", entities=running, http=self.url or None)
        notify(READY="1", STATUS=self.status_line())
        if watcher is not None:
            watcher.start()
        watchdog_s = watchdog_interval()
        last_ping = last_status = 0.0
        status = ""
        while not self._stop.wait(0.25):
            failpoints.reached("supervisor.tick")
            if self._reload.is_set():
                self._reload.clear()
                self.reload()
            if self.intake is not None:
                self.intake.check()
            healthy = self.intake is None or self.intake.pid is not None
            self._revive()
            for runner in list(self.runners.values()):
                runner.check()
                runner.sample()
                healthy &= runner.healthy(self.cfg.stall_timeout_s)
            self.metrics.sample()
            now = time.monotonic()
            if watchdog_s and healthy and now - last_ping >= watchdog_s:
                notify(WATCHDOG="1")
                last_ping = now
            if now - last_status >= 5:
                line = self.status_line()
                if line != status:
                    notify(STATUS=line)
                    status = line
                last_status = now
            if self.drain and all(r.drained() for r in self.runners.values()):
                _log.info("backfill.drained", entities=list(self.runners))
                break

    def status_line(self) -> str:
        runners = dict(self.runners)  # /status asks too, from the HTTP thread, while a reload changes them
        failed = [n for n, r in runners.items() if r.error is not None]
        backlog = sum(r.backlog(s) for r in runners.values() for s in list(r.queries))
        line = f"{len(runners) - len(failed)} entities running"
        if failed:
            line += f", {len(failed)} failed ({', '.join(failed)})"
        line += f", backlog {backlog}"
        if self.config_problems:
            line += f"; config reload rejected ({len(self.config_problems)} problems), old config kept"
        if self.needs_restart:
            line += f"; restart needed for {', '.join(self.needs_restart)}"
        return line

    def _start(self, entity: EntityConfig, wait: bool = True) -> None:
        assert self._session is not None
        runner = EntityRunner(self._session, entity, self.cfg.spark.trigger_interval_s, self._excluded,
                              self.metrics, self.intake)
        self.runners[entity.name] = runner
        if isinstance(runner.source, S3Landing):
            for hook in (n for n in runner.source.source.notifications if isinstance(n, WebhookNotifications)):
                self.webhooks.attach(runner.source, hook, entity.storage)
        try:
            runner.start(reconcile_first=self.drain, wait=wait)
        except LakefeedError as exc:
            runner.stopped_by(exc)
            runner.stop_intake()
            self.metrics.error(entity.name, type(exc).__name__)
            _log.error("entity.failed", entity=entity.name, error=str(exc))
        self._attach(runner, [p.name for p in entity.push])

    def _revive(self) -> None:
        """Start again, without a restart of the daemon, an entity stopped by an error lakefeed reported (an
        invalid manifest, say) once the file it failed on has changed: fixed, restored or removed."""
        for name, runner in list(self.runners.items()):
            if runner.error is None or not runner.terminal:
                continue
            where, version = runner.failed_on or (runner.cfg.manifest, None)
            if cdm_manifest.file_version(where) != version:
                _log.info("entity.reviving", entity=name, reason=f"{where} changed")
                with watchdog_fed():  # its start may take a while; the other entities go on meanwhile
                    self._restart(name)

    def _restart(self, name: str) -> None:
        entity = self.runners[name].cfg
        self._stop_entity(name)
        self._start(entity)
        if self.intake is not None:
            self.intake.resume([(name, p.name) for p in entity.push])

    def _attach(self, runner: EntityRunner, streams: list[str]) -> None:
        """Have the intake serve these push sources of the runner's entity (after the runner started)."""
        if self.intake is None or not streams:
            return
        sources = [p for s in streams if (p := runner.cfg.push_source(s)) is not None]
        try:
            self.intake.attach(runner.cfg, sources, runner.pipeline.push_schema())
        except LakefeedError as exc:
            runner.stopped_by(exc)
            self.metrics.error(runner.cfg.name, type(exc).__name__)
            _log.error("entity.failed", entity=runner.cfg.name, error=str(exc))

    def _stop_entity(self, name: str) -> None:
        """Stop an entity. Its runner stays listed, not running, until `_start` replaces it or a removal drops it:
        /readyz must not answer ready while an entity is between its stop and its start again."""
        runner = self.runners[name]
        runner.stop_intake()  # from here it is not running
        _log.info("entity.stopping", entity=name)
        self.webhooks.detach(name)
        targets = [(name, p.name) for p in runner.cfg.push]
        if self.intake is not None:
            self.intake.pause(targets)  # pushes get 503 + Retry-After until the entity is back (or gone)
        runner.stop(time.monotonic() + self.cfg.shutdown_timeout_s)
        if self.intake is not None:
            self.intake.detach(targets)

    def _failed(self, name: str) -> bool:
        runner = self.runners.get(name)
        return runner is not None and runner.error is not None

    def _reconfigure(self, name: str, new: EntityConfig, streams: list[str]) -> None:
        """Restart only the record sources of an entity that changed; its other streams keep running."""
        runner = self.runners[name]
        targets = [(name, s) for s in streams if runner.cfg.push_source(s) is not None]
        if self.intake is not None:
            self.intake.pause(targets)
        runner.reconfigure(new, streams, time.monotonic() + self.cfg.shutdown_timeout_s)
        if self.intake is not None:
            self.intake.detach(targets)
            self._attach(runner, streams)
            self.intake.resume(targets)

    def reload(self) -> None:
        """Apply the config file again: validate it whole, then start, stop or restart what changed."""
        if self.config_path is None:
            return
        try:
            new = config.load(self.config_path)
        except ConfigError as exc:
            self.config_problems = exc.problems
            for problem in exc.problems:
                _log.error("config.invalid", problem=problem)
            _log.error("reload.rejected", problems=len(exc.problems), reason="the running config is kept")
            notify(STATUS=self.status_line())
            return
        except Exception as exc:  # noqa: BLE001 - a file nobody foresaw must not end the daemon that reads it
            self.config_problems = [f"{self.config_path}: (config): could not be read: {type(exc).__name__}: {exc}"]
            _log.exception("reload.failed", reason="the running config is kept")
            notify(STATUS=self.status_line())
            return
        notify(RELOADING="1", MONOTONIC_USEC=str(time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000))
        # A reload waits for running batches (up to shutdown_timeout_s): it is progress, not a hang,
        # so the watchdog keeps being fed meanwhile.
        if self._watcher is not None:
            self._watcher.watch(new.described_by)
        with watchdog_fed():
            self._apply(new)
        notify(READY="1", STATUS=self.status_line())

    def _apply(self, new: LakefeedConfig) -> None:
        self.config_problems = []
        self.needs_restart = [f for f in RESTART_FIELDS if getattr(new, f) != getattr(self.cfg, f)]
        assert self._session is not None
        new, waiting = writers.until_restart(new, self._session)
        old = {e.name: e for e in self.cfg.entities}
        wanted = {e.name: e for e in new.entities}
        removed = [n for n in old if n not in wanted]
        added = [n for n in wanted if n not in old]
        changed = [n for n in wanted if n in old and wanted[n] != old[n]]
        in_place = {n: _changed_record_sources(old[n], wanted[n]) for n in changed if not self._failed(n)}
        in_place = {n: streams for n, streams in in_place.items() if streams is not None}
        # A failed entity is started again by any reload: its manifest may have been fixed meanwhile.
        changed += [n for n in wanted if n in old and wanted[n] == old[n] and self._failed(n)]
        for name, streams in in_place.items():
            self._reconfigure(name, wanted[name], streams)
        changed = [n for n in changed if n not in in_place]
        for name in removed + changed:
            self._stop_entity(name)
        for name in removed:
            del self.runners[name]
            self.metrics.forget(name)
        for name in changed + list(in_place):
            self.metrics.forget(name, set(old[name].streams()) - set(wanted[name].streams()))
        if self.intake is not None:  # gone: their pushes get 404 now, not 503
            self.intake.resume([(n, p.name) for n in removed for p in old[n].push])
        if new.log_level != self.cfg.log_level:
            log.configure(new.log_level)
        # What needs a restart keeps its running value until then.
        self.cfg = new.model_copy(update={f: getattr(self.cfg, f) for f in self.needs_restart})
        self.needs_restart += [f"entities.{name}.writer" for name in waiting]
        for name in changed + added:
            self._start(wanted[name])
        for name in changed:
            if self.intake is not None:
                self.intake.resume([(name, p.name) for p in self.runners[name].cfg.push])
        _log.info("reload.applied", added=added, removed=removed, restarted=changed,
                  sources_restarted={n: s for n, s in in_place.items()},
                  unchanged=[n for n in wanted if n not in added and n not in changed and n not in in_place],
                  needs_restart=self.needs_restart)


def _changed_record_sources(old: EntityConfig, new: EntityConfig) -> list[str] | None:
    """The push/Kafka sources that differ, when nothing else of the entity does (else None)."""
    if old.model_copy(update={"push": new.push, "kafka": new.kafka}) != new:
        return None
    before = {s.name: s for s in (*old.push, *old.kafka)}
    after = {s.name: s for s in (*new.push, *new.kafka)}
    return sorted(n for n in before.keys() | after.keys() if before.get(n) != after.get(n))
