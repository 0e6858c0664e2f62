"""What a stage task quarantines when a unit of a batch (a landed file, a push frame, a part of a Kafka batch) fails
to stage for a data fault no check foresaw (daemon/pipeline/verdict.py): its rows, with the reason, so that the
batch's other units go on and a replay does not meet the same fault again. Nothing acknowledged is dropped: a
file's rows stay in the file, a frame's and a message's are in the quarantine row as they were acknowledged.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pyarrow as pa

from lakefeed.batch import cdc
from lakefeed.batch.read import BadRow
from lakefeed.inbox import spool
from lakefeed.inbox.spool import Entry
from lakefeed.pipeline.verdict import data_fault

Bad = tuple[tuple[str, BadRow], ...]
_MESSAGE = ("topic", "partition", "offset", "value")


def _reason(exc: BaseException) -> str:
    return f"its rows could not be staged ({type(exc).__name__}: {str(exc)[:500]})"


def file_rows(location: str, exc: BaseException, log_: Any) -> Bad:
    """One row naming the file (at its manifest `location`): its rows are left in it."""
    why = f"{_reason(exc)}; none of them were applied: mend the file and land it again"
    log_.error("file.unstaged", error=why)
    return ((location, BadRow(None, why, "")),)


def frame_rows(folder: Path, location: str, entry: Entry, exc: BaseException, log_: Any) -> Bad:
    """Each row of the frame as acknowledged; the frame's bytes (base64) when its rows cannot be read either."""
    why = f"{_reason(exc)}; nothing of the frame was applied"
    log_.error("frame.unstaged", error=why)
    try:
        return tuple((location, row) for _, row in cdc.bad_rows(spool.read_entry(folder, entry), why))
    except Exception as again:
        if not data_fault(again):
            raise
    raw = base64.b64encode(spool.frame_bytes(folder, entry)).decode("ascii")
    return ((location, BadRow(None, f"{why}; raw: the spooled frame, base64", raw)),)


def message_rows(batch: pa.Table, exc: BaseException, log_: Any) -> Bad:
    """Each message's value (tombstones have none: they are skipped, as always)."""
    why = f"{_reason(exc)}; no message of its part was applied"
    log_.error("messages.unstaged", error=why, messages=batch.num_rows)
    columns = (batch.column(c).to_pylist() for c in _MESSAGE)
    return tuple((f"kafka/{topic}/{partition}", BadRow(offset, why, value.decode("utf-8", "backslashreplace")))
                 for topic, partition, offset, value in zip(*columns, strict=True) if value is not None)
