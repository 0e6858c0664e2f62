"""Push API benchmark: records/s with durable acknowledgements, and ack latency at a fixed rate.

Measures, in one run, against a real daemon (`python -m lakefeed run`) as a subprocess, with
one push-only entity (`cdc: append`) and an aiohttp client in this process:

* closed loop: for batches of 1, 100 and 10k records per request (JSON arrays; for 10k also
  NDJSON and Arrow IPC), C connections each send the next request as soon as the previous one
  is answered, for `--seconds` after a short warm-up. Only 202s count. Reported: requests/s,
  records/s, ack latency p50/p99, and the CPU used meanwhile by the client, the daemon's
  Python process, its intake process (which serves the port), the rest of its session (JVM
  and Python workers) and everything else on the machine (`others`: on a shared machine it
  disturbs every number here). The bodies of a phase are a pool cycled through, so ids repeat;
  the entity appends, so the table count stays exact. The client freezes its start-up objects
  (gc.freeze) so that its own full collections do not show up as server latency.
* open loop: `--open-rate` requests/s of `--open-batch` records, each sent at its scheduled
  time whatever the answers (no coordinated omission): latency runs from the scheduled time to
  the 202, so queueing in the client and the daemon counts. Reported: p50/p99/max, and the
  requests that got no 202 within the timeout (counted as infinitely late in `p99_all_ms`).
* after each phase the run waits until the Delta table holds every acknowledged record and
  reports the drain time (last 202 -> visible); at the end the daemon gets SIGTERM and must
  exit 0.

Baselines, measured in the same run with the same bodies:

* http_floor: a bare aiohttp server in a subprocess on loopback that reads the body and
  answers 202 (no validation, no spool, no fsync), driven by the same client and load. The
  ratios lakefeed / http_floor show what lakefeed's work costs on top of HTTP itself.
* fsync_floor: the same bodies appended to a file here, one fsync per request and one per 16
  requests: the disk's price of durability, and what group commit buys.
* decode_floor: lakefeed's own decode + validate + Arrow IPC encode of each body
  (lakefeed.records, lakefeed.spool), on one thread: the CPU work a 202 needs besides HTTP.

Progress goes to stderr; one JSON object goes to stdout at the end. Exit status 0 when the
run completed and every acknowledged record reached the table (whether or not the goals are
met), 1 otherwise.

    python bench/push_api.py [--seconds 10] [--open-seconds 20] [--open-rate 1000] [--keep] [--smoke]

`--smoke`: every phase and floor for a fraction of a second (the open loop at 200 requests/s for 1 s), in about
a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from _common import (  # bench/ is the script folder, so on sys.path
    BenchError,
    Deadline,
    cpu_of,
    is_intake,
    kill_group,
    log_tail,
    machine_busy,
    parse_args,
    publish,
    ratio,
    say,
    stop_daemon,
    stop_process,
    workdir,
)
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from lakefeed.config import model as lakefeed_config
from lakefeed.inbox.spool import encode
from lakefeed.intake.push_api import ROUTE, token_hash
from lakefeed.intake.records import decode, validate

ENTITY = "bench"
SOURCE = "api"
TOKEN = "bench-token-not-a-secret"
GOAL_RECORDS_PER_S = 100_000
GOAL_P99_MS = 50.0
REQUEST_TIMEOUT_S = 30.0  # closed loop: a stuck request fails the phase rather than the run
OPEN_TIMEOUT_S = 5.0  # open loop: later than this is a miss
MAX_BODY = 64 << 20
CONTENT_TYPES = {"json": "application/json", "ndjson": "application/x-ndjson",
                 "arrow": "application/vnd.apache.arrow.stream"}
# (records per request, body format, connections)
PHASES = [(1, "json", 16), (100, "json", 8), (10_000, "json", 4), (10_000, "ndjson", 4), (10_000, "arrow", 4)]
FSYNC_GROUP = 16
SMOKE = {"seconds": 0.5, "warmup": 0.2, "open_rate": 200.0, "open_seconds": 1.0, "open_warmup": 0.3,
         "fsync_seconds": 0.2, "decode_seconds": 0.2, "trigger_interval": 0.5, "timeout": 300.0}

CONFIG = """\
lake_dir: lake
state_dir: state
log_level: INFO
spark: {{master: "local[2]", trigger_interval_s: {trigger}}}
http: {{host: 127.0.0.1, port: 0, max_body_bytes: {max_body}}}
entities:
  - name: {entity}
    push:
      - {{name: {source}, tokens_sha256: ["{token_hash}"]}}
    cdc: {{strategy: append}}
