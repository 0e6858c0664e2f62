"""The configuration: one frozen, validated model loaded from YAML.

Relative paths are resolved against the folder holding the config file, so a config and the
lake it describes can move together. Every validation problem is reported as
`file:line: field: message`, with the line of the YAML node at fault.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, ValidationError, ValidationInfo, field_validator, model_validator

from lakefeed.config import cdm_root, lines
from lakefeed.config.base import CENTURY_S, Frozen, Location, ResolvedPath
from lakefeed.config.cdm_keys import with_document_key
from lakefeed.config.compaction import Compaction
from lakefeed.config.formats import CsvFormat, FileFormat, JsonFormat, ModelJsonFormat, ParquetFormat
from lakefeed.config.limits import Limits
from lakefeed.config.manifests import Kartothek, Msc, clashes
from lakefeed.config.sources import FILES, KafkaSource, LocalDirSource, PushSource, S3Source, S3Storage
from lakefeed.errors import ConfigError

__all__ = ["FILES", "CsvFormat", "FileFormat", "JsonFormat", "KafkaSource", "LocalDirSource", "Location",
           "ModelJsonFormat", "ParquetFormat", "PushSource", "ResolvedPath", "S3Source", "S3Storage"]

IncrementalType = Literal["Insert", "Update", "Delete", "Upsert", "UpsertAndDelete"]
Writer = Literal["delta-rs", "delta-spark"]


class PatternSpec(Frozen):
    """An inline CDM partition pattern, used when lakefeed creates the entity in the manifest."""

    name: str
    root_location: str = ""
    regular_expression: str | None = None
    glob_pattern: str | None = None
    parameters: tuple[str, ...] = ()
    incremental: IncrementalType | None = Field(
        default=None, description="CDC type of an incrementalPartitionPattern; absent for a data pattern."
    )

    @model_validator(mode="after")
    def _one_expression(self) -> PatternSpec:
        if not (self.regular_expression or self.glob_pattern):
            raise ValueError("give regular_expression or glob_pattern")
        if self.regular_expression:
            try:
                re.compile(self.regular_expression)
            except re.error as exc:
                raise ValueError(f"regular_expression does not compile: {exc}") from exc
        return self


Strategy = Literal["append", "ledger", "snapshot", "upsert", "delete", "upsert_and_delete", "insert", "update",
                   "changelog"]
ChangeKind = Literal["upsert", "delete", "insert", "update"]


class CdcConfig(Frozen):
    """How rows become changes of the current-state table (Open Data Fabric merge strategies, CDM types)."""

    strategy: Strategy = "append"
    primary_key: tuple[str, ...] = ()
    sequence_by: tuple[str, ...] = Field(default=(), description="Per key, the highest sequence wins.")
    compare_columns: tuple[str, ...] = Field(
        default=(), description="Columns whose change makes a correction (default: every non-key column).")
    delete_column: str = Field(default="IsDelete", description="upsert_and_delete: the delete marker column.")
    delete_values: tuple[str, ...] = ("true", "True", "TRUE", "1")
    update_of_absent: Literal["insert", "ignore", "quarantine"] = "insert"
    on_snapshot_removed: Literal["keep", "retract"] = Field(
        default="keep", description="snapshot: when the object the current state came from is deleted, keep "
                                    "the state, or retract every row (as an empty snapshot would).")
    snapshot_scope: str | None = Field(
        default=None, description="snapshot: a key column that a partition pattern captures from each file's path. "
                                  "A file is then the whole state of its scope only (the rows with its value), "
                                  "not of the table; the batch's last file of each scope wins.")
    op_column: str = Field(default="op", description="changelog: the column holding each row's operation.")
    history: bool = Field(default=False, description="Keep an SCD type 2 history table (valid_from, valid_to, "
                                                     "is_current) in step with the current table.")
    debezium: bool = Field(default=False, description="changelog: rows are Debezium envelopes "
                                                      "(before, after, op, ts_ms); ts_ms becomes a timestamp.")
    op_values: dict[str, ChangeKind] = Field(
        default_factory=lambda: {"c": "insert", "r": "upsert", "u": "upsert", "d": "delete",
                                 "insert": "insert", "update": "update", "upsert": "upsert", "delete": "delete"},
        description="changelog: op column value -> change kind (defaults cover Debezium's c/r/u/d).")

    @model_validator(mode="after")
    def _keys_where_needed(self) -> CdcConfig:
        if self.strategy != "append" and not self.primary_key:
            raise ValueError(f"strategy {self.strategy} needs primary_key (none is given, and the entity's CDM schema "
                             "document marks no attribute `purpose: identifiedBy`)")
        if self.strategy == "append" and (self.sequence_by or self.primary_key):
            raise ValueError("strategy append takes no primary_key or sequence_by; use ledger or upsert")
        if self.history and self.strategy == "append":
            raise ValueError("history needs a keyed strategy")
        if self.debezium and self.strategy != "changelog":
            raise ValueError("debezium envelopes need strategy changelog")
        if self.snapshot_scope is not None and (self.strategy != "snapshot"
                                                or self.snapshot_scope not in self.primary_key):
            raise ValueError(f"snapshot_scope {self.snapshot_scope!r} needs strategy snapshot, with the scope column "
                             "in primary_key (rows of different scopes are different rows)")
        return self

    @property
    def keyed(self) -> bool:
        return self.strategy != "append"


class EventTimeConfig(Frozen):
    """Where each row's event time comes from, and how far behind the watermark a row may arrive."""

    source: Literal["system", "column", "path", "file_mtime"] = "system"
    column: str | None = Field(default=None, description="source=column: a timestamp column of the rows.")
    path_pattern: str | None = Field(
        default=None, description="source=path: a regex whose first group, found in the file's location, "
                                  "is the time (ODF EventTimeSource::FromPath).")
    path_format: str = Field(default="%Y-%m-%d", description="source=path: strptime format of that group.")
    allowed_lateness_s: float = Field(default=0.0, ge=0, le=CENTURY_S, description="watermark = max event time - this.")
    late_policy: Literal["apply", "quarantine", "drop"] = "apply"

    @model_validator(mode="after")
    def _source_settings(self) -> EventTimeConfig:
        if self.source == "column" and not self.column:
            raise ValueError("source column needs column")
        if self.source == "path":
            if not self.path_pattern:
                raise ValueError("source path needs path_pattern")
            if re.compile(self.path_pattern).groups < 1:
                raise ValueError("path_pattern needs a group capturing the time")
        return self


