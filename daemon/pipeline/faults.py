"""Why a batch failed, which decides what happens next.

A store fault (a full disk, an I/O error, an unreachable bucket, a concurrent writer, a table found
missing) may go away: the batch is tried again, with backoff, and nothing moves on until it commits. A data
fault (rows the table cannot take: a schema it refuses, a value it cannot store) will not go
away however often the batch is tried: its rows are parked in quarantine with the reason and
the stream goes on, so one bad record can never strand what was acknowledged after it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from pyspark.errors import PySparkException

from lakefeed.batch import cdc
from lakefeed.batch.changelog import quarantine_table
from lakefeed.batch.read import BadRow
from lakefeed.errors import LakefeedError, TransientError
from lakefeed.pipeline import tasks
from lakefeed.pipeline.commit import BatchResult, Committer
from lakefeed.pipeline.tasks import Spread, Staged

# What Rust (delta-rs, object_store) and boto say when the store, not the data, is at fault.
_STORE = re.compile(r"os error \d+|no space left|disk quota|i/o error|timed? ?out|connection|broken pipe|"
                    r"generic s3 error|dispatch failure|service unavailable|throttl|slowdown|too many open files",
                    re.IGNORECASE)
# A table the commit found missing (delta-spark's error classes): the lake's state is at fault, not the batch's
# rows. It is retried, as a store fault is, never parked: parking would put acknowledged rows in quarantine
# for what a retry or the operator mends.
_MISSING = re.compile(r"\[(DELTA_TABLE_NOT_FOUND|DELTA_MISSING_DELTA_TABLE|PATH_NOT_FOUND)\b")


def store_fault(exc: BaseException) -> bool:
    if isinstance(exc, LakefeedError) and not isinstance(exc, TransientError):
        return False  # lakefeed decided already: a terminal error stops the entity with what to do
    if isinstance(exc, OSError | TimeoutError | TransientError | CommitFailedError | TableNotFoundError):
        return True
    return bool(_STORE.search(str(exc)) or _MISSING.search(str(exc)))


# Errors of lakefeed's own code, not of the data: parking would hide them behind a quarantine. A TypeError is
# one too (a call with the wrong arguments), but not Arrow's or Spark's: ArrowTypeError is a cast the data
# cannot take, PySparkTypeError a type Spark cannot convert ("uint64 is not supported in conversion to Arrow").
_BUGS = (AttributeError, NameError, AssertionError, ImportError, RecursionError, TypeError)


def _bug(exc: BaseException) -> bool:
    return isinstance(exc, _BUGS) and not isinstance(exc, pa.ArrowException | PySparkException)


def data_fault(exc: BaseException) -> bool:
    """Not the store's fault, not a bug: delta-rs raises its schema refusals as bare Exceptions ("Schema error:
    Duplicate field name"), Arrow its casts as ArrowInvalid, and so on."""
    if store_fault(exc) or isinstance(exc, LakefeedError) or _bug(exc):  # lakefeed's own errors say what to do
        return False
    return isinstance(exc, Exception)


def commit_or_park(committer: Committer, commit: Callable[[], None], staged: list[Staged], result: BatchResult,
                   checked_at: datetime, log_: Any, retracted: Sequence[str] = ()) -> None:
    """Commit a batch that tasks read and staged; if the data is at fault, put every row of it in quarantine instead
    (once, also on replay: under an application id of its own) and let the stream go on. Only then are its rows read
    here, from the staging folder; `retracted`: files whose rows are not the batch's."""
    try:
        commit()
        return
    except Exception as exc:
        if not data_fault(exc) or _partly_committed(committer, result.batch_id):
            raise  # a batch some table already holds is completed on replay, never parked in part
        reason = f"the table refused this batch ({type(exc).__name__}: {str(exc)[:500]}); nothing of it was applied"
    tables = [tasks.read_staged(committer.cfg, path) for s in staged for path in s.paths]
    data = pa.concat_tables(tables, promote_options="permissive") if tables else None
    if data is not None and retracted:
        data = data.filter(pc.invert(pc.is_in(data.column("source_file"), pa.array(list(retracted), pa.string()))))
    log_.error("batch.parked", error=reason, rows=data.num_rows if data is not None else 0)
    _park(committer, data, [b for s in staged for b in s.bad], result, checked_at, reason)


def _park(committer: Committer, data: pa.Table | None, bad: list[tuple[str, BadRow]], result: BatchResult,
          checked_at: datetime, reason: str) -> None:
    batch_id = result.batch_id
    parked = [] if committer.done(committer.sinks.quarantine, batch_id) else list(bad)
    if data is not None:
        parked += cdc.bad_rows(data, reason)
    app_id = f"{committer.app_id}:parked"
    version = committer.sinks.quarantine.committed_version(app_id)
    if parked and (version is None or version < batch_id):
        committer.sinks.quarantine.append(quarantine_table(committer.cfg.name, parked, batch_id, checked_at),
                                          app_id, batch_id, {"lakefeed.batch_id": str(batch_id)})
    result.rows, result.changes, result.quarantined = 0, 0, len(parked)


def park_staged(committer: Committer, spread: Spread, staged: list[Staged], result: BatchResult,
                checked_at: datetime, log_: Any, whole: tasks.Whole | None = None) -> None:
    """`commit_or_park` for an append batch (`whole`: one task, which wrote it too)."""
    commit_or_park(committer, partial(committer.commit_staged, spread, staged, result, checked_at, log_, whole),
                   staged, result, checked_at, log_)


def _partly_committed(committer: Committer, batch_id: int) -> bool:
    sinks = (committer.sinks.table, committer.sinks.changelog, committer.sinks.history)
    return any(committer.done(sink, batch_id) for sink in sinks if sink is not None)
