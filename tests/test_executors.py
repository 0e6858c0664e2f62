"""Spark does the row work: on a multi-process Spark (`local-cluster`: a master, a worker and two executor JVMs,
each with Python workers of its own; and a standalone master and worker started from `spark-class`), file, push
and Kafka batches are read, decoded and written in executor processes (the changelog files hashed there as ODF
slices), the driver only commits, and SIGKILLs of the daemon or of an executor mid-batch, or a stop that cancels a
batch's tasks, lose and double nothing."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest
from deltalake import DeltaTable

from lakefeed.config import model as config_module
from lakefeed.connectors.sinks.delta_log import commit_metadata
from lakefeed.pipeline.verify import verify
from tests.conftest import entity_yaml, land, wait_for, write_config, writers_of
from tests.kafka_broker import kafka_broker  # noqa: F401 - a fixture
from tests.spark_standalone import spark_standalone  # noqa: F401 - a fixture
from tests.test_daemon_process import ROWS_PER_FILE, Daemon, _csv, _table_rows

CLUSTER = "local-cluster[2,1,1024]"


@pytest.fixture
def cluster(tmp_path, request):
    """`request.param` (indirect parametrization): the entity's writer, delta-rs by default."""
    entity = entity_yaml(source={"type": "local_dir", "path": "landing", "reconcile_interval_s": 2,
                                 "max_files_per_trigger": 8}, writer=getattr(request, "param", "delta-rs"))
    config = write_config(tmp_path, [entity], spark={"master": CLUSTER, "trigger_interval_s": 0.2})
    daemon = Daemon(config, tmp_path / "daemon.log")
    yield tmp_path, daemon, config_module.load(config).entities[0]
    daemon.kill()


def _workers(table: Path) -> set[int]:
    """The pids of the processes that read and wrote the rows of every batch the table holds."""
    pids = set()
    for commit in map(commit_metadata, DeltaTable(str(table)).history()):  # either writer's
        if "lakefeed.workers" in commit:
            pids |= {int(w.rsplit(":", 1)[1]) for w in json.loads(commit["lakefeed.workers"])}
    return pids


def _ancestors(pid: int) -> list[str]:
    """The command lines of a process and of every process above it."""
    lines = []
    while pid > 1:
        lines.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    return lines


class Lineages:
    """Watches the processes of the machine from the test's start, noting the ancestors' command lines of each as it
    appears. A task's Python worker is gone a minute after its last task (Spark's idle-worker timeout), and an
    executor's workers die with it: where a worker ran is read here, not from /proc once the batches are done."""

    def __init__(self, every_s: float = 0.1) -> None:
        self._seen: dict[int, list[list[str]]] = {}  # pid -> the lineage of each process seen with it
        self._every_s = every_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="lineages", daemon=True)

    def _watch(self) -> None:
        alive: set[int] = set()
        while True:
            now = {int(entry.name) for entry in os.scandir("/proc") if entry.name.isdigit()}
            for pid in now - alive:  # new since the last look (a pid used again after a gap counts as new)
                try:
                    self._seen.setdefault(pid, []).append(_ancestors(pid))
                except (FileNotFoundError, ProcessLookupError):
                    pass  # gone while read: a process too short-lived to be a task's worker
            alive = now
            if self._done.wait(self._every_s):
                return

    def __enter__(self) -> Lineages:
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._done.set()
        self._thread.join()

    def of(self, pid: int) -> list[list[str]]:
        """The lineages of every process seen with this pid."""
        return list(self._seen.get(pid, ()))

    def under_executor(self, pid: int) -> list[str] | None:
        """The lineage of the process seen with this pid under an executor, if one was."""
        return next((lineage for lineage in self.of(pid)
                     if any("CoarseGrainedExecutorBackend" in line for line in lineage)), None)


@pytest.fixture
def lineages():
    with Lineages() as watch:
        yield watch


def _worked_in_executors(lineages: Lineages, daemon: Daemon, entities) -> None:
    """Every batch of the entities' tables (this life's and a killed life's) was read and written in processes
    under an executor, not the driver."""
    for cfg in entities:
        workers = _workers(cfg.changelog) | _workers(cfg.table)
        assert workers and daemon.proc.pid not in workers
        for pid in workers:
            assert lineages.under_executor(pid), (pid, lineages.of(pid))


def _files_on_disk(table: Path) -> set[str]:
    return {p.relative_to(table).as_posix() for p in table.rglob("*.parquet")}


def _files_held(table: Path) -> set[str]:
    root = DeltaTable(str(table))
    return {uri.removeprefix(f"file://{table}/").removeprefix(f"{table}/") for uri in root.file_uris()}


