"""Delta Lake tables through delta-rs (`deltalake`): the default writer (`writer: delta-rs`), and the reader of
every table, whichever writer wrote it (connectors/sinks/delta_spark.py writes through delta-spark).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import numpy as np
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
from deltalake import Field as DeltaField
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, create_table_with_add_actions

from lakefeed import log
from lakefeed.batch.cdc import KIND, MergePlan
from lakefeed.batch.checks import Checks
from lakefeed.batch.schema import delta_compatible
from lakefeed.connectors.sinks import constraints
from lakefeed.connectors.sinks.base import TableSink
from lakefeed.connectors.sinks.data_files import DataFile
from lakefeed.connectors.sinks.delta_log import commit_metadata
from lakefeed.connectors.sinks.merge_sql import (
    DATAFUSION,
    changed_clause,
    history_close,
    history_match,
    history_open,
    inserted_kinds,
    kind_in,
    newer_clause,
    within,
)
from lakefeed.connectors.sinks.pruning import may_hold, upper_bound

_log = log.get(__name__)
CDF = "delta.enableChangeDataFeed"
# delta-rs keeps each commit that an incremental update (or a write through the table object) brings in as a piece
# of the table's state of its own, never merged: a table object kept for the daemon's life grew without end, and
# every write through it got slower. A load afresh merges them only from a checkpoint: the commits after it are
# replayed into pieces again. So once the object is this many versions past its load, the writer checkpoints the
# table's version (delta-rs writes one itself only every 100 commits) and loads the table afresh from it.
# bench/delta_state.py, 40 tables x 200 commits: one object kept per table 140 s, +161 MiB (+80 in the last half);
# these writers 63 s, +26 MiB (+0.3 in the last half).
RELOAD_AFTER = 20
TableOrBatch = TypeVar("TableOrBatch", pa.Table, pa.RecordBatch)


def contiguous(data: pa.Table) -> pa.Table:
    """A table with a nested column (struct, list, map) in one chunk per column. delta-rs (arrow-rs) panics on
    some such tables made of several chunks, and the panic aborts the whole process (seen with JSON pushes of
    which only some records carry a nested field; combining the nested column alone did not help). Tables of
    flat columns, the usual case, are left as they are: combining them would copy every batch's data."""
    if data.num_columns and any(pa.types.is_nested(f.type) for f in data.schema) and \
            any(c.num_chunks > 1 for c in data.columns):
        return data.combine_chunks()
    return data


