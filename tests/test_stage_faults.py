"""A unit of a batch (a landed file, a push frame, a part of a Kafka batch) that fails to stage for a data fault no
check foresaw is quarantined with the reason, and the batch's other units commit: no replay meets the fault again,
so nothing acknowledged after it is left stuck. A bug (lakefeed's own fault) still stops the batch, parking nothing.
Real files, real spools, real Delta tables; the fault is injected where the rows are worked on."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError
from deltalake import DeltaTable

from lakefeed.batch import cdc, file_rows, frames
from lakefeed.config import model as config
from lakefeed.connectors.sinks import data_files
from lakefeed.inbox.files import FileEvent, Inbox, InboxReader
from lakefeed.inbox.spool import Pending, Spool, SpoolReader, encode
from lakefeed.intake.push_api import token_hash
from lakefeed.pipeline import staged_files, tasks, unstaged
from lakefeed.pipeline.entity import EntityPipeline
from lakefeed.pipeline.sinks import Sinks
from lakefeed.pipeline.verdict import store_fault
from tests.conftest import land, write_config


def _pipeline(cfg: config.EntityConfig, stream: str = config.FILES) -> EntityPipeline:
    checkpoint = cfg.stream_checkpoint(stream)
    checkpoint.mkdir(parents=True)
    (checkpoint / "metadata").write_text(json.dumps({"id": "q-1"}))
    pipeline = EntityPipeline(cfg, Sinks.of(cfg))
    pipeline.prepare()
    return pipeline


def _rows(uri) -> list[dict]:
    return DeltaTable(str(uri)).to_pyarrow_table().to_pylist() if DeltaTable.is_deltatable(str(uri)) else []


def _failing_for(original, marker: str, exc: Exception):
    """`original`, which raises `exc` for rows holding `marker` (a data fault the checks did not foresee)."""
    def work(*args, **kwargs):
        tables = [t for a in args for t in (a if isinstance(a, list | tuple) else [a]) if isinstance(t, pa.Table)]
        if any(marker in str(t.to_pylist()) for t in tables):
            raise exc
        return original(*args, **kwargs)
    return work


@pytest.fixture
def files(tmp_path):
    cfg = config.load(write_config(tmp_path)).entities[0]
    return cfg, _pipeline(cfg), Inbox(cfg.state / "inbox")


def test_a_file_that_fails_to_stage_is_quarantined_by_name_and_the_others_commit(files, monkeypatch):
    cfg, pipeline, inbox = files
    root = cfg.source.path
    paths = [land(root / "sales" / f"{n}.csv", f"id,note\n{i},{n}\n") for i, n in enumerate(("a", "poison", "c"))]
    monkeypatch.setattr(file_rows, "with_arguments", _failing_for(file_rows.with_arguments, "poison",
                                                                  pa.ArrowInvalid("no column can hold this value")))
    result = pipeline.process(inbox.offer([FileEvent.of(p) for p in paths]), 0)
    assert (result.files, result.rows, result.quarantined) == (3, 2, 1)
    assert sorted(r["note"] for r in _rows(cfg.table)) == ["a", "c"]
    [parked] = _rows(cfg.quarantine)
    assert parked["source_file"] == "sales/poison.csv" and parked["raw"] == ""
    assert "could not be staged (ArrowInvalid: no column can hold this value)" in parked["reason"]
    assert "land it again" in parked["reason"]
    monkeypatch.undo()
    again = land(root / "sales" / "poison2.csv", "id,note\n9,poison\n")  # mended: it lands
    pipeline.process(inbox.offer([FileEvent.of(again)]), 1)
    assert sorted(r["note"] for r in _rows(cfg.table)) == ["a", "c", "poison"]


@pytest.mark.parametrize("fault", [
    AttributeError("'NoneType' object has no attribute 'x'"),  # a bug: the entity stops with it
    ClientError({"Error": {"Code": "InternalError", "Message": "We encountered an internal error"}}, "GetObject"),
    EndpointConnectionError(endpoint_url="http://127.0.0.1:9")])  # the store's: retried
def test_a_bug_or_a_store_fault_while_staging_fails_the_batch_and_parks_nothing(files, monkeypatch, fault):
    cfg, pipeline, inbox = files
    records = inbox.offer([FileEvent.of(land(cfg.source.path / "sales" / "a.csv", "id\n1\n"))])
    monkeypatch.setattr(file_rows, "with_arguments", _failing_for(file_rows.with_arguments, "1", fault))
    with pytest.raises(type(fault)):
        pipeline.process(records, 0)
    assert store_fault(fault) == (not isinstance(fault, AttributeError))
    assert _rows(cfg.quarantine) == [] and _rows(cfg.table) == []
    monkeypatch.undo()
    pipeline.process(records, 0)  # replayed once the code is right
    assert [r["id"] for r in _rows(cfg.table)] == [1]


def test_a_write_the_single_task_fails_is_made_again_by_the_commit_which_parks_the_batch(files, monkeypatch):
    """A batch of one file is staged and written by one task: a data fault in that write falls back to staging
    alone, and the commit, writing it again, parks the rows in quarantine (the table refused them)."""
    cfg, pipeline, inbox = files
    records = inbox.offer([FileEvent.of(land(cfg.source.path / "sales" / "a.csv", "id,note\n1,x\n2,y\n"))])
    monkeypatch.setattr(data_files, "write", _failing_for(data_files.write, "'x'", pa.ArrowNotImplementedError(
        "Unhandled type for Arrow to Parquet schema conversion")))
    result = pipeline.process(records, 0)
    assert (result.rows, result.quarantined) == (0, 2)
    parked = _rows(cfg.quarantine)
    assert sorted(json.loads(p["raw"])["note"] for p in parked) == ["x", "y"]
    assert all("ArrowNotImplementedError" in p["reason"] for p in parked)
    monkeypatch.undo()
    later = land(cfg.source.path / "sales" / "b.csv", "id,note\n3,z\n")
    pipeline.process(inbox.offer([FileEvent.of(later)]), 1)
    assert [r["note"] for r in _rows(cfg.table)] == ["z"]


@pytest.fixture
def pushed(tmp_path):
    entity = {"name": "orders", "push": [{"name": "api", "tokens_sha256": [token_hash("t")]}]}
    cfg = config.load(write_config(tmp_path, [entity])).entities[0]
    pipeline = _pipeline(cfg, "api")
    spool = Spool(cfg.spool("api"), segment_bytes=1 << 20, ttl_s=3600)
    yield cfg, pipeline, spool
    spool.close()


def _push(spool: Spool, *tables: pa.Table) -> None:
    for table in tables:
        spool.append([Pending(encode(table), table.num_rows, None, None)])


def _ingest(cfg, pipeline: EntityPipeline, start: int, batch_id: int) -> int:
    reader = SpoolReader(cfg.spool("api"))
    end = reader.refresh()
    pipeline.process_frames("api", reader.entries(start, end), batch_id)
    return end


def test_a_frame_that_fails_to_stage_is_quarantined_row_by_row_and_the_others_commit(pushed, monkeypatch):
    cfg, pipeline, spool = pushed
    _push(spool, pa.table({"id": [1, 2]}), pa.table({"id": [666, 667]}), pa.table({"id": [3]}))
    monkeypatch.setattr(frames, "_group", _failing_for(frames._group, "666", pa.ArrowInvalid("cannot hold 666")))
    end = _ingest(cfg, pipeline, 0, 0)
    assert sorted(r["id"] for r in _rows(cfg.table)) == [1, 2, 3]
    parked = _rows(cfg.quarantine)
    assert sorted(json.loads(p["raw"])["id"] for p in parked) == ["666", "667"]
    assert {p["source_file"] for p in parked} == {"push/api/1"}
    assert all("could not be staged (ArrowInvalid: cannot hold 666)" in p["reason"] for p in parked)
    monkeypatch.undo()
    _push(spool, pa.table({"id": [4]}))
    _ingest(cfg, pipeline, end, 1)
    assert sorted(r["id"] for r in _rows(cfg.table)) == [1, 2, 3, 4]


def test_a_damaged_frame_is_quarantined_as_its_bytes_and_the_stream_goes_on(pushed):
    """A frame whose bytes no longer match its CRC reads the same on every try: a store fault would hold the
    stream for ever. Its bytes go to quarantine (base64), and the frames around it commit."""
    cfg, pipeline, spool = pushed
    _push(spool, pa.table({"id": [1]}), pa.table({"id": [2]}), pa.table({"id": [3]}))
    entry = SpoolReader(cfg.spool("api")).entries(0, 3)[1]
    with open(cfg.spool("api") / entry.segment, "r+b") as f:
        f.seek(entry.position + entry.length - 8)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    damaged = (cfg.spool("api") / entry.segment).read_bytes()[entry.position:entry.position + entry.length]
    _ingest(cfg, pipeline, 0, 0)
    assert sorted(r["id"] for r in _rows(cfg.table)) == [1, 3]
    [parked] = _rows(cfg.quarantine)
    assert parked["source_file"] == "push/api/1" and "DamagedFrame" in parked["reason"]
    assert "its CRC does not match" in parked["reason"] and base64.b64decode(parked["raw"]) == damaged


def _messages(*values: bytes | None) -> pa.Table:
    n = len(values)
    return pa.table({"key": pa.array([None] * n, pa.binary()), "value": pa.array(values, pa.binary()),
                     "topic": ["t"] * n, "partition": pa.array([0] * n, pa.int32()),
                     "offset": pa.array(range(n), pa.int64()), "timestamp": pa.array([0] * n, pa.timestamp("us")),
                     "timestampType": pa.array([0] * n, pa.int32())})


def _counted(original, calls: list):
    def work(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)
    return work


def test_a_run_of_one_frame_that_fails_to_stage_is_staged_once(pushed, monkeypatch):
    cfg, pipeline, spool = pushed
    _push(spool, pa.table({"id": [666, 667]}))
    monkeypatch.setattr(frames, "_group", _failing_for(frames._group, "666", pa.ArrowInvalid("cannot hold 666")))
    calls: list = []
    monkeypatch.setattr(frames, "rows_of", _counted(frames.rows_of, calls))
    _ingest(cfg, pipeline, 0, 0)
    assert len(calls) == 1
    assert sorted(json.loads(p["raw"])["id"] for p in _rows(cfg.quarantine)) == ["666", "667"]


def _kafka(tmp_path, **entity) -> config.EntityConfig:
    kafka = [{"name": "k", "bootstrap_servers": "127.0.0.1:9", "topics": ["t"]}]
    return config.load(write_config(tmp_path, [{"name": "events", "kafka": kafka, **entity}])).entities[0]


def _part(n: int, poison: int, tombstone: int) -> pa.Table:
    """`n` messages, one `{"id": 666}` at `poison`, a tombstone at `tombstone`, the others `{"id": <offset>}`."""
    return _messages(*(b'{"id": 666}' if i == poison else None if i == tombstone else b'{"id": %d}' % i
                       for i in range(n)))


def test_only_the_kafka_message_at_fault_is_quarantined_and_the_rest_of_its_part_commits(tmp_path, monkeypatch):
    cfg = _kafka(tmp_path)
    pipeline = _pipeline(cfg, "k")
    calls: list = []
    failing = _failing_for(tasks.conform, "666", pa.ArrowInvalid("cannot hold 666"))
    monkeypatch.setattr(tasks, "conform", _counted(failing, calls))
    result = pipeline.process_messages("k", tasks.Here(_part(64, 37, 5)), 0)
    good = [i for i in range(64) if i not in (5, 37)]
    assert (result.files, result.rows, result.quarantined) == (64, 62, 1)
    assert [(r["id"], r["kafka_offset"]) for r in _rows(cfg.table)] == [(i, i) for i in good]
    assert [r["source_file"] for r in _rows(cfg.changelog)] == [f"kafka/t/0/{i}" for i in good]
    [parked] = _rows(cfg.quarantine)
    assert (parked["source_file"], parked["line"], parked["raw"]) == ("kafka/t/0", 37, '{"id": 666}')
    assert "could not be staged (ArrowInvalid: cannot hold 666); the message was not applied" in parked["reason"]
    assert len(calls) <= 2 + 2 * 6  # halving: the part, two pieces a level (64 = 2**6), the part without it
    monkeypatch.undo()
    pipeline.process_messages("k", tasks.Here(_messages(b'{"id": 100}')), 1)
    assert sorted(r["id"] for r in _rows(cfg.table)) == [*good, 100]


def test_a_kafka_part_of_one_message_at_fault_is_decoded_once(tmp_path, monkeypatch):
    cfg = _kafka(tmp_path)
    calls: list = []
    monkeypatch.setattr(tasks, "conform", _counted(_failing_for(tasks.conform, "666", pa.ArrowInvalid("no")), calls))
    result = _pipeline(cfg, "k").process_messages("k", tasks.Here(_messages(b'{"id": 666}')), 0)
    assert (result.rows, result.quarantined, len(calls)) == (0, 1, 1)


def test_a_part_with_too_many_messages_at_fault_to_try_each_quarantines_the_pieces_they_are_in(tmp_path,
                                                                                                monkeypatch):
    cfg = _kafka(tmp_path)
    pipeline = _pipeline(cfg, "k")
    monkeypatch.setattr(unstaged, "_TRIES", 6)  # two rounds: halves, then quarters
    monkeypatch.setattr(tasks, "conform", _failing_for(tasks.conform, "666", pa.ArrowInvalid("cannot hold 666")))
    values = [b'{"id": 666}' if i in (2, 13) else b'{"id": %d}' % i for i in range(16)]
    result = pipeline.process_messages("k", tasks.Here(_messages(*values)), 0)
    assert (result.rows, result.quarantined) == (8, 8)
    assert [r["kafka_offset"] for r in _rows(cfg.table)] == list(range(4, 12))
    parked = sorted(_rows(cfg.quarantine), key=lambda p: p["line"])
    assert [p["line"] for p in parked] == [0, 1, 2, 3, 12, 13, 14, 15]
    assert all(p["reason"].endswith("the message was not applied, nor the 3 beside it: too many messages of its "
                                    "part failed for each to be tried alone") for p in parked)


def _staged_rows(cfg: config.EntityConfig, staged: tasks.Staged) -> list[pa.Table | None]:
    return [tasks.read_staged(cfg, path) if path else None for path in staged.buckets]


@pytest.mark.parametrize("target", [None, pa.schema([("id", pa.int64()), ("v", pa.string())])])
def test_a_keyed_part_staged_without_its_message_at_fault_is_a_clean_part_without_it(tmp_path, monkeypatch, target):
    """The same rows, types, order and tags (numbered within the part, for the reduction to order the batch) as
    the part staged as if the message at fault had never been sent."""
    cfg = _kafka(tmp_path, cdc={"strategy": "upsert", "primary_key": ["id"]})
    values = [b'{"id": %d, "v": "%s"}' % (i % 7, b"x" * i) for i in range(50)]
    values[21], values[8] = b'{"id": 666, "v": "bad"}', None
    batch = _messages(*values)
    checked_at = datetime.now(UTC)

    def staged(rows: pa.Table, where: str) -> tasks.StagedMessages:
        staging = staged_files.folder(str(tmp_path / where), "token", 1)  # named as the daemon names it
        return tasks.stage_messages(tasks.MessagesJob(cfg, "k", target, checked_at, None, staging, 3), rows, 2)

    clean = staged(batch.filter(pa.array([i != 21 for i in range(50)])), "clean")
    monkeypatch.setattr(tasks, "conform", _failing_for(tasks.conform, "666", pa.ArrowInvalid("cannot hold 666")))
    faulty = staged(batch, "faulty")
    assert (faulty.messages, faulty.tombstones, faulty.ends) == (50, 1, {"t": {"0": 50}})
    assert faulty.staged.rows == clean.staged.rows == 48 and faulty.staged.schema == clean.staged.schema
    assert _staged_rows(cfg, faulty.staged) == _staged_rows(cfg, clean.staged)
    [written] = faulty.staged.quarantined.files  # by the task, in the quarantine's folder
    bad = pq.read_table(f"{cfg.quarantine}/{written.path}").select(["source_file", "line"]).to_pylist()
    assert [(row["source_file"], row["line"]) for row in bad] == [("kafka/t/0", 21)]
    tags = pa.concat_tables(t for t in _staged_rows(cfg, faulty.staged) if t is not None).column(cdc.ORDER)
    assert sorted(tags.to_pylist()) == list(range(48))


def _data_fault_then(fault: Exception):
    """`conform`, which raises a data fault for rows holding 666, and `fault` for that row alone."""
    original = tasks.conform

    def work(table, *args, **kwargs):
        if "666" in str(table.to_pylist()):
            raise fault if table.num_rows == 1 else pa.ArrowInvalid("cannot hold 666")
        return original(table, *args, **kwargs)
    return work


@pytest.mark.parametrize("fault", [AttributeError("'NoneType' object has no attribute 'x'"),
                                   EndpointConnectionError(endpoint_url="http://127.0.0.1:9")])
@pytest.mark.parametrize("halving", [False, True])
def test_a_bug_or_a_store_fault_in_a_kafka_part_fails_the_batch_and_parks_nothing(tmp_path, monkeypatch, fault,
                                                                                   halving):
    """From the start, or met while the part is halved to find the messages at fault."""
    cfg = _kafka(tmp_path)
    pipeline = _pipeline(cfg, "k")
    work = _data_fault_then(fault) if halving else _failing_for(tasks.conform, "666", fault)
    monkeypatch.setattr(tasks, "conform", work)
    with pytest.raises(type(fault)):
        pipeline.process_messages("k", tasks.Here(_part(16, 11, 3)), 0)
    assert _rows(cfg.quarantine) == [] and _rows(cfg.table) == []


def test_a_damaged_inbox_line_is_passed_over_and_the_files_around_it_commit(files):
    cfg, pipeline, inbox = files
    a, b = (land(cfg.source.path / "sales" / f"{n}.csv", f"id\n{i}\n") for i, n in enumerate("ab"))
    inbox.offer([FileEvent.of(a)])
    with open(inbox.path, "ab") as f:
        f.write(b"\x00\x00\x00 a line the disk damaged\n")
    inbox = Inbox(cfg.state / "inbox")
    inbox.offer([FileEvent.of(b)])
    records = InboxReader(cfg.state / "inbox").records(0, 3)
    result = pipeline.process(records, 0)
    assert (result.files, result.unmatched) == (2, 1) and sorted(r["id"] for r in _rows(cfg.table)) == [0, 1]
