"""Scale-out benchmark: the same landing load through lakefeed on one Spark executor, then on two.

Each run starts the daemon (`lakefeed run`) with `spark.master` = `local-cluster[N,1,1024]` (N executor JVMs of one
core each, with their own Python workers: a cluster on one machine) and waits for its warm-up (`spark.warmed_up`:
every core's Python worker started). Each load (`--loads`) then runs on that daemon, one after the other, through
entities of its own. First the same files go through its uncounted entities (`warm1_append`, ...; `--warm-loads` of
them, one after the other): the JVMs compile what the load runs (the driver's and the executors' JIT compilers took
2.2 of the 3.3 CPU seconds the JVMs spent in a counted first load on two executors, 2026-11-28), so the load meets
a running cluster, as a long-lived daemon's does; those loads' rows/s are reported as `warm_loads_rows_per_s`. Then
the run renames the same N CSV x M rows into the measured entity's landing folder (the entity is named after the
load) and the load ends when its Delta table holds every file. The other loads' entities idle meanwhile.
rows/s = rows / (last table commit - first landing).

While it runs, every process of the daemon's session is sampled (utime + stime from /proc) and sorted by kind:
the driver (the daemon's Python process, which plans and commits), the driver's JVM, the executors' JVMs, the
executors' Python workers (where the tasks read, decode and write), and the driver side's other Python processes
(the push intake, the streaming sources' runners). CPU per row of the driver against the tasks' shows how little of
the row work is left in the driver.

Goals (issue #20): two executors >= 1.7x the rows/s of one; the driver's CPU per row <= 10% of the tasks'.

What this machine's cores give, measured in the same run (`machine`): the append tasks' row work alone (read,
conform, stage, the changelog's and the table's files, the slice hashes: bench/_row_costs.py), without Spark, on the
same files, in one process of one Arrow thread, then split between two such processes at once. Its two/one is the
most two executors could give here with nothing else running (no driver, no JVM, no scheduling); each load's
`speed_up_of_machine` is its speed-up over it.

Loads (`--loads`): `append`, the entity as ingest_files.py has it; `keyed`, the same files into an upsert entity
keyed by `customer` (20,000 customers) with `sequence_by: [ts]`: its reduction to one change per key runs in the
executors' tasks, a task per bucket of keys, and the driver MERGEs the reduced rows (delta-rs). A keyed run ends
when every file is in a table commit; its table must hold one row per customer of the files.
One JSON object goes to stdout at the end; exit status 0 when every run completed.

    python bench/scale_out.py [--files 200] [--rows 50000] [--loads append,keyed] [--warm-loads 1] [--workdir DIR]
                              [--spark-conf KEY=VALUE ...] [--keep] [--smoke]

`--smoke`: 8 files x 1,000 rows, both loads, no uncounted loads (each run's start-up and the measured loads are the
code paths; the uncounted loads are the same `through` as the measured one, and on 2 cores cost 4 loads' time).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import _row_costs
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from _common import (  # bench/ is the script folder, so on sys.path
    BenchError,
    Deadline,
    Process,
    descends_from,
    kill_group,
    log_events,
    log_tail,
    machine_busy,
    parse_args,
    publish,
    ratio,
    say,
    session_processes,
    stop_daemon,
    workdir,
)
from deltalake import DeltaTable
from ingest_files import CONFIG, ENTITY, LAKEFEED, generate, land, table_rows, wait_ready, watch_table

GOAL_SPEED_UP = 1.7
GOAL_DRIVER_SHARE = 0.10
SMOKE = {"files": 8, "rows": 1000, "timeout": 420.0, "loads": "append,keyed", "warm_loads": 0}
KEYED = "    cdc: {strategy: upsert, primary_key: [customer], sequence_by: [ts]}\n"
KINDS = ("driver", "driver_jvm", "executor_jvm", "executor_python", "driver_side_python")
WARM = "warm"  # the uncounted loads' entities: warm1_append, warm2_append, ..., warm1_keyed, ...


class Sampler:
    """CPU seconds of each process in one session, by kind, sampled until stopped (a process's last sample counts:
    a process that ends between two samples loses at most one interval)."""

    def __init__(self, session: int, interval: float = 0.2) -> None:
        self.session, self.interval = session, interval
        self.cpu: dict[int, float] = {}
        self.kind: dict[int, str] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def snapshot(self) -> dict[int, float]:
        with self._lock:
            return dict(self.cpu)

    def totals(self, since: dict[int, float]) -> dict[str, float]:
        """CPU seconds by kind from a fresh sample, less what each process had at `since` (a snapshot)."""
        self._sample()
        totals = dict.fromkeys(KINDS, 0.0)
        with self._lock:
            for pid, cpu in self.cpu.items():
                totals[self.kind[pid]] += cpu - since.get(pid, 0.0)
        return totals

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)
        self._sample()

    def _sample(self) -> None:
        procs = session_processes(self.session)
        with self._lock:
            for pid, proc in procs.items():
                self.cpu[pid] = max(proc.cpu, self.cpu.get(pid, 0.0))
                # Read again every time: a process just started (vfork, then exec) shows its parent's command line
                # until it execs, so the JVM first seen that way was once counted as a Python process.
                self.kind[pid] = self._kind(proc, procs)

    def _kind(self, proc: Process, procs: dict[int, Process]) -> str:
        if proc.pid == self.session:
            return "driver"
        if _is_executor(proc):
            return "executor_jvm"
        if b"SparkSubmit" in proc.cmdline:
            return "driver_jvm"
        return "executor_python" if descends_from(proc.pid, procs, _is_executor) else "driver_side_python"


def _is_executor(proc: Process) -> bool:
    return b"CoarseGrainedExecutorBackend" in proc.cmdline


def chained(log_path: Path, entity: str, last_offset: int) -> bool:
    """Whether the entity's ODF chain has appended the slice that ends at `last_offset`."""
    events, _ = log_events(log_path)
    return any(e["event"] == "odf.appended" and e.get("entity") == entity and e.get("last_offset") == last_offset
               for e in events)


