"""Operating a real daemon: health, metrics, status (CLI and page in headless Chromium), reload, watchdog,
startup failures and backfill. Real processes, real signals, real HTTP, a real NOTIFY_SOCKET."""

from __future__ import annotations

import http.client
import json
import os
import pty
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from deltalake import DeltaTable

from lakefeed.intake.push_api import token_hash
from tests.conftest import entity_yaml, land, wait_for, write_config, writers_of
from tests.test_daemon_process import Daemon

TOKEN = "t-ops"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _push_entity(name: str = "events", **push: object) -> dict:
    return {"name": name, "push": [{"name": "api", "tokens_sha256": [token_hash(TOKEN)], **push}]}


class Client:
    def __init__(self, state: Path) -> None:
        url = json.loads((state / "http.json").read_text())["url"]
        self.host, port = url.removeprefix("http://").split(":")
        self.port = int(port)
        self.url = url

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict | None = None) -> tuple[int, bytes, dict]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        return resp.status, data, dict(resp.getheaders())

    def get_json(self, path: str) -> tuple[int, dict]:
        status, data, _ = self.request("GET", path)
        return status, json.loads(data)

    def push(self, rows: list[dict], entity: str = "events", source: str = "api") -> tuple[int, dict]:
        status, data, _ = self.request("POST", f"/v1/entities/{entity}/sources/{source}/records",
                                       json.dumps(rows).encode(),
                                       {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
        return status, json.loads(data)


def _log_time(record: dict) -> float:
    """A log record's time (structlog's ISO 8601, UTC) in seconds since the epoch, as time.time() gives."""
    return datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00")).timestamp()


def _ids(table: Path) -> list[int]:
    try:
        return DeltaTable(str(table)).to_pyarrow_table().column("id").to_pylist()
    except Exception:
        return []


def _notify_socket(tmp_path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify.sock"))
    sock.settimeout(0.2)
    return sock


class Notifications:
    """Every sd_notify datagram the daemon sends, with the time it arrived."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.messages = sock, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.messages.append((time.monotonic(), self.sock.recv(4096).decode()))
            except TimeoutError:
                continue

    def with_field(self, field: str) -> list[tuple[float, str]]:
        return [(t, m) for t, m in list(self.messages) if any(line.startswith(field) for line in m.splitlines())]

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def daemons():
    started: list[Daemon] = []
    yield started
    for daemon in started:
        daemon.kill()


def test_health_metrics_status_cli_and_the_status_page(tmp_path, daemons):
    events = _push_entity()
    events["push"].append({"name": "bulk", "tokens_sha256": [token_hash(TOKEN)]})  # a second source of one entity
    config = write_config(tmp_path, [entity_yaml(), events], status_sample_s=1.0)
    daemon = Daemon(config, tmp_path / "daemon.log")
    daemons.append(daemon)
    daemon.start()
    client = Client(tmp_path / "state")
    assert client.get_json("/healthz") == (200, {"status": "alive"})
    assert client.get_json("/readyz")[0] == 200
    land(tmp_path / "landing" / "sales" / "a.csv", "id,amount\n1,2.5\n2,3.5\n3\n")  # row 4: too few columns
    assert client.push([{"id": i, "v": "x"} for i in range(3)])[0] == 202
    assert client.push([{"id": i, "v": "x"} for i in range(3, 5)])[0] == 202
    assert client.push([{"id": i, "v": "y"} for i in range(5, 8)], source="bulk")[0] == 202
    wait_for(lambda: {n: e["rows"] for n, e in client.get_json("/status")[1]["entities"].items()}
             == {"sales": 2, "events": 8}, 60, 0.3, "rows in /status")
    status, doc = client.get_json("/status")
    sales, events = doc["entities"]["sales"], doc["entities"]["events"]
    assert (sales["files"], sales["quarantined"], sales["error"]) == (1, 1, None)  # the entity's totals
    assert sales["streams"]["files"]["running"] and events["streams"]["api"]["backlog"] == 0
    # Each source's own figures (a push source's "files" are its requests): two sources of one entity differ,
    # and add up to the entity's totals.
    figures = {s: (f["rows"], f["files"], f["quarantined"], f["batches"] > 0) for s, f in events["streams"].items()}
    assert figures == {"api": (5, 2, 0, True), "bulk": (3, 1, 0, True)}
    assert sum(f["batches"] for f in events["streams"].values()) == events["batches"]
    files = sales["streams"]["files"]
    assert (files["rows"], files["files"], files["quarantined"], files["batches"]) == (2, 1, 1, sales["batches"])
    assert all(f["last_commit"] and f["freshness_s"] >= 0 for f in events["streams"].values())

    _, text, headers = client.request("GET", "/metrics")
    assert headers["Content-Type"].startswith("text/plain")
    expected = ('lakefeed_rows_total{entity="sales"} 2.0', 'lakefeed_rows_total{entity="events"} 8.0',
                'lakefeed_quarantined_rows_total{entity="sales"} 1.0', 'lakefeed_files_total{entity="sales"} 1.0',
                'lakefeed_backlog{entity="events",stream="api"} 0.0',  # gauges are sampled 4 times a second
                'lakefeed_stream_running{entity="sales",stream="files"} 1.0')

    def scrape() -> str | None:
        text = client.request("GET", "/metrics")[1].decode()
        return text if all(line in text for line in expected) else None

    metrics = wait_for(scrape, 10, 0.2, "the metrics")
    assert 'lakefeed_batch_duration_seconds_count{entity="sales",stream="files"}' in metrics
    # Where a batch's time goes, stage by stage: each file and push batch that committed went through every stage.
    for stream, stages in (("files", ("collect", "discover", "tasks", "commit", "compaction", "manifests")),
                           ("api", ("collect", "tasks", "commit", "compaction", "manifests"))):
        entity = "sales" if stream == "files" else "events"
        for stage in stages:
            assert f'lakefeed_batch_stage_seconds_count{{entity="{entity}",stage="{stage}",stream="{stream}"}}' \
                in metrics, (stream, stage)
    assert 'lakefeed_seconds_since_last_commit{entity="events"}' in metrics

    cli = subprocess.run([sys.executable, "-m", "lakefeed", "status", "--config", str(config)],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    lines = cli.stdout.splitlines()
    assert lines[0].startswith("lakefeed pid") and "2 entities running" in lines[0]
    assert lines[1].split() == ["entity", "source", "state", "backlog", "rows", "files", "quarantined", "batches",
                                "freshness_s", "watermark"]
    rows = {tuple(line.split()[:2]): line.split()[2:7] for line in lines[2:]}
    assert rows[("sales", "files")] == ["running", "0", "2", "1", "1"]  # rows, files, quarantined of the source
    assert rows[("events", "api")] == ["running", "0", "5", "2", "0"]
    assert rows[("events", "bulk")] == ["running", "0", "3", "1", "0"]  # not the entity's 8 rows and 3 files again
    shown = subprocess.run([sys.executable, "-m", "lakefeed", "manifest", "show", "--config", str(config),
                            "--entity", "sales"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "sales/a.csv" in shown.stdout and "1 partitions" in shown.stdout

    wait_for(lambda: all(sum(h["watermark"] is not None for h in e["history"]) >= 2
                         for e in client.get_json("/status")[1]["entities"].values()),
             30, 0.2, "two history samples per entity since the first commit")
    profile = tmp_path / "chromium-profile"
    dom = subprocess.run(["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom",
                          f"{client.url}/"], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert '<tr data-entity="sales">' in dom.stdout and '<tr data-entity="events">' in dom.stdout
    assert '<td class="rows">2</td>' in dom.stdout and '<td class="rows">8</td>' in dom.stdout
    assert dom.stdout.count("<polyline") == 8  # four charts per entity, drawn from the last hour's samples
    shot = tmp_path / "status.png"
    subprocess.run(["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={shot}",
                    "--window-size=1200,900", f"{client.url}/"], capture_output=True, timeout=120, check=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5000

    daemon.stop()
    assert not (tmp_path / "state" / "http.json").exists()


def _write_atomically(path: Path, doc: dict) -> None:
    tmp = path.with_name(".lakefeed.yaml.tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    os.replace(tmp, path)


def test_reload_adds_changes_removes_and_rejects_without_losing_records(tmp_path, daemons):
    events = _push_entity()
    events["push"].append({"name": "bulk", "tokens_sha256": [token_hash(TOKEN)]})
    config = write_config(tmp_path, [events, entity_yaml()])
    doc = yaml.safe_load(config.read_text())
    daemon = Daemon(config, tmp_path / "daemon.log")
    daemons.append(daemon)
    notes = Notifications(_notify_socket(tmp_path))
    daemon.start(env={"NOTIFY_SOCKET": str(tmp_path / "notify.sock")})
    client = Client(tmp_path / "state")
    acked: list[int] = []
    stop = threading.Event()
    unavailable = []

    def produce() -> None:
        n = 0
        while not stop.is_set():
            rows = [{"id": n * 10 + i, "v": "x"} for i in range(10)]
            status, answer = client.push(rows)
            if status == 202:
                acked.extend(r["id"] for r in rows)
                n += 1
            else:
                assert status == 503, answer  # reconfiguring: retry after a moment
                unavailable.append(answer)
                time.sleep(0.05)

    producer = threading.Thread(target=produce)
    producer.start()
    landed = 0

    def land_some(k: int) -> None:
        nonlocal landed
        for _ in range(k):
            land(tmp_path / "landing" / "sales" / f"f{landed:03d}.csv", f"id\n{landed}\n")
            landed += 1

    def run_ids() -> dict[str, str]:
        entities = client.get_json("/status")[1]["entities"]
        return {f"{n}/{s}": v["run_id"] for n, e in entities.items() for s, v in e["streams"].items()}

    def reloads() -> int:
        return daemon.events("reload.applied")

    land_some(3)
    before = run_ids()
    # 1. add an entity, written in place: the file watch notices
    doc["entities"].append(_push_entity("extra"))
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    wait_for(lambda: reloads() == 1, 60, 0.2, "first reload")
    after = run_ids()
    assert set(after) == {"events/api", "events/bulk", "sales/files", "extra/api"}
    assert {k: after[k] for k in before} == before
    land_some(3)
    # 2. change one source of an entity and another entity's file source; the file replaced by a rename. /readyz,
    # asked all along, answers; and never ready while sales is between its stop and its start again.
    readiness: list[tuple[float, float, int]] = []
    watching = threading.Event()

    def ask_ready() -> None:
        while not watching.is_set():
            asked = time.time()
            status = client.request("GET", "/readyz")[0]
            readiness.append((asked, time.time(), status))

    asker = threading.Thread(target=ask_ready)
    asker.start()
    doc["entities"][0]["push"][1]["rate_limit_per_s"] = 10000.0
    doc["entities"][1]["source"]["max_files_per_trigger"] = 2
    _write_atomically(config, doc)
    wait_for(lambda: reloads() == 2, 60, 0.2, "second reload")
    watching.set()
    asker.join()
    stopping, started = (_log_time([r for r in daemon.records(e) if r["entity"] == "sales"][-1])
                         for e in ("entity.stopping", "entity.started"))
    assert {status for _, _, status in readiness} <= {200, 503}, readiness  # a 500: it read what the reload changed
    # From its stop until its new query runs, sales is not ready; then it is (entity.started is logged after that).
    during = [status for asked, answered, status in readiness if stopping < asked < answered < started]
    assert during[:1] in ([], [503]) and during == sorted(during, reverse=True), during
    changed = run_ids()
    assert changed["extra/api"] == after["extra/api"] and changed["events/api"] == after["events/api"]
    assert changed["events/bulk"] != after["events/bulk"] and changed["sales/files"] != after["sales/files"]
    land_some(3)
    # 3. an invalid config is rejected whole; the old one keeps running
    config.write_text(config.read_text().replace("name: extra", "name: 9extra"))
    wait_for(lambda: daemon.events("reload.rejected") == 1, 60, 0.2, "rejected reload")
    status = client.get_json("/status")[1]
    line = next(n for n, text in enumerate(config.read_text().splitlines(), 1) if "name: 9extra" in text)
    assert f"{config}:{line}: entities.2.name: String should match pattern" in \
        "\n".join(status["daemon"]["config_problems"])
    assert run_ids() == changed
    wait_for(lambda: any("config reload rejected" in m for _, m in notes.with_field("STATUS=")), 30, 0.2,
             "STATUS= reporting the rejected config")
    wait_for(lambda: 'lakefeed_stream_running{entity="extra",stream="api"}' in
             client.request("GET", "/metrics")[1].decode(), 30, 0.2, "the extra entity's series")
    # 4. remove an entity and change the Spark master: the removal applies, the master needs a restart; so does
    # the delta-spark writer (the session loads its jars at start): until then delta-rs goes on writing sales
    del doc["entities"][2]
    doc["spark"]["master"] = "local[1]"
    doc["entities"][1]["writer"] = "delta-spark"
    _write_atomically(config, doc)
    wait_for(lambda: reloads() == 3, 60, 0.2, "third reload")
    status = client.get_json("/status")[1]
    assert set(status["entities"]) == {"events", "sales"}
    assert status["daemon"]["needs_restart"] == ["spark", "entities.sales.writer"]
    assert run_ids()["sales/files"] == changed["sales/files"]  # not restarted: nothing it can apply changed
    assert status["daemon"]["config_problems"] == []
    assert client.push([{"id": 1}], entity="extra")[0] == 404  # removed: no longer paused for a restart
    metrics = client.request("GET", "/metrics")[1].decode()
    assert 'entity="extra"' not in metrics and 'lakefeed_stream_running{entity="events",stream="api"}' in metrics
    # 5. SIGHUP reloads too (nothing changed: nothing restarts)
    daemon.signal(signal.SIGHUP)
    wait_for(lambda: reloads() == 4, 60, 0.2, "reload on SIGHUP")
    assert run_ids() == {k: v for k, v in changed.items() if k != "extra/api"}
    land_some(3)
    time.sleep(0.5)  # a last stretch of pushes after the reloads
    stop.set()
    producer.join()
    wait_for(lambda: set(acked) <= set(_ids(tmp_path / "lake" / "events" / "table")), 60, 0.3, "every push")
    wait_for(lambda: len(_ids(tmp_path / "lake" / "sales" / "table")) == landed, 60, 0.3, "every file")
    daemon.stop()
    events = _ids(tmp_path / "lake" / "events" / "table")
    assert len(events) == len(set(events)) and set(acked) <= set(events)
    assert sorted(_ids(tmp_path / "lake" / "sales" / "table")) == list(range(landed))
    assert writers_of(tmp_path / "lake" / "sales" / "table") == {"delta-rs"}
    reloading = notes.with_field("RELOADING=1")
    assert len(reloading) == 4 and all("MONOTONIC_USEC=" in m for _, m in reloading)
    readies = [t for t, _ in notes.with_field("READY=1")]
    assert all(any(r > t for r in readies) for t, _ in reloading)  # READY=1 after each reload
    notes.close()


def test_watchdog_pings_stop_when_a_query_is_stuck_and_a_second_signal_forces_exit(tmp_path, daemons):
    config = write_config(tmp_path, [entity_yaml(), _push_entity()], stall_timeout_s=3)
    daemon = Daemon(config, tmp_path / "daemon.log")
    daemons.append(daemon)
    notes = Notifications(_notify_socket(tmp_path))
    daemon.start(env={"NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": "1000000",
                      "LAKEFEED_FAILPOINT": "hang:batch.discovered"})
    wait_for(lambda: len(notes.with_field("WATCHDOG=1")) >= 3, 30, 0.1, "watchdog pings while idle")
    land(tmp_path / "landing" / "sales" / "a.csv", "id\n1\n")  # this batch hangs
    wait_for(lambda: daemon.events("failpoint.hanging") == 1, 60, 0.1, "the batch to hang")
    time.sleep(4)  # the stall timeout (3 s) passes with work waiting
    quiet_from = time.monotonic()
    time.sleep(2.5)
    assert not [t for t, _ in notes.with_field("WATCHDOG=1") if t > quiet_from], "pings went on while stuck"
    client = Client(tmp_path / "state")
    assert client.push([{"id": 1}])[0] == 202
    daemon.signal(signal.SIGTERM)  # waits for the stuck batch (up to the shutdown timeout) …
    wait_for(lambda: daemon.events("daemon.stopping") == 1, 30, 0.1, "stopping")
    status, answer = client.push([{"id": 2}])
    assert status == 503 and "stopping" in answer["error"]  # intake is closed while batches finish
    assert client.get_json("/healthz")[0] == 200
    daemon.signal(signal.SIGTERM)  # … a second signal does not wait
    assert daemon.wait(30) == 128 + signal.SIGTERM
    notes.close()


def test_sigterm_gives_up_a_hostile_file_batch_when_the_shutdown_timeout_is_up_and_loses_nothing(tmp_path, daemons):
    """Names that take a catastrophic pattern its whole time limit (1 s each) make a batch of minutes: a SIGTERM
    gives it up between files once `shutdown_timeout_s` is up, the daemon exits 0, the batch is replayed."""
    evil = entity_yaml(patterns=[{"name": "evil", "root_location": "sales", "regular_expression": r"/(a|aa)+\.csv"}],
                       source={"type": "local_dir", "path": "landing", "reconcile_interval_s": 1.0,
                               "max_files_per_trigger": 100})
    config = write_config(tmp_path, [evil, _push_entity()], shutdown_timeout_s=3)
    daemon = Daemon(config, tmp_path / "daemon.log")
    daemons.append(daemon)
    daemon.start()
    landing = tmp_path / "landing" / "sales"
    land(landing / "aaaa.csv", "id\n1\n2\n3\n")
    for n in range(12):
        land(landing / ("a" * 60 + f"!{n:02d}.csv"), "id\n99\n")
    wait_for(lambda: daemon.events("file.unmatched") >= 2, 60, 0.1, "the hostile batch to be under way")
    client = Client(tmp_path / "state")
    assert client.push([{"id": 7}])[0] == 202
    stopping = time.monotonic()
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(3 + 20) == 0  # shutdown_timeout_s, and the time to stop the queries and Spark
    log = daemon.log.read_text()
    # The push's own batch may be cut by the same stop (then it too is replayed); the hostile one is, once.
    abandoned = [record["entity"] for record in daemon.records("batch.abandoned")]
    assert abandoned.count("sales") == 1 and daemon.events("daemon.stop_forced") == 0, log[-3000:]
    assert daemon.events("file.unmatched") < 12  # given up part-way
    assert time.monotonic() - stopping < 3 + 20

    daemon.start()  # the batch is replayed whole; the acknowledged push is there once
    wait_for(lambda: sorted(_ids(tmp_path / "lake" / "sales" / "table")) == [1, 2, 3], 120, 0.5, "the replayed batch")
    wait_for(lambda: _ids(tmp_path / "lake" / "events" / "table") == [7], 60, 0.5, "the acknowledged push")
    daemon.stop(60)


def test_a_stop_that_cannot_end_its_batch_exits_by_itself_after_the_grace(tmp_path, daemons):
    """A batch stuck where it cannot be given up (here a hang failpoint): no second signal comes, and the daemon
    exits by itself `stop_grace_s` after the shutdown timeout, before systemd's TimeoutStopSec would SIGKILL it."""
    grace = 5
    config = write_config(tmp_path, [entity_yaml()], shutdown_timeout_s=2, stop_grace_s=grace)
    daemon = Daemon(config, tmp_path / "daemon.log")
    daemons.append(daemon)
    daemon.start(env={"LAKEFEED_FAILPOINT": "hang:batch.discovered"})
    land(tmp_path / "landing" / "sales" / "a.csv", "id\n1\n")
    # At the failpoint, not merely started: a stop cancels a batch's Spark jobs (its read tasks), and that batch
    # then ends by itself.
    wait_for(lambda: daemon.events("failpoint.hanging") == 1, 60, 0.1, "the batch to hang")
    daemon.signal(signal.SIGUSR2)  # every thread's stack on stderr: the stuck one is in the failpoint
    wait_for(lambda: daemon.events("daemon.stacks") == 1, 30, 0.1, "the stacks")
    stacks = [json.loads(line) for line in daemon.log.read_text().splitlines() if '"daemon.stacks"' in line]
    assert any("in reached" in stack and "_process_files" in stack for stack in stacks[0]["threads"].values())
    assert daemon.proc.poll() is None
    stopping = time.monotonic()
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(2 + grace + 30) == 128 + signal.SIGTERM
    assert 2 + grace - 1 < time.monotonic() - stopping < 2 + grace + 30
    assert daemon.events("daemon.stop_forced") == 1
    assert daemon.proc.poll() is not None
    daemon.start()  # the stuck batch is replayed (no failpoint now)
    wait_for(lambda: _ids(tmp_path / "lake" / "sales" / "table") == [1], 60, 0.5, "the replayed batch")
    daemon.stop(60)


def test_a_stop_whose_main_loop_hangs_exits_by_itself_with_the_stacks(tmp_path, daemons):
    """The time limit of a stop runs from the signal, not from the main loop noticing it: a main loop stuck in a
    call (a hang failpoint here) still ends in exit 143 after shutdown_timeout_s + stop_grace_s, and the log
    shows where each thread waited."""
    config = write_config(tmp_path, [entity_yaml()], shutdown_timeout_s=1, stop_grace_s=2)
    daemon = Daemon(config, tmp_path / "daemon.log")
    daemons.append(daemon)
    daemon.start(env={"LAKEFEED_FAILPOINT": "hang:supervisor.tick"})
    wait_for(lambda: daemon.events("failpoint.hanging") == 1, 60, 0.1, "the main loop to hang")
    stopping = time.monotonic()
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(1 + 2 + 30) == 128 + signal.SIGTERM
    assert 1 + 2 - 0.5 < time.monotonic() - stopping
    assert daemon.events("daemon.stop_forced") == 1
    stacks = [json.loads(line) for line in daemon.log.read_text().splitlines() if '"daemon.stacks"' in line]
    assert any("in _serve" in stack and "in reached" in stack for stack in stacks[0]["threads"].values())


def test_compaction_on_demand_needs_the_daemon_s_token_and_the_daemon_goes_on(tmp_path, daemons):
    """`lakefeed compact` has the running daemon compact an entity's tables now (`every: 0`: never by itself). Its
    request carries the token the daemon wrote to state_dir/admin.token, which only the daemon's user reads."""
    other = entity_yaml("other", source={"type": "local_dir", "path": "other"},
                        manifest="other/default.manifest.cdm.json")  # fails at start: its manifest is broken
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "default.manifest.cdm.json").write_text('{"entities": [ oops')
    config = write_config(tmp_path, [entity_yaml(compaction={"every": 0, "vacuum_retain_hours": 0}), other])
    daemon = Daemon(config, tmp_path / "daemon.log")
    daemons.append(daemon)
    daemon.start()
    published = tmp_path / "state" / "admin.token"
    assert published.stat().st_mode & 0o777 == 0o600
    token = published.read_text()
    client = Client(tmp_path / "state")
    table = tmp_path / "lake" / "sales" / "table"
    for n in range(3):  # a batch each: three files in the table
        land(tmp_path / "landing" / "sales" / f"f{n}.csv", f"id\n{n * 10}\n{n * 10 + 1}\n")
        wait_for(lambda n=n: len(_ids(table)) == 2 * (n + 1), 60, 0.2, f"file {n} committed")
    assert len(DeltaTable(str(table)).file_uris()) == 3

    def post(body: bytes, auth: str | None) -> tuple[int, dict]:
        status, data, _ = client.request("POST", "/compact", body, {"Authorization": auth} if auth else {})
        return status, json.loads(data)

    assert post(b"", None)[0] == 401 and post(b"", "Bearer not-the-token")[0] == 401
    assert post(b"", f"Bearer {token}x")[0] == 401
    status, said = post(b'{"entities": "sales"', f"Bearer {token}")
    assert status == 400 and "the body is" in said["error"]
    status, said = post(b'{"entities": ["nope"]}', f"Bearer {token}")
    assert status == 404 and said["error"] == "no entity 'nope'; the daemon runs other, sales"
    status, said = post(b'{"entities": ["other"]}', f"Bearer {token}")
    assert status == 409 and said["error"].startswith("entity 'other' is not running (starting, stopping or failed")
    assert client.get_json("/compact") == (200, {"entities": {}})  # none of those started a run
    assert len(DeltaTable(str(table)).file_uris()) == 3

    # Every entity: the failed one is left out, and said so (exit status 1); the other is compacted.
    cli = subprocess.run([sys.executable, "-m", "lakefeed", "compact", "--config", str(config)],
                         capture_output=True, text=True, timeout=300)
    assert cli.returncode == 1 and "not running, so not compacted: other" in cli.stderr, cli.stderr
    lines = cli.stdout.splitlines()
    assert lines[0].startswith("sales: done (run 1, finished 20")
    assert re.match(r"  table +3 files -> 1, version \d+, ", lines[1]), lines
    assert any(re.match(r"  changelog +3 files -> 1, ", line) for line in lines), lines
    assert len(DeltaTable(str(table)).file_uris()) == 1
    runs = client.get_json("/compact")[1]["entities"]
    assert runs["sales"]["state"] == "done" and runs["sales"]["tables"]["table"]["files_removed"] == 3
    assert "other" not in runs
    named = subprocess.run([sys.executable, "-m", "lakefeed", "compact", "--config", str(config), "--entity",
                            "sales"], capture_output=True, text=True, timeout=300)
    assert named.returncode == 0 and named.stdout.startswith("sales: done (run 2, "), named.stderr
    assert re.search(r"  table +0 files -> 0, ", named.stdout), named.stdout  # nothing left to compact
    unknown = subprocess.run([sys.executable, "-m", "lakefeed", "compact", "--config", str(config), "--entity",
                              "nope"], capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 2 and "no entity 'nope'" in unknown.stderr

    land(tmp_path / "landing" / "sales" / "f3.csv", "id\n30\n31\n")  # the daemon goes on taking files
    wait_for(lambda: len(_ids(table)) == 8, 60, 0.2, "the file after the compaction")
    assert sorted(_ids(table)) == [0, 1, 10, 11, 20, 21, 30, 31]
    verified = subprocess.run([sys.executable, "-m", "lakefeed", "verify", "--config", str(config), "--entity",
                               "sales"], capture_output=True, text=True, timeout=120)
    assert verified.returncode == 0 and verified.stdout.strip() == "sales: ok", verified.stdout
    daemon.stop()
    assert not published.exists()


def test_a_compaction_request_whose_token_is_not_utf8_gets_401():
    """The daemon's own server (an abstract unix socket any local process reaches) is asked directly: header bytes
    that are not UTF-8 are a wrong token, not a server error."""
    import asyncio

    from aiohttp import web

    from lakefeed.ops.compactions import Compactions

    async def ask() -> bytes:
        app = web.Application()
        app.add_routes(Compactions(lambda: {}, "the-token", lambda: False).routes())
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", runner.addresses[0][1])
            writer.write(b"POST /compact HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\r\n"
                         b"Content-Length: 0\r\nConnection: close\r\n\r\n")
            return await asyncio.wait_for(reader.read(), 30)
        finally:
            await runner.cleanup()

    assert asyncio.run(ask()).startswith(b"HTTP/1.1 401 ")


def test_the_reading_commands_say_what_is_wrong_in_one_line(tmp_path):
    """`lakefeed status` asking a port that is not the daemon's, and `lakefeed manifest show` of a manifest edited
    into invalid JSON, exit 1 with a line that says so, not a traceback."""
    import http.server

    class NotLakefeed(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the standard library's name
            body = b"<html>hello</html>" if self.path == "/status" else b'{"daemon": 1}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotLakefeed)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = write_config(tmp_path)
    (tmp_path / "landing").mkdir()
    (tmp_path / "landing" / "default.manifest.cdm.json").write_text("{ oops")
    try:
        status = subprocess.run([sys.executable, "-m", "lakefeed", "status", "--config", str(config), "--url",
                                 f"http://127.0.0.1:{server.server_address[1]}"],
                                capture_output=True, text=True, timeout=60)
    finally:
        server.shutdown()
    assert status.returncode == 1 and "did not answer as a lakefeed daemon does" in status.stderr, status.stderr
    show = subprocess.run([sys.executable, "-m", "lakefeed", "manifest", "show", "--config", str(config)],
                          capture_output=True, text=True, timeout=60)
    assert show.returncode == 1 and "Traceback" not in show.stderr, show.stderr
    assert "sales: manifest" in show.stderr and "is not valid JSON" in show.stderr


def test_a_notify_socket_that_is_gone_is_logged_once_and_the_daemon_goes_on(tmp_path, monkeypatch, capsys):
    """sd_notify(3) ignores a socket it cannot reach; so does lakefeed, saying so once."""
    from lakefeed.ops.notify import notify

    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone.sock"))
    assert notify(READY="1") is False and notify(WATCHDOG="1") is False
    assert capsys.readouterr().err.count("notify.failed") == 1

def test_startup_fails_with_one_clear_line_when_the_port_is_taken(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    config = write_config(tmp_path, [entity_yaml()], http={"host": "127.0.0.1", "port": port})
    proc = subprocess.run([sys.executable, "-m", "lakefeed", "run", "--config", str(config)],
                          capture_output=True, text=True, timeout=120)
    taken.close()
    assert proc.returncode == 2
    assert f"lakefeed: cannot listen on 127.0.0.1:{port}" in proc.stderr.splitlines()[-1]
    no_java = subprocess.run([sys.executable, "-m", "lakefeed", "run", "--config", str(config)], capture_output=True,
                             text=True, timeout=120, env={**os.environ, "JAVA_HOME": str(tmp_path / "no-jdk")})
    assert no_java.returncode == 2
    assert no_java.stderr.splitlines()[-1].startswith("lakefeed: Java 17 or newer is required by Spark")


def test_backfill_processes_everything_pending_and_exits(tmp_path):
    config = write_config(tmp_path, [entity_yaml()])
    for n in range(5):
        land(tmp_path / "landing" / "sales" / f"f{n}.csv", "id\n" + "".join(f"{n * 10 + i}\n" for i in range(10)))
    primary, secondary = pty.openpty()  # on a terminal, backfill draws a progress bar on stderr
    proc = subprocess.Popen([sys.executable, "-m", "lakefeed", "backfill", "--config", str(config)],
                            stdout=subprocess.PIPE, stderr=secondary, text=True)
    os.close(secondary)
    terminal = []

    def read_terminal() -> None:
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # the other end closed
                return
            if not chunk:
                return
            terminal.append(chunk.decode(errors="replace"))

    reader = threading.Thread(target=read_terminal)
    reader.start()
    out, _ = proc.communicate(timeout=300)
    reader.join(30)
    os.close(primary)
    assert proc.returncode == 0, "".join(terminal)[-3000:]
    assert out.splitlines()[-1].startswith("backfill: 5 files, 50 rows in ")
    assert re.search(r"\[#{30}\] 5/5 files  50 rows  ETA", "".join(terminal)), "".join(terminal)[-2000:]
    assert sorted(_ids(tmp_path / "lake" / "sales" / "table")) == list(range(50))
    again = subprocess.run([sys.executable, "-m", "lakefeed", "backfill", "--config", str(config)],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.splitlines()[-1].startswith("backfill: 0 files, 0 rows")
    assert len(_ids(tmp_path / "lake" / "sales" / "table")) == 50


def test_backfill_exits_non_zero_naming_an_entity_that_failed(tmp_path):
    other = entity_yaml("other", source={"type": "local_dir", "path": "other"},
                        manifest="other/default.manifest.cdm.json")
    config = write_config(tmp_path, [entity_yaml(), other])
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "default.manifest.cdm.json").write_text('{"manifestName": "default", "entities": [ oops')
    for n in range(3):
        land(tmp_path / "landing" / "sales" / f"f{n}.csv", f"id\n{n}\n")
    proc = subprocess.run([sys.executable, "-m", "lakefeed", "backfill", "--config", str(config)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if line.startswith("lakefeed: backfill")]
    assert said[0].startswith("lakefeed: backfill: entity 'other' failed: manifest ")
    assert "is not valid JSON" in said[0] and "fix or restore it" in said[0]
    assert said[1].startswith("lakefeed: backfill incomplete: 1 of 2 entities failed; fix the cause and run backfill")
    assert len(said) == 2  # the healthy entity is not named
    assert proc.stdout.splitlines()[-1].startswith("backfill: 3 files, 3 rows in ")  # and was drained all the same
    assert sorted(_ids(tmp_path / "lake" / "sales" / "table")) == [0, 1, 2]

