"""A real moto server on 127.0.0.1 for the object-store tests, and helpers to set it up.

moto speaks S3, SQS and SNS and delivers real bucket notifications (S3→SQS, S3→SNS→HTTP).
Test modules wrap `running()` in a fixture of their own scope and call `reset()` between
tests; the server is stopped when the context ends.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import boto3
import pytest

REGION = "us-east-1"
DUMMY_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",  # moto accepts anything
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_REQUEST_CHECKSUM_CALCULATION": "WHEN_REQUIRED",
    "AWS_RESPONSE_CHECKSUM_VALIDATION": "WHEN_REQUIRED",
}


@dataclass
class MotoServer:
    endpoint: str
    region: str = REGION

    def client(self, service: str) -> Any:
        return boto3.client(service, endpoint_url=self.endpoint, region_name=self.region)

    def reset(self) -> None:
        """Forget every bucket, queue and topic (moto's own reset API)."""
        req = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200


@contextmanager
def running() -> Iterator[MotoServer]:
    """Start moto on a free loopback port with dummy credentials in the environment; stop it after."""
    from moto.server import ThreadedMotoServer

    werkzeug = logging.getLogger("werkzeug")  # one INFO line per request otherwise
    level = werkzeug.level
    werkzeug.setLevel(logging.WARNING)
    with pytest.MonkeyPatch.context() as mp:
        for name, value in DUMMY_ENV.items():
            mp.setenv(name, value)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        try:
            host, port = server.get_host_and_port()
            yield MotoServer(f"http://{host}:{port}")
        finally:
            server.stop()
            werkzeug.setLevel(level)


def create_queue(server: MotoServer, name: str, **attributes: str) -> str:
    return server.client("sqs").create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]


def queue_arn(server: MotoServer, url: str) -> str:
    attrs = server.client("sqs").get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]
    return attrs["QueueArn"]


def bucket_to_queue(server: MotoServer, bucket: str, queue: str, prefix: str | None = None,
                    events: tuple[str, ...] = ("s3:ObjectCreated:*", "s3:ObjectRemoved:*"),
                    **queue_attributes: str) -> str:
    """A bucket whose creations and removals are notified to a new queue; returns the queue URL.

    S3 (and moto) sends an `s3:TestEvent` to the queue when the configuration is put.
    """
    s3 = server.client("s3")
    s3.create_bucket(Bucket=bucket)
    url = create_queue(server, queue, **queue_attributes)
    config: dict[str, Any] = {"QueueArn": queue_arn(server, url), "Events": list(events)}
    if prefix:
        config["Filter"] = {"Key": {"FilterRules": [{"Name": "prefix", "Value": prefix}]}}
    s3.put_bucket_notification_configuration(Bucket=bucket, NotificationConfiguration={"QueueConfigurations": [config]})
    return url


def bucket_to_topic(server: MotoServer, bucket: str, topic: str) -> str:
    """A bucket notifying a new SNS topic; returns the topic ARN."""
    s3 = server.client("s3")
    s3.create_bucket(Bucket=bucket)
    arn = server.client("sns").create_topic(Name=topic)["TopicArn"]
    s3.put_bucket_notification_configuration(Bucket=bucket, NotificationConfiguration={"TopicConfigurations": [
        {"TopicArn": arn, "Events": ["s3:ObjectCreated:*", "s3:ObjectRemoved:*"]}]})
    return arn


def drain(server: MotoServer, url: str, attributes: bool = False) -> list[Any]:
    """Receive and delete everything visible now: bodies, or whole messages with their attributes."""
    sqs = server.client("sqs")
    out: list[Any] = []
    while True:
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0,
                                  MessageAttributeNames=["All"]).get("Messages", [])
        if not got:
            return out
        for m in got:
            out.append(m if attributes else m["Body"])
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])


def depth(server: MotoServer, url: str) -> int:
    """Messages in the queue, visible or in flight."""
    attrs = server.client("sqs").get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])
    return sum(int(v) for v in attrs["Attributes"].values())


@dataclass
class HttpSink:
    """A local HTTP endpoint recording what is POSTed to it (for SNS HTTP subscriptions)."""

    url: str
    posts: list[tuple[dict[str, str], str]] = field(default_factory=list)

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in list(self.posts)]


@contextmanager
def http_sink() -> Iterator[HttpSink]:
    sink = HttpSink("")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            sink.posts.append((dict(self.headers), self.rfile.read(length).decode()))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    sink.url = f"http://127.0.0.1:{server.server_port}/s3-events"
    try:
        yield sink
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
