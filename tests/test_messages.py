"""Kafka messages into rows: the Arrow-compute decode against the simple per-value reference it replaced."""

from __future__ import annotations

import io
import json
import random

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakefeed.batch import cdc, json_text, messages
from lakefeed.batch.read import BadRow, from_rows
from lakefeed.config.model import KafkaSource
from lakefeed.connectors.sources.kafka_records import ARROW_SCHEMA

EVERY_COLUMN = KafkaSource(name="s", bootstrap_servers="b:9092", topics=("t",),
                           metadata_columns=("topic", "partition", "offset", "timestamp", "key", "headers"))


def reference_decode(batch: pa.Table, source: KafkaSource, debezium: bool = False):
    """The decode as it was, value by value in Python lists: what the fast one must give, exactly."""
    batch = batch.sort_by([("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")])
    present = batch.filter(pc.is_valid(batch.column("value")))
    tombstones = batch.num_rows - present.num_rows
    if present.num_rows == 0:
        return None, [], tombstones
    values = present.column("value").to_pylist()
    rows, keep, bad = None, np.ones(len(values), dtype=bool), []
    # The one other change: in bulk only when every value starts with "{" (it was: is not blank). pyarrow read a
    # `null` line as a row of nulls, and crashed on one in the first line.
    if not any(b"\n" in v or not v.lstrip(b" \t\r").startswith(b"{") for v in values):
        try:
            table = pajson.read_json(io.BytesIO(b"\n".join(values)))
            if table.num_rows == len(values):
                rows = table
        except pa.ArrowInvalid:
            pass
    if rows is None:
        records = []
        topics, partitions, offsets = (present.column(c).to_pylist() for c in ("topic", "partition", "offset"))
        for i, value in enumerate(values):
            try:  # JSON is UTF-8 (a BOM dropped), and an object names each key once (daemon/batch/json_text.py)
                record = json.loads(json_text.utf8(value), object_pairs_hook=_each_key_once)
                reason = None if isinstance(record, dict) else "the message value is not a JSON object"
            except _KeyTwice:
                reason = "; ".join(json_text.reason(column, key) for _, column, key in json_text.twice(value))
            except ValueError as exc:
                reason = f"the message value is not JSON: {exc}"
            if reason is not None:
                keep[i] = False
                bad.append((f"kafka/{topics[i]}/{partitions[i]}",
                            BadRow(offsets[i], reason, value.decode("utf-8", "backslashreplace")[:4096])))
            else:
                records.append(record)
        rows = from_rows(records) if records else None
        if rows is None:
            return None, bad, tombstones
        if rows.num_rows < len(records):  # the one change: only `{}`s made no rows, and appending columns failed
            rows = pa.table({"_": pa.nulls(len(records))}).drop_columns(["_"])
    kept = present.filter(pa.array(keep)) if not keep.all() else present
    if debezium:
        if "payload" in rows.column_names and "op" not in rows.column_names:
            payload = rows.column("payload").combine_chunks()
            rows = pa.Table.from_arrays(payload.flatten(), names=[f.name for f in payload.type])
        rows = cdc.unwrap_debezium(rows)
    for name in source.metadata_columns:
        column = kept.column(name)
        if name == "key":
            column = pa.array([k.decode("utf-8", "replace") if k is not None else None for k in column.to_pylist()],
                              pa.string())
        elif name == "headers":
            column = pa.array([json.dumps({h["key"]: h["value"].decode("utf-8", "replace") for h in hs})
                               if hs else None for hs in column.to_pylist()], pa.string())
        rows = rows.append_column(f"{messages.PREFIX}{name}", column)
    where = [f"kafka/{t}/{p}/{o}" for t, p, o in zip(kept.column("topic").to_pylist(),
                                                   kept.column("partition").to_pylist(),
                                                   kept.column("offset").to_pylist(), strict=True)]
    return rows.append_column("source_file", pa.array(where, pa.string())), bad, tombstones


class _KeyTwice(Exception):
    pass


def _each_key_once(pairs: list[tuple[str, object]]) -> dict:
    if len({k for k, _ in pairs}) < len(pairs):
        raise _KeyTwice
    return dict(pairs)


