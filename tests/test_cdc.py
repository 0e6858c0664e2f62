"""CDC strategies against the reference model (tests/cdc_model.py), through the real pipeline and real
Delta tables: random batches of changes with duplicates, out-of-order sequences, null keys and bad ops."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lakefeed.batch.cdc import MergePlan, unwrap_debezium
from lakefeed.config import model as config
from lakefeed.connectors.sinks.delta_log import commit_metadata
from lakefeed.connectors.sinks.delta_rs import DeltaRsSink
from lakefeed.inbox.files import FileEvent
from lakefeed.pipeline.verify import verify
from tests.cdc_model import Model
from tests.conftest import entity_yaml, land, write_config
from tests.test_pipeline import _prepared

COLUMNS = ["k", "v", "seq", "IsDelete", "op", "et"]


def schema_doc(key_format: str = "Int64", key_purpose: bool = False) -> dict:
    """The entity's CDM schema document; `key_purpose` marks k `purpose: identifiedBy` (its default key)."""
    key = {"name": "k", "dataFormat": key_format, **({"purpose": "identifiedBy"} if key_purpose else {})}
    return {"jsonSchemaSemanticVersion": "1.0.0", "definitions": [{"entityName": "sales", "hasAttributes": [
        key, {"name": "v", "dataFormat": "String"},
        {"name": "seq", "dataFormat": "Int64"}, {"name": "IsDelete", "dataFormat": "Boolean"},
        {"name": "op", "dataFormat": "String"}, {"name": "et", "dataFormat": "DateTime"}]}]}


SCHEMA_DOC = schema_doc()
T0 = datetime(2024, 1, 1, tzinfo=UTC)
GUIDS = [str(uuid.uuid5(uuid.NAMESPACE_OID, str(i))) for i in range(5)]  # key i as a GUID (another order)


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):  # odd minutes as .NET (Dataverse) writes them: seven fractional digits
        return value.strftime("%Y-%m-%dT%H:%M:%S.%f") + "9Z" if value.minute % 2 else value.isoformat()
    return str(value).lower() if isinstance(value, bool) else str(value)


def _csv(rows: list[dict]) -> str:
    return ",".join(COLUMNS) + "\n" + "".join(",".join(_cell(r[c]) for c in COLUMNS) + "\n" for r in rows)


class Lake:
    """One entity with a CDC strategy, fed batch by batch through EntityPipeline.process."""

    def __init__(self, root: Path, cdc: dict, event_time: dict | None = None, pattern: str = "/*.csv",
                 prepare: bool = True, schema: dict = SCHEMA_DOC, writer: str = "delta-rs",
                 compact_every: int = 0) -> None:
        """`prepare`: a pipeline and inbox for direct process() calls (not when a Spark query will run it);
        `writer`: delta-spark writes through the active Spark session (the test session's); `compact_every`:
        the entity's compaction.every (0: never)."""
        (root / "landing").mkdir(parents=True)
        (root / "landing" / "sales.cdm.json").write_text(json.dumps(schema))
        entity = entity_yaml(cdc=cdc, patterns=[{"name": "all", "root_location": "data", "glob_pattern": pattern}],
                             event_time=event_time or {}, writer=writer, compaction={"every": compact_every})
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
    "op": st.sampled_from(["c", "u", "d", "r", "x", "update"]),
    "et": st.integers(0, 10).map(lambda m: T0 + timedelta(minutes=m)),
}), max_size=5)
batches = st.lists(st.lists(rows, min_size=1, max_size=3), min_size=1, max_size=4)
SEQ = ("seq",)  # sequence_by: [seq]; () orders a key's changes by arrival
STRATEGIES = ["ledger", "snapshot", "upsert", "delete", "upsert_and_delete", "insert", "update", "changelog"]


def _row(k, v, seq, op):
    return {"k": k, "v": v, "seq": seq, "IsDelete": op == "d", "op": op, "et": T0}


def _guid_keys(data: list) -> list:
    return [[[{**r, "k": None if r["k"] is None else GUIDS[r["k"]]} for r in f] for f in files] for files in data]


