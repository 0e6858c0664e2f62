"""Memory benchmark: the whole daemon's footprint with many entities under a light, steady load.

The daemon (`lakefeed run`, local Spark) runs `--entities` entities, each with a landing folder and a push source.
Every `--period` seconds one small CSV lands for the next entity in turn and one push of a few records goes to
another, for `--seconds`. Every `--sample-every` seconds, the proportional set size (PSS, from
/proc/<pid>/smaps_rollup: shared pages split between the processes that share them, so the kinds add up) of every
process of the daemon's session (and of its intake's) is read and sorted by kind:

* driver: the daemon's Python process;
* driver_jvm: Spark's JVM (driver, and in local mode the executor too);
* python_workers: the processes Spark started for Python, under the JVM: on a local master, mostly the stand-ins
  (daemon/ops/stand_in.c; without a C compiler at set-up, the launchers) of the processes the fork server forked;
  on another, pyspark.daemon and its workers too;
* runners: the fork server (daemon/ops/fork_server.py) and what it forked: the streaming sources' runners, the data
  source planners' daemons and, on local[N], the tasks' daemon and its workers;
* intake: the push intake process;
* other: anything else in the session.

Reported: per kind and in all, the PSS at the first sample after the load starts, the mean, the max and the last,
and the total's slope (MiB per hour, least squares over the run, and over its last half) and the mean of each
tenth of the run, per kind and in all (`tenths_mean_mib`), to show whether it stays flat and which kind grows; and
the cores each kind kept busy on average under the load (`cores_used`: CPU seconds over the load's
seconds). The run checks that every landed and pushed row reached its table. Goal (issue #20): <= 1.5 GiB PSS in
all for 20 entities, flat over an hour. One JSON object goes to stdout at the end; exit status 0 when the run completed.

    python bench/memory.py [--entities 20] [--seconds 3600] [--period 1.0] [--workdir DIR] [--keep] [--smoke]

`--smoke`: 2 entities for 8 s.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import yaml
from _common import (  # bench/ is the script folder, so on sys.path
    INTAKE_CMDLINE,
    BenchError,
    Deadline,
    Process,
    descends_from,
    kill_group,
    log_tail,
    parse_args,
    publish,
    say,
    session_processes,
    stop_daemon,
    workdir,
)
from deltalake import DeltaTable
from ingest_files import LAKEFEED, wait_ready

GOAL_MIB = 1536
SMOKE = {"entities": 2, "seconds": 8.0, "sample_every": 1.0, "timeout": 300.0}
KINDS = ("driver", "driver_jvm", "python_workers", "runners", "intake", "other")
TOKEN = "bench-memory-token"
ROWS = 20  # per landed file and per push


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(work: Path, entities: int, port: int) -> Path:
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    doc = {
        "lake_dir": "lake", "state_dir": "state", "log_level": "INFO",
        "spark": {"master": "local[2]", "trigger_interval_s": 1.0},
        "http": {"host": "127.0.0.1", "port": port},
        "entities": [{
            "name": f"e{i:02d}",
            "source": {"type": "local_dir", "path": f"landing/e{i:02d}", "reconcile_interval_s": 300},
            "manifest": f"landing/e{i:02d}/default.manifest.cdm.json",
            "patterns": [{"name": "all", "root_location": "data", "glob_pattern": "/*.csv"}],
            "format": {"kind": "csv", "header": True},
            "push": [{"name": "api", "tokens_sha256": [digest]}],
        } for i in range(entities)],
    }
    path = work / "lakefeed.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    for i in range(entities):
        (work / "landing" / f"e{i:02d}" / "data").mkdir(parents=True)
    return path


def cpu_by_kind(session: int) -> dict[int, tuple[str, float]]:
    """Each process's kind and CPU seconds, those of the children it waited for included (short-lived processes
    the JVM or Python starts end before any sample sees them: their time is their parent's to count)."""
    procs = session_processes(session)
    return {pid: (_kind(proc, procs, session), proc.cpu + proc.reaped_cpu) for pid, proc in procs.items()}


