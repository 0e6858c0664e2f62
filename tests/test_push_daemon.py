"""Pushing to a real daemon: SIGKILL right after acknowledgements, restart, every acknowledged record once."""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from deltalake import DeltaTable

from lakefeed.batch.read import from_rows
from lakefeed.config import model as config_module
from lakefeed.inbox.spool import Pending, Spool, encode
from lakefeed.intake.push_api import token_hash
from lakefeed.pipeline.verify import verify
from tests.conftest import alive, wait_for, write_config, writers_of
from tests.test_daemon_process import Daemon

TOKEN = "t-push"


def _post(url: str, rows: list[dict], key: str | None = None, starting_for: float = 0.0) -> dict:
    """POST `rows` and expect 202. A client of an intake that has just been started again gets 503 "starting"
    until the daemon has attached its push sources; with `starting_for` it retries, as a producer does, every
    half second for up to that many seconds."""
    host, port = url.removeprefix("http://").split(":")
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    if key:
        headers["Idempotency-Key"] = key
    deadline = time.monotonic() + starting_for
    while True:
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request("POST", "/v1/entities/events/sources/api/records", json.dumps(rows).encode(), headers)
        resp = conn.getresponse()
        body = json.loads(resp.read())
        conn.close()
        if resp.status == 503 and "starting" in body.get("error", "") and time.monotonic() < deadline:
            time.sleep(0.5)
            continue
        assert resp.status == 202, body
        return body


def _ids(table: Path) -> list[int]:
    try:
        return DeltaTable(str(table)).to_pyarrow_table().column("id").to_pylist()
    except Exception:
        return []


@pytest.fixture
def push_daemon(tmp_path, request):
    entity = {"name": "events", "writer": getattr(request, "param", "delta-rs"),
              "push": [{"name": "api", "tokens_sha256": [token_hash(TOKEN)], "max_records_per_trigger": 300}]}
    config = write_config(tmp_path, [entity], spark={"master": "local[2]", "trigger_interval_s": 0.2})
    daemon = Daemon(config, tmp_path / "daemon.log")
    yield tmp_path, config, daemon
    daemon.kill()


def _wait_while_growing(count: Callable[[], int], target: int, what: str, stall_s: float = 60.0) -> None:
    """Poll `count()` until it reaches `target`; fail when it has not grown for `stall_s`."""
    last, since = -1, time.monotonic()
    while (n := count()) < target:
        if n > last:
            last, since = n, time.monotonic()
        assert time.monotonic() - since < stall_s, f"{what}: stuck at {n} of {target} for {stall_s:.0f}s"
        time.sleep(0.3)


def _url(tmp_path: Path) -> str:
    return json.loads((tmp_path / "state" / "http.json").read_text())["url"]


@pytest.mark.parametrize(("failpoint", "push_daemon"), [(None, "delta-spark"), ("manifest.written", "delta-rs")],
                         indirect=["push_daemon"], ids=["anywhere-delta-spark", "manifest.written-delta-rs"])
