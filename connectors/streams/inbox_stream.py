"""The inbox as a Spark streaming source (a PySpark Python data source).

Offsets are `{"offset": n}`, the count of inbox records consumed; Spark keeps them in the
query's checkpoint, so a restarted query resumes exactly after the last committed batch.
Admission control caps a micro-batch at `maxFilesPerTrigger` files.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from lakefeed.inbox.files import SPARK_SCHEMA, InboxReader

FORMAT = "lakefeed_inbox"


class Slice(InputPartition):
    """One partition holding the rows themselves (descriptors: small, planned in one process)."""

    def __init__(self, rows: list[tuple]) -> None:
        self.rows = rows


class SliceReader(DataSourceStreamReader):
    """A stream reader whose partitions are Slices: read() hands their rows to Spark."""

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        assert isinstance(partition, Slice)
        yield from partition.rows


class InboxDataSource(DataSource):
    """Options: `path` (the inbox folder), `maxFilesPerTrigger` (default 1000)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SPARK_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _InboxStreamReader(Path(self.options["path"]), int(self.options.get("maxFilesPerTrigger", 1000)))


class _InboxStreamReader(SliceReader):
    def __init__(self, folder: Path, max_files: int) -> None:
        self._inbox = InboxReader(folder)
        self._max_files = max_files

    def initialOffset(self) -> dict:
        return {"offset": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self._max_files)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        available = self._inbox.refresh()
        if isinstance(limit, ReadAllAvailable):
            return {"offset": available}
        cap = limit.max_rows if isinstance(limit, ReadMaxRows) else self._max_files
        return {"offset": min(available, start["offset"] + cap)}

    def reportLatestOffset(self) -> dict:
        return {"offset": self._inbox.refresh()}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        records = self._inbox.records(start["offset"], end["offset"])
        return [Slice([r.as_tuple() for r in records])] if records else []