def cores_used(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
               seconds: float) -> dict[str, float]:
    """The cores each kind kept busy between two readings, on average: the CPU time gained by the processes there at
    the second, over the seconds between (a process that ended between them counts in its parent, if it waited)."""
    used = dict.fromkeys(KINDS, 0.0)
    for pid, (kind, cpu) in after.items():
        used[kind] += cpu - before.get(pid, (kind, 0.0))[1]
    return {kind: round(value / seconds, 3) for kind, value in used.items()}


def pss_by_kind(session: int) -> dict[str, float]:
    """MiB of PSS of each kind of process in the daemon's session."""
    procs = session_processes(session, pss=True)
    totals = dict.fromkeys(KINDS, 0.0)
    for proc in procs.values():
        totals[_kind(proc, procs, session)] += proc.pss_mib
    return totals


def _is_java(proc: Process) -> bool:
    return b"java" in proc.cmdline.split(b"\0")[0]


def _kind(proc: Process, procs: dict[int, Process], session: int) -> str:
    if proc.pid == session:
        return "driver"
    if INTAKE_CMDLINE in proc.cmdline:
        return "intake"
    if b"lakefeed.ops.fork_server" in proc.cmdline:
        return "runners"
    if _is_java(proc):
        return "driver_jvm"
    return "python_workers" if descends_from(proc.pid, procs, _is_java) else "other"


def push(port: int, entity: str, first: int) -> None:
    rows = [{"id": i, "amount": i * 0.5, "note": "pushed"} for i in range(first, first + ROWS)]
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/entities/{entity}/sources/api/records",
                                     data=json.dumps(rows).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json",
                                              "Idempotency-Key": f"{entity}-{first}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        if response.status != 202:
            raise BenchError(f"push to {entity} answered {response.status}")


def land(work: Path, entity: str, n: int, first: int) -> None:
    folder = work / "landing" / entity / "data"
    tmp = folder.parent / f".f{n:06d}.tmp"
    tmp.write_text("id,amount,note\n" + "".join(f"{i},{i * 0.5},landed\n" for i in range(first, first + ROWS)))
    os.replace(tmp, folder / f"f{n:06d}.csv")


def rows_in(table: Path) -> int:
    try:
        return DeltaTable(str(table)).to_pyarrow_table(columns=["id"]).num_rows
    except Exception:  # noqa: BLE001 - not there yet
        return 0


def summary(samples: list[dict[str, float]]) -> dict:
    out = {}
    for kind in (*KINDS, "total"):
        values = np.array([s[kind] for s in samples])
        out[kind] = {"first_mib": round(values[0], 1), "mean_mib": round(values.mean(), 1),
                     "max_mib": round(values.max(), 1), "last_mib": round(values[-1], 1)}
    return out


