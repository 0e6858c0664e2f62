"""Bad rows are written where they are found: the stage task writes them as a Parquet file of the quarantine table
and returns only its add action; the commit takes those files in the batch's quarantine transaction, once
(daemon/pipeline/quarantine_files.py). A million bad rows returned as they are were 123 MB of pickled result, past
Spark's maxResultSize at about eight million. Files no commit took (a replay's, a crashed attempt's) are removed.
A file whose values fail to cast here and there is cast in slices, not value by value. Real files, real Delta
tables."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from lakefeed.batch import read
from lakefeed.config import model as config
from lakefeed.inbox.files import FileEvent
from lakefeed.pipeline import keyed, tasks
from tests.conftest import entity_yaml, land, write_config
from tests.test_pipeline import _pipeline, _prepared

GOOD, BAD = 3, 12


def _rows(uri) -> list[dict]:
    return DeltaTable(str(uri)).to_pyarrow_table().to_pylist() if DeltaTable.is_deltatable(str(uri)) else []


def _held(uri) -> tuple[set[str], set[str]]:
    """The quarantine's data files: those its log holds, and those in its folder."""
    in_log = set(DeltaTable(str(uri)).get_add_actions(flatten=True).column("path").to_pylist()
                 if DeltaTable.is_deltatable(str(uri)) else [])
    return in_log, {str(p.relative_to(uri)) for p in Path(uri).rglob("*.parquet")}


@pytest.fixture(params=["append", "upsert"])
def mixed_batch(tmp_path, request, monkeypatch):
    entity = entity_yaml(**({"cdc": {"strategy": "upsert", "primary_key": ["id"]}} if request.param == "upsert"
                            else {}))
    cfg, pipeline, inbox = _prepared(config.load(write_config(tmp_path, [entity])).entities[0])
    root = cfg.source.path / "sales"
    pipeline.process(inbox.offer([FileEvent.of(land(root / "a.csv", "id,amount\n100,1.5\n"))]), 0)
    staged: list[tasks.Staged] = []
    stage = tasks.stage
    monkeypatch.setattr(tasks, "stage", lambda job: staged.extend(out := stage(job)) or out)
    lines = [f"{i},{i}.5" for i in range(GOOD)] + [f"{i},x{i}" for i in range(GOOD, GOOD + BAD)]
    mixed = land(root / "mixed.csv", "id,amount\n" + "\n".join(lines) + "\n")
    return cfg, pipeline, inbox.offer([FileEvent.of(mixed)]), staged, inbox


def _expected_bad() -> list[tuple[int, str]]:
    return [(i + 2, json.dumps({"id": str(i), "amount": f"x{i}"})) for i in range(GOOD, GOOD + BAD)]


