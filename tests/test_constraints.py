"""A table's constraints and the files lakefeed's tasks write: rows that break one set apart, nothing lost.

The commit adds files the tasks wrote, where Delta would check rows as it writes them (connectors/sinks/constraints.py);
the tasks check them (daemon/batch/checks.py, against Spark in tests/test_checks.py). Real Delta tables (delta-rs), the
pipeline as the daemon builds it, and a daemon process that quarantines the rows a CHECK refuses, stops the entity on
one it cannot evaluate and starts it again by itself once that is dropped.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import given, settings
from hypothesis import strategies as st

from lakefeed.batch import cdc, checks
from lakefeed.config import model as config
from lakefeed.connectors.sinks.data_files import DataFile
from lakefeed.connectors.sinks.delta_rs import DeltaRsSink
from lakefeed.errors import ConstraintError, TransientError
from lakefeed.inbox.files import FileEvent, Inbox
from lakefeed.pipeline.entity import EntityPipeline
from lakefeed.pipeline.sinks import Sinks
from tests.conftest import entity_yaml, land, wait_for, write_config
from tests.test_cdc import T0, Lake, _prepared
from tests.test_daemon_process import Daemon

NAMES = ("a", "b", "c")


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_rows_with_no_value_in_a_not_null_column_are_set_apart_naming_the_first(data):
    required = data.draw(st.sets(st.sampled_from(NAMES)), "required")
    present = sorted(data.draw(st.sets(st.sampled_from(NAMES), min_size=1), "present"))
    n = data.draw(st.integers(0, 12), "rows")
    values = {c: data.draw(st.lists(st.none() | st.integers(-5, 5), min_size=n, max_size=n), c) for c in present}
    target = pa.schema([pa.field(c, pa.int64(), nullable=c not in required) for c in NAMES])
    rows = pa.table({**{c: pa.array(values[c], pa.int64()) for c in present},
                     "source_file": [f"f{i}" for i in range(n)]})

    kept, bad = checks.refused(rows, target, (), config.CdcConfig())

    def first_empty(i: int) -> str | None:  # the model: the target's order, a missing column is empty
        return next((c for c in NAMES if c in required and (c not in present or values[c][i] is None)), None)
    assert kept.to_pylist() == [r for i, r in enumerate(rows.to_pylist()) if first_empty(i) is None]
    assert [(file, b.reason) for file, b in bad] == [
        (f"f{i}", f"column {first_empty(i)!r} is NOT NULL in the table, and the row has no value there")
        for i in range(n) if first_empty(i) is not None]


def test_a_keyed_entity_s_rows_are_left_to_its_merge():
    rows = cdc.tag(pa.table({"a": pa.array([None, 1], pa.int64())}), "delete", 0)
    kept, bad = checks.refused(rows, pa.schema([pa.field("a", pa.int64(), nullable=False)]), (),
                               config.CdcConfig(strategy="upsert", primary_key=("a",)))
    assert kept.num_rows == 2 and bad == []


def _pipeline(tmp_path):
    cfg = config.load(write_config(tmp_path)).entities[0]
    cfg.checkpoint.mkdir(parents=True)
    (cfg.checkpoint / "metadata").write_text(json.dumps({"id": "q-1"}))
    pipeline = EntityPipeline(cfg, Sinks.of(cfg))
    pipeline.prepare()
    return cfg, pipeline, Inbox(cfg.state / "inbox")


def _process(cfg, pipeline, inbox, name: str, text: str, batch_id: int):
    path = land(cfg.source.path / "sales" / name, text)
    return pipeline.process(inbox.offer([FileEvent.of(path)]), batch_id)


def _ids(uri) -> list | None:
    try:
        return sorted(DeltaTable(str(uri)).to_pyarrow_table()["id"].to_pylist())
    except Exception:  # not made yet
        return None


def _parked(uri) -> list[dict]:
    try:
        return DeltaTable(str(uri)).to_pyarrow_table().to_pylist()
    except Exception:  # not made yet
        return []


def test_a_not_null_column_sends_the_rows_without_a_value_to_quarantine_and_commits_the_rest(tmp_path):
    cfg, pipeline, inbox = _pipeline(tmp_path)
    _process(cfg, pipeline, inbox, "a.csv", "id,amount\n1,1.5\n", 0)
    table = DeltaTable(str(cfg.table)).to_pyarrow_table()  # made NOT NULL, as ALTER TABLE … SET NOT NULL would
    strict = pa.schema([f.with_nullable(f.name != "id") for f in table.schema])
    write_deltalake(str(cfg.table), table.cast(strict), mode="overwrite", schema_mode="overwrite")
    pipeline = EntityPipeline(cfg, Sinks.of(cfg))  # a restart reads the table's schema afresh

    result = _process(cfg, pipeline, inbox, "b.csv", "id,amount\n2,2.5\n,3.5\n4,\n", 1)

    assert (result.rows, result.quarantined) == (2, 1)
    assert _ids(cfg.table) == [1, 2, 4]
    assert sorted(DeltaTable(str(cfg.changelog)).to_pyarrow_table()["id"].to_pylist()) == [1, 2, 4]
    [parked] = DeltaTable(str(cfg.quarantine)).to_pyarrow_table().to_pylist()
    assert "column 'id' is NOT NULL in the table" in parked["reason"] and parked["source_file"] == "sales/b.csv"


def test_a_check_constraint_sends_the_rows_it_refuses_to_quarantine_and_commits_the_rest(tmp_path):
    cfg, pipeline, inbox = _pipeline(tmp_path)
    _process(cfg, pipeline, inbox, "a.csv", "id\n1\n", 0)
    DeltaTable(str(cfg.table)).alter.add_constraint({"id_positive": "id > 0"})

    result = _process(cfg, pipeline, inbox, "b.csv", "id\n2\n-3\n\n4\n", 1)

    assert (result.rows, result.quarantined) == (2, 1)
    assert _ids(cfg.table) == [1, 2, 4] and _ids(cfg.changelog) == [1, 2, 4]
    [parked] = DeltaTable(str(cfg.quarantine)).to_pyarrow_table().to_pylist()
    assert parked["reason"] == "breaks the table's CHECK constraint id_positive (id > 0)"
    assert parked["source_file"] == "sales/b.csv" and json.loads(parked["raw"]) == {"id": "-3"}


def test_a_check_constraint_added_after_the_tasks_ran_fails_the_commit_until_the_batch_is_planned_again(tmp_path):
    cfg, pipeline, inbox = _pipeline(tmp_path)
    _process(cfg, pipeline, inbox, "a.csv", "id\n1\n", 0)
    path = land(cfg.source.path / "sales" / "b.csv", "id\n2\n-3\n")
    records = inbox.offer([FileEvent.of(path)])
    changelog = DeltaTable(str(cfg.changelog)).version()
    table = pipeline.sinks.table
    checks_then = table.checks  # the plan reads the constraints; one is added before the commit looks again
    pipeline.sinks.table.checks = lambda schema, merged: (  # type: ignore[method-assign]
        checks_then(schema, merged), DeltaTable(str(cfg.table)).alter.add_constraint({"id_positive": "id > 0"}))[0]

    with pytest.raises(TransientError, match=r"not checked against, added or changed since .* id_positive \(id > 0\)"):
        pipeline.process(records, 1)
    assert DeltaTable(str(cfg.changelog)).version() == changelog and _ids(cfg.table) == [1]  # nothing committed

    pipeline.sinks.table.checks = checks_then  # type: ignore[method-assign]
    pipeline.process(records, 1)  # the batch tried again, planned anew
    pipeline.process(records, 1)  # and replayed: nothing twice
    assert _ids(cfg.table) == [1, 2] and _ids(cfg.changelog) == [1, 2]
    [parked] = DeltaTable(str(cfg.quarantine)).to_pyarrow_table().to_pylist()
    assert "id_positive" in parked["reason"]


def test_a_check_constraint_lakefeed_cannot_evaluate_refuses_the_batch_before_any_table_takes_it(tmp_path):
    cfg, pipeline, inbox = _pipeline(tmp_path)
    _process(cfg, pipeline, inbox, "a.csv", "id\n1\n", 0)
    DeltaTable(str(cfg.table)).alter.add_constraint({"id_root": "sqrt(id) >= 0"})
    path = land(cfg.source.path / "sales" / "b.csv", "id\n3\n")
    records = inbox.offer([FileEvent.of(path)])
    changelog = DeltaTable(str(cfg.changelog)).version()

    with pytest.raises(ConstraintError, match=r"id_root \(sqrt\(id\) >= 0\): lakefeed does not evaluate .*DROP") as no:
        pipeline.process(records, 1)
    assert no.value.path == cfg.table / "_delta_log" and no.value.stamp is not None
    assert DeltaTable(str(cfg.changelog)).version() == changelog and _ids(cfg.table) == [1]  # nothing committed

    DeltaTable(str(cfg.table)).alter.drop_constraint("id_root")
    pipeline.process(records, 1)
    assert _ids(cfg.table) == [1, 3] and _ids(cfg.changelog) == [1, 3]


def test_a_commit_of_task_files_checks_the_table_itself(tmp_path):
    """The sink's own check: what a caller that did not check first would add is refused all the same."""
    sink = DeltaRsSink(tmp_path / "t")
    strict = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    write_deltalake(str(tmp_path / "t"), pa.Table.from_arrays([pa.array([1], pa.int64())], schema=strict))
    nulls = DataFile("x.parquet", 1, {}, 0, json.dumps({"numRecords": 2, "nullCount": {"id": 1}}), 2)
    with pytest.raises(TransientError, match="NOT NULL columns id, and the batch's file x.parquet holds nulls"):
        sink.commit_files([nulls], pa.schema([pa.field("id", pa.int64())]), "app", 0, {})
    assert DeltaTable(str(tmp_path / "t")).version() == 0


