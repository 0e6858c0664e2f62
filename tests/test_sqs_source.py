"""The SQS notification source against a real moto server: S3 bucket notifications to a real
queue, a real durable inbox, poison messages moved aside, and crashes around the offer."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import botocore.exceptions as boto_errors
import pytest

from lakefeed.connectors.sources.s3_events import ObjectEvent, Scope, latest_per_key
from lakefeed.connectors.sources.sqs_source import SqsSource, transient
from lakefeed.errors import TerminalError
from lakefeed.inbox.files import FileEvent, Inbox, InboxReader
from tests import s3_server
from tests.conftest import wait_for
from tests.test_s3_events import MOTO_PUT, MOTO_TEST_EVENT

VISIBILITY_S = 2
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _ns(t: datetime) -> int:
    return (t - EPOCH) // timedelta(microseconds=1) * 1000


class Crash(Exception):
    """Stands for the process dying at a failpoint."""


@pytest.fixture(scope="module")
def moto():
    with s3_server.running() as server:
        yield server


@dataclass
class Rig:
    server: s3_server.MotoServer
    queue: str
    dlq: str
    tmp: Path
    inbox: Inbox
    removed: list[ObjectEvent] = field(default_factory=list)
    sources: list[SqsSource] = field(default_factory=list)

    def deliver(self, events: list[ObjectEvent]) -> None:
        """What the S3 landing does, minus the HEAD: creations to the inbox (identity from the event)."""
        outcome = latest_per_key(events)
        self.inbox.offer([FileEvent(e.uri, e.size or 0, _ns(e.event_time))
                          for e in outcome if e.kind == "created"])
        self.removed.extend(e for e in outcome if e.kind == "removed")

    def source(self, **overrides: Any) -> SqsSource:
        kwargs: dict[str, Any] = dict(
            deliver=self.deliver, region=self.server.region, endpoint_override=self.server.endpoint,
            access_key_id="testing", secret_access_key="testing", dead_letter_url=self.dlq,
            wait_time_s=1, visibility_timeout_s=VISIBILITY_S, stop_timeout_s=10)
        kwargs.update(overrides)
        src = SqsSource("sales", self.queue, Scope.of("landing", "sales"), **kwargs)
        self.sources.append(src)
        src.start()
        return src

    def records(self):
        reader = InboxReader(self.tmp / "inbox")
        return reader.records(0, reader.refresh())

    def depth(self) -> int:
        return s3_server.depth(self.server, self.queue)

    def send(self, body: str) -> None:
        self.server.client("sqs").send_message(QueueUrl=self.queue, MessageBody=body)


@pytest.fixture
def rig(moto, tmp_path):
    moto.reset()
    queue = s3_server.bucket_to_queue(moto, "landing", "events", VisibilityTimeout=str(VISIBILITY_S))
    assert [json.loads(b)["Event"] for b in s3_server.drain(moto, queue)] == ["s3:TestEvent"]
    dlq = s3_server.create_queue(moto, "events-dead")
    inbox = Inbox(tmp_path / "inbox")
    r = Rig(moto, queue, dlq, tmp_path, inbox)
    yield r
    for src in r.sources:
        src.stop()
    inbox.close()


def _put(rig: Rig, key: str, body: bytes) -> None:
    rig.server.client("s3").put_object(Bucket="landing", Key=key, Body=body)


def _multipart(rig: Rig, key: str, body: bytes) -> None:
    s3 = rig.server.client("s3")
    upload = s3.create_multipart_upload(Bucket="landing", Key=key)
    part = s3.upload_part(Bucket="landing", Key=key, UploadId=upload["UploadId"], PartNumber=1, Body=body)
    s3.complete_multipart_upload(Bucket="landing", Key=key, UploadId=upload["UploadId"],
                                 MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]})


def test_objects_are_ingested_once_and_removals_reach_the_callback(rig):
    rig.source()
    objects = {"sales/a b.csv": b"a\n1\n", "sales/x+y.csv": b"a\n22\n", "sales/é/nested/deep/z.csv": b"a\n333\n",
               "sales/2024/%41 100%.csv": b"a\n4444\n"}
    started_ns = time.time_ns()
    for key, body in objects.items():
        _put(rig, key, body)
    _multipart(rig, "sales/big.csv", b"b\n" * 500)  # moto notifies this one twice
    objects["sales/big.csv"] = b"b\n" * 500
    wait_for(lambda: len(rig.records()) >= len(objects) and rig.depth() == 0, 20, what="every object enqueued")
    records = rig.records()
    assert sorted((r.path, r.size) for r in records) == sorted(
        (f"s3://landing/{k}", len(v)) for k, v in objects.items())
    assert all(started_ns - 60e9 < r.mtime_ns < time.time_ns() + 60e9 for r in records)  # from eventTime
    assert rig.removed == []

    rig.server.client("s3").delete_object(Bucket="landing", Key="sales/x+y.csv")
    wait_for(lambda: rig.removed and rig.depth() == 0, 20, what="the removal")
    assert [(e.key, e.kind) for e in rig.removed] == [("sales/x+y.csv", "removed")]
    assert len(rig.records()) == len(objects)  # nothing new, nothing twice
    assert s3_server.depth(rig.server, rig.dlq) == 0


def test_test_events_and_redelivered_duplicates_are_harmless(rig):
    rig.source()
    rig.send(MOTO_TEST_EVENT)
    rig.send(MOTO_PUT)
    wait_for(lambda: len(rig.records()) == 1 and rig.depth() == 0, 20, what="the first delivery")
    rig.send(MOTO_PUT)  # the same event again, as SQS may deliver it
    wait_for(lambda: rig.depth() == 0, 20, what="the duplicate consumed")
    (rec,) = rig.records()
    assert rec.path == "s3://landing/sales/2024/a b+c é%.csv" and rec.size == 4
    assert rec.mtime_ns == 1795313605658000000  # 2026-11-22T02:13:25.658Z, the recorded eventTime
    assert s3_server.depth(rig.server, rig.dlq) == 0


TRAVERSAL = MOTO_PUT.replace("sales%2F2024%2Fa+b%2Bc+%C3%A9%25.csv", "sales%2F..%2F..%2Fetc%2Fpasswd")


@pytest.mark.parametrize("aside", ["dead_letter_queue", "jsonl_file"])
def test_poison_is_moved_aside_with_its_reason_and_the_source_keeps_going(rig, aside):
    poison_file = rig.tmp / "poison" / "sales.jsonl"
    if aside == "dead_letter_queue":
        rig.source()
    else:
        rig.source(dead_letter_url=None, poison_file=poison_file)
    rig.send("this is not json {")
    rig.send(TRAVERSAL)
    wait_for(lambda: rig.depth() == 0, 20, what="the poison consumed")
    _put(rig, "sales/after.csv", b"a\n1\n")
    wait_for(lambda: len(rig.records()) == 1 and rig.depth() == 0, 20, what="a later object")
    assert rig.records()[0].path == "s3://landing/sales/after.csv"

    if aside == "dead_letter_queue":
        moved = s3_server.drain(rig.server, rig.dlq, attributes=True)
        got = {m["Body"]: m["MessageAttributes"]["reason"]["StringValue"] for m in moved}
        assert all(m["MessageAttributes"]["source_message_id"]["StringValue"] for m in moved)
    else:
        lines = [json.loads(line) for line in poison_file.read_text(encoding="utf-8").splitlines()]
        got = {d["body"]: d["reason"] for d in lines}
        assert all(d["message_id"] and d["entity"] == "sales" for d in lines)
    assert set(got) == {"this is not json {", TRAVERSAL}
    assert got["this is not json {"].startswith("malformed JSON")
    assert got[TRAVERSAL] == "key 'sales/../../etc/passwd' has a '..' segment"


def _failpoints(crash_at: str, action=None):
    calls: list[str] = []

    def failpoint(name: str) -> None:
        calls.append(name)
        if name == crash_at and calls.count(name) == 1:
            if action:
                action()
            else:
                raise Crash(name)

    return calls, failpoint


def test_a_crash_before_the_offer_leaves_the_message_to_be_redelivered(rig):
    calls, failpoint = _failpoints("sqs.received")
    rig.source(failpoint=failpoint)
    _put(rig, "sales/a.csv", b"a\n1\n")
    wait_for(lambda: "sqs.received" in calls, 20, what="the first receipt")
    crashed_at = time.monotonic()
    assert rig.records() == [] and rig.depth() == 1  # not offered, not deleted
    wait_for(lambda: len(rig.records()) == 1 and rig.depth() == 0, 20, what="the redelivery")
    assert time.monotonic() - crashed_at > VISIBILITY_S - 0.5  # it came back only after the visibility timeout
    assert calls == ["sqs.received", "sqs.received", "sqs.offered"]


def test_a_crash_after_the_offer_before_the_delete_does_not_duplicate(rig):
    calls, failpoint = _failpoints("sqs.offered")
    rig.source(failpoint=failpoint)
    _put(rig, "sales/a.csv", b"a\n1\n")
    wait_for(lambda: calls.count("sqs.offered") == 2 and rig.depth() == 0, 20, what="the redelivery")
    assert [r.path for r in rig.records()] == ["s3://landing/sales/a.csv"]
    assert len(rig.inbox) == 1


def test_a_slow_batch_keeps_its_messages_invisible(rig):
    seen: list[str] = []

    def slow() -> None:  # three visibility timeouts long, while another consumer keeps looking
        sqs = rig.server.client("sqs")
        deadline = time.monotonic() + 3 * 1
        while time.monotonic() < deadline:
            got = sqs.receive_message(QueueUrl=rig.queue, WaitTimeSeconds=0, VisibilityTimeout=0).get("Messages", [])
            seen.extend(m["MessageId"] for m in got)
            time.sleep(0.2)

    calls, failpoint = _failpoints("sqs.received", action=slow)
    rig.source(failpoint=failpoint, visibility_timeout_s=1)
    _put(rig, "sales/a.csv", b"a\n1\n")
    wait_for(lambda: len(rig.records()) == 1 and rig.depth() == 0, 20, what="the slow batch")
    assert seen == []
    assert calls == ["sqs.received", "sqs.offered"]  # received once: never handed out again


def test_stop_is_prompt_and_bad_settings_are_refused(rig):
    src = rig.source()
    done = threading.Event()
    t0 = time.monotonic()
    threading.Thread(target=lambda: (src.stop(), done.set()), daemon=True).start()
    assert done.wait(5) and time.monotonic() - t0 < 3  # at most one long poll (1 s here)
    with pytest.raises(ValueError, match="dead_letter_url or poison_file"):
        SqsSource("e", rig.queue, Scope.of("landing"), deliver=print, region="us-east-1")
    with pytest.raises(ValueError, match="wait_time_s must be 0..20"):
        SqsSource("e", rig.queue, Scope.of("landing"), deliver=print, region="us-east-1",
                  poison_file=rig.tmp / "p", wait_time_s=30)
    missing = rig.queue.rsplit("/", 1)[0] + "/nope"
    with pytest.raises(TerminalError, match="cannot be used"):
        SqsSource("e", missing, Scope.of("landing"), deliver=print, region="us-east-1",
                  endpoint_override=rig.server.endpoint, poison_file=rig.tmp / "p").start()


def test_transient_errors_are_retried_and_others_are_not(rig):
    src = SqsSource("e", rig.queue, Scope.of("landing"), deliver=print, region="us-east-1",
                    endpoint_override=rig.server.endpoint, poison_file=rig.tmp / "p", attempts=4)
    throttled = boto_errors.ClientError({"Error": {"Code": "ThrottlingException"}}, "ReceiveMessage")
    denied = boto_errors.ClientError({"Error": {"Code": "AccessDenied"}, "ResponseMetadata": {"HTTPStatusCode": 403}},
                                     "ReceiveMessage")
    failures = [boto_errors.EndpointConnectionError(endpoint_url="http://127.0.0.1:9"), throttled]

    def flaky() -> dict[str, Any]:
        if failures:
            raise failures.pop(0)
        return {"ok": True}

    assert src._call(flaky) == {"ok": True} and failures == []
    assert transient(throttled) and not transient(denied) and not transient(ValueError())
    calls = []

    def refused() -> dict[str, Any]:
        calls.append(1)
        raise denied

    with pytest.raises(boto_errors.ClientError):
        src._call(refused)
    assert calls == [1]
