"""JSON text read as its producer means it, for pushed bodies (daemon/intake/json_body.py) and landed files alike.

JSON is UTF-8 (RFC 8259 §8.1). Text in UTF-16 or UTF-32 is refused with a reason that says so: Python's parser
would quietly decode a JSON array in them, Arrow's would refuse NDJSON. A UTF-8 byte order mark, which many
producers write, is dropped, as for CSV.

An object naming a key twice (`{"id": 1, "id": 2}`) is refused: parsers keep one of the values (Python's the last,
others the first), so storing either loses the other without a word. Arrow's NDJSON reader refuses such objects
itself; a JSON array is parsed by Python's `json`, whose only way to see a repeated key is a Python call per object
(`object_pairs_hook`, +60% on the parse). Small texts pay that; larger ones are parsed plainly and counted instead
(`_no_key_twice`: ~4% of a request of flat records, a pass over the objects for nested ones).
"""

from __future__ import annotations

import codecs
import json
import re
from itertools import chain, compress, repeat
from operator import is_
from typing import Any

import numpy as np

# Up to this size a JSON text is checked in the parser (~0.36 µs an object, ~4.5 µs at 1 KiB of 4-field records);
# larger ones are counted (`_no_key_twice`: ~4.5 µs, plus ~0.6 µs a KiB), which then costs less.
PAIRS_BYTES = 1024
_COLON, _QUOTE = ord(":"), ord('"')
_GAP = re.compile(r"[ \t\n\r,]*")  # between an array's elements


class NotUtf8(ValueError):
    """JSON text in UTF-16 or UTF-32."""


class KeyTwice(Exception):
    """An object names a key twice (not a ValueError: the JSON is valid)."""


def utf8(text: bytes) -> bytes:
    """The text without a UTF-8 byte order mark; NotUtf8 when it is UTF-16 or UTF-32, as its byte order mark or the
    NUL bytes beside its first characters (ASCII in JSON) tell (RFC 8259 §8.1, RFC 4627 §3)."""
    encoding = json.detect_encoding(text[:4])
    if encoding == "utf-8-sig":
        return text[len(codecs.BOM_UTF8):]
    if encoding != "utf-8":
        raise NotUtf8(f"{encoding.upper()}, and JSON must be sent as UTF-8 (RFC 8259 §8.1)")
    return text


def loads(text: bytes) -> Any:
    """The JSON text (UTF-8, without a byte order mark) parsed, ValueError when it is not JSON. A small text is
    checked in the parser (KeyTwice when an object names a key twice); a larger one by `unique` once its records
    are known to be objects."""
    decoded = text.decode("utf-8", "surrogatepass")  # as json.loads decodes bytes
    return _UNIQUE.decode(decoded) if len(text) <= PAIRS_BYTES else json.loads(decoded)


def unique(text: bytes, rows: list[dict[str, Any]]) -> None:
    """KeyTwice when an object of the JSON text, parsed (`loads`) as these records, names a key twice."""
    if len(text) > PAIRS_BYTES and not _no_key_twice(text, rows):
        _UNIQUE.decode(text.decode("utf-8", "surrogatepass"))  # counting proves nothing: the parser checks


def loads_line(line: str) -> Any:
    """One NDJSON line parsed; KeyTwice when an object names a key twice, ValueError when it is not JSON."""
    return _UNIQUE.decode(line)


def twice(text: bytes | str) -> list[tuple[int, str | None, str]]:
    """(record, column, key) for each key named twice: the record by its index in the array (0: the text's one
    object), the column None when the record itself names it, else the column whose object (at any depth) does."""
    document = json.loads(text, object_pairs_hook=_Object)
    out: list[tuple[int, str | None, str]] = []
    for i, row in enumerate(document if isinstance(document, list) else [document]):
        if not isinstance(row, _Object):
            continue
        if row.twice is not None:
            out.append((i, None, row.twice))
        out += [(i, name, key) for name, value in row.items() if (key := _nested_twice(value)) is not None]
    return out


def sources(text: bytes | str) -> list[str]:
    """Each record's own text, as written (an array's elements, or the text's one value): what a record naming a
    key twice is quarantined as, both values in it."""
    decoded = text.decode("utf-8", "surrogatepass") if isinstance(text, bytes) else text
    start = len(decoded) - len(decoded.lstrip())
    if not decoded.startswith("[", start):
        return [decoded.strip()]
    out, at = [], start + 1
    while True:
        at = _GAP.match(decoded, at).end()  # type: ignore[union-attr]  (it matches the empty string too)
        if decoded.startswith("]", at) or at >= len(decoded):
            return out
        _, end = _PLAIN.raw_decode(decoded, at)
        out.append(decoded[at:end])
        at = end


def reason(column: str | None, key: str) -> str:
    """Why a record naming `key` twice (in `column`, if nested) is not taken."""
    where = "the record names" if column is None else f"column {column!r} holds an object naming"
    return f"{where} {key!r} twice: send each key once (only one of the values could be stored)"


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


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`object_pairs_hook` that refuses an object naming a key twice, as cheaply as a Python hook can."""
    obj = dict(pairs)
    if len(obj) < len(pairs):
        raise KeyTwice
    return obj


_PLAIN = json.JSONDecoder()
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


def _nested_twice(value: Any) -> str | None:
    """A key that an object in `value`, at any depth, names twice."""
    if isinstance(value, _Object):
        if value.twice is not None:
            return value.twice
        value = value.values()
    elif not isinstance(value, list):
        return None
    return next((key for v in value if (key := _nested_twice(v)) is not None), None)
