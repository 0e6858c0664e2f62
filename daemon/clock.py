"""Time is always timezone-aware UTC; CDM times are ISO 8601 with milliseconds and a Z."""

from __future__ import annotations

from datetime import UTC, datetime


def now() -> datetime:
    return datetime.now(UTC)


def from_ns(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9, UTC)


def to_cdm(t: datetime) -> str:
    t = t.astimezone(UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def from_cdm(text: str) -> datetime:
    t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def latest(*times: str | None) -> str | None:
    """The latest of several CDM time strings, ignoring missing ones."""
    present = [t for t in times if t]
    return to_cdm(max(from_cdm(t) for t in present)) if present else None
