"""Compaction on demand: POST /compact (`lakefeed compact`) has entities' tables compacted now, due or not.

Each entity asked for is compacted in a thread of its own, between its batches (under the entity's lock:
daemon/pipeline/entity.py, `compact_now`), so the request is answered at once (202) and a compaction that takes
minutes holds no HTTP request open; GET /compact says how far each entity's latest run got. A request for an
entity whose run has not ended joins that run. The request carries the token the daemon wrote to
`state_dir/admin.token` (readable by its user alone): a compaction costs the lake's cores and storage, so not
everyone who reaches the port may ask for one.
"""

from __future__ import annotations

import hmac
import json
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from lakefeed import clock, log

if TYPE_CHECKING:
    from lakefeed.ops.runner import EntityRunner

_log = log.get(__name__)


class Compactions:
    def __init__(self, runners: Callable[[], dict[str, EntityRunner]], token: str,
                 stopping: Callable[[], bool]) -> None:
        self._runners = runners
        self.token = token
        self._stopping = stopping
        self._runs: dict[str, dict[str, Any]] = {}  # entity -> its latest run: number, state, times, tables
        self._lock = threading.Lock()

    def request(self, runners: dict[str, EntityRunner]) -> dict[str, int]:
        """Start a run for each of these entities that has none running; each one's run number."""
        runs = {}
        with self._lock:
            for name, runner in runners.items():
                run = self._runs.get(name)
                if run is None or run["state"] != "running":
                    run = {"run": (run or {"run": 0})["run"] + 1, "state": "running", "finished_at": None,
                           "requested_at": clock.to_cdm(clock.now()), "tables": {}, "error": None}
                    threading.Thread(target=self._compact, args=(name, runner, run), name=f"compact-{name}",
                                     daemon=True).start()
                    self._runs[name] = run  # once its thread runs: a run that never started is never waited on
                runs[name] = run["run"]
        return runs

    def _compact(self, name: str, runner: EntityRunner, run: dict[str, Any]) -> None:
        started = time.perf_counter()
        _log.info("compaction.requested", entity=name, run=run["run"])
        try:  # between two tables, a stop of the daemon or the entity (a reload) ends the run
            tables, error = runner.pipeline.compact_now(lambda: self._stopping() or runner.shutdown.is_set()), None
        except Exception as exc:  # the manifests' refresh before it failed, say: reported, the batches go on
            tables, error = {}, f"{type(exc).__name__}: {exc}"
        failed = error is not None or any("error" in t for t in tables.values())
        with self._lock:
            run.update(state="failed" if failed else "done", tables=tables, error=error,
                       finished_at=clock.to_cdm(clock.now()))
        _log.info("compaction.finished", entity=name, run=run["run"], state=run["state"], error=error,
                  seconds=round(time.perf_counter() - started, 3),
                  files_removed=sum(t.get("files_removed", 0) for t in tables.values()))

    def state(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return json.loads(json.dumps(self._runs))  # a copy the threads no longer touch

    def routes(self) -> list[web.RouteDef]:
        async def ask(request: web.Request) -> web.Response:
            scheme, _, offered = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not self.token or \
                    not hmac.compare_digest(offered.strip().encode("utf-8", "surrogateescape"), self.token.encode()):
                return web.json_response({"error": "give the token in the daemon's state_dir/admin.token as "
                                                   "`Authorization: Bearer <token>` (`lakefeed compact` does)"},
                                         status=401, headers={"WWW-Authenticate": 'Bearer realm="lakefeed"'})
            if self._stopping():
                return web.json_response({"error": "lakefeed is stopping; ask again once it has started"},
                                         status=503, headers={"Retry-After": "5"})
            names = await _names(request)
            if isinstance(names, str):
                return web.json_response({"error": names}, status=400)
            runners = dict(self._runners())  # a copy: the supervisor's thread starts and stops entities meanwhile
            unknown = sorted(set(names or ()) - set(runners))
            if unknown:
                return web.json_response({"error": f"no entity {', '.join(map(repr, unknown))}; the daemon runs "
                                                   f"{', '.join(sorted(runners)) or 'none'}"}, status=404)
            asked = {n: runners[n] for n in (names if names is not None else runners)}
            # An entity starting (its manifests repaired as it starts), stopping or failed is left alone: named, the
            # request is refused; asked for with every entity, it is named in the answer.
            idle = sorted(n for n, r in asked.items() if not r.running())
            if idle and names is not None:
                return web.json_response({"error": f"entity {', '.join(map(repr, idle))} is not running (starting, "
                                                   "stopping or failed: see /status); ask again once it runs"},
                                         status=409)
            runs = self.request({n: r for n, r in asked.items() if n not in idle})  # starts threads, and no more
            return web.json_response({"runs": runs, "not_running": idle}, status=202, headers={"Location": "/compact"})

        async def show(_: web.Request) -> web.Response:
            return web.json_response({"entities": self.state()})

        return [web.post("/compact", ask), web.get("/compact", show)]


async def _names(request: web.Request) -> list[str] | None | str:
    """The entities a request names (`{"entities": [...]}`; no body: every entity), or what is wrong with it."""
    body = await request.read()
    if not body.strip():
        return None
    try:
        names = json.loads(body)["entities"]
    except (ValueError, KeyError, TypeError):
        return 'the body is {"entities": ["name", ...]} (JSON), or empty for every entity'
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return '"entities" is a list of entity names'
    return names
