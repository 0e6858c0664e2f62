"""The push API: POST /v1/entities/{entity}/sources/{source}/records (docs/push-api.md).

A request is checked in this order: known entity and source (404), bearer token (401 without
a valid one, 403 for a token of another source), intake open (503 while stopping), rate
limit (429), spool bound (503), body size (413), Content-Type (415), records valid against
the entity's schema (400, listing rows and fields). Then the records are appended to the
source's spool and `202 Accepted` is sent only once the frame is fsynced. A request with an
`Idempotency-Key` seen before is acknowledged again with the first answer, stored once.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from aiohttp import web

from lakefeed import clock, log
from lakefeed.config.model import EntityConfig, PushSource
from lakefeed.inbox.segments import SpoolWriteError
from lakefeed.inbox.spool import Entry, Pending, Spool, encode
from lakefeed.intake.group_commit import GroupCommit
from lakefeed.intake.problems import Rejected
from lakefeed.intake.records import accept, inflate, kind_of

ROUTE = "/v1/entities/{entity}/sources/{source}/records"
# Bodies up to this size are decoded on the event loop: ~0.1 ms of work, less than the hand-off to a
# worker thread and back costs. Larger ones go to the decode pool so the loop keeps answering.
INLINE_BYTES = 16 * 1024
_log = log.get(__name__)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()  # any header bytes


class TokenBucket:
    """`rate` requests per second with bursts of twice that; used on the event loop only."""

    def __init__(self, rate: float) -> None:
        self.rate, self.capacity = rate, max(1.0, 2 * rate)
        self._tokens, self._at = self.capacity, time.monotonic()

    def take(self) -> float:
        """0 when a request may go now, else the seconds until it may."""
        now = time.monotonic()
        self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return 0.0
        return (1 - self._tokens) / self.rate


@dataclass
class Endpoint:
    """One push source of one entity: its spool and what a request is checked against."""

    cfg: EntityConfig
    source: PushSource
    table_schema: Callable[[], pa.Schema | None]  # the entity table's (None before it exists); may raise Rejected
    spool: Spool
    commit: GroupCommit
    limiter: TokenBucket | None
    first_schema: pa.Schema | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def open(cls, cfg: EntityConfig, source: PushSource, table_schema: Callable[[], pa.Schema | None]) -> Endpoint:
        spool = Spool(cfg.spool(source.name), source.segment_bytes, source.idempotency_ttl_s)
        limiter = TokenBucket(source.rate_limit_per_s) if source.rate_limit_per_s else None
        return cls(cfg, source, table_schema, spool, GroupCommit(spool, source.spool_max_bytes), limiter)

    def prepare(self, body: bytes, content_type: str, key: str | None, event_time: str | None,
                encoding: str | None, limit: int) -> Pending:
        """Inflate, decode and validate (in a worker thread); Rejected when the request cannot be stored.
        `limit`: http.max_body_bytes, which bounds what the body inflates and decodes to."""
        body = inflate(body, encoding, limit)
        target = self.table_schema() or self.first_schema
        table = accept(body, content_type, self.cfg, target, limit)
        if target is None:
            # Until the table exists, the first accepted request's types are the ones later requests must fit.
            with self.lock:
                self.first_schema = self.first_schema or table.schema
        return Pending(encode(table), table.num_rows, key, event_time)

    def close(self) -> None:
        self.commit.close()


class PushApi:
    """The push routes over the endpoints of the running entities (attached and detached on reload).

    It owns the endpoints attached to it: detaching or closing closes their spools."""

    def __init__(self, endpoints: list[Endpoint], max_body_bytes: int, workers: int = 4) -> None:
        self.max_body_bytes = max_body_bytes
        self.endpoints: dict[tuple[str, str], Endpoint] = {}
        self._hashes: dict[tuple[str, str], tuple[str, ...]] = {}
        self._paused: set[tuple[str, str]] = set()
        self._active: dict[tuple[str, str], int] = {}  # requests in progress per target
        self._lock = threading.Lock()
        self._decoders = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="push-decode")
        self._inflight: dict[tuple[str, str, str], asyncio.Future[Entry | None]] = {}
        self.accepting = True
        self.starting = False  # the intake process sets it until the daemon has attached every push source
        self.attach(endpoints)

    def attach(self, endpoints: list[Endpoint]) -> None:
        with self._lock:
            for e in endpoints:
                replaced = self.endpoints.get((e.cfg.name, e.source.name))
                if replaced is not None and replaced is not e:
                    raise ValueError(f"{e.cfg.name}/{e.source.name} is attached already; detach it first")
                self.endpoints[(e.cfg.name, e.source.name)] = e
                self._hashes[(e.cfg.name, e.source.name)] = e.source.tokens_sha256

    def pause(self, targets: list[tuple[str, str]], timeout: float = 30.0) -> None:
        """New requests get 503 + Retry-After; wait until the ones in progress are answered."""
        with self._lock:
            self._paused.update(targets)
        deadline = time.monotonic() + timeout
        while any(self._active.get(t) for t in targets) and time.monotonic() < deadline:
            time.sleep(0.01)

    def resume(self, targets: list[tuple[str, str]]) -> None:
        with self._lock:
            self._paused.difference_update(targets)

    def detach(self, targets: list[tuple[str, str]]) -> None:
        """Take these sources off (after `pause`, so no request is in progress) and close their spools."""
        with self._lock:
            gone = [self.endpoints.pop(tuple(t), None) for t in targets]
            for t in targets:
                self._hashes.pop(tuple(t), None)
        for endpoint in gone:
            if endpoint is not None:
                endpoint.close()

    def routes(self) -> list[web.RouteDef]:
        return [web.post(ROUTE, self.push), web.route("*", ROUTE, _only_post)]

    def _authorize(self, request: web.Request, target: tuple[str, str]) -> None:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _error(401, "send `Authorization: Bearer <token>`", {"WWW-Authenticate": "Bearer"})
        digest = token_hash(token.strip())
        with self._lock:
            known = list(self._hashes.items())
        matches = {name: any([hmac.compare_digest(digest, h) for h in hashes])  # every hash compared
                   for name, hashes in known}
        if matches.get(target):
            return
        if any(matches.values()):
            raise _error(403, f"this token may not push to {target[0]}/{target[1]}")
        raise _error(401, "the bearer token is not valid", {"WWW-Authenticate": 'Bearer error="invalid_token"'})

    async def push(self, request: web.Request) -> web.Response:
        target = (request.match_info["entity"], request.match_info["source"])
        with self._lock:
            endpoint = self.endpoints.get(target)
            paused = target in self._paused
            if endpoint is not None and not paused:
                self._active[target] = self._active.get(target, 0) + 1
        if paused:
            raise _error(503, "this source is being reconfigured; retry in a moment", {"Retry-After": "1"})
        if endpoint is None and self.starting:
            raise _error(503, "lakefeed is starting; retry in a moment", {"Retry-After": "2"})
        if endpoint is None:
            raise _error(404, f"no push source {target[1]!r} for entity {target[0]!r}")
        try:
            return await self._push(request, target, endpoint)
        finally:
            with self._lock:
                self._active[target] -= 1

    async def _push(self, request: web.Request, target: tuple[str, str], endpoint: Endpoint) -> web.Response:
        self._authorize(request, target)
        if not self.accepting:
            raise _error(503, "lakefeed is stopping; retry against the restarted daemon", {"Retry-After": "5"})
        if endpoint.limiter is not None and (wait := endpoint.limiter.take()):
            raise _error(429, "rate limit of this source exceeded", {"Retry-After": str(math.ceil(wait))})
        if endpoint.commit.full():
            raise _error(503, "the spool is full: ingestion is behind; retry later", {"Retry-After": "1"})
        if request.content_length is not None and request.content_length > self.max_body_bytes:
            raise _error(413, f"the body is larger than {self.max_body_bytes} bytes (http.max_body_bytes)")
        try:
            kind_of(request.content_type)
        except Rejected as exc:
            raise _error(exc.status, exc.message) from exc
        event_time = _event_time(request.headers.get("Event-Time"))
        key = _idempotency_key(request.headers.get("Idempotency-Key"))
        if key is None:
            return _accepted(target, await self._store(request, endpoint, key, event_time), duplicate=False)
        prior, inflight = await self._claim(endpoint, target, key)
        if prior is not None:
            return _accepted(target, prior, duplicate=True)
        assert inflight is not None
        try:
            entry = await self._store(request, endpoint, key, event_time)
        except BaseException:
            inflight.set_result(None)  # one of the requests waiting with this key takes over
            raise
        finally:
            del self._inflight[(*target, key)]
        inflight.set_result(entry)
        return _accepted(target, entry, duplicate=False)

    async def _claim(self, endpoint: Endpoint, target: tuple[str, str],
                     key: str) -> tuple[Entry | None, asyncio.Future[Entry | None] | None]:
        """(the first request's entry, None) for a key seen before, else (None, a future this request owns).

        One request per key is in flight: the others wait for it. When it fails (its client gone, its body
        rejected) the first waiter to run claims the key in turn and the rest wait for that one, so the
        records of a key are stored once however many retries overlap."""
        while (running := self._inflight.get((*target, key))) is not None:
            entry = await asyncio.shield(running)
            if entry is not None:
                return entry, None
        entry = endpoint.spool.known(key)  # (also a frame made durable for a request cancelled meanwhile)
        if entry is not None:
            return entry, None
        inflight: asyncio.Future[Entry | None] = asyncio.get_running_loop().create_future()
        self._inflight[(*target, key)] = inflight
        return None, inflight

    async def _store(self, request: web.Request, endpoint: Endpoint, key: str | None,
                     event_time: str | None) -> Entry:
        body = await request.read()
        try:
            encoding = request.headers.get("Content-Encoding")
            if len(body) <= INLINE_BYTES and not encoding:
                pending = endpoint.prepare(body, request.content_type, key, event_time, None, self.max_body_bytes)
            else:
                pending = await asyncio.get_running_loop().run_in_executor(
                    self._decoders, endpoint.prepare, body, request.content_type, key, event_time, encoding,
                    self.max_body_bytes)
        except Rejected as exc:
            _log.info("push.rejected", entity=endpoint.cfg.name, source=endpoint.source.name, status=exc.status,
                      error=exc.message, problems=len(exc.problems))
            raise _error(exc.status, exc.message, body=exc.as_json()) from exc
        try:
            return await endpoint.commit.store(pending)
        except SpoolWriteError as exc:  # nothing of the request is acknowledged: the producer keeps it
            status = 507 if exc.no_space else 503
            raise _error(status, f"{exc}; nothing was stored, retry later", {"Retry-After": "5"}) from exc

    def close(self) -> None:
        self._decoders.shutdown(wait=True)
        self.detach(list(self.endpoints))


async def _only_post(request: web.Request) -> web.Response:
    raise web.HTTPMethodNotAllowed(request.method, ["POST"])


def _idempotency_key(value: str | None) -> str | None:
    """The key, if it is one the spool and Spark can store (aiohttp hands other bytes on surrogate-escaped)."""
    if value is None:
        return None
    if not 0 < len(value) <= 256:
        raise _error(400, "Idempotency-Key must be 1 to 256 characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _error(400, "Idempotency-Key must be UTF-8 text (a UUID, say); this one holds bytes that are "
                          "not UTF-8") from exc
    return value


def _event_time(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return clock.to_cdm(clock.from_cdm(value))
    except ValueError as exc:
        raise _error(400, f"Event-Time {value!r} is not an ISO 8601 time with a zone") from exc


def _accepted(target: tuple[str, str], entry: Entry, duplicate: bool) -> web.Response:
    return web.json_response({"entity": target[0], "source": target[1], "batch": entry.offset,
                              "records": entry.rows, "received_at": entry.received_at, "duplicate": duplicate},
                             status=202)


def _error(status: int, message: str, headers: dict[str, str] | None = None,
           body: dict[str, Any] | None = None) -> web.HTTPException:
    cls = web.HTTPException
    for candidate in (web.HTTPBadRequest, web.HTTPUnauthorized, web.HTTPForbidden, web.HTTPNotFound,
                      web.HTTPRequestEntityTooLarge, web.HTTPUnsupportedMediaType, web.HTTPTooManyRequests,
                      web.HTTPServiceUnavailable, web.HTTPInsufficientStorage):
        if candidate.status_code == status:
            cls = candidate
    payload = body or {"error": message}
    if cls is web.HTTPRequestEntityTooLarge:
        return web.HTTPRequestEntityTooLarge(max_size=0, actual_size=0, text=_json(payload),
                                             content_type="application/json", headers=headers)
    return cls(text=_json(payload), content_type="application/json", headers=headers)


def _json(payload: dict[str, Any]) -> str:
    return json.dumps(payload)
