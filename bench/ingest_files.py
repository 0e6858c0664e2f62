"""Ingest benchmark: N CSV files x M rows landing into a watched folder.

Measures, in one run:

* lakefeed: the daemon (`lakefeed run`) as a subprocess; the files are renamed into its
  landing folder (atomic, like a real producer) and the run ends when the Delta table holds
  every file. rows/s = total rows / (last table commit - first landing); per-file latency =
  timestamp of the table commit that made the file visible - time of its rename.
* the Spark peer: what a Spark user would run instead, plain PySpark Structured Streaming (`readStream.csv` on
  its own landing folder -> `writeStream.format("delta")`, delta-spark, with a checkpoint; bench/_spark_peer.py),
  fed the same files the same way, measured the same way (a file is visible at the Delta commit of the
  micro-batch that read it). Goal: lakefeed, with its changelog and manifests, >= 1.5x its rows/s and a lower p99.
* the floor: the same files read with pyarrow.csv.read_csv and appended with
  deltalake.write_deltalake, no Spark, grouped in the same batches lakefeed made (one append
  per batch). Two variants: the data table only ("single table", the reference for the
  ratio) and the data table plus a changelog table with lakefeed's 6 extra columns.
* the CPU a row costs in each step of lakefeed's append path and of the floor, on the first files, in this process
  (bench/_row_costs.py): their quotient is the `ceiling`, the ratio lakefeed would reach with nothing but its row
  work on a machine the load keeps busy. With them, the goal's `budget_cpu_us_per_row`: the floor's CPU a row over
  the goal ratio, all the whole path may cost for it; `odf_hashes_over_budget` is how much of it the ODF slice's
  hashes alone take (over 1: the goal is out of reach while the chain hashes every slice).

Progress goes to stderr; one JSON object goes to stdout at the end. Exit status 0 when the
run completed (whether or not the ratio goal is met), 1 on failure or timeout.

    python bench/ingest_files.py [--files 200] [--rows 50000] [--workdir DIR] [--keep] [--smoke]

`--smoke`: 6 files x 1,000 rows, at most 2 files per batch, the daemon, the peer (sized for a tiny table:
`--peer-conf`, bench/_spark_peer.py's smoke_conf()) and both floors, in seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import _row_costs
import _spark_peer
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from _common import (  # bench/ is the script folder, so on sys.path
    BenchError,
    Deadline,
    kill_group,
    log_events,
    log_tail,
    parse_args,
    publish,
    say,
    stop_daemon,
    stop_process,
    workdir,
)
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import TableNotFoundError

from lakefeed.config.model import load
from lakefeed.connectors.sinks.delta_log import commit_metadata

ENTITY = "bench"
METADATA_KEY = "lakefeed.partitions"
GOAL_RATIO = 0.8  # issue #20
COST_FILES = 8  # files the CPU of each step is measured on (_row_costs.py)
GOAL_VS_SPARK = 1.5
SEED = 20240601
LAKEFEED = Path(sys.executable).parent / "lakefeed"
SMOKE = {"files": 6, "rows": 1000, "max_files_per_trigger": 2, "timeout": 300.0,
         "peer_conf": _spark_peer.smoke_conf()}

CONFIG = """\
lake_dir: lake
state_dir: state
log_level: INFO
spark: {{master: "{master}", trigger_interval_s: {trigger}}}
http: {{host: 127.0.0.1, port: 0}}
writer: {writer}
entities:
  - name: {entity}
    source: {{type: local_dir, path: landing, reconcile_interval_s: 60, max_files_per_trigger: {max_files}}}
    manifest: landing/default.manifest.cdm.json
    patterns:
      - {{name: all, root_location: data, glob_pattern: "/*.csv"}}
    format: {{kind: csv, header: true}}
