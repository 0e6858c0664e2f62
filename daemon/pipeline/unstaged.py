"""What a stage task quarantines when a unit of a batch (a landed file, a push frame, a part of a Kafka batch) fails
to stage for a data fault no check foresaw (daemon/pipeline/verdict.py): its rows, with the reason, so that the
batch's other units go on and a replay does not meet the same fault again. Nothing acknowledged is dropped: a
file's rows stay in the file, a frame's and a message's are in the quarantine row as they were acknowledged.
A part of a Kafka batch is looked into, as a run of push frames is frame by frame (daemon/pipeline/tasks.py): only
the messages at fault are quarantined, and the others staged.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from lakefeed.batch import cdc
from lakefeed.batch.read import BadRow
from lakefeed.inbox import spool
from lakefeed.inbox.spool import Entry
from lakefeed.pipeline.verdict import data_fault

Bad = tuple[tuple[str, BadRow], ...]
Staged = TypeVar("Staged")
Piece = tuple[int, int, Exception]  # of a part that fails to stage: its first message, how many, the fault
_MESSAGE = ("topic", "partition", "offset", "value")
_TRIES = 1024  # the most tries the messages at fault of a part are looked for with: some seconds, at worst


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


def part_without_faulty(batch: pa.Table, exc: Exception, rows: Callable[[pa.Table], object],
                        stage: Callable[[pa.Table, Bad], Staged], log_: Any) -> Staged:
    """A part of a Kafka batch that failed to stage with `exc`, staged (`stage`: messages, and rows to quarantine
    beside theirs) without the messages at fault, which are quarantined.

    Those are found by halving (`_faulty`): a piece whose `rows` (decoded, conformed, stamped, tagged) fail is
    halved, a piece that passes is looked into no further, so that the good messages of a part of 100,000 are
    worked on in a few dozen pieces, not one by one. The rest is then staged at once, as if the messages at fault
    had never been sent: its rows' types, order and tags are those of a clean part (the pieces' rows put together
    might not be: each piece's types are inferred from its own values). If no piece fails (the fault is between
    messages, or in writing the part) or the rest fails again, all the part's messages are quarantined."""
    faulty = _faulty(batch, exc, rows)
    bad = tuple(row for start, n, fault in faulty for row in message_rows(batch.slice(start, n), fault, log_))
    rest = batch
    if faulty:
        keep = np.ones(batch.num_rows, dtype=bool)
        for start, n, _ in faulty:
            keep[start:start + n] = False
        rest = batch.filter(pa.array(keep))
        try:
            return stage(rest, bad)
        except Exception as again:
            if not data_fault(again):
                raise
            exc = again
    return stage(rest.slice(0, 0), bad + message_rows(rest, exc, log_, whole=True))  # no messages, all quarantined


def _faulty(batch: pa.Table, exc: Exception, rows: Callable[[pa.Table], object]) -> list[Piece]:
    """The pieces of `batch` (which failed with `exc`) that fail: halved a round at a time until each is one
    message, or until the next round would make the tries more than _TRIES. One message at fault takes two tries
    a round (34 for 100,000 messages); without a bound, one in every few would take a try each, and a try takes
    some 2 ms even for one message (pyarrow's JSON reader): a part of 100,000 would take minutes."""
    failing, tries = [(0, batch.num_rows, exc.with_traceback(None))], 0  # whose frames hold the part's rows
    while (split := sum(n > 1 for _, n, _ in failing)) and tries + 2 * split <= _TRIES:
        tries += 2 * split
        failing = [half for start, n, fault in failing
                   for half in (_halves(batch, start, n, rows) if n > 1 else [(start, n, fault)])]
    return failing


def _halves(batch: pa.Table, start: int, n: int, rows: Callable[[pa.Table], object]) -> list[Piece]:
    failing = []
    for first, length in ((start, n // 2), (start + n // 2, n - n // 2)):
        try:
            rows(batch.slice(first, length))
        except Exception as fault:
            if not data_fault(fault):
                raise
            failing.append((first, length, fault.with_traceback(None)))
    return failing


def message_rows(batch: pa.Table, exc: BaseException, log_: Any, whole: bool = False) -> Bad:
    """Each message's value (tombstones have none: they are skipped, as always): of a part none of whose messages
    was staged (`whole`), else of messages at fault (one, or a piece in which too many failed to try each)."""
    n = batch.num_rows
    why = _reason(exc) + ("; no message of its part was applied" if whole else "; the message was not applied"
                          if n == 1 else f"; the message was not applied, nor the {n - 1} beside it: too many "
                                         "messages of its part failed for each to be tried alone")
    columns = [batch.column(c).to_pylist() for c in _MESSAGE]
    if n == 1 and not whole:
        log_.error("message.unstaged", error=why, topic=columns[0][0], partition=columns[1][0], offset=columns[2][0])
    else:
        log_.error("messages.unstaged", error=why, messages=n)
    return tuple((f"kafka/{topic}/{partition}", BadRow(offset, why, value.decode("utf-8", "backslashreplace")))
                 for topic, partition, offset, value in zip(*columns, strict=True) if value is not None)
