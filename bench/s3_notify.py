"""S3 notification benchmark: PUT → rows visible in Delta, with S3 event notifications vs listings.

Set-up: a moto server (`moto.server.ThreadedMotoServer`, in a child process) on a free
loopback port; bucket `landing` (the entity's root) and bucket `lake` (its Delta tables, `lake_dir:
s3://lake/tables`). The daemon (`python -m lakefeed run`) runs as a subprocess with one
append entity whose `source` is `type: s3`, in two modes, one after the other, each with a
fresh moto state, lake and daemon:

* notify: a bucket notification (prefix `sales/`, created/removed) to an SQS queue, which
  the entity reads (`notifications: [{type: sqs}]`, long polls of 20 s, the default);
  `reconcile_interval_s: 300` (listings only at start-up during the run);
* listing: no notification (`notifications: []`): lakefeed's own periodic listing finds
  the files, every `--reconcile-interval` seconds (default 1, as the issue's 1 s trigger;
  the config accepts any `reconcile_interval_s` > 0), narrowed by `dated_prefix`.

Beside them, the peer a Spark user would run instead (mode `spark`): Spark's own file source on s3a://
(hadoop-aws, with the jars `lakefeed jars fetch` cached), `readStream.csv` over the landing prefix with the same
trigger, into a delta-spark table in the same lake bucket, with its checkpoint on local disk as lakefeed's state
is (bench/_spark_peer.py). Each trigger lists the prefix. Goal: lakefeed's notify p50 <= 0.5x the peer's.

In each mode, after the daemon is ready, one warm-up file is PUT and waited for (it creates
the tables; reported, not counted). Then `--rate` files/s for `--seconds` (default 10/s for
60 s: 600 files of `--rows` rows, `sales/date=<UTC today>/f-NNNNN.csv`) on an open-loop
schedule: file i is PUT at t0 + i/rate by a pool of threads, whatever earlier PUTs or the
daemon do (`send_lag` reports how late PUTs started). The Spark trigger is the daemon's
default, 1 s (`--trigger`).

Latency of a file = the moment its rows became visible in the Delta table − the moment its
PUT returned (this host's clock for both). The visible moment is the table commit that holds
the file (the changelog gives each file's `batch_id`, the table's commit info carries
`lakefeed.batch_id`): its commit-info `timestamp`, taken by delta-rs (in the daemon) as it
builds the commit, before the commit file is PUT: a lower bound. An upper bound is measured
too: a thread here lists the table's `_delta_log/` every `--poll` s (0.2) and notes when each
commit file first appears (late by up to one poll interval plus a LIST, ~10 ms). The truth
lies between; `latency_s` (the headline, and the goals) uses the commit timestamps,
`latency_seen_s` the listing, and `commit_to_seen_s` is the width of the bracket per file: its
mean minus half a poll interval estimates how early the commit timestamp is (the commit
file's PUT).

Where the time goes, per file (`stages_s`): PUT returned → in the inbox (the daemon's
`file.enqueued` log time; slightly negative when moto's notification is handled before the
PUT's answer arrives here) → its Spark batch starts (the checkpoint's `offsets/N` written) →
the table commit. Also: latency by 10 s window of the schedule (the trend), Spark batch
durations (`offsets/N` → `commits/N`, which includes the manifest upload), files per commit.

After the schedule the run waits until the table holds every row, stops the daemon with
SIGTERM (it must exit 0) and checks that each file's rows are in the table exactly once.
Reported per mode: count, p50/p99/max/mean latency, PUT time, send lag, batches, CPU of
the daemon's processes, moto, this process (the client) and the whole machine during
the schedule; and the ratios listing/notify of p50 and p99.

Progress goes to stderr; one JSON object goes to stdout at the end. Exit status 0 when the
run completed and every file landed exactly once in each mode (whether or not the goals
are met), 1 otherwise.

    python bench/s3_notify.py [--rate 10] [--seconds 60] [--rows 10] [--modes notify,listing]
                              [--reconcile-interval 1] [--trigger 1] [--poll 0.2] [--keep] [--workdir DIR] [--smoke]

`--smoke`: notification mode and the Spark peer (sized for a tiny table: `--peer-conf`, bench/_spark_peer.py's
smoke_conf()), 5 files/s for 2 s each, trigger 0.5 s, in about a minute.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import _spark_peer
import boto3
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import yaml
from _common import (  # bench/ is the script folder, so on sys.path
    BenchError,
    Deadline,
    cpu_of,
    kill_group,
    log_events,
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
from botocore.config import Config as BotoConfig
from deltalake import DeltaTable

REGION = "us-east-1"
KEY_ID, SECRET = "bench", "bench-secret"  # moto takes any
LANDING, LAKE, QUEUE = "landing", "lake", "landing-events"
ENTITY = "bench"
TABLE = f"s3://{LAKE}/tables/{ENTITY}/table"
SPARK_TABLE = "spark_peer/table"  # in the lake bucket
CHANGELOG = f"s3://{LAKE}/tables/{ENTITY}/changelog"
LOG_PREFIX = f"tables/{ENTITY}/table/_delta_log/"
COMMIT_FILE = re.compile(r"(\d{20})\.json$")
GOAL_P50_S, GOAL_P99_S = 1.5, 5.0
GOAL_VS_SPARK = 0.5  # lakefeed's notify p50 over the Spark peer's
WARMUP_FILE = -1
SMOKE = {"rate": 5.0, "seconds": 2.0, "trigger": 0.5, "modes": "notify,spark", "timeout": 300.0,
         "peer_conf": _spark_peer.smoke_conf()}

os.environ.setdefault("AWS_REQUEST_CHECKSUM_CALCULATION", "WHEN_REQUIRED")
os.environ.setdefault("AWS_RESPONSE_CHECKSUM_VALIDATION", "WHEN_REQUIRED")
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")


# --------------------------------------------------------------------------- Spark's own file source on s3a://


def run_spark(moto: Moto, work: Path, args: argparse.Namespace, deadline: Deadline) -> dict[str, Any]:
    """The Spark peer: PUT -> visible in its delta-spark table, measured as lakefeed's modes are."""
    work.mkdir(parents=True)
    moto.prepare(notify=False)
    s3a = {"spark.hadoop.fs.s3a.endpoint": moto.endpoint, "spark.hadoop.fs.s3a.path.style.access": "true",
           "spark.hadoop.fs.s3a.access.key": KEY_ID, "spark.hadoop.fs.s3a.secret.key": SECRET,
           "spark.hadoop.fs.s3a.endpoint.region": REGION, "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
           "spark.hadoop.fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"}
    checkpoint = work / "checkpoint"
    peer_args = ["csv", f"s3a://{LANDING}/sales/", f"s3a://{LAKE}/{SPARK_TABLE}", str(checkpoint), "--schema",
                 "id long, file long, row long", "--trigger", str(args.trigger), "--jars", "delta,s3a", "--recursive",
                 *(f"--conf={key}={value}" for key, value in s3a.items()), *_spark_peer.conf_args(args.peer_conf)]
    log_path = work / "spark.log"
    s3 = moto.client("s3")
    seen_commits: dict[str, str] = {}

    def visible() -> dict[str, float]:
        listed = s3.list_objects_v2(Bucket=LAKE, Prefix=f"{SPARK_TABLE}/_delta_log/").get("Contents", [])
        for obj in listed:
            if obj["Key"].endswith(".json") and obj["Key"] not in seen_commits:
                seen_commits[obj["Key"]] = s3.get_object(Bucket=LAKE, Key=obj["Key"])["Body"].read().decode()
        return _spark_peer.visible([seen_commits[k] for k in sorted(seen_commits)], checkpoint)

    def wait_files(names: set[str], what: str) -> None:
        while not names <= visible().keys():
            deadline.check(f"waiting for the Spark peer: {what}")
            if proc.poll() is not None:
                raise BenchError(f"the Spark peer exited with {proc.returncode}: {log_tail(log_path)}")
            time.sleep(args.poll)

    s3.put_object(Bucket=LANDING, Key="sales/", Body=b"")  # Spark's file source wants its folder to exist
    t0 = time.time()
    proc = _spark_peer.start(peer_args, log_path)
    try:
        startup_s = time.time() - t0
        s3.put_object(Bucket=LANDING, Key=key_of(WARMUP_FILE), Body=csv_body(WARMUP_FILE, args.rows))
        wait_files({key_of(WARMUP_FILE).rsplit("/", 1)[1]}, "the warm-up file")
        say(f"[spark] peer ready after {startup_s:.1f} s, warm-up file visible; {args.rate:g} files/s")
        puts = put_schedule(moto, args, deadline)
        names = {put["url"].rsplit("/", 1)[1]: put for put in puts}
        wait_files(set(names), "every file")
        code = stop_process(proc, timeout=max(deadline.left(), 5.0))
        when = visible()
        rows = DeltaTable(f"s3://{LAKE}/{SPARK_TABLE}", storage_options=moto.delta_options()).to_pyarrow_table()
        per_file = dict(zip(*[c.to_pylist() for c in pc.value_counts(rows.column("file")).flatten()], strict=True))
        exactly_once = all(per_file.get(i, 0) == args.rows for i in [WARMUP_FILE, *range(len(puts))]) \
            and rows.num_rows == (len(puts) + 1) * args.rows
        out = {"mode": "spark", "files": len(puts), "exactly_once": exactly_once, "exit_code": code,
               "startup_s": round(startup_s, 1),
               "latency_s": percentiles([when[name] - put["done"] for name, put in names.items()]),
               "commits": len({when[name] for name in names})}
        say(f"[spark] latency p50 {out['latency_s']['p50']} s, p99 {out['latency_s']['p99']} s; "
            f"exactly once: {exactly_once}")
        return out
    except BaseException:
        say(f"[spark] peer log tail:\n{log_tail(log_path)}")
        raise
    finally:
        kill_group(proc)