"""


# --------------------------------------------------------------------------- data


def make_records(first_id: int, n: int) -> list[dict[str, Any]]:
    base = datetime(2024, 1, 1, tzinfo=UTC)
    return [{"id": i, "name": f"customer-{i % 5000:05d}", "amount": round((i * 7919 % 100_000) / 100, 2),
             "ts": (base + timedelta(seconds=i % 31_536_000)).strftime("%Y-%m-%dT%H:%M:%SZ")}
            for i in range(first_id, first_id + n)]


def encode_body(rows: list[dict[str, Any]], kind: str) -> bytes:
    if kind == "json":
        return json.dumps(rows, separators=(",", ":")).encode()
    if kind == "ndjson":
        return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows).encode()
    return encode(pa.Table.from_pylist(rows))  # an Arrow IPC stream, as a producer would send it


def make_bodies(batch: int, kind: str, first_id: int) -> list[bytes]:
    """A pool of distinct bodies the load cycles through (pre-encoded: the client only sends)."""
    count = max(4, min(1000, 20_000 // batch))
    return [encode_body(make_records(first_id + j * batch, batch), kind) for j in range(count)]


def phase_key(batch: int, kind: str) -> str:
    return str(batch) if kind == "json" else f"{batch}_{kind}"


# --------------------------------------------------------------------------- measuring


class CpuMeter:
    """CPU seconds of this process, of a server process, of lakefeed's intake process (its child serving the
    port) and of the rest of its session (JVM, Python workers)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def sample(self) -> dict[str, float]:
        out = {"client": time.process_time(), "server": 0.0, "intake": 0.0, "server_children": 0.0,
               "machine": machine_busy(), "at": time.time()}
        try:
            out["server"] = cpu_of(self.pid)[1]
        except OSError:
            return out
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == self.pid:
                continue
            try:
                sid, cpu = cpu_of(int(entry))
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
            if sid == self.pid:  # started with start_new_session: its session id is its pid (intake included)
                out["intake" if is_intake(int(entry)) else "server_children"] += cpu
        return out

    @staticmethod
    def cores(before: dict[str, float], after: dict[str, float], wall: float) -> dict[str, float]:
        """Cores used meanwhile; `others`: the rest of the machine (other programs disturb the numbers)."""
        out = {k: round((after[k] - before[k]) / wall, 2) for k in before if k != "at"}
        out["others"] = round(out.pop("machine") - out["client"] - out["server"] - out["intake"]
                              - out["server_children"], 2)
        return out


def _window(before: dict[str, float], after: dict[str, float]) -> list[float]:
    """Wall-clock start and end (Unix time) of the measured part, to match the daemon's log."""
    return [round(before["at"], 3), round(after["at"], 3)]


class Tally:
    """Acknowledged records of one server, over all phases (what the table must end up holding)."""

    def __init__(self) -> None:
        self.acked = 0
        self.last_ack = 0.0
        self.error_sample: dict[str, str] = {}

    def ack(self, rows: int, at: float) -> None:
        self.acked += rows
        self.last_ack = max(self.last_ack, at)

    def error(self, status: str, body: bytes) -> None:
        self.error_sample.setdefault(status, body[:300].decode("utf-8", "replace"))


def _pct(values: np.ndarray | list[float], q: float) -> float | None:
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return None
    value = float(np.percentile(arr, q))
    return round(value * 1000, 3) if np.isfinite(value) else None  # ms; None: a miss is in the percentile


async def _post(session: aiohttp.ClientSession, url: str, body: bytes,
                headers: dict[str, str]) -> tuple[str, bytes]:
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            return str(resp.status), await resp.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        return type(exc).__name__, b""