def changelog_end(table: Path) -> int:
    """The last offset of the changelog."""
    offsets = pa.table(DeltaTable(str(table)).get_add_actions(flatten=True)).column("max.offset")
    return int(pc.max(offsets).as_py())


def customers(source: Path, names: list[str]) -> int:
    """How many customers the files hold: a keyed run's table holds one row each."""
    seen = [pc.unique(pacsv.read_csv(source / name).column("customer")) for name in names]
    return len(pc.unique(pa.chunked_array(seen)))


def through(work: Path, entity: str, landing: Path, names: list[str], source: Path, keyed: bool,
            proc: subprocess.Popen, log_path: Path, deadline: Deadline) -> tuple[dict[str, float], list[dict], float]:
    """One load: hard links of the generated files renamed into `landing`, until the entity's table holds every
    file, its changelog every change and its ODF chain the last slice; when each file landed, the table's commits,
    and how long the chain took after the last commit."""
    staging = work / f"staging-{entity}"
    staging.mkdir()
    for name in names:
        os.link(source / name, staging / name)
    landed = land(staging, landing / "data", names, 0.0)
    lake = work / "lake" / entity
    commits = watch_table(lake / "table", proc, log_path, set(names), deadline)
    committed_at = time.monotonic()
    while keyed and sum(e["event"] == "batch.committed" and e.get("entity") == entity
                        for e in log_events(log_path)[0]) < len(commits):
        deadline.check("waiting for the last batch's changelog")  # it is committed after the table's MERGE
        time.sleep(0.1)
    last = changelog_end(lake / "changelog") if keyed else table_rows(lake / "table") - 1
    while not chained(log_path, entity, last):  # the driver's share includes the ODF chain
        deadline.check("waiting for the ODF chain to take the last rows")
        time.sleep(0.1)
    return landed, commits, time.monotonic() - committed_at


def entity_config(name: str, max_files: int, keyed: bool) -> str:
    """The config of one entity of the run: its own landing folder (named after it), the files as CSV."""
    return (f"  - name: {name}\n"
            f"    source: {{type: local_dir, path: {name}, reconcile_interval_s: 60, "
            f"max_files_per_trigger: {max_files}}}\n"
            f"    manifest: {name}/default.manifest.cdm.json\n"
            "    patterns:\n"
            '      - {name: all, root_location: data, glob_pattern: "/*.csv"}\n'
            "    format: {kind: csv, header: true}\n" + (KEYED if keyed else ""))


