"""Lifecycle benchmark: cold start to READY=1, and a reload under load that changes one entity of ten.

Measures, in one run, against real daemons (`python -m lakefeed run`) as subprocesses, each with a
Unix datagram socket of ours as NOTIFY_SOCKET (what systemd sees):

* cold start: spawn -> the `READY=1` datagram, with a fresh lake and state (no checkpoint), for a
  daemon with one push entity (`--cold-runs` times) and, as the first part of the reload run, one
  with `--entities` push entities. Each daemon then gets SIGTERM and must exit 0.
* reload under load: `--entities` push-only entities (`cdc: append`), trigger interval
  `--trigger` s. One open-loop producer per entity sends `--batch` records every 1/`--rate` s
  (at the scheduled time, whatever the answers) and records send time, answer time and status
  of each request. After `--steady` s the first entity's config changes, once per `--changes`:
  `source` (its push source's `rate_limit_per_s`: only that source restarts) and `entity`
  (its `event_time.allowed_lateness_s`: the whole entity restarts), `--after` s apart. Each
  time the file is replaced atomically and the daemon gets SIGHUP; the file watch notices the
  file too, so a second reload that finds nothing to change may follow. reload_s = RELOADING=1
  (its MONOTONIC_USEC) -> the next READY=1, of the reload that restarted something. The commit
  timeline of each entity comes from its table's Delta log (one commit per batch). Then
  every acknowledged record must be in its entity's table exactly once, and SIGTERM must end
  the daemon with 0. The top-level reload figures are the worst over the reloads made; each
  reload's own are under `changes`.

Baseline, in the same run: a bare `SparkSession` (local[2], loopback, no UI, the daemon's
network settings) in a fresh interpreter, spawn -> session up, interleaved with the cold starts.
The ratio lakefeed / bare session shows what lakefeed adds over Spark's own start.

How long the unchanged entities paused: the longest gap between consecutive 202 answers, and
between consecutive commits, that touches the reload window (first RELOADING=1 to last READY=1,
plus `--settle` s), against the longest gap held in the steady window before it. Pooled over the
unchanged entities, that excess is `pause_s`; per entity (each against itself) it is reported
too, but with a handful of commits per window the largest of nine differences is positive from
noise alone. The same figure for a control window (as long as the reload's, right before it,
nothing happening) shows the noise of the run. Gaps jitter on a loaded machine, so "0 s pause"
is taken to mean: a pooled excess of at most one trigger interval (the smallest pause a
micro-batch daemon could be said to have) for acks and for commits, no non-202 answer, no
skipped request, and no stream restarted (same run_id in /status).

Progress goes to stderr; one JSON object goes to stdout at the end. Exit status 0 when the run
completed with every acknowledged record in its table exactly once and exit code 0 from the
daemons (whether or not the pause goal is met), 1 otherwise.

    python bench/lifecycle.py [--cold-runs 3] [--entities 10] [--rate 20] [--steady 32] [--after 26] [--keep]
                              [--smoke]

`--smoke`: one cold start (and bare session), then 2 entities at 5 requests/s with both reloads, 12 s of steady
load before the first and 4 s after each (a control window needs 2 s of steady time beside it), in about a
minute.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import yaml
from _common import (  # bench/ is the script folder, so on sys.path
    CLK_TCK,
    BenchError,
    Deadline,
    cpu_of,
    kill_group,
    parse_args,
    publish,
    say,
)
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

TOKEN = "bench-token-not-a-secret"
SOURCE = "api"
REQUEST_TIMEOUT_S = 30.0
MAX_INFLIGHT = 200  # per entity: beyond it a scheduled request is skipped (and counted)
MIN_BASELINE_S = 8.0  # a steady window shorter than this leaves no room for a control window
SMOKE = {"cold_runs": 1, "entities": 2, "rate": 5.0, "batch": 5, "steady": 12.0, "warmup": 2.0, "after": 4.0,
         "settle": 1.0, "min_baseline": 2.0, "timeout": 300.0}
SPARK_BASELINE = """\
from pyspark.sql import SparkSession
session = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
           .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