"""

# The floor reads with the types the table ends up with (lakefeed does the same from its
# second batch on, when the table exists).
FLOOR_TYPES = {
    "id": pa.int64(),
    "customer": pa.string(),
    "amount": pa.float64(),
    "ts": pa.timestamp("us", tz="UTC"),
    "category": pa.string(),
}
PEER_SCHEMA = "id long, customer string, amount double, ts timestamp, category string"
CATEGORIES = np.array(["books", "games", "garden", "grocery", "music", "sports", "tools", "toys"])
_TS = pa.timestamp("us", tz="UTC")


# --------------------------------------------------------------------------- data


def generate(staging: Path, files: int, rows: int) -> list[str]:
    """Write the CSVs (deterministic: fixed seed per file); return their names in landing order."""
    staging.mkdir(parents=True, exist_ok=True)
    width = max(4, len(str(files - 1)))
    customers = pa.array([f"cust_{i:05d}" for i in range(20_000)])
    base = np.datetime64("2024-01-01T00:00:00", "s").astype(np.int64)
    names = []
    for i in range(files):
        rng = np.random.default_rng(SEED + i)
        start = i * rows
        ts = pa.array(base + np.sort(rng.integers(0, 365 * 86400, rows)), pa.timestamp("s"))
        table = pa.table({
            "id": pa.array(np.arange(start, start + rows, dtype=np.int64)),
            "customer": customers.take(pa.array(rng.integers(0, len(customers), rows))),
            "amount": pa.array(np.round(rng.gamma(2.0, 40.0, rows), 2)),
            "ts": pc.strftime(ts, format="%Y-%m-%dT%H:%M:%SZ"),
            "category": pa.array(CATEGORIES[rng.integers(0, len(CATEGORIES), rows)]),
        })
        name = f"f{i:0{width}d}.csv"
        pacsv.write_csv(table, staging / name,
                        write_options=pacsv.WriteOptions(quoting_style="needed"))
        names.append(name)
    return names


# --------------------------------------------------------------------------- daemon


def wait_ready(proc: subprocess.Popen, log_path: Path, deadline: Deadline) -> None:
    pos = 0
    while True:
        events, pos = log_events(log_path, pos)
        for ev in events:
            if ev["event"] == "daemon.ready":
                if not ev.get("entities"):
                    raise BenchError(f"daemon ready without entities: {ev}")
                return
            if ev["event"] in ("entity.failed", "daemon.failed"):
                raise BenchError(f"daemon reported {ev['event']}: {ev}")
        if proc.poll() is not None:
            raise BenchError(f"daemon exited with {proc.returncode} before daemon.ready")
        deadline.check("waiting for daemon.ready")
        time.sleep(0.1)


def land(staging: Path, data_dir: Path, names: list[str], interval: float) -> dict[str, float]:
    data_dir.mkdir(parents=True, exist_ok=True)
    landed = {}
    for name in names:
        os.rename(staging / name, data_dir / name)
        landed[name] = time.time()
        if interval:
            time.sleep(interval)
    return landed


def watch_table(table_uri: Path, proc: subprocess.Popen, log_path: Path, expected: set[str],
                deadline: Deadline) -> list[dict]:
    """Poll the data table's log until every expected file is in a commit; return those commits."""
    table: DeltaTable | None = None
    seen_version = -1
    commits: list[dict] = []
    found: set[str] = set()
    log_pos = 0
    last_report = 0.0
    while True:
        if table is None:
            try:
                table = DeltaTable(str(table_uri))
            except TableNotFoundError:
                table = None
        else:
            table.update_incremental()
        if table is not None and table.version() > seen_version:
            new = map(commit_metadata, table.history(limit=table.version() - seen_version))
            for c in sorted(new, key=lambda c: c["version"]):
                if c["version"] <= seen_version or METADATA_KEY not in c:
                    continue
                batch = json.loads(c[METADATA_KEY])
                files = [p["location"].rsplit("/", 1)[-1] for p in batch["partitions"]]
                commits.append({"version": c["version"], "timestamp_ms": c["timestamp"], "files": files,
                                "rows": added_rows(table_uri, c["version"]),
                                "batch_id": c.get("lakefeed.batch_id")})
                found.update(files)
            seen_version = table.version()
        if expected <= found:
            return commits
        events, log_pos = log_events(log_path, log_pos)
        for ev in events:
            if ev["event"] in ("entity.failed", "daemon.failed"):
                raise BenchError(f"daemon reported {ev['event']}: {json.dumps(ev)[:2000]}")
        if proc.poll() is not None:
            raise BenchError(f"daemon exited with {proc.returncode} while ingesting")
        deadline.check(f"waiting for the table ({len(found)}/{len(expected)} files visible)")
        if time.monotonic() - last_report > 5:
            say(f"  {len(found)}/{len(expected)} files visible, table version {seen_version}")
            last_report = time.monotonic()
        time.sleep(0.05)


