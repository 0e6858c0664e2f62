"""Kafka messages into rows: each value a JSON object, coordinates kept as `kafka_*` columns.

Values are parsed together as NDJSON when they can be (one pass in pyarrow); otherwise one by
one, and a value that is not a JSON object goes to quarantine with its coordinates
(`kafka/<topic>/<partition>`, line = offset). Null values (tombstones of compacted topics)
carry no record and are skipped.

The NDJSON text is built and checked with Arrow and numpy over the values' buffers, not value by
value in Python: a batch is hundreds of thousands of messages, and per-value Python work was the
largest part of the driver's share (bench/kafka_ingest.py).
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from lakefeed.batch import cdc, json_text
from lakefeed.batch.admit import too_deep
from lakefeed.batch.read import BadRow, from_rows
from lakefeed.config.model import KafkaSource

PREFIX = "kafka_"
_NEWLINE, _BRACE = ord("\n"), ord("{")
_KEYS = ("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")


def columns(source: KafkaSource) -> list[str]:
    """The message columns decode() reads: Spark need not carry the others to the driver."""
    return ["topic", "partition", "offset", "value", *(c for c in source.metadata_columns
                                                       if c not in ("topic", "partition", "offset"))]


def decode(batch: pa.Table, source: KafkaSource, debezium: bool = False
           ) -> tuple[pa.Table | None, list[tuple[str, BadRow]], int]:
    """(rows with `source_file` and the metadata columns, bad messages, tombstones skipped).

    With `debezium`, values are Debezium envelopes (bare, or inside the JSON converter's
    `{"schema", "payload"}`) and become the rows they describe."""
    if not _sorted(batch):
        batch = batch.sort_by(list(_KEYS))
    present = batch.filter(pc.is_valid(batch.column("value"))) if batch.column("value").null_count else batch
    tombstones = batch.num_rows - present.num_rows
    if present.num_rows == 0:
        return None, [], tombstones
    rows, keep, bad = _parse(present)
    if rows is None:
        return None, bad, tombstones
    kept = present.filter(pa.array(keep)) if not keep.all() else present
    if debezium:
        if "payload" in rows.column_names and "op" not in rows.column_names:
            payload = rows.column("payload").combine_chunks()
            rows = pa.Table.from_arrays(payload.flatten(), names=[f.name for f in payload.type])
        rows = cdc.unwrap_debezium(rows)
    for name in source.metadata_columns:
        column = kept.column(name)
        if name == "key":
            column = _text(column)
        elif name == "headers":
            column = pa.array([json.dumps({h["key"]: h["value"].decode("utf-8", "replace") for h in hs})
                               if hs else None for hs in column.to_pylist()], pa.string())
        rows = rows.append_column(f"{PREFIX}{name}", column)
    where = pc.binary_join_element_wise("kafka", kept.column("topic"), kept.column("partition").cast(pa.string()),
                                        kept.column("offset").cast(pa.string()), "/")
    return rows.append_column("source_file", where), bad, tombstones


def _sorted(batch: pa.Table) -> bool:
    """Whether the messages are in (topic, partition, offset) order already, as Spark hands them over."""
    if batch.num_rows < 2:
        return True
    topic = batch.column("topic")
    if pc.count_distinct(topic).as_py() != 1:
        return False
    partition = batch.column("partition").to_numpy()
    offset = batch.column("offset").to_numpy()
    step_p, step_o = np.diff(partition), np.diff(offset)
    return bool(((step_p > 0) | ((step_p == 0) & (step_o > 0))).all())


def _text(column: pa.ChunkedArray) -> pa.ChunkedArray | pa.Array:
    """Binary as UTF-8 text, invalid sequences replaced (as bytes.decode(errors="replace"))."""
    try:
        return column.cast(pa.string())  # checks UTF-8: fails on the first invalid value
    except pa.ArrowInvalid:
        return pa.array([k.decode("utf-8", "replace") if k is not None else None for k in column.to_pylist()],
                        pa.string())


def _ndjson(values: pa.Array) -> pa.Buffer | None:
    """The values joined by newlines (what b"\\n".join(values) gives), or None unless each value is one line
    that starts with "{" (after JSON whitespace). Others are not one JSON object per line, and pyarrow would read them
    wrong: a blank value gives no row (shifting the rest), a `null` a row of nulls, and a `null` in the first
    line crashes it (pyarrow 26: a segmentation fault)."""
    values = values.cast(pa.large_binary())  # int64 offsets, whatever Spark sent
    offsets = np.frombuffer(values.buffers()[1], np.int64)[values.offset:values.offset + len(values) + 1]
    data = np.frombuffer(values.buffers()[2] or b"", np.uint8)
    if (np.diff(offsets) == 0).any() or (data[offsets[0]:offsets[-1]] == _NEWLINE).any():
        return None
    # Nearly every value starts with "{"; the others are looked at one by one (JSON's whitespace is " \t\r\n").
    if any(not values[int(i)].as_py().lstrip(b" \t\r").startswith(b"{")
           for i in np.flatnonzero(data[offsets[:-1]] != _BRACE)):
        return None
    blank, newline = pa.scalar(b"", pa.large_binary()), pa.scalar(b"\n", pa.large_binary())
    lines = pc.binary_join_element_wise(values, blank, newline)  # each value and a newline, one buffer
    ends = np.frombuffer(lines.buffers()[1], np.int64)[[lines.offset, lines.offset + len(lines)]]
    return lines.buffers()[2][int(ends[0]):int(ends[1]) - 1]  # without the last newline


def _parse(messages: pa.Table) -> tuple[pa.Table | None, np.ndarray, list[tuple[str, BadRow]]]:
    values = messages.column("value").combine_chunks()
    keep = np.ones(len(values), dtype=bool)
    if (text := _ndjson(values)) is not None and not too_deep(text):  # pyarrow would crash on deep nesting
        try:
            table = pajson.read_json(pa.BufferReader(text))
            if table.num_rows == len(values):
                return table, keep, []
        except pa.ArrowInvalid:
            pass  # some value is not a JSON object: sort them out one by one
    records, bad = [], []
    topics, partitions, offsets = (messages.column(c).to_pylist() for c in ("topic", "partition", "offset"))
    for i, value in enumerate(values.to_pylist()):
        try:
            record = json_text.loads_line(json_text.utf8(value).decode("utf-8"))
            reason = None if isinstance(record, dict) else "the message value is not a JSON object"
        except json_text.KeyTwice:
            reason = "; ".join(json_text.reason(column, key) for _, column, key in json_text.twice(value))
        except ValueError as exc:
            reason = f"the message value is not JSON: {exc}"
        except RecursionError:
            reason = "the message value nests too deeply to decode"
        if reason is not None:
            keep[i] = False
            bad.append((f"kafka/{topics[i]}/{partitions[i]}",
                        BadRow(offsets[i], reason, value.decode("utf-8", "backslashreplace")[:4096])))
        else:
            records.append(record)
    rows = from_rows(records) if records else None
    if rows is not None and rows.num_rows < len(records):  # only `{}`s: rows without fields, as pyarrow reads them
        rows = pa.table({"_": pa.nulls(len(records))}).drop_columns(["_"])
    return rows, keep, bad