def _expect_exactly(cfg, files: int) -> None:
    total = files * ROWS_PER_FILE
    rows = DeltaTable(str(cfg.table)).to_pyarrow_table()
    assert sorted(rows["id"].to_pylist()) == list(range(total))  # every row once
    changelog = DeltaTable(str(cfg.changelog)).to_pyarrow_table()
    assert sorted(changelog["offset"].to_pylist()) == list(range(total))  # dense, never reused
    assert verify(cfg) == []  # the changelog replays to the table, the ODF chain checks
    for table in (cfg.table, cfg.changelog):  # nothing a failed attempt wrote is left beside the table
        assert _files_on_disk(Path(table)) == _files_held(Path(table))


def test_a_standalone_cluster_master_and_worker_do_the_work(tmp_path, spark_standalone, lineages):  # noqa: F811
    """`spark.master: spark://…`, a master and a worker started as a user starts them: the worker's two executors
    read and write the rows of file batches (the driver reads paths and metadata only). The other tests here use
    local-cluster, which runs the same executors without the separate master and worker."""
    entity = entity_yaml(source={"type": "local_dir", "path": "landing", "reconcile_interval_s": 2,
                                 "max_files_per_trigger": 8})
    spark = {"master": spark_standalone.url, "trigger_interval_s": 0.2,
             "conf": {"spark.executor.cores": "1", "spark.executor.memory": "512m"}}
    config = write_config(tmp_path, [entity], spark=spark)
    with Daemon(config, tmp_path / "daemon.log") as daemon:
        _files_are_worked_by_two_executors(tmp_path, daemon, config_module.load(config).entities[0], lineages)


def _read_bytes(pid: int) -> int:
    """Bytes the process has read so far (files, pipes and sockets: /proc/<pid>/io rchar)."""
    return next(int(line.split()[1]) for line in Path(f"/proc/{pid}/io").read_text().splitlines()
                if line.startswith("rchar:"))


def _files_are_worked_by_two_executors(tmp_path: Path, daemon: Daemon, cfg, lineages: Lineages) -> None:
    daemon.start()
    rows_per_file = 20_000
    pad = "p" * 64
    # Each file ends with a bad row (a field too many): the tasks write the quarantine's files too.
    texts = ["id,file,pad\n" + "".join(f"{i},{n},{pad}\n" for i in range(n * rows_per_file, (n + 1) * rows_per_file))
             + f"{n},{n},{pad},extra\n" for n in range(16)]
    landed = sum(len(text) for text in texts)
    read_before = _read_bytes(daemon.proc.pid)
    for n, text in enumerate(texts):
        land(tmp_path / "landing" / "sales" / f"f{n:03d}.csv", text)
    wait_for(lambda: _table_rows(cfg.table) == 16 * rows_per_file, 180, 0.3, "every row")
    # The driver (this daemon's own process) read paths and metadata, not the rows: far less than was landed.
    driver_read = _read_bytes(daemon.proc.pid) - read_before
    assert driver_read < landed / 10, (driver_read, landed)
    wait_for(lambda: _table_rows(cfg.quarantine) == 16, 30, 0.3, "every bad row")
    workers = _workers(cfg.table) | _workers(cfg.changelog) | _workers(cfg.quarantine)
    assert daemon.proc.pid not in workers and _workers(cfg.quarantine)
    # Each is a Python worker of one of the two executor JVMs.
    executors = set()
    for pid in workers:
        above = lineages.under_executor(pid)
        assert above, f"pid {pid} is not under an executor: {lineages.of(pid)}"
        assert "pyspark.daemon" in above[0] or "pyspark.daemon" in above[1], above[:2]
        backend = [line for line in above if "CoarseGrainedExecutorBackend" in line]
        executors.add(backend[0])
    assert len(executors) == 2  # the work was spread over both executors
    daemon.stop()
    changelog = DeltaTable(str(cfg.changelog)).to_pyarrow_table()
    assert sorted(changelog["offset"].to_pylist()) == list(range(16 * rows_per_file))
    assert sorted(changelog["id"].to_pylist()) == list(range(16 * rows_per_file))
    assert verify(cfg) == []
    quarantine = DeltaTable(str(cfg.quarantine)).to_pyarrow_table()
    assert sorted(quarantine["source_file"].to_pylist()) == [f"sales/f{n:03d}.csv" for n in range(16)]
    assert _files_on_disk(Path(cfg.quarantine)) == _files_held(Path(cfg.quarantine))