def added_rows(table_uri: Path, version: int) -> int:
    """The rows a commit added, from its add actions' statistics."""
    log = (table_uri / "_delta_log" / f"{version:020d}.json").read_text(encoding="utf-8")
    actions = [json.loads(line) for line in log.splitlines() if line.strip()]
    adds = [a["add"] for a in actions if "add" in a]
    return sum(json.loads(a.get("stats") or "{}").get("numRecords", 0) for a in adds)


def table_rows(uri: Path) -> int:
    actions = pa.table(DeltaTable(str(uri)).get_add_actions(flatten=True))
    return int(pc.sum(actions.column("num_records")).as_py() or 0)


def _ts(ev: dict) -> float:
    return datetime.fromisoformat(ev["timestamp"].replace("Z", "+00:00")).timestamp()


def batch_breakdown(log_path: Path) -> list[dict]:
    """Per file batch, from the daemon log: its files and rows (`batch.committed`), its seconds and where they went
    (`batch.timed`: collect, discover, tasks, commit, manifests), when it started and ended."""
    events, _ = log_events(log_path)
    committed: dict[int, dict] = {}
    out = []
    for ev in events:
        if ev.get("stream") not in (None, "files") or ev.get("batch_id") is None:
            continue
        if ev["event"] == "batch.committed":
            committed[ev["batch_id"]] = ev
        elif ev["event"] == "batch.timed" and ev["batch_id"] in committed:
            done = _ts(ev)
            out.append({"batch_id": ev["batch_id"], "files": committed[ev["batch_id"]].get("files"),
                        "rows": committed[ev["batch_id"]].get("rows"), "batch_s": ev["seconds"],
                        "stages_s": ev["stages"], "start": done - ev["seconds"], "committed": done})
    return out


def run_lakefeed(work: Path, staging: Path, names: list[str], rows: int, args, deadline: Deadline) -> dict:
    cfg = work / "lakefeed.yaml"
    cfg.write_text(CONFIG.format(entity=ENTITY, trigger=args.trigger_interval, max_files=args.max_files_per_trigger,
                                 master=getattr(args, "master", "local[2]"), writer=args.writer))
    (work / "landing").mkdir(exist_ok=True)
    log_path = work / "daemon.log"
    say(f"starting lakefeed ({cfg}), log {log_path}")
    t0 = time.time()
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen([str(LAKEFEED), "run", "--config", str(cfg)], cwd=work,
                                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True)
    result: dict = {}
    try:
        wait_ready(proc, log_path, deadline)
        startup_s = time.time() - t0
        say(f"daemon.ready after {startup_s:.1f}s; landing {len(names)} files")
        landed = land(staging, work / "landing" / "data", names, args.interval)
        say(f"landed in {landed[names[-1]] - landed[names[0]]:.3f}s; waiting for the table")
        commits = watch_table(work / "lake" / ENTITY / "table", proc, log_path, set(names), deadline)
        visible = {f: c["timestamp_ms"] / 1000 for c in commits for f in c["files"]}
        first_land = min(landed.values())
        last_commit = max(visible.values())
        elapsed = last_commit - first_land
        total_rows = table_rows(work / "lake" / ENTITY / "table")
        latencies = np.array([visible[n] - landed[n] for n in names])
        say(f"all files visible: {total_rows} rows in {len(commits)} commits, {elapsed:.2f}s after first landing")
        say("stopping the daemon (SIGTERM)")
        t_stop = time.time()
        wait_s = min(120.0, max(deadline.left(), 5.0))  # what is left of the run's deadline, at least 5 s
        code = stop_daemon(proc, timeout=wait_s)
        if code is None:
            raise BenchError(f"daemon did not exit within {wait_s:.0f}s of SIGTERM (all that was left of the "
                             f"run's {deadline.seconds:.0f}-s deadline, up to 120 s)")
        say(f"daemon exited with {code} after {time.time() - t_stop:.1f}s")
        result = {
            "startup_s": round(startup_s, 2),
            "elapsed_s": round(elapsed, 3),
            "rows": total_rows,
            "rows_per_s": total_rows / elapsed,
            "latency_p50_s": float(np.percentile(latencies, 50)),
            "latency_p99_s": float(np.percentile(latencies, 99)),
            "latency_max_s": float(latencies.max()),
            "batches": len(commits),
            "batch_files": [c["files"] for c in commits],
            "commits": [{k: c[k] for k in ("version", "batch_id", "rows")} | {"files": len(c["files"])}
                        for c in commits],
            "exit_code": code,
            "shutdown_s": round(time.time() - t_stop, 2),
            "breakdown": batch_breakdown(log_path),
            "first_land": first_land,
        }
        if total_rows != rows * len(names):
            raise BenchError(f"table holds {total_rows} rows, expected {rows * len(names)}")
        if code != 0:
            raise BenchError(f"daemon exited with {code}, expected 0")
        return result
    except BaseException:
        say("daemon log tail:\n" + log_tail(log_path))
        raise
    finally:
        if proc.poll() is None:
            say("killing the daemon")
        kill_group(proc)