# --------------------------------------------------------------------------- moto


def serve_moto() -> int:
    """The moto server (run as `s3_notify.py --moto-server`): print its endpoint, serve until SIGTERM."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one INFO line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(json.dumps({"endpoint": f"http://{host}:{port}"}), flush=True)
    stop.wait()
    server.stop()
    return 0


class Moto:
    """moto's threaded server on a free loopback port, in a child process: in this one, a deltalake call
    holding the GIL while it waits for moto's answer would wait forever (moto needs the GIL to answer)."""

    def __init__(self, deadline: Deadline) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--moto-server"], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, start_new_session=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # the server prints its endpoint once listening
        deadline.check("starting moto")
        if not line:
            raise BenchError(f"the moto server exited with {self.proc.wait()} before listening")
        self.endpoint = json.loads(line)["endpoint"]

    def cpu(self) -> float:
        try:
            return cpu_of(self.proc.pid)[1]
        except OSError:
            return 0.0

    def client(self, service: str, pool: int = 10) -> Any:
        return boto3.client(service, endpoint_url=self.endpoint, region_name=REGION, aws_access_key_id=KEY_ID,
                            aws_secret_access_key=SECRET,
                            config=BotoConfig(retries={"mode": "standard"}, max_pool_connections=pool))

    def reset(self) -> None:
        req = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        with urllib.request.urlopen(req, timeout=30) as resp:
            if resp.status != 200:
                raise BenchError(f"moto reset answered {resp.status}")

    def prepare(self, notify: bool) -> str | None:
        """Fresh buckets; with `notify`, the landing bucket's events go to a new queue (its URL)."""
        self.reset()
        s3 = self.client("s3")
        s3.create_bucket(Bucket=LANDING)
        s3.create_bucket(Bucket=LAKE)
        if not notify:
            return None
        sqs = self.client("sqs")
        url = sqs.create_queue(QueueName=QUEUE)["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        s3.put_bucket_notification_configuration(Bucket=LANDING, NotificationConfiguration={"QueueConfigurations": [
            {"QueueArn": arn, "Events": ["s3:ObjectCreated:*", "s3:ObjectRemoved:*"],
             "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": "sales/"}]}}}]})
        return url

    def delta_options(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ALLOW_HTTP": "true", "AWS_REGION": REGION,
                "AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET}

    def stop(self) -> None:
        stop_process(self.proc, 10)
        kill_group(self.proc)


# --------------------------------------------------------------------------- the daemon


def write_config(work: Path, moto: Moto, queue_url: str | None, args: argparse.Namespace) -> Path:
    notifications = [{"type": "sqs", "queue_url": queue_url}] if queue_url else []
    doc = {
        "lake_dir": f"s3://{LAKE}/tables",
        "state_dir": "state",
        "log_level": "INFO",
        "spark": {"master": "local[2]", "trigger_interval_s": args.trigger},
        "http": {"host": "127.0.0.1", "port": 0},
        "storage": {"endpoint_override": moto.endpoint, "region": REGION, "access_key_id": KEY_ID,
                    "secret_access_key": SECRET},
        "entities": [{
            "name": ENTITY,
            "source": {"type": "s3", "url": f"s3://{LANDING}/", "notifications": notifications,
                       "reconcile_interval_s": args.reconcile_interval if not queue_url else 300,
                       "dated_prefix": "sales/date=%Y-%m-%d/", "listing_lookback_s": 86400},
            "patterns": [{"name": "any", "root_location": "sales", "regular_expression": r"/.+\.csv"}],
            "format": {"kind": "csv", "header": True},
            "cdc": {"strategy": "append"},
        }],
    }
    path = work / "lakefeed.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def session_cpu(sid: int) -> float:
    """CPU seconds of the live processes of a session (the daemon, its JVM and Python workers)."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*"):
        try:
            session, cpu = cpu_of(int(stat.name))
        except (OSError, ValueError, IndexError):
            continue
        if session == sid:
            total += cpu
    return total


class Daemon:
    def __init__(self, work: Path, config: Path) -> None:
        self.log_path = work / "daemon.log"
        self.config = config
        self.work = work
        self.proc: subprocess.Popen | None = None
        self.pos = 0
        self.events: list[dict] = []

    def start(self, deadline: Deadline) -> float:
        t = time.perf_counter()
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "lakefeed", "run", "--config", str(self.config)],
                                         cwd=self.work, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        while not any(e["event"] == "daemon.ready" for e in self.poll()):
            deadline.check("waiting for daemon.ready")
            time.sleep(0.2)
        return time.perf_counter() - t

    def poll(self) -> list[dict]:
        """New log events; fails on a daemon that exited or reported a failure."""
        new, self.pos = log_events(self.log_path, self.pos)
        self.events += new
        for ev in new:
            if ev["event"] in ("entity.failed", "daemon.failed"):
                raise BenchError(f"daemon reported {ev['event']}: {json.dumps(ev)[:2000]}")
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise BenchError(f"daemon exited with {self.proc.returncode}")
        return new

    def count(self, name: str, field: str | None = None) -> int:
        return sum((e.get(field) or 0) if field else 1 for e in self.events if e["event"] == name)

    def stop(self, timeout: float) -> tuple[int | None, float]:
        assert self.proc is not None
        t = time.perf_counter()
        code = stop_daemon(self.proc, timeout)
        return code, time.perf_counter() - t


# --------------------------------------------------------------------------- the table


class CommitWatcher(threading.Thread):
    """Lists the table's _delta_log/ every `interval` s; when each commit file was first seen."""

    def __init__(self, moto: Moto, interval: float) -> None:
        super().__init__(name="commit-watcher", daemon=True)
        self.s3 = moto.client("s3")
        self.interval = interval
        self.seen: dict[int, float] = {}
        self.lists = 0
        self.list_s: list[float] = []
        self.error: str | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        last = ""
        while not self._halt.is_set():
            t = time.time()
            try:
                got = self.s3.list_objects_v2(Bucket=LAKE, Prefix=LOG_PREFIX, StartAfter=last or LOG_PREFIX)
            except Exception as exc:  # noqa: BLE001 - reported, the bracket then has gaps
                self.error = f"{type(exc).__name__}: {exc}"
                got = {}
            now = time.time()
            self.lists += 1
            self.list_s.append(now - t)
            for obj in got.get("Contents", ()):
                m = COMMIT_FILE.search(obj["Key"])
                if m:
                    self.seen.setdefault(int(m.group(1)), now)
                    last = max(last, obj["Key"])
            self._halt.wait(max(0.0, self.interval - (time.time() - t)))

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)


