"""Bad rows past `tasks.SPILL_ROWS` stay out of a task's result: the task stages them, and the commit reads them
into the quarantine (a million bad rows were 123 MB of pickled result, past Spark's maxResultSize at about eight
million). A file whose values fail to cast here and there is cast in slices, not value by value. Real files, real
Delta tables."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from lakefeed.batch import read
from lakefeed.config import model as config
from lakefeed.inbox.files import FileEvent
from lakefeed.pipeline import tasks
from tests.conftest import entity_yaml, land, write_config
from tests.test_pipeline import _prepared

GOOD, BAD = 3, 12


def _rows(uri) -> list[dict]:
    return DeltaTable(str(uri)).to_pyarrow_table().to_pylist() if DeltaTable.is_deltatable(str(uri)) else []


@pytest.fixture(params=["append", "upsert"])
def spilling(tmp_path, request, monkeypatch):
    entity = entity_yaml(**({"cdc": {"strategy": "upsert", "primary_key": ["id"]}} if request.param == "upsert"
                            else {}))
    cfg, pipeline, inbox = _prepared(config.load(write_config(tmp_path, [entity])).entities[0])
    root = cfg.source.path / "sales"
    pipeline.process(inbox.offer([FileEvent.of(land(root / "a.csv", "id,amount\n100,1.5\n"))]), 0)
    monkeypatch.setattr(tasks, "SPILL_ROWS", 5)
    staged: list[tasks.Staged] = []
    stage = tasks.stage
    monkeypatch.setattr(tasks, "stage", lambda job: staged.extend(out := stage(job)) or out)
    lines = [f"{i},{i}.5" for i in range(GOOD)] + [f"{i},x{i}" for i in range(GOOD, GOOD + BAD)]
    mixed = land(root / "mixed.csv", "id,amount\n" + "\n".join(lines) + "\n")
    return cfg, pipeline, inbox.offer([FileEvent.of(mixed)]), staged


def _expected_bad() -> list[tuple[int, str]]:
    return [(i + 2, json.dumps({"id": str(i), "amount": f"x{i}"})) for i in range(GOOD, GOOD + BAD)]


def test_many_bad_rows_are_staged_by_the_task_and_quarantined_by_the_commit_once(spilling):
    cfg, pipeline, batch, staged = spilling
    result = pipeline.process(batch, 1)
    assert (result.rows, result.quarantined) == (GOOD, BAD)
    [mixed] = [s for s in staged if s.location == "sales/mixed.csv"]
    assert mixed.bad == () and mixed.spilled is not None  # not in the task's result
    quarantine = _rows(cfg.quarantine)
    assert sorted((r["line"], r["raw"]) for r in quarantine) == _expected_bad()
    assert {r["source_file"] for r in quarantine} == {"sales/mixed.csv"}
    assert all("is not a valid double" in r["reason"] for r in quarantine)
    assert sorted(r["id"] for r in _rows(cfg.table)) == [0, 1, 2, 100]
    pipeline.process(batch, 1)  # a replay: nothing twice
    assert len(_rows(cfg.quarantine)) == BAD and len(_rows(cfg.table)) == GOOD + 1


def test_a_parked_batch_parks_the_bad_rows_its_tasks_staged_too(spilling, monkeypatch):
    """The quarantine refuses the batch's bad rows (a data fault): the batch is parked, its bad rows with it."""
    cfg, pipeline, batch, _ = spilling
    refused = "Schema error: the table refuses this batch"
    append, calls = pipeline.sinks.quarantine.append, []

    def refuse_once(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            raise Exception(refused)  # noqa: TRY002 - delta-rs raises its schema refusals as bare Exceptions
        return append(*args, **kwargs)

    monkeypatch.setattr(pipeline.sinks.quarantine, "append", refuse_once)
    result = pipeline.process(batch, 1)
    assert (result.rows, result.quarantined) == (0, GOOD + BAD)
    quarantine = _rows(cfg.quarantine)
    assert len(quarantine) == GOOD + BAD
    assert sorted((r["line"], r["raw"]) for r in quarantine if "is not a valid" in r["reason"]) == _expected_bad()
    assert sum(refused in r["reason"] for r in quarantine) == GOOD
    assert sorted(r["id"] for r in _rows(cfg.table)) == [100]


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
