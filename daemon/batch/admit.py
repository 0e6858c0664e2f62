"""What a table may take: checked before a push is acknowledged and before a file's rows are committed.

Everything here is something the commit path (delta-rs, Parquet and Delta readers, the manifests)
would refuse or store unreadably later, when nobody can fix it any more: column names that differ
only by case (delta-rs refuses them) or that take lakefeed's working names (`__…`), nesting deeper
than readers take, more columns than the limits allow, and strings that are not valid UTF-8.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from lakefeed.config.limits import Limits

RESERVED_PREFIX = "__"  # lakefeed's working columns (event time, CDC kind, order) while a batch is built


def depth(t: pa.DataType) -> int:
    """How deep a type nests: 0 for a scalar, 1 for a list or struct of scalars, …"""
    if pa.types.is_struct(t):
        return 1 + max((depth(t.field(i).type) for i in range(t.num_fields)), default=0)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t) \
            or pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return 1 + depth(t.value_type)
    if pa.types.is_map(t):
        return 1 + max(depth(t.key_type), depth(t.item_type))
    return 0


def schema_problems(schema: pa.Schema, target: pa.Schema | None, limits: Limits) -> list[tuple[str | None, str]]:
    """(field, message) for each way the columns cannot be stored; [] when they can."""
    problems: list[tuple[str | None, str]] = []
    if len(schema) > limits.max_columns:
        return [(None, f"{len(schema)} columns, more than limits.max_columns ({limits.max_columns})")]
    known = {n.casefold(): n for n in (target.names if target is not None else ())}
    seen: dict[str, str] = {}
    for f in schema:
        name = f.name
        if not name.strip():
            problems.append((name, "a column name is empty"))
            continue
        if name.startswith(RESERVED_PREFIX):
            problems.append((name, f"column names starting with {RESERVED_PREFIX!r} are lakefeed's own; rename it"))
        if any(ord(c) < 32 for c in name):
            problems.append((name, f"column name {name!r} holds a control character"))
        folded = name.casefold()
        if folded in seen:
            other = seen[folded]
            problems.append((name, f"column {name!r} appears twice" if other == name else
                             f"columns {other!r} and {name!r} differ only by case; Delta tables take one of them"))
        elif folded in known and known[folded] != name:
            problems.append((name, f"column {name!r} differs only by case from the table's {known[folded]!r}; "
                                   f"send it as {known[folded]!r}"))
        seen[folded] = name
        if (d := depth(f.type)) > limits.max_nesting:
            problems.append((name, f"column {name!r} nests {d} levels deep, more than limits.max_nesting "
                                   f"({limits.max_nesting})"))
    return problems


def utf8_problem(table: pa.Table) -> str | None:
    """Why the table's strings cannot be stored (invalid UTF-8), or None. Arrow checks it in one pass."""
    try:
        table.validate(full=True)
    except pa.ArrowInvalid as exc:
        return f"the data is not valid: {exc}"
    return None


_OPEN = np.zeros(256, np.int8)
_OPEN[[ord("["), ord("{")]] = 1
_OPEN[[ord("]"), ord("}")]] = -1


class JsonDepth:
    """The deepest nesting of brackets in JSON text, outside strings, fed in pieces. A JSON parser recurses
    per level: pyarrow's crashes the process at about 20,000, so a file or body is measured before it is
    parsed (in numpy, a few hundred MB/s, holding one piece at a time)."""

    def __init__(self) -> None:
        self.deepest = 0
        self._depth = 0
        self._in_string = False
        self._backslashes = 0  # how many backslashes end the text fed so far

    def feed(self, piece: bytes) -> None:
        data = np.frombuffer(piece, np.uint8)
        if not data.size:
            return
        n = data.size
        slash = data == ord("\\")
        # a quote is a string's edge unless an odd run of backslashes stands before it
        last_other = np.maximum.accumulate(np.where(slash, -1, np.arange(n)))
        before = np.arange(n) - 1 - np.concatenate(([-1], last_other[:-1]))
        before[: int(np.argmax(~slash)) + 1 if (~slash).any() else n] += self._backslashes  # runs from the last piece
        edges = (data == ord('"')) & (before % 2 == 0)
        inside = (np.cumsum(edges) + self._in_string) % 2 == 1  # true from an opening quote up to its closing
        steps = np.where(inside | edges, 0, _OPEN[data]).astype(np.int64)
        depth = np.cumsum(steps) + self._depth
        self.deepest = max(self.deepest, int(depth.max()))
        self._depth = int(depth[-1])
        self._in_string = bool(inside[-1])
        tail = n - 1 - int(last_other[-1])
        self._backslashes = tail + (self._backslashes if tail == n else 0)


def json_depth(text: bytes) -> int:
    measure = JsonDepth()
    measure.feed(text)
    return measure.deepest


# Far deeper than any schema lakefeed stores (limits.max_nesting is at most 64, checked once parsed), far below
# where parsers fail (pyarrow's JSON reader crashes the process at about 20,000 levels; it reads 5,000).
PARSER_DEPTH = 2000


def too_deep(text: bytes, limit: int = PARSER_DEPTH) -> bool:
    """Whether some line of JSON text nests `limit` levels or more. A line nests no deeper than it has opening
    brackets, nor than it is long: only lines that long with that many brackets are measured exactly, so the
    common case costs a pass that finds the line ends."""
    data = np.frombuffer(text, np.uint8)
    ends = np.flatnonzero(data == ord("\n")) + 1
    if not ends.size or ends[-1] != data.size:
        ends = np.append(ends, data.size)
    starts = np.concatenate(([0], ends[:-1]))
    long = np.flatnonzero(ends - starts >= limit)
    if not long.size:
        return False
    opening = (data == ord("[")) | (data == ord("{"))
    return any(np.count_nonzero(opening[starts[i]:ends[i]]) >= limit and
               json_depth(text[starts[i]:ends[i]]) >= limit for i in long)
