"""The daemon as operators run it: a real process, real signals, SIGKILL mid-stream and restart."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from lakefeed.connectors.sinks import cdm_manifest
from tests.conftest import entity_yaml, land, wait_for, write_config, writers_of

ROWS_PER_FILE = 40


class Daemon:
    def __init__(self, config: Path, log: Path) -> None:
        self.config, self.log = config, log
        self.proc: subprocess.Popen | None = None

    def start(self, env: dict[str, str] | None = None, new_session: bool = False) -> None:
        """`new_session`: the daemon leads a session of its own, as under systemd."""
        self._log_file = open(self.log, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "lakefeed", "run", "--config", str(self.config)],
                                     stdout=self._log_file, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                     start_new_session=new_session)
        starts = self.events("daemon.ready")
        wait_for(lambda: self.events("daemon.ready") > starts or self.proc.poll() is not None, 120, 0.2, "ready")
        assert self.proc.poll() is None, self.log.read_text()[-3000:]

    def events(self, name: str) -> int:
        if not self.log.exists():
            return 0
        return sum(1 for line in self.log.read_text(errors="replace").splitlines() if f'"event": "{name}"' in line)

    def records(self, name: str) -> list[dict]:
        """The log's records of one event, parsed."""
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text(errors="replace").splitlines()
                if f'"event": "{name}"' in line and line.startswith("{")]

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def __enter__(self) -> Daemon:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def kill(self) -> None:
        """SIGKILL the daemon if it still runs: a test's clean-up, whatever happened."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout: float = 90) -> None:
        """SIGTERM: the daemon must exit 0 within `timeout`."""
        self.signal(signal.SIGTERM)
        code = self.wait(timeout)
        assert code == 0, f"the daemon exited with {code}:\n{self.log.read_text()[-3000:]}"

    def wait(self, timeout: float = 60) -> int:
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGUSR2)  # its threads' stacks into the log: what it waits on
            time.sleep(1)
            raise AssertionError(f"the daemon did not exit in {timeout} s:\n{self.log.read_text()[-6000:]}") from None
        self._log_file.close()
        return code


def _table_rows(uri: Path) -> int:
    try:
        return DeltaTable(str(uri)).to_pyarrow_table().num_rows
    except Exception:
        return 0


def _csv(file_no: int) -> str:
    ids = range(file_no * ROWS_PER_FILE, (file_no + 1) * ROWS_PER_FILE)
    return "id,file\n" + "".join(f"{i},{file_no}\n" for i in ids)


@pytest.fixture
def setup(tmp_path):
    entity = entity_yaml(source={"type": "local_dir", "path": "landing", "reconcile_interval_s": 2,
                                 "max_files_per_trigger": 3})
    config = write_config(tmp_path, [entity], spark={"master": "local[2]", "trigger_interval_s": 0.2})
    daemon = Daemon(config, tmp_path / "daemon.log")
    yield tmp_path, daemon
    daemon.kill()


def test_sigkill_mid_stream_loses_nothing_and_duplicates_nothing(setup):
    tmp_path, daemon = setup
    landing, table = tmp_path / "landing" / "sales", tmp_path / "lake" / "sales" / "table"
    daemon.start()
    for n in range(15):
        land(landing / f"f{n:03d}.csv", _csv(n))
    wait_for(lambda: daemon.events("batch.committed") >= 2, 60, what="two committed batches")
    daemon.signal(signal.SIGKILL)
    assert daemon.wait() == -signal.SIGKILL
    for n in range(15, 25):  # landed while the daemon is down
        land(landing / f"f{n:03d}.csv", _csv(n))

    daemon.start()
    committed = daemon.events("batch.committed")
    for n in range(25, 30):
        land(landing / f"f{n:03d}.csv", _csv(n))
    wait_for(lambda: daemon.events("batch.committed") > committed, 60, what="a batch after restart")
    daemon.signal(signal.SIGKILL)  # and once more, wherever it is now
    daemon.wait()
    for n in range(30, 35):
        land(landing / f"f{n:03d}.csv", _csv(n))

    daemon.start()
    total = 35 * ROWS_PER_FILE
    wait_for(lambda: _table_rows(table) == total, 120, 0.3, f"{total} rows")
    daemon.stop()
    assert daemon.events("daemon.stopped") == 1

    rows = DeltaTable(str(table)).to_pyarrow_table()
    assert sorted(rows["id"].to_pylist()) == list(range(total))  # every row once
    changelog = DeltaTable(str(tmp_path / "lake" / "sales" / "changelog")).to_pyarrow_table()
    assert sorted(changelog["offset"].to_pylist()) == list(range(total))  # dense, never reused
    assert sorted(changelog["id"].to_pylist()) == list(range(total))
    entity = cdm_manifest.find_entity(cdm_manifest.load(tmp_path / "landing" / "default.manifest.cdm.json"), "sales")
    assert sorted(p["location"] for p in entity["dataPartitions"]) == [f"sales/f{n:03d}.csv" for n in range(35)]


def test_sigint_finishes_and_exits_zero_and_bad_manifest_stops_only_that_entity(setup):
    tmp_path, daemon = setup
    other = entity_yaml("other", source={"type": "local_dir", "path": "other"},
                        manifest="other/default.manifest.cdm.json")
    config = write_config(tmp_path, [entity_yaml(), other], spark={"master": "local[2]", "trigger_interval_s": 0.2})
    (tmp_path / "other").mkdir()
    broken = '{"manifestName": "default", "entities": [ oops'
    (tmp_path / "other" / "default.manifest.cdm.json").write_text(broken)
    daemon.config = config
    notify_socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify_socket.bind(str(tmp_path / "notify.sock"))
    notify_socket.settimeout(60)
    daemon.start(env={"NOTIFY_SOCKET": str(tmp_path / "notify.sock")})
    ready = notify_socket.recv(4096).decode()
    assert "READY=1" in ready.splitlines()
    assert "STATUS=1 entities running, 1 failed (other), backlog 0" in ready.splitlines()
    failures = [json.loads(line) for line in daemon.log.read_text().splitlines()
                if '"event": "entity.failed"' in line]
    assert len(failures) == 1 and failures[0]["entity"] == "other"
    assert "is not valid JSON" in failures[0]["error"] and "left it untouched" in failures[0]["error"]
    assert (tmp_path / "other" / "default.manifest.cdm.json").read_text() == broken

    land(tmp_path / "landing" / "sales" / "a.csv", _csv(0))  # the healthy entity keeps working
    wait_for(lambda: _table_rows(tmp_path / "lake" / "sales" / "table") == ROWS_PER_FILE, 60, what="rows")
    daemon.signal(signal.SIGINT)  # Ctrl-C stops as gracefully as SIGTERM
    wait_for(lambda: "STOPPING=1" in notify_socket.recv(4096).decode().splitlines(), 60, 0, "STOPPING=1")
    assert daemon.wait(90) == 0
    assert daemon.events("daemon.stopped") == 1
    notify_socket.close()


def test_startup_with_an_invalid_config_exits_non_zero_with_the_problem(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("entities:\n  - name: 1nvalid\n")
    proc = subprocess.run([sys.executable, "-m", "lakefeed", "run", "--config", str(bad)],
                          capture_output=True, text=True, timeout=60, env={**os.environ})
    assert proc.returncode == 2
    assert f"{bad}:2: entities.0.name: String should match pattern" in proc.stderr


def _changes_csv(rows: list[tuple[int, str, int]]) -> str:
    return "id,v,seq,bad\n" + "".join(f"{k},{v},{s},\n" for k, v, s in rows)


@pytest.mark.parametrize("points", [
    # ODF catches up at start: not after a step behind it; the changelog's file written, not committed: swept
    ("batch.discovered", "commit.changelog_written", "odf.block_written"),
    ("commit.changelog", "commit.quarantine", "manifest.written")])
def test_keyed_entity_killed_at_each_commit_step_ends_exactly_right(tmp_path, points):
    """SIGKILL at a precise step of a batch, restart, SIGKILL at another step (of the replay or of a new batch),
    restart, and the tables are exactly what the changes say. Each life lands 3 files, the last (not killed) too.
    delta-spark's keyed kill at `commit.table` (where its own transaction matters) is on a local-cluster, in
    test_executors.py's push test."""
    import random

    entity = entity_yaml(cdc={"strategy": "upsert", "primary_key": ["id"], "sequence_by": ["seq"]},
                         source={"type": "local_dir", "path": "landing", "reconcile_interval_s": 2,
                                 "max_files_per_trigger": 2})
    config = write_config(tmp_path, [entity], spark={"master": "local[2]", "trigger_interval_s": 0.2})
    rng = random.Random("-".join(points))
    files, expected = [], {}
    killed = 3 * len(points)  # files landed in the lives that are killed
    for n in range(killed + 3):
        rows = [(rng.randrange(6), rng.choice("abc"), 10 * n + i) for i in range(4)]
        bad = f",bad{n},1,\n" if n < killed else ""  # a row without a key: quarantined whatever types are found first
        files.append((f"f{n}.csv", _changes_csv(rows) + bad))
        for k, v, s in rows:
            expected[k] = (v, s)  # sequences grow with the file number: the last change of a key wins
    landing = tmp_path / "landing" / "sales"
    with Daemon(config, tmp_path / "daemon.log") as daemon:
        for life, point in enumerate(points):
            daemon.start(env={"LAKEFEED_FAILPOINT": point})
            for name, text in files[3 * life:3 * life + 3]:
                land(landing / name, text)
            assert daemon.wait(90) == -signal.SIGKILL, f"the failpoint {point} was not reached"
        daemon.start()
        for name, text in files[killed:]:
            land(landing / name, text)
        table = tmp_path / "lake" / "sales" / "table"
        wait_for(lambda: _state(table) == expected, 120, 0.3, "the expected state")
        daemon.stop()
    from lakefeed.config import model as config_module
    from lakefeed.pipeline.verify import verify

    cfg = config_module.load(config).entities[0]
    assert verify(cfg) == []  # offsets dense, the changelog replays to the table
    for kept in (cfg.changelog, cfg.quarantine):  # nothing a killed life or a replay wrote is left behind
        held = set(DeltaTable(str(kept)).file_uris())
        assert {str(p) for p in Path(kept).glob("*.parquet")} == held, kept
    assert writers_of(cfg.table) == {"delta-rs"}
    quarantine = DeltaTable(str(cfg.quarantine)).to_pyarrow_table().to_pylist()
    assert sorted(json.loads(r["raw"])["v"] for r in quarantine) == [f"bad{n}" for n in range(killed)]  # each once
    entity_doc = cdm_manifest.find_entity(cdm_manifest.load(cfg.manifest), "sales")
    assert sorted(p["location"] for p in entity_doc["dataPartitions"]) == sorted(f"sales/{name}" for name, _ in files)


def _state(table: Path) -> dict:
    try:
        rows = DeltaTable(str(table)).to_pyarrow_table().to_pylist()
    except Exception:
        return {}
    return {r["id"]: (r["v"], r["seq"]) for r in rows}
