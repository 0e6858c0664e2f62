"""Kafka messages into rows: each value a JSON object, coordinates kept as `kafka_*` columns.

Values are parsed together as NDJSON when they can be (one pass in pyarrow); otherwise one by
one, and a value that is not a JSON object goes to quarantine with its coordinates
(`kafka/<topic>/<partition>`, line = offset). Null values (tombstones of compacted topics)
carry no record and are skipped.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from lakefeed import cdc
from lakefeed.config import KafkaSource
from lakefeed.read import BadRow
from lakefeed.records import from_rows

PREFIX = "kafka_"


def decode(batch: pa.Table, source: KafkaSource, debezium: bool = False
           ) -> tuple[pa.Table | None, list[tuple[str, BadRow]], int]:
    """(rows with `source_file` and the metadata columns, bad messages, tombstones skipped).

    With `debezium`, values are Debezium envelopes (bare, or inside the JSON converter's
    `{"schema", "payload"}`) and become the rows they describe."""
    batch = batch.sort_by([("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")])
    present = batch.filter(pc.is_valid(batch.column("value")))
    tombstones = batch.num_rows - present.num_rows
    if present.num_rows == 0:
        return None, [], tombstones
    values = present.column("value").to_pylist()
    rows, keep, bad = _parse(values, present)
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
            column = pa.array([k.decode("utf-8", "replace") if k is not None else None for k in column.to_pylist()],
                              pa.string())
        elif name == "headers":
            column = pa.array([json.dumps({h["key"]: h["value"].decode("utf-8", "replace") for h in hs})
                               if hs else None for hs in column.to_pylist()], pa.string())
        rows = rows.append_column(f"{PREFIX}{name}", column)
    where = [f"kafka/{t}/{p}/{o}" for t, p, o in zip(kept.column("topic").to_pylist(),
                                                   kept.column("partition").to_pylist(),
                                                   kept.column("offset").to_pylist(), strict=True)]
    return rows.append_column("source_file", pa.array(where, pa.string())), bad, tombstones


def _parse(values: list[bytes], messages: pa.Table) -> tuple[pa.Table | None, np.ndarray, list[tuple[str, BadRow]]]:
    keep = np.ones(len(values), dtype=bool)
    if not any(b"\n" in v or not v.strip() for v in values):
        try:
            table = pajson.read_json(io.BytesIO(b"\n".join(values)))
            if table.num_rows == len(values):
                return table, keep, []
        except pa.ArrowInvalid:
            pass  # some value is not a JSON object: sort them out one by one
    records, bad = [], []
    topics, partitions, offsets = (messages.column(c).to_pylist() for c in ("topic", "partition", "offset"))
    for i, value in enumerate(values):
        try:
            record = json.loads(value)
            reason = None if isinstance(record, dict) else "the message value is not a JSON object"
        except ValueError as exc:
            reason = f"the message value is not JSON: {exc}"
        if reason is not None:
            keep[i] = False
            bad.append((f"kafka/{topics[i]}/{partitions[i]}",
                        BadRow(offsets[i], reason, value.decode("utf-8", "backslashreplace")[:4096])))
        else:
            records.append(record)
    return (from_rows(records) if records else None), keep, bad
