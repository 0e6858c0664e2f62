"""Decoding and validating a pushed request body into Arrow, before it is acknowledged.

The body's `Content-Type` picks the decoder: a JSON array of objects, NDJSON, CSV with a
header, Parquet, or an Arrow IPC stream. The records are conformed to the entity's schema;
every problem is reported with the record's number (1-based) and the field at fault, and a
request with any problem is rejected whole: nothing of it is stored.
"""

from __future__ import annotations

import codecs
import csv
import ctypes
import io
import struct
import zlib
from datetime import UTC, date, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from lakefeed import clock
from lakefeed.batch import event_time
from lakefeed.batch.admit import schema_problems, utf8_problem
from lakefeed.batch.read import BadRow, conform, from_rows
from lakefeed.batch.schema import decode as plain_values
from lakefeed.batch.schema import decoded, unstorable
from lakefeed.config.model import EntityConfig
from lakefeed.intake import columnar
from lakefeed.intake.json_body import json_array, ndjson
from lakefeed.intake.problems import Problem, Rejected

_LIBC = ctypes.CDLL(None)  # malloc_trim: glibc, the only libc lakefeed runs on (Linux, systemd)
# JSON bodies up to this size may take the fast path of `accept` (10 records: ~45 instead of ~80 µs);
# from about 100 records on, checking every value in Python costs as much as Arrow's inference and casts.
PLAIN_BYTES = 4096
CONTENT_TYPES = {
    "application/json": "json",
    "application/x-ndjson": "ndjson",
    "application/ndjson": "ndjson",
    "application/jsonl": "ndjson",
    "text/csv": "csv",
    "application/vnd.apache.parquet": "parquet",
    "application/x-parquet": "parquet",
    "application/vnd.apache.arrow.stream": "arrow",
}


def inflate(body: bytes, encoding: str | None, limit: int) -> bytes:
    """The body with its Content-Encoding (gzip, deflate) undone, never holding more than `limit` bytes of it:
    a bomb of a few hundred kilobytes that inflates to gigabytes is a 413 after `limit` bytes, not a few
    hundred megabytes of memory the process keeps (the HTTP server leaves bodies compressed for this)."""
    codings = [c.strip().lower() for c in (encoding or "").split(",")]
    for coding in reversed([c for c in codings if c and c != "identity"]):
        if coding not in ("gzip", "x-gzip", "deflate"):
            raise Rejected(415, f"Content-Encoding {coding!r} is not supported; send gzip, deflate or none")
        if body:  # (an empty body is answered as such)
            body = _inflate(body, coding, limit)
    return body


def _inflate(body: bytes, coding: str, limit: int) -> bytes:
    """One coding undone. gzip may hold several members, one after another (RFC 1952): each is inflated. A
    stream cut short, or bytes after its end, is a 400: what the producer meant cannot be known."""
    gzip = "gzip" in coding
    # gzip: a gzip header; deflate: a zlib header, or (as some clients send it) raw deflate
    wbits = 16 + zlib.MAX_WBITS if gzip else zlib.MAX_WBITS if body[:1] == b"\x78" else -zlib.MAX_WBITS
    parts: list[bytes] = []
    size, rest = 0, body
    while rest:
        inflater = zlib.decompressobj(wbits)
        try:
            parts.append(inflater.decompress(rest, limit + 1 - size))
        except zlib.error as exc:
            raise Rejected(400, f"the body is not valid {coding}: {exc}") from exc
        size += len(parts[-1])
        if size > limit or inflater.unconsumed_tail:
            del parts
            _LIBC.malloc_trim(0)  # glibc keeps the freed inflate buffers otherwise: each bomb would grow the process
            raise Rejected(413, f"the body inflates to more than {limit} bytes (http.max_body_bytes)")
        if not inflater.eof:
            raise Rejected(400, f"the body is not valid {coding}: the stream is cut short; send all of it")
        rest = inflater.unused_data
        if rest and not (gzip and rest[:2] == b"\x1f\x8b"):
            raise Rejected(400, f"the body is not valid {coding}: {len(rest)} bytes follow the end of the stream")
    return parts[0] if len(parts) == 1 else b"".join(parts)