@pytest.mark.parametrize("strategy", STRATEGIES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=batches, sequence=st.sampled_from([(), ("seq",)]),
       update_of_absent=st.sampled_from(["insert", "ignore", "quarantine"]),
       late_policy=st.sampled_from(["apply", "quarantine", "drop"]), key=st.sampled_from(["Int64", "Guid"]),
       key_from_document=st.booleans(), compact_every=st.sampled_from([0, 1, 2]))
# A deletion's tombstone, then an older change of its key: the tombstones table is read with GUID keys.
@example(data=[[[_row(1, "a", 2, "d")]], [[_row(1, "b", 1, "c"), _row(2, "b", 1, "c")]]],
         sequence=SEQ, update_of_absent="insert", late_policy="apply", key="Guid", key_from_document=False,
         compact_every=1)
# Create, delete and create again of a present key in one batch: the last create is the row (either order).
@example(data=[[[_row(1, "a", 0, "c")]], [[_row(1, "x", 1, "c"), _row(1, None, 2, "d"), _row(1, "b", 3, "c")]]],
         sequence=SEQ, update_of_absent="insert", late_policy="apply", key="Int64", key_from_document=False,
         compact_every=0)
@example(data=[[[_row(1, "a", 0, "c")]], [[_row(1, "x", 1, "c"), _row(1, None, 2, "d"), _row(1, "b", 3, "c")]]],
         sequence=(), update_of_absent="insert", late_policy="apply", key="Int64", key_from_document=False,
         compact_every=0)
# An update after a delete of its present key in one batch finds the key absent (each policy).
@example(data=[[[_row(1, "a", 0, "c")]], [[_row(1, None, 1, "d"), _row(1, "b", 2, "update")]]],
         sequence=SEQ, update_of_absent="ignore", late_policy="apply", key="Int64", key_from_document=False,
         compact_every=0)
@example(data=[[[_row(1, "a", 0, "c")]], [[_row(1, None, 1, "d"), _row(1, "b", 2, "update"),
                                            _row(1, "c", 3, "update")]]],
         sequence=SEQ, update_of_absent="quarantine", late_policy="apply", key="Guid", key_from_document=False,
         compact_every=1)
@example(data=[[[_row(1, "a", 0, "c")]], [[_row(1, None, 1, "d"), _row(1, "b", 2, "c"), _row(1, "c", 3, "update")]]],
         sequence=SEQ, update_of_absent="quarantine", late_policy="apply", key="Int64", key_from_document=False,
         compact_every=0)
# A delete older than the stored row, then a create or an update: the delete is stale, they find the key there.
@example(data=[[[_row(1, "a", 3, "c")]], [[_row(1, None, 1, "d"), _row(1, "b", 5, "c")]]],
         sequence=SEQ, update_of_absent="ignore", late_policy="apply", key="Int64", key_from_document=False,
         compact_every=0)
@example(data=[[[_row(1, "a", 3, "c")]], [[_row(1, None, 1, "d"), _row(1, "b", 5, "update")]]],
         sequence=SEQ, update_of_absent="quarantine", late_policy="apply", key="Guid", key_from_document=False,
         compact_every=0)
def test_strategy_matches_reference_model(strategy, sequence, data, update_of_absent, late_policy, key,
                                          key_from_document, compact_every):
    """`key`: the key column's CDM type (GUIDs are strings); `key_from_document`: cdc.primary_key is not given
    and comes from the schema document's `purpose: identifiedBy`; `compact_every`: the tables are compacted after
    that many commits each (daemon/pipeline/compaction.py), or never (0)."""
    _matches_reference_model("delta-rs", strategy, sequence, data, update_of_absent, late_policy, key,
                             key_from_document, compact_every)


@pytest.mark.parametrize("strategy", STRATEGIES)
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=batches, sequence=st.sampled_from([(), ("seq",)]),
       update_of_absent=st.sampled_from(["insert", "ignore", "quarantine"]),
       late_policy=st.sampled_from(["apply", "quarantine", "drop"]), key=st.sampled_from(["Int64", "Guid"]),
       compact_every=st.sampled_from([0, 2]))