async def post_once(url: str, body: bytes) -> tuple[str, bytes]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as session:
        return await _post(session, url + ROUTE.format(entity=ENTITY, source=SOURCE), body, _headers("json"))


def _headers(kind: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}", "Content-Type": CONTENT_TYPES[kind]}


async def closed_loop(url: str, kind: str, bodies: list[bytes], rows: int, concurrency: int, seconds: float,
                      warmup: float, tally: Tally, cpu: CpuMeter) -> dict[str, Any]:
    headers = _headers(kind)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as session:

        async def run(duration: float) -> tuple[list[float], Counter, float, float]:
            latencies: list[float] = []
            errors: Counter = Counter()
            t0 = time.perf_counter()
            end, last = t0 + duration, t0

            async def worker(w: int) -> None:
                nonlocal last
                i = w
                while time.perf_counter() < end:
                    body = bodies[i % len(bodies)]
                    i += concurrency
                    sent = time.perf_counter()
                    status, answer = await _post(session, url, body, headers)
                    done = time.perf_counter()
                    last = max(last, done)
                    if status == "202":
                        latencies.append(done - sent)
                        tally.ack(rows, done)
                        if len(latencies) == 1 and json.loads(answer).get("records") not in (None, rows):
                            raise BenchError(f"acknowledged {answer[:200]!r}, expected {rows} records")
                    else:
                        errors[status] += 1
                        tally.error(status, answer)
                        await asyncio.sleep(0.01)  # no busy loop against a server that says no

            await asyncio.gather(*(worker(w) for w in range(concurrency)))
            return latencies, errors, t0, last

        if warmup > 0:
            await run(warmup)
        before = cpu.sample()
        latencies, errors, t0, last = await run(seconds)
        elapsed = last - t0
        after = cpu.sample()
    ok = len(latencies)
    size = sum(len(b) for b in bodies) / len(bodies)
    return {"records_per_request": rows, "format": kind, "connections": concurrency,
            "body_bytes": round(size), "elapsed_s": round(elapsed, 3), "requests": ok,
            "errors": dict(errors), "requests_per_s": round(ok / elapsed, 1),
            "records_per_s": round(ok * rows / elapsed), "mb_per_s": round(ok * size / elapsed / 1e6, 1),
            "latency_ms": {"p50": _pct(latencies, 50), "p99": _pct(latencies, 99),
                           "max": _pct(latencies, 100)},
            "cpu_cores": CpuMeter.cores(before, after, elapsed), "window": _window(before, after)}


async def open_loop(url: str, bodies: list[bytes], rows: int, rate: float, seconds: float, warmup: float,
                    tally: Tally, cpu: CpuMeter) -> dict[str, Any]:
    """Requests at t0 + i/rate whatever the answers; latency from the scheduled time."""
    headers = _headers("json")
    skip, total = int(rate * warmup), int(rate * (warmup + seconds))
    latency = np.full(total, np.inf)
    lag = np.zeros(total)
    statuses: list[str] = [""] * total
    connector = aiohttp.TCPConnector(limit=1024)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=OPEN_TIMEOUT_S)) as session:

        async def one(i: int, at: float) -> None:
            lag[i] = time.perf_counter() - at
            status, answer = await _post(session, url, bodies[i % len(bodies)], headers)
            statuses[i] = status
            if status == "202":
                done = time.perf_counter()
                latency[i] = done - at
                tally.ack(rows, done)
            else:
                tally.error(status, answer)

        # Only the requests in flight are kept (a few at a time): a list of every task made the client's own
        # garbage collections walk tens of thousands of finished ones, pauses that counted as server latency.
        pending: set[asyncio.Task] = set()
        failures: list[BaseException] = []

        def finished(task: asyncio.Task) -> None:
            pending.discard(task)
            if not task.cancelled() and task.exception() is not None:
                failures.append(task.exception())

        t0 = time.perf_counter() + 0.05
        before: dict[str, float] | None = None
        for i in range(total):
            at = t0 + i / rate
            if i == skip:
                before = cpu.sample()
            delay = at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(one(i, at))
            pending.add(task)
            task.add_done_callback(finished)
        while pending:
            await asyncio.wait(list(pending))
        if failures:
            raise failures[0]
        after = cpu.sample()
    assert before is not None
    wall = time.perf_counter() - (t0 + skip / rate)
    measured, lags = latency[skip:], lag[skip:]
    ok = measured[np.isfinite(measured)]
    missed = Counter(s for s in statuses[skip:] if s != "202")
    return {"rate_per_s": rate, "records_per_request": rows, "seconds": seconds, "warmup_s": warmup,
            "requests": int(measured.size), "acknowledged": int(ok.size), "missed": sum(missed.values()),
            "missed_by_status": dict(missed), "timeout_s": OPEN_TIMEOUT_S,
            "latency_ms": {"p50": _pct(ok, 50), "p90": _pct(ok, 90), "p99": _pct(ok, 99), "p999": _pct(ok, 99.9),
                           "max": _pct(ok, 100)},
            "p99_all_ms": _pct(measured, 99),  # misses as infinitely late: None when they reach the p99
            "send_lag_ms": {"p50": _pct(lags, 50), "p99": _pct(lags, 99), "max": _pct(lags, 100)},
            # When the slow answers came (steady, or bunched after the phase before it).
            "p99_ms_by_second": [_pct(second[np.isfinite(second)], 99)
                                 for second in np.array_split(measured, max(1, round(seconds)))],
            "cpu_cores": CpuMeter.cores(before, after, wall), "window": _window(before, after)}


