"""Cells of a data manifest's attributes typed by Java class (seed 001: "must be convertible with Joda-Convert"),
converted as Joda-Convert's JDK converters do: each class's `parse`/`valueOf` form, which is its `toString` form
(ISO-8601 for java.time), without a JVM.

Integers, floating point numbers and strings are cast by Arrow (`read.conform`, fast on large files: it takes
every `toString` form, `NaN`, `Infinity` and `1.0E10` included); the other types are parsed here cell by cell. A
cell that does not convert fails its row, with the reason.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Context, Decimal, InvalidOperation
from typing import Any
from zoneinfo import ZoneInfo

import pyarrow as pa

from lakefeed.config.data_manifest import Column
from lakefeed.config.java_types import CLASSES

_TS = pa.timestamp("us", tz="UTC")
ARROW = {
    "int8": pa.int8(), "int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(), "float32": pa.float32(),
    "float64": pa.float64(), "string": pa.string(), "bool": pa.bool_(), "char": pa.string(),
    "decimal": pa.decimal128(38, 18), "biginteger": pa.decimal128(38, 0), "instant": _TS, "date": pa.date32(),
    "local_datetime": _TS, "offset_datetime": _TS, "zoned_datetime": _TS, "duration": pa.int64(),
    "uuid": pa.string(),
}
_DATE = r"(\d{4})-(\d{2})-(\d{2})"
_TIME = r"T(\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,9}))?)?"
_OFFSET = r"(Z|[+-]\d{2}(?::?\d{2}(?::?\d{2})?)?)"  # parsed leniently, as ISO_OFFSET_DATE_TIME does
# Digits are 0-9 only (re.ASCII), as Java's ISO formatters take them.
_DURATION = re.compile(r"([-+]?)P(?:([-+]?\d+)D)?(T(?:([-+]?\d+)H)?(?:([-+]?\d+)M)?"
                       r"(?:([-+]?\d+)(?:[.,](\d{0,9}))?S)?)?", re.IGNORECASE | re.ASCII)
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", re.ASCII)
_SCALE = Decimal(1).scaleb(-18)
_WIDE = Context(prec=80)
_NS = 1_000_000_000


def _boolean(text: str) -> bool:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    raise ValueError("a Boolean is 'true' or 'false', in any case")


def _character(text: str) -> str:
    if len(text) != 1 or ord(text) > 0xFFFF:
        raise ValueError("a Character is one UTF-16 character")
    return text


def _big_decimal(text: str) -> Decimal:
    if not _NUMBER.fullmatch(text):
        raise ValueError("not a BigDecimal (e.g. -12.50, 1.5E+3)")
    value = Decimal(text)
    if not value.is_zero() and (value.adjusted() >= 20 or value.quantize(_SCALE, context=_WIDE) != value):
        raise ValueError("does not fit the column's decimal(38, 18): at most 20 digits before the point and 18 "
                         "after")
    return value.quantize(_SCALE, context=_WIDE)


def _big_integer(text: str) -> Decimal:
    if not re.fullmatch(r"[+-]?[0-9]+", text):
        raise ValueError("not a BigInteger (e.g. -123)")
    if len(text.lstrip("+-").lstrip("0")) > 38:
        raise ValueError("does not fit the column's decimal(38, 0): at most 38 digits")
    return Decimal(text)


def _local(m: re.Match[str]) -> datetime:
    """The date and time of day a match's first seven groups hold, as UTC."""
    year, month, day, hour, minute, second, fraction = m.groups()[:7]
    micros = int((fraction or "").ljust(9, "0")[:6])  # to the microseconds the column holds
    return datetime(int(year), int(month), int(day), int(hour), int(minute), int(second or 0), micros, tzinfo=UTC)


def _offset(text: str) -> timezone:
    if text == "Z":
        return UTC
    digits = text[1:].replace(":", "")
    hours, minutes, seconds = int(digits[:2]), int(digits[2:4] or 0), int(digits[4:6] or 0)
    if hours > 18 or minutes > 59 or seconds > 59 or hours * 3600 + minutes * 60 + seconds > 18 * 3600:
        raise ValueError(f"offset {text} is beyond ±18:00")
    delta = timedelta(hours=hours, minutes=minutes, seconds=seconds)
    return timezone(-delta if text[0] == "-" else delta)