def kind_of(content_type: str) -> str:
    kind = CONTENT_TYPES.get(content_type.split(";")[0].strip().lower())
    if kind is None:
        raise Rejected(415, f"unsupported Content-Type {content_type!r}; use one of: {', '.join(CONTENT_TYPES)}")
    return kind


def decode(body: bytes, content_type: str, target: pa.Schema | None, limit: int) -> pa.Table:
    """The body as a table (not yet conformed), or Rejected; Parquet and Arrow bodies may decode to
    `columnar.DECODED_FACTOR` × `limit` (http.max_body_bytes) bytes, else 413."""
    kind = kind_of(content_type)
    if not body:
        raise Rejected(400, "the request body is empty")
    try:
        if kind == "json":
            return from_rows(json_array(body))
        if kind == "ndjson":
            return ndjson(body, target)
        if kind == "csv":
            return _csv(body, target)
        if kind == "parquet":
            return columnar.read_parquet(body, limit * columnar.DECODED_FACTOR)
        return columnar.read_arrow(body, limit * columnar.DECODED_FACTOR)
    except Rejected:
        raise
    except columnar.TooLarge as exc:
        raise Rejected(413, f"the {kind} body decodes to more than {columnar.DECODED_FACTOR} × {limit} bytes "
                            "(http.max_body_bytes); send it in smaller requests") from exc
    except (csv.Error, struct.error) as exc:
        raise Rejected(400, f"the body is not valid {kind}: {exc}") from exc
    except (pa.ArrowException, OSError, ValueError, UnicodeDecodeError) as exc:
        raise Rejected(400, f"the body is not valid {kind}: {exc}") from exc


def accept(body: bytes, content_type: str, cfg: EntityConfig, target: pa.Schema | None, limit: int) -> pa.Table:
    """The records of a request, decoded, conformed and checked (`decode` + `validate`), or Rejected.

    Whatever a body makes the decoders raise is the body's fault, and answered as such (400), never 500."""
    if not body:
        raise Rejected(400, "the request body is empty")
    try:
        return _accept(body, content_type, cfg, target, limit)
    except Rejected:
        raise
    except RecursionError as exc:
        raise Rejected(400, "the body nests too deeply to decode "
                            f"(columns may nest {cfg.limits.max_nesting} levels: limits.max_nesting)") from exc
    except (ValueError, TypeError, OverflowError, pa.ArrowException) as exc:  # UnicodeError is a ValueError
        raise Rejected(400, f"the records cannot be stored: {type(exc).__name__}: {exc}") from exc


def _accept(body: bytes, content_type: str, cfg: EntityConfig, target: pa.Schema | None, limit: int) -> pa.Table:
    """A small JSON request whose values plainly fit their columns (`_plain`) is built straight into the
    table's types: about half the work of inferring types and casting them, which is most of what a
    10-record push costs besides HTTP. Every other request takes the general path."""
    if target is not None and len(body) <= PLAIN_BYTES and kind_of(content_type) == "json":
        table = _plain(json_array(body), cfg, target)
        if table is not None:
            return _checked(table, table, [], cfg)
    return validate(decode(body, content_type, target, limit), cfg, target)


def validate(table: pa.Table, cfg: EntityConfig, target: pa.Schema | None) -> pa.Table:
    """Conform to the entity's schema and check keys and event times; Rejected lists every problem."""
    if table.num_rows == 0:
        raise Rejected(400, "the request holds no records")
    columns = [Problem(None, name, message) for name, message in schema_problems(table.schema, target, cfg.limits)]
    columns += [Problem(None, f.name, f"column {f.name!r} {why}") for f in table.schema
                if (why := unstorable(f.type)) is not None]
    columns += [Problem(None, f.name, why) for f in table.schema
                if f.name in cfg.cdc.primary_key and (why := _key_type_problem(f.type, f.name)) is not None]
    if columns:
        raise Rejected(400, "the columns cannot be stored; nothing was stored", columns)
    if (invalid := utf8_problem(table)) is not None:
        raise Rejected(400, f"{invalid}; nothing was stored")
    read = conform(table, target, first_line=1)
    assert read.table is not None
    return _checked(table, read.table, [Problem(b.line, b.field, b.reason) for b in read.bad], cfg)


