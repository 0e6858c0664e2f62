"""The Kafka streaming source against real brokers (tansu, or LAKEFEED_TEST_KAFKA; and Apache Kafka) and real
Spark."""

from __future__ import annotations

import base64
import json
import os
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka import KafkaConsumer, TopicPartition
from pyspark.sql.datasource import ReadAllAvailable
from pyspark.sql.pandas.types import to_arrow_schema

from lakefeed.connectors.sources.kafka_records import ARROW_SCHEMA
from lakefeed.connectors.sources.kafka_source import (
    _MIN_SPLIT,
    FORMAT,
    KafkaDataSource,
    _admit,
    _Options,
    _split,
)
from lakefeed.errors import TransientError
from tests.conftest import wait_for
from tests.kafka_broker import EXTERNAL_ENV, ApacheKafka, Broker, cluster_id, free_port

Row = tuple[str, int, int, Any]  # topic, partition, offset, decoded value


class Run:
    """A streaming query over the Kafka source whose foreachBatch keeps each batch's rows."""

    def __init__(self, spark, checkpoint: Path, trigger: dict[str, Any] | None = None, **options: str) -> None:
        self.batches: list[list[Row]] = []
        reader = spark.readStream.format(FORMAT)
        for key, value in options.items():
            reader = reader.option(key, value)
        self.query = (reader.load().writeStream.foreachBatch(self._collect)
                      .option("checkpointLocation", str(checkpoint))
                      .trigger(**(trigger or {"processingTime": "0.3 seconds"})).start())

    def _collect(self, frame, batch_id: int) -> None:
        table = frame.select("topic", "partition", "offset", "value").toArrow()
        if table.num_rows:
            self.batches.append([(t, p, o, json.loads(v)) for t, p, o, v in zip(*table.to_pydict().values(),
                                                                                   strict=True)])

    @property
    def rows(self) -> list[Row]:
        return [row for batch in self.batches for row in batch]

    def wait_rows(self, n: int, timeout: float = 60) -> list[Row]:
        def done() -> bool:
            if self.query.exception() is not None:
                raise AssertionError(f"query failed: {self.query.exception()}")
            return len(self.rows) >= n
        wait_for(done, timeout, 0.05, f"{n} rows")
        return self.rows

    def stop(self) -> None:
        self.query.stop()


@pytest.fixture(scope="module", params=["tansu", "apache-kafka"])
def kafka_broker(request, tmp_path_factory):
    """Each test that takes it runs on tansu (or LAKEFEED_TEST_KAFKA) and on Apache Kafka: they differ where a
    client can tell (tests/kafka_broker.py)."""
    folder = tmp_path_factory.mktemp(request.param)
    broker = (Broker(folder / "tansu.log", external=os.environ.get(EXTERNAL_ENV)) if request.param == "tansu"
              else ApacheKafka(folder))
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="module")
def kspark(spark):
    spark.dataSource.register(KafkaDataSource)
    return spark


@pytest.fixture
def runs():
    started: list[Run] = []
    yield started
    for run in started:
        run.stop()


@pytest.fixture
def own_broker(tmp_path):
    """A tansu broker of the test's own (it gets stopped and restarted, losing its topics), on a free port, not
    started yet — also when LAKEFEED_TEST_KAFKA points the other tests at a real Kafka."""
    broker = Broker(tmp_path / "tansu.log", port=free_port())
    yield broker
    broker.stop()


def topic_name() -> str:
    return f"t_{uuid.uuid4().hex[:10]}"


def expected(metadata, values) -> list[Row]:
    return sorted((m.topic, m.partition, m.offset, v) for m, v in zip(metadata, values, strict=True))