def batch_of(values: list[bytes | None], keys: list[bytes | None] | None = None, topic: str = "t",
             partitions: int = 1, headers: list | None = None) -> pa.Table:
    """Messages round-robin over `partitions`, in (partition, offset) order, offsets from 100."""
    n = len(values)
    return pa.Table.from_pydict({
        "topic": [topic] * n, "partition": [i % partitions for i in range(n)],
        "offset": [100 + i // partitions for i in range(n)], "timestamp": [1_700_000_000_000_000] * n,
        "key": keys or [None] * n, "value": values, "headers": headers or [None] * n}, schema=ARROW_SCHEMA)


def same(got, want) -> None:
    (rows, bad, tombstones), (want_rows, want_bad, want_tombstones) = got, want
    assert (bad, tombstones) == (want_bad, want_tombstones)
    if want_rows is None:
        assert rows is None
    else:
        assert rows is not None and rows.schema == want_rows.schema
        # repr: NaN (which json.loads takes) is not equal to itself.
        assert rows.equals(want_rows) or repr(rows.to_pylist()) == repr(want_rows.to_pylist()), \
            (rows.to_pylist()[:5], want_rows.to_pylist()[:5])


def decode_both(batch: pa.Table, source: KafkaSource = EVERY_COLUMN, debezium: bool = False) -> tuple:
    got = messages.decode(batch, source, debezium)
    same(got, reference_decode(batch, source, debezium))
    return got


# -- values of every kind a topic may hold ------------------------------------------------------------------
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.text(max_size=8),
                    st.floats(allow_nan=False, allow_infinity=False, width=32))
objects = st.dictionaries(st.sampled_from(["id", "name", "v", "nested", "ts"]),
                          st.one_of(scalars, st.dictionaries(st.sampled_from(["a", "b"]), scalars, max_size=2),
                                    st.lists(st.integers(0, 9), max_size=3)), max_size=4)
rendered = st.one_of(
    objects.map(lambda o: json.dumps(o, separators=(",", ":")).encode()),
    objects.map(lambda o: json.dumps(o, indent=1).encode()),  # newlines inside one value
    objects.map(lambda o: b" " + json.dumps(o).encode()),     # leading whitespace, still one object
    objects.map(lambda o: json.dumps(o).encode() + b"\r"),
)
odd = st.sampled_from([b"", b" ", b"\t\r ", b"\n", b"\x0b\x0c", b"[1, 2]", b"42", b'"text"', b"null",
                       b'{"a":1}{"b":2}', b'{"a":1} {"b":2}', b"{", b"not json", b"\xff\xfe{}", b'{"a":"\xe9"}',
                       b'{"id":1,"id":2}', b'{"v":{"a":1,"a":2}}', b'\xef\xbb\xbf{"id": 5}'])
value = st.one_of(rendered, rendered, rendered, odd, st.binary(max_size=12), st.none())
header = st.one_of(st.none(), st.lists(st.tuples(st.sampled_from(["h", "trace"]), st.binary(max_size=4)),
                                       max_size=2).map(lambda hs: [{"key": k, "value": v} for k, v in hs] or None))


@given(values=st.lists(value, max_size=40), keys=st.data(), partitions=st.integers(1, 3), layout=st.randoms())
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_fast_decode_is_the_per_value_reference(values, keys, partitions, layout: random.Random):
    n = len(values)
    batch = batch_of(values, keys.draw(st.lists(st.one_of(st.none(), st.binary(max_size=6)), min_size=n, max_size=n)),
                     partitions=partitions,
                     headers=keys.draw(st.lists(header, min_size=n, max_size=n)))
    # As Spark may hand it over: in chunks, sliced out of larger buffers, in any order.
    if n > 2 and layout.random() < 0.5:
        cut = layout.randrange(1, n)
        batch = pa.Table.from_batches(batch.slice(0, cut).to_batches() + batch.slice(cut).to_batches())
    if layout.random() < 0.3:
        padded = pa.concat_tables([batch_of([b"{}"]), batch, batch_of([b"{}"])]).combine_chunks()
        batch = padded.slice(1, n)
    if layout.random() < 0.3:
        batch = batch.take(pa.array(layout.sample(range(n), n), pa.int64()))
    decode_both(batch)


def test_values_that_are_not_one_line_of_json_each_are_sorted_out_one_by_one():
    values = [b'{"id": 1}', b"", b'{"id":\n 2}', b"   ", b'{"a":1}{"b":2}', b"[1]", None, b'{"id": 3}']
    rows, bad, tombstones = decode_both(batch_of(values, partitions=2))
    assert tombstones == 1
    assert rows.column("id").to_pylist() == [1, 2, 3]
    assert rows.column("source_file").to_pylist() == ["kafka/t/0/100", "kafka/t/0/101", "kafka/t/1/103"]
    # Quarantine coordinates: kafka/<topic>/<partition>, line = offset.
    assert [(where, b.line, b.raw) for where, b in bad] == [
        ("kafka/t/0", 102, '{"a":1}{"b":2}'), ("kafka/t/1", 100, ""), ("kafka/t/1", 101, "   "),
        ("kafka/t/1", 102, "[1]")]