print("up", flush=True)
session.stop()
"""


# --------------------------------------------------------------------------- config


def config_doc(entities: int, trigger: float) -> dict[str, Any]:
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    return {"lake_dir": "lake", "state_dir": "state", "log_level": "INFO",
            "spark": {"master": "local[2]", "trigger_interval_s": trigger},
            "http": {"host": "127.0.0.1", "port": 0},
            "entities": [{"name": f"e{i}", "push": [{"name": SOURCE, "tokens_sha256": [digest]}],
                          "cdc": {"strategy": "append"}} for i in range(entities)]}


def write_atomically(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    os.replace(tmp, path)


# --------------------------------------------------------------------------- processes


class Notifications:
    """Every sd_notify datagram a daemon sends, with the (monotonic) time it arrived."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, dict[str, str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="notify", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            at = time.monotonic()
            fields = dict(line.split("=", 1) for line in data.decode(errors="replace").splitlines() if "=" in line)
            self.messages.append((at, fields))

    def find(self, field: str, value: str = "1", start: int = 0) -> int | None:
        """Index of the first message from `start` on carrying field=value."""
        for i in range(start, len(self.messages)):
            if self.messages[i][1].get(field) == value:
                return i
        return None

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


class Daemon:
    """`python -m lakefeed run` in its own session, its log in a file, its datagrams on our socket."""

    def __init__(self, work: Path, doc: dict[str, Any]) -> None:
        self.work = work
        self.config = work / "lakefeed.yaml"
        write_atomically(self.config, doc)
        self.log = work / "daemon.log"
        self.notes = Notifications(work / "notify.sock")
        self.proc: subprocess.Popen | None = None
        self.spawned = 0.0

    def start(self) -> None:
        env = {**os.environ, "NOTIFY_SOCKET": str(self.work / "notify.sock")}
        with open(self.log, "wb") as log_file:
            self.spawned = time.monotonic()
            self.proc = subprocess.Popen([sys.executable, "-m", "lakefeed", "run", "--config", str(self.config)],
                                         cwd=self.work, env=env, stdin=subprocess.DEVNULL, stdout=log_file,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def wait_note(self, field: str, start: int, deadline: Deadline, what: str, limit_s: float = 300.0) -> int:
        """Index of the next datagram with field=1 from `start` on; fails if the daemon exits first."""
        assert self.proc is not None
        give_up = time.monotonic() + limit_s
        while (found := self.notes.find(field, "1", start)) is None:
            if self.proc.poll() is not None:
                raise BenchError(f"daemon exited with {self.proc.returncode} while {what}\n{self.tail()}")
            deadline.check(what)
            if time.monotonic() > give_up:
                raise BenchError(f"no {field}=1 within {limit_s:.0f}s while {what}")
            time.sleep(0.01)
        return found

    def url(self) -> str:
        return json.loads((self.work / "state" / "http.json").read_text())["url"]

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """The daemon's JSON log events. The JVM writes to the same file, and now and then a line of
        its output lands on the same line as an event, before or after it: decode from the `{`."""
        out, decoder = [], json.JSONDecoder()
        for line in self.log.read_bytes().splitlines():
            start = line.find(b'{"')
            if start < 0:
                continue  # Spark / JVM output
            try:
                event, _ = decoder.raw_decode(line[start:].decode(errors="replace"))
            except ValueError:
                continue
            if isinstance(event, dict) and "event" in event and (name is None or event["event"] == name):
                out.append(event)
        return out

    def stop(self, timeout: float) -> tuple[int | None, float]:
        """SIGTERM; (exit code or None when it did not exit in time, seconds it took)."""
        assert self.proc is not None
        t = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                return None, time.monotonic() - t
        return self.proc.returncode, time.monotonic() - t

    def kill(self) -> None:
        """SIGKILL what is left of the daemon's session (its JVM, Python workers)."""
        if self.proc is not None:
            kill_group(self.proc)
        self.notes.close()

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def log_time(event: dict[str, Any], wall_minus_mono: float) -> float:
    """A log line's (wall, UTC) timestamp on this process's monotonic clock."""
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp() - wall_minus_mono


def wall_minus_mono() -> float:
    return min(time.time() - time.monotonic() for _ in range(5))


def get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=30) as resp:  # noqa: S310 (http://127.0.0.1 only)
        return json.load(resp)


def run_ids(url: str) -> dict[str, str | None]:
    entities = get_json(f"{url}/status")["entities"]
    return {n: e["streams"][SOURCE]["run_id"] for n, e in entities.items()}


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def cpu_sample(session: int) -> dict[str, float]:
    """CPU seconds so far: this process, the daemon's session (daemon, JVM, workers), the whole machine."""
    daemon = 0.0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                sid, cpu = cpu_of(int(entry))
            except (OSError, ValueError, IndexError):
                continue
            if sid == session:
                daemon += cpu
    with open("/proc/stat", encoding="ascii") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    machine = (sum(ticks[:8]) - ticks[3] - ticks[4]) / CLK_TCK
    return {"client": time.process_time(), "daemon": daemon, "machine": machine, "at": time.monotonic()}


