"""Bad rows written where they were found: a task (a stage task, a keyed reduction's) writes its bad rows as a
Parquet file of the entity's quarantine table, in that table's storage (local or s3://), and returns only the file's
add action, their count and the few rows the commit logs. The driver commits the files of a batch's tasks, and the
few bad rows it found itself (a unit whose task died, a change to a key the table lacks), in one transaction of the
quarantine under the batch's application id: exactly once, as the table's and the changelog's files. A file no
commit took (the batch's replay found the quarantine done, a task's earlier attempt) is removed: by name at once,
or by `Staging.sweep`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from lakefeed.batch.changelog import quarantine_table
from lakefeed.batch.read import BadRow
from lakefeed.config.model import EntityConfig
from lakefeed.connectors.sinks import data_files
from lakefeed.connectors.sinks.data_files import DataFile
from lakefeed.inbox.storage import Storage
from lakefeed.pipeline.staged_files import batch_of

# The bad rows of a batch logged one by one (`row.quarantined`); the rest are counted by file (`rows.quarantined`): a
# hostile file of a million bad rows wrote a million log lines, which took 28 of the 50 s of a batch of 300k.
LOGGED_ROWS = 20


@dataclass(frozen=True)
class Quarantined:
    """Bad rows written as quarantine files, as the driver needs them: the files, and what to log."""
    files: tuple[DataFile, ...]
    rows: int
    sample: tuple[tuple[str, int | None, str], ...]  # the first LOGGED_ROWS: source file, line, reason
    by_file: tuple[tuple[str, int], ...]  # how many bad rows each source file gave
    retried: bool = False  # written by a task's later attempt: an earlier one may have left files
    worker: str = ""  # the task's process (host:pid; "": the driver)


def of_task(cfg: EntityConfig, bad: Sequence[tuple[str, BadRow]], staging: str, checked_at: datetime, unit: str,
            task: tuple[str, int]) -> Quarantined:
    """`write` in a task of the batch whose staging folder is `staging`; `unit`: which of its tasks; `task`: its
    process and attempt (`tasks.worker()`)."""
    (where, attempt), (token, batch_id) = task, batch_of(staging)
    name = f"{data_files.prefix(token, batch_id)}q{unit}-a{attempt}"
    return replace(write(cfg, bad, batch_id, checked_at, name), retried=attempt > 0, worker=where)


def write(cfg: EntityConfig, bad: Sequence[tuple[str, BadRow]], batch_id: int, checked_at: datetime,
          name: str) -> Quarantined:
    """`bad` as the quarantine's rows of batch `batch_id`, in files named `name`-<n>-<uuid>."""
    rows = quarantine_table(cfg.name, bad, batch_id, checked_at)
    out, root = Storage(cfg.storage).fs_of(cfg.quarantine)
    files = data_files.write(out, root, rows, name)
    sample = tuple((path, row.line, row.reason) for path, row in bad[:LOGGED_ROWS])
    return Quarantined(tuple(files), rows.num_rows, sample, tuple(Counter(path for path, _ in bad).items()))


def discard(cfg: EntityConfig, parts: Sequence[Quarantined], log_: Any,
            reason: str = "bad rows of a replayed batch, whose quarantine commit was done") -> None:
    """The files of bad rows no commit will take (the quarantine has the batch already; a reduction done again):
    removed now."""
    files = [f for part in parts for f in part.files]
    if not files:
        return
    out, root = Storage(cfg.storage).fs_of(cfg.quarantine)
    for file in files:
        out.delete_file(f"{root}/{file.path}")
    log_.info("files.orphans_removed", table=str(cfg.quarantine), files=len(files), reason=reason)


def log_rows(log_: Any, parts: Sequence[Quarantined]) -> None:
    """The first LOGGED_ROWS bad rows one by one, and how many there were of each file past those."""
    sample = [row for part in parts for row in part.sample][:LOGGED_ROWS]
    for source_file, line, reason in sample:
        log_.warning("row.quarantined", file=source_file, line=line, reason=reason)
    total = sum(part.rows for part in parts)
    if total > LOGGED_ROWS:
        counts: Counter[str] = Counter()
        for part in parts:
            counts.update(dict(part.by_file))
        log_.warning("rows.quarantined", rows=total, logged=LOGGED_ROWS, files=dict(counts.most_common(LOGGED_ROWS)))