# --------------------------------------------------------------------------- Spark peer


def run_spark_peer(work: Path, staging: Path, names: list[str], rows: int, args, deadline: Deadline) -> dict:
    """The same files through plain Structured Streaming into delta-spark, measured as lakefeed is."""
    peer = work / "spark_peer"
    landing, table = peer / "landing", peer / "table"
    landing.mkdir(parents=True, exist_ok=True)
    log_path = peer / "spark.log"
    t0 = time.time()
    proc = _spark_peer.start(["csv", str(landing), str(table), str(peer / "checkpoint"), "--schema", PEER_SCHEMA,
                              "--trigger", str(args.trigger_interval), "--master", getattr(args, "master", "local[2]"),
                              *_spark_peer.conf_args(getattr(args, "peer_conf", []))],
                             log_path)
    try:
        startup_s = time.time() - t0
        landed = land(staging, landing, names, args.interval)
        seen: dict[str, float] = {}
        while len(seen) < len(names):
            deadline.check(f"waiting for the Spark peer's table ({len(seen)}/{len(names)} files visible)")
            if proc.poll() is not None:
                raise BenchError(f"the Spark peer exited with {proc.returncode}: {log_tail(log_path)}")
            time.sleep(0.05)
            seen = _spark_peer.visible(_spark_peer.local_commits(table), peer / "checkpoint")
        code = stop_process(proc, timeout=max(deadline.left(), 5.0))
        first_land = min(landed.values())
        elapsed = max(seen.values()) - first_land
        latencies = np.array([seen[n] - landed[n] for n in names])
        total_rows = table_rows(table)
        if total_rows != rows * len(names):
            raise BenchError(f"the Spark peer's table holds {total_rows} rows, expected {rows * len(names)}")
        return {"startup_s": round(startup_s, 2), "elapsed_s": round(elapsed, 3), "rows": total_rows,
                "rows_per_s": total_rows / elapsed, "latency_p50_s": float(np.percentile(latencies, 50)),
                "latency_p99_s": float(np.percentile(latencies, 99)), "exit_code": code,
                "batches": len({round(t, 3) for t in seen.values()})}
    finally:
        kill_group(proc)


# --------------------------------------------------------------------------- floor


def changelog_of(data: pa.Table, first_offset: int, batch_id: int, source: pa.ChunkedArray) -> pa.Table:
    """Lakefeed's changelog shape (offset, op, system_time, event_time, data, source_file, batch_id)."""
    n = data.num_rows
    now = pa.scalar(datetime.now().astimezone(), _TS)
    system = pa.repeat(now, n)
    out = pa.table({
        "offset": pa.array(np.arange(first_offset, first_offset + n, dtype=np.int64)),
        "op": pa.array(np.zeros(n, dtype=np.int8)),
        "system_time": system,
        "event_time": system,
    })
    for name in data.column_names:
        out = out.append_column(data.field(name), data.column(name))
    out = out.append_column("source_file", source)
    return out.append_column("batch_id", pa.array(np.full(n, batch_id, dtype=np.int64)))