def _source_type(value: Any) -> str:
    return (value.get("type") if isinstance(value, dict) else getattr(value, "type", None)) or "local_dir"


FileSource = Annotated[Annotated[LocalDirSource, Tag("local_dir")] | Annotated[S3Source, Tag("s3")],
                       Discriminator(_source_type)]


class EntityConfig(Frozen):
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    source: FileSource | None = Field(default=None, description="Where files land: a local folder (local_dir) or s3.")
    push: tuple[PushSource, ...] = Field(default=(), description="HTTP push sources of records.")
    kafka: tuple[KafkaSource, ...] = Field(default=(), description="Kafka topic sources of records.")
    manifest: ResolvedPath = Field(description="The *.manifest.cdm.json describing the entity.")
    cdm_parents: tuple[ResolvedPath, ...] = Field(default=(), description="Set by cdm_root: the manifests above "
                                                  "the entity's, nearest first, whose subManifests are kept current.")
    patterns: tuple[PatternSpec, ...] = ()
    pattern_precedence: Literal["spec", "sdk"] = Field(default="spec", description="Of several patterns matching "
                                                       "a file, the last processed (spec) or the first (CDM SDK).")
    format: FileFormat = CsvFormat()
    event_time: EventTimeConfig = EventTimeConfig()
    cdc: CdcConfig = CdcConfig()
    limits: Limits = Limits()
    msc: Msc = Field(default=Msc(), description="MSC manifests of the landing folder and of the tables.")
    kartothek: Kartothek = Field(default=Kartothek(), description="The table as a Kartothek dataset too.")
    compaction: Compaction = Compaction()
    partition_by: tuple[str, ...] = Field(default=(), description="Columns (e.g. partition arguments) a new table "
                                          "is partitioned by: Hive-style folders, Kartothek's partition keys.")
    table: Location
    changelog: Location
    quarantine: Location
    history: Location
    tombstones: Location = Field(description="Sequences of deleted keys (with sequence_by), so that an "
                                                 "older change arriving later cannot bring a deleted row back.")
    odf: Location = Field(description="The entity's Open Data Fabric dataset: its hash-linked metadata chain and "
                          "data slices (docs/odf.md).")
    checkpoint: ResolvedPath
    state: ResolvedPath = Field(description="Inbox and bookkeeping of this entity.")
    storage: S3Storage = Field(default=S3Storage(), description="Object-store access (default: top-level `storage`).")
    writer: Writer = Field(default="delta-rs", description="Who writes the entity's Delta tables (default: "
                                                          "top-level `writer`).")

    @model_validator(mode="before")
    @classmethod
    def _key_from_schema_document(cls, data: Any, info: ValidationInfo) -> Any:
        return with_document_key(data, (info.context or {}).get("base_dir"))

    @model_validator(mode="after")
    def _sources(self) -> EntityConfig:
        if self.source is None and not self.push and not self.kafka:
            raise ValueError("give the entity a source: `source` (files), `push` or `kafka`")
        names = self.streams()
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"source names must be unique within an entity ({FILES!r} is the file source): "
                             f"{', '.join(repeated)}")
        if (self.push or self.kafka) and self.cdc.snapshot_scope is not None:
            raise ValueError("cdc.snapshot_scope takes each file's scope from its path: pushed and Kafka records "
                             "have none; give them an entity of their own")
        if (self.push or self.kafka) and self.event_time.source in ("path", "file_mtime"):
            raise ValueError(f"event_time.source {self.event_time.source} needs files; pushed and Kafka records "
                             "take their event time from a column (e.g. kafka_timestamp), the Event-Time header "
                             "or the system time")
        return self

    @model_validator(mode="after")
    def _landing_inside_cdm_folder(self) -> EntityConfig:
        if not self.manifest.name.endswith(".manifest.cdm.json"):
            raise ValueError("manifest must be a *.manifest.cdm.json file")
        root = self.manifest.parent
        if self.source is None:
            return self
        if isinstance(self.source, S3Source):
            if self.manifest != self.state / "cdm" / self.source.manifest_name:
                raise ValueError(f"an s3 source keeps its manifest in the bucket, at {self.source.url.rstrip('/')}/"
                                 f"{self.source.manifest_name}: remove `manifest` (set source.manifest_name "
                                 "to name it)")
            return self
        if root != self.source.path and root not in self.source.path.parents:
            raise ValueError(
                f"source.path {self.source.path} must be the manifest's folder {root} or below it: "
                "partition locations are corpus paths relative to the manifest"
            )
        return self

    @property
    def manifest_url(self) -> str | None:
        """Where the manifest is published when the entity's root is a bucket (`manifest` is the working copy)."""
        return self.source.root + self.source.manifest_name if isinstance(self.source, S3Source) else None

    def streams(self) -> list[str]:
        """The names of the entity's sources, each read by its own streaming query."""
        return ([FILES] if self.source else []) + [p.name for p in self.push] + [k.name for k in self.kafka]

    def stream_checkpoint(self, stream: str) -> Path:
        return self.checkpoint if stream == FILES else self.state / "streams" / stream / "checkpoint"

    def spool(self, stream: str) -> Path:
        return self.state / "streams" / stream / "spool"

    def push_source(self, stream: str) -> PushSource | None:
        return next((p for p in self.push if p.name == stream), None)

    def kafka_source(self, stream: str) -> KafkaSource | None:
        return next((k for k in self.kafka if k.name == stream), None)


