"""Where a row's CPU goes: each step of the append path, as its tasks run it, beside the floor's two steps, on the
same files in this process (time.process_time: the CPU of every thread, Arrow's and delta-rs's included).

On a machine whose cores the load keeps busy, rows/s is the cores over the CPU a row costs, so the floor's CPU per
row over lakefeed's is the ratio lakefeed could reach with nothing but its row work: the `ceiling` of
ingest_files.py's ratio. What the measured ratio lacks beyond it is the daemon's own cost (Spark's jobs, the
commit, the manifests, cores left idle).

`on_cores` runs the same row work, without Spark, in N processes of one Arrow thread each (as Spark's tasks run on
executors of one core): what N cores of this machine give for it, the ceiling of scale_out.py's speed-up.
"""

from __future__ import annotations

import multiprocessing
import queue
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
from _common import BenchError  # bench/ is the script folder, so on sys.path
from deltalake import write_deltalake

from lakefeed.batch.changelog import build_changelog, data_columns
from lakefeed.batch.discovery import Partition
from lakefeed.config.model import EntityConfig, load
from lakefeed.connectors.sinks import data_files
from lakefeed.inbox.files import InboxRecord
from lakefeed.odf import slices
from lakefeed.pipeline import tasks

T = TypeVar("T")
HASHES = "write: changelog slice hashes (ODF)"  # the step the ODF chain needs (arrow-digest's logical hash)


class _Clock:
    def __init__(self) -> None:
        self.spent: dict[str, float] = {}

    def __call__(self, step: str, work: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        start = time.process_time()
        out = work(*args, **kwargs)
        self.spent[step] = self.spent.get(step, 0.0) + time.process_time() - start
        return out


def measure(cfg: EntityConfig, files: list[Path], floor_types: dict[str, pa.DataType], work: Path,
            goal_ratio: float) -> dict:
    """CPU microseconds per row of each step over `files` (landed CSVs of one schema), and the ceiling. A pass over
    the first file comes first, uncounted: it loads code and warms the caches, which neither run pays per row.
    `goal_ratio` (of lakefeed's rows/s to the floor's) gives the `budget`: the CPU a row of the whole path may cost
    for it on busy cores, and what the ODF slice's hashes alone take of it."""
    _floor(_Clock(), files[:1], floor_types, work / "warm-up")
    _steps(_Clock(), cfg, files[:1], work / "warm-up")
    clock = _Clock()
    _floor(clock, files, floor_types, work / "measured")
    rows = _steps(clock, cfg, files, work / "measured")
    per_row = {step: round(seconds / rows * 1e6, 4) for step, seconds in clock.spent.items()}
    floor_us = sum(v for k, v in per_row.items() if k.startswith("floor"))
    lakefeed_us = sum(v for k, v in per_row.items() if not k.startswith("floor"))
    budget_us = floor_us / goal_ratio
    return {"rows": rows, "files": len(files), "cpu_us_per_row": per_row, "floor_cpu_us_per_row": round(floor_us, 4),
            "lakefeed_cpu_us_per_row": round(lakefeed_us, 4), "ceiling": round(floor_us / lakefeed_us, 3),
            "budget_cpu_us_per_row": round(budget_us, 4),
            "odf_hashes_over_budget": round(per_row[HASHES] / budget_us, 3)}


def on_cores(config: Path, entity: str, files: list[Path], processes: int, work: Path) -> float:
    """Rows/s of the row work alone (`_steps`) over `files`, split among `processes` fresh processes of one Arrow
    thread each. Each first passes over one file, uncounted; the clock starts once all have."""
    context = multiprocessing.get_context("spawn")
    ready, results = context.Barrier(processes), context.Queue()
    workers = [context.Process(target=_worker, args=(config, entity, files[n::processes], work / f"process-{n}",
                                                     ready, results)) for n in range(processes)]
    for worker in workers:
        worker.start()
    spans: list[Any] = []
    try:
        while len(spans) < processes:
            try:
                spans.append(results.get(timeout=1.0))
            except queue.Empty:
                if sum(w.exitcode is not None for w in workers) > len(spans):
                    try:  # a process that put its word before it exited may have done so since the wait ended
                        spans.append(results.get(timeout=5.0))
                    except queue.Empty:
                        raise BenchError("a process of the row work died without a word: exit codes "
                                         f"{[w.exitcode for w in workers]}") from None
    finally:
        for worker in workers:
            worker.join(timeout=60)
            if worker.is_alive():
                worker.kill()
    if any(isinstance(span, str) for span in spans):
        raise BenchError(f"the row work failed: {[s for s in spans if isinstance(s, str)]}")
    rows = sum(span[0] for span in spans)
    return rows / (max(span[2] for span in spans) - min(span[1] for span in spans))


def _worker(config: Path, entity: str, files: list[Path], work: Path, ready: Any, results: Any) -> None:
    try:
        pa.set_cpu_count(1)  # as a task on an executor of one core (Spark sets OMP_NUM_THREADS=1)
        cfg = next(e for e in load(config).entities if e.name == entity)
        _steps(_Clock(), cfg, files[:1], work / "warm-up")
        ready.wait(timeout=600)
        start = time.monotonic()
        rows = _steps(_Clock(), cfg, files, work / "measured")
        results.put((rows, start, time.monotonic()))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
        ready.abort()  # the others stop waiting for this one
        results.put(f"{type(exc).__name__}: {exc}")


def _floor(clock: _Clock, files: list[Path], floor_types: dict[str, pa.DataType], work: Path) -> None:
    convert = pacsv.ConvertOptions(column_types=floor_types)
    floor = [clock("floor: read", pacsv.read_csv, path, convert_options=convert) for path in files]
    clock("floor: write_deltalake", write_deltalake, str(work / "floor"), pa.concat_tables(floor), mode="append")


def _steps(clock: _Clock, cfg: EntityConfig, files: list[Path], work: Path) -> int:
    fs = pafs.LocalFileSystem()
    now = datetime.now(UTC)
    rows, target = 0, None
    for n, path in enumerate(files):
        stat = path.stat()
        record = InboxRecord(n, str(path), stat.st_size, stat.st_mtime_ns, now.isoformat())
        job = tasks.StageJob(cfg, ((record, Partition(f"data/{path.name}")),), target, now, None,
                             str(work / "staging"))
        staged = clock("stage: read, conform, stamp, stage", tasks.stage, job)[0]
        target = target or staged.schema
        data = clock("write: read the staged rows", tasks.read_staged, cfg, staged.path)
        changelog = clock("write: changelog rows", build_changelog, data, rows, 0, now)
        seen: list[tuple[pa.Table, pa.Buffer]] = []
        clock("write: changelog file (Parquet, statistics)", data_files.write, fs, str(work / "changelog"),
              changelog, f"part-cost-{n}", seen=partial(_keep, seen))
        for written, encoded in seen:
            clock(HASHES, slices.describe, written, encoded)
        clock("write: table file (Parquet, statistics)", data_files.write, fs, str(work / "table"),
              data_columns(data), f"part-cost-{n}")
        rows += data.num_rows
    return rows


def _keep(into: list[tuple[pa.Table, pa.Buffer]], _file: data_files.DataFile, written: pa.Table,
          encoded: pa.Buffer) -> None:
    into.append((written, encoded))