def test_strategy_written_by_delta_spark_matches_reference_model(spark, strategy, sequence, data, update_of_absent,
                                                                 late_policy, key, compact_every):
    """The same model, the tables written by delta-spark: fewer examples (a MERGE takes about a second)."""
    _matches_reference_model("delta-spark", strategy, sequence, data, update_of_absent, late_policy, key, False,
                             compact_every)


def test_the_delta_spark_model_test_passes_on_a_local_cluster():
    """The same property test for the keyed strategy whose MERGE does the most (a snapshot's diff: inserts, updates
    and deletes of the keys it no longer holds), in a pytest of its own whose Spark is local-cluster[2,1,1024]: two
    executor JVMs, two shuffle partitions, every task of the MERGE on an executor."""
    chosen = ("snapshot",)
    test = f"{__file__}::test_strategy_written_by_delta_spark_matches_reference_model"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", " or ".join(chosen),
                          test], env={**os.environ, "LAKEFEED_TEST_SPARK_MASTER": "local-cluster[2,1,1024]"},
                         capture_output=True, text=True, timeout=900, check=False)
    assert run.returncode == 0 and f"{len(chosen)} passed" in run.stdout, run.stdout[-4000:] + run.stderr[-2000:]


def _matches_reference_model(writer, strategy, sequence, data, update_of_absent, late_policy, key,
                             key_from_document, compact_every):
    data = _guid_keys(data) if key == "Guid" else data
    model = Model(strategy, sequence=sequence, update_of_absent=update_of_absent, event_time="et",
                  lateness=timedelta(minutes=2), late_policy=late_policy)
    cdc = {"strategy": strategy, "sequence_by": list(sequence), "update_of_absent": update_of_absent, "history": True,
           **({} if key_from_document else {"primary_key": ["k"]})}
    with tempfile.TemporaryDirectory() as tmp:
        lake = Lake(Path(tmp), cdc,
                    {"source": "column", "column": "et", "allowed_lateness_s": 120, "late_policy": late_policy},
                    schema=schema_doc(key, key_purpose=key_from_document), writer=writer, compact_every=compact_every)
        assert lake.cfg.cdc.primary_key == ("k",)
        for files in data:
            model.apply_batch(files)
            lake.batch(files)
            assert lake.state() == model.state
        assert lake.changelog() == model.changelog, (lake.changelog(), model.changelog)
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
    monkeypatch.setattr(changelog, "commit_files", lambda *a: (_ for _ in ()).throw(RuntimeError("killed")))
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
    held = set(DeltaTable(str(lake.cfg.changelog)).file_uris())
    assert {str(p) for p in Path(lake.cfg.changelog).glob("*.parquet")} == held  # the killed write's file swept
    version = DeltaTable(str(lake.cfg.table)).version()
    assert fresh.process(records, 1).skipped
    assert DeltaTable(str(lake.cfg.table)).version() == version


@pytest.mark.parametrize("case", ["delete, update, delete", "delete, insert"])
def test_a_replay_settles_a_key_against_the_table_before_its_merge(tmp_path, monkeypatch, case):
    """A key's changes, some after a delete of the batch, are checked against its stored row's sequence; replayed
    once its merge committed, that is the row the merge changed (its change data), not what it left: the same
    changes, tombstones and changelog (with its rows' file and event time), none quarantined that was not the first
    time."""
    lake = Lake(tmp_path, {"strategy": "changelog", "primary_key": ["k"], "sequence_by": ["seq"],
                           "update_of_absent": "quarantine"}, {"source": "column", "column": "et"})
    lake.batch([[_row(1, "old", 3, "u")]])
    later = T0 + timedelta(minutes=1)
    changes = {"delete, update, delete": [_row(1, None, 1, "d"), _row(1, "x", 2, "update"), _row(1, None, 4, "d")],
               "delete, insert": [_row(1, None, 4, "d"), _row(1, "new", 5, "c")]}[case]
    changes = [{**row, "et": later} for row in changes]
    records = lake.inbox.offer([FileEvent.of(land(lake.cfg.source.path / "data" / "b1.csv", _csv(changes)))])
    # Killed after the merge, before the tombstones (and the changelog): the replay reads no deletion of this batch.
    tombstones = lake.pipeline.sinks.tombstones
    monkeypatch.setattr(tombstones, "merge", lambda *a: (_ for _ in ()).throw(RuntimeError("killed")))
    with pytest.raises(RuntimeError):
        lake.pipeline.process(records, 1)
    monkeypatch.undo()
    from tests.test_pipeline import _pipeline

    _pipeline(lake.cfg).process(records, 1)
    model = Model("changelog", sequence=("seq",), update_of_absent="quarantine")
    model.apply_batch([[_row(1, "old", 3, "u")]])
    model.apply_batch([changes])
    assert lake.state() == model.state
    assert lake.changelog() == model.changelog
    assert lake.quarantined() == model.quarantined == 0
    rows = [r for r in lake._read(lake.cfg.changelog) if r["batch_id"] == 1]
    assert {(r["source_file"], r["event_time"]) for r in rows} == {("data/b1.csv", later)}


