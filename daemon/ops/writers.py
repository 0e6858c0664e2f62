"""What the daemon's Spark session can write with: delta-spark's jars are loaded when it starts, or never."""

from __future__ import annotations

from pyspark.sql import SparkSession

from lakefeed import log
from lakefeed.config.model import LakefeedConfig
from lakefeed.connectors.sinks.delta_spark import has_delta

_log = log.get(__name__)


def spark_packages(cfg: LakefeedConfig) -> tuple[str, ...]:
    """The jars the daemon's session loads: delta-spark's when an entity's writer is delta-spark."""
    return ("delta",) if any(e.writer == "delta-spark" for e in cfg.entities) else ()


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