def run_floor(data_dir: Path, out: Path, groups: list[list[str]], with_changelog: bool,
              deadline: Deadline) -> dict:
    table_uri, changelog_uri = out / "table", out / "changelog"
    convert = pacsv.ConvertOptions(column_types=FLOOR_TYPES)
    offset = 0
    rows = 0
    t0 = time.perf_counter()
    read_s = write_s = changelog_s = 0.0
    for batch_id, files in enumerate(groups):
        deadline.check("running the floor")
        t = time.perf_counter()
        tables = [pacsv.read_csv(data_dir / f, convert_options=convert) for f in files]
        data = pa.concat_tables(tables)
        t1 = time.perf_counter()
        read_s += t1 - t
        if with_changelog:
            source = pa.chunked_array([pa.repeat(pa.scalar(str(data_dir / f)), t.num_rows)
                                       for f, t in zip(files, tables, strict=True)], pa.string())
            write_deltalake(str(changelog_uri), changelog_of(data, offset, batch_id, source), mode="append")
            offset += data.num_rows
        t2 = time.perf_counter()
        changelog_s += t2 - t1
        write_deltalake(str(table_uri), data, mode="append")
        write_s += time.perf_counter() - t2
        rows += data.num_rows
    elapsed = time.perf_counter() - t0
    if table_rows(table_uri) != rows:
        raise BenchError(f"floor table holds {table_rows(table_uri)} rows, expected {rows}")
    return {"elapsed_s": round(elapsed, 3), "rows": rows, "rows_per_s": rows / elapsed,
            "read_s": round(read_s, 3), "changelog_write_s": round(changelog_s, 3),
            "table_write_s": round(write_s, 3)}


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=200)
    p.add_argument("--rows", type=int, default=50_000, help="rows per file")
    p.add_argument("--workdir", type=Path, default=None, help="default: a fresh temporary folder")
    p.add_argument("--keep", action="store_true", help="keep the workdir (always kept when --workdir is given)")
    p.add_argument("--timeout", type=float, default=1200.0, help="overall deadline in seconds (default 1200)")
    p.add_argument("--interval", type=float, default=0.0, help="seconds between landings (default 0: a burst)")
    p.add_argument("--staging", choices=("inside", "outside"), default="outside",
                   help="where the files wait before their rename into landing/data: WORKDIR/staging, "
                        "outside the watched tree (default: watchdog reports such a rename as a created "
                        "event), or landing/_staging (a move inside the watched tree)")
    p.add_argument("--trigger-interval", type=float, default=0.5)
    p.add_argument("--max-files-per-trigger", type=int, default=1000)
    p.add_argument("--writer", choices=("delta-rs", "delta-spark"), default="delta-rs",
                   help="lakefeed's Delta writer (default delta-rs, the default config's)")
    _spark_peer.add_conf_argument(p)
    args = parse_args(p, argv, SMOKE)
    deadline = Deadline(args.timeout)

    work, remove = workdir(p, args.workdir, args.keep, "lakefeed-bench-")
    report: dict = {"bench": "ingest_files", "smoke": args.smoke,
                    "files": args.files, "rows": args.files * args.rows, "rows_per_file": args.rows,
                    "staging": args.staging, "writer": args.writer,
                    "ok": False, "workdir": str(work)}
    try:
        say(f"workdir {work}; generating {args.files} files x {args.rows} rows")
        t = time.perf_counter()
        # Staging on the landing folder's filesystem. "outside" (default): a sibling folder of
        # landing; watchdog reports such a rename as a *created* event (no IN_MOVED_FROM in the
        # tree). "inside": landing/_staging, which the daemon never lists (names starting with
        # "_"), so a rename into landing/data is a move inside the watched tree.
        staging = work / "landing" / "_staging" if args.staging == "inside" else work / "staging"
        (work / "landing" / "data").mkdir(parents=True, exist_ok=True)  # exists before the watch starts
        names = generate(staging, args.files, args.rows)
        peer_staging = work / "spark_peer_staging"  # a copy for the Spark peer, landed after lakefeed's run
        shutil.copytree(staging, peer_staging)
        size = sum((staging / n).stat().st_size for n in names)
        say(f"generated {size / 1e6:.1f} MB in {time.perf_counter() - t:.1f}s")
        report["csv_mb"] = round(size / 1e6, 1)

        lf = run_lakefeed(work, staging, names, args.rows, args, deadline)
        groups = lf.pop("batch_files")
        breakdown = lf.pop("breakdown")
        first_land = lf.pop("first_land")
        data_dir = work / "landing" / "data"

        say(f"floor (single table): {len(groups)} appends, same grouping as lakefeed")
        floor = run_floor(data_dir, work / "floor1", groups, with_changelog=False, deadline=deadline)
        say(f"  {floor['rows_per_s']:,.0f} rows/s ({floor['elapsed_s']}s)")
        say("floor (table + changelog)")
        floor_cl = run_floor(data_dir, work / "floor2", groups, with_changelog=True, deadline=deadline)
        say(f"  {floor_cl['rows_per_s']:,.0f} rows/s ({floor_cl['elapsed_s']}s)")

        say("CPU per row of each step, lakefeed's and the floor's (bench/_row_costs.py)")
        costs = _row_costs.measure(load(work / "lakefeed.yaml").entities[0],
                                   [data_dir / n for n in names[:COST_FILES]], FLOOR_TYPES, work / "costs",
                                   GOAL_RATIO)
        say(f"  lakefeed {costs['lakefeed_cpu_us_per_row']} us, floor {costs['floor_cpu_us_per_row']} us: "
            f"ceiling {costs['ceiling']}; the goal's budget {costs['budget_cpu_us_per_row']} us, "
            f"{costs['odf_hashes_over_budget']} of it the ODF slice's hashes")

        say("Spark peer: Structured Streaming readStream.csv -> delta-spark")
        spark_peer = run_spark_peer(work, peer_staging, names, args.rows, args, deadline)
        say(f"  {spark_peer['rows_per_s']:,.0f} rows/s, p99 {spark_peer['latency_p99_s']:.2f}s")

        ratio = lf["rows_per_s"] / floor["rows_per_s"]
        vs_spark = lf["rows_per_s"] / spark_peer["rows_per_s"]
        for b in breakdown:
            b["start_after_first_land_s"] = round(b.pop("start") - first_land, 3)
            b["committed_after_first_land_s"] = round(b.pop("committed") - first_land, 3)
        report.update({
            "lakefeed_rows_per_s": round(lf["rows_per_s"]),
            "floor_rows_per_s": round(floor["rows_per_s"]),
            "ratio": round(ratio, 3),
            "floor_with_changelog_rows_per_s": round(floor_cl["rows_per_s"]),
            "ratio_vs_floor_with_changelog": round(lf["rows_per_s"] / floor_cl["rows_per_s"], 3),
            "goal_ratio": GOAL_RATIO,
            "ceiling": costs["ceiling"],  # the ratio with nothing but the row work (bench/_row_costs.py)
            "row_costs": costs,
            "goal_met": ratio >= GOAL_RATIO,
            "spark_peer_rows_per_s": round(spark_peer["rows_per_s"]),
            "ratio_vs_spark_peer": round(vs_spark, 3),
            "spark_peer_latency_p99_s": round(spark_peer["latency_p99_s"], 3),
            "goal_vs_spark_peer": GOAL_VS_SPARK,
            "goal_vs_spark_peer_met": vs_spark >= GOAL_VS_SPARK and lf["latency_p99_s"] < spark_peer["latency_p99_s"],
            "spark_peer": spark_peer,
            "latency_p50_s": round(lf["latency_p50_s"], 3),
            "latency_p99_s": round(lf["latency_p99_s"], 3),
            "latency_max_s": round(lf["latency_max_s"], 3),
            "batches": lf["batches"],
            "lakefeed_elapsed_s": lf["elapsed_s"],
            "lakefeed_startup_s": lf["startup_s"],
            "lakefeed_shutdown_s": lf["shutdown_s"],
            "daemon_exit_code": lf["exit_code"],
            "floor_elapsed_s": floor["elapsed_s"],
            "floor_with_changelog_elapsed_s": floor_cl["elapsed_s"],
            "floor_detail": {"single_table": floor, "with_changelog": floor_cl},
            "lakefeed_commits": lf["commits"],
            "lakefeed_batches_from_log": breakdown,
            "ok": True,
        })
        say(f"lakefeed {report['lakefeed_rows_per_s']:,} rows/s, floor {report['floor_rows_per_s']:,} rows/s, "
            f"ratio {ratio:.3f} (goal >= {GOAL_RATIO}); {vs_spark:.2f}x the Spark peer (goal >= {GOAL_VS_SPARK}); "
            f"latency p50 {lf['latency_p50_s']:.2f}s "
            f"p99 {lf['latency_p99_s']:.2f}s; {lf['batches']} batches")
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


if __name__ == "__main__":
    sys.exit(main())
