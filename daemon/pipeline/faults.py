"""Why a batch failed, which decides what happens next.

A store fault (a full disk, an I/O error, an unreachable bucket, a concurrent writer, a table found
missing) may go away: the batch is tried again, with backoff, and nothing moves on until it commits. A data
fault (rows the table cannot take: a schema it refuses, a value it cannot store) will not go
away however often the batch is tried: its rows are parked in quarantine with the reason and
the stream goes on, so one bad record can never strand what was acknowledged after it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from lakefeed.batch import cdc
from lakefeed.batch.changelog import QUARANTINE_SCHEMA
from lakefeed.batch.read import BadRow
from lakefeed.pipeline import quarantine_files, tasks
from lakefeed.pipeline.commit import BatchResult, Committer
from lakefeed.pipeline.tasks import Spread, Staged
from lakefeed.pipeline.verdict import data_fault


def commit_or_park(committer: Committer, commit: Callable[[], None], staged: list[Staged], result: BatchResult,
                   checked_at: datetime, log_: Any, retracted: Sequence[str] = ()) -> None:
    """Commit a batch that tasks read and staged; if the data is at fault, put every row of it in quarantine instead
    (once, also on replay: under an application id of its own) and let the stream go on. Only then are its rows read
    here, from the staging folder; `retracted`: files whose rows are not the batch's."""
    try:
        commit()
        return
    except Exception as exc:
        committer.staging.failed(result.batch_id)  # its tasks' files are looked for when it commits
        if not data_fault(exc) or _partly_committed(committer, result.batch_id):
            raise  # a batch some table already holds is completed on replay, never parked in part
        reason = f"the table refused this batch ({type(exc).__name__}: {str(exc)[:500]}); nothing of it was applied"
    # Part by part: parts whose types no one type holds may be what the table refused.
    data = [tasks.read_staged(committer.cfg, path) for s in staged for path in s.paths]
    if retracted:
        gone = pa.array(list(retracted), pa.string())
        data = [part.filter(pc.invert(pc.is_in(part.column("source_file"), gone))) for part in data]
    log_.error("batch.parked", error=reason, rows=sum(part.num_rows for part in data))
    _park(committer, data, [b for s in staged for b in s.bad], result, checked_at, reason, staged, log_)


def _park(committer: Committer, data: list[pa.Table], bad: list[tuple[str, BadRow]], result: BatchResult,
          checked_at: datetime, reason: str, staged: list[Staged], log_: Any) -> None:
    """The batch's rows, and its bad rows unless the quarantine has them already (`bad`, and the files its tasks
    wrote: `staged`), in one commit of the quarantine under an application id of its own."""
    batch_id = result.batch_id
    held = committer.done(committer.sinks.quarantine, batch_id)
    parked = [] if held else list(bad)
    for part in data:
        parked += cdc.bad_rows(part, reason)
    written = [] if held else [s.quarantined for s in staged if s.quarantined is not None]
    result.rows, result.changes = 0, 0
    result.quarantined = len(parked) + sum(part.rows for part in written)
    app_id = f"{committer.app_id}:parked"
    version = committer.sinks.quarantine.committed_version(app_id)
    if version is None or version < batch_id:
        if parked:
            written.append(quarantine_files.write(committer.cfg, parked, batch_id, checked_at,
                                                  f"{committer.staging.quarantine_name(batch_id)}-parked"))
        if files := [f for part in written for f in part.files]:
            committer.sinks.quarantine.commit_files(files, QUARANTINE_SCHEMA, app_id, batch_id,
                                                    {"lakefeed.batch_id": str(batch_id)})
    # What this attempt's tasks wrote and no commit took (the quarantine had the batch, or its parked rows): gone.
    committer.staging.sweep(batch_id, True, ((committer.sinks.quarantine, str(committer.cfg.quarantine), []),), log_)


def park_staged(committer: Committer, spread: Spread, staged: list[Staged], result: BatchResult,
                checked_at: datetime, log_: Any, whole: tasks.Whole | None = None) -> None:
    """`commit_or_park` for an append batch (`whole`: one task, which wrote it too)."""
    commit_or_park(committer, partial(committer.commit_staged, spread, staged, result, checked_at, log_, whole),
                   staged, result, checked_at, log_)


def _partly_committed(committer: Committer, batch_id: int) -> bool:
    sinks = (committer.sinks.table, committer.sinks.changelog, committer.sinks.history)
    return any(committer.done(sink, batch_id) for sink in sinks if sink is not None)
