"""Event time of each row, and the entity's watermark.

Event time comes from a column, from the file's location (ODF `EventTimeSource::FromPath`:
a regex group parsed with a strptime format), from the file's modification time, or is the
system time. The watermark is the largest event time seen minus the allowed lateness; it
only moves forward and is recorded in the table commit's metadata (`lakefeed.watermark`),
where `lakefeed watermark advance` can also move it for an idle source. Rows with an event
time behind the watermark are late: applied, quarantined or dropped as configured.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakefeed import clock
from lakefeed.batch.read import BadRow, as_python
from lakefeed.batch.schema import cast_to
from lakefeed.config.model import EventTimeConfig

EVENT_TIME = "__event_time"
WATERMARK_KEY = "lakefeed.watermark"
_TS = pa.timestamp("us", tz="UTC")
_EARLIEST = pa.scalar(datetime(1, 1, 1, tzinfo=UTC), _TS)
_LATEST = pa.scalar(datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), _TS)


def constant(value: datetime, n: int) -> pa.Array:
    return pa.array(np.full(n, int(value.timestamp() * 1_000_000), dtype="datetime64[us]")).cast(_TS)


def stamp(table: pa.Table, spec: EventTimeConfig, location: str, mtime_ns: int,
          system_time: datetime) -> tuple[pa.Table, list[BadRow]]:
    """The rows with an `__event_time` column; rows whose event time cannot be read come back as bad rows."""
    n = table.num_rows
    if spec.source == "system":
        return table.append_column(EVENT_TIME, constant(system_time, n)), []
    if spec.source == "file_mtime":
        return table.append_column(EVENT_TIME, constant(clock.from_ns(mtime_ns), n)), []
    if spec.source == "path":
        try:
            when = _from_path(spec, location)
        except ValueError as exc:
            return table.slice(0, 0).append_column(EVENT_TIME, constant(system_time, 0)), [
                BadRow(None, f"event time from path {location!r}: {exc}", f"{n} rows")]
        return table.append_column(EVENT_TIME, constant(when, n)), []
    assert spec.column is not None
    if spec.column not in table.column_names:
        return table.slice(0, 0).append_column(EVENT_TIME, constant(system_time, 0)), [
            BadRow(None, f"event time column {spec.column!r} is missing", f"{n} rows")]
    values = table.column(spec.column)
    try:
        return _held(table.append_column(EVENT_TIME, cast_to(values, _TS)), spec.column)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    parsed, bad = [], []
    for i, v in enumerate(values):
        try:
            parsed.append(cast_to(v, _TS) if v.is_valid else None)  # a scalar: any year (as_py holds 1-9999)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            parsed.append(None)
            bad.append(i)
    keep = np.ones(n, dtype=bool)
    keep[bad] = False
    rows, outside = _held(table.append_column(EVENT_TIME, pa.array(parsed, _TS)).filter(pa.array(keep)), spec.column)
    return rows, [BadRow(None, f"event time {as_python(values[i])!r} in column {spec.column!r} is not a timestamp",
                         str(as_python(values[i]))) for i in bad] + outside


def _from_path(spec: EventTimeConfig, location: str) -> datetime:
    """The time the first group of `path_pattern` captures from a location; ValueError when there is none to read."""
    assert spec.path_pattern is not None
    match = re.search(spec.path_pattern, location)
    if match is None:
        raise ValueError(f"path_pattern {spec.path_pattern!r} does not match")
    text = match.group(1)
    if text is None:  # an alternative without the group matched (`day=(…)|undated`)
        raise ValueError(f"path_pattern {spec.path_pattern!r} matches, but its first group captures nothing; "
                         "make the group take part in every match or move the file to a dated path")
    return datetime.strptime(text, spec.path_format).replace(tzinfo=UTC)  # noqa: DTZ007


def _held(rows: pa.Table, column: str) -> tuple[pa.Table, list[BadRow]]:
    """The rows whose event time a watermark (Python's datetime) can hold, and the others as bad rows: Arrow takes
    times far outside the years 1-9999, and one batch of only such rows would fail at every try."""
    times = rows.column(EVENT_TIME)
    outside = pc.fill_null(pc.or_(pc.less(times, _EARLIEST), pc.greater(times, _LATEST)), False)
    if not pc.any(outside).as_py():
        return rows, []
    texts = pc.cast(times.filter(outside), pa.string()).to_pylist()
    return rows.filter(pc.invert(outside)), [
        BadRow(None, f"event time {text} in column {column!r} is outside the years 1-9999", text) for text in texts]


def late_mask(data: pa.Table, watermark: datetime | None) -> np.ndarray:
    if watermark is None or data.num_rows == 0:
        return np.zeros(data.num_rows, dtype=bool)
    late = pc.less(data.column(EVENT_TIME), pa.scalar(watermark, _TS))
    return pc.fill_null(late, False).to_numpy(zero_copy_only=False)


def advance_to(watermark: datetime | None, latest: datetime | None, spec: EventTimeConfig) -> datetime | None:
    """The watermark once rows up to event time `latest` (None: no rows with one) were seen: that time minus the
    allowed lateness; it never moves back."""
    if latest is None:
        return watermark
    candidate = latest - timedelta(seconds=spec.allowed_lateness_s)
    return candidate if watermark is None or candidate > watermark else watermark
