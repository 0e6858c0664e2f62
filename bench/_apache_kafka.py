"""A real Apache Kafka broker for the Kafka bench: one KRaft node (broker and controller) on 127.0.0.1.

Its jars are Maven Central's `org.apache.kafka:kafka_2.13`, resolved once into lakefeed's jar cache
(daemon/ops/jars.py) and run with the JVM Spark uses. Spark's own Kafka source, the bench's peer, needs a broker
whose ListOffsets answers right: tansu's gives a partition's last record batch's base offset + 1.
"""

from __future__ import annotations

import base64
import contextlib
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from lakefeed.ops import jars
from tests.kafka_broker import Broker, free_port

COORDINATE = "org.apache.kafka:kafka_2.13:4.1.1"
# Spark's Ivy leaves out what Spark ships itself; Kafka's broker needs these of them.
FROM_PYSPARK = ("scala-library-", "scala-reflect-", "jackson-module-scala_")
PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller}
listeners=PLAINTEXT://{bootstrap},CONTROLLER://127.0.0.1:{controller}
advertised.listeners=PLAINTEXT://{bootstrap}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs={logs}
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
"""


class ApacheKafka(Broker):
    """`Broker`'s interface (bootstrap, proc, start, stop, create_topic) on Apache Kafka."""

    stop_wait_s = 30.0

    def __init__(self, folder: Path) -> None:
        super().__init__(folder / "kafka.log")
        self.folder = folder

    def start(self, timeout: float = 60.0) -> None:
        java = shutil.which("java") or "java"
        classpath = ":".join(str(jar) for jar in self._classpath())
        properties = self.folder / "server.properties"
        properties.write_text(PROPERTIES.format(bootstrap=self.bootstrap, controller=free_port(),
                                                logs=self.folder / "data"))
        cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        with open(self.log, "ab") as out:
            subprocess.run([java, "-cp", classpath, "kafka.tools.StorageTool", "format", "-t", cluster, "-c",
                            str(properties)], stdout=out, stderr=subprocess.STDOUT, check=True, timeout=120)
            self.proc = subprocess.Popen([java, "-Xmx1g", "-cp", classpath, "kafka.Kafka", str(properties)],
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready(timeout)

    @staticmethod
    def _classpath() -> list[Path]:
        own = jars.own_jars()
        with contextlib.redirect_stdout(sys.stderr):  # a bench's stdout is its JSON report alone
            broker = jars.resolve("kafka-broker", COORDINATE)
        return [*broker,
                *(jar for name, jar in own.items() if name.startswith(FROM_PYSPARK))]
