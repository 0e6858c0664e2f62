"""The push API's fast path for small JSON requests gives what the general path gives.

`records.accept` builds a small JSON request whose values plainly fit their columns straight into
the table's types; the model is the general path, `validate(decode(...))` (Arrow's inference, then
casts to the table's schema). Hypothesis draws schemas, rows of fitting and unfitting values, keys
and event-time settings; both must agree on the table (to the byte, as the spool stores it) or on
the rejection (status, message and every problem).
"""

from __future__ import annotations

import codecs
import json
from pathlib import Path

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakefeed.batch.json_text import PAIRS_BYTES
from lakefeed.config import model as config
from lakefeed.inbox.spool import encode
from lakefeed.intake.json_body import json_array
from lakefeed.intake.problems import Rejected
from lakefeed.intake.records import _plain, accept, decode, validate
from tests.conftest import write_config

TYPES = [pa.int64(), pa.int32(), pa.int8(), pa.float64(), pa.string(), pa.bool_(), pa.timestamp("us", tz="UTC"),
         pa.date32()]
NAMES = ["id", "a", "b", "c"]
LIMIT = 1 << 20
VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70), st.integers(-200, 200),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6), st.sampled_from(["12", "2.5", "true"]),
    st.sampled_from(["2024-05-01T10:00:00Z", "2024-05-01", "not a time"]),
    st.lists(st.integers(0, 3), max_size=2), st.dictionaries(st.sampled_from("xy"), st.integers(0, 3), max_size=1))


def _cfg(tmp: Path, primary_key: list[str], time_column: str | None) -> config.EntityConfig:
    entity = {"name": "events", "push": [{"name": "api", "tokens_sha256": ["0" * 64]}],
              "cdc": {"strategy": "ledger" if primary_key else "append", "primary_key": primary_key}}
    if time_column:
        entity["event_time"] = {"source": "column", "column": time_column}
    return config.load(write_config(tmp, [entity])).entities[0]


def _outcome(run):
    try:
        return "table", encode(run())
    except Rejected as exc:
        return "rejected", (exc.status, exc.message, exc.problems)


@st.composite
def cases(draw):
    types = draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=len(NAMES)))
    target = pa.schema([pa.field(n, t) for n, t in zip(NAMES, types, strict=False)])
    key = draw(st.sampled_from([[], ["id"]]))
    times = [f.name for f in target if pa.types.is_timestamp(f.type)]
    time_column = draw(st.sampled_from([None, *times]))
    # Half the cases are meant for the fast path (values of their column's kind, keys present), with
    # a chance of one value that is not; the others draw any value for any column, new ones too.
    plain = draw(st.booleans())
    names = target.names if plain else [*target.names, "extra"]
    rows = []
    for _ in range(draw(st.integers(0 if not plain else 1, 6))):
        chosen = draw(st.lists(st.sampled_from(names), unique=True, min_size=0 if not plain else 1))
        if plain and key:
            chosen = list(dict.fromkeys(["id", *chosen]))
        row = {}
        for name in chosen:
            column = target.field(name).type if name in target.names else None
            fitting = _fitting(column, required=name in key) if plain and column is not None else VALUES
            row[name] = draw(fitting)
        rows.append(row)
    if plain and rows and draw(st.integers(0, 9)) == 0:  # now and then one value that does not fit
        row = draw(st.sampled_from(rows))
        row[draw(st.sampled_from(sorted(row)))] = draw(VALUES)
    return target, rows, key, time_column


def _fitting(t: pa.DataType, required: bool) -> st.SearchStrategy:
    """Values of the column's own kind (null too unless `required`); null only for the other types."""
    if pa.types.is_integer(t):
        bits = t.bit_width - 1
        values = st.integers(-(1 << bits), (1 << bits) - 1)
    elif pa.types.is_floating(t):
        values = st.one_of(st.floats(), st.integers(-(1 << 53), 1 << 53))
    elif pa.types.is_string(t):
        values = st.text(max_size=6)
    elif pa.types.is_boolean(t):
        values = st.booleans()
    else:
        return st.none()
    return values if required else st.one_of(st.none(), values)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_the_fast_path_agrees_with_decoding_and_conforming(tmp_path, case):
    target, rows, key, time_column = case
    cfg = _cfg(tmp_path, key, time_column)
    body = json.dumps(rows).encode()
    fast = _outcome(lambda: accept(body, "application/json", cfg, target, LIMIT))
    general = _outcome(lambda: validate(decode(body, "application/json", target, LIMIT), cfg, target))
    assert fast == general


