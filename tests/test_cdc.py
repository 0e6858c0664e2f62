"""CDC strategies against the reference model (tests/cdc_model.py), through the real pipeline and real
Delta tables: random batches of changes with duplicates, out-of-order sequences, null keys and bad ops."""

from __future__ import annotations

import json
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakefeed.config import model as config
from lakefeed.inbox.files import FileEvent
from lakefeed.pipeline.verify import verify
from tests.cdc_model import Model
from tests.conftest import entity_yaml, land, write_config
from tests.test_pipeline import _prepared

COLUMNS = ["k", "v", "seq", "IsDelete", "op", "et"]
SCHEMA_DOC = {"jsonSchemaSemanticVersion": "1.0.0", "definitions": [{"entityName": "sales", "hasAttributes": [
    {"name": "k", "dataFormat": "Int64"}, {"name": "v", "dataFormat": "String"},
    {"name": "seq", "dataFormat": "Int64"}, {"name": "IsDelete", "dataFormat": "Boolean"},
    {"name": "op", "dataFormat": "String"}, {"name": "et", "dataFormat": "DateTime"}]}]}
T0 = datetime(2024, 1, 1, tzinfo=UTC)


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value).lower() if isinstance(value, bool) else str(value)


def _csv(rows: list[dict]) -> str:
    return ",".join(COLUMNS) + "\n" + "".join(",".join(_cell(r[c]) for c in COLUMNS) + "\n" for r in rows)


class Lake:
    """One entity with a CDC strategy, fed batch by batch through EntityPipeline.process."""

    def __init__(self, root: Path, cdc: dict, event_time: dict | None = None, pattern: str = "/*.csv",
                 prepare: bool = True) -> None:
        """`prepare`: a pipeline and inbox for direct process() calls (not when a Spark query will run it)."""
        (root / "landing").mkdir(parents=True)
        (root / "landing" / "sales.cdm.json").write_text(json.dumps(SCHEMA_DOC))
        entity = entity_yaml(cdc=cdc, patterns=[{"name": "all", "root_location": "data", "glob_pattern": pattern}],
                             event_time=event_time or {})
        self.cfg = config.load(write_config(root, [entity])).entities[0]
        if prepare:
            self.cfg, self.pipeline, self.inbox = _prepared(self.cfg)
        self.batches = 0

    def batch(self, files: list[list[dict]]) -> None:
        paths = [land(self.cfg.source.path / "data" / f"b{self.batches}_f{i}.csv", _csv(rows))
                 for i, rows in enumerate(files)]
        records = self.inbox.offer([FileEvent.of(p) for p in paths])
        self.pipeline.process(records, self.batches)
        self.batches += 1

    def _read(self, path) -> list[dict]:
        try:
            return DeltaTable(str(path)).to_pyarrow_table().to_pylist()
        except Exception:
            return []

    def state(self) -> dict:
        return {r["k"]: {c: r[c] for c in COLUMNS} for r in self._read(self.cfg.table)}

    def changelog(self) -> list:
        rows = sorted(self._read(self.cfg.changelog), key=lambda r: r["offset"])
        assert [r["offset"] for r in rows] == list(range(len(rows)))  # dense, never reused
        return [(r["op"], {c: r["data_op" if c == "op" else c] for c in COLUMNS}) for r in rows]

    def quarantined(self) -> int:
        return len(self._read(self.cfg.quarantine))


rows = st.lists(st.fixed_dictionaries({
    "k": st.integers(-1, 4).map(lambda k: None if k < 0 else k),
    "v": st.sampled_from(["a", "b", None]),
    "seq": st.integers(0, 3),
    "IsDelete": st.booleans(),
    "op": st.sampled_from(["c", "u", "d", "r", "x"]),
    "et": st.integers(0, 10).map(lambda m: T0 + timedelta(minutes=m)),
}), max_size=5)
batches = st.lists(st.lists(rows, min_size=1, max_size=3), min_size=1, max_size=4)
STRATEGIES = ["ledger", "snapshot", "upsert", "delete", "upsert_and_delete", "insert", "update", "changelog"]