class _Jobs:
    """The pipeline's own spread (threads of this process), with the Spark jobs a batch would start recorded."""

    def __init__(self, spread) -> None:
        self.spread, self.width, self.started = spread, spread.width, []

    def map(self, work, jobs, description):
        self.started.append(description.rsplit(": ", 1)[1])
        return self.spread.map(work, jobs, description)


@pytest.mark.parametrize("strategy", ["upsert", "upsert_and_delete", "ledger"])
def test_a_keyed_batch_of_one_task_is_reduced_by_it_in_one_job(tmp_path, strategy):
    """A keyed batch that is one stage task (one landed file, a few push frames) is reduced by that task too: one
    Spark job, not two. State, changelog and quarantine (a late row, a superseded change) are the reference
    model's, as the batches of several files, which still take two jobs, are."""
    model = Model(strategy, sequence=("seq",), update_of_absent="insert", event_time="et", lateness=timedelta(0),
                  late_policy="quarantine")
    lake = Lake(tmp_path, {"strategy": strategy, "primary_key": ["k"], "sequence_by": ["seq"]},
                {"source": "column", "column": "et", "allowed_lateness_s": 0, "late_policy": "quarantine"})
    jobs = lake.pipeline.spread = _Jobs(lake.pipeline.spread)
    row = {"k": 1, "v": "a", "seq": 0, "IsDelete": False, "op": "c", "et": T0 + timedelta(minutes=5)}
    batches = [
        ([[row, {**row, "k": 2, "seq": 2}], [{**row, "k": 3}]], ["read", "reduce"]),  # two files: a task each
        ([[{**row, "v": "b", "seq": 1}, {**row, "v": "c", "seq": 2, "IsDelete": True},
           {**row, "k": 2, "v": "x", "seq": 1},  # older than key 2's change: superseded
           {**row, "k": 4, "v": "late", "et": T0}]], ["read and reduce"]),  # behind the watermark (minute 5)
        ([[{**row, "k": 3, "v": "d", "seq": 3}], [{**row, "k": 5, "v": "e"}]], ["read", "reduce"]),
        ([[{**row, "k": 6, "v": "f", "et": T0 + timedelta(minutes=9)}]], ["read and reduce"]),
    ]
    for files, started in batches:
        jobs.started.clear()
        model.apply_batch(files)
        lake.batch(files)
        assert jobs.started == started
        assert lake.state() == model.state
    assert lake.changelog() == model.changelog and lake.quarantined() == model.quarantined > 0
    reducers = [json.loads(c["lakefeed.reducers"]) for c in map(commit_metadata, DeltaTable(str(lake.cfg.table))
                                                                 .history()) if "lakefeed.reducers" in c]
    assert len(reducers) == len(batches) and all(reducers)  # each batch records where it was reduced
    assert verify(lake.cfg) == []


