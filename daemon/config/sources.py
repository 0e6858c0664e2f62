"""Where an entity's data comes from: a landing folder or bucket, HTTP push sources, Kafka topics."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from lakefeed.config.base import CENTURY_S, Frozen, Name, ResolvedPath

S3_URL = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$"

FILES = "files"  # the stream name of an entity's file source


class LocalDirSource(Frozen):
    type: Literal["local_dir"] = "local_dir"
    path: ResolvedPath = Field(description="The landing folder to watch (the CDM folder or below it).")
    reconcile_interval_s: float = Field(default=60.0, gt=0, le=CENTURY_S, description="Listing to catch missed events.")
    max_files_per_trigger: int = Field(default=1000, gt=0)
    follow_symlinks: bool = Field(default=False, description="Take symbolic links whose target is inside the "
                                  "folder; other links, and all links when false, go to quarantine unread.")
    complete_marker: str | None = Field(default=None, description="A file in a folder (right under `path`) waits "
                                        "until the folder holds a non-empty file of this name (model.json for "
                                        "Synapse Link): a folder still being written is not taken.")


def _hex_hashes(value: tuple[str, ...]) -> tuple[str, ...]:
    for digest in value:
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise ValueError("each entry must be a lowercase hex SHA-256 digest (64 characters), not a token")
    return value


class S3Storage(Frozen):
    """How lakefeed reaches an S3-compatible store. Without keys here, credentials come from the standard
    AWS environment variables, `profile` or the shared config files, as for the AWS CLI."""

    endpoint_override: str | None = Field(default=None, description="e.g. http://127.0.0.1:9000 for MinIO, "
                                                                    "SeaweedFS or moto; unset for AWS.")
    region: str = "us-east-1"
    profile: str | None = Field(default=None, description="A profile of ~/.aws/config and ~/.aws/credentials.")
    access_key_id: str | None = None
    secret_access_key: SecretStr | None = Field(default=None, description="Never logged.")
    session_token: SecretStr | None = None
    delta_commits: Literal["conditional_put", "unsafe_rename"] = Field(
        default="conditional_put", description="How Delta commits stay atomic on S3: conditional_put (If-None-Match, "
        "AWS S3 since 2024, MinIO, moto: safe with several writers) or unsafe_rename (one writer per table only).")

    @model_validator(mode="after")
    def _key_pair(self) -> S3Storage:
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ValueError("give both access_key_id and secret_access_key, or neither")
        return self


class SqsNotifications(Frozen):
    """S3 event notifications through an SQS queue (S3→SQS or S3→SNS→SQS)."""

    type: Literal["sqs"] = "sqs"
    queue_url: str = Field(min_length=1)
    dead_letter_url: str | None = Field(default=None, description="Where unusable messages go, with the reason "
                                        "(default: the entity's state folder, poison.jsonl).")
    wait_time_s: int = Field(default=20, ge=0, le=20, description="Long polling wait.")
    visibility_timeout_s: int = Field(default=60, ge=1, le=43200)


class WebhookNotifications(Frozen):
    """S3 events POSTed to /v1/entities/{entity}/notifications by SNS (HTTP subscription) or a MinIO webhook."""

    type: Literal["webhook"] = "webhook"
    tokens_sha256: tuple[str, ...] = Field(min_length=1, description="SHA-256 (hex) of each accepted bearer "
                                           "token (SNS: put it in the subscription URL as ?token=…).")
    topic_arns: tuple[str, ...] = Field(default=(), description="SNS topics whose subscription confirmations "
                                        "lakefeed confirms; others are refused.")

    _hashes = field_validator("tokens_sha256")(classmethod(lambda cls, v: _hex_hashes(v)))


class KafkaNotifications(Frozen):
    """S3/MinIO event records on a Kafka topic (MinIO's Kafka target); offsets committed once durable."""

    type: Literal["kafka"] = "kafka"
    bootstrap_servers: str = Field(min_length=1)
    topic: str = Field(min_length=1)
    group_id: str = Field(min_length=1)


Notifications = Annotated[SqsNotifications | WebhookNotifications | KafkaNotifications, Field(discriminator="type")]


class S3Source(Frozen):
    """A bucket prefix as the entity's landing place and CDM folder: the manifest is kept there too."""

    type: Literal["s3"] = "s3"
    url: str = Field(pattern=S3_URL, description="s3://bucket/prefix/, the entity's root.")
    notifications: tuple[Notifications, ...] = Field(default=(), description="Where the bucket's events arrive; "
                                                     "without any, the periodic listing alone finds files.")
    reconcile_interval_s: float = Field(default=300.0, gt=0, le=CENTURY_S,
                                        description="Listing to catch lost notifications.")
    dated_prefix: str | None = Field(default=None, description="strftime pattern of the keys' leading part "
                                     "below url, e.g. 'date=%Y-%m-%d/': periodic listings then start after the "
                                     "key prefix of now - listing_lookback_s instead of listing everything.")
    listing_lookback_s: float = Field(default=2 * 86400.0, gt=0, le=CENTURY_S)
    manifest_name: str = Field(default="default.manifest.cdm.json", pattern=r"^[^/]+\.manifest\.cdm\.json$")
    max_files_per_trigger: int = Field(default=1000, gt=0)

    @property
    def bucket(self) -> str:
        return self.url.removeprefix("s3://").split("/", 1)[0]

    @property
    def prefix(self) -> str:
        """The key prefix, '' or ending in '/'."""
        rest = self.url.removeprefix("s3://").partition("/")[2].strip("/")
        return rest + "/" if rest else ""

    @property
    def root(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

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
    idempotency_ttl_s: float = Field(default=86400.0, gt=0, le=CENTURY_S, description="How long an Idempotency-Key is "
                                                                        "remembered.")
    max_records_per_trigger: int = Field(default=1_000_000, gt=0)

    _hashes = field_validator("tokens_sha256")(classmethod(lambda cls, v: _hex_hashes(v)))


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
    max_offsets_per_trigger: int = Field(default=500_000, gt=0, description="Messages per micro-batch at most, "
                                         "shared across partitions; a batch is held in the driver's memory whole.")
    min_partitions: int | None = Field(default=None, gt=0, description="Read tasks per micro-batch at least "
                                       "(Spark's minPartitions): when fewer partitions hold data, a partition's "
                                       "range is split. Default: twice the machine's cores.")
    group_id: str | None = Field(default=None, description="Processed offsets are mirrored to this consumer "
                                                           "group for lag monitoring only.")
    retry_timeout_s: float = Field(default=300.0, gt=0, le=CENTURY_S, description="How long an unreachable broker is "
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
