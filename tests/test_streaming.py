"""The whole path with real Spark, real watchdog events and real Delta tables, in this process."""

from __future__ import annotations

import tempfile
import time
from datetime import timedelta
from pathlib import Path

import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from lakefeed.config import model as config
from lakefeed.connectors.sinks import cdm_manifest
from lakefeed.inbox.files import FileEvent
from lakefeed.ops.metrics import Metrics
from lakefeed.ops.runner import EntityRunner
from lakefeed.pipeline.verify import verify
from tests import cdm_sdk
from tests.cdc_model import Model
from tests.conftest import land, wait_for, write_config
from tests.test_cdc import Lake
from tests.test_cdc import _csv as cdc_csv
from tests.test_cdc import batches as cdc_batches


def _rows(uri) -> int:
    try:
        return DeltaTable(str(uri)).to_pyarrow_table().num_rows
    except Exception:
        return 0


@pytest.fixture
def runner(spark, tmp_path):
    cfg = config.load(write_config(tmp_path))
    r = EntityRunner(spark, cfg.entities[0], cfg.spark.trigger_interval_s, (cfg.lake_dir, cfg.state_dir), Metrics())
    yield r
    r.stop_intake()
    r.stop(time.monotonic() + 30)


def test_files_landing_become_delta_rows_and_manifest_partitions(runner, tmp_path):
    cfg = runner.cfg
    landing = cfg.source.path
    land(landing / "sales/2023/12/old.csv", "id,amount\n0,0.5\n")  # landed while the daemon was down
    runner.start()
    land(landing / "sales/2024/01/a.csv", "id,amount\n1,1.5\n2,2.5\n")
    (landing / "sales").mkdir(exist_ok=True)
    with open(landing / "sales/b.csv", "w") as f:  # written in place: enqueued on close, not on create
        f.write("id,amount\n")
        f.flush()
        f.write("3,3.5\n")
    land(landing / "sales/2024/01/readme.txt", "not data")
    wait_for(lambda: _rows(cfg.table) == 4, what="4 rows in the table")
    entity = wait_for(lambda: _partitions(cfg) if len(_partitions(cfg)) == 3 else None, what="3 partitions")
    assert entity == {"sales/2023/12/old.csv": {"year": ["2023"], "month": ["12"]},
                      "sales/2024/01/a.csv": {"year": ["2024"], "month": ["01"]},
                      "sales/b.csv": {}}
    changelog = DeltaTable(str(cfg.changelog)).to_pyarrow_table()
    assert sorted(changelog["offset"].to_pylist()) == [0, 1, 2, 3]
    assert "sales/2023/12/old.csv" in changelog["source_file"].to_pylist()

    # The manifest lakefeed wrote loads in Microsoft's CDM SDK with the same partitions.
    sdk, doc = cdm_sdk.partitions(landing)
    assert {loc: args for (loc, _), args in sdk["sales"].items()} == entity
    assert doc.last_file_status_check_time is not None and doc.last_child_file_modified_time is not None
    # ... and the entity schema document lakefeed wrote for the entity it declared resolves there too.
    attributes = wait_for(lambda: (landing / "sales.cdm.json").exists()) and \
        cdm_sdk.entity_attributes(landing, "sales.cdm.json/sales")
    assert [(n, f.split(".")[-1].upper()) for n, f in attributes] == [
        ("id", "INT64"), ("amount", "DOUBLE"), ("year", "STRING"), ("month", "STRING")]


def test_a_file_batch_whose_records_the_inbox_fails_to_give_is_tried_again(runner, monkeypatch):
    """The batch's records are read from the inbox in the batch's work: a read that fails (an I/O error) is tried
    again as a store's fault is, said in the log; the batch is taken then, the query still running."""
    read, failed = runner._cursor.records, []

    def flaky(start: int, end: int):
        if not failed and end > start:  # a batch with records (the query's first may have none)
            failed.append((start, end))
            raise OSError(5, "Input/output error")
        return read(start, end)

    monkeypatch.setattr(runner._cursor, "records", flaky)
    with capture_logs() as logs:
        runner.start()
        land(runner.cfg.source.path / "sales/a.csv", "id,amount\n1,1.5\n2,2.5\n")
        wait_for(lambda: _rows(runner.cfg.table) == 2, what="2 rows in the table")
    assert failed == [(0, 1)] and runner.queries["files"].isActive
    retried = [e for e in logs if e["event"] == "batch.retrying"]
    assert len(retried) == 1 and "Input/output error" in retried[0]["error"] and retried[0]["stream"] == "files"


def _partitions(cfg):
    try:
        entity = cdm_manifest.find_entity(cdm_manifest.load(cfg.manifest), cfg.name) or {}
    except (FileNotFoundError, ValueError):
        return {}
    out = {}
    for p in entity.get("dataPartitions") or ():
        args = {}
        for a in p.get("arguments", []):
            args.setdefault(a["name"], []).append(a["value"])
        out[p["location"]] = args
    return out


