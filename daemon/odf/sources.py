"""The source events of an entity's chain, from its config: the file source as `SetPollingSource` (a files glob
over the landing place, event time from the files' metadata), each push and Kafka source as `AddPushSource`, all
with their read step and lakefeed's CDC strategy as ODF's merge strategy:

    append                                    -> Append
    ledger                                    -> Ledger(primary key)
    snapshot                                  -> Snapshot(primary key)
    changelog (Debezium and others)           -> ChangelogStream(primary key)
    upsert, delete, upsert_and_delete,
    insert, update                            -> UpsertStream(primary key)

ODF has no read step for CDM's model.json folders or the data-manifest text files: they are described as the
CSV they are. Pushed records arrive as NDJSON (or CSV) and Kafka values as JSON: both are NdJson."""

from __future__ import annotations

from lakefeed.config.formats import CsvFormat, JsonFormat, ParquetFormat
from lakefeed.config.model import EntityConfig
from lakefeed.config.sources import S3Source
from lakefeed.odf.blocks import AddPushSource, MergeStrategy, ReadStep, SetPollingSource

_UPSERTS = {"upsert", "delete", "upsert_and_delete", "insert", "update"}


def merge_strategy(cfg: EntityConfig) -> MergeStrategy:
    strategy, key = cfg.cdc.strategy, tuple(cfg.cdc.primary_key)
    if strategy == "append":
        return MergeStrategy("Append")
    if strategy == "ledger":
        return MergeStrategy("Ledger", key)
    if strategy == "snapshot":
        return MergeStrategy("Snapshot", key)
    if strategy == "changelog":
        return MergeStrategy("ChangelogStream", key)
    assert strategy in _UPSERTS, strategy
    return MergeStrategy("UpsertStream", key)


def file_read_step(cfg: EntityConfig) -> ReadStep:
    fmt = cfg.format
    if isinstance(fmt, JsonFormat):
        return ReadStep("NdJson") if fmt.kind == "ndjson" else ReadStep("Json")
    if isinstance(fmt, ParquetFormat):
        return ReadStep("Parquet")
    if isinstance(fmt, CsvFormat):
        return ReadStep("Csv", (("separator", fmt.delimiter), ("encoding", fmt.encoding), ("quote", fmt.quote),
                                ("header", fmt.header), ("null_value", fmt.null_value)))
    return ReadStep("Csv", (("header", False),))  # model.json folders and data-manifest text files


def source_events(cfg: EntityConfig) -> list[SetPollingSource | AddPushSource]:
    """The entity's sources, in a stable order (files, pushes, Kafka)."""
    merge = merge_strategy(cfg)
    events: list[SetPollingSource | AddPushSource] = []
    if cfg.source is not None:
        root = cfg.source.root if isinstance(cfg.source, S3Source) else cfg.source.path.as_uri()
        events.append(SetPollingSource(root.rstrip("/") + "/**", file_read_step(cfg), merge))
    events += [AddPushSource(p.name, ReadStep("NdJson"), merge) for p in cfg.push]
    events += [AddPushSource(k.name, ReadStep("NdJson"), merge) for k in cfg.kafka]
    return events