def test_sigkill_right_after_acknowledgements_loses_and_repeats_nothing(push_daemon, failpoint):
    """Each writer once: delta-spark (its tasks' files committed by the driver through Delta's transaction) killed
    wherever it is when 3000 records are acknowledged, delta-rs right after a batch's manifests."""
    tmp_path, config, daemon = push_daemon
    table = tmp_path / "lake" / "events" / "table"
    daemon.start(env={"LAKEFEED_FAILPOINT": failpoint} if failpoint else None)
    url = _url(tmp_path)
    acked: list[int] = []
    stop = threading.Event()

    def produce() -> None:  # until the kill, or a backlog the restart works through in a minute or so
        n = 0
        while not stop.is_set() and n < 60:
            rows = [{"id": n * 100 + i, "v": "x"} for i in range(100)]
            try:
                _post(url, rows)
            except (OSError, http.client.HTTPException):
                return  # the daemon died under this request: it was never acknowledged
            acked.extend(r["id"] for r in rows)
            n += 1

    producer = threading.Thread(target=produce)
    producer.start()
    if failpoint:
        assert daemon.wait(90) == -signal.SIGKILL, "the failpoint was not reached"
    else:
        wait_for(lambda: len(acked) >= 3000, 60, what="3000 acknowledged records")
        daemon.signal(signal.SIGKILL)  # right after a 202: the spool holds it, Delta may not yet
        assert daemon.wait() == -signal.SIGKILL
    stop.set()
    producer.join()
    before = list(acked)

    daemon.start()
    url = _url(tmp_path)
    more = [{"id": 10_000_000 + i, "v": "after"} for i in range(50)]
    _post(url, more)
    expected = set(before) | {r["id"] for r in more}
    # Ready comes while the backlog of the first life (up to 6k records at 300 a batch) is worked through:
    # wait as long as records keep arriving, and fail when they stop short.
    _wait_while_growing(lambda: len(expected & set(_ids(table))), len(expected), "every acknowledged record")
    daemon.stop()
    ids = _ids(table)
    assert len(ids) == len(set(ids)), "a record was stored twice"
    # Requests cut off by the kill were not acknowledged; if their frame was durable they are in, once.
    cfg = config_module.load(config).entities[0]
    assert verify(cfg) == []
    assert writers_of(cfg.table) == {cfg.writer}


def test_idempotency_survives_a_restart_and_sigterm_exits_cleanly(push_daemon):
    tmp_path, config, daemon = push_daemon
    table = tmp_path / "lake" / "events" / "table"
    ours = _autogroup(os.getpid())
    daemon.start()
    first = _post(_url(tmp_path), [{"id": 1, "v": "a"}], key="order-1")
    # A daemon in another's session (here pytest's) leaves that session's priority alone and keeps the intake in it.
    assert _autogroup(os.getpid()) == ours and os.getsid(_intake_pid(_url(tmp_path))) == os.getsid(0)
    intake = Path(f"/proc/{_intake_pid(_url(tmp_path))}")
    # Decoding a JSON push did not load pandas into the intake (pyarrow would, for nothing), and the processes the
    # daemon starts have glibc's arenas and deltalake's limited as its own (daemon/ops/malloc.py).
    assert "/pandas/" not in (intake / "maps").read_text()
    environ = (intake / "environ").read_bytes().split(b"\0")
    assert b"MALLOC_ARENA_MAX=2" in environ and b"_RJEM_MALLOC_CONF=narenas:1" in environ
    wait_for(lambda: _ids(table) == [1], 60, what="the first record")
    daemon.stop()
    daemon.start()
    again = _post(_url(tmp_path), [{"id": 1, "v": "a"}], key="order-1")
    assert (again["batch"], again["duplicate"]) == (first["batch"], True)
    _post(_url(tmp_path), [{"id": 2, "v": "b"}], key="order-2")
    wait_for(lambda: sorted(_ids(table)) == [1, 2], 60, what="the second record")
    daemon.stop()
    assert sorted(_ids(table)) == [1, 2]


def _get(url: str, path: str) -> tuple[int, bytes]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("GET", path)
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, body


def _intake_pid(url: str) -> int | None:
    try:
        status, body = _get(url, "/status")
    except (OSError, http.client.HTTPException):
        return None  # the port is between intake processes
    return json.loads(body)["daemon"]["intake_pid"] if status == 200 else None