class DeltaRsSink(TableSink):
    def __init__(self, uri: str | Path, storage_options: dict[str, str] | None = None,
                 unique_columns: tuple[str, ...] = (), partition_by: tuple[str, ...] = (),
                 file_bytes: int | None = None) -> None:
        """`unique_columns` hold (nearly) unique values, such as offsets: Parquet dictionaries are skipped for them;
        `partition_by`: the columns a new table is partitioned by (Hive-style folders); `file_bytes`: the size at
        which an append starts a new file (delta-rs's default, ~100 MB, when None)."""
        self.uri = str(uri)
        self._file_bytes = file_bytes
        self._partition_by = list(partition_by) or None
        self._options = storage_options
        self._table: DeltaTable | None = None
        self._loaded = -1  # the version `_table` was loaded at
        # app id -> (a table version, the app's transaction version there). delta-rs reads an app's transaction by
        # replaying every commit since the last checkpoint (up to 100 GETs on S3) at each call. This sink records
        # its own commits as they succeed; any other commit (another writer, the delta-spark subclass) moves the
        # table past the recorded version, and the next check reads the log again.
        self._txns: dict[str, tuple[int, int | None]] = {}
        self._writer = WriterProperties(
            column_properties={c: ColumnProperties(dictionary_enabled=False) for c in unique_columns}
        ) if unique_columns else None

    def _load(self) -> DeltaTable | None:
        """The table at its latest version; None while there is none."""
        if self._table is not None and self._table.version() - self._loaded >= RELOAD_AFTER:
            self._checkpoint(self._table)  # at the object's version: the load reads what came after it
            self._table = None
        if self._table is None:
            try:
                self._table = DeltaTable(self.uri, storage_options=self._options)
            except TableNotFoundError:
                return None
            self._loaded = self._table.version()
        else:
            self._table.update_incremental()
        return self._table

    def _checkpoint(self, table: DeltaTable) -> None:
        """A checkpoint of the table's version, for the next load to start from. Only that: one that cannot be
        written (a store's hiccup, a table feature delta-rs cannot write) leaves the load to replay more commits."""
        try:
            table.create_checkpoint()
        except (DeltaError, OSError) as e:
            _log.warning("delta.checkpoint_failed", table=self.uri, version=table.version(), error=str(e))

    def committed_version(self, app_id: str) -> int | None:
        table = self._load()
        if table is None:
            return None
        known = self._txns.get(app_id)
        if known is not None and known[0] == table.version():
            return known[1]
        version = table.transaction_version(app_id)
        self._txns[app_id] = (table.version(), version)
        return version

    def _committed(self, app_id: str, table_version: int, version: int) -> None:
        """The app's commit of `version` became `table_version`. A later table version found at the next check
        means someone else committed too (or the commit was retried later): the log is read again then."""
        self._txns[app_id] = (table_version, version)

    def append(self, data: pa.Table, app_id: str, version: int, metadata: dict[str, str]) -> None:
        target = self._target()
        write_deltalake(
            target,
            contiguous(data),
            mode="append",
            partition_by=self._partition_by if isinstance(target, str) else None,
            schema_mode="merge",
            storage_options=self._options,
            writer_properties=self._writer,
            target_file_size=self._file_bytes,
            commit_properties=CommitProperties(
                custom_metadata=metadata, app_transactions=[Transaction(app_id, version)]
            ),
        )
        if isinstance(target, DeltaTable):  # write_deltalake brings the table it wrote to up to its commit
            self._committed(app_id, target.version(), version)

    def commit_files(self, files: list[DataFile], schema: pa.Schema, app_id: str, version: int,
                     metadata: dict[str, str], checked: Checks = ()) -> None:
        actions = [AddAction(f.path, f.size, f.partition_values, f.modification_time, True, f.stats) for f in files]
        properties = CommitProperties(custom_metadata=metadata, app_transactions=[Transaction(app_id, version)])
        table = self._load()
        if table is None:
            create_table_with_add_actions(self.uri, DeltaSchema.from_arrow(delta_compatible(schema)), actions,
                                          mode="append", partition_by=self._partition_by,
                                          storage_options=self._options, commit_properties=properties)
            return
        current = pa.schema(table.schema().to_arrow())
        constraints.check(self.uri, table.metadata().configuration, current, files, checked)
        new = [f for f in delta_compatible(schema) if f.name not in current.names]
        if new:  # a commit of its own, before the files': a replay finds the columns there and goes on
            table.alter.add_columns([DeltaField.from_arrow(f) for f in new])
            current = pa.schema([*current, *new])
        base = table.version()
        table.create_write_transaction(actions, "append", current, partition_by=self._partition_by,
                                       commit_properties=properties)
        self._committed(app_id, base + 1, version)  # the table object stays at `base`: the next load finds it

    def check_files(self, files: list[DataFile], checked: Checks = ()) -> None:
        table = self._load()
        if table is not None:
            constraints.check(self.uri, table.metadata().configuration, pa.schema(table.schema().to_arrow()), files,
                              checked)

    def checks(self, schema: pa.Schema | None, merged: bool) -> Checks:
        table = self._load() if schema is not None else None
        if table is None or schema is None:
            return ()
        return constraints.evaluable(self.uri, table.metadata().configuration, schema, merged)

    def compact(self, target_bytes: int) -> tuple[int, int]:
        table = self._load()
        if table is None:
            return 0, 0
        done = table.optimize.compact(target_size=target_bytes, writer_properties=self._writer)
        return int(done["numFilesRemoved"]), int(done["numFilesAdded"])

    def vacuum(self, retain_hours: int) -> None:
        table = self._load()
        if table is None:
            return
        # Full: every file on storage against the log, not only the removals the table's state still lists, which
        # it forgets after delta.deletedFileRetentionDuration (a week), about when a week-old file would be due.
        # What it returns is no count: it names again, until they expire, removals an earlier vacuum deleted.
        table.vacuum(retention_hours=retain_hours, dry_run=False, enforce_retention_duration=False, full=True)

    def paths(self) -> set[str]:
        table = self._load()
        if table is None:
            return set()
        return set(pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist())

    def record(self, data: pa.Table, metadata: dict[str, str]) -> None:
        """A commit that belongs to no batch (e.g. an operator moving the watermark)."""
        write_deltalake(self._target(), data, mode="append", storage_options=self._options,
                        commit_properties=CommitProperties(custom_metadata=metadata))

    def _target(self) -> DeltaTable | str:
        """The loaded table (brought up to date), else the URI that creates it. Given the URI of an existing
        table, write_deltalake loads it afresh, replaying the log since the last checkpoint: each append of a
        batch got slower until the next checkpoint (on S3, 73 ms at version 1-10, 613 ms at 91-100)."""
        return self._load() or self.uri

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
        return sorted(map(commit_metadata, table.history(limit=table.version() - version)), key=lambda c: c["version"])

    def version(self) -> int | None:
        table = self._load()
        return table.version() if table is not None else None

    def merge(self, source: pa.Table, plan: MergePlan, app_id: str, version: int, metadata: dict[str, str]) -> int:
        source = contiguous(source)
        columns = [c for c in source.column_names if c != KIND]
        table = self._load()
        if table is None:
            write_deltalake(self.uri, source.select(columns).schema.empty_table(), mode="append",
                            partition_by=self._partition_by, storage_options=self._options,
                            configuration={CDF: "true"})
            table = self._load()
        elif table.metadata().configuration.get(CDF) != "true":
            table.alter.set_table_properties({CDF: "true"})
        assert table is not None
        before = table.version()
        values = DATAFUSION.assign(columns)
        merger = table.merge(source, predicate=DATAFUSION.same_keys(plan.keys), source_alias="s", target_alias="t",
                             merge_schema=True, writer_properties=self._writer,
                             commit_properties=CommitProperties(custom_metadata=metadata,
                                                                app_transactions=[Transaction(app_id, version)]))
        existing = set(pa.schema(table.schema().to_arrow()).names)
        changed = changed_clause(tuple(c for c in plan.compare if c in columns and c in existing),
                                 tuple(c for c in plan.compare if c in columns and c not in existing))
        if plan.snapshot:
            merger = (merger.when_matched_update(values, predicate=changed)
                      .when_not_matched_insert(values)
                      .when_not_matched_by_source_delete(predicate=within(plan.scope)))
        else:
            newer = newer_clause(plan.sequence)
            merger = (merger.when_matched_delete(predicate=f"{kind_in(('delete',))} AND ({newer})")
                      .when_matched_update(values, predicate=f"{kind_in(('upsert', 'update'))} AND ({newer}) "
                                                             f"AND ({changed})")
                      .when_not_matched_insert(values, predicate=kind_in(inserted_kinds(plan))))
        merger.execute()
        if table.version() != before:  # the merge committed (delta-rs brings the table it merged into up to it)
            self._committed(app_id, table.version(), version)
        table = self._load()
        assert table is not None
        if table.version() == before:  # nothing changed: record the batch all the same
            self.append(pa.schema(table.schema().to_arrow()).empty_table(), app_id, version, metadata)
            table = self._load()
            assert table is not None
        return table.version()

    def apply_history(self, edits: pa.Table, keys: tuple[str, ...], app_id: str, version: int) -> None:
        source = history_source(edits)
        columns = [c for c in source.column_names if c not in ("__h", "__at")]
        if self._load() is None:
            write_deltalake(self.uri, source.select(columns).schema.empty_table(), mode="append",
                            storage_options=self._options)
        table = self._load()
        assert table is not None
        before = table.version()
        (table.merge(source, predicate=history_match(keys), source_alias="s", target_alias="t", merge_schema=True,
                     writer_properties=self._writer,
                     commit_properties=CommitProperties(app_transactions=[Transaction(app_id, version)]))
         .when_matched_update(history_close())
         .when_not_matched_insert(DATAFUSION.assign(columns), predicate=history_open())
         .execute())
        if table.version() != before:
            self._committed(app_id, table.version(), version)

    def lookup(self, keys: pa.Table, columns: tuple[str, ...] = ()) -> pa.Table:
        table = self._load()
        names = keys.column_names
        if table is None or keys.num_rows == 0:
            return keys.slice(0, 0)  # nothing held (callers check num_rows before reading `columns`)
        wanted = _plain(keys).group_by(names).aggregate([])
        first = wanted.column(names[0]).combine_chunks()
        # Rows are matched here, not by a dataset filter: Arrow compares a filter's values with the files'
        # statistics, which delta-rs gives as string_view for string columns, and has no kernel for that
        # (every lookup of a string key failed). The join makes composite keys exact.
        dataset = may_hold(table, names[0], first)
        schema = delta_compatible(pa.schema([dataset.schema.field(c) for c in [*names, *columns]]))
        found = [batch.filter(pc.is_in(batch.column(names[0]), value_set=first))
                 for batch in map(_plain, dataset.to_batches(columns=[*names, *columns]))]
        return wanted.join(pa.Table.from_batches(found, schema), keys=names, join_type="inner")

    def may_hold_newer(self, rows: pa.Table, columns: tuple[str, ...]) -> np.ndarray:
        """Whether the table may hold a row whose `columns` compare (lexicographically) above each row's: below the
        largest values its files' statistics record, widened where writers record them inexactly (pruning.py).
        True wherever the statistics cannot tell (a column without them, a file without them, a type not widened);
        False for a table without rows."""
        table = self._load()
        if table is None or rows.num_rows == 0:
            return np.zeros(rows.num_rows, dtype=bool)
        actions = pa.table(table.get_add_actions(flatten=True))
        if actions.num_rows == 0:
            return np.zeros(rows.num_rows, dtype=bool)
        below, equal = np.zeros(rows.num_rows, dtype=bool), np.ones(rows.num_rows, dtype=bool)
        for column in columns:  # (max of each column) is at or above every row's values, lexicographically
            bound = upper_bound(actions, column, rows.schema.field(column).type)
            if bound is None:
                return np.ones(rows.num_rows, dtype=bool)
            values = rows.column(column)
            below |= equal & pc.fill_null(pc.less(values, bound), True).to_numpy(zero_copy_only=False)
            equal &= pc.fill_null(pc.equal(values, bound), False).to_numpy(zero_copy_only=False)
        return below

    def changes(self, table_version: int) -> pa.Table:
        table = self._load()
        assert table is not None
        changes = pa.table(table.load_cdf(starting_version=table_version, ending_version=table_version).read_all())
        return changes.cast(delta_compatible(changes.schema))

    def latest_metadata(self, key: str, app_id: str, before: int) -> str | None:
        table = self._load()
        if table is None:
            return None
        for depth in (8, 1000):  # the newest commits nearly always carry it: read few first
            for commit in map(commit_metadata, table.history(limit=depth)):
                if commit.get("lakefeed.app_id") == app_id and int(commit.get("lakefeed.batch_id", -1)) >= before:
                    continue
                if key in commit:
                    return str(commit[key])
        return None

    def version_of(self, app_id: str, version: int) -> int | None:
        table = self._load()
        if table is None:
            return None
        for commit in map(commit_metadata, table.history(limit=1000)):
            if commit.get("lakefeed.app_id") == app_id and commit.get("lakefeed.batch_id") == str(version):
                return int(commit["version"])
        return None

    def to_arrow(self) -> pa.Table:
        table = self._load()
        if table is None:
            raise TableNotFoundError(f"no Delta table at {self.uri}")
        return pa.table(table.to_pyarrow_table())


def history_source(edits: pa.Table) -> pa.Table:
    """SCD2 edits (`__h`, `__at` beside the data) with the history table's columns: each row a version valid from
    `__at`, open and current."""
    return edits.append_column("valid_from", edits.column("__at")).append_column(
        "valid_to", pa.nulls(edits.num_rows, edits.schema.field("__at").type)).append_column(
        "is_current", pa.array(np.ones(edits.num_rows, dtype=bool)))


def _plain(data: TableOrBatch) -> TableOrBatch:
    """Delta's own types (string for large_string and string_view, …), so that values compare and join."""
    schema = delta_compatible(data.schema)
    return data if data.schema == schema else data.cast(schema)