def test_keyed_entity_through_spark_matches_the_changes(spark, tmp_path):
    """Random upserts and deletes with sequences, landed while the query runs: the state is exactly the
    newest change per key, and the changelog replays to it."""
    import random

    from tests.conftest import entity_yaml

    entity = entity_yaml(cdc={"strategy": "upsert_and_delete", "primary_key": ["id"], "sequence_by": ["seq"],
                              "history": True},
                         source={"type": "local_dir", "path": "landing", "reconcile_interval_s": 1,
                                 "max_files_per_trigger": 3})
    cfg = config.load(write_config(tmp_path, [entity]))
    runner = EntityRunner(spark, cfg.entities[0], 0.2, (cfg.lake_dir, cfg.state_dir), Metrics())
    rng = random.Random(7)
    expected: dict[int, tuple[str, int]] = {}
    latest: dict[int, int] = {}
    runner.start()
    try:
        for n in range(12):
            lines = []
            for _ in range(5):
                key, seq, value = rng.randrange(8), rng.randrange(100), rng.choice("abc")
                delete = rng.random() < 0.2
                lines.append(f"{key},{value},{seq},{str(delete).lower()}\n")
                if seq >= latest.get(key, -1):  # newest sequence wins; ties go to the later arrival
                    latest[key] = seq
                    if delete:
                        expected.pop(key, None)
                    else:
                        expected[key] = (value, seq)
            land(cfg.entities[0].source.path / "sales" / f"c{n:02d}.csv", "id,v,seq,IsDelete\n" + "".join(lines))
        table = cfg.entities[0].table
        wait_for(lambda: _keyed(table) == expected, 60, 0.2, "the newest change of every key")
        wait_for(lambda: len(_partitions(cfg.entities[0])) == 12, 30, what="12 partitions in the manifest")
    finally:
        runner.stop_intake()
        runner.stop(time.monotonic() + 30)
    assert verify(cfg.entities[0]) == []


def _keyed(table) -> dict:
    try:
        rows = DeltaTable(str(table)).to_pyarrow_table().to_pylist()
    except Exception:
        return {}
    return {r["id"]: (r["v"], r["seq"]) for r in rows}


@pytest.mark.parametrize("strategy", ["snapshot", "upsert_and_delete", "changelog", "update"])
@settings(max_examples=3, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=cdc_batches, late_policy=st.sampled_from(["apply", "quarantine"]))
def test_cdc_model_through_a_spark_query(spark, strategy, data, late_policy):
    """The reference model again, now through a real streaming query: each generated batch is put in the
    inbox at once and the query is driven with processAllAvailable, so Spark's batches are the model's."""
    model = Model(strategy, sequence=("seq",), update_of_absent="insert", event_time="et",
                  lateness=timedelta(minutes=2), late_policy=late_policy)
    with tempfile.TemporaryDirectory() as tmp:
        lake = Lake(Path(tmp), {"strategy": strategy, "primary_key": ["k"], "sequence_by": ["seq"]},
                    {"source": "column", "column": "et", "allowed_lateness_s": 120, "late_policy": late_policy},
                    pattern="/_*.csv", prepare=False)  # names the source leaves alone: the test makes the batches
        runner = EntityRunner(spark, lake.cfg, 0.2, (lake.cfg.table.parent.parent, lake.cfg.state.parent),
                              Metrics())
        runner.start()
        try:
            for n, files in enumerate(data):
                paths = [land(lake.cfg.source.path / "data" / f"_b{n}_f{i}.csv", cdc_csv(rows))
                         for i, rows in enumerate(files)]
                runner.inbox.offer([FileEvent.of(p) for p in paths])  # one append: one Spark batch
                runner.queries["files"].processAllAvailable()
                model.apply_batch(files)
                assert lake.state() == model.state
        finally:
            runner.stop_intake()
            runner.stop(time.monotonic() + 30)
        assert lake.changelog() == model.changelog
        assert lake.quarantined() == model.quarantined
        assert verify(lake.cfg) == []


def test_a_batchs_range_in_the_offsets_log_is_what_its_frame_holds_also_when_run_again(spark, tmp_path):
    """The daemon reads a file batch's records from the range Spark's offsets log gives the batch, not from its frame:
    a real query on the inbox source, batches capped at 3 records, one failing once (the query stops after its
    offsets were logged) and run again by the restarted query: each batch's range is its frame's records."""
    from lakefeed.connectors.streams.inbox_stream import FORMAT
    from lakefeed.inbox.files import Inbox, InboxCursor
    from lakefeed.ops.offsets_log import batch_range, committed_offset

    inbox, checkpoint, seen, failed = Inbox(tmp_path / "inbox"), tmp_path / "checkpoint", [], []
    inbox.offer([FileEvent(f"/l/{i}.csv", i, i) for i in range(8)])

    def batch(frame, batch_id: int) -> None:
        offsets = sorted(row.offset for row in frame.collect())
        seen.append((batch_id, batch_range(checkpoint, batch_id), offsets))
        if batch_id == 1 and not failed:
            failed.append(batch_id)
            raise RuntimeError("the batch fails once")

    def run(until) -> None:
        query = (spark.readStream.format(FORMAT).option("path", str(tmp_path / "inbox"))
                 .option("maxFilesPerTrigger", "3").load().writeStream.foreachBatch(batch)
                 .option("checkpointLocation", str(checkpoint)).trigger(processingTime="100 milliseconds").start())
        wait_for(lambda: not query.isActive or until(), 120, 0.1, "the query's batches")
        query.stop()
        assert (query.exception() is not None) == (len(seen) == 2)  # the first run stops at the batch that fails

    run(lambda: False)
    assert committed_offset(checkpoint) == 3 and [b for b, _, _ in seen] == [0, 1]
    inbox.offer([FileEvent("/l/late.csv", 9, 9)])
    run(lambda: committed_offset(checkpoint) == 9)
    assert [b for b, _, _ in seen] == [0, 1, 1, 2]
    cursor = InboxCursor(tmp_path / "inbox")
    for _, (start, end), offsets in seen:
        assert offsets == list(range(start, end))
        assert [r.offset for r in cursor.records(start, end)] == offsets
    assert committed_offset(checkpoint) == 9
    inbox.close()
