"""Every case of the bad-input corpus (tests/hostile_corpus.py) against one real daemon process.

The daemon runs without CAP_DAC_OVERRIDE (setpriv), so a mode-000 file is unreadable to it as it is to
the service user. After each case: the answer or the quarantine reason is the expected one, the
daemon still answers /healthz, and a canary push is acknowledged. At the end, a clean stop and a
restart: every record the daemon acknowledged, and every good file, is in the table exactly once.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from deltalake import DeltaTable

from lakefeed.config import model as config
from lakefeed.errors import ConfigError
from lakefeed.intake.push_api import token_hash
from tests import hostile_corpus as corpus
from tests.conftest import entity_yaml, land, wait_for, write_config

CASES = [*corpus.PUSHES, *corpus.LANDINGS, *corpus.MANIFESTS, *corpus.CONFIGS]
GOOD_FRAGILE = {"manifestName": "default", "entities": [corpus._FRAGILE]}


class Daemon:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.config = write_config(folder, [
            entity_yaml("sales", push=[{"name": "api", "tokens_sha256": [token_hash(corpus.TOKEN)]}],
                        patterns=[{"name": "flat", "root_location": "sales", "glob_pattern": "/*.csv"}]),
            entity_yaml("events", format={"kind": "ndjson"},
                        patterns=[{"name": "flat", "root_location": "events", "glob_pattern": "/*.json"}]),
            entity_yaml("fragile", source={"type": "local_dir", "path": "fragile_landing", "reconcile_interval_s": 1},
                        manifest="fragile_landing/default.manifest.cdm.json", patterns=[]),
        ], spark={"master": "local[2]", "trigger_interval_s": 0.3}, http={"host": "127.0.0.1", "port": 0,
                                                                           "max_body_bytes": 1 << 20})
        self.log = folder / "daemon.log"
        self.proc: subprocess.Popen | None = None
        self.acked: set[int] = set()
        self.canary = 20_000

    def start(self, probe_start_up: bool = False) -> None:
        starts = self.events("daemon.ready")
        with open(self.log, "ab") as out:
            # As the service user: permissions hold (root's CAP_DAC_OVERRIDE would read a mode-000 file).
            self.proc = subprocess.Popen(
                ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--",
                 sys.executable, "-m", "lakefeed", "run", "--config", str(self.config)],
                stdout=out, stderr=subprocess.STDOUT)
        if probe_start_up:  # the port answers before Spark runs: a push then is told to come back, not 404
            published = self.folder / "state" / "http.json"
            wait_for(lambda: published.exists() or self.proc.poll() is not None, 60, 0.05, "the port")
            self.url = json.loads(published.read_text())["url"]
            self.host, self.port = self.url.split("://")[1].split(":")
            status, answer = self.request("POST", corpus.PUSH, b"[]", {"Authorization": f"Bearer {corpus.TOKEN}"})
            assert status == 503 and "starting" in answer["error"], answer
        wait_for(lambda: self.events("daemon.ready") > starts or self.proc.poll() is not None, 180, 0.2, "ready")
        assert self.proc.poll() is None, self.log.read_text(errors="replace")[-3000:]
        self.url = json.loads((self.folder / "state" / "http.json").read_text())["url"]
        self.host, self.port = self.url.split("://")[1].split(":")

    def stop(self) -> None:
        """A clean stop: exit 0 well inside the backstop (shutdown_timeout_s + stop_grace_s, 80 s)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGUSR2)  # where it waits, in the log below
            wait_for(lambda: self.events("daemon.stacks") > 0, 30, 0.2, "the stacks")
            code = None
        assert code == 0, self.log.read_text(errors="replace")[-20000:]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def lines(self) -> list[dict]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out

    def events(self, name: str, **match: str) -> int:
        if not self.log.exists():
            return 0
        return sum(1 for e in self.lines() if e.get("event") == name
                   and all(v in str(e.get(k, "")) for k, v in match.items()))

    def request(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
                ) -> tuple[int, dict]:
        conn = http.client.HTTPConnection(self.host, int(self.port), timeout=60)
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        try:
            return resp.status, json.loads(data) if data else {}
        except ValueError:
            return resp.status, {"error": data.decode(errors="replace")}

    def raw(self, case: corpus.Push) -> int:
        """The request as bytes on a socket: header bytes that no client library would send."""
        head = (f"{case.method} {case.path} HTTP/1.1\r\nHost: x\r\nContent-Type: {case.content_type}\r\n"
                f"Content-Length: {len(case.body)}\r\nConnection: close\r\n").encode()
        with socket.create_connection((self.host, int(self.port)), timeout=60) as s:
            s.sendall(head + (case.raw_headers or b"") + b"\r\n" + case.body)
            answer = s.recv(4096)
        return int(answer.split(b" ", 2)[1])

    def push_canary(self) -> None:
        self.canary += 1
        status, answer = self.request("POST", corpus.PUSH, json.dumps([{"id": self.canary}]).encode(),
                                      {"Authorization": f"Bearer {corpus.TOKEN}", "Content-Type": "application/json"})
        assert status == 202, answer
        self.acked.add(self.canary)

    def quarantined(self, entity: str) -> list[dict]:
        try:
            return DeltaTable(str(self.folder / "lake" / entity / "quarantine")).to_pyarrow_table().to_pylist()
        except Exception:
            return []

    def ids(self, entity: str = "sales") -> list[int]:
        try:
            return DeltaTable(str(self.folder / "lake" / entity / "table")).to_pyarrow_table()["id"].to_pylist()
        except Exception:
            return []


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    fragile = folder / "fragile_landing"
    fragile.mkdir()
    (fragile / "default.manifest.cdm.json").write_text(json.dumps(GOOD_FRAGILE))
    land(folder / "landing" / "sales" / "seed.csv", corpus._csv(9900).decode())  # the table's types
    land(fragile / "fragile" / "seed.csv", "id\n1\n")
    d = Daemon(folder)
    d.start()
    wait_for(lambda: 9900 in d.ids() and d.ids("fragile"), 120, 0.3, "the seed rows")
    yield d
    if d.alive():
        d.proc.kill()
        d.proc.wait()