def test_the_daemon_quarantines_what_a_check_refuses_and_stops_the_entity_on_one_it_cannot_evaluate(tmp_path):
    config_path = write_config(tmp_path)
    landing = tmp_path / "landing" / "sales"
    lake = tmp_path / "lake" / "sales"
    with Daemon(config_path, tmp_path / "daemon.log") as daemon:
        daemon.start()
        land(landing / "a.csv", "id\n1\n")
        wait_for(lambda: _ids(lake / "table") == [1], 120, 0.3, "the first file's row")
        DeltaTable(str(lake / "table")).alter.add_constraint({"id_positive": "id > 0"})
        land(landing / "b.csv", "id\n2\n-5\n")
        wait_for(lambda: _ids(lake / "table") == [1, 2] and _parked(lake / "quarantine"), 120, 0.3,
                 "the second file's good row committed, its bad one quarantined")
        [parked] = _parked(lake / "quarantine")
        assert "id_positive" in parked["reason"] and json.loads(parked["raw"]) == {"id": "-5"}

        DeltaTable(str(lake / "table")).alter.add_constraint({"id_mod": "sqrt(id) >= 0"})
        land(landing / "c.csv", "id\n3\n")
        wait_for(lambda: [e for e in daemon.records("entity.failed") if "id_mod" in e["error"]], 120, 0.3,
                 "entity.failed naming the constraint it cannot evaluate")
        DeltaTable(str(lake / "table")).alter.drop_constraint("id_mod")  # the table's log changes: it starts again
        wait_for(lambda: _ids(lake / "table") == [1, 2, 3], 120, 0.3, "the third file's row, once it is gone")
        assert daemon.events("entity.reviving") == 1
        daemon.stop()


