"""Reading landed files into Arrow, conformed to the entity's schema.

Rows that cannot be parsed or converted are returned as bad rows (they go to the
quarantine table) instead of failing the file; a file that cannot be decoded at all is one
bad row with line None. Reading uses pyarrow in the driver: measured faster than Spark's
readers for this path, and the Delta writer (delta-rs) takes Arrow as is (docs/architecture.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from lakefeed.batch import joda, json_text, model_json, textfile
from lakefeed.batch.schema import cast_to, decode, delta_compatible, unstorable
from lakefeed.config.data_manifest import TextFileFormat
from lakefeed.config.model import CsvFormat, FileFormat

_BLOCK = 64  # values of a slice that does not cast whole that are cast one by one, not halved further


@dataclass(frozen=True)
class BadRow:
    line: int | None
    reason: str
    raw: str
    field: str | None = None  # the column at fault, when one is


@dataclass
class FileRead:
    table: pa.Table | None
    bad: list[BadRow] = field(default_factory=list)


def read_file(path: Path, fmt: FileFormat, target: pa.Schema | None, origin: Path | None = None) -> FileRead:
    """Raises FileNotFoundError when the file vanished; every other problem becomes bad rows. `origin`: where the
    file landed, when `path` is a descriptor of it."""
    try:
        if isinstance(fmt, CsvFormat):
            return _read_csv(path, fmt, target)
        if fmt.kind == "parquet":
            return conform(pq.read_table(path), target, first_line=None)
        if fmt.kind == "model_json":
            return _read_model_json(path, origin or path, target)
        if fmt.kind == "textfile":
            return _read_textfile(path, fmt, target, origin or path)
        return _read_json(path, fmt.kind, target)
    except FileNotFoundError:
        raise
    except (pa.ArrowException, OSError, ValueError, UnicodeDecodeError) as exc:
        return FileRead(None, [BadRow(None, f"file cannot be decoded: {exc}", _head(path))])


def _head(path: Path, limit: int = 4096) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "backslashreplace")
    except OSError:
        return ""


def _read_csv(path: Path, fmt: CsvFormat, target: pa.Schema | None) -> FileRead:
    if path.stat().st_size == 0:
        return FileRead(None)
    invalid: list[BadRow] = []

    def on_invalid(row: pacsv.InvalidRow) -> str:
        invalid.append(BadRow(row.number, f"expected {row.expected_columns} columns, found "
                              f"{row.actual_columns}", row.text))
        return "skip"

    parse = pacsv.ParseOptions(delimiter=fmt.delimiter, quote_char=fmt.quote, newlines_in_values=fmt.multiline,
                               invalid_row_handler=on_invalid)
    read = pacsv.ReadOptions(encoding=fmt.encoding, autogenerate_column_names=not fmt.header,
                             use_threads=True, block_size=8 << 20)
    nulls = [fmt.null_value] if fmt.null_value else [""]
    # Timestamps are read as text and parsed by `conform`, which takes more fractional digits than the
    # column holds (the CSV parser refuses .NET's seven, and the whole file was read twice).
    types = {f.name: pa.string() if pa.types.is_timestamp(f.type) else f.type for f in target or ()}
    typed = pacsv.ConvertOptions(null_values=nulls, strings_can_be_null=True, column_types=types or None)
    try:
        table = pacsv.read_csv(path, read_options=read, parse_options=parse, convert_options=typed)
        result = conform(table, target, first_line=2 if fmt.header else 1)
    except pa.ArrowInvalid as exc:
        if "conversion error" not in str(exc).lower() or "utf8" in str(exc).lower():
            raise
        # A value does not fit its column type: read as text and sort good rows from bad.
        invalid.clear()
        as_text = pacsv.ConvertOptions(null_values=nulls, strings_can_be_null=True,
                                       column_types={f.name: pa.string() for f in target or ()})
        table = pacsv.read_csv(path, read_options=read, parse_options=parse, convert_options=as_text)
        result = conform(table, target, first_line=2 if fmt.header else 1)
    if any(b.line is None for b in invalid):
        # Parallel parsing does not know line numbers; the rare file with bad rows is re-read serially.
        invalid.clear()
        serial = pacsv.ReadOptions(encoding=fmt.encoding, autogenerate_column_names=not fmt.header,
                                   use_threads=False)
        pacsv.read_csv(path, read_options=serial, parse_options=parse)  # types inferred: cannot fail
    result.bad[:0] = invalid
    return result



def _read_model_json(path: Path, origin: Path, target: pa.Schema | None) -> FileRead:
    """Cells by position as its folder's model.json names and types them, then as the table has them."""
    table, lines, misfits = model_json.read_rows(path, origin)
    bad = [BadRow(line, reason, raw) for line, reason, raw in misfits]
    typed = conform(table, model_json.schema_of(origin), first_line=0)  # bad lines: row indexes, mapped below
    bad += [BadRow(lines[b.line] if b.line is not None else None, b.reason, b.raw, b.field) for b in typed.bad]
    if typed.table is None or target is None:
        return FileRead(typed.table, bad)
    failed = {b.line for b in typed.bad}
    kept = [line for i, line in enumerate(lines) if i not in failed]
    result = conform(typed.table, target, first_line=0)
    bad += [BadRow(kept[b.line] if b.line is not None else None, b.reason, b.raw, b.field) for b in result.bad]
    return FileRead(result.table, bad)