def test_sigkill_of_the_daemon_mid_batch_on_a_cluster_loses_and_doubles_nothing(cluster):
    tmp_path, daemon, cfg = cluster
    landing = tmp_path / "landing" / "sales"
    daemon.start(env={"LAKEFEED_FAILPOINT": "commit.changelog"})  # the changelog committed, the table not
    for n in range(6):
        land(landing / f"f{n:03d}.csv", _csv(n))
    assert daemon.wait(120) == -signal.SIGKILL, "the failpoint commit.changelog was not reached"
    daemon.start()
    for n in range(6, 10):
        land(landing / f"f{n:03d}.csv", _csv(n))
    wait_for(lambda: _table_rows(cfg.table) == 10 * ROWS_PER_FILE, 180, 0.3, "every row")
    daemon.stop()
    _expect_exactly(cfg, 10)


@pytest.mark.parametrize("cluster", ["delta-spark"], indirect=True)  # the daemon's SIGKILL above is on delta-rs
def test_an_executor_killed_mid_batch_loses_and_doubles_nothing(cluster):
    """The first write task to finish its files kills its executor's JVM: Spark runs the task again on an
    executor that lives, the batch commits once (through delta-spark's transaction), and the dead attempt's
    files are removed."""
    tmp_path, daemon, cfg = cluster
    once = tmp_path / "executor-killed"
    daemon.start(env={"LAKEFEED_FAILPOINT": "executor:task.written", "LAKEFEED_FAILPOINT_ONCE": str(once)})
    for n in range(8):
        land(tmp_path / "landing" / "sales" / f"f{n:03d}.csv", _csv(n))
    wait_for(lambda: _table_rows(cfg.table) == 8 * ROWS_PER_FILE, 240, 0.3, "every row")
    assert once.exists(), "no executor was killed"
    # After the commits (the rows are visible first): the dead attempt's files go.
    wait_for(lambda: daemon.events("files.orphans_removed") >= 1, 60, 0.2, "the dead attempt's files removed")
    assert daemon.proc.poll() is None
    daemon.stop()
    _expect_exactly(cfg, 8)
    assert writers_of(cfg.table) == {"delta-spark"}


def _reducers(table: Path) -> set[int]:
    """The pids of the processes that reduced the keyed batches the table holds."""
    return {int(w.rsplit(":", 1)[1]) for commit in map(commit_metadata, DeltaTable(str(table)).history())
            for w in json.loads(commit.get("lakefeed.reducers", "[]"))}


def test_a_keyed_batch_is_reduced_in_executor_tasks_and_an_executor_killed_mid_reduction_loses_nothing(tmp_path,
                                                                                                      lineages):
    """An upsert entity (sequence_by) on local-cluster, 8 files of 20k changes to 500 keys: the reduction to one
    change per key runs in executor Python workers (each commit's `lakefeed.reducers`) and the driver reads far less
    than was landed. The first reduction task to finish kills its executor's JVM: Spark runs it again, and every
    key ends at its last change, the changelog's offsets dense, `verify` passing."""
    entity = entity_yaml(source={"type": "local_dir", "path": "landing", "reconcile_interval_s": 2,
                                 "max_files_per_trigger": 8},
                         cdc={"strategy": "upsert", "primary_key": ["key"], "sequence_by": ["seq"]})
    config = write_config(tmp_path, [entity], spark={"master": CLUSTER, "trigger_interval_s": 0.2})
    cfg = config_module.load(config).entities[0]
    once = tmp_path / "executor-killed"
    files, rows_per_file, keys, pad = 8, 20_000, 500, "p" * 48
    texts = ["key,seq,file,pad\n" + "".join(f"{i % keys},{i},{n},{pad}\n"
                                            for i in range(n * rows_per_file, (n + 1) * rows_per_file))
             for n in range(files)]
    last = {k: files * rows_per_file - keys + k for k in range(keys)}  # each key's highest sequence
    with Daemon(config, tmp_path / "daemon.log") as daemon:
        daemon.start(env={"LAKEFEED_FAILPOINT": "executor:task.reduced", "LAKEFEED_FAILPOINT_ONCE": str(once)})
        read_before = _read_bytes(daemon.proc.pid)
        for n, text in enumerate(texts):
            land(tmp_path / "landing" / "sales" / f"f{n:03d}.csv", text)

        def state() -> dict[int, int]:
            try:
                rows = DeltaTable(str(cfg.table)).to_pyarrow_table(columns=["key", "seq"]).to_pylist()
            except Exception:  # noqa: BLE001 - no table yet
                return {}
            return {r["key"]: r["seq"] for r in rows}

        wait_for(lambda: state() == last, 240, 0.5, "every key at its last change")
        driver_read = _read_bytes(daemon.proc.pid) - read_before
        assert once.exists(), "no executor was killed"
        assert driver_read < sum(map(len, texts)) / 10, driver_read
        reducers = _reducers(Path(cfg.table))
        assert reducers and daemon.proc.pid not in reducers
        for pid in reducers:
            assert lineages.under_executor(pid), (pid, lineages.of(pid))
        daemon.stop()
    changelog = DeltaTable(str(cfg.changelog)).to_pyarrow_table()
    assert sorted(changelog["offset"].to_pylist()) == list(range(changelog.num_rows))
    assert verify(cfg) == []


