"""Where an entity's data comes from: a landing folder, HTTP push sources, Kafka topics."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from lakefeed.config_base import Frozen, Name, ResolvedPath

FILES = "files"  # the stream name of an entity's file source


class LocalDirSource(Frozen):
    type: Literal["local_dir"] = "local_dir"
    path: ResolvedPath = Field(description="The landing folder to watch (the CDM folder or below it).")
    reconcile_interval_s: float = Field(default=60.0, gt=0, description="Listing to catch missed events.")
    max_files_per_trigger: int = Field(default=1000, gt=0)




class PushSource(Frozen):
    """Producers POST records to /v1/entities/{entity}/sources/{name}/records (docs/push-api.md)."""

    type: Literal["http_push"] = "http_push"
    name: Name
    tokens_sha256: tuple[str, ...] = Field(
        min_length=1, description="SHA-256 (hex) of each bearer token allowed to push to this source; "
                                  "`lakefeed token` makes a token and its hash.")
    rate_limit_per_s: float | None = Field(default=None, gt=0, description="Requests per second (burst 2x); "
                                                                          "429 beyond it.")
    spool_max_bytes: int = Field(default=1 << 30, gt=0, description="Acknowledged data not yet committed; "
                                                                    "503 with Retry-After beyond it.")
    segment_bytes: int = Field(default=64 << 20, gt=0, description="Spool segment size.")
    idempotency_ttl_s: float = Field(default=86400.0, gt=0, description="How long an Idempotency-Key is "
                                                                        "remembered.")
    max_records_per_trigger: int = Field(default=1_000_000, gt=0)

    @field_validator("tokens_sha256")
    @classmethod
    def _hex_hashes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for digest in value:
            if not re.fullmatch(r"[0-9a-f]{64}", digest):
                raise ValueError("each entry must be a lowercase hex SHA-256 digest (64 characters), not a token")
        return value


class KafkaSource(Frozen):
    """Records from Kafka topics; offsets live in the query's checkpoint (docs/kafka.md)."""

    type: Literal["kafka"] = "kafka"
    name: Name
    bootstrap_servers: str = Field(min_length=1, description="host:port[,host:port…]")
    topics: tuple[str, ...] = ()
    pattern: str | None = Field(default=None, description="A regex over topic names (instead of topics); "
                                                          "new matching topics are picked up.")
    starting_offsets: str = Field(default="earliest", description="earliest, latest, or JSON "
                                  '{"topic": {"0": offset}} (-2 earliest, -1 latest) for a new checkpoint.')
    max_offsets_per_trigger: int = Field(default=100_000, gt=0)
    group_id: str | None = Field(default=None, description="Processed offsets are mirrored to this consumer "
                                                           "group for lag monitoring only.")
    retry_timeout_s: float = Field(default=300.0, gt=0, description="How long an unreachable broker is "
                                                                    "retried before the stream fails.")
    metadata_columns: tuple[Literal["topic", "partition", "offset", "timestamp", "key", "headers"], ...] = Field(
        default=("topic", "partition", "offset", "timestamp", "key"),
        description="Message coordinates kept as columns kafka_<name> beside the value's fields.")

    @model_validator(mode="after")
    def _topics_or_pattern(self) -> KafkaSource:
        if bool(self.topics) == bool(self.pattern):
            raise ValueError("give exactly one of topics and pattern")
        if self.pattern:
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ValueError(f"pattern does not compile: {exc}") from exc
        return self