def test_every_message_once_across_a_restart_and_lag_committed_to_the_group(kspark, kafka_broker, runs, tmp_path):
    topic = kafka_broker.create_topic(topic_name(), 3)
    first = [{"n": i} for i in range(30)]
    sent = kafka_broker.produce(topic, first)
    options = {"bootstrap_servers": kafka_broker.bootstrap, "topics": topic, "startingOffsets": "earliest",
               "group_id": f"lag_{topic}"}
    runs.append(run := Run(kspark, tmp_path / "ckpt", **options))
    assert sorted(run.wait_rows(30)) == expected(sent, first)
    sent += kafka_broker.produce(topic, first[:3])
    assert sorted(run.wait_rows(33)) == expected(sent, first + first[:3])
    # Spark tells the source a batch is done (commit()) only when it plans the next one, which an idle topic never
    # needs: the source stores each trigger's start, so the group does not trail by the last batch.
    lag = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, group_id=f"lag_{topic}", enable_auto_commit=False)
    parts = [TopicPartition(topic, p) for p in range(3)]
    wait_for(lambda: [lag.committed(tp) for tp in parts] == [11, 11, 11], 30, 0.2, "group offsets")
    lag.close()
    run.stop()

    second = [{"n": i} for i in range(30, 45)]
    more = kafka_broker.produce(topic, second)
    runs.append(again := Run(kspark, tmp_path / "ckpt", **options))
    assert sorted(again.wait_rows(15)) == expected(more, second)  # only the new ones, none of the first 33


def test_a_group_commit_that_failed_is_stored_at_the_next_trigger(kafka_broker, monkeypatch):
    """The group's offsets are for lag monitoring: a failed commit (here the coordinator refuses it once) is logged,
    never raised, and stored at the next trigger though no batch came in between."""
    from kafka.errors import CommitFailedError
    from structlog.testing import capture_logs

    topic = kafka_broker.create_topic(topic_name(), 2)
    kafka_broker.produce(topic, [{"n": i} for i in range(6)])
    group = f"retry_{topic}"
    reader = KafkaDataSource({"bootstrap_servers": kafka_broker.bootstrap, "topics": topic, "group_id": group,
                              "startingOffsets": "earliest"}).streamReader(None)  # type: ignore[arg-type]
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {topic: {"0": 3, "1": 3}}
    refused = []

    def refuse(self, offsets, **kwargs):
        refused.append(offsets)
        raise CommitFailedError("the group is rebalancing")

    with capture_logs() as logs:
        with monkeypatch.context() as patch:
            patch.setattr(KafkaConsumer, "commit", refuse)
            reader.commit(end)  # Spark: the batch [start, end) is done
        assert len(refused) == 1 and [e["event"] for e in logs] == ["kafka.group_commit_failed"]
        assert reader.latestOffset(end, ReadAllAvailable()) == end  # the next trigger: nothing new
    assert [e["event"] for e in logs] == ["kafka.group_commit_failed", "kafka.group_committed"]
    lag = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, group_id=group, enable_auto_commit=False)
    assert [lag.committed(TopicPartition(topic, p)) for p in range(2)] == [3, 3]
    lag.close()
    reader.stop()


def test_the_end_of_an_idle_topic_is_found_at_once_trigger_after_trigger(kafka_broker, tmp_path):
    """Nothing new arrives between triggers (one partition never had a record): each trigger must still learn
    every partition's end on its first try. In an incremental fetch session Apache Kafka leaves partitions whose
    high watermark did not change out of its answers; the source used to wait 10 s for them, then retry."""
    topic = kafka_broker.create_topic(topic_name(), 3)
    kafka_broker.produce(topic, [{"n": i} for i in range(20)], partition=0)
    kafka_broker.produce(topic, [{"n": i} for i in range(7)], partition=1)
    status = tmp_path / "status.json"  # written only when a broker call had to be retried
    reader = KafkaDataSource({"bootstrap_servers": kafka_broker.bootstrap, "topics": topic,
                              "startingOffsets": "earliest", "statusPath": str(status)}).streamReader(None)  # type: ignore[arg-type]
    start = reader.initialOffset()
    assert start == {topic: {"0": 0, "1": 0, "2": 0}}
    for _ in range(4):
        assert reader.latestOffset(start, ReadAllAvailable()) == {topic: {"0": 20, "1": 7, "2": 0}}
    kafka_broker.produce(topic, [{"n": 20}], partition=0)
    assert reader.latestOffset(start, ReadAllAvailable()) == {topic: {"0": 21, "1": 7, "2": 0}}
    assert not status.exists()
    reader.stop()