def _read_textfile(path: Path, fmt: TextFileFormat, target: pa.Schema | None, origin: Path) -> FileRead:
    """A data manifest's textfile (the source that reads `origin`): cells by position, typed as the manifest says
    (Java classes as Joda-Convert converts them), rows its entity builder cannot build out, then as the table has
    them (a derived entity: the distinct values of its attribute)."""
    source = fmt.source(origin)
    text, lines, misfits = textfile.read_rows(path, source)
    bad = [BadRow(line, reason, raw) for line, reason, raw in misfits]
    converted, failed = joda.convert(text, source.columns)
    converted, lines = _drop(converted, lines, failed, bad, shown=text)
    typed = conform(converted, textfile.schema(source), first_line=0)  # bad lines: row indexes, mapped below
    bad += [BadRow(lines[b.line] if b.line is not None else None, b.reason, b.raw, b.field) for b in typed.bad]
    if typed.table is None:
        return FileRead(None, bad)
    failed_rows = {b.line for b in typed.bad}
    lines = [line for i, line in enumerate(lines) if i not in failed_rows]
    data, lines = _drop(typed.table, lines, textfile.rejected(typed.table, source, fmt.rating_domain), bad)
    if fmt.derive:
        return FileRead(textfile.derived(data, fmt.derive), bad)
    if target is None:
        return FileRead(data, bad)
    result = conform(data, target, first_line=0)
    bad += [BadRow(lines[b.line] if b.line is not None else None, b.reason, b.raw, b.field) for b in result.bad]
    return FileRead(result.table, bad)


def _drop(data: pa.Table, lines: list[int], failed: dict[int, tuple[str, str]], bad: list[BadRow],
          shown: pa.Table | None = None) -> tuple[pa.Table, list[int]]:
    """The rows not in `failed` (row index -> (column, reason)) and their lines; the failed ones added to `bad`,
    each with its values (those of `shown`, the same rows before conversion, when given)."""
    if not failed:
        return data, lines
    for i, (column, reason) in sorted(failed.items()):
        row = (shown if shown is not None else data).slice(i, 1).to_pylist()[0]
        bad.append(BadRow(lines[i], reason, json.dumps({k: None if v is None else str(v) for k, v in row.items()}),
                          column))
    keep = np.ones(data.num_rows, dtype=bool)
    keep[list(failed)] = False
    return data.filter(pa.array(keep)), [line for i, line in enumerate(lines) if i not in failed]


def json_options(target: pa.Schema | None) -> pajson.ParseOptions:
    """Parse the target's columns as their types: inferred types would turn e.g. ISO strings into
    timestamps (and back into differently formatted strings)."""
    if target is None:
        return pajson.ParseOptions()
    return pajson.ParseOptions(explicit_schema=target, unexpected_field_behavior="infer")