def run(work: Path, master: str, names: list[str], source: Path, rows: int, loads: list[str], args,
        deadline: Deadline) -> dict[str, dict]:
    """One daemon on `master` over hard links of the generated files, each load (`append`, `keyed`) through an
    entity of its own (named after the load) after its own uncounted loads (`warm1_append`, ...): each load's
    figures, by load. One daemon for every load: one start-up (a local-cluster's takes 15-20 s) for all of them."""
    work.mkdir(parents=True)
    cfg = work / "lakefeed.yaml"
    warm = {load: [f"{WARM}{i}_{load}" for i in range(1, args.warm_loads + 1)] for load in loads}
    entities = [(name, load) for load in loads for name in (*warm[load], load)]
    head = CONFIG.split("entities:\n")[0].format(trigger=args.trigger_interval, master=master, writer="delta-rs")
    if args.spark_conf:  # a JSON object is a YAML flow mapping
        head = head.replace("\nspark: {", f"\nspark: {{conf: {json.dumps(dict(args.spark_conf))}, ", 1)
    cfg.write_text(head
                   + "entities:\n"
                   + "".join(entity_config(name, args.max_files_per_trigger, load == "keyed")
                             for name, load in entities))
    for name, _ in entities:
        (work / name / "data").mkdir(parents=True)
    log_path = work / "daemon.log"
    say(f"[{master}] starting lakefeed, log {log_path}")
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen([str(LAKEFEED), "run", "--config", str(cfg)], cwd=work, stdin=subprocess.DEVNULL,
                                stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    sampler = Sampler(proc.pid).start()
    try:
        wait_ready(proc, log_path, deadline)
        while not any(e["event"] == "spark.warmed_up" for e in log_events(log_path)[0]):
            deadline.check("waiting for the Spark session's warm-up")  # every executor's worker started: the
            time.sleep(0.1)  # load meets a running cluster, as a long-lived daemon's does
        figures = {load: measure(work, master, load, warm[load], names, source, rows, proc, log_path, sampler,
                                 deadline) for load in loads}
        code = stop_daemon(proc, timeout=min(120.0, max(deadline.left(), 5.0)))
        if code != 0:
            raise BenchError(f"[{master}] the daemon exited with {code}, expected 0")
        return figures
    except BaseException:
        say("daemon log tail:\n" + log_tail(log_path))
        raise
    finally:
        sampler.stop()
        kill_group(proc)


def measure(work: Path, master: str, load: str, warm: list[str], names: list[str], source: Path, rows: int,
            proc: subprocess.Popen, log_path: Path, sampler: Sampler, deadline: Deadline) -> dict:
    """One load on the running daemon: its uncounted loads, then the measured one with the CPU it took."""
    keyed = load == "keyed"
    warm_s = []
    for name in warm:
        say(f"[{master}] {load}: load {len(warm_s) + 1} of {len(warm)} uncounted (entity {name})")
        landed, commits, _ = through(work, name, work / name, names, source, keyed, proc, log_path, deadline)
        warm_s.append(max(c["timestamp_ms"] for c in commits) / 1000 - min(landed.values()))
    before = sampler.snapshot()  # start-up's, the uncounted loads' and the other loads' CPU are not the load's
    busy = machine_busy()
    landed, commits, chain_s = through(work, load, work / load, names, source, keyed, proc, log_path, deadline)
    busy = machine_busy() - busy
    cpu = sampler.totals(since=before)
    elapsed = max(c["timestamp_ms"] for c in commits) / 1000 - min(landed.values())
    held, total = table_rows(work / "lake" / load / "table"), rows * len(names)
    expected = customers(source, names) if keyed else total
    if held != expected:
        raise BenchError(f"[{master}] {load}: the table holds {held} rows, expected {expected}")
    tasks_cpu = cpu["executor_python"] + cpu["executor_jvm"]
    say(f"[{master}] {load}: {total / elapsed:,.0f} rows/s ({elapsed:.2f} s); CPU s: "
        + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items()))
    return {"master": master, "rows": total, "elapsed_s": round(elapsed, 3), "rows_per_s": round(total / elapsed),
            "warm_loads_rows_per_s": [round(total / seconds) for seconds in warm_s],
            "batches": len(commits), "chain_after_commit_s": round(chain_s, 2),
            "cpu_s": {k: round(v, 2) for k, v in cpu.items()},
            "machine_busy_cpu_s": round(busy, 2),
            "driver_cpu_us_per_row": round(cpu["driver"] / total * 1e6, 3),
            "tasks_cpu_us_per_row": round(tasks_cpu / total * 1e6, 3)}