def test_a_value_naming_a_key_twice_is_quarantined_and_a_byte_order_mark_dropped():
    """As for pushes and landed files (daemon/batch/json_text.py): either value of a key named twice would be lost."""
    values = [b'{"id": 1, "id": 2}', b'\xef\xbb\xbf{"id": 3}', b'{"id": 4, "v": {"a": 1, "a": 2}}']
    rows, bad, _ = decode_both(batch_of(values))
    assert rows.column("id").to_pylist() == [3]
    assert [(b.line, b.raw, b.reason) for _, b in bad] == [
        (100, '{"id": 1, "id": 2}', "the record names 'id' twice: send each key once (only one of the values could "
                                    "be stored)"),
        (102, '{"id": 4, "v": {"a": 1, "a": 2}}', "column 'v' holds an object naming 'a' twice: send each key once "
                                                  "(only one of the values could be stored)")]


@pytest.mark.parametrize("values", [[b"null"], [b" null", b'{"id": 1}'], [b'{"id": 1}', b"null"], [b"{}", b"\tnull"]])
def test_a_json_null_value_is_quarantined_not_a_row_of_nulls(values):
    # pyarrow's NDJSON reader takes a `null` line for a row of nulls, and crashes (SIGSEGV) on one in the first line.
    rows, bad, tombstones = decode_both(batch_of(values))
    assert [(b.raw.strip(), b.reason) for _, b in bad] == [("null", "the message value is not a JSON object")]
    assert tombstones == 0 and (rows.num_rows if rows is not None else 0) == len(values) - 1


def test_only_empty_objects_still_give_their_rows_beside_a_bad_value():
    rows, bad, _ = decode_both(batch_of([b"{}", b"x", b"{}"]))
    assert rows.num_rows == 2 and rows.column("kafka_offset").to_pylist() == [100, 102] and len(bad) == 1


def test_a_blank_value_and_two_objects_on_one_line_do_not_shift_rows():
    # Read in bulk, "" gives no row and the other two: the count would match and every row would be wrong.
    rows, bad, _ = decode_both(batch_of([b'{"id": 1}{"id": 2}', b"", b'{"id": 3}']))
    assert rows.column("id").to_pylist() == [3]
    assert [b.line for _, b in bad] == [100, 101]


def test_a_large_batch_takes_the_bulk_path_and_keeps_every_coordinate():
    values = [json.dumps({"id": i, "v": "x" * (i % 7)}).encode() for i in range(50_000)]
    keys = [None if i % 3 else f"k{i}".encode() for i in range(50_000)]
    rows, bad, _ = decode_both(batch_of(values, keys, partitions=4).slice(5))
    assert bad == [] and rows.num_rows == 49_995
    assert rows.column("kafka_key").null_count == 49_995 - len([k for k in keys[5:] if k])
    assert rows.column("source_file")[0].as_py() == "kafka/t/0/102"  # (partition, offset) order


def test_keys_and_headers_that_are_not_utf8_are_replaced_not_dropped():
    rows, _, _ = decode_both(batch_of([b'{"id": 1}', b'{"id": 2}'], keys=[b"ok", b"\xff\xfe"],
                                      headers=[[{"key": "h", "value": b"\xff"}], None]))
    assert rows.column("kafka_key").to_pylist() == ["ok", "\ufffd\ufffd"]
    assert rows.column("kafka_headers").to_pylist() == ['{"h": "\\ufffd"}', None]


@pytest.mark.parametrize("wrapped", [False, True])
def test_debezium_envelopes_decode_as_the_reference(wrapped):
    def envelope(op, before, after, ts):
        change = {"before": before, "after": after, "op": op, "ts_ms": ts}
        return json.dumps({"schema": {"type": "struct"}, "payload": change} if wrapped else change).encode()

    values = [envelope("c", None, {"id": 1, "name": "ada"}, 1000), envelope("u", {"id": 1, "name": "ada"},
                                                                            {"id": 1, "name": "ada l."}, 1001),
              envelope("d", {"id": 2, "name": "bob"}, None, 1002), b"not json", None]
    rows, bad, tombstones = decode_both(batch_of(values), debezium=True)
    assert rows.column("id").to_pylist() == [1, 1, 2] and rows.column("op").to_pylist() == ["c", "u", "d"]
    assert len(bad) == 1 and tombstones == 1


@given(st.lists(st.sampled_from(["topic", "partition", "offset", "timestamp", "key", "headers"]), unique=True))
def test_decode_needs_only_the_columns_it_names(kept):
    """The runner has Spark bring only `columns(source)` to the driver: decode gives the same from those."""
    source = KafkaSource(name="s", bootstrap_servers="b:9092", topics=("t",), metadata_columns=tuple(kept))
    batch = batch_of([b'{"a": 1}', b"not json", None, b'{"a": 2}'], keys=[b"k", None, b"x", b"y"], partitions=2,
                     headers=[[{"key": "h", "value": b"v"}], None, None, None])
    same(messages.decode(batch.select(messages.columns(source)), source), messages.decode(batch, source))
