"""JSON and NDJSON request bodies read as their producer means them (daemon/batch/json_text.py): UTF-8 (a byte
order mark dropped; UTF-16 or UTF-32 a 400 that says so), and an object naming a key twice a 400 naming the record
and the key. Nothing of a body at fault is stored.
"""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa
import pyarrow.json as pajson

from lakefeed.batch import json_text
from lakefeed.batch.admit import PARSER_DEPTH, too_deep
from lakefeed.batch.read import from_rows, json_options
from lakefeed.intake.problems import Problem, Rejected


def utf8(body: bytes) -> bytes:
    """The body without a UTF-8 byte order mark; Rejected when it is UTF-16 or UTF-32."""
    try:
        return json_text.utf8(body)
    except json_text.NotUtf8 as exc:
        raise Rejected(400, f"the body is {exc}; nothing was stored") from None


def json_array(body: bytes) -> list[dict[str, Any]]:
    """The records of a JSON body (an array of objects, or one object), or Rejected."""
    text = utf8(body)
    try:
        document = json_text.loads(text)
        rows = document if isinstance(document, list) else [document]
        if not all(map(dict.__instancecheck__, rows)):
            raise Rejected(400, "the body must be a JSON array of objects", [
                Problem(i + 1, None, "a record must be a JSON object") for i, r in enumerate(rows)
                if not isinstance(r, dict)])
        json_text.unique(text, rows)
    except json_text.KeyTwice:
        raise _rejected(_twice_problems(text, 1)) from None
    except ValueError as exc:
        raise Rejected(400, f"the body is not valid JSON: {exc}") from exc
    return rows


def ndjson(body: bytes, target: pa.Schema | None) -> pa.Table:
    """An NDJSON body as a table (not yet conformed), or Rejected listing the lines at fault."""
    body = utf8(body)
    if too_deep(body):  # pyarrow's reader would crash the process on it
        raise Rejected(400, f"the body nests more than {PARSER_DEPTH} levels deep; nothing was stored")
    try:
        return pajson.read_json(io.BytesIO(body), parse_options=json_options(target))
    except pa.ArrowInvalid:  # a line that is not JSON, or names a key twice
        return from_rows(_ndjson_rows(body))  # find the bad lines one by one


def _ndjson_rows(body: bytes) -> list[dict[str, Any]]:
    rows, problems, invalid = [], [], False
    for number, line in enumerate(body.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json_text.loads_line(line)
        except json_text.KeyTwice:
            problems += _twice_problems(line, number)
            continue
        except ValueError as exc:
            problems.append(Problem(number, None, f"invalid JSON: {exc}"))
            invalid = True
            continue
        if isinstance(value, dict):
            rows.append(value)
        else:
            problems.append(Problem(number, None, "a line must hold a JSON object"))
            invalid = True
    if invalid:
        raise Rejected(400, "the body is not valid NDJSON", problems)
    if problems:
        raise _rejected(problems)
    return rows


def _twice_problems(text: bytes | str, first: int) -> list[Problem]:
    """A problem for each key a record of `text` (numbered from `first`) names twice."""
    return [Problem(first + i, column or key, json_text.reason(column, key))
            for i, column, key in json_text.twice(text)]


def _rejected(problems: list[Problem]) -> Rejected:
    return Rejected(400, f"{len({p.row for p in problems})} record(s) name a key twice; nothing was stored",
                    problems)