def _read_json(path: Path, kind: str, target: pa.Schema | None) -> FileRead:
    if kind == "ndjson":
        try:
            return conform(pajson.read_json(path, parse_options=json_options(target)), target, first_line=1)
        except pa.ArrowInvalid:
            pass  # find the bad lines one by one below
        rows, bad = [], []
        with open(path, encoding="utf-8-sig") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    value = json_text.loads_line(line)
                except json_text.KeyTwice:
                    bad += [BadRow(number, json_text.reason(column, key), line.rstrip("\n"), column or key)
                            for _, column, key in json_text.twice(line)]
                    continue
                except ValueError as exc:
                    bad.append(BadRow(number, f"invalid JSON: {exc}", line.rstrip("\n")))
                    continue
                if isinstance(value, dict):
                    rows.append(value)
                else:
                    bad.append(BadRow(number, "a JSON line must hold an object", line.rstrip("\n")))
        result = conform(from_rows(rows), target, first_line=None) if rows else FileRead(None)
        result.bad[:0] = bad
        return result
    try:
        text = json_text.utf8(path.read_bytes())
    except json_text.NotUtf8 as exc:
        return FileRead(None, [BadRow(None, f"the file is {exc}", _head(path))])
    bad = []
    try:
        document = json_text.loads(text)
        rows = document if isinstance(document, list) else [document]
        if all(map(dict.__instancecheck__, rows)):
            json_text.unique(text, rows)
    except json_text.KeyTwice:  # those records are quarantined, the others taken
        twice, written = json_text.twice(text), json_text.sources(text)
        bad = [BadRow(None, f"record {i + 1}: {json_text.reason(column, key)}", written[i], column or key)
               for i, column, key in twice]
        document, at_fault = json.loads(text), {i for i, _, _ in twice}
        rows = [row for i, row in enumerate(document if isinstance(document, list) else [document])
                if i not in at_fault]
    if not all(isinstance(r, dict) for r in rows):
        return FileRead(None, [BadRow(None, "a JSON file must hold an object or an array of objects", _head(path))])
    result = conform(from_rows(rows), target, first_line=None) if rows else FileRead(None)
    result.bad[:0] = bad
    return result


def from_rows(rows: list[dict[str, Any]]) -> pa.Table:
    """JSON objects as a table: a column for every key of any object (Arrow's `Table.from_pylist` takes
    the first object's keys and silently drops the others'), typed by all of its values. A column whose
    values mix types (or hold an int beyond 64 bits) is taken as text: conforming then finds the values
    that do not fit."""
    names = dict.fromkeys(rows[0]) if rows else {}
    if len(set().union(*rows)) > len(names):  # an object has a key the first lacks: every key, in order seen
        names = dict.fromkeys(k for r in rows for k in r)
    columns = {}
    for name in names:
        values = [r.get(name) for r in rows]
        try:
            columns[name] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            columns[name] = pa.array([_text(v) for v in values], pa.string())
    return pa.table(columns)


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value)