@pytest.mark.parametrize("sequence", [(), ("seq",)], ids=["arrival", "sequence_by"])
@pytest.mark.parametrize("strategy", STRATEGIES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=batches, update_of_absent=st.sampled_from(["insert", "ignore", "quarantine"]),
       late_policy=st.sampled_from(["apply", "quarantine", "drop"]))
def test_strategy_matches_reference_model(strategy, sequence, data, update_of_absent, late_policy):
    model = Model(strategy, sequence=sequence, update_of_absent=update_of_absent, event_time="et",
                  lateness=timedelta(minutes=2), late_policy=late_policy)
    with tempfile.TemporaryDirectory() as tmp:
        lake = Lake(Path(tmp), {"strategy": strategy, "primary_key": ["k"], "sequence_by": list(sequence),
                                "update_of_absent": update_of_absent, "history": True},
                    {"source": "column", "column": "et", "allowed_lateness_s": 120, "late_policy": late_policy})
        for files in data:
            model.apply_batch(files)
            lake.batch(files)
            assert lake.state() == model.state
        assert lake.changelog() == model.changelog
        assert lake.quarantined() == model.quarantined
        assert verify(lake.cfg) == []
        history = lake._read(lake.cfg.history)
        current = {r["k"]: {c: r[c] for c in COLUMNS} for r in history if r["is_current"]}
        assert current == model.state  # the SCD2 table's current versions are the current table
        opened = sum(1 for op, _ in model.changelog if op in (0, 3))
        closed = sum(1 for op, _ in model.changelog if op in (1, 2))
        assert (len(history), sum(1 for r in history if r["valid_to"] is not None)) == (opened, closed)


def test_replayed_keyed_batch_changes_nothing_and_crash_before_changelog_is_completed(tmp_path, monkeypatch):
    lake = Lake(tmp_path, {"strategy": "upsert", "primary_key": ["k"]})
    lake.batch([[{"k": 1, "v": "a", "seq": 0, "IsDelete": False, "op": "c", "et": T0}]])
    changelog = lake.pipeline.sinks.changelog
    monkeypatch.setattr(changelog, "append", lambda *a: (_ for _ in ()).throw(RuntimeError("killed")))
    path = land(lake.cfg.source.path / "data" / "b1.csv", _csv([{"k": 1, "v": "b", "seq": 1, "IsDelete": False,
                                                                 "op": "u", "et": T0}]))
    records = lake.inbox.offer([FileEvent.of(path)])
    with pytest.raises(RuntimeError):
        lake.pipeline.process(records, 1)
    assert lake.state()[1]["v"] == "b"  # the merge committed; its changelog did not
    monkeypatch.undo()
    from tests.test_pipeline import _pipeline

    fresh = _pipeline(lake.cfg)
    fresh.process(records, 1)
    assert [op for op, _ in lake.changelog()] == [0, 2, 3]
    version = DeltaTable(str(lake.cfg.table)).version()
    assert fresh.process(records, 1).skipped
    assert DeltaTable(str(lake.cfg.table)).version() == version


