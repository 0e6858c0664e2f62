"""Delta Lake tables through delta-rs (`deltalake`): the TableSink used where no Delta jars exist.

A delta-spark sink for clusters can implement the same contract (connectors/base.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import (
    ColumnProperties,
    CommitProperties,
    DeltaTable,
    Transaction,
    WriterProperties,
    write_deltalake,
)
from deltalake.exceptions import TableNotFoundError

from lakefeed.connectors.base import TableSink


class DeltaRsSink(TableSink):
    def __init__(self, uri: str | Path, storage_options: dict[str, str] | None = None,
                 unique_columns: tuple[str, ...] = ()) -> None:
        """`unique_columns` hold (nearly) unique values, such as offsets: Parquet dictionaries are skipped for them."""
        self.uri = str(uri)
        self._options = storage_options
        self._table: DeltaTable | None = None
        self._writer = WriterProperties(
            column_properties={c: ColumnProperties(dictionary_enabled=False) for c in unique_columns}
        ) if unique_columns else None

    def _load(self) -> DeltaTable | None:
        if self._table is None:
            try:
                self._table = DeltaTable(self.uri, storage_options=self._options)
            except TableNotFoundError:
                return None
        else:
            self._table.update_incremental()
        return self._table

    def committed_version(self, app_id: str) -> int | None:
        table = self._load()
        return table.transaction_version(app_id) if table is not None else None

    def append(self, data: pa.Table, app_id: str, version: int, metadata: dict[str, str]) -> None:
        write_deltalake(
            self.uri,
            data,
            mode="append",
            schema_mode="merge",
            storage_options=self._options,
            writer_properties=self._writer,
            commit_properties=CommitProperties(
                custom_metadata=metadata, app_transactions=[Transaction(app_id, version)]
            ),
        )

    def schema(self) -> pa.Schema | None:
        table = self._load()
        return pa.schema(table.schema().to_arrow()) if table is not None else None

    def max_of(self, column: str) -> Any:
        table = self._load()
        if table is None:
            return None
        actions = pa.table(table.get_add_actions(flatten=True))
        stat = f"max.{column}"
        if actions.num_rows == 0 or stat not in actions.column_names:
            return None
        return pc.max(actions.column(stat)).as_py()

    def commits_after(self, version: int) -> list[dict[str, Any]]:
        table = self._load()
        if table is None or table.version() <= version:
            return []
        return sorted(table.history(limit=table.version() - version), key=lambda c: c["version"])

    def version(self) -> int | None:
        table = self._load()
        return table.version() if table is not None else None

    def to_arrow(self) -> pa.Table:
        table = self._load()
        if table is None:
            raise TableNotFoundError(f"no Delta table at {self.uri}")
        return pa.table(table.to_pyarrow_table())