def conform(table: pa.Table, target: pa.Schema | None, first_line: int | None = None) -> FileRead:
    """Cast to the target schema (missing columns become null; new ones are kept for schema merge)."""
    names = table.column_names
    if len(set(names)) < len(names):  # a CSV header or an Arrow body naming a column twice: no row can be placed
        twice = next(n for n in names if names.count(n) > 1)
        return FileRead(None, [BadRow(None, f"column {twice!r} appears twice", "", twice)])
    for f in table.schema:
        if (why := unstorable(f.type)) is not None:  # no row can be placed: the file (or request) is refused
            return FileRead(None, [BadRow(None, f"column {f.name!r} {why}", "", f.name)])
    failures: dict[int, tuple[str, str]] = {}
    sent = table
    if table.schema != delta_compatible(table.schema):
        table = _storable(table, failures)
    if target is None and not failures:
        return FileRead(table)
    columns, names = [], []
    for f in target if target is not None else table.schema:
        if f.name not in table.column_names:
            columns.append(pa.nulls(table.num_rows, f.type))
        else:
            column = table.column(f.name)
            if column.type != f.type:
                try:
                    column = cast_to(column, f.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    column, failed = _cast_per_value(column, f.type)
                    for i, value in _values_at(table.column(f.name), failed):
                        failures.setdefault(i, (f.name, f"column {f.name!r}: {value!r} is not a valid {f.type}"))
            columns.append(column)
        names.append(f.name)
    for name in table.column_names if target is not None else ():
        if name not in target.names:
            columns.append(table.column(name))
            names.append(name)
    out = pa.Table.from_arrays(columns, names=names)
    if not failures:
        return FileRead(out)
    bad = []
    places = sorted(failures)
    texts = [[None if v is None else str(v) for _, v in _values_at(sent.column(name), places)]
             for name in sent.column_names]
    for i, *values in zip(places, *texts, strict=True):
        name, reason = failures[i]
        raw = json.dumps(dict(zip(sent.column_names, values, strict=True)))
        bad.append(BadRow(first_line + i if first_line is not None else None, reason, raw, name))
    keep = np.ones(table.num_rows, dtype=bool)
    keep[list(failures)] = False
    return FileRead(out.filter(pa.array(keep)), bad)


def _storable(table: pa.Table, failures: dict[int, tuple[str, str]]) -> pa.Table:
    """The columns as types Delta stores (`delta_compatible`), dictionaries and list views decoded. A value the
    stored type cannot hold (a nanosecond, an unsigned integer past 2^63) is a failure of its row, naming the
    column (a null in its place), so that the other rows are taken."""
    columns = []
    for f, column in zip(table.schema, table.columns, strict=True):
        to = delta_compatible(pa.schema([f])).field(0).type
        column = decode(column)
        if column.type != to:
            try:
                column = column.cast(to)
            except pa.ArrowInvalid:
                column, failed = _cast_per_value(column, to)
                for i, value in _values_at(table.column(f.name), failed):
                    failures.setdefault(i, (f.name, f"column {f.name!r}: {value!r} is not a valid {to} (the type "
                                                    "tables store it as)"))
        columns.append(column)
    return pa.Table.from_arrays(columns, names=table.column_names)


def as_python(value: pa.Scalar) -> Any:
    """The value in Python, or Arrow's text of it where Python cannot hold it (a timestamp of the year 0)."""
    try:
        return value.as_py()
    except (OverflowError, ValueError):
        return value.cast(pa.string()).as_py()


def _values_at(column: pa.ChunkedArray, places: Iterable[int]) -> list[tuple[int, Any]]:
    """(place, value in Python) at each of `places`, in their order: taken at once (indexing a column of many chunks
    one value at a time walks its chunks each time)."""
    places = sorted(places)
    values = column.take(pa.array(places, pa.int64()))
    try:
        python = values.to_pylist()
    except (OverflowError, ValueError):
        python = [as_python(v) for v in values]
    return list(zip(places, python, strict=True))


def _cast_per_value(column: pa.ChunkedArray, to: pa.DataType) -> tuple[pa.ChunkedArray, set[int]]:
    """`column` cast with a null for each value that does not cast, and those values' places. Found by halving: a
    slice that casts is taken whole, one that does not is halved, down to _BLOCK values cast one by one (kept as
    Arrow scalars: `as_py` fails on values Arrow holds and Python does not, a year 0 timestamp). A million values
    with one bad among them took 18 s one by one; a failed cast stops at the first bad value, so halving costs
    about two casts of the column and some 30 of a slice."""
    pieces: list[tuple[int, pa.Array]] = []
    failed: set[int] = set()
    whole = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    todo = [(0, len(whole))]
    while todo:
        start, length = todo.pop()
        part = whole.slice(start, length)
        try:
            pieces.append((start, cast_to(part, to)))
            continue
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
        if length > _BLOCK:
            half = length // 2
            todo += [(start + half, length - half), (start, half)]  # the first half next: pieces come in order
            continue
        values = []
        for i, scalar in enumerate(part, start):
            try:
                values.append(cast_to(scalar, to) if scalar.is_valid else None)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                values.append(None)
                failed.add(i)
        pieces.append((start, pa.array(values, type=to)))
    return pa.chunked_array([piece for _, piece in pieces], type=to), failed