def test_a_snapshot_batch_of_one_file_is_still_reduced_by_the_driver_s_plan(tmp_path):
    lake = Lake(tmp_path, {"strategy": "snapshot", "primary_key": ["k"]})
    jobs = lake.pipeline.spread = _Jobs(lake.pipeline.spread)
    row = {"k": 1, "v": "a", "seq": 0, "IsDelete": False, "op": "c", "et": T0}
    lake.batch([[row, {**row, "k": 2}]])
    lake.batch([[{**row, "v": "b"}]])  # the whole state: key 2 is gone
    assert jobs.started == ["read", "reduce", "read", "reduce"]
    assert {k: r["v"] for k, r in lake.state().items()} == {1: "b"}


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


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(st.dictionaries(st.sampled_from(GUIDS), st.integers(0, 9), min_size=1), min_size=1, max_size=3),
       probe=st.lists(st.sampled_from([*GUIDS, "absent"]), min_size=1, max_size=6),
       kind=st.sampled_from([pa.string(), pa.large_string(), pa.string_view()]))
def test_sink_lookup_of_string_keys_matches_a_dictionary(batches, probe, kind):
    """Keys as Arrow holds text (delta-rs writes and reads string_view; readers may give large_string): the
    lookup finds what the merges left, file statistics pruning included."""
    held: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        sink = DeltaRsSink(Path(tmp) / "t")
        for version, rows in enumerate(batches):
            source = pa.table({"k": pa.array(list(rows), kind), "seq": list(rows.values()),
                               "__kind": ["upsert"] * len(rows)})
            sink.merge(source, MergePlan(("k",), (), ("seq",), False, True), "app", version, {})
            held.update(rows)
        found = sink.lookup(pa.table({"k": pa.array(probe, kind)}), ("seq",)).to_pylist()
    assert sorted(found, key=lambda r: r["k"]) == [{"k": k, "seq": held[k]} for k in sorted(set(probe) & set(held))]


# A sequence column's type, and its value for a number: in the order of the numbers, close ones within a
# millisecond, or sharing a prefix longer than writers keep of a string's statistics
SEQUENCES = {"int64": (pa.int64(), lambda n: n),
             "timestamp": (pa.timestamp("us", tz="UTC"), lambda n: T0 + timedelta(microseconds=300 * n)),
             "text": (pa.string(), lambda n: f"{n // 10:03d}" + "x" * 70 + f"{n:04d}"),
             "decimal": (pa.decimal128(20, 3), lambda n: Decimal(1000) + Decimal(n).scaleb(-3))}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(sorted(SEQUENCES)),
       batches=st.lists(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 40), st.integers(0, 3)), min_size=1,
                                 max_size=5), min_size=1, max_size=3),
       probe=st.lists(st.tuples(st.integers(0, 45), st.integers(0, 3)), min_size=1, max_size=6))
def test_sink_says_it_holds_no_newer_row_only_when_it_does_not(kind, batches, probe):
    """`may_hold_newer` by file statistics, of a sequence of two columns (compared lexicographically), the first of a
    type whose statistics writers record inexactly: where it says the table holds no newer row than a probe's, the
    table holds none; above everything stored it says so (but for text cut where the values still agree)."""
    kind_of, value = SEQUENCES[kind]
    stored: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        sink = DeltaRsSink(Path(tmp) / "t")
        columns = ("s1", "s2")
        assert not sink.may_hold_newer(pa.table({"s1": pa.array([value(0)], kind_of), "s2": [0]}), columns).any()
        for version, changes in enumerate(batches):
            rows = {k: (a, b) for k, a, b in changes}
            source = pa.table({"k": list(rows), "s1": pa.array([value(a) for a, _ in rows.values()], kind_of),
                               "s2": [b for _, b in rows.values()], "__kind": ["upsert"] * len(rows)})
            sink.merge(source, MergePlan(("k",), (), columns, False, True), "app", version, {})
            stored.update(rows)
        top = max(stored.values())
        probe = [*probe, (top[0] + 10, 0)]
        probes = pa.table({"s1": pa.array([value(a) for a, _ in probe], kind_of), "s2": [b for _, b in probe]})
        says = sink.may_hold_newer(probes, columns).tolist()
    assert all(said for said, p in zip(says, probe, strict=True) if any(row > p for row in stored.values()))
    assert not says[-1] or kind == "text"


