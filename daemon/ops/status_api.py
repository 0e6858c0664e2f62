"""Health, metrics and status over HTTP: /healthz, /readyz, /metrics, /status, / (the status page)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from lakefeed import clock
from lakefeed.intake import openapi
from lakefeed.ops import status_page

if TYPE_CHECKING:
    from lakefeed.intake.client import IntakeProcess
    from lakefeed.ops.metrics import Metrics
    from lakefeed.ops.runner import EntityRunner


class Daemon(Protocol):
    """What the status routes read of the running daemon (the supervisor, which serves them)."""

    metrics: Metrics
    runners: dict[str, EntityRunner]
    intake: IntakeProcess | None
    ready: bool
    url: str
    config_path: Path | None
    config_problems: list[str]
    needs_restart: list[str]

    def status_line(self) -> str: ...


# The figures of an entity or a stream that has committed nothing since the daemon started.
_NOTHING = {"files": 0, "rows": 0, "batches": 0, "quarantined": 0, "last_commit": None, "freshness_s": None}


def status(sup: Daemon) -> dict[str, Any]:
    snapshot = sup.metrics.snapshot()
    entities = {}
    for name, runner in list(sup.runners.items()):
        totals = dict(snapshot.get(name, {**_NOTHING, "watermark": None, "backlog": {}, "history": []}))
        figures = totals.pop("streams", {})  # each stream's own, shown under it; the entity keeps its totals
        queries = dict(runner.queries)  # a reload starts and stops them meanwhile
        streams = {s: {"running": s in queries and queries[s].isActive, "backlog": runner.backlog(s),
                       "run_id": str(queries[s].runId) if s in queries else None,
                       "source": runner.source_status(s), **figures.get(s, _NOTHING)}
                   for s in runner.cfg.streams()}
        entities[name] = {"error": runner.error, "streams": streams, **totals}
    return {"daemon": {"pid": os.getpid(), "intake_pid": sup.intake.pid if sup.intake is not None else None,
                       "ready": sup.ready, "url": sup.url,
                       "started_at": clock.to_cdm(clock.from_ns(int(sup.metrics.started * 1e9))),
                       "uptime_s": round(time.time() - sup.metrics.started, 3),
                       "config": str(sup.config_path) if sup.config_path else None,
                       "config_problems": sup.config_problems, "needs_restart": sup.needs_restart,
                       "status": sup.status_line()},
            "entities": entities}


def routes(sup: Daemon) -> list[web.RouteDef]:
    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "alive"})

    async def readyz(_: web.Request) -> web.Response:
        down = [n for n, r in list(sup.runners.items()) if not r.running()]  # a reload changes it meanwhile
        ready = sup.ready and not down
        return web.json_response({"ready": ready, "not_running": down}, status=200 if ready else 503)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=sup.metrics.prometheus(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def status_json(_: web.Request) -> web.Response:
        return web.json_response(status(sup))

    async def page(_: web.Request) -> web.Response:
        return web.Response(text=status_page.render(status(sup)), content_type="text/html")

    async def openapi_json(_: web.Request) -> web.Response:
        return web.json_response(openapi.document())

    return [web.get("/healthz", healthz), web.get("/readyz", readyz), web.get("/metrics", metrics),
            web.get("/status", status_json), web.get("/", page), web.get("/openapi.json", openapi_json)]