def test_a_keyed_entity_s_rows_that_break_a_check_are_set_apart_and_its_deletes_still_apply(tmp_path):
    entity = entity_yaml(format={"kind": "ndjson"},
                         patterns=[{"name": "all", "root_location": "data", "glob_pattern": "/*.json"}],
                         cdc={"strategy": "changelog", "primary_key": ["id"], "debezium": True})
    cfg, pipeline, inbox = _prepared(config.load(write_config(tmp_path, [entity])).entities[0])

    def batch(events: list[dict], batch_id: int):
        path = land(cfg.source.path / "data" / f"{batch_id}.json", "".join(json.dumps(e) + "\n" for e in events))
        return pipeline.process(inbox.offer([FileEvent.of(path)]), batch_id)

    batch([{"before": None, "after": {"id": 1, "v": "a"}, "op": "c"},
           {"before": None, "after": {"id": 2, "v": "x"}, "op": "c"}], 0)
    DeltaTable(str(cfg.table)).alter.add_constraint({"not_bad": "v <> 'bad'"})
    result = batch([{"before": {"id": 1, "v": "a"}, "after": {"id": 1, "v": "bad"}, "op": "u"},
                    {"before": {"id": 2, "v": "bad"}, "after": None, "op": "d"},  # a delete writes no row
                    {"before": None, "after": {"id": 3, "v": "z"}, "op": "c"}], 1)

    assert result.quarantined == 1
    assert sorted((r["id"], r["v"]) for r in DeltaTable(str(cfg.table)).to_pyarrow_table().to_pylist()) == [
        (1, "a"), (3, "z")]
    [parked] = _parked(cfg.quarantine)
    assert parked["reason"] == "breaks the table's CHECK constraint not_bad (v != 'bad')"  # as delta-rs stored it
    assert json.loads(parked["raw"])["v"] == "bad"

    # One lakefeed does not evaluate is left to the MERGE, which delta-rs checks: a keyed entity goes on.
    DeltaTable(str(cfg.table)).alter.add_constraint({"id_mod": "sqrt(id) >= 0"})
    batch([{"before": None, "after": {"id": 4, "v": "w"}, "op": "c"}], 2)
    assert sorted(r["id"] for r in DeltaTable(str(cfg.table)).to_pyarrow_table().to_pylist()) == [1, 3, 4]


