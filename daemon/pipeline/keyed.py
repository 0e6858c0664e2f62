"""A keyed batch reduced to one change per key, as tasks: Spark's executors in the daemon, this process without Spark.

The stage tasks (daemon/pipeline/tasks.py) cut the rows they staged into buckets by key (daemon/batch/buckets.py),
so every change of a key is in one bucket. One task per bucket reads that bucket of every staged part, in the
batch's order, resolves the rows' kinds, sets late rows apart, reduces the rows to each key's final change
(`cdc.reduce`) and stages what is left. The driver reads only those rows, one per key, for the MERGE, and settles the
few whose outcome depends on the table (`settled`); the MERGE runs wherever the table's writer can (delta-rs: in the
driver).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakefeed import clock, failpoints
from lakefeed.batch import cdc, event_time
from lakefeed.batch.read import BadRow
from lakefeed.config.model import CdcConfig, EntityConfig
from lakefeed.connectors.sinks.base import TableSink
from lakefeed.inbox.storage import Storage
from lakefeed.pipeline import quarantine_files, tasks
from lakefeed.pipeline.quarantine_files import Quarantined
from lakefeed.pipeline.sinks import delta_sink


@dataclass(frozen=True)
class Reduction:
    """A batch's (or a bucket's) rows as the commit takes them."""

    rows: pa.Table | None  # one change per key; None: no rows
    bad: tuple[tuple[str, BadRow], ...] = ()  # rows of unknown kind, late rows (quarantined), superseded updates
    kept: int = 0  # rows left once those of unknown kind and the late ones are out
    late: int = 0
    latest: datetime | None = None  # the latest event time of the rows kept (the watermark's next step)
    stale: int = 0  # changes older than a deletion of their key (the tombstones'), left out
    quarantined: tuple[Quarantined, ...] = ()  # instead of `bad`: those its tasks wrote (quarantine_files.py)


def reduction(data: pa.Table | None, cfg: EntityConfig, watermark: datetime | None,
              snapshot: cdc.Snapshot | None, tombstones: TableSink | None) -> Reduction:
    """Kinds resolved, late rows set apart (the commit logs those it drops), less the changes a deletion in
    `tombstones` is newer than, one change per key."""
    if data is None:
        return Reduction(None)
    data, bad = cdc.resolve_kinds(data, cfg.cdc)
    late = 0
    if cfg.event_time.late_policy != "apply":
        mask = event_time.late_mask(data, watermark)
        if mask.any():
            late = int(mask.sum())
            if cfg.event_time.late_policy == "quarantine":
                reason = f"late: event time behind the watermark {clock.to_cdm(watermark)}"  # type: ignore[arg-type]
                bad = [*bad, *cdc.bad_rows(data.filter(pa.array(mask)), reason)]
            data = data.filter(pa.array(~mask))
    latest = pc.max(data.column(event_time.EVENT_TIME)).as_py() if data.num_rows else None
    kept = data.num_rows
    if cfg.cdc.strategy in ("ledger", "snapshot"):  # one row of a key counts: the one it keeps
        reduced, dropped = cdc.reduce(data, cfg.cdc, snapshot)
        reduced, stale = _fresh(reduced, cfg, tombstones)
    else:  # each change counts, as applied one by one: those older than the key's deletion never apply
        fresh, stale = _fresh(data, cfg, tombstones)
        reduced, dropped = cdc.reduce(fresh, cfg.cdc, snapshot)
    return Reduction(reduced, (*bad, *dropped), kept, late, latest, stale)


def _fresh(rows: pa.Table, cfg: EntityConfig, tombstones: TableSink | None) -> tuple[pa.Table, int]:
    """Changes older than a deletion of their key are stale: the deletion is newer and stays."""
    keys, seq = list(cfg.cdc.primary_key), cfg.cdc.sequence_by
    if tombstones is None or rows.num_rows == 0:
        return rows, 0
    found = tombstones.lookup(rows.select(keys), seq)
    if found.num_rows == 0:
        return rows, 0
    stale = _older(rows, found, keys, seq)
    return (rows.filter(pa.array(~stale)) if stale.any() else rows), int(stale.sum())


def _older(rows: pa.Table, found: pa.Table, keys: list[str], seq: tuple[str, ...]) -> np.ndarray:
    """Whether each row's sequence is older than that of the row of its key in `found` (keys, then `seq`'s
    columns), compared lexicographically; False where its key is not in `found`."""
    if found.num_rows == 0:
        return np.zeros(rows.num_rows, dtype=bool)
    joined = beside(rows, found.rename_columns([*keys, *(f"__found_{c}" for c in seq)]), keys)
    older = np.zeros(rows.num_rows, dtype=bool)
    equal = np.ones(rows.num_rows, dtype=bool)
    for c in seq:  # lexicographic: older at the first sequence column that differs
        mine, theirs = rows.column(c), joined.column(f"__found_{c}")
        older |= equal & pc.fill_null(pc.less(mine, theirs), False).to_numpy(zero_copy_only=False)
        equal &= pc.fill_null(pc.equal(mine, theirs), False).to_numpy(zero_copy_only=False)
    return older


Stored = Callable[[pa.Table, tuple[str, ...]], pa.Table]  # keys -> the table's rows of them (keys, those columns)
Newer = Callable[[pa.Table, tuple[str, ...]], np.ndarray]  # rows -> whether the table may hold a row newer in those


def settled(reduced: pa.Table, cfg: CdcConfig, stored: Stored,
            may_hold_newer: Newer) -> tuple[pa.Table, list[tuple[str, BadRow]]]:
    """The MERGE rows of a reduced batch, and the updates quarantined on the way, once the table has told what they
    depend on (`stored`: its rows of some keys as they stood before the batch):

    - the keys that wait for their stored row's sequence (`cdc.WAITS`): their changes older than the stored row are
      stale and left out, the others reduced as the table holds the key or not. Only the keys with a change the
      table may hold a newer row than (`may_hold_newer`: by its files' statistics) are looked up; the others
      cannot have a stale change and are reduced as any key is;
    - the rows whose outcome depends on whether the table holds their key (`cdc.path_dependent`).

    A batch that has neither asks the table nothing; one that has both asks once."""
    keys, seq = list(cfg.primary_key), cfg.sequence_by
    bad: list[tuple[str, BadRow]] = []
    waits = cdc.waiting(reduced)
    asked = reduced.slice(0, 0)
    if waits.any():
        rows = cdc.as_they_came(reduced.filter(pa.array(waits)))
        maybe = _of_keys(rows, keys, may_hold_newer(rows, seq))
        free, bad = cdc.reduce(rows.filter(pa.array(~maybe)), cfg, stored_known=True)
        reduced, asked = pa.concat_tables([reduced.filter(pa.array(~waits)), free]), rows.filter(pa.array(maybe))
    marked = cdc.path_dependent(reduced)
    if not marked.any() and not asked.num_rows:
        return reduced, bad
    probe = pa.concat_tables([reduced.filter(pa.array(marked)).select(keys), asked.select(keys)])
    found = stored(probe, seq if asked.num_rows else ())
    absent: list[tuple[str, BadRow]] = []
    if marked.any():
        held = np.zeros(reduced.num_rows, dtype=bool)
        held[marked] = _held(reduced.filter(pa.array(marked)), found, keys)
        reduced, absent = cdc.resolve(reduced, held)
    if asked.num_rows:
        fresh, dropped = cdc.reduce(asked.filter(pa.array(~_older(asked, found, keys, seq))), cfg, stored_known=True)
        fresh, more = cdc.resolve(fresh, _held(fresh, found, keys))
        reduced, absent = pa.concat_tables([reduced, fresh]), [*absent, *dropped, *more]
    return reduced, [*bad, *absent]


def _held(rows: pa.Table, found: pa.Table, keys: list[str]) -> np.ndarray:
    """Whether each row's key is in `found`."""
    found = found.select(keys).append_column("__held", pa.array(np.ones(found.num_rows, dtype=bool)))
    return beside(rows, found, keys).column("__held").is_valid().to_numpy(zero_copy_only=False)


def _of_keys(rows: pa.Table, keys: list[str], marked: np.ndarray) -> np.ndarray:
    """Every row of a key one of whose rows is marked."""
    if marked.all() or not marked.any():
        return marked
    return _held(rows, rows.filter(pa.array(marked)).select(keys).group_by(keys).aggregate([]), keys)


def beside(rows: pa.Table, found: pa.Table, keys: list[str]) -> pa.Table:
    """`found`'s columns beside each row of `rows` (null where its key is not in `found`), in row order."""
    numbered = rows.select(keys).append_column("__row", pa.array(np.arange(rows.num_rows)))
    return numbered.join(found, keys=keys, join_type="left outer").sort_by("__row")


@dataclass(frozen=True)
class ReduceJob:
    cfg: EntityConfig
    parts: tuple[tuple[str, int], ...]  # the bucket of each staged part, in the batch's order, and what its rows'
    # order is shifted by (a Kafka part's rows are numbered from 0 within the part: the batch orders them)
    schema: pa.Schema  # of the batch's rows (every staged part's, unified)
    retracted: tuple[str, ...]  # files whose rows are not the state (a snapshot's, gone before the batch)
    watermark: datetime | None
    snapshot: cdc.Snapshot | None
    staging: str  # the batch's staging folder: the bucket's reduced rows are staged in it
    bucket: int
    checked_at: datetime  # the batch's: its bad rows' time in the quarantine


@dataclass(frozen=True)
class Reduced:
    reduction: Reduction  # without its rows: they are at `path`
    path: str | None
    worker: str


def reduce_bucket(job: ReduceJob) -> Reduced:
    where, attempt = tasks.worker()
    cfg = job.cfg
    tables = []
    for path, shift in job.parts:
        rows = tasks.shaped(tasks.read_staged(cfg, path), job.schema)
        if shift:
            order = pc.add(rows.column(cdc.ORDER), pa.scalar(shift, pa.int64()))
            rows = rows.set_column(rows.schema.get_field_index(cdc.ORDER), cdc.ORDER, order)
        tables.append(rows)
    data = pa.concat_tables(tables) if tables else None
    if data is not None and job.retracted:
        data = data.filter(pc.invert(pc.is_in(data.column("source_file"), pa.array(job.retracted, pa.string()))))
    # The tombstones read here, by delta-rs whichever writer wrote them: each task looks up its own keys.
    tombstones = delta_sink(cfg, cfg.tombstones) if cfg.cdc.sequence_by else None
    done = reduction(data, cfg, job.watermark, job.snapshot, tombstones)
    if done.bad:  # late rows may be a whole backfill: written here, not returned
        written = quarantine_files.of_task(cfg, done.bad, job.staging, job.checked_at, f"r{job.bucket}",
                                           (where, attempt))
        done = replace(done, bad=(), quarantined=(written,))
    if done.rows is None:
        return Reduced(done, None, where)
    path = tasks.write_staged(Storage(cfg.storage), f"{job.staging}/reduced/{job.bucket}-a{attempt}.arrow", done.rows)
    failpoints.reached("task.reduced")  # staged, not returned: a retry stages its own
    return Reduced(replace(done, rows=None), path, where)


def reduce_staged(spread: tasks.Spread, cfg: EntityConfig, staged: list[tasks.Staged], batch_id: int,
                  staging: str, checked_at: datetime, watermark: datetime | None, snapshot: cdc.Snapshot | None,
                  retracted: tuple[str, ...] = (), numbered: bool = False) -> tuple[Reduction, list[str]]:
    """The batch's reduction, a task per bucket, and where those tasks ran; `numbered`: the staged parts' rows are
    ordered within each part (a Kafka batch's), and the batch orders the parts."""
    jobs = _reduce_jobs(cfg, staged, batch_id, staging, checked_at, watermark, snapshot, retracted, numbered)
    if isinstance(jobs, Reduction):
        return jobs, []
    return _combined(cfg, spread.map(reduce_bucket, jobs, f"lakefeed {cfg.name} batch {batch_id}: reduce"))


def _reduce_jobs(cfg: EntityConfig, staged: list[tasks.Staged], batch_id: int, staging: str, checked_at: datetime,
                 watermark: datetime | None, snapshot: cdc.Snapshot | None, retracted: tuple[str, ...],
                 numbered: bool) -> Reduction | list[ReduceJob]:
    """A task's job for each bucket that has rows; or, for a batch without rows, its reduction (nothing to spread)."""
    schemas = [s.schema for s in staged if s.schema is not None]  # files without rows too: their columns count
    if not schemas:
        return Reduction(None)
    schema = pa.unify_schemas(schemas, promote_options="permissive")
    parts = [s for s in staged if s.rows]
    if not parts:  # no rows, but what they would be: that makes the table (and a snapshot's empty state)
        return reduction(schema.empty_table(), cfg, watermark, snapshot, None)
    widths = {len(s.buckets) for s in parts}
    assert len(widths) == 1, f"a batch's parts were cut into different numbers of buckets: {sorted(widths)}"
    shifted, before = [], 0
    for s in parts:
        shifted.append((s, batch_id * cdc.ROWS_PER_SOURCE + before if numbered else 0))
        before += s.rows
    jobs = [ReduceJob(cfg, tuple((s.buckets[b], shift) for s, shift in shifted if s.buckets[b]), schema, retracted,
                      watermark, snapshot, staging, b, checked_at) for b in range(len(parts[0].buckets))]
    return [j for j in jobs if j.parts]


def _combined(cfg: EntityConfig, done: list[Reduced]) -> tuple[Reduction, list[str]]:
    """The buckets' reductions as the batch's (every change of a key is in one bucket), and where they ran."""
    tables = [tasks.read_staged(cfg, d.path) for d in done if d.path]
    latest = [d.reduction.latest for d in done if d.reduction.latest is not None]
    return Reduction(pa.concat_tables(tables) if tables else None,
                     tuple(b for d in done for b in d.reduction.bad), sum(d.reduction.kept for d in done),
                     sum(d.reduction.late for d in done), max(latest, default=None),
                     sum(d.reduction.stale for d in done), tuple(q for d in done for q in d.reduction.quarantined)
                     ), [d.worker for d in done]


# -- a batch that is one stage task: that task reduces it as well ---------------------------------------------------

def in_one_task(cfg: EntityConfig, stage: Callable[[Any], list[tasks.Staged]], job: tasks.StageJob | tasks.FramesJob,
                committer: Any, batch_id: int) -> tuple[Callable[[Any], Any], Any, str] | None:
    """How a batch of one stage task goes on in that task, if it does: an append batch is written by it
    (`tasks.whole`), a keyed one reduced (`stage_and_reduce`), but for a snapshot's, whose plan (the files
    retracted, the state replaced) the driver makes from what the stage found. (work, its job, what it does)."""
    if not cfg.cdc.keyed:
        return tasks.whole, tasks.WholeJob(stage, job, committer.plan_whole(batch_id)), "write"
    if cfg.cdc.strategy == "snapshot":
        return None
    return stage_and_reduce, FusedJob(stage, job, committer.watermark_before(batch_id), batch_id), "reduce"


@dataclass(frozen=True)
class FusedJob:
    stage: Callable[[Any], list[tasks.Staged]]
    job: tasks.StageJob | tasks.FramesJob
    watermark: datetime | None  # the batch's, for the reduction (the stage job's own is None: it sets none apart)
    batch_id: int


@dataclass(frozen=True)
class Fused:
    watermark: datetime | None  # the reduction's: the driver reduces again if the batch's has moved since
    staged: tuple[tasks.Staged, ...]
    reduced: Reduction | tuple[Reduced, ...]  # each bucket's; or the reduction of a batch without rows

    def quarantined(self) -> tuple[Quarantined, ...]:
        """The files of bad rows the reduction wrote."""
        if isinstance(self.reduced, Reduction):
            return self.reduced.quarantined
        return tuple(q for done in self.reduced for q in done.reduction.quarantined)


def stage_and_reduce(job: FusedJob) -> Fused:
    """Stage the batch's rows and reduce them, each bucket as its own task would (one Spark job instead of two: a
    job costs 0.1-0.2 s, which a small keyed batch would otherwise pay twice)."""
    staged = job.stage(job.job)
    jobs = _reduce_jobs(job.job.cfg, staged, job.batch_id, job.job.staging, job.job.checked_at, job.watermark, None,
                        (), False)
    return Fused(job.watermark, tuple(staged), jobs if isinstance(jobs, Reduction) else tuple(map(reduce_bucket, jobs)))


def fused_reduction(cfg: EntityConfig, fused: Fused) -> tuple[Reduction, list[str]]:
    if isinstance(fused.reduced, Reduction):
        return fused.reduced, []
    return _combined(cfg, list(fused.reduced))