def _checked(table: pa.Table, out: pa.Table, problems: list[Problem], cfg: EntityConfig) -> pa.Table:
    """`out` (the conformed `table`) once keys and event times are checked."""
    for key in cfg.cdc.primary_key:
        if key not in table.column_names:
            problems.append(Problem(None, key, f"primary key column {key!r} is missing"))
            continue
        problems.extend(_key_problems(table.column(key), key))
    problems.extend(_time_range_problems(out, numbered=out.num_rows == table.num_rows))
    if cfg.event_time.source == "column":
        _, bad_times = event_time.stamp(out, cfg.event_time, "", 0, clock.now())
        problems.extend(_time_problem(b, cfg.event_time.column) for b in bad_times)
    if problems:
        problems.sort(key=lambda p: (p.row is not None, p.row or 0))
        raise Rejected(400, f"{len(problems)} problem(s) in the records; nothing was stored", problems)
    return out


def _key_type_problem(t: pa.DataType, key: str) -> str | None:
    """Why a key column of this type cannot match rows, or None. A dictionary is only an encoding: conforming
    decodes it (batch/schema.py `decoded`), as for a landed file, so its values' type is the key's."""
    if pa.types.is_nested(decoded(t)):
        return f"primary key column {key!r} is a {t}: a key must be a single value (a string, number, date or time)"
    return None


def _key_problems(column: pa.ChunkedArray, key: str) -> list[Problem]:
    """Keys the commit cannot match rows on: nulls and NaN (not equal to itself). Keys that are no single value
    are refused before conforming (`_key_type_problem`)."""
    column = plain_values(column)  # in a dictionary a null may be an index or a value: the decoded column tells
    problems = [Problem(int(i) + 1, key, f"primary key column {key!r} is null")  # numbered as sent
                for i in column.is_null().to_numpy(zero_copy_only=False).nonzero()[0]]
    if pa.types.is_floating(column.type):
        nan = pc.fill_null(pc.is_nan(column), False).to_numpy(zero_copy_only=False)
        problems += [Problem(int(i) + 1, key, f"primary key column {key!r} is NaN, which equals no key")
                     for i in nan.nonzero()[0]]
    return problems


# What Python's datetime, Spark and Delta hold: years 1 to 9999.
_FIRST_DAY, _LAST_DAY = date(1, 1, 1), date(9999, 12, 31)


def _time_range_problems(table: pa.Table, numbered: bool) -> list[Problem]:
    """Dates and times outside years 1-9999, at any depth (row numbers for top-level columns, when `numbered`)."""
    problems = []
    for name in table.column_names:
        column = table.column(name)
        for leaf, top in _temporal(column, top=True):
            outside = _outside(leaf)
            if outside is None or not pc.any(outside).as_py():
                continue
            rows = outside.to_numpy(zero_copy_only=False).nonzero()[0] if top and numbered else [None]
            problems += [Problem(None if i is None else int(i) + 1, name, f"column {name!r} holds a date or time "
                                 "outside the years 1 to 9999, which tables cannot hold") for i in rows]
    return problems


def _temporal(column: pa.ChunkedArray, top: bool) -> list[tuple[pa.ChunkedArray, bool]]:
    """The date and time arrays in the column, and whether each is the column itself."""
    t = column.type
    if not _holds_time(t):
        return []
    if pa.types.is_date(t) or pa.types.is_timestamp(t):
        return [(column, top)]
    if pa.types.is_struct(t):
        return [leaf for i in range(t.num_fields) for leaf in _temporal(pc.struct_field(column, [i]), top)]
    if pa.types.is_map(t):
        return [leaf for part in ("keys", "items")
                for leaf in _temporal(pa.chunked_array([getattr(c, part) for c in column.chunks],
                                                       t.key_type if part == "keys" else t.item_type), False)]
    return _temporal(pc.list_flatten(column), False)  # the list types


def _holds_time(t: pa.DataType) -> bool:
    return pa.types.is_date(t) or pa.types.is_timestamp(t) or any(_holds_time(t.field(i).type)
                                                                   for i in range(t.num_fields))