def _fail_once(monkeypatch, sink, error: Exception) -> None:
    commit, calls = sink.commit_files, []

    def failing(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            raise error
        return commit(*args, **kwargs)

    monkeypatch.setattr(sink, "commit_files", failing)


def test_the_task_writes_the_bad_rows_and_a_retry_after_the_quarantine_commit_takes_none_twice(mixed_batch,
                                                                                              monkeypatch):
    """The changelog's commit fails once (a store fault) after the quarantine's: the batch is tried again, its
    tasks write the bad rows again, and those files are removed, not committed."""
    cfg, pipeline, batch, staged, _ = mixed_batch
    _fail_once(monkeypatch, pipeline.sinks.changelog, OSError("the store went away"))
    with pytest.raises(OSError, match="the store went away"):
        pipeline.process(batch, 1)
    [mixed] = [s for s in staged if s.location == "sales/mixed.csv"]
    assert mixed.bad == () and mixed.quarantined is not None and mixed.quarantined.rows == BAD  # not returned
    in_log, in_folder = _held(cfg.quarantine)
    assert in_log == in_folder == {f.path for f in mixed.quarantined.files}
    result = pipeline.process(batch, 1)
    assert (result.rows, result.quarantined) == (GOOD, BAD)
    quarantine = _rows(cfg.quarantine)
    assert sorted((r["line"], r["raw"]) for r in quarantine) == _expected_bad()
    assert {r["source_file"] for r in quarantine} == {"sales/mixed.csv"} and {r["batch_id"] for r in quarantine} == {1}
    assert all("is not a valid double" in r["reason"] for r in quarantine)
    assert sorted(r["id"] for r in _rows(cfg.table)) == [0, 1, 2, 100]
    assert _held(cfg.quarantine) == (in_log, in_log)  # the retry's copy is gone
    changelog_log, changelog_folder = _held(cfg.changelog)
    assert changelog_log == changelog_folder  # and the changelog file of the commit that failed
    pipeline.process(batch, 1)  # a replay: nothing twice
    assert len(_rows(cfg.quarantine)) == BAD and len(_rows(cfg.table)) == GOOD + 1


def test_files_of_an_attempt_that_died_before_the_commit_are_removed_by_the_next_start(mixed_batch, monkeypatch):
    cfg, pipeline, batch, _, _ = mixed_batch
    _fail_once(monkeypatch, pipeline.sinks.quarantine, OSError("the store went away"))
    with pytest.raises(OSError, match="the store went away"):
        pipeline.process(batch, 1)
    _, left = _held(cfg.quarantine)
    assert len(left) == 1  # the task's file, in no commit (the quarantine has no table yet)
    restarted = _pipeline(cfg)
    restarted.prepare()
    assert restarted.process(batch, 1).quarantined == BAD
    in_log, in_folder = _held(cfg.quarantine)
    assert in_log == in_folder and not in_log & left and len(_rows(cfg.quarantine)) == BAD


def test_files_of_a_commit_that_failed_are_removed_when_its_retry_commits(mixed_batch, monkeypatch):
    """In the same process, after its first sweep: the batch before had bad rows too."""
    cfg, pipeline, batch, _, inbox = mixed_batch
    assert pipeline.process(batch, 1).quarantined == BAD
    again = inbox.offer([FileEvent.of(land(cfg.source.path / "sales" / "again.csv", "id,amount\n7,x7\n"))])
    _fail_once(monkeypatch, pipeline.sinks.quarantine, OSError("the store went away"))
    with pytest.raises(OSError, match="the store went away"):
        pipeline.process(again, 2)
    in_log, in_folder = _held(cfg.quarantine)
    [left] = in_folder - in_log
    assert pipeline.process(again, 2).quarantined == 1  # the same process tries it again
    in_log, in_folder = _held(cfg.quarantine)
    assert in_log == in_folder and left not in in_log and len(_rows(cfg.quarantine)) == BAD + 1


def test_a_parked_batch_parks_the_bad_rows_its_tasks_wrote_too(mixed_batch, monkeypatch):
    """The quarantine refuses the batch's bad rows (a data fault): the batch is parked, its bad rows with it."""
    cfg, pipeline, batch, _, _ = mixed_batch
    refused = "Schema error: the table refuses this batch"
    _fail_once(monkeypatch, pipeline.sinks.quarantine, Exception(refused))  # delta-rs's refusals are bare
    result = pipeline.process(batch, 1)
    assert (result.rows, result.quarantined) == (0, GOOD + BAD)
    quarantine = _rows(cfg.quarantine)
    assert len(quarantine) == GOOD + BAD
    assert sorted((r["line"], r["raw"]) for r in quarantine if "is not a valid" in r["reason"]) == _expected_bad()
    assert sum(refused in r["reason"] for r in quarantine) == GOOD
    assert sorted(r["id"] for r in _rows(cfg.table)) == [100]
    in_log, in_folder = _held(cfg.quarantine)
    assert in_log == in_folder


def test_a_fused_reduction_done_again_for_a_moved_watermark_leaves_none_of_its_files(tmp_path, monkeypatch):
    """A keyed batch of one task is staged and reduced by it, with the watermark of its start; when the commit finds
    another (a batch of the entity's other stream committed in between), it reduces again, and the late rows the
    first reduction wrote to the quarantine go with it."""
    event_time = {"source": "column", "column": "ts", "allowed_lateness_s": 0, "late_policy": "quarantine"}
    entity = entity_yaml(cdc={"strategy": "upsert", "primary_key": ["id"]}, event_time=event_time)
    cfg, pipeline, inbox = _prepared(config.load(write_config(tmp_path, [entity])).entities[0])
    root = cfg.source.path / "sales"
    first = land(root / "a.csv", "id,ts\n1,2024-01-01T11:00:00Z\n9,never\n")  # the quarantine is swept once here
    assert pipeline.process(inbox.offer([FileEvent.of(first)]), 0).quarantined == 1
    in_one_task, fused = keyed.in_one_task, []

    def later_at_start(*args):  # the task saw a watermark the commit no longer finds
        work, job, what = in_one_task(*args)
        fused.append(job := dataclasses.replace(job, watermark=datetime(2024, 1, 2, tzinfo=UTC)))
        return work, job, what

    monkeypatch.setattr(keyed, "in_one_task", later_at_start)
    late = land(root / "b.csv", "id,ts\n2,2024-01-01T10:00:00Z\n3,2024-01-01T12:00:00Z\n")
    result = pipeline.process(inbox.offer([FileEvent.of(late)]), 1)
    assert len(fused) == 1  # the batch was fused: its task reduced it, both rows late by its watermark
    assert (result.rows, result.late, result.quarantined) == (1, 1, 1)  # by the commit's: 10:00 only
    assert sorted(r["id"] for r in _rows(cfg.table)) == [1, 3]
    late_rows = [json.loads(r["raw"])["id"] for r in _rows(cfg.quarantine) if r["reason"].startswith("late")]
    assert late_rows == ["2"]
    in_log, in_folder = _held(cfg.quarantine)
    assert in_log == in_folder and len(in_log) == 2


def test_one_value_in_a_large_column_that_does_not_cast_is_found_in_slices(monkeypatch):
    n = 200_000
    values = [str(i) for i in range(n)]
    values[123_457] = "oops"
    calls = []
    cast_to = read.cast_to
    monkeypatch.setattr(read, "cast_to", lambda column, to: calls.append(column) or cast_to(column, to))
    out = read.conform(pa.table({"id": values}), pa.schema([("id", pa.int64())]), first_line=2)
    [bad] = out.bad
    assert (bad.line, bad.field, json.loads(bad.raw)) == (123_459, "id", {"id": "oops"})
    assert out.table.column("id").to_pylist() == [i for i in range(n) if i != 123_457]
    assert len(calls) < 200  # not one per value (18 s for a million)
