"""A bucket prefix as an entity's landing place: event notifications, and listings that catch lost ones.

Every transport (SQS, the daemon's webhook route, a Kafka topic of MinIO events) hands its
parsed events to `deliver`, which returns once they are durable in the inbox: the transport
acknowledges (deletes the message, answers the POST, commits the offset) only then. A created
object is looked up (HEAD) so that its identity is the one a listing gives (storage.py); an
object gone by then is skipped, its removal event follows. A removal is an inbox record too,
so the manifest drops the partition in commit order; it is looked up too, since a removal
delivered after a newer creation must not drop a live object.

A listing at start-up covers the whole prefix. Later ones, every `reconcile_interval_s`, start
after the key prefix `dated_prefix` gives for now - `listing_lookback_s` when the layout is
dated, so their cost follows the recent keys, not the bucket's history. Whatever a listing
finds that the inbox has not seen was never notified: it is enqueued, logged at WARNING and
counted (`on_found`). Listed keys pass the rule notifications pass (`s3_events.key_verdict`):
folder markers are skipped, keys that cannot be paths (`a//b.csv`) are quarantined with the reason.
An object the inbox holds that a complete listing of its range no longer finds lost its removal
notification: its removal is enqueued, as a notified one is (looked up first, once per removal).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from lakefeed import clock, log
from lakefeed.config.sources import KafkaNotifications, S3Source, SqsNotifications
from lakefeed.connectors.sources.base import Source
from lakefeed.connectors.sources.local_dir import is_data_file
from lakefeed.connectors.sources.s3_events import ObjectEvent, Scope, key_verdict, latest_per_key
from lakefeed.connectors.sources.sqs_source import SqsSource
from lakefeed.inbox.files import FileEvent, Inbox, InboxRecord
from lakefeed.inbox.storage import Storage, whole_seconds_ns

_log = log.get(__name__)
_CHUNK = 100  # removals a listing looks up (HEAD) per hold of the lock


class S3Landing(Source):
    def __init__(self, entity: str, source: S3Source, inbox: Inbox, storage: Storage, state: Path,
                 excluded: tuple[str, ...] = (), on_found: Callable[[int], None] = lambda n: None) -> None:
        self.entity = entity
        self.source = source
        self.scope = Scope.of(source.bucket, source.prefix)
        self.poison_file = state / "poison.jsonl"
        self._inbox = inbox
        self._storage = storage
        self._excluded = tuple(e.rstrip("/") + "/" for e in excluded)
        self._on_found = on_found
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"source-{entity}-listing", daemon=True)
        self.transports: list[Source] = [self._transport(n) for n in source.notifications
                                         if isinstance(n, SqsNotifications | KafkaNotifications)]

    def _transport(self, n: SqsNotifications | KafkaNotifications) -> Source:
        if isinstance(n, SqsNotifications):
            creds = self._storage.credentials
            return SqsSource(self.entity, n.queue_url, self.scope, deliver=self.deliver,
                             region=self._storage.cfg.region, endpoint_override=self._storage.cfg.endpoint_override,
                             access_key_id=creds.access_key, secret_access_key=creds.secret_key,
                             session_token=creds.token, dead_letter_url=n.dead_letter_url,
                             poison_file=self.poison_file, wait_time_s=n.wait_time_s,
                             visibility_timeout_s=n.visibility_timeout_s)
        from lakefeed.connectors.sources.kafka_events import KafkaEvents  # kafka-python only when configured

        return KafkaEvents(self.entity, n, self.scope, deliver=self.deliver, set_aside=self.set_aside)

    def wanted(self, key: str) -> bool:
        """Data, not lakefeed's own output or a hidden or temporary object."""
        relative = key.removeprefix(self.source.prefix)
        if f"s3://{self.source.bucket}/{key}".startswith(self._excluded):
            return False
        return is_data_file(key) and not any(s.startswith((".", "_")) for s in relative.split("/")[:-1])

    def deliver(self, events: list[ObjectEvent]) -> int:
        """Make the outcome of these events durable in the inbox; return how many records were new.

        Deliveries are unordered, and `latest_per_key` orders one delivery only: every event is checked against the
        object as it is now (HEAD). A removal of an object that exists is stale (a newer creation came before it,
        or it removed an older version): the current version is offered instead of it. A HEAD and the offer it
        decides hold the lock, so that a listing's offer cannot come between them."""
        with self._lock:
            return len(self._offer([ev for ev in map(self._outcome, latest_per_key(events)) if ev is not None]))

    def _outcome(self, ev: ObjectEvent) -> FileEvent | None:
        """What the inbox gets of one event: the object's identity now, its removal, or nothing."""
        if not self.wanted(ev.key):
            _log.info("object.ignored", entity=self.entity, file=ev.uri, reason="not a data file")
            return None
        if ev.kind == "removed":
            return self._removal(ev.uri, whole_seconds_ns(ev.event_time), ev.version_id or ev.sequencer or "",
                                 by=f"notification {ev.name} (sequencer {ev.sequencer})")
        now = self._storage.head(ev.uri)
        if now is None:
            _log.info("object.gone", entity=self.entity, file=ev.uri, reason="removed before it was "
                      "looked at; its removal event follows")
        return now

    def _removal(self, url: str, at_ns: int, version: str, by: str) -> FileEvent | None:
        """The removal of an object the store no longer has and the inbox still holds; the object as it is now if it
        exists; or nothing. Called with the lock held, so that the HEAD and the offer it decides are one step.

        Notifications and listings both report removals, in either order and more than once: only the first one
        that finds the inbox holding the object records it. One that finds the object there is stale (a newer
        version came first, or the listing passed the key before it was written): the object is offered instead,
        and the inbox skips it when it has it."""
        now = self._storage.head(url)
        if now is not None:
            _log.info("object.removal_stale", entity=self.entity, file=url, by=by,
                      reason="the object exists: written again before this removal was seen; kept")
            return now
        if not self._inbox.present(url):
            _log.info("object.removal_known", entity=self.entity, file=url, by=by,
                      reason="the inbox has its removal already, or never held it")
            return None
        return FileEvent(url, 0, at_ns, version, removed=True)

    def _offer(self, events: list[FileEvent]) -> list[InboxRecord]:
        added = self._inbox.offer(events) if events else []  # the inbox skips identities it has
        for rec in added:
            _log.info("object.removed" if rec.removed else "file.enqueued", entity=self.entity, file=rec.path,
                      offset=rec.offset, size=rec.size, problem=rec.problem or None)
        return added

    def reconcile(self, narrowed: bool = False) -> int:
        """List the prefix (only its recent part if `narrowed` and the layout is dated); enqueue the unseen, and the
        removal of what the inbox holds that the listing no longer finds. Returns how many records it added."""
        return sum(self._listing(narrowed))

    def _listing(self, narrowed: bool) -> tuple[int, int]:
        """(objects found, removals found) by one listing.

        The listing runs while notifications keep arriving: an object both report is one identity, and
        an older identity listed after a rewrite was notified is skipped when read (superseded). A listing
        that fails part way raises before anything is offered: what it did not reach is not removed."""
        start_after = self.start_after() if narrowed else ""
        objects = list(self._storage.list(self.source.bucket, self.source.prefix, start_after))
        listed = [ev for ev in map(self._listed, objects) if ev is not None]
        with self._lock:
            found = len(self._offer(sorted(listed, key=lambda e: (e.mtime_ns, e.path))))
        removed = self._vanished({ev.path for ev in objects}, start_after)
        _log.info("source.listed", entity=self.entity, prefix=self.source.root, start_after=start_after or None,
                  objects=len(objects), taken=len(listed), found=found, removed=removed)
        return found, removed

    def _vanished(self, there: set[str], start_after: str) -> int:
        """Enqueue the removal of each object the inbox holds in the listed range that the listing did not find;
        how many were enqueued. Each is looked up (HEAD) under the lock, a chunk at a time so that deliveries wait
        for one chunk only: an object written after the listing passed its key is not removed, and a removal
        notified meanwhile is not recorded twice."""
        missing = [path for path in self._inbox.listed(self.source.root)
                   if path not in there and self._removable(path, start_after)]
        removed = 0
        for i in range(0, len(missing), _CHUNK):
            with self._lock:
                gone = [self._removal(path, time.time_ns(), "", by="listing") for path in missing[i:i + _CHUNK]]
                removed += sum(rec.removed for rec in self._offer([ev for ev in gone if ev is not None]))
        return removed

    def _removable(self, path: str, start_after: str) -> bool:
        """An inbox path a listing after `start_after` covers and would have taken (data, not a rejected key)."""
        key = path.removeprefix(f"s3://{self.source.bucket}/")
        return key > start_after and key_verdict(self.scope, self.source.bucket, key)[0] == "data" and self.wanted(key)

    def _listed(self, ev: FileEvent) -> FileEvent | None:
        """A listed object as the inbox gets it, by the rule notifications follow (`key_verdict`): a data object, one
        whose key cannot be a path (quarantined with the reason), or nothing (a folder marker, not data)."""
        key = ev.path.removeprefix(f"s3://{self.source.bucket}/")
        verdict, why = key_verdict(self.scope, self.source.bucket, key)
        if verdict == "ignored" or not self.wanted(key):
            return None
        if verdict == "rejected":
            return replace(ev, problem=f"{why}; rename the object to take it")
        return ev

    def start_after(self) -> str:
        """The key a narrowed listing starts after: the dated prefix of now - lookback (everything from
        that day on sorts after it), or '' when the layout is not dated."""
        if not self.source.dated_prefix:
            return ""
        since = datetime.now(UTC) - timedelta(seconds=self.source.listing_lookback_s)
        return self.source.prefix + since.strftime(self.source.dated_prefix)

    def start(self) -> None:
        _log.info("source.starting", entity=self.entity, root=self.source.root, **self._storage.describe())
        for transport in self.transports:
            transport.start()
        # After the transports listen, so an object landing now is seen by one or the other.
        self._reconcile(narrowed=False)
        self._thread.start()

    def _reconcile(self, narrowed: bool) -> None:
        try:
            self._report(*self._listing(narrowed))
        except Exception as exc:  # noqa: BLE001 - the store or the state disk may fail a while: listings go on
            _log.warning("source.reconcile_failed", entity=self.entity, error=str(exc))

    def _report(self, found: int, removed: int) -> None:
        if found:
            _log.warning("source.missed_events", entity=self.entity, files=found,
                         reason="the listing found objects no notification announced")
            self._on_found(found)
        if removed:
            _log.warning("source.missed_removals", entity=self.entity, files=removed,
                         reason="the listing no longer found objects whose removal no notification announced")

    def _loop(self) -> None:
        while not self._stop.wait(self.source.reconcile_interval_s):
            self._reconcile(narrowed=True)

    def stop(self) -> None:
        self._stop.set()
        for transport in self.transports:
            transport.stop()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def set_aside(self, origin: str, reason: str, body: str) -> None:
        """Keep an unusable notification with the reason, durably, in the entity's poison.jsonl."""
        line = {"at": clock.to_cdm(clock.now()), "entity": self.entity, "origin": origin, "reason": reason,
                "body": body}
        self.poison_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.poison_file, "a", encoding="utf-8") as f:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        _log.warning("notification.set_aside", entity=self.entity, origin=origin, reason=reason,
                     file=str(self.poison_file))
