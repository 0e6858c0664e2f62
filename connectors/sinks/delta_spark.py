"""Delta Lake tables written by delta-spark (`writer: delta-spark`) on the daemon's Spark session.

Appends are DataFrame writes, MERGE is delta-spark's (it runs on the executors when `spark.master` is a cluster),
and files written by tasks are committed through Delta's own optimistic transaction. Every write carries the
batch's application transaction (`txn` action: Delta's idempotent writes), as the delta-rs writer's do. Reads
(transaction versions, statistics, history, change data) stay with delta-rs, which reads any Delta table: a table
one writer wrote is continued by the other.

delta-spark cannot put keys of lakefeed's own at the top of a commit's `commitInfo`, as delta-rs does: it
records them as the commit's `userMetadata`, a JSON object (`delta_log.commit_metadata` reads both).

A column name Delta refuses in a table that maps nothing (a space, `,;{}()=`: a CSV header's `first name`) makes
the table map its columns, each to its own name (column_mapping.py); delta-rs reads no change data of such a table,
so Spark reads it. A backtick in a column name is refused before a MERGE into a table with change data, mapped or
not: Delta's MERGE fails on it there.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from lakefeed.batch.cdc import KIND, MergePlan
from lakefeed.batch.checks import Checks
from lakefeed.batch.schema import delta_compatible
from lakefeed.connectors.sinks import column_mapping, constraints, delta_rs
from lakefeed.connectors.sinks.column_mapping import MAX_ID, MODE
from lakefeed.connectors.sinks.data_files import DataFile
from lakefeed.connectors.sinks.delta_rs import DeltaRsSink
from lakefeed.connectors.sinks.merge_sql import (
    SPARK,
    changed_clause,
    history_close,
    history_match,
    history_open,
    inserted_kinds,
    kind_in,
    newer_clause,
    within,
)
from lakefeed.errors import TerminalError

_TXN_APP, _TXN_VERSION = "spark.databricks.delta.write.txnAppId", "spark.databricks.delta.write.txnVersion"
_USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
_SNAPSHOT_PARTITIONS = "spark.databricks.delta.snapshotPartitions"
_CHECKSUM = "spark.databricks.delta.writeChecksumFile.enabled"
_OPTIMIZE_MIN = "spark.databricks.delta.optimize.minFileSize"  # smaller files are OPTIMIZE's candidates
_OPTIMIZE_MAX = "spark.databricks.delta.optimize.maxFileSize"  # the size it writes


def has_delta(spark: SparkSession) -> bool:
    """Whether the session was built with delta-spark (daemon/ops/jars.py's DELTA_CONF)."""
    return "DeltaSparkSessionExtension" in (spark.conf.get("spark.sql.extensions", "") or "")


def s3a_conf(bucket: str, options: dict[str, str]) -> dict[str, str]:
    """Hadoop's s3a settings for one bucket (`fs.s3a.bucket.<bucket>.*`), from the delta-rs storage options the
    store's config makes (daemon/inbox/storage.py): the same endpoint, region and credentials. Set on the
    writer's own session, they reach the Hadoop configuration of its jobs, and no other bucket's."""
    conf = {"endpoint.region": options.get("AWS_REGION", "us-east-1")}
    if endpoint := options.get("AWS_ENDPOINT_URL"):
        conf.update({"endpoint": endpoint, "path.style.access": "true",
                     "connection.ssl.enabled": str(endpoint.startswith("https://")).lower()})
    if "AWS_ACCESS_KEY_ID" in options:
        conf.update({"access.key": options["AWS_ACCESS_KEY_ID"], "secret.key": options["AWS_SECRET_ACCESS_KEY"]})
        if token := options.get("AWS_SESSION_TOKEN"):
            conf.update({"session.token": token,
                         "aws.credentials.provider": "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"})
        else:
            conf["aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
    else:  # the store's config found no credentials: anonymous, as its other clients are
        conf["aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.AnonymousAWSCredentialsProvider"
    return {f"fs.s3a.bucket.{bucket}.{key}": value for key, value in conf.items()}


def _set_write_confs(session: SparkSession) -> None:
    """The SQL confs of a writer's session. Delta's own are set once its `DeltaSQLConf` object has loaded:
    Spark registers a conf in two tables, one after the other, as it loads, and a `conf.set` of one of its keys
    from another thread in between fails with CANNOT_MODIFY_CONFIG (seen once: an entity's sinks were made while
    the warm-up's thread loaded Delta). Touching the object returns once it has loaded, whichever thread loads
    it: the JVM initialises a class once, under a lock."""
    context = session.sparkContext
    assert context._jvm is not None
    context._jvm.org.apache.spark.sql.delta.sources.DeltaSQLConf.DELTA_SNAPSHOT_PARTITIONS()
    # Timestamps as Parquet's TIMESTAMP(MICROS, UTC), as delta-rs writes them; Spark's default is INT96, which
    # Arrow reads back without a time zone.
    session.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    # Delta rebuilds a table's state with a Spark job of 50 partitions by default: on the 2 cores measured a
    # commit of task-written files took 3.2-5.4 s, with as many partitions as cores 1.2-1.5 s (and a MERGE of
    # 10k changes into 800k rows 3.5 s instead of 7.8 s). A value set in `spark.conf` is kept.
    if not context.getConf().contains(_SNAPSHOT_PARTITIONS):
        session.conf.set(_SNAPSHOT_PARTITIONS, str(context.defaultParallelism))
    # After each commit Delta writes a checksum file (.crc) of the table's state, by a Spark job: a commit of
    # task files took 0.57-1.0 s with it and 0.15-0.19 s without (median of 14, 2 cores). It is optional in
    # the protocol, delta-rs writes none (a table both continue would have them only here and there), and
    # readers do without. A value set in `spark.conf` is kept.
    if not context.getConf().contains(_CHECKSUM):
        session.conf.set(_CHECKSUM, "false")


class DeltaSparkSink(DeltaRsSink):
    def __init__(self, spark: SparkSession, uri: str | Path, storage_options: dict[str, str] | None = None,
                 unique_columns: tuple[str, ...] = (), partition_by: tuple[str, ...] = (),
                 file_bytes: int | None = None) -> None:
        """As DeltaRsSink's; `file_bytes` set: each write is one file (the changelog's slices are whole files)."""
        super().__init__(uri, storage_options, unique_columns, partition_by, file_bytes)
        # A session of its own: a commit's transaction and metadata are SQL confs of the session that commits, and
        # entities commit from threads of their own.
        self._spark = spark.newSession()
        _set_write_confs(self._spark)
        self._path = self.uri
        if self.uri.startswith("s3://"):  # Hadoop's S3 client, told this bucket's endpoint and credentials
            self._path = "s3a://" + self.uri.removeprefix("s3://")
            for key, value in s3a_conf(urlsplit(self.uri).netloc, storage_options or {}).items():
                self._spark.conf.set(key, value)
        self._one_file = file_bytes is not None

    def _checkpoint(self, table: Any) -> None:
        """None of its own: delta-spark writes one every 10 commits."""

    # -- writes -------------------------------------------------------------------------------------------------
    def append(self, data: pa.Table, app_id: str, version: int, metadata: dict[str, str]) -> None:
        if data.num_rows == 0:  # a commit of the transaction alone: Spark would write an empty file no log holds
            self.commit_files([], data.schema, app_id, version, metadata)
            return
        self._map_columns(self._load(), data.schema)
        self._write(self._frame(data), app_id, version, metadata)

    def commit_files(self, files: list[DataFile], schema: pa.Schema, app_id: str, version: int,
                     metadata: dict[str, str], checked: Checks = ()) -> None:
        table = self._load()
        now = int(time.time() * 1000)
        actions: list[dict[str, Any]] = [{"txn": {"appId": app_id, "version": version, "lastUpdated": now}}]
        mapping = self._mapping(table, schema, {})
        if table is None:  # the table is made by this commit (its folder already holds the tasks' files)
            actions.append(mapping or self._new_table(schema, {}))
        else:
            self._check_physical_names(table)
            current = pa.schema(table.schema().to_arrow())
            constraints.check(self.uri, table.metadata().configuration, current, files, checked)
            if mapping is not None:  # in a commit of its own first: a replay finds the columns there
                self._commit([mapping], {})
            elif any(f.name not in current.names for f in delta_compatible(schema)):
                self._add_columns(schema, current)  # so too
        actions += [{"add": {"path": quote(f.path), "partitionValues": f.partition_values, "size": f.size,
                             "modificationTime": f.modification_time, "dataChange": True, "stats": f.stats}}
                    for f in files]
        self._commit(actions, metadata)

    def compact(self, target_bytes: int) -> tuple[int, int]:
        """Delta's OPTIMIZE, whose rewrite runs in Spark's tasks: files under `target_bytes` are its candidates."""
        from delta.tables import DeltaTable

        if self.schema() is None:
            return 0, 0
        with _SessionConf(self._spark, {_OPTIMIZE_MIN: str(target_bytes), _OPTIMIZE_MAX: str(target_bytes)}):
            done = DeltaTable.forPath(self._spark, self._path).optimize().executeCompaction().collect()
        metrics = done[0]["metrics"] if done else None
        return (int(metrics["numFilesRemoved"]), int(metrics["numFilesAdded"])) if metrics else (0, 0)

    def merge(self, source: pa.Table, plan: MergePlan, app_id: str, version: int, metadata: dict[str, str]) -> int:
        from delta.tables import DeltaTable  # delta-spark's Python API: imported where the jar is in use

        columns = [c for c in source.column_names if c != KIND]
        table = self._load()
        _check_merged_names([*columns, *(pa.schema(table.schema().to_arrow()).names if table is not None else [])])
        frame = self._frame(source)
        if table is None:
            self._create(source.select(columns).schema, cdf=True)
        else:
            if table.metadata().configuration.get(delta_rs.CDF) != "true":
                self._spark.sql(f"ALTER TABLE delta.`{self._path}` SET TBLPROPERTIES ({delta_rs.CDF} = true)")
                table = self._load()
            self._map_columns(table, source.select(columns).schema)
        table = self._load()
        assert table is not None
        before, current = table.version(), pa.schema(table.schema().to_arrow())
        existing = set(current.names)
        values, on = SPARK.assign(columns), SPARK.same_keys(plan.keys)
        changed = changed_clause(tuple(c for c in plan.compare if c in columns and c in existing),
                                 tuple(c for c in plan.compare if c in columns and c not in existing), SPARK)
        target = DeltaTable.forPath(self._spark, self._path)
        acting = self._acting(frame, target.toDF(), plan, on, changed, existing)
        merger = (target.alias("t").merge(acting.alias("s"), on).withSchemaEvolution()
                  .whenMatchedDelete(kind_in(("delete",), SPARK))
                  .whenMatchedUpdate(kind_in(("upsert", "update"), SPARK), values)
                  .whenNotMatchedInsert(kind_in(inserted_kinds(plan), SPARK), values))
        with self._transaction(app_id, version, metadata):
            merger.execute()
        after = self.version()
        if after == before:  # nothing changed: record the batch all the same
            self.commit_files([], current, app_id, version, metadata)
            after = self.version()
        return after  # type: ignore[return-value]

    def apply_history(self, edits: pa.Table, keys: tuple[str, ...], app_id: str, version: int) -> None:
        from delta.tables import DeltaTable

        source = delta_rs.history_source(edits)
        columns = [c for c in source.column_names if c not in ("__h", "__at")]
        frame = self._frame(source)
        table = self._load()
        if table is None:
            self._create(source.select(columns).schema, cdf=False)
        else:
            self._map_columns(table, source.select(columns).schema)
        merger = (DeltaTable.forPath(self._spark, self._path).alias("t")
                  .merge(frame.alias("s"), history_match(keys, SPARK)).withSchemaEvolution()
                  .whenMatchedUpdate(set=history_close(SPARK))
                  .whenNotMatchedInsert(history_open(SPARK), SPARK.assign(columns)))
        with self._transaction(app_id, version, {}):
            merger.execute()

    def changes(self, table_version: int) -> pa.Table:
        """delta-rs 1.6 reads no change data of a table that maps its columns ("Column mapping is not supported for
        read operation 'CHANGE DATA FEED scans'"): Delta reads it then, in the same columns and types."""
        table = self._load()
        if table is None or table.metadata().configuration.get(MODE, "none") == "none":
            return super().changes(table_version)
        read = (self._spark.read.format("delta").option("readChangeFeed", "true")
                .option("startingVersion", table_version).option("endingVersion", table_version))
        changes = read.load(self._path).toArrow()
        return changes.cast(delta_compatible(changes.schema))

    # -- helpers ------------------------------------------------------------------------------------------------
    @staticmethod
    def _acting(source: DataFrame, target: DataFrame, plan: MergePlan, on: str, changed: str,
                existing: set[str]) -> DataFrame:
        """The source rows that change the table, each with the kind of change it makes.

        delta-spark's MERGE rewrites every file holding a matched row, also when no clause acts on it, and then
        records no change data: readers take the rewritten files' rows as deleted and inserted again. So only
        rows that act are merged: a snapshot becomes upserts of its new and changed rows and deletes of the keys
        (in its scope) it no longer holds."""
        from pyspark.sql import functions as F

        keys = list(plan.keys)
        wanted = [c for c in dict.fromkeys([*keys, *plan.compare, *plan.sequence]) if c in existing]
        t = target.select(*[F.col(SPARK.name(c)) for c in wanted]).alias("t")
        matched = source.alias("s").join(t, F.expr(on), "left")
        absent = " AND ".join(f"{SPARK.col('t', k)} IS NULL" for k in keys)
        if plan.snapshot:
            upserts = (matched.where(f"({absent}) OR ({changed})").select("s.*")
                       .withColumn(KIND, F.lit("upsert")))
            scoped = within(plan.scope, SPARK)
            kept = target.alias("t").where(scoped) if scoped else target.alias("t")
            gone = (kept.join(source.alias("s"), F.expr(on), "left_anti")
                    .select(*[F.col(SPARK.col("t", k)).cast(source.schema[k].dataType).alias(k) for k in keys])
                    .withColumn(KIND, F.lit("delete")))
            return upserts.unionByName(gone, allowMissingColumns=True)
        newer = newer_clause(plan.sequence, SPARK)
        acts = (f"({absent}) OR ({kind_in(('delete',), SPARK)} AND ({newer})) OR "
                f"({kind_in(('upsert', 'update'), SPARK)} AND ({newer}) AND ({changed}))")
        return matched.where(acts).select("s.*")

    def _frame(self, data: pa.Table) -> DataFrame:
        data = delta_rs.contiguous(data)
        return self._spark.createDataFrame(data.cast(delta_compatible(data.schema)))

    def _create(self, schema: pa.Schema, cdf: bool) -> None:
        """The table, in a commit of its metadata alone, through Delta's own transaction as task-written files are
        committed. Delta's CREATE TABLE is not used: a folder holding a `_delta_log/` without a commit, as a
        creation cut short by a crash leaves it, is a table to it, which it then fails to find
        (DELTA_TABLE_NOT_FOUND), so the table could never be made; a transaction's first commit makes it."""
        configuration = {delta_rs.CDF: "true"} if cdf else {}
        self._commit([self._mapping(None, schema, configuration) or self._new_table(schema, configuration)], {})

    def _map_columns(self, table: Any, schema: pa.Schema) -> None:
        """The columns of `schema` that `table` lacks, mapped, in a commit of their own when the table maps its
        columns or must (`_mapping`); else Delta's own schema evolution adds them with the write."""
        if (action := self._mapping(table, schema, {})) is not None:
            self._commit([action], {})

    def _mapping(self, table: Any, schema: pa.Schema, configuration: dict[str, str]) -> dict[str, Any] | None:
        """The `metaData` action that gives `table` (the delta-rs table; None: made with `configuration`) the
        columns of `schema` it lacks, each mapped to its own name (column_mapping.py), when the table maps its
        columns or one of them is a name Delta refuses unmapped. None otherwise: nothing to add, or a table that
        maps nothing, which Delta's own schema evolution serves."""
        mapped = table is not None and table.metadata().configuration.get(MODE, "none") != "none"
        have = column_mapping.paths(pa.schema(table.schema().to_arrow())) if table is not None else set()
        new = column_mapping.paths(schema) - have
        if not (new if mapped else any(column_mapping.refused(path[-1]) for path in new)):
            return None  # the usual case, told without Spark
        if table is None:
            action, current = self._new_table(schema, configuration), []
        else:
            action = json.loads(self._log().startTransaction().metadata().json())  # its latest
            current = json.loads(action["metaData"]["schemaString"])["fields"]
        meta = action["metaData"]
        incoming = json.loads(self._frame(schema.empty_table()).schema.json())["fields"]
        fields, top = column_mapping.evolve(current, incoming, int(meta["configuration"].get(MAX_ID, 0)))
        meta["schemaString"] = json.dumps({"type": "struct", "fields": fields})
        meta["configuration"] = {**meta["configuration"], MODE: "name", MAX_ID: str(top)}
        return action

    def _check_physical_names(self, table: Any) -> None:
        """Task-written files name their columns as the data does: in a table whose columns another Delta writer
        mapped to other physical names (`col-<uuid>`), their values would read as nulls."""
        if renamed := column_mapping.renamed(json.loads(table.schema().to_json())["fields"]):
            raise TerminalError(f"table {self.uri}: columns {renamed} are stored under other physical names, given "
                                "by a Delta writer other than lakefeed's; lakefeed's files name each column as the "
                                "data does, so it cannot add files to this table: write the entity to a new table")

    def _new_table(self, schema: pa.Schema, configuration: dict[str, str]) -> dict[str, Any]:
        """The `metaData` action that makes the table (Delta adds the protocol its configuration needs)."""
        return {"metaData": {"id": str(uuid.uuid4()), "format": {"provider": "parquet", "options": {}},
                             "schemaString": self._frame(schema.empty_table()).schema.json(),
                             "partitionColumns": list(self._partition_by or ()), "configuration": configuration,
                             "createdTime": int(time.time() * 1000)}}

    def _commit(self, actions: list[dict[str, Any]], metadata: dict[str, str]) -> None:
        """One commit of `actions` (the Delta protocol's JSON actions) through Delta's optimistic transaction."""
        jvm = self._spark.sparkContext._jvm
        assert jvm is not None
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(self._spark._jsparkSession)
        txn = self._log().startTransaction()
        parse = jvm.org.apache.spark.sql.delta.actions.Action.fromJson
        seq = jvm.scala.jdk.javaapi.CollectionConverters.asScala(
            jvm.java.util.ArrayList([parse(json.dumps(a)) for a in actions])).toSeq()
        manual = getattr(getattr(jvm.org.apache.spark.sql.delta, "DeltaOperations$ManualUpdate$"), "MODULE$")
        if metadata:
            self._spark.conf.set(_USER_METADATA, json.dumps(metadata))
        try:
            txn.commit(seq, manual)
        finally:
            self._spark.conf.unset(_USER_METADATA)

    def _log(self) -> Any:
        """Delta's log of the table (`DeltaLog`, in the JVM)."""
        jvm = self._spark.sparkContext._jvm
        assert jvm is not None
        return jvm.org.apache.spark.sql.delta.DeltaLog.forTable(self._spark._jsparkSession, self._path)

    def _add_columns(self, schema: pa.Schema, current: pa.Schema) -> None:
        fields = self._frame(schema.empty_table()).schema.fields
        added = ", ".join(f"{SPARK.name(f.name)} {f.dataType.simpleString()}" for f in fields
                          if f.name not in current.names)
        self._spark.sql(f"ALTER TABLE delta.`{self._path}` ADD COLUMNS ({added})")

    def _write(self, frame: DataFrame, app_id: str, version: int, metadata: dict[str, str]) -> None:
        if self._one_file:
            frame = frame.coalesce(1)
        writer = frame.write.format("delta").mode("append").option("mergeSchema", "true")
        if self._partition_by and self.schema() is None:
            writer = writer.partitionBy(*self._partition_by)
        writer = writer.option("txnAppId", app_id).option("txnVersion", version)
        if metadata:
            writer = writer.option("userMetadata", json.dumps(metadata))
        writer.save(self._path)

    def _transaction(self, app_id: str, version: int, metadata: dict[str, str]) -> _SessionConf:
        confs = {_TXN_APP: app_id, _TXN_VERSION: str(version)}
        if metadata:
            confs[_USER_METADATA] = json.dumps(metadata)
        return _SessionConf(self._spark, confs)


def _check_merged_names(names: list[str]) -> None:
    """Delta 4.4's MERGE into a table with change data quotes each column name in backticks without doubling one
    inside (MergeOutputGeneration: INVALID_ATTRIBUTE_NAME_SYNTAX), whether the table maps its columns or not."""
    if ticked := [n for n in dict.fromkeys(names) if "`" in n]:
        raise ValueError(f"columns {ticked}: delta-spark's MERGE cannot write a column name holding a backtick (`) "
                         "into a table with change data feed (a Delta bug); write this entity with "
                         "`writer: delta-rs`, which takes any name, or rename the column at its source")


class _SessionConf:
    """SQL confs set for the commit made inside the `with`, unset after it."""

    def __init__(self, spark: SparkSession, confs: dict[str, Any]) -> None:
        self._spark, self._confs = spark, confs

    def __enter__(self) -> None:
        for key, value in self._confs.items():
            self._spark.conf.set(key, value)

    def __exit__(self, *_: object) -> None:
        for key in self._confs:
            self._spark.conf.unset(key)