def table_rows(moto: Moto) -> int:
    """Rows in the table from its add actions (no data read); 0 before it exists."""
    try:
        table = DeltaTable(TABLE, storage_options=moto.delta_options())
    except Exception:  # noqa: BLE001 - not created yet
        return 0
    actions = pa.table(table.get_add_actions(flatten=True))
    return int(pc.sum(actions.column("num_records")).as_py() or 0) if actions.num_rows else 0


def wait_rows(moto: Moto, daemon: Daemon, expected: int, timeout: float, deadline: Deadline, what: str) -> float:
    """Wait until the table holds `expected` rows; the seconds it took."""
    t = time.perf_counter()
    last_report = t
    while (rows := table_rows(moto)) < expected:
        daemon.poll()
        deadline.check(f"waiting for {what} ({rows}/{expected} rows)")
        if time.perf_counter() - t > timeout:
            raise BenchError(f"{what}: {rows}/{expected} rows visible after {timeout:.0f} s")
        if time.perf_counter() - last_report > 10:
            say(f"  {rows:,}/{expected:,} rows visible")
            last_report = time.perf_counter()
        time.sleep(0.5)
    return time.perf_counter() - t


# --------------------------------------------------------------------------- the schedule


def csv_body(file_no: int, rows: int) -> bytes:
    first = file_no * rows
    return ("id,file,row\n" + "".join(f"{first + r},{file_no},{r}\n" for r in range(rows))).encode()


