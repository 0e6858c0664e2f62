"""An input whose reader crashes the process (a C library's segfault, a worker the kernel kills for memory) must not
stand a stream still: a real daemon on local Spark, the task's Python worker SIGKILLed each time it reaches the
input (`poison:` failpoint), as such an input would. The unit is quarantined with the reason, the rest of its batch
and everything after it commit, and the daemon stays up. Before, Spark's "Python worker exited unexpectedly"
counted as a store fault and the batch was tried again for ever."""

from __future__ import annotations

import base64
import json
import signal
from datetime import UTC, datetime
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from lakefeed.config import model as config_module
from lakefeed.inbox import spool
from lakefeed.intake.push_api import token_hash
from lakefeed.pipeline import poison, staged_files, tasks
from lakefeed.pipeline.verify import verify
from tests.conftest import entity_yaml, land, wait_for, write_config
from tests.kafka_broker import kafka_broker  # noqa: F401 - a fixture
from tests.test_daemon_process import Daemon
from tests.test_push_daemon import TOKEN, _post, _url
from tests.test_stage_faults import _kafka, _messages


def _rows(table) -> list[dict]:
    return DeltaTable(str(table)).to_pyarrow_table().to_pylist() if DeltaTable.is_deltatable(str(table)) else []


@pytest.mark.parametrize("master", ["local[2]", "local-cluster[2,1,1024]"])  # on a cluster, Spark tries a task 4 times
def test_a_landed_file_the_reader_dies_on_is_quarantined_and_its_batch_commits(tmp_path, master):
    config = write_config(tmp_path, [entity_yaml()], spark={"master": master, "trigger_interval_s": 0.3})
    landing = tmp_path / "landing" / "sales"
    for n, name in enumerate(("a", "poison", "c")):  # one batch: they are there before the start
        land(landing / f"{name}.csv", f"id,note\n{n},{name}\n")
    cfg = config_module.load(config).entities[0]
    with Daemon(config, tmp_path / "daemon.log") as daemon:
        daemon.start(env={"LAKEFEED_FAILPOINT": "poison:stage.file:poison"})
        wait_for(lambda: len(_rows(cfg.table)) == 2, 120, what="the batch's other files committed")
        [parked] = wait_for(lambda: _rows(cfg.quarantine), 30, what="the file quarantined")
        assert parked["source_file"] == "sales/poison.csv" and parked["raw"] == ""
        assert "the task staging it died each time, alone too" in parked["reason"]
        assert "Python worker exited unexpectedly" in parked["reason"]
        assert sorted(r["note"] for r in _rows(cfg.table)) == ["a", "c"]
        land(landing / "d.csv", "id,note\n3,d\n")  # the stream goes on
        wait_for(lambda: len(_rows(cfg.table)) == 3, 60, what="a later file committed")
        assert daemon.events("batch.task_died") >= 1 and daemon.events("file.unstaged") == 1
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(90) == 0