def _healthy(d: Daemon) -> None:
    assert d.alive(), d.log.read_text(errors="replace")[-3000:]
    assert d.request("GET", "/healthz")[0] == 200
    d.push_canary()


def _push(d: Daemon, case: corpus.Push) -> None:
    if case.raw_headers is not None:
        status, answer = d.raw(case), {}
    else:
        headers = {"Content-Type": case.content_type, **case.headers}
        if case.token is not None:
            headers["Authorization"] = f"Bearer {case.token}"
        if headers.pop("Content-Length-Override", None):
            headers["Content-Length"] = str(1 << 30)  # declared larger than http.max_body_bytes
            status, answer = d.request(case.method, case.path, b"", headers)
        else:
            status, answer = d.request(case.method, case.path, case.body, headers)
    assert status == case.status, answer
    assert case.says.lower() in json.dumps(answer).lower(), answer
    if status == 202:
        d.acked.update(case.acked_ids)
    secret = corpus.TOKEN.encode()
    assert secret not in d.log.read_bytes(), "a token reached the log"


def _landing(d: Daemon, case: corpus.Landing) -> None:
    root = d.folder / "landing"
    relative = os.fsdecode(case.relative) if isinstance(case.relative, bytes) else case.relative
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    if case.make == "fifo":
        os.mkfifo(path)
    elif case.make == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    elif case.make == "symlink":
        path.symlink_to(case.link_to)
    elif case.make == "folder":
        path.mkdir()
    else:
        tmp = path.with_name(".landing.tmp")
        tmp.write_bytes(case.content)
        if case.make == "mode000":
            tmp.chmod(0)
        os.replace(tmp, path)
    entity = relative.split("/")[0]
    if case.reason is not None:
        shown = os.fsencode(relative).decode("utf-8", "replace")
        rows = wait_for(lambda: [q for q in d.quarantined(entity) if q["source_file"] == shown], 90, 0.3,
                        f"quarantine of {shown}")
        assert case.reason.lower() in rows[0]["reason"].lower(), rows
    for i in case.ids:
        wait_for(lambda i=i: i in d.ids(entity), 90, 0.3, f"row {i}")
        d.acked.add(i)