# --------------------------------------------------------------------------- servers


def serve_floor() -> int:
    """The http_floor server (run as `push_api.py --floor-server`): read the body, answer 202."""
    from aiohttp import web

    async def records(request: web.Request) -> web.Response:
        body = await request.read()
        return web.json_response({"entity": request.match_info["entity"], "source": request.match_info["source"],
                                  "batch": 0, "records": None, "bytes": len(body),
                                  "received_at": "2024-01-01T00:00:00.000Z", "duplicate": False}, status=202)

    async def main() -> None:
        app = web.Application(client_max_size=MAX_BODY)
        app.add_routes([web.post(ROUTE, records)])
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        print(json.dumps({"url": f"http://127.0.0.1:{runner.addresses[0][1]}"}), flush=True)
        await stop.wait()
        await runner.cleanup()

    asyncio.run(main())
    return 0


def start_floor(deadline: Deadline) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, __file__, "--floor-server"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the server prints its URL once listening
    deadline.check("starting the http_floor server")
    if not line:
        raise BenchError(f"the http_floor server exited with {proc.wait()} before listening")
    return proc, json.loads(line)["url"]


def wait_ready(proc: subprocess.Popen, state: Path, log_path: Path, deadline: Deadline) -> str:
    """The daemon's URL once GET /readyz answers 200."""
    url = ""
    while True:
        if proc.poll() is not None:
            raise BenchError(f"daemon exited with {proc.returncode} before it was ready")
        deadline.check("waiting for the daemon's /readyz")
        if not url and (state / "http.json").exists():
            url = json.loads((state / "http.json").read_text())["url"]
        if url:
            try:
                with urllib.request.urlopen(f"{url}/readyz", timeout=5) as resp:
                    if resp.status == 200:
                        return url
            except (urllib.error.URLError, OSError):
                pass  # 503 until every query runs
        time.sleep(0.2)


class TableRows:
    """Rows in the Delta table, from the add actions' statistics (no data read)."""

    def __init__(self, uri: Path) -> None:
        self.uri = uri
        self._table: DeltaTable | None = None

    def count(self) -> int:
        if self._table is None:
            try:
                self._table = DeltaTable(str(self.uri))
            except TableNotFoundError:
                return 0
        else:
            self._table.update_incremental()
        actions = pa.table(self._table.get_add_actions(flatten=True))
        return int(pc.sum(actions.column("num_records")).as_py() or 0) if actions.num_rows else 0