@pytest.mark.parametrize("strategy", ["append", "upsert"])
def test_a_push_frame_the_decoder_dies_on_is_quarantined_as_acknowledged(tmp_path, strategy):
    """Upsert: a batch of a few frames is one task that stages and reduces them (keyed.in_one_task); it dies too,
    and the batch is staged as any other."""
    entity = {"name": "events", "push": [{"name": "api", "tokens_sha256": [token_hash(TOKEN)]}]}
    if strategy == "upsert":
        entity["cdc"] = {"strategy": "upsert", "primary_key": ["id"]}
    config = write_config(tmp_path, [entity], spark={"master": "local[2]", "trigger_interval_s": 2.0})
    cfg = config_module.load(config).entities[0]
    with Daemon(config, tmp_path / "daemon.log") as daemon:
        daemon.start(env={"LAKEFEED_FAILPOINT": "poison:stage.frame:poison"})
        url = wait_for(lambda: _url(tmp_path), 60, what="the push API")
        _post(url, [{"id": 0, "v": "first"}], key="warm", starting_for=60)
        wait_for(lambda: len(_rows(cfg.table)) == 1, 60, what="the first push committed")
        # Three frames within one trigger interval: one batch.
        _post(url, [{"id": 1, "v": "a"}], key="k-1")
        poison = _post(url, [{"id": 2, "v": "b"}, {"id": 3, "v": "c"}], key="poison-1")
        _post(url, [{"id": 4, "v": "d"}], key="k-3")
        wait_for(lambda: len(_rows(cfg.table)) == 3, 120, what="the batch's other frames committed")
        [parked] = wait_for(lambda: _rows(cfg.quarantine), 30, what="the frame quarantined")
        assert parked["source_file"] == f"push/api/{poison['batch']}"
        assert "the task staging it died each time, alone too" in parked["reason"]
        frame = base64.b64decode(parked["raw"])  # the frame as acknowledged, not decoded: decoding it crashes
        _, head, body, _ = spool._HEAD.unpack_from(frame)
        acknowledged = pa.ipc.open_stream(frame[spool._HEAD.size + head:]).read_all()
        assert acknowledged.num_rows == 2 and acknowledged.to_pylist()[0]["v"] == "b"
        assert sorted(r["v"] for r in _rows(cfg.table)) == ["a", "d", "first"]
        _post(url, [{"id": 5, "v": "e"}], key="k-4")  # the stream goes on
        wait_for(lambda: len(_rows(cfg.table)) == 4, 60, what="a later push committed")
        assert daemon.events("batch.task_died") >= 1 and daemon.events("frame.unstaged") == 1
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(90) == 0


@pytest.mark.parametrize("master", ["local[2]", "local-cluster[2,1,1024]"])  # on a cluster, Spark tries a task 4 times
def test_a_kafka_message_the_decoder_dies_on_is_quarantined_as_sent(tmp_path, kafka_broker, master):  # noqa: F811
    """One topic into an append and an upsert entity. The first batch (no table yet: one part) and a later one (a
    part per topic-partition) each hold a message whose task dies each time; it is found by halving its part's
    offset range and quarantined as its value, and every other message lands once, in order: the upsert entity
    keeps the change of key 1 sent after the poison message, not the one before it. Without the search, the
    first batch was tried again for ever."""
    topic = kafka_broker.create_topic(f"poisoned-{master.split('[')[0]}", 2)  # the broker is the session's
    source = [{"name": "topic", "bootstrap_servers": kafka_broker.bootstrap, "topics": [topic]}]
    entities = [{"name": "orders", "kafka": source},
                {"name": "latest", "cdc": {"strategy": "upsert", "primary_key": ["id"]}, "kafka": source}]
    config = write_config(tmp_path, entities, spark={"master": master, "trigger_interval_s": 1.0})
    patience = 60 if master.startswith("local[") else 300  # each task tried 4 times, a Python worker started each time
    orders, latest = config_module.load(config).entities
    first = [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}, {"id": 3, "v": "poison-1"}]  # there before the start
    kafka_broker.produce(topic, first, partition=0)
    kafka_broker.produce(topic, [{"id": 4, "v": "d"}], partition=1)
    with Daemon(config, tmp_path / "daemon.log") as daemon:
        daemon.start(env={"LAKEFEED_FAILPOINT": "poison:stage.message:poison"})
        wait_for(lambda: len(_rows(orders.table)) == 3 and len(_rows(latest.table)) == 3, patience,
                 what="the first batch's other messages")
        later = [{"id": 1, "v": "a2"}, {"id": 5, "v": "e"}, {"id": 6, "v": "poison-2"}, {"id": 1, "v": "a3"},
                 {"id": 7, "v": "g"}]
        kafka_broker.produce(topic, [{"id": 8, "v": "h"}], partition=0)
        poison = kafka_broker.produce(topic, later, partition=1)[2]  # the second part's task dies
        wait_for(lambda: len(_rows(orders.table)) == 8 and len(_rows(latest.table)) == 6, patience,
                 what="the later batch's other messages")
        kafka_broker.produce(topic, [{"id": 9, "v": "i"}], partition=0)  # the stream goes on past both
        wait_for(lambda: len(_rows(orders.table)) == 9 and len(_rows(latest.table)) == 7, patience,
                 what="a later message")
        assert daemon.events("batch.task_died") >= 4 and daemon.events("message.unstaged") == 4
        daemon.stop()
    assert sorted(r["v"] for r in _rows(orders.table)) == ["a", "a2", "a3", "b", "d", "e", "g", "h", "i"]
    assert {r["id"]: r["v"] for r in _rows(latest.table)} == {1: "a3", 2: "b", 4: "d", 5: "e", 7: "g", 8: "h", 9: "i"}
    for cfg in (orders, latest):
        parked = sorted(_rows(cfg.quarantine), key=lambda r: (r["source_file"], r["line"]))
        assert [(r["source_file"], r["line"]) for r in parked] == [(f"kafka/{topic}/0", 2),
                                                                   (f"kafka/{topic}/1", poison.offset)]
        assert [json.loads(base64.b64decode(r["raw"])) for r in parked] == [first[2], later[2]]  # as sent
        assert all("the task decoding it died each time, alone too" in r["reason"]
                   and "Python worker exited unexpectedly" in r["reason"] for r in parked)
        assert verify(cfg) == []


