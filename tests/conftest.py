"""Shared fixtures: one local SparkSession per test process, config files in tmp_path, waiting."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from hypothesis import settings

os.environ.setdefault("TZ", "UTC")  # the CDM SDK's local adapter reports local time as UTC
# Every JVM the suite starts (Spark's, the test brokers') compiles with C1 only: each lives seconds to a minute, too
# short for C2's compilations to pay back their CPU. Measured: two daemon kill tests took 21% less time.
C1_ONLY = "-XX:TieredStopAtLevel=1"
os.environ.setdefault("JDK_JAVA_OPTIONS", C1_ONLY)
# Two workers share the machine's cores (`make test`: pytest-xdist): an example slower than hypothesis's default
# deadline (200 ms) is the other worker's JVM, not a failure. Each property test still runs all its examples.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

# `make test` hands each of its two workers one test file at a time (pytest-xdist: `--dist loadfile`, files in the
# order collected: `--no-loadscope-reorder`). The slowest go first, so that no run ends with one worker alone on a
# long file while the other idles. Worker seconds of each in a CI run, 2026-11-30 (790 tests, 5,456 s in all);
# files not named follow, by name.
SLOW_FILES = {"test_benches.py": 850, "test_cdc.py": 720, "test_executors.py": 600, "test_delta_spark.py": 400,
              "test_daemon_process.py": 310, "test_s3_daemon.py": 310, "test_push_daemon.py": 290,
              "test_operations.py": 280, "test_poison.py": 250, "test_msc.py": 110, "test_kafka_source.py": 100,
              "test_kartothek.py": 90}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: -SLOW_FILES.get(item.path.name, 0))  # stable: a file's tests stay together, in order


@pytest.fixture(autouse=True, scope="session")
def _logs_to_stderr():
    from lakefeed import log

    log.configure("INFO", json=False)  # as the daemon does: stdout stays for command output

@pytest.fixture(autouse=True)
def _inboxes_closed(monkeypatch):
    """Inboxes a test opens are closed after it, as the daemon's runner closes its own at a stop. Left open, a pytest
    worker's descriptors passed 1024, and py4j's callback server, which select()s its socket, died ("filedescriptor
    out of range in select()"): every foreachBatch query of that worker after it hung."""
    from lakefeed.inbox.files import Inbox

    opened: list[Inbox] = []
    init = Inbox.__init__

    def tracked(self, *args, **kwargs):
        init(self, *args, **kwargs)
        opened.append(self)

    monkeypatch.setattr(Inbox, "__init__", tracked)
    yield
    for inbox in opened:
        if inbox._fd != -1:  # not closed by the test (a runner's stop closes its own)
            inbox.close()


T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout: float = 60.0, interval: float = 0.1, what: str = "") -> T:
    """Poll until `condition()` is truthy and return it; fail the test at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")
        time.sleep(interval)


def entity_yaml(name: str = "sales", **overrides: Any) -> dict[str, Any]:
    entity: dict[str, Any] = {
        "name": name,
        "source": {"type": "local_dir", "path": "landing", "reconcile_interval_s": 1.0},
        "manifest": "landing/default.manifest.cdm.json",
        "patterns": [
            {"name": "byMonth", "root_location": name, "regular_expression": r"/(\d{4})/(\d{2})/[^/]+\.csv",
             "parameters": ["year", "month"]},
            {"name": "flat", "root_location": name, "glob_pattern": "/*.csv"},
        ],
        "format": {"kind": "csv", "header": True},
    }
    entity.update(overrides)
    return entity


def write_config(folder: Path, entities: list[dict[str, Any]] | None = None, **top: Any) -> Path:
    doc: dict[str, Any] = {
        "lake_dir": "lake",
        "state_dir": "state",
        "log_level": "INFO",
        "spark": {"master": "local[2]", "trigger_interval_s": 0.3},
        "http": {"host": "127.0.0.1", "port": 0},  # a free port: tests never collide with a running daemon
        "entities": entities or [entity_yaml()],
    }
    doc.update(top)
    path = folder / "lakefeed.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def writers_of(table: Path | str, storage_options: dict[str, str] | None = None) -> set[str]:
    """Which writers made the commits of a Delta table, by their engineInfo: delta-spark's reads
    "Apache-Spark/<v> Delta-Lake/<v>", delta-rs's "delta-rs:py-<v>"."""
    from deltalake import DeltaTable

    engines = [c.get("engineInfo", "") for c in DeltaTable(str(table), storage_options=storage_options).history()]
    return {"delta-spark" if "Delta-Lake/" in e else "delta-rs" if e.startswith("delta-rs") else e for e in engines}


def land(path: Path, text: str) -> Path:
    """Write a file the way producers should: under a temporary name, then rename into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Whether the process is there and not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="session")
def spark():
    """local[2]; or the master LAKEFEED_TEST_SPARK_MASTER names (tests/test_cdc.py runs its delta-spark model
    test on local-cluster that way), with a shuffle partition per executor."""
    from lakefeed.config.model import SparkConfig
    from lakefeed.ops import spark as spark_module

    master = os.environ.get("LAKEFEED_TEST_SPARK_MASTER", "local[2]")
    partitions = "1" if master.startswith("local[") else "2"
    with pytest.MonkeyPatch.context() as patch:
        # Unlike the daemons the tests start, this JVM lives as long as its worker and runs every delta-spark MERGE
        # of it: C2's compilations pay back here (the delta-spark model test, same seed: 136 s, 175 with C1 only).
        if os.environ.get("JDK_JAVA_OPTIONS") == C1_ONLY:
            patch.delenv("JDK_JAVA_OPTIONS")
        session = spark_module.session(SparkConfig(master=master, conf={"spark.sql.shuffle.partitions": partitions}),
                                       packages=("delta",))  # for the delta-spark writer
    if master.startswith("local-cluster"):  # its executors, registered: no task runs in the driver
        wait_for(lambda: session.sparkContext._jsc.sc().getExecutorMemoryStatus().size() > 2, 120, 0.2, "executors")
    yield session
    session.stop()
