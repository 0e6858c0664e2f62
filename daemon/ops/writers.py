"""What the daemon's Spark session can write with: delta-spark's jars are loaded when it starts, or never."""

from __future__ import annotations

import shutil
import threading
import time

import pyarrow as pa
import pyarrow.fs as pafs
from pyspark.sql import SparkSession

from lakefeed import log
from lakefeed.batch.cdc import KIND, MergePlan
from lakefeed.config.model import LakefeedConfig
from lakefeed.connectors.sinks import data_files
from lakefeed.connectors.sinks.delta_spark import DeltaSparkSink, has_delta
from lakefeed.ops import spark

_log = log.get(__name__)


def spark_packages(cfg: LakefeedConfig) -> tuple[str, ...]:
    """The jars the daemon's session loads: delta-spark's when an entity's writer is delta-spark, and
    hadoop-aws's (s3a://) when such an entity has a table in S3."""
    spark_written = [e for e in cfg.entities if e.writer == "delta-spark"]
    if not spark_written:
        return ()
    in_s3 = any(str(loc).startswith("s3://") for e in spark_written
                for loc in (e.table, e.changelog, e.quarantine, e.history, e.tombstones))
    return ("delta", "s3a") if in_s3 else ("delta",)


def until_restart(new: LakefeedConfig, session: SparkSession) -> tuple[LakefeedConfig, list[str]]:
    """`new`, less what the running session cannot do: entities a reload sets to `writer: delta-spark` while the
    session has no delta-spark jars are written by delta-rs (the tables are the same to both) until a restart;
    and their names."""
    if has_delta(session):
        return new, []
    waiting = [e.name for e in new.entities if e.writer == "delta-spark"]
    if not waiting:
        return new, []
    _log.warning("reload.writer_needs_restart", entities=waiting,
                 reason="delta-spark's jars are loaded when the daemon starts; until a restart delta-rs writes "
                        "these entities' tables")
    kept = tuple(e.model_copy(update={"writer": "delta-rs"}) if e.name in waiting else e for e in new.entities)
    return new.model_copy(update={"entities": kept}), waiting


def warm_up(cfg: LakefeedConfig, session: SparkSession) -> None:
    """The session's code paths, in the background while the entities start: the Python workers; with
    delta-spark, a MERGE, an append and a commit of task files into scratch tables (the first of each in a
    process took 12-24 s on the 2 cores measured, later ones 1-4 s). The first batch does not pay for them, and
    readiness does not wait."""
    delta = any(e.writer == "delta-spark" for e in cfg.entities) and has_delta(session)
    threading.Thread(target=_warm, args=(cfg, session, delta), name="warm-up", daemon=True).start()


def _warm(cfg: LakefeedConfig, session: SparkSession, delta: bool) -> None:
    started = time.monotonic()
    try:
        spark.warm_up(session)
    except Exception as exc:  # a stop under way (the session is going)
        _log.info("spark.warm_up_stopped", error=" ".join(str(exc).splitlines()[:1])[:300])
        return
    if delta:
        _warm_delta(cfg, session)
    try:
        spark.keep_heap_small(session)  # once started: daemon/ops/spark.py's HEAP_FREE
    except Exception as exc:  # a stop under way
        _log.info("spark.heap_left_as_is", error=" ".join(str(exc).splitlines()[:1])[:300])
    _log.info("spark.warmed_up", seconds=round(time.monotonic() - started, 3))


def _warm_delta(cfg: LakefeedConfig, session: SparkSession) -> None:
    scratch = cfg.state_dir / "warm-up-delta-spark"
    shutil.rmtree(scratch, ignore_errors=True)  # what a killed process left
    started = time.monotonic()
    plan = MergePlan(keys=("id",), sequence=(), compare=("v",), snapshot=False, insert_updates_of_absent=False)
    try:
        sink = DeltaSparkSink(session, scratch / "table")
        for version in (0, 1):
            sink.merge(pa.table({"id": [1, version + 2], "v": ["a", "b"], KIND: ["upsert", "upsert"]}), plan,
                       "warm-up", version, {})
        DeltaSparkSink(session, scratch / "appended").append(pa.table({"id": [1]}), "warm-up", 0, {})
        committed = DeltaSparkSink(session, scratch / "committed")  # task files, as most append batches commit
        for version in (0, 1):
            rows = pa.table({"id": [version]})
            files = data_files.write(pafs.LocalFileSystem(), str(scratch / "committed"), rows, f"part-b{version}-")
            committed.commit_files(files, rows.schema, "warm-up", version, {})
    except Exception as exc:  # a stop under way (the session is going), or a fault the first batch reports
        _log.info("writer.warm_up_stopped", writer="delta-spark", error=" ".join(str(exc).splitlines()[:1])[:300])
        return
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    _log.info("writer.warmed", writer="delta-spark", seconds=round(time.monotonic() - started, 1))