def key_of(file_no: int) -> str:
    name = "warmup.csv" if file_no == WARMUP_FILE else f"f-{file_no:05d}.csv"
    return f"sales/date={datetime.now(UTC):%Y-%m-%d}/{name}"


def put_schedule(moto: Moto, args: argparse.Namespace, deadline: Deadline) -> list[dict[str, Any]]:
    """Open loop: file i PUT at t0 + i/rate by a thread pool; each file's scheduled, start and done times."""
    n = round(args.rate * args.seconds)
    s3 = moto.client("s3", pool=args.put_threads)
    bodies = [csv_body(i, args.rows) for i in range(n)]
    puts: list[dict[str, Any]] = [{} for _ in range(n)]

    def put(i: int, at: float) -> None:
        start, key = time.time(), key_of(i)
        s3.put_object(Bucket=LANDING, Key=key, Body=bodies[i], ContentType="text/csv")
        puts[i] = {"scheduled": at, "start": start, "done": time.time(), "url": f"s3://{LANDING}/{key}"}

    futures: list[Future] = []
    t0 = time.time() + 0.2
    with ThreadPoolExecutor(args.put_threads) as pool:
        for i in range(n):
            at = t0 + i / args.rate
            pause = at - time.time()
            if pause > 0:
                time.sleep(pause)
            futures.append(pool.submit(put, i, at))
            if i % max(1, round(args.rate * 10)) == 0 and i:
                deadline.check("putting files")
                say(f"  {i:,}/{n:,} files PUT")
    for f in futures:
        f.result()  # a failed PUT fails the run
    return puts


