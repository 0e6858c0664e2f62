"""Decoding and validating a pushed request body into Arrow, before it is acknowledged.

The body's `Content-Type` picks the decoder: a JSON array of objects, NDJSON, CSV with a
header, Parquet, or an Arrow IPC stream. The records are conformed to the entity's schema;
every problem is reported with the record's number (1-based) and the field at fault, and a
request with any problem is rejected whole: nothing of it is stored.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from lakefeed import clock, event_time
from lakefeed.config import EntityConfig
from lakefeed.read import BadRow, conform, json_options

MAX_PROBLEMS = 100
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


@dataclass(frozen=True)
class Problem:
    row: int | None
    field: str | None
    message: str

    def as_json(self) -> dict[str, Any]:
        return {"row": self.row, "field": self.field, "message": self.message}


class Rejected(Exception):
    """The request cannot be stored; `status` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str, problems: list[Problem] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.problems = problems or []

    def as_json(self) -> dict[str, Any]:
        shown = self.problems[:MAX_PROBLEMS]
        return {"error": self.message, "problems": [p.as_json() for p in shown],
                "problems_total": len(self.problems)}


def kind_of(content_type: str) -> str:
    kind = CONTENT_TYPES.get(content_type.split(";")[0].strip().lower())
    if kind is None:
        raise Rejected(415, f"unsupported Content-Type {content_type!r}; use one of: {', '.join(CONTENT_TYPES)}")
    return kind


def decode(body: bytes, content_type: str, target: pa.Schema | None) -> pa.Table:
    """The body as a table (not yet conformed), or Rejected."""
    kind = kind_of(content_type)
    if not body:
        raise Rejected(400, "the request body is empty")
    try:
        if kind == "json":
            return from_rows(_json_array(body))
        if kind == "ndjson":
            try:
                return pajson.read_json(io.BytesIO(body), parse_options=json_options(target))
            except pa.ArrowInvalid:
                return from_rows(_ndjson_rows(body))  # find the bad lines one by one
        if kind == "csv":
            return _csv(body, target)
        if kind == "parquet":
            return pq.read_table(pa.BufferReader(body))
        return pa.ipc.open_stream(body).read_all()
    except Rejected:
        raise
    except (pa.ArrowException, OSError, ValueError, UnicodeDecodeError) as exc:
        raise Rejected(400, f"the body is not valid {kind}: {exc}") from exc


def validate(table: pa.Table, cfg: EntityConfig, target: pa.Schema | None) -> pa.Table:
    """Conform to the entity's schema and check keys and event times; Rejected lists every problem."""
    if table.num_rows == 0:
        raise Rejected(400, "the request holds no records")
    read = conform(table, target, first_line=1)
    problems = [Problem(b.line, b.field, b.reason) for b in read.bad]
    out = read.table
    assert out is not None
    for key in cfg.cdc.primary_key:
        if key not in table.column_names:
            problems.append(Problem(None, key, f"primary key column {key!r} is missing"))
            continue
        nulls = table.column(key).is_null().to_numpy(zero_copy_only=False)  # numbered as sent
        problems.extend(Problem(int(i) + 1, key, f"primary key column {key!r} is null") for i in nulls.nonzero()[0])
    if cfg.event_time.source == "column":
        _, bad_times = event_time.stamp(out, cfg.event_time, "", 0, clock.now())
        problems.extend(_time_problem(b, cfg.event_time.column) for b in bad_times)
    if problems:
        problems.sort(key=lambda p: (p.row is not None, p.row or 0))
        raise Rejected(400, f"{len(problems)} problem(s) in the records; nothing was stored", problems)
    return out


def _time_problem(bad: BadRow, column: str | None) -> Problem:
    return Problem(None, column, bad.reason)


def _json_array(body: bytes) -> list[dict[str, Any]]:
    try:
        document = json.loads(body)
    except ValueError as exc:
        raise Rejected(400, f"the body is not valid JSON: {exc}") from exc
    rows = document if isinstance(document, list) else [document]
    problems = [Problem(i + 1, None, "a record must be a JSON object") for i, r in enumerate(rows)
                if not isinstance(r, dict)]
    if problems:
        raise Rejected(400, "the body must be a JSON array of objects", problems)
    return rows


def _ndjson_rows(body: bytes) -> list[dict[str, Any]]:
    rows, problems = [], []
    for number, line in enumerate(body.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError as exc:
            problems.append(Problem(number, None, f"invalid JSON: {exc}"))
            continue
        if isinstance(value, dict):
            rows.append(value)
        else:
            problems.append(Problem(number, None, "a line must hold a JSON object"))
    if problems:
        raise Rejected(400, "the body is not valid NDJSON", problems)
    return rows


def from_rows(rows: list[dict[str, Any]]) -> pa.Table:
    try:
        return pa.Table.from_pylist(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        # Mixed types in a column: take every value as text; conforming finds the ones that do not fit.
        names = list(dict.fromkeys(k for r in rows for k in r))
        return pa.table({n: pa.array([_text(r.get(n)) for r in rows], pa.string()) for n in names})


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value)


def _csv(body: bytes, target: pa.Schema | None) -> pa.Table:
    problems: list[Problem] = []

    def on_invalid(row: pacsv.InvalidRow) -> str:
        problems.append(Problem(row.number - 1 if row.number else None, None,
                                f"expected {row.expected_columns} columns, found {row.actual_columns}"))
        return "skip"

    parse = pacsv.ParseOptions(invalid_row_handler=on_invalid)
    read = pacsv.ReadOptions(use_threads=False)  # serial: bad rows get their numbers
    # Typed as text: conforming to the schema reports each value that does not fit.
    header = body.split(b"\n", 1)[0].decode("utf-8").rstrip("\r")
    names = next(csv.reader([header])) if target else []
    convert = pacsv.ConvertOptions(column_types={n: pa.string() for n in names}, strings_can_be_null=True)
    table = pacsv.read_csv(io.BytesIO(body), read_options=read, parse_options=parse, convert_options=convert)
    if problems:
        raise Rejected(400, "the body is not valid CSV", problems)
    return table
