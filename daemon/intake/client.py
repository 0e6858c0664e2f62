"""The daemon's side of the intake process (daemon/intake/process.py): start it, drive it, restart it.

The client keeps what the intake should be serving (the attached push sources, their tables'
schemas, paused sources, whether pushes are accepted), so that an intake that died is started
again in the same state by `check`. The operations that follow a commit (`schema`, `release`)
never fail the batch sending them: with the intake down, the schema waits for the restart and
the release for the next batch (it releases everything below its first offset).
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from lakefeed import log
from lakefeed.config.model import EntityConfig, HttpConfig, PushSource
from lakefeed.errors import LakefeedError, TerminalError

_log = log.get(__name__)
Target = tuple[str, str]  # (entity, push source)


class IntakeDown(LakefeedError):
    """The intake process is not running (it is restarted by the supervisor's next check)."""


class IntakeProcess:
    def __init__(self, http: HttpConfig, upstream: str, log_level: str, start_timeout_s: float = 60.0,
                 own_session: bool = False) -> None:
        self._settings = {"http": http, "upstream": upstream, "log_level": log_level}
        self._start_timeout_s = start_timeout_s
        self._own_session = own_session  # its own session, so its own scheduler autogroup (daemon/ops/supervisor.py)
        self._attached: dict[Target, tuple[EntityConfig, PushSource]] = {}
        self._schemas: dict[str, pa.Schema | str | None] = {}
        self._paused: set[Target] = set()
        self._accepting = True
        self._started = False  # every entity attached: an unknown push target is then a 404, not "starting"
        self._lock = threading.RLock()  # one operation at a time on the pipe
        self._proc: subprocess.Popen | None = None
        self._conn: Any = None
        self._retry_at = 0.0
        # Processes are started from this one thread, made at the first start: a restarted intake gets the
        # priority the first one got, not the lower one the daemon gives itself afterwards (daemon/ops/supervisor.py).
        self._launcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="intake-launcher")
        self.url = ""

    @property
    def pid(self) -> int | None:
        """The running intake process's pid."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def start(self) -> str:
        """Start the process, wait until it listens, bring it to the kept state; return its URL."""
        with self._lock:
            ours, theirs = multiprocessing.Pipe()
            self._proc = self._launcher.submit(
                subprocess.Popen,
                [sys.executable, "-m", "lakefeed.intake", str(theirs.fileno()), str(os.getpid())],
                pass_fds=(theirs.fileno(),), start_new_session=self._own_session).result()
            theirs.close()
            self._conn = ours
            ours.send(self._settings)
            status, value = self._answer("start", self._start_timeout_s)
            if status != "ok":
                self._proc.wait()
                ours.close()
                self._conn = None
                raise TerminalError(value)
            self.url = value
            # A restarted intake listens where this one does, also when the config says port 0.
            self._settings["http"] = self._settings["http"].model_copy(update={"port": int(value.rsplit(":", 1)[1])})
            for target, (cfg, source) in self._attached.items():
                self._call("attach", cfg, source, self._schemas.get(target[0]))
            if self._paused:
                self._call("pause", sorted(self._paused))
            if not self._accepting:
                self._call("accepting", False)
            if self._started:
                self._call("started")
            _log.info("intake.started", pid=self._proc.pid, url=self.url, sources=len(self._attached))
            return self.url

    def _answer(self, op: str, timeout: float) -> tuple[str, Any]:
        try:
            if not self._conn.poll(timeout):  # hung: killed by `_down`, started again by the next `check`
                raise TimeoutError(f"no answer in {timeout:g} s")
            return self._conn.recv()
        except (OSError, EOFError) as exc:  # TimeoutError is an OSError
            self._down(op, exc)
            raise IntakeDown(f"the intake process is not running ({op}: {exc or type(exc).__name__})") from exc

    def _call(self, op: str, *args: Any, timeout: float = 60.0) -> Any:
        with self._lock:
            if self._conn is None:
                raise IntakeDown("the intake process is not running")
            try:
                self._conn.send((op, args))
            except OSError as exc:
                self._down(op, exc)
                raise IntakeDown(f"the intake process is not running ({op}: {exc})") from exc
            status, value = self._answer(op, timeout)
        if status != "ok":
            raise LakefeedError(f"the intake process could not {op}: {value}")
        return value

    def _down(self, op: str, exc: BaseException) -> None:
        """The process is lost, whichever operation found it so first (a call, or `check`): once per process."""
        _log.error("intake.lost", operation=op, error=str(exc) or type(exc).__name__)
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()  # it stopped answering: the next one must not share the spools with it
                self._proc.wait()
            _log.error("intake.exited", returncode=self._proc.returncode)
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    def _quietly(self, op: str, *args: Any) -> Any:
        try:
            return self._call(op, *args)
        except LakefeedError as exc:
            _log.warning("intake.operation_skipped", operation=op, error=str(exc))
            return None

    def attach(self, cfg: EntityConfig, sources: list[PushSource], schema: pa.Schema | str | None) -> None:
        """Serve these push sources of the entity; `schema` as for `schema`. Raises LakefeedError when the
        intake cannot open a source's spool; an intake that is down gets the sources when it is restarted."""
        self._schemas[cfg.name] = schema
        for source in sources:
            self._attached[(cfg.name, source.name)] = (cfg, source)
            try:
                self._call("attach", cfg, source, schema)
            except IntakeDown as exc:
                _log.warning("intake.attach_deferred", entity=cfg.name, source=source.name, error=str(exc))

    def detach(self, targets: list[Target]) -> None:
        """Stop serving these sources and close their spools."""
        for target in targets:
            self._attached.pop(target, None)
        self._quietly("detach", targets)

    def pause(self, targets: list[Target]) -> None:
        """New pushes to these sources get 503 + Retry-After; returns once the ones in progress are answered."""
        self._paused.update(targets)
        self._quietly("pause", targets)

    def resume(self, targets: list[Target]) -> None:
        self._paused.difference_update(targets)
        self._quietly("resume", targets)

    def schema(self, entity: str, schema: pa.Schema | str | None) -> None:
        """The table's schema pushes are checked against (None: no table yet; a str: why it cannot be read)."""
        self._schemas[entity] = schema
        self._quietly("schema", entity, schema)

    def release(self, entity: str, source: str, below: int) -> None:
        """Delete the source's spool segments whose frames are all below `below` (committed)."""
        self._quietly("release", entity, source, below)

    def started(self) -> None:
        """Every configured push source is attached: from now on an unknown target is a 404 (before, a 503)."""
        self._started = True
        self._quietly("started")

    def accepting(self, flag: bool) -> None:
        self._accepting = flag
        self._quietly("accepting", flag)

    def check(self) -> None:
        """Start the process again if it died (at most once a second)."""
        with self._lock:
            if self._proc is None or (self._conn is not None and self._proc.poll() is None):
                return
            if time.monotonic() < self._retry_at:
                return
            self._retry_at = time.monotonic() + 1.0
            if self._conn is not None:
                self._down("check", ChildProcessError(f"exit status {self._proc.poll()}"))
            try:
                self.start()
            except LakefeedError as exc:
                _log.error("intake.restart_failed", error=str(exc))

    def stop(self, timeout: float = 30.0) -> None:
        """Close the port and the spools, and wait for the process to exit."""
        with self._lock:
            if self._proc is None:
                return
            if self._conn is not None:
                try:
                    self._call("stop", timeout=timeout)
                except LakefeedError as exc:
                    _log.warning("intake.stop_failed", error=str(exc))
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            if self._conn is not None:
                self._conn.close()
            self._conn, self._proc = None, None
            self._launcher.shutdown()
            _log.info("intake.stopped")