def test_dataverse_style_upsert_and_delete_partitions_out_of_order(tmp_path):
    """CDM incremental patterns (Upsert, Delete) over dated folders, delivered out of order, sequenced."""
    landing = tmp_path / "landing"
    landing.mkdir()
    manifest = {"manifestName": "default", "jsonSchemaSemanticVersion": "1.0.0", "entities": [{
        "type": "LocalEntity", "entityName": "sales", "entityPath": "sales.cdm.json/sales",
        "incrementalPartitionPatterns": [
            {"name": "UpsertPattern", "rootLocation": "account", "regularExpression": r"/([\d-]+)/Upserts/\d+\.csv",
             "parameters": ["day"], "exhibitsTraits": [{"traitReference": "is.partition.incremental",
                                                        "arguments": [{"name": "type", "value": "Upsert"}]}]},
            {"name": "DeletePattern", "rootLocation": "account", "globPattern": "/*/Deletes/*.csv",
             "exhibitsTraits": [{"traitReference": "is.partition.incremental",
                                 "arguments": [{"name": "type", "value": "Delete"}]}]}]}]}
    (landing / "default.manifest.cdm.json").write_text(json.dumps(manifest))
    (landing / "sales.cdm.json").write_text(json.dumps(SCHEMA_DOC))
    entity = entity_yaml(patterns=[], cdc={"strategy": "upsert", "primary_key": ["k"], "sequence_by": ["seq"]})
    cfg, pipeline, inbox = _prepared(config.load(write_config(tmp_path, [entity])).entities[0])

    def deliver(batch_id, *files):
        paths = [land(landing / "account" / name, _csv(rows)) for name, rows in files]
        pipeline.process(inbox.offer([FileEvent.of(p) for p in paths]), batch_id)

    r = lambda k, v, seq: {"k": k, "v": v, "seq": seq, "IsDelete": False, "op": None, "et": T0}  # noqa: E731
    deliver(0, ("2024-01-02/Upserts/1.csv", [r(1, "new", 2), r(2, "two", 2)]))
    deliver(1, ("2024-01-01/Upserts/1.csv", [r(1, "old", 1), r(3, "three", 1)]),  # older, arriving late
            ("2024-01-01/Deletes/1.csv", [r(2, None, 1)]))  # a delete older than the row it would remove
    paths = [land(landing / "account" / "2024-01-03/Deletes/1.csv", _csv([r(3, None, 3), r(9, None, 3)]))]
    result = pipeline.process(inbox.offer([FileEvent.of(p) for p in paths]), 2)
    assert result.deletes_of_absent == 1  # 9 was never there: counted, not an error
    state = {row["k"]: row["v"] for row in DeltaTable(str(cfg.table)).to_pyarrow_table().to_pylist()}
    assert state == {1: "new", 2: "two"}
    doc = json.loads(cfg.manifest.read_text())
    incremental = {p["location"]: p["exhibitsTraits"][0]["arguments"][0]["value"]
                   for p in doc["entities"][0]["incrementalPartitions"]}
    assert incremental == {"account/2024-01-02/Upserts/1.csv": "Upsert", "account/2024-01-01/Upserts/1.csv": "Upsert",
                           "account/2024-01-01/Deletes/1.csv": "Delete", "account/2024-01-03/Deletes/1.csv": "Delete"}


