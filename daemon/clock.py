"""Time is always timezone-aware UTC; CDM times are ISO 8601 with milliseconds and a Z."""

from __future__ import annotations

from datetime import UTC, datetime


def now() -> datetime:
    return datetime.now(UTC)


def seconds(ns: int) -> float:
    """A file time in ns as the float `os.stat().st_mtime` gives for it (what the CDM SDK reads): not `ns / 1e9`,
    which may differ in the last bit."""
    whole, part = divmod(ns, 1_000_000_000)
    return whole + part * 1e-9


def from_ns(ns: int) -> datetime:
    return datetime.fromtimestamp(seconds(ns), UTC)  # rounded to the microsecond, half to even


def to_cdm(t: datetime) -> str:
    t = t.astimezone(UTC)
    # Not strftime: its %Y writes year 1 as "1", which no ISO reader takes back.
    return (f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}."
            f"{t.microsecond // 1000:03d}Z")


def from_cdm(text: str) -> datetime:
    """An ISO 8601 time as UTC (no zone: UTC); ValueError for text that is none, or outside years 1 to 9999 in UTC."""
    t = datetime.fromisoformat(text.upper().replace("Z", "+00:00"))  # RFC 3339 allows a lower-case t and z
    try:
        return t.astimezone(UTC) if t.tzinfo else t.replace(tzinfo=UTC)
    except OverflowError as exc:
        raise ValueError(f"{text!r} is outside years 1 to 9999 in UTC") from exc


def latest(*times: str | None) -> str | None:
    """The latest of several CDM time strings, ignoring missing ones."""
    present = [t for t in times if t]
    return to_cdm(max(from_cdm(t) for t in present)) if present else None