def _manifest(d: Daemon, case: corpus.Manifest) -> None:
    manifest = d.folder / "fragile_landing" / "default.manifest.cdm.json"
    failed = d.events("entity.failed", entity="fragile", error=case.says) if case.says else 0
    before = json.loads(manifest.read_text())
    if case.document is None:
        manifest.unlink()
    else:
        text = case.document if isinstance(case.document, str) else json.dumps(case.document)
        tmp = manifest.with_name(".m.tmp")
        tmp.write_text(text)
        os.replace(tmp, manifest)
    if case.land:
        land(d.folder / "fragile_landing" / case.land, "id\n2\n")
    if case.says:  # the next batch reads the manifest: a file landing makes one
        land(d.folder / "fragile_landing" / "fragile" / f"probe-{case.name}.csv", "id\n4\n")
        wait_for(lambda: d.events("entity.failed", entity="fragile", error=case.says) > failed, 60, 0.2,
                 f"entity.failed saying {case.says!r}")
        status, answer = d.request("GET", "/readyz")
        assert status == 503 and answer["not_running"] == ["fragile"], answer
    else:  # the entity goes on: a deleted manifest comes back whole; a pattern that backtracks is cut short
        land(d.folder / "fragile_landing" / case.appears, "id\n3\n")
        wait_for(lambda: manifest.exists() and case.appears in manifest.read_text(), 60, 0.2, "manifest")
        if case.unmatched:
            unmatched = [e for e in d.lines() if e.get("event") == "file.unmatched" and case.land in e.get("file", "")]
            assert unmatched and case.unmatched in unmatched[-1]["reason"], unmatched
        if not case.unmatched:  # a manifest or declaration deleted comes back with every partition
            kept = {p["location"] for p in json.loads(manifest.read_text())["entities"][0]["dataPartitions"]}
            assert {p["location"] for p in before["entities"][0]["dataPartitions"]} <= kept
    assert d.alive()
    tmp = manifest.with_name(".m.tmp")
    tmp.write_text(json.dumps(before))
    os.replace(tmp, manifest)  # fixed: the entity starts again by itself, with no restart
    wait_for(lambda: d.request("GET", "/readyz")[0] == 200, 60, 0.2, "fragile running again")


def _config(d: Daemon, case: corpus.Config, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    if isinstance(case.text, bytes):
        path.write_bytes(case.text)
    else:
        path.write_text(case.text)
    with pytest.raises(ConfigError) as refused:
        config.load(path)
    at = [p for p in refused.value.problems if p.startswith(f"{path}:{case.line}:")]
    assert at and case.says.lower() in " ".join(at).lower(), refused.value.problems


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{type(c).__name__.lower()}-{c.name}")
def test_bad_input_gets_its_answer_and_the_daemon_goes_on(daemon, case, tmp_path):
    if isinstance(case, corpus.Push):
        _push(daemon, case)
    elif isinstance(case, corpus.Landing):
        _landing(daemon, case)
    elif isinstance(case, corpus.Manifest):
        _manifest(daemon, case)
    else:
        _config(daemon, case, tmp_path)
    _healthy(daemon)


def test_a_bad_config_on_reload_keeps_the_running_one(daemon):
    good = daemon.config.read_text()
    rejected = daemon.events("reload.rejected")
    daemon.config.write_text(good.replace("entities:", "entities: [oops", 1))
    daemon.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: daemon.events("reload.rejected") > rejected, 60, 0.2, "reload.rejected")
    problems = [e["problem"] for e in daemon.lines() if e.get("event") == "config.invalid"]
    assert any(p.startswith(f"{daemon.config}:") for p in problems), problems
    _healthy(daemon)
    daemon.config.write_text(good)


def test_everything_acknowledged_is_in_the_table_once_after_a_clean_stop_and_restart(daemon):
    daemon.stop()
    assert yaml.safe_load(daemon.config.read_text())["entities"]
    daemon.start(probe_start_up=True)
    wanted = daemon.acked | {9900}
    wait_for(lambda: wanted <= set(daemon.ids()), 120, 0.3, "every acknowledged record")
    ids = daemon.ids()
    assert sorted(i for i in ids if i in wanted) == sorted(wanted), "an acknowledged record is missing or twice"
    # The good NDJSON file of the landing cases: nothing waited for its batch, which may commit only after the restart.
    wait_for(lambda: 9201 in daemon.ids("events"), 120, 0.3, "the good NDJSON file's row")
    assert daemon.ids("events").count(9201) == 1
    daemon.stop()
    verify = subprocess.run([sys.executable, "-m", "lakefeed", "verify", "--config", str(daemon.config)],
                            capture_output=True, text=True, timeout=300)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    shutil.rmtree(daemon.folder / "landing" / "sales" / "folder.csv", ignore_errors=True)