def wait_visible(rows: TableRows, tally: Tally, proc: subprocess.Popen, deadline: Deadline,
                 what: str) -> dict[str, Any]:
    """Wait until the table holds every acknowledged record; drain time from the last 202."""
    last_report = time.perf_counter()
    while True:
        visible = rows.count()
        now = time.perf_counter()
        if visible >= tally.acked:
            return {"acked_total": tally.acked, "visible_total": visible,
                    "drain_s": round(max(0.0, now - tally.last_ack), 2)}
        if proc.poll() is not None:
            raise BenchError(f"daemon exited with {proc.returncode} while draining {what}")
        deadline.check(f"waiting for {what} in the table ({visible}/{tally.acked} records visible)")
        if now - last_report > 10:
            say(f"  {visible:,}/{tally.acked:,} records visible")
            last_report = now
        time.sleep(0.1)


# --------------------------------------------------------------------------- phases


def run_load(url: str, bodies: dict[tuple[int, str], list[bytes]], phases: list[tuple[int, str, int]],
             args: argparse.Namespace, tally: Tally, cpu: CpuMeter, deadline: Deadline,
             after_phase: Callable[[str, float, int], dict[str, Any]] | None = None,
             ) -> tuple[dict[str, Any], dict[str, Any]]:
    target = url + ROUTE.format(entity=ENTITY, source=SOURCE)
    closed: dict[str, Any] = {}
    for batch, kind, conns in phases:
        deadline.check(f"before the closed loop of {batch} {kind}")
        started = time.perf_counter()
        acked_before = tally.acked
        res = asyncio.run(closed_loop(target, kind, bodies[(batch, kind)], batch, conns, args.seconds,
                                      args.warmup, tally, cpu))
        say(f"  closed loop {batch:>6} x {kind:<6} {conns:>2} conns: {res['requests_per_s']:>9,.1f} req/s "
            f"{res['records_per_s']:>10,} records/s  p50 {res['latency_ms']['p50']} ms "
            f"p99 {res['latency_ms']['p99']} ms  errors {res['errors'] or 0}  cpu {res['cpu_cores']}")
        if after_phase is not None:
            res["drain"] = after_phase(f"the {batch} x {kind} phase", started, tally.acked - acked_before)
        closed[phase_key(batch, kind)] = res
    deadline.check("before the open loop")
    started = time.perf_counter()
    acked_before = tally.acked
    res = asyncio.run(open_loop(target, bodies[(args.open_batch, "json")], args.open_batch, args.open_rate,
                                args.open_seconds, args.open_warmup, tally, cpu))
    say(f"  open loop {args.open_rate:.0f} req/s x {args.open_batch}: p50 {res['latency_ms']['p50']} ms "
        f"p99 {res['latency_ms']['p99']} ms max {res['latency_ms']['max']} ms, missed {res['missed']}, "
        f"send lag p99 {res['send_lag_ms']['p99']} ms  cpu {res['cpu_cores']}")
    if after_phase is not None:
        res["drain"] = after_phase("the open loop", started, tally.acked - acked_before)
    return closed, res


def run_http_floor(bodies: dict, phases: list, args: argparse.Namespace, deadline: Deadline) -> dict[str, Any]:
    proc, url = start_floor(deadline)
    try:
        say(f"http_floor: bare aiohttp server at {url} (pid {proc.pid})")
        closed, open_ = run_load(url, bodies, phases, args, Tally(), CpuMeter(proc.pid), deadline)
        return {"closed_loop": closed, "open_loop": open_}
    finally:
        stop_process(proc, 10)
        kill_group(proc)