def cores_used(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    wall = after["at"] - before["at"]
    out = {k: round((after[k] - before[k]) / wall, 2) for k in ("client", "daemon", "machine")}
    out["others"] = round(out["machine"] - out["client"] - out["daemon"], 2)  # work of other programs
    return out


# --------------------------------------------------------------------------- cold start


def spark_baseline(deadline: Deadline) -> float:
    """Seconds from spawning a fresh interpreter to a bare local[2] SparkSession being up."""
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", SPARK_BASELINE], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert proc.stdout is not None
        while not select.select([proc.stdout], [], [], 0.2)[0]:
            deadline.check("starting a bare SparkSession")
            if time.monotonic() - t0 > 300:
                raise BenchError("the bare SparkSession was not up within 300s")
        line = proc.stdout.readline()
        up = time.monotonic() - t0
        if line.strip() != b"up":
            raise BenchError(f"the bare SparkSession did not come up (exit {proc.wait(60)})")
        if proc.wait(120) != 0:
            raise BenchError(f"the bare SparkSession exited with {proc.returncode}")
        return up
    finally:
        kill_group(proc)


def cold_start(work: Path, entities: int, trigger: float, deadline: Deadline) -> dict[str, Any]:
    """Spawn -> READY=1 of a fresh daemon, then SIGTERM -> exit."""
    work.mkdir(parents=True)
    daemon = Daemon(work, config_doc(entities, trigger))
    try:
        daemon.start()
        ready = daemon.wait_note("READY", 0, deadline, "waiting for READY=1")
        result = startup_breakdown(daemon, daemon.notes.messages[ready][0])
        code, took = daemon.stop(120)
        result.update(exit_code=code, shutdown_s=round(took, 2))
        if code != 0:
            raise BenchError(f"daemon exited with {code} after SIGTERM\n{daemon.tail()}")
        return result
    finally:
        daemon.kill()


def startup_breakdown(daemon: Daemon, ready_at: float) -> dict[str, Any]:
    """READY=1 after spawn, and from the log when the HTTP server listened and each entity started."""
    offset = wall_minus_mono()
    since = {e["event"] + (f":{e['entity']}" if "entity" in e else ""): round(log_time(e, offset) - daemon.spawned, 2)
             for e in daemon.events() if e["event"] in ("http.listening", "entity.started")}
    started = sorted(v for k, v in since.items() if k.startswith("entity.started"))
    return {"ready_s": round(ready_at - daemon.spawned, 3), "http_listening_s": since.get("http.listening"),
            "first_entity_started_s": started[0] if started else None,
            "last_entity_started_s": started[-1] if started else None}


# --------------------------------------------------------------------------- load


class Load:
    """One open-loop producer per entity: `batch` records every 1/`rate` s, whatever the answers."""

    def __init__(self, url: str, entities: list[str], rate: float, batch: int) -> None:
        self.url, self.entities, self.rate, self.batch = url, entities, rate, batch
        # per entity: (request no, scheduled at, answered at, status); times on time.monotonic()
        self.requests: dict[str, list[tuple[int, float, float, str]]] = {e: [] for e in entities}
        self.skipped: Counter = Counter()
        self.started = self.stopped = 0.0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)

    def start(self) -> None:
        self.started = time.monotonic()
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def abort(self) -> None:
        """Stop without judging (clean-up after a failure)."""
        self._stop.set()
        self._thread.join(REQUEST_TIMEOUT_S + 5)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(REQUEST_TIMEOUT_S + 30)
        self.stopped = time.monotonic()
        if self._thread.is_alive():
            raise BenchError("the load did not stop")
        if self.error is not None:
            raise BenchError(f"the load failed: {self.error!r}")

    def ids(self, entity: str, n: int) -> range:
        return range(n * self.batch, (n + 1) * self.batch)

    def sent(self, entity: str) -> set[int]:
        return {i for n, *_ in self.requests[entity] for i in self.ids(entity, n)}

    def acked(self, entity: str) -> set[int]:
        return {i for n, _, _, s in self.requests[entity] if s == "202" for i in self.ids(entity, n)}

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by stop()
            self.error = exc

    async def _main(self) -> None:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector,
                                         timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as session:
            await asyncio.gather(*(self._produce(session, e, i) for i, e in enumerate(self.entities)))

    async def _produce(self, session: aiohttp.ClientSession, entity: str, index: int) -> None:
        url = f"{self.url}/v1/entities/{entity}/sources/{SOURCE}/records"
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        t0 = time.monotonic() + index / (self.rate * len(self.entities))  # producers staggered
        inflight: set[asyncio.Task] = set()
        n = 0
        while not self._stop.is_set():
            at = t0 + n / self.rate
            if (delay := at - time.monotonic()) > 0:
                await asyncio.sleep(delay)
            if len(inflight) >= MAX_INFLIGHT:
                self.skipped[entity] += 1
            else:
                body = json.dumps([{"id": i, "entity": entity, "request": n} for i in self.ids(entity, n)])
                task = asyncio.create_task(self._send(session, url, headers, body.encode(), entity, n, at))
                inflight.add(task)
                task.add_done_callback(inflight.discard)
            n += 1
        await asyncio.gather(*inflight)

    async def _send(self, session: aiohttp.ClientSession, url: str, headers: dict[str, str], body: bytes,
                    entity: str, n: int, at: float) -> None:
        try:
            async with session.post(url, data=body, headers=headers) as resp:
                await resp.read()
                status = str(resp.status)
        except (aiohttp.ClientError, TimeoutError) as exc:
            status = type(exc).__name__
        self.requests[entity].append((n, at, time.monotonic(), status))