def ts(event: dict) -> float:
    return datetime.fromisoformat(event["timestamp"]).timestamp()


def mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def percentiles(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"count": 0, "p50": None, "p99": None, "max": None, "mean": None, "min": None}
    a = np.asarray(values)
    return {"count": len(values), "p50": round(float(np.percentile(a, 50)), 3),
            "p99": round(float(np.percentile(a, 99)), 3), "max": round(float(a.max()), 3),
            "mean": round(float(a.mean()), 3), "min": round(float(a.min()), 3)}


def run_mode(mode: str, moto: Moto, work: Path, args: argparse.Namespace, deadline: Deadline) -> dict[str, Any]:
    work.mkdir(parents=True)
    queue_url = moto.prepare(notify=mode == "notify")
    config = write_config(work, moto, queue_url, args)
    daemon = Daemon(work, config)
    out: dict[str, Any] = {"mode": mode, "notifications": "sqs" if queue_url else None,
                           "reconcile_interval_s": args.reconcile_interval if mode == "listing" else 300}
    say(f"[{mode}] starting the daemon, log {daemon.log_path}")
    watcher = CommitWatcher(moto, args.poll)
    try:
        startup_s = daemon.start(deadline)
        say(f"[{mode}] daemon ready after {startup_s:.1f} s; warm-up file")
        watcher.start()
        moto.client("s3").put_object(Bucket=LANDING, Key=key_of(WARMUP_FILE), Body=csv_body(WARMUP_FILE, args.rows))
        warmup_s = wait_rows(moto, daemon, args.rows, 120, deadline, "the warm-up file")
        say(f"[{mode}] warm-up file visible after {warmup_s:.1f} s; {args.rate:g} files/s for {args.seconds:g} s")

        cpu0 = (session_cpu(daemon.proc.pid), moto.cpu(), time.process_time(), machine_busy(), time.time())
        puts = put_schedule(moto, args, deadline)
        cpu1 = (session_cpu(daemon.proc.pid), moto.cpu(), time.process_time(), machine_busy(), time.time())
        n = len(puts)
        expected = (n + 1) * args.rows
        drain_s = wait_rows(moto, daemon, expected, args.drain_timeout, deadline, "every file")
        say(f"[{mode}] all {n:,} files visible {drain_s:.1f} s after the last PUT")
        time.sleep(2 * args.trigger)  # a file read twice would show up in the next batches
        daemon.poll()
        watcher.stop()
        code, shutdown_s = daemon.stop(min(120.0, max(deadline.left(), 5.0)))
        if code is None:
            raise BenchError("daemon did not exit within 120 s of SIGTERM")
        daemon.events += log_events(daemon.log_path, daemon.pos)[0]
        say(f"[{mode}] daemon exited with {code} after {shutdown_s:.1f} s")

        # Exactly once: each file's rows, once; and which table commit made each file visible.
        opts = moto.delta_options()
        rows = DeltaTable(TABLE, storage_options=opts).to_pyarrow_table(columns=["id", "file"])
        per_file = dict(zip(*[c.to_pylist() for c in pc.value_counts(rows.column("file")).flatten()],
                            strict=True))
        wrong = {f: per_file.get(f, 0) for f in [WARMUP_FILE, *range(n)] if per_file.get(f, 0) != args.rows}
        strangers = sorted(set(per_file) - {WARMUP_FILE, *range(n)})
        distinct = pc.count_distinct(rows.column("id")).as_py()
        changelog = DeltaTable(CHANGELOG, storage_options=opts).to_pyarrow_table(columns=["file", "batch_id"])
        batches_of: dict[int, set[int]] = {}
        for f, b in zip(changelog.column("file").to_pylist(), changelog.column("batch_id").to_pylist(),
                        strict=True):
            batches_of.setdefault(f, set()).add(b)
        history = DeltaTable(TABLE, storage_options=opts).history()
        commit_of: dict[int, tuple[int, float]] = {}  # batch_id -> (version, commit timestamp s)
        for c in history:
            if "lakefeed.batch_id" in c:
                b = int(c["lakefeed.batch_id"])
                if b not in commit_of or c["version"] < commit_of[b][0]:
                    commit_of[b] = (c["version"], c["timestamp"] / 1000)

        # Per file: PUT returned -> in the inbox (file.enqueued) -> its batch starts (Spark writes the batch's
        # offsets/N to the checkpoint) -> the table commit (delta-rs timestamp) -> first seen in _delta_log/.
        enqueued = {e["file"]: ts(e) for e in daemon.events if e["event"] == "file.enqueued"}
        offsets = work / "state" / ENTITY / "checkpoint" / "offsets"
        stages: dict[str, list[float]] = {k: [] for k in ("latency", "seen", "bracket", "to_inbox", "inbox_to_batch",
                                                          "batch_to_commit")}
        per_commit: dict[int, int] = {}
        unmapped, timeline = [], []
        for i, put in enumerate(puts):
            b = batches_of.get(i, set())
            if len(b) != 1 or next(iter(b)) not in commit_of:
                unmapped.append(i)
                continue
            batch = next(iter(b))
            version, committed = commit_of[batch]
            per_commit[version] = per_commit.get(version, 0) + 1
            stages["latency"].append(committed - put["done"])
            timeline.append((put["done"], committed - put["done"]))
            if version in watcher.seen:
                stages["seen"].append(watcher.seen[version] - put["done"])
                stages["bracket"].append(watcher.seen[version] - committed)
            started = mtime(offsets / str(batch))
            if put["url"] in enqueued and started is not None:
                stages["to_inbox"].append(enqueued[put["url"]] - put["done"])
                stages["inbox_to_batch"].append(started - enqueued[put["url"]])
                stages["batch_to_commit"].append(committed - started)
        # Spark's batches during the schedule: offsets/N written -> commits/N written (after the manifest upload).
        batch_ids = sorted({next(iter(b)) for f, b in batches_of.items() if f != WARMUP_FILE and len(b) == 1})
        spans = [(mtime(offsets / str(b)), mtime(offsets.parent / "commits" / str(b))) for b in batch_ids]
        batch_s = [end - start for start, end in spans if start is not None and end is not None]
        # The trend over the schedule: latency by 10 s window of PUT completion.
        t0 = puts[0]["done"]
        windows = [{"from_s": w * 10, **percentiles([lat for at, lat in timeline if w * 10 <= at - t0 < w * 10 + 10])}
                   for w in range(int((puts[-1]["done"] - t0) // 10) + 1)]
        wall = cpu1[4] - cpu0[4]
        out.update({
            "files": n, "rows_per_file": args.rows, "rows_expected": expected, "rows_in_table": rows.num_rows,
            "distinct_ids": distinct,
            "exactly_once": not wrong and not strangers and distinct == rows.num_rows == expected and code == 0,
            "files_with_wrong_row_count": dict(list(wrong.items())[:20]), "unknown_files": strangers[:20],
            "files_without_one_commit": unmapped[:20],
            "latency_s": percentiles(stages["latency"]),
            "latency_seen_s": percentiles(stages["seen"]),
            "commit_to_seen_s": percentiles(stages["bracket"]),
            "stages_s": {"put_to_inbox": percentiles(stages["to_inbox"]),
                         "inbox_to_batch_start": percentiles(stages["inbox_to_batch"]),
                         "batch_start_to_commit": percentiles(stages["batch_to_commit"])},
            "latency_by_10s_window": [{k: w[k] for k in ("from_s", "count", "p50", "p99", "max")} for w in windows],
            "put_s": percentiles([p["done"] - p["start"] for p in puts]),
            "send_lag_s": percentiles([p["start"] - p["scheduled"] for p in puts]),
            "schedule_s": round(puts[-1]["done"] - puts[0]["scheduled"], 2),
            "commits": len(per_commit), "files_per_commit": percentiles(list(per_commit.values())),
            "spark_batch_s": percentiles(batch_s),
            "cpu_cores_during_schedule": {"daemon": round((cpu1[0] - cpu0[0]) / wall, 2),
                                          "moto": round((cpu1[1] - cpu0[1]) / wall, 2),
                                          "bench": round((cpu1[2] - cpu0[2]) / wall, 2),
                                          "machine": round((cpu1[3] - cpu0[3]) / wall, 2)},
            "daemon": {"startup_s": round(startup_s, 1), "warmup_visible_s": round(warmup_s, 1),
                       "drain_after_last_put_s": round(drain_s, 1), "exit_code": code,
                       "shutdown_s": round(shutdown_s, 1),
                       "files_enqueued": daemon.count("file.enqueued"),
                       "found_by_listings": daemon.count("source.missed_events", "files"),
                       "listings": daemon.count("source.listed"),
                       "sqs_receives": daemon.count("sqs.received")},
            "watcher": {"lists": watcher.lists, "list_s": percentiles(watcher.list_s), "error": watcher.error},
        })
        lat = out["latency_s"]
        say(f"[{mode}] latency p50 {lat['p50']} s, p99 {lat['p99']} s, max {lat['max']} s over {lat['count']} files "
            f"(seen by listing: p50 {out['latency_seen_s']['p50']} s, p99 {out['latency_seen_s']['p99']} s); "
            f"exactly once: {out['exactly_once']}")
        return out
    except BaseException:
        say(f"[{mode}] daemon log tail:\n" + log_tail(daemon.log_path))
        raise
    finally:
        if daemon.proc is not None:
            kill_group(daemon.proc)
        if watcher.is_alive():
            watcher.stop()


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=10.0, help="files per second (default 10)")
    p.add_argument("--seconds", type=float, default=60.0, help="how long files are PUT (default 60)")
    p.add_argument("--rows", type=int, default=10, help="rows per file (default 10)")
    p.add_argument("--modes", default="notify,listing,spark",
                   help="any of notify, listing and spark (the Spark peer), comma-separated (default: all)")
    p.add_argument("--reconcile-interval", type=float, default=1.0,
                   help="listing mode: reconcile_interval_s (default 1)")
    p.add_argument("--trigger", type=float, default=1.0, help="the daemon's spark.trigger_interval_s (default 1)")
    p.add_argument("--poll", type=float, default=0.2, help="how often _delta_log/ is listed (default 0.2 s)")
    p.add_argument("--put-threads", type=int, default=8, help="PUT threads (default 8)")
    p.add_argument("--drain-timeout", type=float, default=120.0,
                   help="how long, after the last PUT, every row may take to be visible (default 120 s)")
    p.add_argument("--workdir", type=Path, default=None, help="default: a fresh temporary folder")
    p.add_argument("--keep", action="store_true", help="keep the workdir (always kept when --workdir is given)")
    p.add_argument("--timeout", type=float, default=1200.0, help="overall deadline in seconds (default 1200)")
    p.add_argument("--moto-server", action="store_true", help=argparse.SUPPRESS)
    _spark_peer.add_conf_argument(p)
    args = parse_args(p, argv, SMOKE)
    if args.moto_server:
        return serve_moto()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - {"notify", "listing", "spark"} or len(set(modes)) != len(modes):
        p.error("--modes: any of notify, listing and spark, comma-separated")
    if args.rate <= 0 or args.seconds <= 0 or args.rows <= 0 or args.reconcile_interval <= 0 or args.trigger <= 0 \
            or args.poll <= 0 or args.put_threads <= 0 or round(args.rate * args.seconds) < 1:
        p.error("--rate, --seconds, --rows, --reconcile-interval, --trigger, --poll and --put-threads must be > 0")
    deadline = Deadline(args.timeout)
    work, remove = workdir(p, args.workdir, args.keep, "lakefeed-bench-s3-notify-")
    report: dict[str, Any] = {
        "bench": "s3_notify", "smoke": args.smoke, "store": "moto ThreadedMotoServer (in a child process)",
        "rate_per_s": args.rate,
        "seconds": args.seconds, "rows_per_file": args.rows, "trigger_interval_s": args.trigger,
        "poll_s": args.poll, "goal_p50_s": GOAL_P50_S, "goal_p99_s": GOAL_P99_S,
        "latency": "PUT returned -> the table commit holding the file (delta-rs commit timestamp: a lower bound, "
                   "early by the commit file's PUT); latency_seen_s: when a listing of _delta_log/ every poll_s "
                   "first saw that commit (an upper bound)",
        "cpus": os.cpu_count(), "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "ok": False, "workdir": str(work)}
    moto: Moto | None = None
    try:
        say(f"workdir {work}")
        moto = Moto(deadline)
        report["moto_version"] = __import__("moto").__version__
        say(f"moto on {moto.endpoint}")
        results = {}
        for mode in modes:
            results[mode] = (run_spark if mode == "spark" else partial(run_mode, mode))(moto, work / mode, args,
                                                                                         deadline)
        report["modes"] = results
        failed = [m for m, r in results.items() if not r["exactly_once"]]
        if "notify" in results:
            lat = results["notify"]["latency_s"]
            seen = results["notify"]["latency_seen_s"]
            report["goal_met"] = {"p50": lat["p50"] is not None and lat["p50"] <= GOAL_P50_S,
                                  "p99": lat["p99"] is not None and lat["p99"] <= GOAL_P99_S}
            report["goal_met_by_upper_bound"] = {"p50": seen["p50"] is not None and seen["p50"] <= GOAL_P50_S,
                                                 "p99": seen["p99"] is not None and seen["p99"] <= GOAL_P99_S}
        if "notify" in results and "spark" in results:
            n, sp = results["notify"]["latency_s"], results["spark"]["latency_s"]
            report["notify_over_spark"] = {"p50": ratio(n["p50"], sp["p50"], 2), "p99": ratio(n["p99"], sp["p99"], 2)}
            report["goal_vs_spark_met"] = report["notify_over_spark"]["p50"] is not None \
                and report["notify_over_spark"]["p50"] <= GOAL_VS_SPARK
            say(f"notify / Spark peer: p50 x{report['notify_over_spark']['p50']}, "
                f"p99 x{report['notify_over_spark']['p99']} (goal p50 <= {GOAL_VS_SPARK})")
        if "notify" in results and "listing" in results:
            n, li = results["notify"]["latency_s"], results["listing"]["latency_s"]
            report["listing_over_notify"] = {"p50": ratio(li["p50"], n["p50"], 2), "p99": ratio(li["p99"], n["p99"], 2)}
            say(f"listing / notify: p50 x{report['listing_over_notify']['p50']}, "
                f"p99 x{report['listing_over_notify']['p99']}")
        if failed:
            report["error"] = f"files not landed exactly once in: {', '.join(failed)}"
        report["ok"] = not failed
        return 0 if not failed else 1
    except Exception as exc:  # noqa: BLE001 - BenchError, boto3, deltalake…: reported in the JSON
        report["error"] = f"{type(exc).__name__}: {exc}"
        say(f"FAILED: {report['error']}")
        return 1
    except KeyboardInterrupt:
        report["error"] = "interrupted"
        return 1
    finally:
        report["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        if moto is not None:
            moto.stop()
        publish(report, work, remove)


if __name__ == "__main__":
    sys.exit(main())
