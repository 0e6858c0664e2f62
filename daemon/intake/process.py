"""The intake process: the daemon's HTTP port, the push API and the spool writers.

The daemon's own process runs Spark's driver, the micro-batches and the commits, whose Python
threads share one GIL; an HTTP loop among them waits for it, so a push that needs well under a
millisecond of work was acknowledged tens of milliseconds late behind a batch decoding frames.
The port is therefore served here, in a process of its own: a push is checked, decoded,
validated and group-committed to its spool without the driver; the spool files are the boundary
(the daemon's Spark source reads them). Every other route (health, metrics, status, the status
page, S3 webhooks, /openapi.json) is passed through to the daemon's server on a unix socket.

The daemon drives this process over a socket pair (`multiprocessing.connection`, daemon/
intake_client.py): each message is `(operation, args)` and is answered `("ok", value)` or
`("error", message)`. The process exits when the daemon says `stop`, closes the pair, or dies.
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import sys
from functools import partial
from multiprocessing.connection import Connection
from typing import Any

import aiohttp
import pyarrow as pa
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from lakefeed import log
from lakefeed.config.model import EntityConfig, HttpConfig, PushSource
from lakefeed.errors import LakefeedError
from lakefeed.intake.http_server import HttpServer
from lakefeed.intake.problems import Rejected
from lakefeed.intake.push_api import Endpoint, PushApi

_log = log.get(__name__)
# Not passed on in either direction: they describe one connection, not the request.
_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                  "transfer-encoding", "upgrade", "content-length", "host"})


class Passthrough:
    """Every route but the push API, answered by the daemon process's own server."""

    def __init__(self, socket: str) -> None:
        self.socket = socket
        self._session: aiohttp.ClientSession | None = None

    def routes(self) -> list[web.RouteDef]:
        return [web.route("*", "/{tail:.*}", self.forward)]

    async def forward(self, request: web.Request) -> web.Response:
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=self.socket),
                                                  auto_decompress=False, timeout=aiohttp.ClientTimeout(total=60))
        headers = CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in _HOP)
        try:
            async with self._session.request(request.method, URL(f"http://lakefeed{request.raw_path}", encoded=True),
                                             headers=headers, data=await request.read(),
                                             allow_redirects=False) as resp:
                body = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            return web.json_response({"error": f"the daemon process did not answer ({exc or type(exc).__name__})"},
                                     status=502)
        return web.Response(status=resp.status, body=body,
                            headers=CIMultiDict((k, v) for k, v in resp.headers.items() if k.lower() not in _HOP))

    async def close(self, _app: web.Application | None = None) -> None:
        if self._session is not None:
            await self._session.close()


class Intake:
    """The push API and the pass-through on the daemon's port; `handle` carries out the daemon's operations."""

    def __init__(self, http: HttpConfig, upstream: str) -> None:
        self.api = PushApi([], http.max_body_bytes)
        self.api.starting = True  # until the daemon says every push source is attached
        passthrough = Passthrough(upstream)
        self.server = HttpServer(http, [*self.api.routes(), *passthrough.routes()])
        self.server.app.on_cleanup.append(passthrough.close)
        self._schemas: dict[str, pa.Schema | str | None] = {}

    def start(self) -> str:
        return self.server.start()

    def handle(self, op: str, *args: Any) -> Any:
        if op == "attach":
            self._attach(*args)
        elif op == "detach":
            self.api.detach(args[0])
        elif op == "pause":
            self.api.pause(args[0])
        elif op == "resume":
            self.api.resume(args[0])
        elif op == "schema":
            self._schemas[args[0]] = args[1]
        elif op == "release":
            entity, source, below = args
            endpoint = self.api.endpoints.get((entity, source))
            return endpoint.spool.release(below) if endpoint is not None else 0
        elif op == "accepting":
            self.api.accepting = args[0]
        elif op == "started":
            self.api.starting = False
        else:
            raise ValueError(f"unknown operation {op!r}")
        return None

    def _attach(self, cfg: EntityConfig, source: PushSource, schema: pa.Schema | str | None) -> None:
        self._schemas[cfg.name] = schema
        self.api.attach([Endpoint.open(cfg, source, partial(self._schema, cfg.name))])
        _log.info("intake.attached", entity=cfg.name, source=source.name)

    def _schema(self, entity: str) -> pa.Schema | None:
        """The table's schema as the daemon last sent it (after each commit)."""
        value = self._schemas.get(entity)
        if isinstance(value, str):
            raise Rejected(503, f"the table's schema cannot be read right now ({value}); retry in a moment")
        return value

    def stop(self) -> None:
        self.api.accepting = False
        self.server.stop()
        self.api.close()


def serve(conn: Connection) -> int:
    """Bind, say so, then carry out the daemon's operations until it says `stop` or goes away."""
    settings = conn.recv()
    log.configure(settings["log_level"])
    intake = Intake(settings["http"], settings["upstream"])
    try:
        url = intake.start()
    except LakefeedError as exc:
        conn.send(("error", str(exc)))
        return 1
    # What start-up made lives as long as the process; frozen, a full collection no longer walks it
    # (unfrozen: ~0.1 s holding the GIL, a pause every request in flight would wait out).
    gc.freeze()
    conn.send(("ok", url))
    try:
        while True:
            try:
                op, args = conn.recv()
            except (EOFError, OSError):
                _log.warning("intake.daemon_gone")
                return 0
            if op == "stop":
                break
            try:
                answer = ("ok", intake.handle(op, *args))
            except Exception as exc:  # the daemon gets the reason; this process keeps serving
                _log.error("intake.operation_failed", operation=op, error=str(exc))
                answer = ("error", f"{type(exc).__name__}: {exc}")
            conn.send(answer)
    finally:
        intake.stop()
    conn.send(("ok", None))  # stopped: the port and the spools are closed
    return 0


def _die_with(parent: int) -> None:
    """SIGKILL this process when the daemon dies, however it dies (Linux's PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the call
        os._exit(1)


def main(argv: list[str] | None = None) -> int:
    fd, parent = (int(a) for a in (argv if argv is not None else sys.argv[1:]))
    _die_with(parent)
    # Ctrl-C in a terminal and a hang-up reach the whole process group: the daemon decides when this stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    return serve(Connection(fd))