class HttpConfig(Frozen):
    """The daemon's HTTP server: push API, health and status."""

    host: str = Field(default="127.0.0.1", description="Listen address (loopback by default).")
    port: int = Field(default=8480, ge=0, le=65535, description="0 picks a free port (logged, and written "
                                                                "to state_dir/http.json).")
    tls_cert: ResolvedPath | None = None
    tls_key: ResolvedPath | None = None
    max_body_bytes: int = Field(default=64 << 20, gt=0, description="Larger request bodies get 413.")

    @model_validator(mode="after")
    def _tls_pair(self) -> HttpConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("give both tls_cert and tls_key, or neither")
        return self


class SparkConfig(Frozen):
    master: str = "local[2]"
    app_name: str = "lakefeed"
    trigger_interval_s: float = Field(default=1.0, gt=0, le=CENTURY_S)
    conf: dict[str, str] = Field(default_factory=dict)
    nice: int = Field(default=10, ge=0, le=19, description="How much nicer than the intake process (which "
                      "acknowledges pushes) the rest of the daemon runs: Spark's JVM, its Python workers and "
                      "the batches. When the cores are busy, acknowledgements come first; 0 treats them alike.")
    log_level: Literal["ALL", "TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF"] = Field(
        default="ERROR", description="Level of Spark's own log (log4j, on stderr beside lakefeed's events). ERROR "
        "keeps Spark's routine warnings (a batch falling behind its trigger, …) out of lakefeed's log; WARN or "
        "INFO to diagnose Spark itself.")