def test_a_stop_cancels_a_batch_stuck_in_its_tasks_and_the_restart_commits_it_once(tmp_path):
    """A write task hangs (after writing its files): SIGTERM waits `shutdown_timeout_s` for the batch, then the stop
    cancels its Spark jobs; the daemon exits 0 well before the forced exit, nothing is committed or parked, and the
    next start commits the batch once and removes the cancelled attempt's files."""
    entity = entity_yaml(source={"type": "local_dir", "path": "landing", "reconcile_interval_s": 2})
    config = write_config(tmp_path, [entity], spark={"master": CLUSTER, "trigger_interval_s": 0.2},
                          shutdown_timeout_s=3)
    cfg = config_module.load(config).entities[0]
    with Daemon(config, tmp_path / "daemon.log") as daemon:
        daemon.start(env={"LAKEFEED_FAILPOINT": "hang:task.written"})
        for n in range(4):
            land(tmp_path / "landing" / "sales" / f"f{n:03d}.csv", _csv(n))
        wait_for(lambda: any(p.suffix == ".parquet" for p in Path(cfg.table).rglob("*")), 120, 0.2,
                 "a write task's files")
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(3 + 20 - 1) == 0  # before the forced exit (`stop_grace_s`, 20 s)
        assert daemon.events("daemon.stop_forced") == 0 and daemon.events("batch.committed") == 0
        assert daemon.events("batch.parked") == 0 and _table_rows(cfg.table) == 0
        assert daemon.events("batch.abandoned") == 1
        daemon.start()
        wait_for(lambda: _table_rows(cfg.table) == 4 * ROWS_PER_FILE, 180, 0.3, "every row")
        daemon.stop()
        _expect_exactly(cfg, 4)


def _sql_tasks(event_log: Path) -> dict[str, set[str]]:
    """From Spark's event log: the executors that ran the tasks of each SQL execution, by its description."""
    executions, jobs, where = {}, {}, {}
    for path in (p for p in event_log.iterdir() if p.is_file() and not p.name.startswith(".")):
        for line in path.read_text(errors="replace").splitlines():
            event = json.loads(line)
            kind = event["Event"]
            if kind.endswith("SparkListenerSQLExecutionStart"):
                executions[event["executionId"]] = event.get("description", "")
            elif kind == "SparkListenerJobStart":
                execution = event.get("Properties", {}).get("spark.sql.execution.id")
                for stage in event["Stage IDs"]:
                    jobs[stage] = int(execution) if execution is not None else None
            elif kind == "SparkListenerTaskEnd":
                described = executions.get(jobs.get(event["Stage ID"]), "")
                where.setdefault(described, set()).add(event["Task Info"]["Executor ID"])
    return where