@pytest.mark.parametrize("strategy", ["append", "upsert"])
def test_a_check_added_by_spark_sql_is_honoured_by_the_delta_spark_writer(spark, tmp_path, strategy):
    """delta-spark's own ALTER TABLE … ADD CONSTRAINT; the tasks' files (append) or its MERGE (upsert) commit the rows
    the constraint takes, and Spark reads the table back with the constraint in force."""
    lake = Lake(tmp_path, {"strategy": strategy, **({"primary_key": ["k"]} if strategy == "upsert" else {})},
                writer="delta-spark")
    row = {"v": "a", "seq": 0, "IsDelete": False, "op": "c", "et": T0}
    lake.batch([[{**row, "k": 1}]])
    spark.sql(f"ALTER TABLE delta.`{lake.cfg.table}` ADD CONSTRAINT k_small CHECK (k < 10 AND v <> 'bad')")

    lake.batch([[{**row, "k": 2}, {**row, "k": 11}, {**row, "k": 3, "v": "bad"}]])

    assert sorted(lake.state()) == [1, 2]
    reasons = [r["reason"] for r in _parked(lake.cfg.quarantine)]
    assert len(reasons) == 2 and all(r.startswith("breaks the table's CHECK constraint k_small (") for r in reasons)
    assert sorted(r.k for r in spark.read.format("delta").load(str(lake.cfg.table)).collect()) == [1, 2]


def test_a_snapshot_s_row_a_check_refuses_is_absent_from_the_snapshot_it_applies(tmp_path):
    """As a key the snapshot lacks: the stored row is retracted; the new one waits in quarantine (docs/bad-input.md)."""
    entity = entity_yaml(format={"kind": "ndjson"},
                         patterns=[{"name": "all", "root_location": "data", "glob_pattern": "/*.json"}],
                         cdc={"strategy": "snapshot", "primary_key": ["id"]})
    cfg, pipeline, inbox = _prepared(config.load(write_config(tmp_path, [entity])).entities[0])

    def batch(rows: list[dict], batch_id: int):
        path = land(cfg.source.path / "data" / f"{batch_id}.json", "".join(json.dumps(r) + "\n" for r in rows))
        return pipeline.process(inbox.offer([FileEvent.of(path)]), batch_id)

    batch([{"id": 1, "v": "a"}, {"id": 2, "v": "b"}], 0)
    DeltaTable(str(cfg.table)).alter.add_constraint({"not_bad": "v <> 'bad'"})
    assert batch([{"id": 1, "v": "a"}, {"id": 2, "v": "bad"}], 1).quarantined == 1

    assert [(r["id"], r["v"]) for r in DeltaTable(str(cfg.table)).to_pyarrow_table().to_pylist()] == [(1, "a")]
    assert [json.loads(r["raw"]) for r in _parked(cfg.quarantine)] == [{"id": "2", "v": "bad"}]