# --------------------------------------------------------------------------- analysis


def max_gap(times: list[float], lo: float, hi: float, rule: str) -> float | None:
    """The longest interval between consecutive events in [lo, hi] by `rule`: "inside" (both ends in
    it), "touching" (any overlap) or "ending" (it ends in it).

    A reload window counts every silence that touches it; a baseline counts only the ones it holds
    whole, so that a pause a reload caused never raises it; a control window right before a reload
    counts the ones that end in it, as the reload window would, but not one the reload began."""
    t = sorted(times)
    pairs = zip(t, t[1:], strict=False)
    keep = {"inside": lambda a, b: lo <= a and b <= hi, "touching": lambda a, b: b > lo and a < hi,
            "ending": lambda a, b: lo < b <= hi}[rule]
    gaps = [b - a for a, b in pairs if keep(a, b)]
    return round(max(gaps), 3) if gaps else None


RULES = {"steady": "inside", "reload": "touching", "control": "ending"}


def p99_ms(requests: list[tuple[int, float, float, str]], lo: float, hi: float) -> float | None:
    """p99 of the 202 latency (scheduled -> answered) of the requests scheduled in [lo, hi], in ms."""
    values = [done - at for _, at, done, s in requests if s == "202" and lo <= at <= hi]
    return round(float(np.percentile(values, 99)) * 1000, 1) if values else None


def entity_figures(load: Load, entity: str, commits: list[float], windows: dict[str, tuple[float, float]],
                   reloading: tuple[float, float]) -> dict[str, Any]:
    """Per window: the longest ack and commit gap, the commits, the ack p99. Then commits while
    reloading (RELOADING=1 .. READY=1) and the commit times around it, in s after RELOADING=1."""
    requests = load.requests[entity]
    acks = [done for _, _, done, s in requests if s == "202"] + [load.stopped]  # silence until the end counts
    commits = [*commits, load.stopped]
    lo, hi = windows["reload"]
    return {
        "ack_gap_s": {w: max_gap(acks, *span, RULES[w]) for w, span in windows.items()},
        "commit_gap_s": {w: max_gap(commits, *span, RULES[w]) for w, span in windows.items()},
        "commits": {w: sum(a <= c <= b for c in commits[:-1]) for w, (a, b) in windows.items()},
        "ack_p99_ms": {w: p99_ms(requests, *span) for w, span in windows.items()},
        "non_202": dict(Counter(s for _, at, _, s in requests if s != "202" and lo - 1 <= at <= hi)),
        "commits_while_reloading": sum(reloading[0] <= c <= reloading[1] for c in commits[:-1]),
        "commit_times_s": [round(c - reloading[0], 2) for c in commits[:-1] if lo - 3 <= c <= hi],
    }


def unchanged_figures(unchanged: dict[str, dict[str, Any]], merged_acks: list[float],
                      windows: dict[str, tuple[float, float]]) -> dict[str, Any]:
    """The pause of the unchanged entities. Pooled: the longest gap of any of them in the reload
    window against the longest of any of them in the steady window (`pause_s`, with the same
    figure for the control window, where nothing happened: the noise). Per entity: the largest of
    the nine differences (each entity against itself), positive from noise alone with a few
    commits per window. Silence of all: the longest time none of them got a 202 (a stall of the
    whole daemon, e.g. its event loop or GIL, silences all of them at once)."""
    out: dict[str, Any] = {}
    for kind in ("ack_gap", "commit_gap"):
        pooled = {w: _max(f[f"{kind}_s"][w] for f in unchanged.values()) for w in windows}
        out[f"max_{kind}_s"] = pooled
        out[f"{kind}_excess_pooled_s"] = {w: _minus(pooled[w], pooled["steady"]) for w in windows if w != "steady"}
        out[f"max_{kind}_excess_s"] = _max(_minus(f[f"{kind}_s"]["reload"], f[f"{kind}_s"]["steady"])
                                           for f in unchanged.values())
    out["pause_s"] = {k: None if (x := out[f"{k}_gap_excess_pooled_s"]["reload"]) is None else max(0.0, x)
                      for k in ("ack", "commit")}
    out["max_silence_of_all_s"] = {w: max_gap(merged_acks, *span, RULES[w]) for w, span in windows.items()}
    # A slowdown is not a stop: the nine's commits per second in each window, and whether each kept committing.
    out["commits_per_s"] = {w: round(sum(f["commits"][w] for f in unchanged.values()) / (b - a), 2)
                            for w, (a, b) in windows.items()}
    out["min_commits_while_reloading"] = min(f["commits_while_reloading"] for f in unchanged.values())
    out["non_202"] = sum(sum(f["non_202"].values()) for f in unchanged.values())
    return out


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 3)