def test_pushes_are_decoded_and_written_in_executor_processes_append_and_keyed(tmp_path, lineages):
    """Push frames of an append entity and of an upsert entity written by delta-spark: executor Python workers
    decode them (both) and write the tables' files (append); delta-spark's MERGE runs in executor tasks. The first
    life is killed (SIGKILL) between the keyed entity's table commit and its changelog's; after the restart every
    acknowledged record is there once, offsets dense, `verify` passes."""
    from tests.test_operations import TOKEN, Client, _push_entity

    upserts = {**_push_entity("accounts"), "cdc": {"strategy": "upsert", "primary_key": ["id"]},
               "writer": "delta-spark"}
    events_log = tmp_path / "spark-events"
    events_log.mkdir()
    config = write_config(tmp_path, [_push_entity("events"), upserts],
                          spark={"master": CLUSTER, "trigger_interval_s": 0.2,
                                 "conf": {"spark.eventLog.enabled": "true", "spark.eventLog.dir": str(events_log),
                                          "spark.eventLog.compress": "false",
                                          "spark.eventLog.rolling.enabled": "false"}})
    assert TOKEN
    lake = config_module.load(config)
    events, accounts = lake.entities
    with Daemon(config, tmp_path / "daemon.log") as daemon:
        daemon.start(env={"LAKEFEED_FAILPOINT": "commit.table"})  # only the keyed entity's commit passes there
        assert Client(tmp_path / "state").push([{"id": 0, "v": "first life"}], "accounts")[0] == 202
        assert daemon.wait(120) == -signal.SIGKILL, "the failpoint commit.table was not reached"
        daemon.start()
        client = Client(tmp_path / "state")
        for n in range(30):
            assert client.push([{"id": n * 10 + i, "v": f"r{n}"} for i in range(10)], "events")[0] == 202
            assert client.push([{"id": n % 7, "v": f"r{n}"}], "accounts")[0] == 202
        wait_for(lambda: _table_rows(events.table) == 300, 180, 0.3, "every pushed event")
        wait_for(lambda: _table_rows(accounts.table) == 7  # its first commit may come after the events' last
                 and sorted(DeltaTable(str(accounts.table)).to_pyarrow_table()["v"].to_pylist())
                 == sorted(f"r{n}" for n in range(23, 30)), 180, 0.3, "the last value of each account")
        # The changelog's commit follows the table's: the batch is whole once the changelog replays to the table.
        wait_for(lambda: _table_rows(accounts.changelog) and verify(accounts) == [], 60, 0.5, "the changelog")
        _worked_in_executors(lineages, daemon, (events, accounts))
        # delta-spark's first MERGE and append, done before a batch needs them, and tidied (a killed life's too)
        wait_for(lambda: daemon.events("writer.warmed") >= 1, 120, 0.3, "delta-spark warmed up")
        daemon.stop()
        assert not (tmp_path / "state" / "warm-up-delta-spark").exists()
        assert writers_of(accounts.table) == {"delta-spark"}
        tasks = _sql_tasks(events_log)
        merges = {e for d, on in tasks.items() if "merge" in d.lower() for e in on}
        assert merges and "driver" not in merges, tasks
        rows = DeltaTable(str(events.table)).to_pyarrow_table()
        assert sorted(rows["id"].to_pylist()) == list(range(300))
        changelog = DeltaTable(str(events.changelog)).to_pyarrow_table()
        assert sorted(changelog["offset"].to_pylist()) == list(range(300))
        assert verify(events) == [] and verify(accounts) == []


def test_kafka_messages_are_decoded_and_written_in_executor_processes(tmp_path, kafka_broker,  # noqa: F811
                                                                       lineages):
    """A topic of 3 partitions into an append entity and an upsert entity: the messages are decoded where Spark's
    tasks read them and no row comes to the driver. The first life is killed (SIGKILL) between the upsert entity's
    table commit and its changelog's; after the restart every message is there once, `verify` passes."""
    kafka_broker.create_topic("clicks", 3)
    clicks = {"name": "clicks", "kafka": [{"name": "topic", "bootstrap_servers": kafka_broker.bootstrap,
                                           "topics": ["clicks"], "max_offsets_per_trigger": 200}]}
    users = {"name": "users", "cdc": {"strategy": "upsert", "primary_key": ["id"]},
             "kafka": [{"name": "topic", "bootstrap_servers": kafka_broker.bootstrap, "topics": ["clicks"]}]}
    config = write_config(tmp_path, [clicks, users], spark={"master": CLUSTER, "trigger_interval_s": 0.2})
    lake = config_module.load(config)
    with Daemon(config, tmp_path / "daemon.log") as daemon:
        daemon.start(env={"LAKEFEED_FAILPOINT": "commit.table"})  # only the keyed entity's commit passes there
        kafka_broker.produce("clicks", [{"id": i % 50, "n": i} for i in range(600)])
        assert daemon.wait(120) == -signal.SIGKILL, "the failpoint commit.table was not reached"
        daemon.start()
        wait_for(lambda: _table_rows(lake.entity("clicks").table) == 600, 180, 0.3, "every message")
        wait_for(lambda: _table_rows(lake.entity("users").table) == 50, 180, 0.3, "every user")
        _worked_in_executors(lineages, daemon, lake.entities)
        daemon.stop()
    rows = DeltaTable(str(lake.entity("clicks").table)).to_pyarrow_table()
    assert sorted(rows["n"].to_pylist()) == list(range(600))
    changelog = DeltaTable(str(lake.entity("clicks").changelog)).to_pyarrow_table()
    assert sorted(changelog["offset"].to_pylist()) == list(range(600))
    users = DeltaTable(str(lake.entity("users").table)).to_pyarrow_table().to_pylist()
    assert sorted(u["id"] for u in users) == list(range(50)) and all(u["n"] % 50 == u["id"] for u in users)
    assert verify(lake.entity("clicks")) == [] and verify(lake.entity("users")) == []