def test_verify_command_detects_a_changelog_that_does_not_replay(tmp_path, capsys):
    from deltalake import write_deltalake

    from lakefeed.ops import cli

    lake = Lake(tmp_path, {"strategy": "upsert", "primary_key": ["k"]})
    row = {"k": 1, "v": "a", "seq": 0, "IsDelete": False, "op": "c", "et": T0}
    lake.batch([[row, {**row, "k": 2}]])
    lake.batch([[{**row, "v": "b"}]])
    config_file = tmp_path / "lakefeed.yaml"
    capsys.readouterr()
    assert cli.main(["verify", "--config", str(config_file)]) == 0
    assert capsys.readouterr().out == "sales: ok\n"
    # tamper: drop the correction's correct-from row
    changelog = DeltaTable(str(lake.cfg.changelog)).to_pyarrow_table()
    import pyarrow.compute as pc

    write_deltalake(str(lake.cfg.changelog), changelog.filter(pc.not_equal(changelog["op"], 2)), mode="overwrite")
    capsys.readouterr()
    assert cli.main(["verify", "--config", str(config_file)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("sales: ") and "offsets must be dense" in out


def test_debezium_envelopes_become_changes_with_their_event_time(tmp_path):
    entity = entity_yaml(format={"kind": "ndjson"},
                         patterns=[{"name": "all", "root_location": "data", "glob_pattern": "/*.json"}],
                         cdc={"strategy": "changelog", "primary_key": ["id"], "debezium": True},
                         event_time={"source": "column", "column": "ts_ms"})
    cfg, pipeline, inbox = _prepared(config.load(write_config(tmp_path, [entity])).entities[0])
    events = [
        {"before": None, "after": {"id": 1, "v": "a"}, "op": "c", "ts_ms": 1_700_000_000_000},
        {"before": None, "after": {"id": 2, "v": "x"}, "op": "r", "ts_ms": 1_700_000_000_500},
        {"before": {"id": 1, "v": "a"}, "after": {"id": 1, "v": "b"}, "op": "u", "ts_ms": 1_700_000_001_000},
        {"before": {"id": 2, "v": "x"}, "after": None, "op": "d", "ts_ms": 1_700_000_002_000},
        {"before": None, "after": {"id": 3, "v": "z"}, "op": "t", "ts_ms": 1_700_000_003_000},  # truncate: unknown
    ]
    path = land(cfg.source.path / "data" / "a.json", "".join(json.dumps(e) + "\n" for e in events[:2]))
    pipeline.process(inbox.offer([FileEvent.of(path)]), 0)
    path = land(cfg.source.path / "data" / "b.json", "".join(json.dumps(e) + "\n" for e in events[2:]))
    result = pipeline.process(inbox.offer([FileEvent.of(path)]), 1)
    assert result.quarantined == 1
    table = DeltaTable(str(cfg.table)).to_pyarrow_table().to_pylist()
    assert [(r["id"], r["v"]) for r in table] == [(1, "b")]
    log = DeltaTable(str(cfg.changelog)).to_pyarrow_table().sort_by("offset").to_pylist()
    assert [(r["op"], r["id"], r["v"]) for r in log] == [(0, 1, "a"), (0, 2, "x"), (2, 1, "a"), (3, 1, "b"),
                                                         (1, 2, "x")]
    assert log[4]["event_time"] == datetime.fromtimestamp(1_700_000_002, UTC)
    assert verify(cfg) == []


def test_files_without_rows_are_still_partitions_of_a_keyed_entity(tmp_path):
    lake = Lake(tmp_path, {"strategy": "upsert", "primary_key": ["k"]})
    lake.batch([[{"k": 1, "v": "a", "seq": 0, "IsDelete": False, "op": "c", "et": T0}]])
    empty = land(lake.cfg.source.path / "data" / "empty.csv", "")
    lake.pipeline.process(lake.inbox.offer([FileEvent.of(empty)]), 1)
    doc = json.loads(lake.cfg.manifest.read_text())
    assert sorted(p["location"] for p in doc["entities"][0]["dataPartitions"]) == ["data/b0_f0.csv", "data/empty.csv"]


def test_crash_before_the_history_commit_is_completed_on_replay(tmp_path, monkeypatch):
    lake = Lake(tmp_path, {"strategy": "upsert", "primary_key": ["k"], "history": True})
    row = {"k": 1, "v": "a", "seq": 0, "IsDelete": False, "op": "c", "et": T0}
    path = land(lake.cfg.source.path / "data" / "a.csv", _csv([row]))
    records = lake.inbox.offer([FileEvent.of(path)])
    monkeypatch.setattr(lake.pipeline.sinks.history, "apply_history",
                        lambda *a: (_ for _ in ()).throw(RuntimeError("killed")))
    with pytest.raises(RuntimeError):
        lake.pipeline.process(records, 0)
    monkeypatch.undo()
    from tests.test_pipeline import _pipeline

    assert not _pipeline(lake.cfg).process(records, 0).skipped  # table and changelog done, history not
    history = lake._read(lake.cfg.history)
    assert [(r["k"], r["is_current"]) for r in history] == [(1, True)]
    assert [op for op, _ in lake.changelog()] == [0]
