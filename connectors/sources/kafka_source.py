"""Kafka topics as a Spark streaming source: a PySpark Python data source that reads with kafka-python.

- Spark's own Kafka source needs jars from Maven; this one needs only kafka-python.
- Offsets are `{"topic": {"partition": next_offset_to_read}}` and live only in the query's checkpoint. Spark
  logs a batch's end offsets before running it and marks it done after the sink has it, so a restarted query
  re-reads or skips exactly the right records. A consumer group cannot do that: its commit is neither atomic
  with the sink nor tied to a batch, so resuming from it would lose or repeat records after a crash.
- `group_id`, when set, only mirrors processed offsets into that consumer group (kafka_group.py), at each trigger
  and in `commit()`, so the usual lag tools see how far behind the query is. It is best effort, never read back.
- One InputPartition per topic-partition with new records, large ranges split so that every core reads (option
  `minPartitions`): executors `assign()` + `seek()` (no rebalances), read exactly [start, end), yield Arrow batches
  decoded a whole fetch at a time (connectors/sources/kafka_records.py).
- End offsets are high watermarks from fetch responses. ListOffsets alone can under-report (tansu answers with
  the last record batch's base offset + 1), and ListOffsets is only used to find a valid offset to fetch from.
- New partitions, and new topics matching `pattern`, enter the offsets at their earliest offset in one batch and
  are read from the next one on. Their starting point is then recorded in the checkpoint too.
- An end offset below the checkpoint (topic recreated, or the broker lost its data) or a checkpointed partition
  the broker no longer has raises KafkaOffsetError. Carrying on would silently skip or repeat records.
- Driver-side broker calls retry with exponential backoff for `retryTimeoutMs`. Executors wait up to
  `pollTimeoutMs` for records they know exist.
- The columns are those of Spark's Kafka source, minus timestampType, in SCHEMA's order. `timestamp` is the
  record's timestamp (epoch milliseconds) in UTC. `headers` is null for a record without headers, as in Spark.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import pyarrow as pa
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError, KafkaTimeoutError, OffsetOutOfRangeError
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_delay, wait_exponential

from lakefeed import log
from lakefeed.connectors.sources.kafka_group import GroupOffsets
from lakefeed.connectors.sources.kafka_records import arrow_fetches
from lakefeed.errors import TerminalError, TransientError

FORMAT = "lakefeed_kafka"
SCHEMA = ("topic string, partition int, offset long, timestamp timestamp, key binary, value binary, "
          "headers array<struct<key:string,value:binary>>")
EARLIEST, LATEST = -2, -1
_MIN_SPLIT = 50_000  # offsets: a read task costs a consumer of its own (a connection, metadata, a seek)

_log = log.get(__name__)
T = TypeVar("T")
Tp = tuple[str, int]


class KafkaOffsetError(TerminalError):
    """The broker does not hold the offsets the checkpoint or `startingOffsets` expects."""


@dataclass(frozen=True)
class _Options:
    bootstrap_servers: str
    topics: tuple[str, ...]
    pattern: re.Pattern[str] | None
    starting: str | dict[str, dict[str, int]]
    max_offsets: int | None
    group_id: str | None
    poll_timeout_s: float
    retry_timeout_s: float
    status_path: str | None = None
    min_partitions: int = 2

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> _Options:
        def positive(name: str) -> int | None:
            if (raw := options.get(name)) is not None and (not str(raw).isdigit() or int(raw) <= 0):
                raise ValueError(f"{FORMAT} option {name} must be a positive integer, got {raw!r}")
            return int(raw) if raw is not None else None

        servers = options.get("bootstrap_servers", "")
        if not servers:
            raise ValueError(f"{FORMAT} needs option bootstrap_servers, e.g. 'broker1:9092,broker2:9092'")
        topics = tuple(t.strip() for t in options.get("topics", "").split(",") if t.strip())
        pattern = options.get("pattern")
        if bool(topics) == bool(pattern):
            raise ValueError(f"{FORMAT} needs exactly one of the options topics (comma-separated) and pattern")
        try:
            compiled = re.compile(pattern) if pattern else None
        except re.error as e:
            raise ValueError(f"{FORMAT} option pattern is not a valid regular expression: {e}") from e
        return cls(servers, topics, compiled, _parse_starting(options.get("startingOffsets", "latest")),
                   positive("maxOffsetsPerTrigger"), options.get("group_id") or None,
                   (positive("pollTimeoutMs") or 120_000) / 1000, (positive("retryTimeoutMs") or 300_000) / 1000,
                   options.get("statusPath") or None, positive("minPartitions") or 2 * (os.cpu_count() or 1))

    def subscribed(self, topic: str) -> bool:
        return bool(self.pattern.fullmatch(topic)) if self.pattern else topic in self.topics


def _parse_starting(raw: str) -> str | dict[str, dict[str, int]]:
    if raw.strip().lower() in ("earliest", "latest"):
        return raw.strip().lower()
    try:
        spec = json.loads(raw)
        if isinstance(spec, dict) and all(
                isinstance(parts, dict) and all(str(p).isdigit() and isinstance(o, int) and o >= EARLIEST
                                                for p, o in parts.items()) for parts in spec.values()):
            return spec
    except json.JSONDecodeError:
        pass
    raise ValueError(f"{FORMAT} option startingOffsets must be earliest, latest or JSON like "
                     f'{{"topic": {{"0": 12, "1": -2}}}} (-2 earliest, -1 latest), got {raw!r}')


def _to_json(offsets: Mapping[Tp, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def _from_json(offsets: Mapping[str, Mapping[str, int]]) -> dict[Tp, int]:
    return {(topic, int(p)): int(o) for topic, parts in offsets.items() for p, o in parts.items()}


def _admit(start: Mapping[Tp, int], end: dict[Tp, int], cap: int) -> dict[Tp, int]:
    """Cap the records of a batch at `cap`, shared across partitions in proportion to what each has waiting."""
    waiting = {tp: end[tp] - start[tp] for tp in end if tp in start and end[tp] > start[tp]}
    total = sum(waiting.values())
    if total <= cap:
        return end
    share = {tp: n * cap // total for tp, n in waiting.items()}
    # Floors leave `cap - sum` records over; the largest remainders get one each (each still has one waiting).
    for tp in sorted(waiting, key=lambda tp: (-(waiting[tp] * cap % total), tp))[:cap - sum(share.values())]:
        share[tp] += 1
    return {**end, **{tp: start[tp] + n for tp, n in share.items()}}


def _cap_at(start: Mapping[Tp, int], end: dict[Tp, int], target: Mapping[Tp, int]) -> dict[Tp, int]:
    """Trigger.AvailableNow: go no further than `target`; partitions it does not know stay where they are."""
    return {tp: max(start.get(tp, o), min(o, target.get(tp, start.get(tp, o)))) for tp, o in end.items()}


class _TopicRange(InputPartition):
    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


def _split(ranges: Mapping[Tp, tuple[int, int]], tasks: int, least: int = _MIN_SPLIT) -> list[_TopicRange]:
    """Read tasks for the offset ranges: each range gets its share of `tasks` by size (as minPartitions does in
    Spark's own Kafka source), in pieces of at least `least` offsets that tile the range exactly."""
    total = sum(e - s for s, e in ranges.values())
    pieces = {tp: max(1, min(round((e - s) * tasks / total), (e - s) // least)) for tp, (s, e) in ranges.items()}
    return [_TopicRange(t, p, s + (e - s) * i // n, s + (e - s) * (i + 1) // n)
            for (t, p), (s, e) in sorted(ranges.items()) for n in (pieces[(t, p)],) for i in range(n)]


class KafkaDataSource(DataSource):
    """Options: bootstrap_servers; topics (comma-separated) or pattern (regex, full match over topic names);
    startingOffsets (earliest | latest | JSON, default latest; only for a new checkpoint); maxOffsetsPerTrigger;
    minPartitions (default 2 x cores); group_id (lag monitoring); pollTimeoutMs (120000), retryTimeoutMs (300000)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _KafkaStreamReader(_Options.parse(self.options))


class _KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: _Options) -> None:
        self._opts = options
        self._consumer: KafkaConsumer | None = None  # driver side only: created on first use, never pickled
        self._start: dict[Tp, int] | None = None
        self._latest: dict[Tp, int] = {}
        self._target: dict[Tp, int] | None = None  # Trigger.AvailableNow: what existed when it started
        self._retries, self._unavailable = 0, False
        self._group = GroupOffsets(options.group_id) if options.group_id else None

    # -- driver side ----------------------------------------------------------------------------------------
    def initialOffset(self) -> dict:
        # Spark asks more than once before the first batch (seen: twice); "latest" must not move in between.
        if self._start is None:
            self._start = self._call(self._initial)
        return _to_json(self._start)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self._opts.max_offsets) if self._opts.max_offsets else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._call(lambda c: self._high_watermarks(c, self._discover(c)))

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = _from_json(start)
        # Spark plans a batch once the one before it is done, and calls commit() for that one only when it plans
        # another: `start` is processed, and storing it here keeps an idle topic's group from trailing a batch.
        if self._group is not None:
            self._group.store(begin, self._client, self._close)
        self._latest = end = self._call(lambda c: self._available(c, begin))
        if self._target is not None:
            end = _cap_at(begin, end, self._target)
        if isinstance(limit, ReadMaxRows):
            end = _admit(begin, end, limit.max_rows)
        return _to_json(end)

    def reportLatestOffset(self) -> dict | None:
        return _to_json(self._latest) if self._latest else None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin = _from_json(start)
        return _split({tp: (begin[tp], o) for tp, o in _from_json(end).items() if tp in begin and begin[tp] < o},
                      self._opts.min_partitions)

    def commit(self, end: dict) -> None:
        if self._group is not None:
            self._group.store(_from_json(end), self._client, self._close)

    def stop(self) -> None:
        self._close()

    def _initial(self, consumer: KafkaConsumer) -> dict[Tp, int]:
        present, spec = self._discover(consumer), self._opts.starting
        if spec == "earliest":
            return self._beginnings(consumer, present)
        if spec == "latest":
            return self._high_watermarks(consumer, present)
        assert isinstance(spec, dict)
        wanted = {(t, p): o for (t, p), o in _from_json(spec).items() if self._opts.subscribed(t)}
        if missing := sorted(set(wanted) - present):
            raise KafkaOffsetError(f"startingOffsets names {', '.join(f'{t}-{p}' for t, p in missing)}, which the "
                                   f"broker at {self._opts.bootstrap_servers} does not have: fix startingOffsets")
        first, last = self._beginnings(consumer, present), self._high_watermarks(consumer, present)
        offsets = {tp: {EARLIEST: first[tp], LATEST: last[tp]}.get(o, o) for tp, o in wanted.items()}
        for tp, offset in offsets.items():
            if not first[tp] <= offset <= last[tp]:
                raise KafkaOffsetError(f"startingOffsets puts {tp[0]}-{tp[1]} at {offset}, outside the broker's "
                                       f"range [{first[tp]}, {last[tp]}]: fix startingOffsets")
        return {**first, **offsets}  # partitions the JSON leaves out start at their earliest offset

    def _available(self, consumer: KafkaConsumer, start: Mapping[Tp, int]) -> dict[Tp, int]:
        present = self._discover(consumer)
        ends = self._high_watermarks(consumer, present)
        advice = ("The topic was deleted or recreated, or the broker lost its data; continuing would skip or "
                  "repeat records. Restore the topic, or delete this query's checkpoint to start over from "
                  "startingOffsets.")
        for (topic, p), offset in start.items():
            if not self._opts.subscribed(topic):
                continue  # no longer subscribed: dropped from the offsets
            where = f"Kafka topic-partition {topic}-{p} is at offset {offset} in this query's checkpoint but the broker"
            if (topic, p) not in ends:
                raise KafkaOffsetError(f"{where} no longer has this partition. {advice}")
            if ends[(topic, p)] < offset:
                raise KafkaOffsetError(f"{where}'s end offset is {ends[(topic, p)]}. {advice}")
        if added := sorted(present - set(start)):
            _log.info("kafka.partitions_added", partitions=[f"{t}-{p}" for t, p in added])
            ends.update(self._beginnings(consumer, set(added)))  # read from the next batch on
        return ends

    def _discover(self, consumer: KafkaConsumer) -> set[Tp]:
        topics = [t for t in consumer.topics() if self._opts.subscribed(t)]  # topics() refreshes metadata
        return {(t, p) for t in topics for p in consumer.partitions_for_topic(t)}

    def _beginnings(self, consumer: KafkaConsumer, tps: set[Tp]) -> dict[Tp, int]:
        found = consumer.beginning_offsets([TopicPartition(*tp) for tp in tps], timeout_ms=10_000) if tps else {}
        return {(tp.topic, tp.partition): o for tp, o in found.items()}

    def _high_watermarks(self, consumer: KafkaConsumer, tps: set[Tp]) -> dict[Tp, int]:
        """Fetch from ListOffsets' answer, which is a valid offset, and take the response's high watermark."""
        if not tps:
            return {}
        parts = [TopicPartition(*tp) for tp in sorted(tps)]
        listed = consumer.end_offsets(parts, timeout_ms=10_000)
        consumer.assign([])  # a fresh assignment forgets earlier high watermarks
        consumer.assign(parts)
        for tp in parts:
            consumer.seek(tp, listed[tp])
        deadline = time.monotonic() + 10
        while any(consumer.highwater(tp) is None for tp in parts):
            if time.monotonic() > deadline:
                raise KafkaTimeoutError("no fetch response with a high watermark within 10 s")
            consumer.poll(timeout_ms=100)
        return {(tp.topic, tp.partition): max(listed[tp], consumer.highwater(tp)) for tp in parts}

    def _client(self) -> KafkaConsumer:
        if self._consumer is None:
            # max_partition_fetch_bytes=1: fetches here are for high watermarks, one record batch is plenty.
            # No incremental fetch sessions (KIP-227): in one, the broker leaves a partition whose high watermark
            # did not change out of its answer, and an idle partition's would never come.
            self._consumer = KafkaConsumer(
                bootstrap_servers=self._opts.bootstrap_servers, group_id=self._opts.group_id,
                client_id="lakefeed-kafka-source", enable_auto_commit=False, auto_offset_reset="none",
                allow_auto_create_topics=False, bootstrap_timeout_ms=2000, request_timeout_ms=10_000,
                fetch_max_wait_ms=10, max_partition_fetch_bytes=1, enable_incremental_fetch_sessions=False)
        return self._consumer

    def _close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            try:
                consumer.close(autocommit=False, timeout_ms=2000)
            except Exception as e:  # a broken connection is why we are closing
                _log.debug("kafka.close_failed", error=repr(e))

    def _call(self, step: Callable[[KafkaConsumer], T]) -> T:
        """Run a broker call, retrying transient failures with a fresh client and backoff."""
        def log_retry(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            _log.warning("kafka.retry", bootstrap_servers=self._opts.bootstrap_servers, attempt=state.attempt_number,
                        wait_s=round(state.upcoming_sleep, 2), error=repr(error))
            self._retries += 1
            self._report(unavailable=True, error=repr(error))
            self._close()

        retrying = Retrying(retry=retry_if_exception(_transient), wait=wait_exponential(multiplier=0.2, max=5),
                            stop=stop_after_delay(self._opts.retry_timeout_s), before_sleep=log_retry, reraise=True)
        try:
            result = retrying(lambda: step(self._client()))
            if self._unavailable:
                self._report(unavailable=False, error=None)
            return result
        except KafkaError as e:
            if not _transient(e):
                raise
            raise TransientError(f"Kafka at {self._opts.bootstrap_servers} kept failing for "
                                 f"{self._opts.retry_timeout_s:.0f} s ({e!r}); the query stops. Start it again "
                                 "when the broker is back: it resumes from its checkpoint without loss.") from e

    def _report(self, unavailable: bool, error: str | None) -> None:
        """Tell the daemon (this runs in Spark's planner process) that the broker is away or back."""
        self._unavailable = unavailable
        if self._opts.status_path is None:
            return
        tmp = f"{self._opts.status_path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"unavailable": unavailable, "retries": self._retries, "error": error}, f)
        os.replace(tmp, self._opts.status_path)

    # -- executor side --------------------------------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _TopicRange)
        r = partition
        tp = TopicPartition(r.topic, r.partition)
        consumer = arrow_fetches(KafkaConsumer(
            bootstrap_servers=self._opts.bootstrap_servers, client_id="lakefeed-kafka-read", enable_auto_commit=False,
            auto_offset_reset="none", allow_auto_create_topics=False, max_partition_fetch_bytes=8 << 20,
            fetch_max_bytes=64 << 20), until={tp: r.end})
        try:
            consumer.assign([tp])
            consumer.seek(tp, r.start)
            position, deadline = r.start, time.monotonic() + self._opts.poll_timeout_s
            while position < r.end:
                try:
                    polled = consumer.poll(timeout_ms=500)
                except OffsetOutOfRangeError as e:
                    raise KafkaOffsetError(f"Kafka topic-partition {r.topic}-{r.partition} no longer holds offsets "
                                           f"[{r.start}, {r.end}) (deleted by retention, or the topic was "
                                           "recreated): restore them, or delete this query's checkpoint to start "
                                           "over from startingOffsets") from e
                for chunk in polled.get(tp, ()):
                    # The last batch decoded may run past the range's end.
                    if inside := int(np.searchsorted(chunk.batch.column("offset").to_numpy(), r.end)):
                        yield chunk.batch.slice(0, inside)
                if (now_at := consumer.position(tp)) > position:
                    position, deadline = now_at, time.monotonic() + self._opts.poll_timeout_s
                elif time.monotonic() > deadline:
                    raise TransientError(f"no records from Kafka topic-partition {r.topic}-{r.partition} at offset "
                                         f"{position} (reading up to {r.end}) within pollTimeoutMs "
                                         f"({self._opts.poll_timeout_s:.0f} s): is the broker reachable?")
        finally:
            consumer.close(autocommit=False, timeout_ms=2000)


def _transient(error: BaseException) -> bool:
    return isinstance(error, KafkaError) and (error.retriable or isinstance(error, OffsetOutOfRangeError))

