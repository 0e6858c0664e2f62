"""The contract of a table sink.

A TableSink is a table whose every commit carries an application transaction (app_id, version):
`committed_version` tells whether a batch is in already. The caller decides from it whether a
write is due (daemon/pipeline/commit.py, once per table and batch); a sink writes what it is given.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import pyarrow as pa

from lakefeed.batch.cdc import MergePlan
from lakefeed.batch.checks import Checks
from lakefeed.connectors.sinks.data_files import DataFile


class TableSink(ABC):
    @abstractmethod
    def committed_version(self, app_id: str) -> int | None:
        """The last transaction version committed by `app_id`, or None."""

    @abstractmethod
    def append(self, data: pa.Table, app_id: str, version: int, metadata: dict[str, str]) -> None:
        """Append `data` (possibly empty) in one commit recording (app_id, version) and `metadata`."""

    @abstractmethod
    def commit_files(self, files: list[DataFile], schema: pa.Schema, app_id: str, version: int,
                     metadata: dict[str, str], checked: Checks = ()) -> None:
        """Commit data files written by tasks (connectors/sinks/data_files.py) in one commit recording
        (app_id, version) and `metadata`; the table is made, or gains the columns of `schema` it lacks, first."""

    @abstractmethod
    def check_files(self, files: list[DataFile], checked: Checks = ()) -> None:
        """Raise ConstraintError when the table's constraints forbid adding `files`, whose rows the tasks checked
        against the CHECK constraints `checked` (connectors/sinks/constraints.py). `commit_files` checks too: a
        caller checks first to refuse a batch before another table commits it."""

    @abstractmethod
    def checks(self, schema: pa.Schema | None, merged: bool) -> Checks:
        """The table's CHECK constraints, for the tasks to evaluate on rows of `schema` (none while there is no
        table); raises ConstraintError for one lakefeed cannot evaluate, unless the rows are `merged` (keyed),
        whose MERGE enforces it (connectors/sinks/constraints.py)."""

    @abstractmethod
    def compact(self, target_bytes: int) -> tuple[int, int]:
        """Rewrite the table's small files into files of about `target_bytes` in one commit that changes no row
        (none when there is nothing to rewrite); the numbers of files it removed and added."""

    @abstractmethod
    def vacuum(self, retain_hours: int) -> None:
        """Delete the files under the table's folder that its current version does not use and that are older
        than `retain_hours` (hidden and `_`-prefixed paths, its log among them, stay)."""

    @abstractmethod
    def paths(self) -> set[str]:
        """The relative paths (URI-encoded, as in the log) of the files the table holds."""

    @abstractmethod
    def schema(self) -> pa.Schema | None:
        """The table's schema, or None while the table does not exist."""

    @abstractmethod
    def max_of(self, column: str) -> Any:
        """The largest value of a column, from file statistics; None for an empty table."""

    @abstractmethod
    def commits_after(self, version: int) -> list[dict[str, Any]]:
        """Commit infos (with their custom metadata) of versions greater than `version`, oldest first."""

    @abstractmethod
    def version(self) -> int | None: ...

    @abstractmethod
    def merge(self, source: pa.Table, plan: MergePlan, app_id: str, version: int, metadata: dict[str, str]) -> int:
        """Apply a reduced batch (one row per key, with `__kind`) in one commit; return the table version.

        The commit records (app_id, version) and `metadata` even when the merge changes nothing.
        """

    @abstractmethod
    def apply_history(self, edits: pa.Table, keys: tuple[str, ...], app_id: str, version: int) -> None:
        """SCD type 2 in one commit: `__h` close rows end the key's current version at `__at`; open rows
        add a version valid from `__at`. Columns: the data, valid_from, valid_to, is_current."""

    @abstractmethod
    def lookup(self, keys: pa.Table, columns: tuple[str, ...] = ()) -> pa.Table:
        """The rows of `keys` that the table holds, with the table's `columns` beside the key columns."""

    @abstractmethod
    def may_hold_newer(self, rows: pa.Table, columns: tuple[str, ...]) -> np.ndarray:
        """For each row, whether the table may hold a row whose `columns` compare (lexicographically) above its
        own: False only where the table can tell it holds none (by its files' statistics, say)."""

    @abstractmethod
    def changes(self, table_version: int) -> pa.Table:
        """What one commit changed, as change data rows with `_change_type`
        (insert, delete, update_preimage, update_postimage)."""

    @abstractmethod
    def latest_metadata(self, key: str, app_id: str, before: int) -> str | None:
        """The newest commit metadata value of `key`, ignoring commits of `app_id` for versions >= `before`."""

    @abstractmethod
    def version_of(self, app_id: str, version: int) -> int | None:
        """The table version whose commit recorded (app_id, version), if it is still in the log."""