def _parser(pattern: str, example: str, make: Callable[[re.Match[str]], Any]) -> Callable[[str], Any]:
    compiled = re.compile(pattern, re.ASCII)

    def parse(text: str) -> Any:
        m = compiled.fullmatch(text)
        if m is None:
            raise ValueError(f"not ISO-8601 as its class parses it (e.g. {example})")
        return make(m)
    return parse


def _with_offset(m: re.Match[str]) -> datetime:
    return _local(m).replace(tzinfo=_offset(m.group(8))).astimezone(UTC)


def _zoned(m: re.Match[str]) -> datetime:
    if m.group(9) is not None:
        try:
            ZoneInfo(m.group(9))
        except (ValueError, KeyError, OSError) as exc:
            raise ValueError(f"unknown time zone {m.group(9)!r}") from exc
    return _with_offset(m)  # the offset places the instant, as Java resolves a parsed offset and zone


def _duration(text: str) -> int:
    m = _DURATION.fullmatch(text)
    if m is None or m.group(3) == "T" or not any(m.group(i) for i in (2, 4, 5, 6)):
        raise ValueError("not an ISO-8601 duration as Duration parses it (e.g. PT15M, P2DT3H4.5S)")
    sign, days, _, hours, minutes, seconds, fraction = m.groups()
    nanos = (int(days or 0) * 86_400 + int(hours or 0) * 3600 + int(minutes or 0) * 60 + int(seconds or 0)) * _NS
    if fraction:
        part = int(fraction.ljust(9, "0"))
        nanos += -part if (seconds or "").startswith("-") else part
    nanos = -nanos if sign == "-" else nanos
    if not -(2**63) <= nanos < 2**63:
        raise ValueError("does not fit the column's int64 nanoseconds (about ±292 years)")
    return nanos


def _uuid(text: str) -> str:
    parts = text.split("-")
    if len(parts) != 5 or not all(re.fullmatch(rf"[0-9a-fA-F]{{1,{n}}}", p)
                                  for p, n in zip(parts, (8, 4, 4, 4, 12), strict=True)):
        raise ValueError("not a UUID (e.g. 123e4567-e89b-12d3-a456-426614174000)")
    return str(uuid.UUID("".join(p.rjust(n, "0") for p, n in zip(parts, (8, 4, 4, 4, 12), strict=True))))


PARSED: dict[str, Callable[[str], Any]] = {
    "bool": _boolean, "char": _character, "decimal": _big_decimal, "biginteger": _big_integer,
    "instant": _parser(f"{_DATE}T(\\d{{2}}):(\\d{{2}}):(\\d{{2}})(?:\\.(\\d{{0,9}}))?{_OFFSET}",
                       "2007-12-03T10:15:30.00Z", _with_offset),
    "date": _parser(_DATE, "2007-12-03", lambda m: date(*map(int, m.groups()))),
    "local_datetime": _parser(_DATE + _TIME, "2007-12-03T10:15:30", _local),
    "offset_datetime": _parser(_DATE + _TIME + _OFFSET, "2007-12-03T10:15:30+01:00", _with_offset),
    "zoned_datetime": _parser(_DATE + _TIME + _OFFSET + r"(?:\[([^\]]+)\])?", "2007-12-03T10:15:30+01:00"
                              "[Europe/Paris]", _zoned),
    "duration": _duration, "uuid": _uuid,
}


def convert(table: pa.Table, columns: tuple[Column, ...]) -> tuple[pa.Table, dict[int, tuple[str, str]]]:
    """The columns of types Arrow does not cast as Java parses them, converted from their text cells; row index ->
    (column, reason) for the first cell of a row that does not convert (its value is left null)."""
    failed: dict[int, tuple[str, str]] = {}
    for column in columns:
        parse = PARSED.get(column.type)
        if parse is None:
            continue
        values: list[Any] = []
        for i, text in enumerate(table.column(column.name).to_pylist()):
            try:
                values.append(None if text is None else parse(text))
            except (ValueError, InvalidOperation, OverflowError) as exc:
                values.append(None)
                failed.setdefault(i, (column.name, f"column {column.name!r}: {text!r} is not a {_java(column)}: "
                                                  f"{exc}"))
        at = table.schema.get_field_index(column.name)
        table = table.set_column(at, column.name, pa.array(values, ARROW[column.type]))
    return table, failed


def _java(column: Column) -> str:
    return next(name for name, kind in CLASSES.items() if kind == column.type)
