"""A Spark standalone cluster for tests: a master and a worker from the pip-installed pyspark's `bin/spark-class`
(org.apache.spark.deploy.master.Master and org.apache.spark.deploy.worker.Worker), on 127.0.0.1, as a user who
outgrows one machine would run them on each of theirs."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest

from tests.kafka_broker import free_port

SPARK_HOME = Path(pyspark.__file__).parent


class Standalone:
    """One master and one worker with `cores` cores; `url` is the master's spark:// URL."""

    def __init__(self, folder: Path, cores: int = 2) -> None:
        self.folder = folder
        self.cores = cores
        self.url = f"spark://127.0.0.1:{free_port()}"
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, timeout: float = 90.0) -> None:
        port = self.url.rsplit(":", 1)[1]
        self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", port,
                               "--webui-port", str(free_port())])
        self._await("master", "I have been elected leader", timeout)
        work = self.folder / "worker-work"
        work.mkdir(parents=True, exist_ok=True)
        self._spawn("worker", ["org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                               "--cores", str(self.cores), "--memory", "2g", "--work-dir", str(work),
                               "--webui-port", str(free_port())])
        self._await("worker", "Successfully registered with master", timeout)

    def _spawn(self, name: str, args: list[str]) -> None:
        env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
               "SPARK_NO_DAEMONIZE": "1"}
        with open(self.folder / f"{name}.log", "ab") as out:
            self.procs.append(subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), *args], env=env,
                                               stdout=out, stderr=subprocess.STDOUT, start_new_session=True))

    def _await(self, name: str, line: str, timeout: float) -> None:
        log = self.folder / f"{name}.log"
        deadline = time.monotonic() + timeout
        while line not in log.read_text(errors="replace"):
            proc = self.procs[-1]
            if proc.poll() is not None:
                raise RuntimeError(f"the Spark {name} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Spark {name} did not log {line!r} in {timeout:.0f}s:\n"
                                   f"{log.read_text()[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        for proc in reversed(self.procs):  # the worker first: it kills its executors
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


@pytest.fixture
def spark_standalone(tmp_path) -> Iterator[Standalone]:
    folder = tmp_path / "spark-standalone"
    folder.mkdir()
    cluster = Standalone(folder)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