def _conf_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: KEY=VALUE")
    return key, value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=200)
    p.add_argument("--rows", type=int, default=50_000, help="rows per file")
    p.add_argument("--workdir", type=Path, default=None, help="default: a fresh temporary folder")
    p.add_argument("--keep", action="store_true", help="keep the workdir (always kept when --workdir is given)")
    p.add_argument("--timeout", type=float, default=1800.0, help="overall deadline in seconds (default 1800)")
    p.add_argument("--trigger-interval", type=float, default=0.5)
    p.add_argument("--max-files-per-trigger", type=int, default=1000)
    p.add_argument("--warm-loads", type=int, default=1, help="uncounted loads before the measured one")
    p.add_argument("--spark-conf", action="append", default=[], type=_conf_pair, metavar="KEY=VALUE",
                   help="a `spark.conf` entry of the daemon's config, e.g. spark.executor.extraJavaOptions=...; "
                        "repeatable")
    p.add_argument("--loads", default="append", help="append, keyed or both (comma-separated), each on one executor "
                                                     "then two")
    args = parse_args(p, argv, SMOKE)
    if args.warm_loads < 0:
        p.error("--warm-loads: 0 or more")
    loads = args.loads.split(",")
    if not loads or set(loads) - {"append", "keyed"} or len(set(loads)) < len(loads):
        p.error(f"--loads {args.loads!r}: append, keyed or both, each once (comma-separated)")
    deadline = Deadline(args.timeout)
    work, remove = workdir(p, args.workdir, args.keep, "lakefeed-bench-scale-")
    report: dict = {"bench": "scale_out", "smoke": args.smoke, "files": args.files, "rows": args.files * args.rows,
                    "cores": os.cpu_count(), "load_before": os.getloadavg()[0], "ok": False, "workdir": str(work),
                    "spark_conf": dict(args.spark_conf)}
    try:
        say(f"workdir {work}; generating {args.files} files x {args.rows} rows")
        names = generate(work / "generated", args.files, args.rows)
        report["machine"] = machine(work / "machine", [work / "generated" / n for n in names], args)
        one, two = (run(work / name, f"local-cluster[{n},1,1024]", names, work / "generated", args.rows, loads, args,
                        deadline) for n, name in ((1, "one"), (2, "two")))
        report["loads"] = {load: compare(load, one[load], two[load], report["machine"]["speed_up"])
                           for load in loads}
        report["ok"] = True
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


def machine(work: Path, files: list[Path], args) -> dict:
    """The append tasks' row work without Spark on one core, then two (bench/_row_costs.py's `on_cores`)."""
    work.mkdir(parents=True)
    config = work / "lakefeed.yaml"
    config.write_text(CONFIG.format(entity=ENTITY, trigger=args.trigger_interval, max_files=args.max_files_per_trigger,
                                    master="local[1]", writer="delta-rs"))
    one, two = (_row_costs.on_cores(config, ENTITY, files, n, work / str(n)) for n in (1, 2))
    say(f"[machine] the row work alone: one process {one:,.0f} rows/s, two {two:,.0f}: {two / one:.3f}x")
    return {"one_process_rows_per_s": round(one), "two_processes_rows_per_s": round(two),
            "speed_up": ratio(two, one)}


def compare(load: str, one: dict, two: dict, machine_speed_up: float | None) -> dict:
    speed_up = ratio(two["rows_per_s"], one["rows_per_s"])
    share = ratio(two["driver_cpu_us_per_row"], two["tasks_cpu_us_per_row"])
    say(f"[{load}] two executors / one: {speed_up}x (goal >= {GOAL_SPEED_UP}; the row work alone "
        f"{machine_speed_up}x); driver CPU per row / tasks': {share} (goal <= {GOAL_DRIVER_SHARE})")
    return {"one_executor": one, "two_executors": two, "speed_up": speed_up, "goal_speed_up": GOAL_SPEED_UP,
            "speed_up_of_machine": ratio(speed_up, machine_speed_up),
            "driver_over_tasks_cpu_per_row": share, "goal_driver_over_tasks": GOAL_DRIVER_SHARE,
            "goal_met": bool(speed_up and share is not None and speed_up >= GOAL_SPEED_UP
                             and share <= GOAL_DRIVER_SHARE)}


if __name__ == "__main__":
    sys.exit(main())
