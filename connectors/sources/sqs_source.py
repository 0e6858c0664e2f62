"""S3 event notifications read from an SQS queue (S3→SQS, or S3→SNS→SQS) into the inbox.

A thread long-polls the queue. Each batch is parsed (`s3_events`) and its events handed to
`deliver`, which returns once they are durable (the S3 landing writes them to the inbox);
bodies with rejected records are moved aside with the reason (to a dead-letter queue as a
`reason` message attribute, else a local JSONL file), and only then are the messages deleted.
A crash anywhere before the delete means redelivery after the visibility timeout, which is
harmless: the inbox keeps one record per object identity. While a batch is worked on its
visibility is extended, so a slow batch is not handed out twice. SQS cannot be listed: the
landing's listing catches what the queue lost.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions as boto_errors
from botocore.config import Config as BotoConfig
from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_when_event_set, wait_exponential

from lakefeed import clock, failpoints, log
from lakefeed.connectors.sources.base import Source
from lakefeed.connectors.sources.s3_events import ObjectEvent, Parsed, Scope, parse
from lakefeed.errors import TerminalError

_log = log.get(__name__)
_THROTTLED = {"Throttling", "ThrottlingException", "RequestThrottled", "RequestTimeout", "ServiceUnavailable",
              "InternalError", "InternalFailure", "KmsThrottled"}


def transient(exc: BaseException) -> bool:
    """Worth retrying: the network, throttling, or the service's own trouble."""
    if isinstance(exc, boto_errors.ConnectionError | boto_errors.HTTPClientError):
        return True
    if isinstance(exc, boto_errors.ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return exc.response.get("Error", {}).get("Code") in _THROTTLED or status >= 500
    return False


def _reveal(secret: Any) -> str | None:
    """Plain strings or pydantic SecretStr; the value only ever goes to boto."""
    return secret.get_secret_value() if hasattr(secret, "get_secret_value") else secret


def _sqs_text(text: str, limit: int = 1024) -> str:
    """SQS refuses characters outside XML's range in attribute values."""
    ok = (c if c in "\t\n\r" or " " <= c <= "\ud7ff" or "\ue000" <= c <= "\ufffd" or c >= "\U00010000" else "?"
          for c in text)
    return "".join(ok)[:limit]


class SqsSource(Source):
    def __init__(self, entity: str, queue_url: str, scope: Scope, *,
                 deliver: Callable[[list[ObjectEvent]], object], region: str,
                 endpoint_override: str | None = None, access_key_id: str | None = None,
                 secret_access_key: Any = None, session_token: Any = None,
                 dead_letter_url: str | None = None, poison_file: Path | None = None,
                 wait_time_s: int = 20, visibility_timeout_s: int = 60, attempts: int = 5,
                 failpoint: Callable[[str], None] = failpoints.reached, stop_timeout_s: float = 2.0) -> None:
        if not (dead_letter_url or poison_file):
            raise ValueError(f"entity {entity!r}: set dead_letter_url or poison_file, where rejected messages go")
        if not 0 <= wait_time_s <= 20:
            raise ValueError(f"entity {entity!r}: wait_time_s must be 0..20 (SQS long polling), not {wait_time_s}")
        if not 1 <= visibility_timeout_s <= 43200:
            raise ValueError(f"entity {entity!r}: visibility_timeout_s must be 1..43200, not {visibility_timeout_s}")
        self.entity = entity
        self.queue_url = queue_url
        self._scope = scope
        self._deliver = deliver
        self._dlq = dead_letter_url
        self._poison_file = poison_file
        self._wait = wait_time_s
        self._visibility = visibility_timeout_s
        self._attempts = attempts
        self._failpoint = failpoint
        self._stop_timeout = stop_timeout_s
        self._endpoint = endpoint_override
        session = boto3.session.Session(aws_access_key_id=access_key_id, region_name=region,
                                        aws_secret_access_key=_reveal(secret_access_key),
                                        aws_session_token=_reveal(session_token))
        # tenacity owns retries; the read timeout must outlast a long poll.
        config = BotoConfig(retries={"mode": "standard", "max_attempts": 1}, connect_timeout=5,
                            read_timeout=wait_time_s + 10)
        self._sqs = session.client("sqs", endpoint_url=endpoint_override, config=config)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"source-{entity}", daemon=True)

    def _call(self, fn: Callable[..., dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
        for attempt in Retrying(retry=retry_if_exception(transient), reraise=True, sleep=self._pause,
                                stop=stop_after_attempt(self._attempts) | stop_when_event_set(self._stop),
                                wait=wait_exponential(multiplier=0.2, max=5)):
            with attempt:
                return fn(**kwargs)
        raise AssertionError("unreachable")  # Retrying either returns or re-raises

    def _pause(self, seconds: float) -> None:
        self._stop.wait(seconds)  # a backoff that stop() cuts short

    def start(self) -> None:
        for url in filter(None, (self.queue_url, self._dlq)):
            try:
                self._call(self._sqs.get_queue_attributes, QueueUrl=url, AttributeNames=["QueueArn"])
            except boto_errors.ClientError as exc:
                raise TerminalError(f"entity {self.entity!r}: queue {url} cannot be used: {exc}") from exc
        _log.info("source.started", entity=self.entity, queue=self.queue_url, endpoint=self._endpoint)
        self._thread.start()

    def reconcile(self) -> int:
        """A queue cannot be listed; the landing's listing does this."""
        return 0

    def stop(self) -> None:
        """Stop intake; a long poll still in flight ends on its own and its messages are released."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._stop_timeout)
        _log.info("source.stopped", entity=self.entity, queue=self.queue_url)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                messages = self._call(self._sqs.receive_message, QueueUrl=self.queue_url, MaxNumberOfMessages=10,
                                      WaitTimeSeconds=self._wait, VisibilityTimeout=self._visibility,
                                      MessageSystemAttributeNames=["ApproximateReceiveCount"]).get("Messages", [])
            except Exception as exc:
                if not self._stop.is_set():
                    _log.error("sqs.receive_failed", entity=self.entity, queue=self.queue_url, error=str(exc))
                    self._stop.wait(5.0)
                continue
            if not messages:
                continue
            if self._stop.is_set():
                self._release(messages)
                break
            try:
                with self._extending(messages):
                    self._work(messages)
                self._delete(messages)
            except Exception as exc:  # nothing deleted: the batch comes back after the visibility timeout
                _log.error("sqs.batch_failed", entity=self.entity, queue=self.queue_url, error=repr(exc),
                           messages=[m["MessageId"] for m in messages])

    def _work(self, messages: list[dict[str, Any]]) -> None:
        parsed = [(m, parse(m["Body"], self._scope)) for m in messages]
        _log.info("sqs.received", entity=self.entity, messages=len(messages),
                  receive_counts=[int(m.get("Attributes", {}).get("ApproximateReceiveCount", 0)) for m in messages])
        for m, p in parsed:
            for r in p.rejected:
                _log.warning("event.rejected", entity=self.entity, message_id=m["MessageId"], reason=r.reason,
                             excerpt=r.raw_excerpt)
        self._failpoint("sqs.received")
        self._deliver([ev for _, p in parsed for ev in p.events])
        self._failpoint("sqs.offered")
        for m, p in parsed:
            if reason := _aside_reason(p):
                self._move_aside(m, reason)

    def _move_aside(self, message: dict[str, Any], reason: str) -> None:
        if self._dlq:
            attrs = {"reason": reason, "source_queue": self.queue_url, "source_message_id": message["MessageId"]}
            try:
                self._call(self._sqs.send_message, QueueUrl=self._dlq, MessageBody=message["Body"],
                           MessageAttributes={k: {"DataType": "String", "StringValue": _sqs_text(v)}
                                              for k, v in attrs.items()})
                _log.warning("sqs.poison", entity=self.entity, message_id=message["MessageId"], reason=reason,
                             moved_to=self._dlq)
                return
            except boto_errors.ClientError as exc:
                if self._poison_file is None or transient(exc):
                    raise
                _log.error("sqs.dead_letter_refused", entity=self.entity, queue=self._dlq, error=str(exc))
        assert self._poison_file is not None
        line = {"at": clock.to_cdm(clock.now()), "entity": self.entity, "queue": self.queue_url,
                "message_id": message["MessageId"], "reason": reason, "body": message["Body"]}
        self._poison_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self._poison_file, "a", encoding="utf-8") as f:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        _log.warning("sqs.poison", entity=self.entity, message_id=message["MessageId"], reason=reason,
                     moved_to=str(self._poison_file))

    def _delete(self, messages: list[dict[str, Any]]) -> None:
        entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)]
        failed = self._call(self._sqs.delete_message_batch, QueueUrl=self.queue_url, Entries=entries).get("Failed")
        if failed:  # they come back and are recognised as already offered
            _log.warning("sqs.delete_failed", entity=self.entity, failed=failed)

    def _release(self, messages: list[dict[str, Any]]) -> None:
        """Make messages received while stopping visible again at once, for whoever polls next."""
        entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0}
                   for i, m in enumerate(messages)]
        try:
            self._sqs.change_message_visibility_batch(QueueUrl=self.queue_url, Entries=entries)
        except Exception as exc:  # they reappear after the visibility timeout anyway
            _log.warning("sqs.release_failed", entity=self.entity, error=str(exc))

    @contextmanager
    def _extending(self, messages: list[dict[str, Any]]) -> Iterator[None]:
        """Extend the batch's visibility every half timeout while it is worked on."""
        done = threading.Event()
        entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": self._visibility}
                   for i, m in enumerate(messages)]

        def beat() -> None:
            while not done.wait(self._visibility / 2):
                try:
                    failed = self._sqs.change_message_visibility_batch(QueueUrl=self.queue_url,
                                                                       Entries=entries).get("Failed")
                    _log.info("sqs.visibility_extended", entity=self.entity, messages=len(entries),
                              by_s=self._visibility, failed=failed or None)
                except Exception as exc:  # the next beat tries again; at worst a duplicate delivery
                    _log.warning("sqs.extend_failed", entity=self.entity, error=str(exc))

        beater = threading.Thread(target=beat, name=f"source-{self.entity}-visibility", daemon=True)
        beater.start()
        try:
            yield
        finally:
            done.set()
            beater.join()


def _aside_reason(p: Parsed) -> str | None:
    """Why a message's body is kept aside, or None: rejected records, or a confirmation a person must act on."""
    if p.confirmation:
        return f"SNS subscription confirmation for {p.confirmation.topic_arn}: confirm it through SubscribeURL"
    if not p.rejected:
        return None
    reasons = "; ".join(r.reason for r in p.rejected)
    if p.poison:
        return reasons
    return f"{len(p.rejected)} record(s) rejected, the others were taken: {reasons}"
