"""The Open Data Fabric changelog rows and the quarantine rows of a batch.

Changelog columns follow ODF: `offset` (dense, monotonic per dataset), `op` (0 append,
1 retract, 2 correct-from, 3 correct-to), `system_time`, `event_time`, then the data, then
provenance (`source_file`, `batch_id`). A data column whose name is one of these is
stored as `data_<name>` in the changelog (a Debezium `op` column becomes `data_op`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import numpy as np
import pyarrow as pa

from lakefeed.batch.event_time import EVENT_TIME
from lakefeed.batch.read import BadRow

OP_APPEND = 0
SYSTEM_COLUMNS = ("offset", "op", "system_time", "event_time", "source_file", "batch_id")
_TS = pa.timestamp("us", tz="UTC")
QUARANTINE_SCHEMA = pa.schema([
    ("entity", pa.string()), ("source_file", pa.string()), ("line", pa.int64()), ("reason", pa.string()),
    ("raw", pa.string()), ("batch_id", pa.int64()), ("system_time", _TS),
])
_BAD_SCHEMA = pa.schema([QUARANTINE_SCHEMA.field(n) for n in ("source_file", "line", "reason", "raw")])


def build_changelog(data: pa.Table, first_offset: int, batch_id: int, system_time: datetime) -> pa.Table:
    """Appends (op 0) for every row; `data` carries `source_file` and `__event_time`."""
    n = data.num_rows
    micros = int(system_time.timestamp() * 1_000_000)
    front = pa.table({
        "offset": pa.array(np.arange(first_offset, first_offset + n, dtype=np.int64)),
        "op": pa.array(np.full(n, OP_APPEND, dtype=np.int8)),
        "system_time": pa.array(np.full(n, micros, dtype="datetime64[us]")).cast(_TS),
        "event_time": data.column(EVENT_TIME),
    })
    return assemble(front, data_columns(data), data.column("source_file"), batch_id)


def data_columns(data: pa.Table) -> pa.Table:
    """The rows without lakefeed's working columns (provenance, change kind, order, event time)."""
    return data.drop_columns([c for c in data.column_names if c == "source_file" or c.startswith("__")])


def assemble(front: pa.Table, data: pa.Table, source_file: pa.ChunkedArray | pa.Array, batch_id: int) -> pa.Table:
    """System columns, then the data (names clear of the system ones), then provenance."""
    out = front
    for name in data.column_names:
        out = out.append_column(f"data_{name}" if name in SYSTEM_COLUMNS else name, data.column(name))
    out = out.append_column("source_file", source_file)
    return out.append_column("batch_id", pa.array(np.full(front.num_rows, batch_id, dtype=np.int64)))


def quarantine_table(entity: str, bad: Sequence[tuple[str, BadRow]], batch_id: int, system_time: datetime) -> pa.Table:
    """The quarantine's rows of a batch's bad rows."""
    n = len(bad)
    rows = pa.table({"source_file": [path for path, _ in bad], "line": [row.line for _, row in bad],
                     "reason": [row.reason for _, row in bad], "raw": [row.raw for _, row in bad]},
                    schema=_BAD_SCHEMA)
    return pa.table([pa.array([entity] * n, pa.string()), *rows.columns, pa.array(np.full(n, batch_id, np.int64)),
                     pa.array([system_time] * n, QUARANTINE_SCHEMA.field("system_time").type)],
                    schema=QUARANTINE_SCHEMA)