def _outside(column: pa.ChunkedArray) -> pa.ChunkedArray | None:
    """Whether each value is outside years 1-9999 (null: not); None when the type cannot hold such values."""
    t = column.type
    if pa.types.is_timestamp(t) and t.unit == "ns":
        return None  # 1677 to 2262
    first, last = (_FIRST_DAY, _LAST_DAY) if pa.types.is_date(t) else (
        datetime(1, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC))
    if pa.types.is_timestamp(t) and t.tz is None:
        first, last = first.replace(tzinfo=None), last.replace(tzinfo=None)
    low, high = pa.scalar(first, t), pa.scalar(last, t)
    return pc.fill_null(pc.or_(pc.less(column, low), pc.greater(column, high)), False)


# JSON values that plainly fit a column type: the Python types json.loads gives, and the ints in range.
_FITTING = {pa.int64(): frozenset({int}), pa.int32(): frozenset({int}), pa.int16(): frozenset({int}),
            pa.int8(): frozenset({int}), pa.float64(): frozenset({int, float}), pa.string(): frozenset({str}),
            pa.bool_(): frozenset({bool})}
_INT_BOUNDS = {pa.int64(): (-(1 << 63), (1 << 63) - 1), pa.int32(): (-(1 << 31), (1 << 31) - 1),
               pa.int16(): (-(1 << 15), (1 << 15) - 1), pa.int8(): (-(1 << 7), (1 << 7) - 1),
               pa.float64(): (-(1 << 53), 1 << 53)}  # ints a double holds exactly
_NONE = type(None)


def _plain(rows: list[dict[str, Any]], cfg: EntityConfig, target: pa.Schema) -> pa.Table | None:
    """The rows as a table of the target's columns when every value plainly fits its column (a JSON
    int in range for an integer or double column, a number for a double, a string for a string,
    a boolean for a boolean, null for any), no row has a column the target lacks, and every row
    has its primary key; else None, and the general path (`from_rows` + `conform`) decides. For
    these rows the general path gives the same table (tests/test_records.py checks it)."""
    known = set(target.names)
    if not rows or not all(rows) or not all(map(known.issuperset, rows)):
        return None  # (an empty object too: Arrow reads only empty objects as no records at all)
    columns = []
    for f in target:
        values = [r.get(f.name) for r in rows]
        kinds = set(map(type, values))
        if _NONE in kinds:
            if f.name in cfg.cdc.primary_key:
                return None
            kinds.discard(_NONE)
        if kinds and not kinds <= _FITTING.get(f.type, frozenset()):
            return None
        if int in kinds:
            low, high = _INT_BOUNDS[f.type]
            ints = [v for v in values if type(v) is int]
            if min(ints) < low or max(ints) > high:
                return None
        columns.append(pa.array(values, type=f.type))
    return pa.Table.from_arrays(columns, names=target.names)


def _time_problem(bad: BadRow, column: str | None) -> Problem:
    return Problem(None, column, bad.reason)


def _csv(body: bytes, target: pa.Schema | None) -> pa.Table:
    problems: list[Problem] = []

    def on_invalid(row: pacsv.InvalidRow) -> str:
        problems.append(Problem(row.number - 1 if row.number else None, None,
                                f"expected {row.expected_columns} columns, found {row.actual_columns}"))
        return "skip"

    parse = pacsv.ParseOptions(invalid_row_handler=on_invalid)
    read = pacsv.ReadOptions(use_threads=False)  # serial: bad rows get their numbers
    body = body.removeprefix(codecs.BOM_UTF8)  # else the first column's name is not the column's, nor its type
    # Typed as text: conforming to the schema reports each value that does not fit.
    header = body.split(b"\n", 1)[0].decode("utf-8").rstrip("\r")
    try:
        names = next(csv.reader([header])) if target else []
    except csv.Error as exc:
        raise Rejected(400, f"the CSV header cannot be read ({exc}): end lines with \\n or \\r\\n, and keep "
                            f"each header field under {csv.field_size_limit()} characters") from exc
    convert = pacsv.ConvertOptions(column_types={n: pa.string() for n in names}, strings_can_be_null=True)
    table = pacsv.read_csv(io.BytesIO(body), read_options=read, parse_options=parse, convert_options=convert)
    if problems:
        raise Rejected(400, "the body is not valid CSV", problems)
    return table
