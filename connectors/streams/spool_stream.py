"""A push source's spool as a Spark streaming source (a PySpark Python data source).

Offsets are `{"offset": n}`, the spool frame to read next; Spark keeps them in the query's
checkpoint. A micro-batch is a list of frame descriptors (daemon/inbox/spool.py `Entry`); the batch
reads the records from the spool in the driver. Admission control caps a micro-batch at
`maxRecordsPerTrigger` records (at least one frame).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from lakefeed.connectors.streams.inbox_stream import Slice, SliceReader
from lakefeed.inbox.spool import SPARK_SCHEMA, Entry, SpoolReader

FORMAT = "lakefeed_spool"


class SpoolDataSource(DataSource):
    """Options: `path` (the spool folder), `maxRecordsPerTrigger` (default 1,000,000)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SPARK_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _SpoolStreamReader(Path(self.options["path"]), int(self.options.get("maxRecordsPerTrigger", 1_000_000)))


class _SpoolStreamReader(SliceReader):
    def __init__(self, folder: Path, max_records: int) -> None:
        self._spool = SpoolReader(folder)
        self._max_records = max_records

    def initialOffset(self) -> dict:
        self._spool.refresh()
        return {"offset": self._spool.start()}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self._max_records)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        available = self._spool.refresh()
        if isinstance(limit, ReadAllAvailable):
            return {"offset": available}
        cap = limit.max_rows if isinstance(limit, ReadMaxRows) else self._max_records
        end, records = start["offset"], 0
        for entry in self._spool.entries(start["offset"], available):
            if end > start["offset"] and records + entry.rows > cap:
                break
            end, records = entry.offset + 1, records + entry.rows
        return {"offset": end}

    def reportLatestOffset(self) -> dict:
        return {"offset": self._spool.refresh()}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        self._spool.forget(start["offset"])
        entries = self._spool.entries(start["offset"], end["offset"])
        return [Slice([_row(e) for e in entries])] if entries else []


def _row(entry: Entry) -> tuple:
    """The entry as Spark's row. Spark encodes strings as UTF-8: a key an older intake stored with bytes that are
    not (surrogate-escaped by aiohttp) would fail every replay of the batch, so its bad bytes are replaced."""
    if entry.key is None:
        return entry.as_tuple()
    key = entry.key.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return replace(entry, key=key).as_tuple()
