"""The Delta tables of an entity, written by its `writer` (delta-rs or delta-spark)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from lakefeed.config.model import EntityConfig
from lakefeed.connectors.sinks.base import TableSink
from lakefeed.connectors.sinks.delta_rs import DeltaRsSink
from lakefeed.connectors.sinks.delta_spark import DeltaSparkSink, has_delta
from lakefeed.errors import TerminalError
from lakefeed.inbox.storage import Storage

# A batch's changelog rows in one file: that file is the batch's ODF data slice as it is (docs/odf.md); delta-rs
# writes a batch's record batches in parallel, so the files of a split append would interleave their offsets.
CHANGELOG_FILE_BYTES = 1 << 30

@dataclass
class Sinks:
    table: TableSink
    changelog: TableSink
    quarantine: TableSink
    history: TableSink | None = None
    tombstones: TableSink | None = None

    @classmethod
    def of(cls, cfg: EntityConfig, spark: SparkSession | None = None) -> Sinks:
        """The entity's tables, written by its `writer`; delta-spark writes through `spark`."""
        def sink(location: Path | str, **kwargs: Any) -> TableSink:
            if cfg.writer == "delta-rs":
                return delta_sink(cfg, location, **kwargs)
            return delta_spark_sink(cfg, spark, location, **kwargs)

        return cls(sink(cfg.table, partition_by=cfg.partition_by),
                   sink(cfg.changelog, unique_columns=("offset",), file_bytes=CHANGELOG_FILE_BYTES),
                   sink(cfg.quarantine), sink(cfg.history) if cfg.cdc.history else None,
                   sink(cfg.tombstones) if cfg.cdc.keyed and cfg.cdc.sequence_by else None)


def delta_sink(cfg: EntityConfig, location: Path | str, **kwargs: Any) -> DeltaRsSink:
    """The Delta table at one of the entity's locations, local or in its object store, read and written by
    delta-rs."""
    return DeltaRsSink(location, storage_options=Storage(cfg.storage).delta_options(location), **kwargs)


def delta_spark_sink(cfg: EntityConfig, spark: SparkSession | None, location: Path | str,
                     **kwargs: Any) -> DeltaSparkSink:
    """The same table, written by delta-spark on `spark` (default: the active session), which must have
    delta-spark's jars: the daemon's has them when an entity's writer is delta-spark at its start."""
    spark = spark or SparkSession.getActiveSession()
    if spark is None or not has_delta(spark):
        raise TerminalError(f"entity {cfg.name}: writer delta-spark needs a Spark session with delta-spark's jars; "
                            "the daemon's loads them at start when an entity's writer is delta-spark: restart it")
    return DeltaSparkSink(spark, location, storage_options=Storage(cfg.storage).delta_options(location), **kwargs)
