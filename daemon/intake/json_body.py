"""JSON and NDJSON request bodies read as their producer means them.

JSON is UTF-8 (RFC 8259 §8.1). A body in UTF-16 or UTF-32 is a 400 that says so: Python's parser would
quietly decode a JSON array in them, Arrow's would refuse NDJSON, so a body was taken or not by its
Content-Type. A UTF-8 byte order mark, which many producers write, is dropped, as for CSV.

An object naming a key twice (`{"id": 1, "id": 2}`) is a 400 naming the record and the key: parsers keep
one of the values (Python's the last, others the first), so storing either loses the other without a word.
Arrow's NDJSON reader refuses such objects itself; a JSON array is parsed by Python's `json`, whose only
way to see a repeated key is a Python call per object (`object_pairs_hook`, +60% on the parse). Small
bodies pay that; larger ones are parsed plainly and counted instead (`_no_key_twice`: ~4% of a request of
flat records, a pass over the objects for nested ones).
"""

from __future__ import annotations

import codecs
import io
import json
from itertools import chain, compress, repeat
from operator import is_
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson

from lakefeed.batch.admit import PARSER_DEPTH, too_deep
from lakefeed.batch.read import from_rows, json_options
from lakefeed.intake.problems import Problem, Rejected

# Up to this size a JSON body is checked in the parser (~0.36 µs an object, ~4.5 µs at 1 KiB of 4-field records);
# larger ones are counted (`_no_key_twice`: ~4.5 µs, plus ~0.6 µs a KiB), which then costs less.
PAIRS_BYTES = 1024
_COLON, _QUOTE = ord(":"), ord('"')


def utf8(body: bytes) -> bytes:
    """The body without a UTF-8 byte order mark; Rejected when it is UTF-16 or UTF-32, as its byte order mark
    or the NUL bytes beside its first characters (ASCII in JSON) tell (RFC 8259 §8.1, RFC 4627 §3)."""
    encoding = json.detect_encoding(body[:4])
    if encoding == "utf-8-sig":
        return body[len(codecs.BOM_UTF8):]
    if encoding != "utf-8":
        raise Rejected(400, f"the body is {encoding.upper()}: JSON must be sent as UTF-8 (RFC 8259 §8.1); "
                            "nothing was stored")
    return body


def json_array(body: bytes) -> list[dict[str, Any]]:
    """The records of a JSON body (an array of objects, or one object), or Rejected."""
    text = utf8(body)
    small = len(text) <= PAIRS_BYTES
    try:
        document = _parse(text, check=small)
    except _KeyTwice:
        raise _rejected(_twice_problems(text, 1)) from None
    except ValueError as exc:
        raise Rejected(400, f"the body is not valid JSON: {exc}") from exc
    rows = document if isinstance(document, list) else [document]
    problems = [Problem(i + 1, None, "a record must be a JSON object") for i, r in enumerate(rows)
                if not isinstance(r, dict)]
    if problems:
        raise Rejected(400, "the body must be a JSON array of objects", problems)
    if not small and not _no_key_twice(text, rows):
        try:
            _parse(text, check=True)
        except _KeyTwice:
            raise _rejected(_twice_problems(text, 1)) from None
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
            value = _UNIQUE.decode(line)
        except _KeyTwice:
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


def _parse(text: bytes, check: bool) -> Any:
    """The JSON text (UTF-8, without a byte order mark); with `check`, _KeyTwice at an object naming a key twice."""
    decoded = text.decode("utf-8", "surrogatepass")  # as json.loads decodes bytes
    return _UNIQUE.decode(decoded) if check else json.loads(decoded)


def _no_key_twice(text: bytes, rows: list[dict[str, Any]]) -> bool:
    """Whether counting proves that no object of the JSON text `text`, parsed as `rows`, names a key twice.

    Each member of an object is a key, maybe whitespace, then a colon: so the colons right after a quote or
    whitespace (or a byte below the quote, which JSON has nowhere else) are at least as many as the members
    written. The objects parsed hold at most that many keys, fewer when a key was repeated: as many, and
    none was. The top-level objects' keys are counted first (no Python per record); when there are more
    colons, the nested objects' too. A string holding `":` or ` :` proves nothing: the caller then parses
    again with the check in the parser."""
    data = np.frombuffer(text, np.uint8)
    written = int(np.count_nonzero((data[1:] == _COLON) & (data[:-1] <= _QUOTE)))
    return written == sum(map(len, rows)) or written == _keys(rows)


def _keys(rows: list[dict[str, Any]]) -> int:
    """The keys of the objects in `rows`, at any depth: one level at a time, each in C loops (none in Python per
    value), about what checking each object in the parser would cost."""
    total, objects, arrays = 0, rows, []
    while objects or arrays:
        total += sum(map(len, objects))
        values = list(chain(chain.from_iterable(map(dict.values, objects)), chain.from_iterable(arrays)))
        kinds = list(map(type, values))
        objects = list(compress(values, map(is_, kinds, repeat(dict))))
        arrays = list(compress(values, map(is_, kinds, repeat(list))))
    return total


class _KeyTwice(Exception):
    """An object names a key twice (not a ValueError: the JSON is valid)."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`object_pairs_hook` that refuses an object naming a key twice, as cheaply as a Python hook can."""
    obj = dict(pairs)
    if len(obj) < len(pairs):
        raise _KeyTwice
    return obj


_UNIQUE = json.JSONDecoder(object_pairs_hook=_unique)  # made once: json.loads(…, hook) makes one per call (~3 µs)


class _Object(dict):
    """An object as parsed while looking for the repeated keys: `twice` is one, or None."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(pairs)
        self.twice: str | None = None
        seen: set[str] = set()
        for key, _ in pairs if len(self) < len(pairs) else ():
            if key in seen:
                self.twice = key
                break
            seen.add(key)


def _twice_problems(text: bytes | str, first: int) -> list[Problem]:
    """A problem for each record of `text` (numbered from `first`) with an object that names a key twice."""
    document = json.loads(text, object_pairs_hook=_Object)
    rows = document if isinstance(document, list) else [document]
    problems = []
    for number, row in enumerate(rows, start=first):
        if not isinstance(row, _Object):
            continue
        if row.twice is not None:
            problems.append(Problem(number, row.twice, f"the record names {row.twice!r} twice: send each key "
                                                       "once (only one of the values could be stored)"))
        problems += [Problem(number, name, f"column {name!r} holds an object naming {key!r} twice: send each "
                                           "key once (only one of the values could be stored)")
                     for name, value in row.items() if (key := _nested_twice(value)) is not None]
    return problems


def _nested_twice(value: Any) -> str | None:
    """A key that an object in `value`, at any depth, names twice."""
    if isinstance(value, _Object):
        if value.twice is not None:
            return value.twice
        value = value.values()
    elif not isinstance(value, list):
        return None
    return next((key for v in value if (key := _nested_twice(v)) is not None), None)


def _rejected(problems: list[Problem]) -> Rejected:
    return Rejected(400, f"{len({p.row for p in problems})} record(s) name a key twice; nothing was stored",
                    problems)