def tenths(samples: list[dict[str, float]]) -> dict[str, list[float]]:
    """The mean of each tenth of the samples (one part a sample when there are fewer), per kind and in all."""
    parts = np.array_split(np.arange(len(samples)), min(10, len(samples)))
    return {kind: [round(float(np.mean([samples[i][kind] for i in part])), 1) for part in parts]
            for kind in (*KINDS, "total")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--entities", type=int, default=20)
    p.add_argument("--seconds", type=float, default=3600.0, help="how long the load runs")
    p.add_argument("--period", type=float, default=1.0, help="seconds between one landing and one push")
    p.add_argument("--sample-every", type=float, default=10.0)
    p.add_argument("--workdir", type=Path, default=None, help="default: a fresh temporary folder")
    p.add_argument("--keep", action="store_true", help="keep the workdir (always kept when --workdir is given)")
    p.add_argument("--timeout", type=float, default=None, help="overall deadline (default: seconds + 600)")
    args = parse_args(p, argv, SMOKE)
    deadline = Deadline(args.timeout or args.seconds + 600)
    work, remove = workdir(p, args.workdir, args.keep, "lakefeed-bench-memory-")
    report: dict = {"bench": "memory", "smoke": args.smoke, "entities": args.entities, "seconds": args.seconds,
                    "cores": os.cpu_count(), "load_before": os.getloadavg()[0], "ok": False, "workdir": str(work)}
    port = free_port()
    cfg = config(work, args.entities, port)
    log_path = work / "daemon.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen([str(LAKEFEED), "run", "--config", str(cfg)], cwd=work, stdin=subprocess.DEVNULL,
                                stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        t0 = time.monotonic()
        wait_ready(proc, log_path, deadline)
        report["startup_s"] = round(time.monotonic() - t0, 1)
        report["idle"] = pss_by_kind(proc.pid)
        say(f"ready after {report['startup_s']} s; idle PSS {sum(report['idle'].values()):.0f} MiB; load for "
            f"{args.seconds:.0f} s")
        entities = [f"e{i:02d}" for i in range(args.entities)]
        samples, times = [], []
        landed = pushed = n = 0
        start = time.monotonic()
        next_sample = start
        cpu_before = cpu_by_kind(proc.pid)
        while time.monotonic() - start < args.seconds:
            deadline.check("running the load")
            if proc.poll() is not None:
                raise BenchError(f"the daemon exited with {proc.returncode} under load")
            land(work, entities[n % len(entities)], n, n * ROWS)
            push(port, entities[(n + len(entities) // 2) % len(entities)], n * ROWS)
            landed, pushed, n = landed + 1, pushed + 1, n + 1
            if time.monotonic() >= next_sample:
                sample = pss_by_kind(proc.pid)
                sample["total"] = sum(sample.values())
                samples.append(sample)
                times.append(time.monotonic() - start)
                next_sample += args.sample_every
            time.sleep(args.period)
        cores = cores_used(cpu_before, cpu_by_kind(proc.pid), time.monotonic() - start)
        cores["total"] = round(sum(cores.values()), 3)
        expected = (landed + pushed) * ROWS
        wait_rows = time.monotonic()
        while sum(rows_in(work / "lake" / e / "table") for e in entities) < expected:
            deadline.check(f"waiting for {expected} rows in the tables")
            time.sleep(1.0)
        found = sum(rows_in(work / "lake" / e / "table") for e in entities)
        if found != expected:
            raise BenchError(f"the tables hold {found} rows, expected {expected}")
        code = stop_daemon(proc, timeout=120.0)
        if code != 0:
            raise BenchError(f"the daemon exited with {code}, expected 0")
        totals = np.array([s["total"] for s in samples])
        hours = np.array(times) / 3600
        slope = float(np.polyfit(hours, totals, 1)[0]) if len(samples) > 2 else None
        later = hours >= hours[-1] / 2  # past the start's growth (the JVM's heap and compiled code)
        late_slope = float(np.polyfit(hours[later], totals[later], 1)[0]) if later.sum() > 2 else None
        report.update({
            "landed_files": landed, "pushes": pushed, "rows": found,
            "drain_s": round(time.monotonic() - wait_rows, 1),
            "samples": len(samples), "pss": summary(samples), "tenths_mean_mib": tenths(samples),
            "cores_used": cores,
            "total_slope_mib_per_hour": round(slope, 1) if slope is not None else None,
            "total_slope_last_half_mib_per_hour": round(late_slope, 1) if late_slope is not None else None,
            "goal_mib": GOAL_MIB, "goal_met": bool(totals.max() <= GOAL_MIB),
            "ok": True,
        })
        say(f"PSS in all: first {totals[0]:.0f} MiB, max {totals.max():.0f} MiB, last {totals[-1]:.0f} MiB "
            f"(goal <= {GOAL_MIB}); slope {report['total_slope_mib_per_hour']} MiB/h; by kind, max: "
            + ", ".join(f"{k} {v['max_mib']:.0f}" for k, v in report["pss"].items() if k != "total")
            + f"; cores kept busy {cores['total']}")
        return 0
    except (BenchError, OSError) as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
        say(f"FAILED: {report['error']}")
        say("daemon log tail:\n" + log_tail(log_path))
        return 1
    except KeyboardInterrupt:
        report["error"] = "interrupted"
        return 1
    finally:
        kill_group(proc)
        publish(report, work, remove)


if __name__ == "__main__":
    sys.exit(main())