def test_sink_says_it_may_hold_a_newer_row_where_a_column_has_no_statistics(tmp_path):
    """Writers keep statistics of a table's first 32 columns only."""
    sink = DeltaRsSink(tmp_path / "t")
    filler = {f"c{i}": [i] for i in range(32)}
    sink.merge(pa.table({"k": [1], **filler, "seq": [5], "__kind": ["upsert"]}), MergePlan(("k",), (), ("seq",), False,
               True), "app", 0, {})
    assert sink.may_hold_newer(pa.table({"seq": [1, 9]}), ("seq",)).tolist() == [True, True]


def _envelopes(changes: list, ts: int) -> tuple[list[dict], list[dict]]:
    """(Debezium envelopes, the rows they stand for). A before-image is the whole row, the key only, or the key
    and nulls (Postgres with REPLICA IDENTITY DEFAULT)."""
    envelopes, rows = [], []
    for i, (key, op, n, name, form) in enumerate(changes):
        row = {"id": key, "n": n, "amount": n + 0.5, "name": name}
        image = {"full": row, "key": {"id": key}, "nulls": {"id": key, "n": None, "amount": None, "name": None}}[form]
        envelopes.append({"before": None if op == "c" else image, "after": None if op == "d" else row, "op": op,
                          "ts_ms": ts + i})
        shown = image if op == "d" else row
        rows.append({**dict.fromkeys(row), **shown, "op": op, "ts_ms": datetime.fromtimestamp((ts + i) / 1000, UTC)})
    return envelopes, rows


change = st.tuples(st.integers(0, 3), st.sampled_from("cud"), st.integers(-9, 9), st.sampled_from(["x", "y"]),
                   st.sampled_from(["full", "key", "nulls"]))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(st.lists(change, min_size=1, max_size=4), min_size=1, max_size=3))
@example(batches=[[(1, "d", 0, "x", "nulls")]])  # a delete's before-image of the key and nulls
@example(batches=[[(0, "d", 0, "x", "full")]])  # the first create deleted again: nothing ever changed
def test_debezium_envelopes_match_reference_model(batches):
    """Whatever fields the images of a batch hold, the rows keep their types (the first batch fixes the table's:
    it starts with a create, as a table's history does)."""
    batches = [[(0, "c", 1, "x", "full"), *batches[0]], *batches[1:]]
    model = Model("changelog", key="id")
    with tempfile.TemporaryDirectory() as tmp:
        entity = entity_yaml(format={"kind": "ndjson"},
                             patterns=[{"name": "all", "root_location": "data", "glob_pattern": "/*.json"}],
                             cdc={"strategy": "changelog", "primary_key": ["id"], "debezium": True})
        cfg, pipeline, inbox = _prepared(config.load(write_config(Path(tmp), [entity])).entities[0])
        for b, changes in enumerate(batches):
            envelopes, rows = _envelopes(changes, 1_700_000_000_000 + 1000 * b)
            path = land(cfg.source.path / "data" / f"{b}.json", "".join(json.dumps(e) + "\n" for e in envelopes))
            pipeline.process(inbox.offer([FileEvent.of(path)]), b)
            model.apply_batch([rows])
            table = DeltaTable(str(cfg.table)).to_pyarrow_table()
            assert {r["id"]: r for r in table.to_pylist()} == model.state
        assert [table.schema.field(c).type for c in ("n", "amount", "name")] == [pa.int64(), pa.float64(), pa.string()]
        # No changelog table when nothing ever changed (a create and a delete of one key in one batch).
        log = DeltaTable(str(cfg.changelog)).to_pyarrow_table().sort_by("offset").to_pylist() \
            if cfg.changelog.exists() else []
        assert [(r["op"], {c: r["data_op" if c == "op" else c] for c in rows[0]}) for r in log] == model.changelog


def test_debezium_images_of_different_number_types_unify_to_the_wider():
    envelopes = pa.Table.from_pylist([{"before": {"id": 1, "amount": 2.5}, "after": {"id": 1, "amount": 3}, "op": "u"},
                                      {"before": {"id": 2, "amount": 2.5}, "after": None, "op": "d"}])
    rows = unwrap_debezium(envelopes)
    assert rows.schema.field("amount").type == pa.float64()
    assert rows.select(["id", "amount"]).to_pylist() == [{"id": 1, "amount": 3.0}, {"id": 2, "amount": 2.5}]
