"""A file's rows beside what lakefeed knows of them from elsewhere: the partition arguments of its path and the
file it came from (`source_file`)."""

from __future__ import annotations

import json

import pyarrow as pa

from lakefeed.batch.discovery import Partition


def with_arguments(table: pa.Table, partition: Partition, location: str) -> pa.Table:
    for name, values in partition.arguments.items():
        value = values[0] if len(values) == 1 else json.dumps(values)
        table = table.append_column(name, pa.repeat(pa.scalar(value, pa.string()), table.num_rows))
    return table.append_column("source_file", pa.repeat(pa.scalar(location, pa.string()), table.num_rows))


def file_schema(schema: pa.Schema | None, arguments: dict[str, list[str]]) -> pa.Schema | None:
    """The file's part of a schema: partition arguments come from the path, provenance from lakefeed."""
    if schema is None:
        return None
    return pa.schema([f for f in schema if f.name not in arguments and f.name != "source_file"
                      and not f.name.startswith("__")])