class _Batch:
    """A Kafka batch's parts in this process, as `poison.Pieces`: a job whose task holds a message `dies` on fails as
    Spark fails it; `jobs` logs every job run. Its work is not run: a part's outcome is its messages' coordinates."""

    def __init__(self, parts: list[list[tuple]], dies, jobs: list[str] | None = None) -> None:
        self.parts, self.dies, self.jobs = parts, dies, [] if jobs is None else jobs

    def map(self, work, whole: bool, description: str) -> list:
        self.jobs.append(description)
        parts = [[m for part in self.parts for m in part]] if whole else self.parts
        if getattr(work, "func", None) is poison.as_sent:  # base64 only: no task dies on it
            return [("as sent", [m[:3] for m in part]) for part in parts if part]
        for task, part in enumerate(parts):
            if self.dies(part):
                raise RuntimeError(f"Job aborted due to stage failure: Task {task} in stage 4.0 failed 1 times, most "
                                   f"recent failure: Lost task {task}.0 in stage 4.0 (TID 9) (localhost executor "
                                   "driver): org.apache.spark.SparkException: Python worker exited unexpectedly "
                                   "(crashed). Consider setting 'spark.sql.execution.pyspark.udf.faulthandler.enabled'")
        return [[m[:3] for m in part] for part in parts if part]

    def ranges(self, part: int | None) -> list[tuple]:
        self.jobs.append("ranges")
        messages = [m for p in self.parts for m in p] if part is None else self.parts[part]
        tps = sorted({m[:2] for m in messages})
        return [(*tp, min(m[2] for m in messages if m[:2] == tp), max(m[2] for m in messages if m[:2] == tp))
                for tp in tps]

    def only(self, topic: str, partition: int, first: int, last: int) -> _Batch:
        return _Batch([[m for p in self.parts for m in p if m[:2] == (topic, partition) and first <= m[2] <= last]],
                      self.dies, self.jobs)

    def without(self, ranges) -> _Batch:
        return _Batch([[m for m in p if not any(m[:2] == r[:2] and r[2] <= m[2] <= r[3] for r in ranges)]
                       for p in self.parts], self.dies, self.jobs)

    def value(self, topic: str, partition: int, offset: int) -> bytes | None:
        self.jobs.append("value")
        return next(m[3] for p in self.parts for m in p if m[:3] == (topic, partition, offset))


_JOB = SimpleNamespace(cfg=SimpleNamespace(name="orders"), stream="topic")


def _poisoned(part: list[tuple]) -> bool:
    return any(b"poison" in m[3] for m in part)


def _parts(poisoned: set[int], size: int = 1000) -> list[list[tuple]]:
    return [[("t", 0, o, b"poison" if o in poisoned else b"{}") for o in range(size)],
            [("t", 1, o, b"{}") for o in range(10)]]