def _nice(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def _autogroup(pid: int) -> tuple[str, int] | None:
    """(name, nice) of a process's scheduler autogroup; None on a kernel without autogroups, or for a process
    in the root group (the file is empty then: init's session, where a CI runner's processes may be)."""
    try:
        fields = Path(f"/proc/{pid}/autogroup").read_text().split()
    except FileNotFoundError:
        return None
    if not fields:
        return None
    name, _, nice = fields
    return name, int(nice)


def test_the_intake_process_is_restarted_when_it_dies_and_goes_with_the_daemon(push_daemon):
    tmp_path, config, daemon = push_daemon
    table = tmp_path / "lake" / "events" / "table"
    daemon.start(new_session=True)  # as under systemd
    url = _url(tmp_path)
    # The port is the intake's; the daemon's own routes answer through it, the push route only to POST.
    first = _intake_pid(url)
    assert first is not None and first != daemon.proc.pid and alive(first)
    # Acknowledging comes first: the Spark side runs spark.nice (default 10) nicer than the intake, and
    # where the kernel shares the CPU between sessions first (autogroups), the daemon's session is the
    # nicer one and the intake has a session of its own.
    assert (_nice(first), _nice(daemon.proc.pid)) == (_nice(os.getpid()), min(19, _nice(os.getpid()) + 10))
    _assert_own_session(first, daemon.proc.pid)
    assert _get(url, "/openapi.json")[0] == 200 and _get(url, "/healthz")[0] == 200
    assert _get(url, "/v1/entities/events/sources/api/records")[0] == 405
    assert _get(url, "/no/such/route")[0] == 404
    _post(url, [{"id": i, "v": "before"} for i in range(100)])

    os.kill(first, signal.SIGKILL)
    wait_for(lambda: (_intake_pid(url) or first) != first, 60, 0.2, "a new intake process")
    assert daemon.events("intake.exited") == 1
    assert _nice(_intake_pid(url)) == _nice(os.getpid())  # started again at the intake's priority
    _assert_own_session(_intake_pid(url), daemon.proc.pid)
    _post(url, [{"id": 1000 + i, "v": "after"} for i in range(100)], starting_for=60)  # its push sources again
    wait_for(lambda: len(_ids(table)) >= 200, 60, 0.3, "both requests' records")
    assert sorted(_ids(table)) == [*range(100), *range(1000, 1100)]

    second = _intake_pid(url)
    daemon.signal(signal.SIGKILL)
    assert daemon.wait() == -signal.SIGKILL
    wait_for(lambda: not alive(second), 30, 0.1, "the intake to go with its daemon")
    daemon.start()  # the spools' writer lock is free again
    _post(_url(tmp_path), [{"id": 5000, "v": "restarted"}])
    wait_for(lambda: 5000 in _ids(table), 60, 0.3, "the record pushed after the restart")
    daemon.stop()
    assert len(_ids(table)) == 201


def _assert_own_session(intake: int, daemon: int) -> None:
    if _autogroup(daemon) is None:  # a kernel without autogroups: nice alone orders them, one session
        assert os.getsid(intake) == os.getsid(daemon) == daemon
        return
    assert os.getsid(intake) == intake and os.getsid(daemon) == daemon
    assert _autogroup(daemon)[1] == 10 and _autogroup(intake)[1] == 0
    assert _autogroup(intake)[0] != _autogroup(daemon)[0]


def test_pushes_adding_a_column_with_other_types_in_one_batch_commit_and_park_the_misfit(push_daemon):
    """`"x": 1` and `"x": "a"` acknowledged into one micro-batch (the table has no x yet; the frames are put in
    the spool while the daemon is stopped, as the intake would have): the batch settles on int64, commits
    what fits and quarantines the row that does not, and the stream goes on."""
    tmp_path, config, daemon = push_daemon
    table = tmp_path / "lake" / "events" / "table"
    daemon.start()
    _post(_url(tmp_path), [{"id": 1}])
    wait_for(lambda: _ids(table) == [1], 120, 0.3, "the first record")
    daemon.stop()
    cfg = config_module.load(config).entities[0]
    spool = Spool(cfg.spool("api"), 64 << 20, 3600)
    spool.append([Pending(encode(from_rows(rows)), len(rows), None, None)
                  for rows in ([{"id": 2, "x": 1}], [{"id": 3, "x": "a"}], [{"id": 4}])])
    spool.close()
    daemon.start()
    wait_for(lambda: sorted(_ids(table)) == [1, 2, 4], 60, 0.3, "the rows that fit")
    parked = DeltaTable(str(cfg.quarantine)).to_pyarrow_table().to_pylist()
    assert [json.loads(q["raw"])["id"] for q in parked] == ["3"] and "not a valid int64" in parked[0]["reason"]
    daemon.stop()