def test_max_offsets_per_trigger_caps_every_batch(kspark, kafka_broker, runs, tmp_path):
    topic = kafka_broker.create_topic(topic_name(), 3)
    values = [{"n": i} for i in range(50)]
    sent = kafka_broker.produce(topic, values[:40]) + kafka_broker.produce(topic, values[40:], partition=0)
    options = {"bootstrap_servers": kafka_broker.bootstrap, "topics": topic, "startingOffsets": "earliest",
               "maxOffsetsPerTrigger": "12"}
    runs.append(run := Run(kspark, tmp_path / "a", **options))
    assert sorted(run.wait_rows(50)) == expected(sent, values)
    assert [len(b) for b in run.batches] == [12, 12, 12, 12, 2]
    first_batch = {p: sum(1 for _, q, _, _ in run.batches[0] if q == p) for p in range(3)}
    assert first_batch == {0: 6, 1: 3, 2: 3}  # in proportion to what each partition had (24, 13, 13)

    # Trigger.AvailableNow honours the cap too and stops once it has what existed when it started.
    runs.append(now := Run(kspark, tmp_path / "b", trigger={"availableNow": True}, **options))
    now.query.awaitTermination(60)
    assert now.query.exception() is None
    assert sorted(now.rows) == expected(sent, values) and [len(b) for b in now.batches] == [12, 12, 12, 12, 2]


def test_starting_offsets_latest_and_per_partition_json(kspark, kafka_broker, runs, tmp_path):
    topic = kafka_broker.create_topic(topic_name(), 2)
    old = kafka_broker.produce(topic, [{"n": i} for i in range(10)])
    runs.append(latest := Run(kspark, tmp_path / "latest", bootstrap_servers=kafka_broker.bootstrap, topics=topic))
    wait_for(lambda: latest.query.lastProgress, 60, 0.05, "the first trigger")  # the start offsets are fixed
    new = kafka_broker.produce(topic, [{"n": i} for i in range(10, 14)])
    assert sorted(latest.wait_rows(4)) == expected(new, [{"n": i} for i in range(10, 14)])

    spec = json.dumps({topic: {"0": 3, "1": -2}})
    runs.append(exact := Run(kspark, tmp_path / "json", trigger={"availableNow": True},
                             bootstrap_servers=kafka_broker.bootstrap, topics=topic, startingOffsets=spec))
    exact.query.awaitTermination(60)
    assert exact.query.exception() is None
    everything = old + new
    assert sorted((t, p, o) for t, p, o, _ in exact.rows) == sorted(
        (m.topic, m.partition, m.offset) for m in everything if m.partition == 1 or m.offset >= 3)


def test_topics_created_later_that_match_the_pattern_are_read_from_earliest(kspark, kafka_broker, runs, tmp_path):
    # tansu does not implement CreatePartitions, so new partitions are exercised as new topics of a pattern:
    # both are "a partition the offsets do not know yet" to the source.
    prefix = topic_name()
    first = kafka_broker.create_topic(f"{prefix}_a", 1)
    a = kafka_broker.produce(first, [{"n": i} for i in range(5)])
    runs.append(run := Run(kspark, tmp_path / "ckpt", bootstrap_servers=kafka_broker.bootstrap,
                           pattern=f"{prefix}_.*", startingOffsets="latest"))
    wait_for(lambda: run.query.lastProgress, 60, 0.05, "the first trigger")
    kafka_broker.create_topic(f"{prefix}_b", 2)
    kafka_broker.create_topic(f"other_{prefix}", 1)  # does not match
    b = kafka_broker.produce(f"{prefix}_b", [{"n": i} for i in range(8)])
    kafka_broker.produce(f"other_{prefix}", [{"n": 0}])
    assert sorted(run.wait_rows(8)) == expected(b, [{"n": i} for i in range(8)])  # all of it: from earliest
    assert not any(t == first for t, *_ in run.rows) and len(a) == 5  # "latest" skipped what came before