@pytest.mark.parametrize("whole", [False, True])
def test_the_messages_a_kafka_task_dies_on_are_found_by_halving(whole):
    batch = _Batch(_parts({637, 901}), _poisoned)
    outs = poison.messages(batch, _JOB, whole, "batch 7")
    *staged, first, second = outs
    assert sorted(m for part in staged for m in part) == sorted(
        m[:3] for part in _parts(set()) for m in part if m[:3] not in {("t", 0, 637), ("t", 0, 901)})
    for out, offset in ((first, 637), (second, 901)):
        assert out.messages == 1 and out.ends == {"t": {"0": offset + 1}}  # the stream moves past it
        [(location, row)] = out.staged.bad
        assert (location, row.line, base64.b64decode(row.raw)) == ("kafka/t/0", offset, b"poison")
        assert "Python worker exited unexpectedly (crashed)" in row.reason and "Consider" not in row.reason
    # For each: a range, a job per halving of 1,000 offsets (and one for the other topic-partition, in one part),
    # its value and the batch again; and the first job.
    assert len(batch.jobs) <= 1 + 2 * (1 + 1 + 10 + 2 + 1)


def test_a_death_no_message_brings_back_alone_quarantines_nothing():
    crowded = _Batch(_parts(set()), lambda part: len(part) > 100)  # memory short only for many messages together
    with pytest.raises(RuntimeError, match="Python worker exited unexpectedly"):
        poison.messages(crowded, _JOB, False, "batch 7")
    once = iter([True])  # an executor lost once
    flaky = _Batch(_parts(set()), lambda part: next(once, False))
    assert [len(part) for part in poison.messages(flaky, _JOB, False, "batch 7")] == [1000, 10]


@pytest.mark.parametrize("cap", [30, 3, 0])
def test_the_jobs_spent_on_dying_messages_are_bounded_and_then_the_suspects_go_as_sent(monkeypatch, cap):
    """Past the cap, the ranges a message the task dies on may still be in are quarantined as sent (by tasks), and
    the batch goes on: before, it failed, was tried again with a new cap, and failed again, for ever."""
    monkeypatch.setattr(poison, "_JOBS", cap)
    poisoned = {100, 200, 300}
    batch = _Batch(_parts(poisoned), _poisoned)
    outs = poison.messages(batch, _JOB, False, "batch 7")
    decoded = [m for out in outs if isinstance(out, list) for m in out]
    found = [out.staged.bad[0][1].line for out in outs if isinstance(out, poison.StagedMessages)]
    as_sent = [m for out in outs if isinstance(out, tuple) for m in out[1]]
    everything = sorted(m[:3] for part in _parts(set()) for m in part)
    assert sorted(decoded + [("t", 0, o) for o in found] + as_sent) == everything  # each message once
    assert not poisoned & {m[2] for m in decoded}  # none the task dies on was decoded
    assert len(found) == len(set(found)) and set(found) <= poisoned
    assert len(found) < len(poisoned) and as_sent  # the cap was reached, and then the rest went as sent
    searching = [job for job in batch.jobs if job.endswith(("apart", "ranges"))]
    assert len(searching) <= cap + 5  # the cap, and a ranges job each time the search looks at a part again


def test_messages_quarantined_as_sent_are_written_by_their_task_as_they_were_sent(tmp_path):
    """`as_sent` on a real piece: every value base64 in one quarantine file (a tombstone has none to keep), every
    offset counted, so that the stream moves past them."""
    cfg = _kafka(tmp_path)
    values = [b'{"id": 1}', b"\xff\x00 not json", None, b'{"id": 4}']
    staging = staged_files.folder(str(tmp_path / "staging"), "token", 3)
    job = tasks.MessagesJob(cfg, "k", None, datetime.now(UTC), None, staging)
    out = poison.as_sent(job, "the search gave up", _messages(*values), 1)
    assert (out.messages, out.tombstones, out.ends, out.staged.rows) == (4, 1, {"t": {"0": 4}}, 0)
    [written] = out.staged.quarantined.files
    rows = pq.read_table(f"{cfg.quarantine}/{written.path}").to_pylist()
    assert [(r["source_file"], r["line"], base64.b64decode(r["raw"])) for r in rows] == [
        ("kafka/t/0", 0, values[0]), ("kafka/t/0", 1, values[1]), ("kafka/t/0", 3, values[3])]
    assert all(r["reason"].startswith("the search gave up; raw: the message's value, base64") for r in rows)