def run_lakefeed(work: Path, bodies: dict, phases: list, args: argparse.Namespace,
                 deadline: Deadline) -> dict[str, Any]:
    cfg = work / "lakefeed.yaml"
    cfg.write_text(CONFIG.format(trigger=args.trigger_interval, max_body=MAX_BODY, entity=ENTITY, source=SOURCE,
                                 token_hash=token_hash(TOKEN)))
    log_path = work / "daemon.log"
    say(f"starting lakefeed ({cfg}), log {log_path}")
    t0 = time.perf_counter()
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", "lakefeed", "run", "--config", str(cfg)], cwd=work,
                                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        url = wait_ready(proc, work / "state", log_path, deadline)
        startup_s = time.perf_counter() - t0
        say(f"daemon ready at {url} after {startup_s:.1f}s (pid {proc.pid})")
        rows = TableRows(work / "lake" / ENTITY / "table")
        tally = Tally()
        cpu = CpuMeter(proc.pid)

        # One request first, until it is in the table: from then on requests are checked against the
        # table's schema, as in steady state (before, against the first request's types).
        status, answer = asyncio.run(post_once(url, encode_body(make_records(10**12, 100), "json")))
        if status != "202":
            raise BenchError(f"the first request got {status}: {answer[:300]!r}")
        tally.ack(100, time.perf_counter())
        first_visible = wait_visible(rows, tally, proc, deadline, "the first request")
        say(f"first request visible {first_visible['drain_s']}s after its 202")

        def drain(what: str, started: float, records: int) -> dict[str, Any]:
            out = wait_visible(rows, tally, proc, deadline, what)
            out["visible_records_per_s"] = round(records / (time.perf_counter() - started))
            say(f"  drained: {out['visible_total']:,} records visible {out['drain_s']}s after the last 202 "
                f"({out['visible_records_per_s']:,} records/s from phase start to visible)")
            return out

        closed, open_ = run_load(url, bodies, phases, args, tally, cpu, deadline, after_phase=drain)
        say("stopping the daemon (SIGTERM)")
        t_stop = time.perf_counter()
        code = stop_daemon(proc, timeout=min(120.0, max(deadline.left(), 5.0)))
        if code is None:
            raise BenchError("daemon did not exit within 120s of SIGTERM")
        shutdown_s = time.perf_counter() - t_stop
        say(f"daemon exited with {code} after {shutdown_s:.1f}s")
        visible = TableRows(work / "lake" / ENTITY / "table").count()
        if code != 0:
            raise BenchError(f"daemon exited with {code}, expected 0")
        if visible < tally.acked:
            raise BenchError(f"table holds {visible} records, {tally.acked} were acknowledged")
        return {"closed_loop": closed, "open_loop": open_,
                "daemon": {"startup_s": round(startup_s, 1), "exit_code": code, "shutdown_s": round(shutdown_s, 1),
                           "first_request_visible_s": first_visible["drain_s"]},
                "delta": {"acked_records": tally.acked, "visible_records": visible,
                          "exactly_acked": visible == tally.acked},
                "error_samples": tally.error_sample}
    except BaseException:
        say("daemon log tail:\n" + log_tail(log_path))
        raise
    finally:
        if proc.poll() is None:
            say("killing the daemon")
        kill_group(proc)


# --------------------------------------------------------------------------- in-process floors


def fsync_floor(folder: Path, bodies: list[bytes], rows: int, group: int, seconds: float) -> dict[str, Any]:
    """Append the bodies to a file, one fsync per `group` requests."""
    path = folder / f"fsync-{rows}-{group}.log"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    syncs: list[float] = []
    n = written = 0
    t0 = time.perf_counter()
    try:
        while time.perf_counter() - t0 < seconds:
            chunk = [bodies[(n + k) % len(bodies)] for k in range(group)]
            written += os.writev(fd, chunk)
            t = time.perf_counter()
            os.fsync(fd)
            syncs.append(time.perf_counter() - t)
            n += group
        elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
        path.unlink()
    return {"requests_per_fsync": group, "requests_per_s": round(n / elapsed, 1),
            "records_per_s": round(n * rows / elapsed), "mb_per_s": round(written / elapsed / 1e6, 1),
            "fsync_ms": {"p50": _pct(syncs, 50), "p99": _pct(syncs, 99)}}


def decode_floor(cfg_path: Path, table: Path, bodies: list[bytes], rows: int, kind: str,
                 seconds: float) -> dict[str, Any]:
    """lakefeed's per-request CPU work (decode, validate against the table's schema, encode), one thread."""
    cfg = lakefeed_config.load(cfg_path)
    entity, limit = cfg.entity(ENTITY), cfg.http.max_body_bytes
    schema = pa.schema(DeltaTable(str(table)).schema().to_arrow())
    # As EntityPipeline.schema(): the table's columns without provenance and lakefeed's own.
    target = pa.schema([f for f in schema if f.name != "source_file" and not f.name.startswith("__")])
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        encode(validate(decode(bodies[n % len(bodies)], CONTENT_TYPES[kind], target, limit), entity, target))
        n += 1
    elapsed = time.perf_counter() - t0
    return {"requests_per_s": round(n / elapsed, 1), "records_per_s": round(n * rows / elapsed),
            "ms_per_request": round(elapsed / n * 1000, 3)}