def _max(values: Any) -> float | None:
    values = list(values)
    return None if not values or None in values else max(values)


def commit_times(table: Path, wall_minus_mono: float) -> list[float]:
    """When each batch was committed to the table (the Delta log's commit timestamps, ms), on our clock."""
    return sorted(c["timestamp"] / 1000 - wall_minus_mono for c in DeltaTable(str(table)).history()
                  if "lakefeed.batch_id" in c)


def check_tables(lake: Path, load: Load, names: list[str]) -> dict[str, int]:
    """Every acknowledged record in its entity's table, each once; nothing that was never sent."""
    out = Counter(records_acked=0, records_lost=0, duplicates=0, unexpected_records=0, unacked_but_stored=0)
    for e in names:
        stored, acked, sent = table_ids(lake, e), load.acked(e), load.sent(e)
        out["records_acked"] += len(acked)
        out["records_lost"] += len(acked - set(stored))
        out["duplicates"] += sum(c - 1 for c in stored.values() if c > 1)
        out["unexpected_records"] += len(set(stored) - sent)
        out["unacked_but_stored"] += len((sent - acked) & set(stored))  # e.g. a timed-out request
    return dict(out)


def table_ids(lake: Path, entity: str) -> Counter:
    try:
        ids = DeltaTable(str(lake / entity / "table")).to_pyarrow_table(columns=["id"]).column("id").to_pylist()
    except TableNotFoundError:
        return Counter()
    return Counter(ids)


# --------------------------------------------------------------------------- reload under load

# What a reload changes in the first entity: a push source only (that source restarts), or the
# entity itself (the whole entity restarts). Both leave what the entity stores unchanged.
CHANGES: dict[str, tuple[str, Callable[[dict[str, Any]], None]]] = {
    "source": ("push source rate_limit_per_s", lambda e: e["push"][0].update(rate_limit_per_s=100000.0)),
    "entity": ("event_time.allowed_lateness_s", lambda e: e.update(event_time={"source": "system",
                                                                                  "allowed_lateness_s": 60.0})),
}


def reload_under_load(work: Path, args: argparse.Namespace, deadline: Deadline) -> tuple[dict, dict]:
    """(the cold start of the N-entity daemon, the reload figures)."""
    work.mkdir(parents=True)
    doc = config_doc(args.entities, args.trigger)
    names = [e["name"] for e in doc["entities"]]
    daemon = Daemon(work, doc)
    load: Load | None = None
    try:
        daemon.start()
        ready = daemon.wait_note("READY", 0, deadline, "waiting for READY=1")
        cold = startup_breakdown(daemon, daemon.notes.messages[ready][0])
        assert daemon.proc is not None
        say(f"{args.entities} entities: READY=1 after {cold['ready_s']:.1f}s; load {args.rate:g} req/s x "
            f"{args.batch} records per entity for {args.steady:g}s")
        url = daemon.url()
        cpu_before = cpu_sample(daemon.proc.pid)
        load = Load(url, names, args.rate, args.batch)
        load.start()
        sleep_watching(daemon, load, args.steady, deadline, "steady load")
        load_mid = loadavg()
        marks = []
        for kind in args.changes:
            what, change = CHANGES[kind]
            ids_before = run_ids(url)
            say(f"reload: {names[0]}'s {what} changes; file replaced, then SIGHUP")
            change(doc["entities"][0])
            first = len(daemon.notes.messages)
            write_atomically(daemon.config, doc)
            daemon.proc.send_signal(signal.SIGHUP)
            signalled = time.monotonic()
            reloading = daemon.wait_note("RELOADING", first, deadline, "waiting for RELOADING=1", 120)
            back = daemon.wait_note("READY", reloading, deadline, "waiting for READY=1 after the reload", 120)
            say(f"  READY=1 {daemon.notes.messages[back][0] - daemon.notes.messages[reloading][0]:.2f}s "
                "after RELOADING=1")
            sleep_watching(daemon, load, args.after, deadline, "load after the reload")
            # The file watch notices the replaced file too: a second reload (nothing left to change) may follow.
            marks.append({"kind": kind, "what": what, "signalled": signalled, "ids_before": ids_before,
                          "pairs": reload_pairs(daemon, first, deadline), "ids_after": run_ids(url)})
        load.stop()
        cpu_after = cpu_sample(daemon.proc.pid)
        say(f"load stopped: {sum(len(load.acked(e)) for e in names)} records acknowledged; waiting for the tables")
        drain_s = wait_tables(work / "lake", load, names, deadline)
        code, took = daemon.stop(120)
        say(f"daemon exited with {code} after {took:.1f}s")
        changes = analyse(daemon, load, names, marks, args)
        if args.keep:  # the raw timeline, to look at what the figures summarise
            (work / "timeline.json").write_text(json.dumps({
                "load_started": load.started, "load_stopped": load.stopped, "requests": load.requests,
                "notifications": daemon.notes.messages, "wall_minus_mono": wall_minus_mono()}))
        return cold, {
            "entities": args.entities, "rate_per_entity_per_s": args.rate, "records_per_request": args.batch,
            "trigger_interval_s": args.trigger, **summarise(changes, load, names), "changes": changes,
            **check_tables(work / "lake", load, names),
            "drain_s": drain_s, "exit_code": code, "shutdown_s": round(took, 2),
            "cpu_cores_during_load": cores_used(cpu_before, cpu_after), "loadavg_before_reload": load_mid,
        }
    except BaseException:
        say("daemon log tail:\n" + daemon.tail())
        raise
    finally:
        if load is not None and load.alive():
            load.abort()
        daemon.kill()