def test_partitions_added_to_a_topic_the_query_reads_are_read_from_earliest(kspark, own_broker, runs, tmp_path):
    # tansu has no CreatePartitions and keeps topics in memory only; so the topic is made again, with three
    # partitions, while the query is stopped (a running one's metadata requests make tansu create it again
    # with one, whatever the client asks), and partition 0 is filled up to the offset in the checkpoint.
    # To the query, that is its topic grown from one partition to three, partition 0 where it left it.
    own_broker.start()
    topic = own_broker.create_topic(topic_name(), 1)
    before = own_broker.produce(topic, [{"n": i} for i in range(5)])
    options = {"bootstrap_servers": own_broker.bootstrap, "topics": topic, "startingOffsets": "earliest"}
    runs.append(run := Run(kspark, tmp_path / "ckpt", **options))
    assert sorted(run.wait_rows(5)) == expected(before, [{"n": i} for i in range(5)])
    # Stopped before its commit, the batch would run again on restart, from the offsets the source gives then.
    wait_for(lambda: (tmp_path / "ckpt" / "commits" / "0").exists(), 30, 0.05, "the batch's commit")
    run.stop()
    own_broker.stop()
    own_broker.start()
    own_broker.create_topic(topic, 3)
    own_broker.produce(topic, [{"n": -1}] * 5, partition=0)  # offsets 0-4, which the checkpoint has read
    sent = own_broker.produce(topic, [{"n": i} for i in range(5, 35)])
    assert {m.partition for m in sent} == {0, 1, 2}
    runs.append(again := Run(kspark, tmp_path / "ckpt", **options))
    assert sorted(again.wait_rows(30)) == expected(sent, [{"n": i} for i in range(5, 35)])


def test_broker_that_lost_its_data_fails_the_query_with_what_to_do(kspark, own_broker, runs, tmp_path):
    own_broker.start()
    topic = own_broker.create_topic(topic_name(), 2)
    own_broker.produce(topic, [{"n": i} for i in range(20)])
    options = {"bootstrap_servers": own_broker.bootstrap, "topics": topic, "startingOffsets": "earliest"}
    runs.append(run := Run(kspark, tmp_path / "ckpt", **options))
    run.wait_rows(20)
    own_broker.stop()
    wait_for(lambda: run.query.status["isTriggerActive"], 10, 0.05, "a trigger retrying the broker")
    own_broker.start()  # tansu keeps topics in memory only: the topic is gone
    own_broker.create_topic(topic, 2)
    own_broker.produce(topic, [{"n": 0}, {"n": 1}])  # end offset 1 per partition, the checkpoint has 10
    # Depending on whether the source looks before or after the topic is recreated, the partition is missing
    # or its end offset is below the checkpoint: either way the query stops and says what to do.
    wait_for(lambda: run.query.exception() is not None, 60, 0.1, "the query to fail")
    message = str(run.query.exception())
    assert "KafkaOffsetError" in message and f"Kafka topic-partition {topic}-" in message
    assert "is at offset 10 in this query's checkpoint but the broker" in message
    assert "delete this query's checkpoint to start over" in message

    runs.append(again := Run(kspark, tmp_path / "ckpt", **options))  # the recreated topic is there now
    wait_for(lambda: again.query.exception() is not None, 60, 0.1, "the restarted query to fail")
    message = str(again.query.exception())
    assert "KafkaOffsetError" in message and "in this query's checkpoint but the broker's end offset is 1." in message
    assert again.rows == []


def test_broker_unreachable_at_start_is_retried_and_nothing_is_lost(kspark, own_broker, runs, tmp_path):
    runs.append(run := Run(kspark, tmp_path / "ckpt", bootstrap_servers=own_broker.bootstrap, pattern="late_.*",
                           startingOffsets="earliest"))
    wait_for(lambda: run.query.status["isTriggerActive"], 60, 0.05, "the first trigger reaching for the broker")
    time.sleep(3)  # the outage itself: longer than one bootstrap attempt (2 s), so the source must retry
    assert run.query.exception() is None
    own_broker.start()
    topic = own_broker.create_topic(f"late_{topic_name()}", 2)
    values = [{"n": i} for i in range(12)]
    sent = own_broker.produce(topic, values)
    assert sorted(run.wait_rows(12, timeout=60)) == expected(sent, values)


