"""S3 event notifications POSTed to the daemon: SNS HTTP(S) subscriptions and MinIO webhook targets.

POST /v1/entities/{entity}/notifications with a body s3_events.parse understands. The caller
authenticates with a bearer token, HTTP Basic (the token as password: SNS puts `user:token@` of
the subscription URL there) or `?token=`. The answer comes only once the events are durable in
the inbox: 200 then, 503 if the store or the inbox failed (the sender retries). Rejected records
are set aside with the reason and still answered 200: sending them again would not mend them.
An SNS SubscriptionConfirmation is confirmed (GET SubscribeURL) for the topics the config lists,
when the URL is the SNS endpoint (AWS over HTTPS, or the configured endpoint_override).
The SNS message signature is not verified: the token is what authenticates the sender.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import threading
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from lakefeed import log
from lakefeed.config.sources import S3Storage, WebhookNotifications
from lakefeed.connectors.sources.s3_events import SubscriptionConfirmation, parse
from lakefeed.connectors.sources.s3_landing import S3Landing
from lakefeed.intake.push_api import token_hash

ROUTE = "/v1/entities/{entity}/notifications"
_log = log.get(__name__)


class Webhooks:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._targets: dict[str, tuple[S3Landing, WebhookNotifications, S3Storage]] = {}

    def attach(self, landing: S3Landing, cfg: WebhookNotifications, storage: S3Storage) -> None:
        with self._lock:
            self._targets[landing.entity] = (landing, cfg, storage)

    def detach(self, entity: str) -> None:
        with self._lock:
            self._targets.pop(entity, None)

    def routes(self) -> list[web.RouteDef]:
        return [web.post(ROUTE, self.post)]

    async def post(self, request: web.Request) -> web.Response:
        entity = request.match_info["entity"]
        with self._lock:
            target = self._targets.get(entity)
        if target is None:
            return _answer(404, error=f"entity {entity!r} takes no webhook notifications")
        landing, cfg, storage = target
        if not _authorized(request, cfg.tokens_sha256):
            return web.json_response({"error": "send the token as `Authorization: Bearer <token>`, as the "
                                      "password of Basic auth, or as ?token="}, status=401,
                                     headers={"WWW-Authenticate": 'Bearer, Basic realm="lakefeed"'})
        body = await request.read()
        try:
            parsed = parse(body, landing.scope)
        except (ValueError, RecursionError) as exc:  # JSON nested past Python's stack, an int of 5,000 digits
            _log.info("webhook.unreadable", entity=entity, error=f"{type(exc).__name__}: {str(exc)[:200]}")
            return _answer(400, error=f"the body is not an S3 event notification lakefeed can read "
                                      f"({type(exc).__name__}: {str(exc)[:200]}); nothing was stored")
        loop = asyncio.get_running_loop()
        if parsed.confirmation is not None:
            return await loop.run_in_executor(None, _confirm, landing, cfg, storage, parsed.confirmation, body)
        if parsed.rejected:
            reasons = "; ".join(r.reason for r in parsed.rejected)
            await loop.run_in_executor(None, landing.set_aside, "webhook", reasons, body.decode("utf-8", "replace"))
        try:
            added = await loop.run_in_executor(None, landing.deliver, list(parsed.events))
        except Exception as exc:
            _log.error("webhook.deliver_failed", entity=entity, error=repr(exc))
            return _answer(503, error=f"not stored, send again: {exc}", retry=True)
        return _answer(200, events=len(parsed.events), enqueued=added, rejected=len(parsed.rejected),
                       ignored=len(parsed.ignored))


def _authorized(request: web.Request, hashes: tuple[str, ...]) -> bool:
    scheme, _, credential = request.headers.get("Authorization", "").partition(" ")
    token = request.query.get("token", "")
    if scheme.lower() == "bearer":
        token = credential.strip()
    elif scheme.lower() == "basic":
        try:
            token = base64.b64decode(credential.strip(), validate=True).decode().partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            return False
    if not token:
        return False
    digest = token_hash(token)
    return any([hmac.compare_digest(digest, h) for h in hashes])  # every hash compared


def _confirm(landing: S3Landing, cfg: WebhookNotifications, storage: S3Storage,
             confirmation: SubscriptionConfirmation, body: bytes) -> web.Response:
    url = urlsplit(confirmation.subscribe_url)
    endpoint = urlsplit(storage.endpoint_override or "")
    trusted = (url.scheme == "https" and url.hostname is not None and url.hostname.startswith("sns.")
               and url.hostname.endswith(".amazonaws.com")) or (bool(endpoint.netloc)
                                                                and url.netloc == endpoint.netloc)
    if confirmation.topic_arn not in cfg.topic_arns or not trusted:
        reason = (f"subscription confirmation for {confirmation.topic_arn} refused: list the topic in "
                  "notifications.topic_arns" if confirmation.topic_arn not in cfg.topic_arns
                  else f"SubscribeURL host {url.netloc!r} is not the SNS endpoint")
        landing.set_aside("webhook", reason, body.decode("utf-8", "replace"))
        return _answer(403, error=reason)
    try:
        with urllib.request.urlopen(confirmation.subscribe_url, timeout=10) as resp:  # noqa: S310 (checked above)
            resp.read()
    except OSError as exc:
        _log.error("webhook.confirm_failed", entity=landing.entity, topic=confirmation.topic_arn, error=str(exc))
        return _answer(503, error=f"could not confirm the subscription: {exc}", retry=True)
    _log.info("webhook.subscription_confirmed", entity=landing.entity, topic=confirmation.topic_arn)
    return _answer(200, confirmed=confirmation.topic_arn)


def _answer(status: int, retry: bool = False, **payload: Any) -> web.Response:
    return web.json_response(payload, status=status, headers={"Retry-After": "5"} if retry else None)