def summarise(changes: list[dict[str, Any]], load: Load, names: list[str]) -> dict[str, Any]:
    """The worst over the reloads made (each reload's own figures stay under `changes`)."""
    return {
        "reload_s": _max(c["reload_s"] for c in changes),
        "changed_entity": {"name": names[0], "run_id_changed": all(c["changed_entity"]["run_id_changed"]
                                                                   for c in changes),
                           "unavailable_503": sum(c["changed_entity"]["unavailable_503"] for c in changes),
                           "pause_ack_s": _max(c["changed_entity"]["pause_ack_s"] for c in changes),
                           "pause_commit_s": _max(c["changed_entity"]["pause_commit_s"] for c in changes)},
        "unchanged": {
            "pause_s": {k: _max(c["unchanged"]["pause_s"][k] for c in changes) for k in ("ack", "commit")},
            "max_ack_gap_excess_s": _max(c["unchanged"]["max_ack_gap_excess_s"] for c in changes),
            "max_commit_gap_excess_s": _max(c["unchanged"]["max_commit_gap_excess_s"] for c in changes),
            "noise_control_excess_s": {k: _max(c["unchanged"][f"{k}_gap_excess_pooled_s"]["control"]
                                               for c in changes if "control" in c["windows_s"])
                                       for k in ("ack", "commit")},
            "max_silence_of_all_s": _max(c["unchanged"]["max_silence_of_all_s"]["reload"] for c in changes),
            "min_commits_while_reloading": min(c["unchanged"]["min_commits_while_reloading"] for c in changes),
            "non_202": sum(c["unchanged"]["non_202"] for c in changes),
            "skipped": sum(load.skipped[e] for e in names[1:]),
            "run_ids_unchanged": all(c["unchanged"]["run_ids_unchanged"] for c in changes)},
    }