def test_a_broker_gone_longer_than_retry_timeout_stops_with_a_transient_error():
    source = KafkaDataSource({"bootstrap_servers": f"127.0.0.1:{free_port()}", "topics": "t", "retryTimeoutMs": "1500"})
    with pytest.raises(TransientError, match="kept failing for .* resumes from its checkpoint without loss"):
        source.streamReader(None).initialOffset()  # type: ignore[arg-type]


def test_key_headers_and_timestamp_come_through(kspark, kafka_broker, tmp_path):
    topic = kafka_broker.create_topic(topic_name(), 1)
    before = datetime.now(UTC).replace(microsecond=0)
    kafka_broker.produce(topic, [{"n": 1}], key=b"k1", headers=[("source", b"test"), ("empty", b"")])
    kafka_broker.produce(topic, [{"n": 2}])
    after = datetime.now(UTC)
    got: list[dict[str, Any]] = []
    query = (kspark.readStream.format(FORMAT).option("bootstrap_servers", kafka_broker.bootstrap)
             .option("topics", topic).option("startingOffsets", "earliest").load()
             .writeStream.foreachBatch(lambda frame, _: got.extend(frame.toArrow().to_pylist()))
             .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    query.awaitTermination(60)
    assert query.exception() is None
    one, two = sorted(got, key=lambda r: r["offset"])
    assert (one["key"], one["headers"]) == (b"k1", [{"key": "source", "value": b"test"},
                                                   {"key": "empty", "value": b""}])
    assert (two["key"], two["headers"], json.loads(two["value"])) == (None, None, {"n": 2})
    assert before <= one["timestamp"].astimezone(UTC) <= after


def test_the_test_brokers_cluster_ids_never_read_as_an_option():
    # 1 in 64 random ids began with "-", and StorageTool then refused to format (the fixture's 10 errors of a CI run)
    ids = {cluster_id() for _ in range(5_000)}
    assert len(ids) == 5_000 and not any(cluster.startswith("-") for cluster in ids)
    assert all(len(base64.urlsafe_b64decode(cluster + "==")) == 16 for cluster in ids)


def test_arrow_schema_is_what_spark_expects(kspark):
    spark_schema = kspark.createDataFrame([], KafkaDataSource({}).schema()).schema
    assert to_arrow_schema(spark_schema, timezone="UTC").equals(ARROW_SCHEMA)


def test_admission_shares_the_cap_in_proportion_and_exactly():
    start = {("t", 0): 0, ("t", 1): 10, ("t", 2): 5}
    end = {("t", 0): 100, ("t", 1): 20, ("t", 2): 5, ("u", 0): 7}  # ("u", 0) is new: it enters at its start
    capped = _admit(start, end, 11)
    assert capped == {("t", 0): 10, ("t", 1): 11, ("t", 2): 5, ("u", 0): 7}
    assert sum(capped[tp] - start[tp] for tp in start) == 11
    assert _admit(start, end, 1000) == end
    assert _admit(start, end, 1)[("t", 0)] == 1


def test_a_large_range_of_one_partition_is_read_by_several_tasks_every_offset_once(kspark, kafka_broker, tmp_path):
    topic = kafka_broker.create_topic(topic_name(), 1)
    n = 2 * _MIN_SPLIT + 123  # two pieces: smaller ones are not worth a consumer each
    kafka_broker.produce(topic, [{"n": i} for i in range(n)], partition=0)
    batches: list[tuple[int, list[int]]] = []

    def collect(frame, _) -> None:
        tasks = frame.rdd.getNumPartitions()
        table = frame.select("offset", "value").toArrow()
        assert [json.loads(v)["n"] for v in table.column("value").to_pylist()] == table.column("offset").to_pylist()
        batches.append((tasks, table.column("offset").to_pylist()))

    query = (kspark.readStream.format(FORMAT).option("bootstrap_servers", kafka_broker.bootstrap)
             .option("topics", topic).option("startingOffsets", "earliest").option("minPartitions", "4").load()
             .writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert query.exception() is None
    assert [tasks for tasks, _ in batches] == [2]
    assert batches[0][1] == list(range(n))  # each offset once, in order


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_pieces_of_a_range_read_exactly_their_offsets_also_from_inside_a_record_batch(kafka_broker, compression):
    """A fetch answers from the start of the record batch holding the offset asked for (and a compressed batch is
    decompressed whole): each piece must still get exactly its offsets, with their keys, headers and values."""
    topic = kafka_broker.create_topic(topic_name(), 1)
    kafka_broker.produce(topic, [{"n": i} for i in range(150)], partition=0, compression=compression)
    kafka_broker.produce(topic, [{"n": i} for i in range(150, 300)], partition=0, key=b"k",
                         headers=[("h", b"v")], compression=compression)
    reader = KafkaDataSource({"bootstrap_servers": kafka_broker.bootstrap, "topics": topic}).streamReader(None)  # type: ignore[arg-type]
    pieces = _split({(topic, 0): (5, 297)}, 7, least=1)
    assert len(pieces) == 7
    got = []
    for piece in pieces:
        rows = [row for batch in reader.read(piece) for row in batch.to_pylist()]
        assert [r["offset"] for r in rows] == list(range(piece.start, piece.end))
        assert all(json.loads(r["value"]) == {"n": r["offset"]} for r in rows)
        assert all((r["key"], r["headers"]) == ((b"k", [{"key": "h", "value": b"v"}]) if r["offset"] >= 150
                                                else (None, None)) for r in rows)
        got += [r["offset"] for r in rows]
    assert got == list(range(5, 297))


@given(sizes=st.lists(st.integers(1, 400), min_size=1, max_size=6), starts=st.lists(st.integers(0, 10**6), min_size=6,
                                                                                      max_size=6),
       tasks=st.integers(1, 16), least=st.integers(1, 100))
@settings(max_examples=300, deadline=None)
def test_split_tiles_every_range_exactly_in_pieces_no_smaller_than_least(sizes, starts, tasks, least):
    ranges = {("t", p): (starts[p], starts[p] + size) for p, size in enumerate(sizes)}
    pieces = _split(ranges, tasks, least)
    for tp, (start, end) in ranges.items():
        mine = [(r.start, r.end) for r in pieces if (r.topic, r.partition) == tp]
        assert mine[0][0] == start and mine[-1][1] == end
        assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(mine, mine[1:], strict=False))
        assert len(mine) == 1 or all(e - s >= least for s, e in mine)


def test_split_keeps_one_task_per_partition_when_there_are_enough():
    four = {("t", p): (0, 125_000) for p in range(4)}
    assert [(r.partition, r.start, r.end) for r in _split(four, 4)] == [(p, 0, 125_000) for p in range(4)]
    one = _split({("t", 0): (0, 500_000)}, 4)
    assert [(r.start, r.end) for r in one] == [(0, 125_000), (125_000, 250_000), (250_000, 375_000),
                                               (375_000, 500_000)]
    assert len(_split({("t", 0): (0, _MIN_SPLIT + 1)}, 4)) == 1  # too small to be worth a second consumer


@pytest.mark.parametrize(("options", "fix"), [
    ({"topics": "t"}, "needs option bootstrap_servers"),
    ({"bootstrap_servers": "b:9092"}, "exactly one of the options topics"),
    ({"bootstrap_servers": "b:9092", "topics": "t", "pattern": "t.*"}, "exactly one of the options topics"),
    ({"bootstrap_servers": "b:9092", "pattern": "("}, "not a valid regular expression"),
    ({"bootstrap_servers": "b:9092", "topics": "t", "startingOffsets": '{"t": {"0": "x"}}'}, "-2 earliest"),
    ({"bootstrap_servers": "b:9092", "topics": "t", "maxOffsetsPerTrigger": "0"}, "positive integer"),
    ({"bootstrap_servers": "b:9092", "topics": "t", "minPartitions": "x"}, "positive integer"),
])
def test_options_are_validated_with_what_to_fix(options, fix):
    with pytest.raises(ValueError, match=fix):
        _Options.parse(options)