def test_plain_requests_take_the_fast_path_and_the_rest_do_not(tmp_path):
    cfg = _cfg(tmp_path, ["id"], None)
    target = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string()), pa.field("amount", pa.float64())])
    table = _plain([{"id": 1, "name": "a", "amount": 2}, {"id": 2, "amount": 2.5}], cfg, target)
    assert table is not None and table.to_pylist() == [{"id": 1, "name": "a", "amount": 2.0},
                                                       {"id": 2, "name": None, "amount": 2.5}]
    assert _plain([{"id": 1, "new": "x"}], cfg, target) is None  # a new column: schema evolution
    assert _plain([{"id": 1, "amount": "2.5"}], cfg, target) is None  # text for a number: cast or reject
    assert _plain([{"id": True}], cfg, target) is None  # a boolean is no integer here
    assert _plain([{"name": "no key"}], cfg, target) is None  # the key is missing: the general path says so
    assert _plain([{"id": 1 << 63}], cfg, target) is None  # out of int64's range
    assert _plain([], cfg, target) is None


def test_keys_missing_from_the_first_record_are_stored_and_huge_ints_are_a_400(tmp_path):
    cfg = _cfg(tmp_path, [], None)
    body = json.dumps([{"id": 1}, {"id": 2, "a": "x"}]).encode()
    assert accept(body, "application/json", cfg, None, LIMIT).to_pylist() == [{"id": 1, "a": None}, {"id": 2, "a": "x"}]
    target = pa.schema([pa.field("id", pa.int64())])
    try:
        accept(json.dumps([{"id": 1 << 70}]).encode(), "application/json", cfg, target, LIMIT)
    except Rejected as exc:
        assert exc.status == 400 and [(p.row, p.field) for p in exc.problems] == [(1, "id")]
    else:
        raise AssertionError("an int beyond 64 bits was accepted")


# What `json_body._no_key_twice` counts (colons after a quote or whitespace), in keys and strings; separators
# with whitespace before the colon; escaped and unescaped text.
KEYS = st.sampled_from(["id", "a", "b", ":", 'q"', "a :", "é"])
STRINGS = st.one_of(st.sampled_from(["", ":x", "a:b", " : ", '":', '\\":', "12:30", "é:"]),
                    st.text(st.characters(exclude_categories=("Cs",)), max_size=4))
COLONS = st.sampled_from([":", ": ", " : ", "\n:", "\t: "])
COMMAS = st.sampled_from([",", ", ", ",\n"])


@st.composite
def _json_value(draw, depth: int) -> tuple[str, bool]:
    """JSON text of a value, written by hand, and whether an object in it names a key twice."""
    kind = draw(st.sampled_from(["scalar", "string", "list", "object"] if depth < 3 else ["scalar", "string"]))
    if kind == "scalar":
        return json.dumps(draw(st.one_of(st.none(), st.booleans(), st.integers()))), False
    if kind == "string":
        return json.dumps(draw(STRINGS), ensure_ascii=draw(st.booleans())), False
    if kind == "list":
        items = draw(st.lists(_json_value(depth + 1), max_size=3))
        return "[" + draw(COMMAS).join(t for t, _ in items) + "]", any(d for _, d in items)
    return draw(_json_object(depth + 1))


@st.composite
def _json_object(draw, depth: int) -> tuple[str, bool]:
    keys = draw(st.lists(KEYS, max_size=4))
    values = [draw(_json_value(depth)) for _ in keys]
    members = [json.dumps(k, ensure_ascii=draw(st.booleans())) + draw(COLONS) + t
               for k, (t, _) in zip(keys, values, strict=True)]
    return "{" + draw(COMMAS).join(members) + "}", len(set(keys)) < len(keys) or any(d for _, d in values)


@settings(max_examples=400, deadline=None)
@given(rows=st.lists(_json_object(0), min_size=1, max_size=8), pad=st.booleans(), bom=st.booleans())
def test_keys_named_twice_are_found_in_small_and_large_bodies_alike(rows, pad, bom):
    """Large bodies are parsed plainly and counted, small ones checked in the parser: both refuse exactly the
    records with an object (at any depth) naming a key twice, and take the others as Python's json reads them."""
    if pad:  # a record of padding makes the body large
        rows = [*rows, ('{"pad": "' + "x" * PAIRS_BYTES + '"}', False)]
    text = "[" + ",\n".join(t for t, _ in rows) + "]"
    body = (codecs.BOM_UTF8 if bom else b"") + text.encode()
    twice = [n for n, (_, d) in enumerate(rows, start=1) if d]
    try:
        taken = json_array(body)
    except Rejected as exc:
        assert exc.status == 400 and "name a key twice" in exc.message and twice, exc.message
        assert sorted({p.row for p in exc.problems}) == twice
        assert all("send each key once" in p.message for p in exc.problems)
    else:
        assert not twice and taken == json.loads(text)
