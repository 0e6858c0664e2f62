"""S3 event notifications from a Kafka topic (MinIO's Kafka target: `{EventName, Key, Records}` values).

A consumer of the configured group polls the topic; each poll's records are parsed and handed to
`deliver` (durable in the inbox when it returns), unusable values are set aside with the reason,
and only then are the offsets committed. A crash before the commit means the records are read
again, which the inbox recognises. Offsets are committed explicitly, never automatically.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from kafka import KafkaConsumer
from kafka.errors import KafkaError

from lakefeed import log
from lakefeed.config.sources import KafkaNotifications
from lakefeed.connectors.sources.base import Source
from lakefeed.connectors.sources.s3_events import ObjectEvent, Scope, parse

_log = log.get(__name__)


class KafkaEvents(Source):
    def __init__(self, entity: str, cfg: KafkaNotifications, scope: Scope, *,
                 deliver: Callable[[list[ObjectEvent]], object],
                 set_aside: Callable[[str, str, str], None]) -> None:
        self.entity = entity
        self.cfg = cfg
        self._scope = scope
        self._deliver = deliver
        self._set_aside = set_aside
        self._stop = threading.Event()
        self._consumer: KafkaConsumer | None = None
        self._thread = threading.Thread(target=self._loop, name=f"source-{entity}-kafka-events", daemon=True)

    def start(self) -> None:
        self._consumer = KafkaConsumer(
            self.cfg.topic, bootstrap_servers=self.cfg.bootstrap_servers.split(","), group_id=self.cfg.group_id,
            enable_auto_commit=False, auto_offset_reset="earliest", client_id=f"lakefeed-{self.entity}-events")
        _log.info("source.started", entity=self.entity, topic=self.cfg.topic, group_id=self.cfg.group_id)
        self._thread.start()

    def reconcile(self) -> int:
        """A topic is not a listing; the landing's listing does this."""
        return 0

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        if self._consumer is not None:
            self._consumer.close(autocommit=False)
        _log.info("source.stopped", entity=self.entity, topic=self.cfg.topic)

    def _loop(self) -> None:
        assert self._consumer is not None
        while not self._stop.is_set():
            try:
                polled = self._consumer.poll(timeout_ms=500, max_records=500)
                if not polled:
                    continue
                self._work([r for records in polled.values() for r in records])
                self._consumer.commit()
            except KafkaError as exc:  # uncommitted records are read again after the broker is back
                _log.warning("kafka_events.failed", entity=self.entity, topic=self.cfg.topic, error=repr(exc))
                self._stop.wait(2.0)
            except Exception as exc:
                _log.error("kafka_events.batch_failed", entity=self.entity, topic=self.cfg.topic, error=repr(exc))
                self._seek_back()
                self._stop.wait(2.0)

    def _work(self, records: list) -> None:
        events: list[ObjectEvent] = []
        for record in records:
            where = f"kafka/{record.topic}/{record.partition}/{record.offset}"
            parsed = parse(record.value or b"", self._scope)
            events.extend(parsed.events)
            if parsed.rejected:
                body = (record.value or b"").decode("utf-8", "replace")
                self._set_aside(where, "; ".join(r.reason for r in parsed.rejected), body)
        self._deliver(events)

    def _seek_back(self) -> None:
        """Go back to the committed offsets, so a failed batch is read again rather than skipped."""
        assert self._consumer is not None
        for tp in self._consumer.assignment():
            committed = self._consumer.committed(tp)
            if committed is None:
                self._consumer.seek_to_beginning(tp)
            else:
                self._consumer.seek(tp, committed)