def analyse(daemon: Daemon, load: Load, names: list[str], marks: list[dict[str, Any]],
            args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per reload made: its duration and steps, the changed entity's unavailability, the others' pause.

    Windows: `reload` from RELOADING=1 to the last READY=1 plus `--settle` s (L s long); `steady`
    from the end of the previous reload's window (or `--warmup` s into the load) to RELOADING=1.
    When the steady time is long enough (as with the default `--steady` and `--after`), its last
    L s become `control`: a window as long as the reload's, right before it, where nothing happened;
    its excess over the (then shorter) steady window is what noise alone gives."""
    offset = wall_minus_mono()
    events = daemon.events()
    commits = {e: commit_times(daemon.work / "lake" / e / "table", offset) for e in names}
    applied = [e for e in events if e["event"] == "reload.applied"]
    step_names = ("entity.stopped", "entity.started", "entity.reconfigured")
    steps = [(log_time(e, offset), e["event"]) for e in events
             if e.get("entity") == names[0] and e["event"] in step_names]
    changed, out = names[0], []
    since = load.started + args.warmup
    pairs_before = 0
    for k, mark in enumerate(marks):
        pairs = mark["pairs"]
        lo, hi = pairs[0][0], pairs[-1][1]
        until = marks[k + 1]["pairs"][0][0] if k + 1 < len(marks) else load.stopped
        end = min(until, hi + args.settle)
        windows = {"steady": (since, lo), "reload": (lo, end)}
        if lo - (end - lo) - since >= args.min_baseline:
            windows = {"steady": (since, lo - (end - lo)), "control": (lo - (end - lo), lo), "reload": (lo, end)}
        reloads = [{"reload_s": round(ready - start, 3), "after_sighup_s": round(start - mark["signalled"], 3),
                    "restarted": info.get("restarted"), "sources_restarted": info.get("sources_restarted")}
                   for (start, ready), info in zip(pairs, applied[pairs_before:], strict=False)]
        pairs_before += len(pairs)
        measured = next((r for r in reloads if r["restarted"] or r["sources_restarted"]), None)
        per_entity = {e: entity_figures(load, e, commits[e], windows, (lo, pairs[0][1])) for e in names}
        unchanged = {e: f for e, f in per_entity.items() if e != changed}
        merged = [done for e in unchanged for _, _, done, s in load.requests[e] if s == "202"] + [load.stopped]
        unavailable = [(at, done) for _, at, done, s in load.requests[changed] if s == "503" and lo - 1 <= at <= hi]
        out.append({
            "change": f"{changed}: {mark['what']}", "reload_s": measured["reload_s"] if measured else None,
            "reloads": reloads,
            "steps_after_reloading_s": [(round(t - lo, 3), name) for t, name in steps if lo <= t <= pairs[0][1]],
            "windows_s": {w: [round(a - load.started, 2), round(b - load.started, 2)] for w, (a, b) in windows.items()},
            "changed_entity": {
                "run_id_changed": mark["ids_before"][changed] != mark["ids_after"].get(changed),
                "unavailable_503": len(unavailable),
                "unavailable_s": round(max(d for _, d in unavailable) - min(a for a, _ in unavailable), 3)
                if unavailable else 0.0,
                "pause_ack_s": per_entity[changed]["ack_gap_s"]["reload"],
                "pause_commit_s": per_entity[changed]["commit_gap_s"]["reload"]},
            "unchanged": {**unchanged_figures(unchanged, merged, windows),
                          "run_ids_unchanged": all(mark["ids_before"][e] == mark["ids_after"].get(e)
                                                   for e in unchanged)},
            "per_entity": per_entity,
        })
        since = end
    return out


def sleep_watching(daemon: Daemon, load: Load, seconds: float, deadline: Deadline, what: str) -> None:
    assert daemon.proc is not None
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if daemon.proc.poll() is not None:
            raise BenchError(f"daemon exited with {daemon.proc.returncode} during {what}")
        if not load.alive():
            raise BenchError(f"the load stopped during {what}: {load.error!r}")
        deadline.check(what)
        time.sleep(0.1)


def reload_pairs(daemon: Daemon, first: int, deadline: Deadline) -> list[tuple[float, float]]:
    """(RELOADING=1 as its MONOTONIC_USEC, the next READY=1's arrival) of each reload since message `first`."""
    pairs, i = [], first
    while (r := daemon.notes.find("RELOADING", "1", i)) is not None:
        ready = daemon.wait_note("READY", r, deadline, "waiting for READY=1 after a reload", 120)
        at, fields = daemon.notes.messages[r]
        pairs.append((int(fields["MONOTONIC_USEC"]) / 1e6 if "MONOTONIC_USEC" in fields else at,
                      daemon.notes.messages[ready][0]))
        i = ready + 1
    return pairs


def wait_tables(lake: Path, load: Load, names: list[str], deadline: Deadline, limit_s: float = 180.0) -> float | None:
    """Seconds from the last 202 until every acknowledged record is in its table (None: not within limit_s)."""
    last_ack = max(done for e in names for _, _, done, s in load.requests[e] if s == "202")
    waiting = {e: load.acked(e) for e in names}
    give_up = time.monotonic() + limit_s
    while waiting:
        for e in list(waiting):
            if waiting[e] <= set(table_ids(lake, e)):
                del waiting[e]
        if not waiting:
            break
        if time.monotonic() > give_up or deadline.left() < 60:
            say(f"  still missing records in {sorted(waiting)} after {limit_s:.0f}s")
            return None
        time.sleep(0.5)
    return round(time.monotonic() - last_ack, 2)


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cold-runs", type=int, default=3, help="cold starts of a 1-entity daemon (and bare sessions)")
    p.add_argument("--entities", type=int, default=10)
    p.add_argument("--rate", type=float, default=20.0, help="requests per second per entity")
    p.add_argument("--batch", type=int, default=10, help="records per request")
    p.add_argument("--trigger", type=float, default=0.5, help="spark.trigger_interval_s")
    p.add_argument("--steady", type=float, default=32.0, help="seconds of load before the reload")
    p.add_argument("--warmup", type=float, default=6.0, help="seconds of load not counted as steady")
    p.add_argument("--after", type=float, default=26.0,
                   help="seconds of load after READY=1 of each reload (the next one's steady and control time)")
    p.add_argument("--changes", default="source,entity",
                   help=f"the reloads to make, in order, from {', '.join(CHANGES)} (default: both)")
    p.add_argument("--settle", type=float, default=3.0, help="seconds after READY=1 still counted as the reload")
    p.add_argument("--min-baseline", type=float, default=MIN_BASELINE_S,
                   help=f"steady seconds a control window needs left beside it (default {MIN_BASELINE_S:g})")
    p.add_argument("--timeout", type=float, default=900.0, help="overall deadline in seconds (default 900)")
    p.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parse_args(p, argv, SMOKE)
    args.changes = [c.strip() for c in args.changes.split(",") if c.strip()]
    if not args.changes or set(args.changes) - set(CHANGES):
        p.error(f"--changes: a list of {', '.join(CHANGES)}")
    deadline = Deadline(args.timeout)
    work = Path(tempfile.mkdtemp(prefix="lakefeed-lifecycle-"))
    report: dict[str, Any] = {"bench": "lifecycle", "smoke": args.smoke, "ok": False, "cores": os.cpu_count(),
                              "loadavg_start": loadavg(), "pause_threshold_s": args.trigger}
    try:
        say(f"work folder {work}; {os.cpu_count()} cores, load average {report['loadavg_start']}")
        runs, bare = [], []
        for i in range(args.cold_runs):
            bare.append(round(spark_baseline(deadline), 3))
            say(f"cold start {i + 1}/{args.cold_runs}: bare SparkSession up after {bare[-1]:.2f}s")
            runs.append(cold_start(work / f"cold{i}", 1, args.trigger, deadline))
            say(f"cold start {i + 1}/{args.cold_runs}: lakefeed (1 entity) READY=1 after {runs[-1]['ready_s']:.2f}s, "
                f"exit {runs[-1]['exit_code']} {runs[-1]['shutdown_s']}s after SIGTERM")
        median = statistics.median(r["ready_s"] for r in runs)
        bare_median = statistics.median(bare)
        report["cold_start"] = {"entities": 1, "runs": runs, "median_ready_s": round(median, 3),
                                "spark_session_baseline": {"runs_s": bare, "median_s": round(bare_median, 3)},
                                "ratio": round(median / bare_median, 2),
                                "lakefeed_adds_s": round(median - bare_median, 3)}
        cold10, reload = reload_under_load(work / "reload", args, deadline)
        report["cold_start"][f"with_{args.entities}_entities"] = cold10
        report["reload"] = reload
        unchanged = reload["unchanged"]
        threshold = args.trigger
        pause = unchanged["pause_s"]
        report["goals"] = {
            "unchanged_pause_s == 0": (pause["ack"] is not None and pause["ack"] <= threshold
                                       and pause["commit"] is not None and pause["commit"] <= threshold
                                       and unchanged["non_202"] == 0 and unchanged["skipped"] == 0
                                       and unchanged["run_ids_unchanged"]),
            "changed_entity_restarted": reload["changed_entity"]["run_id_changed"],
            "no_loss_no_duplicates": reload["records_lost"] == 0 and reload["duplicates"] == 0
            and reload["drain_s"] is not None,
        }
        report["loadavg_end"] = loadavg()
        report["ok"] = report["goals"]["no_loss_no_duplicates"] and reload["exit_code"] == 0
        say(f"cold start median {median:.2f}s (bare SparkSession {bare_median:.2f}s, x{median / bare_median:.2f}); "
            f"{args.entities} entities {cold10['ready_s']:.2f}s; reload {[c['reload_s'] for c in reload['changes']]}s; "
            "unchanged entities: "
            f"pause {pause}s (per entity at most ack {unchanged['max_ack_gap_excess_s']}s, commit "
            f"{unchanged['max_commit_gap_excess_s']}s), non-202 {unchanged['non_202']}; "
            f"lost {reload['records_lost']}, duplicates {reload['duplicates']}")
        return 0 if report["ok"] else 1
    except (BenchError, OSError) as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
        say(f"FAILED: {report['error']}")
        return 1
    except KeyboardInterrupt:
        report["error"] = "interrupted"
        return 1
    finally:
        publish(report, work, not args.keep)


if __name__ == "__main__":
    sys.exit(main())