# --------------------------------------------------------------------------- main


def machine() -> dict[str, Any]:
    model = ""
    try:
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "")
    except OSError:
        pass
    return {"cores": os.cpu_count(), "cores_usable": len(os.sched_getaffinity(0)), "cpu": model,
            "loadavg_1m_at_start": os.getloadavg()[0],
            "python": platform.python_version(), "platform": platform.platform(), "aiohttp": aiohttp.__version__,
            "pyarrow": pa.__version__}


def source_tree() -> dict[str, Any] | None:
    """The commit measured, and the package files that differ from it (uncommitted work changes the numbers)."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=True, timeout=10).stdout.strip()
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "daemon", "connectors"],
                                capture_output=True, text=True, check=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "uncommitted": sorted(line[3:] for line in status.splitlines())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0, help="measured seconds per closed-loop phase")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each closed-loop phase")
    p.add_argument("--open-rate", type=float, default=1000.0, help="open loop: requests per second")
    p.add_argument("--open-batch", type=int, default=10, help="open loop: records per request")
    p.add_argument("--open-seconds", type=float, default=20.0)
    p.add_argument("--open-warmup", type=float, default=2.0)
    p.add_argument("--phases", default=None,
                   help="closed-loop phases as RECORDS:FORMAT:CONNECTIONS,... (default: "
                        + ",".join(f"{b}:{k}:{c}" for b, k, c in PHASES) + "); the 10000:json phase is required "
                        "for the goal")
    p.add_argument("--fsync-seconds", type=float, default=2.0)
    p.add_argument("--decode-seconds", type=float, default=2.0)
    p.add_argument("--trigger-interval", type=float, default=1.0)
    p.add_argument("--timeout", type=float, default=1200.0, help="overall deadline in seconds (default 1200)")
    p.add_argument("--workdir", type=Path, default=None, help="default: a fresh temporary folder")
    p.add_argument("--keep", action="store_true", help="keep the workdir (always kept when --workdir is given)")
    p.add_argument("--floor-server", action="store_true", help=argparse.SUPPRESS)
    args = parse_args(p, argv, SMOKE)
    if args.floor_server:
        return serve_floor()
    deadline = Deadline(args.timeout)
    phases = PHASES if args.phases is None else [_phase(spec, p) for spec in args.phases.split(",")]

    work, remove = workdir(p, args.workdir, args.keep, "lakefeed-bench-push-")
    report: dict[str, Any] = {"bench": "push_api", "smoke": args.smoke, "ok": False, "workdir": str(work),
                              "machine": machine(),
                              "source": source_tree(),
                              "settings": {k: v for k, v in vars(args).items() if k not in ("floor_server",)}
                              | {"phases": [{"records_per_request": b, "format": k, "connections": c}
                                            for b, k, c in phases]}}
    report["settings"]["workdir"] = str(work)
    try:
        say(f"workdir {work}; encoding request bodies")
        bodies: dict[tuple[int, str], list[bytes]] = {}
        for n, (batch, kind, _) in enumerate([*phases, (args.open_batch, "json", 0)]):
            bodies.setdefault((batch, kind), make_bodies(batch, kind, first_id=n * 10**9))
        # The client's own garbage collections would count as server latency: what it holds from here on
        # (modules, bodies) is never garbage, so full collections need not walk it.
        gc.freeze()

        say("http_floor (bare aiohttp, same client and load)")
        floor = run_http_floor(bodies, phases, args, deadline)
        report["http_floor"] = floor

        lf = run_lakefeed(work, bodies, phases, args, deadline)
        report["closed_loop"] = lf["closed_loop"]
        report["open_loop_1k"] = lf["open_loop"]
        report.update({k: lf[k] for k in ("daemon", "delta", "error_samples")})

        say("fsync_floor (same bodies appended here, fsync per request and per group)")
        (work / "fsync").mkdir(exist_ok=True)
        report["fsync_floor"] = {}
        for batch in sorted({b for b, _, _ in phases}):
            deadline.check("running the fsync floor")
            one = fsync_floor(work / "fsync", bodies[(batch, "json")], batch, 1, args.fsync_seconds)
            grouped = fsync_floor(work / "fsync", bodies[(batch, "json")], batch, FSYNC_GROUP, args.fsync_seconds)
            report["fsync_floor"][str(batch)] = {"per_request": one, f"per_{FSYNC_GROUP}": grouped,
                                                 "group_gain": ratio(grouped["requests_per_s"],
                                                                     one["requests_per_s"])}
            say(f"  {batch:>6}: {one['requests_per_s']:,.0f} req/s fsync each, {grouped['requests_per_s']:,.0f} "
                f"req/s fsync per {FSYNC_GROUP} (fsync p50 {one['fsync_ms']['p50']} ms)")

        say("decode_floor (lakefeed decode + validate + encode, one thread)")
        report["decode_floor"] = {}
        for batch, kind, _ in phases:
            deadline.check("running the decode floor")
            res = decode_floor(work / "lakefeed.yaml", work / "lake" / ENTITY / "table", bodies[(batch, kind)],
                               batch, kind, args.decode_seconds)
            report["decode_floor"][phase_key(batch, kind)] = res
            say(f"  {phase_key(batch, kind):>12}: {res['records_per_s']:>10,} records/s "
                f"({res['ms_per_request']} ms per request)")

        closed, floor_closed = report["closed_loop"], floor["closed_loop"]
        open_, floor_open = report["open_loop_1k"], floor["open_loop"]
        report["ratios"] = {
            "requests_per_s_vs_http_floor": {k: ratio(v["requests_per_s"], floor_closed[k]["requests_per_s"])
                                             for k, v in closed.items()},
            "records_per_s_vs_decode_floor": {k: ratio(v["records_per_s"], report["decode_floor"][k]["records_per_s"])
                                              for k, v in closed.items()},
            "open_loop_p50_ms_minus_http_floor": _minus(open_["latency_ms"]["p50"], floor_open["latency_ms"]["p50"]),
            "open_loop_p99_ms_minus_http_floor": _minus(open_["latency_ms"]["p99"], floor_open["latency_ms"]["p99"]),
        }
        batched = closed.get(phase_key(10_000, "json"), {}).get("records_per_s")
        p99 = open_["p99_all_ms"]
        report["goals"] = {  # None: not measured in this run (--phases without 10000:json)
            f"records_per_s_batched_10k_json >= {GOAL_RECORDS_PER_S}":
                None if batched is None else batched >= GOAL_RECORDS_PER_S,
            f"open_loop p99_ms <= {GOAL_P99_MS:.0f}": p99 is not None and p99 <= GOAL_P99_MS,
        }
        report["machine"]["loadavg_1m_at_end"] = os.getloadavg()[0]
        report["ok"] = True
        say(f"lakefeed 10k batches {batched} records/s (goal >= {GOAL_RECORDS_PER_S:,}); open loop "
            f"{args.open_rate:.0f} req/s p99 {p99} ms (goal <= {GOAL_P99_MS:.0f}); goals {report['goals']}")
        return 0
    except (BenchError, OSError, pa.ArrowException) as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
        say(f"FAILED: {report['error']}")
        return 1
    except KeyboardInterrupt:
        report["error"] = "interrupted"
        return 1
    finally:
        publish(report, work, remove)


def _phase(spec: str, parser: argparse.ArgumentParser) -> tuple[int, str, int]:
    try:
        batch, kind, conns = spec.split(":")
        if kind not in CONTENT_TYPES:
            raise ValueError(kind)
        return int(batch), kind, int(conns)
    except ValueError:
        parser.error(f"--phases: {spec!r} is not RECORDS:FORMAT:CONNECTIONS with FORMAT one of "
                     f"{', '.join(CONTENT_TYPES)}")
        raise


def _minus(a: float | None, b: float | None) -> float | None:
    return round(a - b, 3) if a is not None and b is not None else None


if __name__ == "__main__":
    sys.exit(main())
