"""Kafka topics into a real daemon against a real broker (tansu): exactly once across SIGKILL, a broker
outage of 20 s mid-stream, undecodable messages quarantined, Debezium envelopes, and a broker that lost its
data failing the source loudly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from deltalake import DeltaTable
from kafka import KafkaProducer
from moto.server import ThreadedMotoServer

from lakefeed.config import model as config_module
from lakefeed.pipeline.verify import verify
from tests.conftest import wait_for, write_config, writers_of
from tests.kafka_broker import (
    Broker,
    free_port,
    kafka_broker,  # noqa: F401 - a fixture
    tansu_binary,
)
from tests.test_daemon_process import Daemon


class DurableBroker(Broker):
    """tansu storing its topics in S3 (a moto server on loopback), so a restart keeps every record."""

    def __init__(self, log: Path, s3_endpoint: str) -> None:
        super().__init__(log)
        self._env = {**os.environ, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                     "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT": s3_endpoint,
                     "AWS_ALLOW_HTTP": "true"}

    def start(self, timeout: float = 30.0) -> None:
        url = f"tcp://{self.bootstrap}"
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([str(tansu_binary()), "broker", "--listener-url", url,
                                          "--advertised-listener-url", url, "--storage-engine", "s3://tansu/"],
                                         stdout=out, stderr=subprocess.STDOUT, env=self._env)
        self._wait_ready(timeout)


@pytest.fixture
def durable_broker(tmp_path) -> Iterator[DurableBroker]:
    s3 = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    s3.start()
    host, port = s3.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                 region_name="us-east-1").create_bucket(Bucket="tansu")
    broker = DurableBroker(tmp_path / "tansu.log", endpoint)
    broker.start()
    yield broker
    broker.stop()
    s3.stop()


def _table(path: Path) -> list[dict]:
    try:
        return DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    except Exception:
        return []


def _get(url: str, path: str) -> str:
    with urllib.request.urlopen(url + path, timeout=10) as resp:
        return resp.read().decode()


def _source(url: str) -> dict | None:
    return json.loads(_get(url, "/status"))["entities"]["orders"]["streams"]["topic"]["source"]


def _send_raw(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for value in values:
        producer.send(topic, value, partition=0)
    producer.flush()
    producer.close()


def _debezium(op: str, before: dict | None, after: dict | None, ts: int) -> dict:
    return {"schema": {"type": "struct"}, "payload": {"before": before, "after": after, "op": op, "ts_ms": ts}}


def test_topics_land_exactly_once_across_sigkill_and_a_broker_outage(tmp_path, durable_broker):
    """Both writers in one daemon: the orders (appends) by delta-rs, the customers (MERGE) by delta-spark."""
    broker = durable_broker
    broker.create_topic("orders", 3)
    broker.create_topic("customers", 1)
    orders = {"name": "orders", "kafka": [{"name": "topic", "bootstrap_servers": broker.bootstrap,
                                           "topics": ["orders"], "max_offsets_per_trigger": 150}]}
    customers = {"name": "customers", "writer": "delta-spark",
                 "cdc": {"strategy": "changelog", "primary_key": ["id"], "debezium": True},
                 "kafka": [{"name": "cdc", "bootstrap_servers": broker.bootstrap, "pattern": "cust.*"}]}
    config = write_config(tmp_path, [orders, customers], spark={"master": "local[2]", "trigger_interval_s": 0.3})
    table = tmp_path / "lake" / "orders" / "table"
    with Daemon(config, tmp_path / "daemon.log") as daemon:
        daemon.start(env={"LAKEFEED_FAILPOINT": "manifest.written"})  # killed once its first batch committed
        broker.produce("orders", [{"id": i, "v": "x"} for i in range(600)])
        _send_raw(broker.bootstrap, "orders", [b"not json", b"[1, 2]", b"null", b"   "])  # JSON null: not a row
        broker.produce("customers", [
            _debezium("c", None, {"id": 1, "name": "ada"}, 1000), _debezium("c", None, {"id": 2, "name": "bob"}, 1001),
            _debezium("u", {"id": 1, "name": "ada"}, {"id": 1, "name": "ada l."}, 1002),
            _debezium("d", {"id": 2, "name": "bob"}, None, 1003)])
        assert daemon.wait(120) == -signal.SIGKILL
        daemon.start()  # ready while it works through what the first life left (150 orders a batch)
        # The outage starts once those are in, between batches: the source reports it when Spark asks it for new
        # offsets (a read cut off inside a batch is retried by the task, and reported only by the next planning).
        wait_for(lambda: len(_table(table)) >= 600, 120, 0.3, "the orders of the first life")
        url = json.loads((tmp_path / "state" / "http.json").read_text())["url"]
        outage = time.monotonic()
        broker.stop()  # the broker is away for 10 s mid-stream
        wait_for(lambda: (_source(url) or {}).get("unavailable"), 20, 0.2, "the source to report the outage")
        wait_for(lambda: 'lakefeed_source_unavailable{entity="orders",stream="topic"} 1.0' in _get(url, "/metrics"),
                 10, 0.2, "the outage in the metrics")
        time.sleep(max(0.0, 10 - (time.monotonic() - outage)))  # the rest of the outage
        broker.start()
        broker.produce("orders", [{"id": i, "v": "y"} for i in range(600, 1000)])
        wait_for(lambda: (_source(url) or {}).get("unavailable") is False, 60, 0.2, "the source to be back")
        assert _source(url)["retries"] >= 1

        def reports() -> list[str]:  # logged by the daemon's sampling loop, a moment after /status shows it
            return [json.loads(line)["event"] for line in daemon.log.read_text().splitlines()
                    if line.startswith("{") and '"entity": "orders"' in line and '"event": "source.' in line]

        wait_for(lambda: reports()[-2:] == ["source.unavailable", "source.available"], 10, 0.2, "the log")
        wait_for(lambda: len(_table(table)) >= 1000, 180, 0.5, "every order")
        wait_for(lambda: {r["id"]: r["name"] for r in _table(tmp_path / "lake" / "customers" / "table")}
                 == {1: "ada l."}, 60, 0.3, "the customers' state")
        daemon.stop()
    rows = _table(table)
    assert sorted(r["id"] for r in rows) == list(range(1000))  # every message once
    assert {r["kafka_topic"] for r in rows} == {"orders"} and {r["kafka_partition"] for r in rows} == {0, 1, 2}
    by_offset = {(r["kafka_partition"], r["kafka_offset"]) for r in rows}
    assert len(by_offset) == 1000
    quarantine = _table(tmp_path / "lake" / "orders" / "quarantine")
    assert sorted((q["source_file"], q["raw"]) for q in quarantine) == [
        ("kafka/orders/0", "   "), ("kafka/orders/0", "[1, 2]"), ("kafka/orders/0", "not json"),
        ("kafka/orders/0", "null")]
    assert all(q["line"] >= 200 for q in quarantine)  # the offsets of the bad messages in partition 0
    cfg = config_module.load(config)
    assert verify(cfg.entity("orders")) == [] and verify(cfg.entity("customers")) == []
    assert writers_of(cfg.entity("orders").table) == {"delta-rs"}
    assert writers_of(cfg.entity("customers").table) == {"delta-spark"}


def test_a_broker_that_lost_its_data_stops_the_source_with_a_clear_error(tmp_path, kafka_broker):  # noqa: F811
    broker = kafka_broker  # memory storage: a restart loses every topic
    broker.create_topic("lost", 1)
    entity = {"name": "lost", "kafka": [{"name": "topic", "bootstrap_servers": broker.bootstrap,
                                         "topics": ["lost"], "retry_timeout_s": 30}]}
    config = write_config(tmp_path, [entity], spark={"master": "local[2]", "trigger_interval_s": 0.3})
    broker.produce("lost", [{"id": i} for i in range(20)])
    with Daemon(config, tmp_path / "daemon.log") as daemon:
        daemon.start()
        wait_for(lambda: len(_table(tmp_path / "lake" / "lost" / "table")) == 20, 60, 0.3, "the first records")
        broker.restart()  # the daemon's own metadata requests may recreate the topic, empty
        broker.produce("lost", [{"id": 100}])
        wait_for(lambda: daemon.events("entity.failed") == 1, 120, 0.5, "the source to fail")
        failure = next(json.loads(line) for line in daemon.log.read_text().splitlines()
                       if '"event": "entity.failed"' in line)
        assert failure["entity"] == "lost" and "KafkaOffsetError" in failure["error"]
        assert "checkpoint" in failure["error"]
        daemon.stop()