class LakefeedConfig(Frozen):
    lake_dir: Location = Field(default=Path("var/lake"), description="Default home of the entities' Delta "
                               "tables: a folder or s3://bucket/prefix.")
    state_dir: ResolvedPath = Path("var/state")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    shutdown_timeout_s: float = Field(default=60.0, gt=0, le=CENTURY_S, description="How long a stop waits for "
                                      "the running batches; one still running then is given up between files.")
    stop_grace_s: float = Field(default=20.0, gt=0, le=CENTURY_S, description="After shutdown_timeout_s, the time "
                                "left to stop the queries and Spark before the daemon exits by itself (128+SIGTERM; "
                                "what it interrupts is replayed). Keep the unit's TimeoutStopSec above the two "
                                "together.")
    status_sample_s: float = Field(default=10.0, gt=0, le=3600, description="How often the status page's "
                                   "charts take a point (the last hour is kept).")
    stall_timeout_s: float = Field(default=600.0, gt=0, le=CENTURY_S, description="A stream with work waiting "
                                   "and no batch finished for this long is stuck: the systemd watchdog pings stop.")
    spark: SparkConfig = SparkConfig()
    http: HttpConfig = HttpConfig()
    storage: S3Storage = Field(default=S3Storage(), description="Object-store access for s3:// locations.")
    writer: Writer = Field(default="delta-rs", description="Who writes the Delta tables: delta-rs (in the driver "
                                                          "and the tasks) or delta-spark (Spark's Delta, MERGE on the "
                                                          "executors); either continues the other's tables.")
    entities: tuple[EntityConfig, ...]
    described_by: tuple[ResolvedPath, ...] = Field(default=(), description="Set on load: the data manifests and "
                                                   "cdm_root manifests the entities come from, watched like the "
                                                   "config file.")

    @field_validator("entities")
    @classmethod
    def _some_entity(cls, value: tuple[EntityConfig, ...]) -> tuple[EntityConfig, ...]:
        if not value:
            raise ValueError("declare at least one entity")
        return value

    @model_validator(mode="before")
    @classmethod
    def _entity_defaults(cls, data: Any) -> Any:
        """Fill each entity's unset paths from lake_dir/state_dir before validation."""
        if not isinstance(data, dict) or not isinstance(data.get("entities"), list):
            return data
        lake = str(data.get("lake_dir", "var/lake")).rstrip("/")
        state = str(data.get("state_dir", "var/state"))
        entities = []
        for raw in data["entities"]:
            if isinstance(raw, dict) and isinstance(raw.get("name"), str):
                name = raw["name"]
                raw = {
                    "table": f"{lake}/{name}/table",
                    "changelog": f"{lake}/{name}/changelog",
                    "quarantine": f"{lake}/{name}/quarantine",
                    "history": f"{lake}/{name}/history",
                    "tombstones": f"{lake}/{name}/tombstones",
                    "odf": f"{lake}/{name}/odf",
                    "checkpoint": f"{state}/{name}/checkpoint",
                    "state": f"{state}/{name}",
                    **raw,
                }
                source = raw.get("source")
                for inherited in ("storage", "writer"):
                    if inherited in data:
                        raw.setdefault(inherited, data[inherited])
                if isinstance(source, dict) and source.get("type") == "s3":
                    # The working copy; the manifest itself is published next to the data in the bucket.
                    name_ = source.get("manifest_name", "default.manifest.cdm.json")
                    raw.setdefault("manifest", f"{raw['state']}/cdm/{name_}")
                elif "manifest" not in raw:
                    folder = source.get("path") if isinstance(source, dict) and "path" in source else lake
                    if not isinstance(folder, str):
                        folder = lake  # the source's path is the error reported
                    if folder.startswith("s3://"):
                        folder = f"{state}/{name}/cdm"
                    raw["manifest"] = f"{folder}/default.manifest.cdm.json"
            entities.append(raw)
        return {**data, "entities": entities}

    @model_validator(mode="after")
    def _unique_names(self) -> LakefeedConfig:
        names = [e.name for e in self.entities]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"entity names must be unique: {', '.join(duplicates)}")
        clashes(self.entities)
        return self

    def entity(self, name: str) -> EntityConfig:
        return next(e for e in self.entities if e.name == name)


def json_schema() -> dict[str, Any]:
    return LakefeedConfig.model_json_schema()


def load(path: str | Path) -> LakefeedConfig:
    """Read, validate and freeze a config file, or raise ConfigError listing every problem."""
    path = Path(path)
    node, data = lines.read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError([f"{path}:1: (root): the config must be a mapping"])
    origin: list[tuple[int, str | None]] = []
    if isinstance(data.get("entities"), list):
        try:
            entities, origin, described = cdm_root.expand(data["entities"], path.parent.resolve())
        except cdm_root.TreeError as exc:
            loc = ("entities", exc.index, exc.key)
            where = f"{path}:{lines.line_of(node, loc)}: entities.{exc.index}.{exc.key}"
            problem = str(exc) if exc.where else f"{where}: {exc}"
            raise ConfigError([problem]) from exc
        data = {**data, "entities": entities, "described_by": [str(p) for p in described]}
    try:
        return LakefeedConfig.model_validate(data, context={"base_dir": path.parent.resolve()})
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = cdm_root.config_loc(tuple(err["loc"]), origin)
            field = ".".join(str(p) for p in loc) or "(root)"
            problems.append(f"{path}:{lines.line_of(node, loc)}: {field}: {err['msg']}")
        raise ConfigError(problems) from exc
