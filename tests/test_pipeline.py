"""The commit protocol and manifest upkeep with real files and real Delta tables (no Spark needed)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from structlog.testing import capture_logs

from lakefeed import clock
from lakefeed.config import model as config
from lakefeed.connectors.sinks import cdm_manifest
from lakefeed.errors import ManifestError
from lakefeed.inbox.files import FileEvent, Inbox
from lakefeed.pipeline.entity import EntityPipeline
from lakefeed.pipeline.quarantine_files import LOGGED_ROWS
from lakefeed.pipeline.sinks import Sinks
from tests.conftest import entity_yaml, land, write_config


def _pipeline(cfg) -> EntityPipeline:
    """A pipeline as the daemon builds one (a new one is what a restart sees)."""
    return EntityPipeline(cfg, Sinks.of(cfg))


def _prepared(cfg):
    cfg.checkpoint.mkdir(parents=True)
    (cfg.checkpoint / "metadata").write_text(json.dumps({"id": "q-1"}))
    pipeline = _pipeline(cfg)
    pipeline.prepare()
    return cfg, pipeline, Inbox(cfg.state / "inbox")


@pytest.fixture
def setup(tmp_path):
    return _prepared(config.load(write_config(tmp_path)).entities[0])


def _batch(inbox, *paths):
    return inbox.offer([FileEvent.of(p) for p in paths])


def rows(uri):
    return DeltaTable(str(uri)).to_pyarrow_table()


def test_batch_appends_table_and_odf_changelog_and_quarantines_bad_rows(setup):
    cfg, pipeline, inbox = setup
    root = cfg.source.path
    a = land(root / "sales/2024/01/a.csv", "id,amount\n1,1.5\n2,x\n3\n")
    b = land(root / "sales/b.csv", "id,amount\n4,2.5\n")
    c = land(root / "sales/notes/readme.md", "hello")
    result = pipeline.process(_batch(inbox, a, b, c), 0)
    assert (result.files, result.rows, result.quarantined, result.unmatched) == (2, 3, 1, 1)
    table = rows(cfg.table).sort_by("id").to_pydict()
    assert table["id"] == [1, 2, 4] and table["year"] == ["2024", "2024", None]
    changelog = rows(cfg.changelog).sort_by("offset").to_pydict()
    assert changelog["offset"] == [0, 1, 2] and set(changelog["op"]) == {0}
    assert changelog["event_time"] == changelog["system_time"]
    assert set(changelog["source_file"]) == {"sales/2024/01/a.csv", "sales/b.csv"}  # manifest locations
    quarantine = rows(cfg.quarantine).to_pydict()
    assert quarantine["line"] == [4] and quarantine["raw"] == ["3"]
    assert quarantine["source_file"] == ["sales/2024/01/a.csv"]

    d = land(root / "sales/2024/02/d.csv", "id,amount\n5,1\n6,2\n")
    pipeline.process(_batch(inbox, d), 1)
    assert rows(cfg.changelog).sort_by("offset")["offset"].to_pylist() == [0, 1, 2, 3, 4]


def test_a_batch_logs_its_first_quarantined_rows_and_counts_the_rest_by_file(setup):
    """A hostile file of a million bad rows wrote a million log lines; all of them are in the quarantine table."""
    cfg, pipeline, inbox = setup
    root = cfg.source.path
    pipeline.process(_batch(inbox, land(root / "sales/a.csv", "id,amount\n1,1.5\n")), 0)
    many = land(root / "sales/many.csv", "id,amount\n" + "".join(f"{i},x{i}\n" for i in range(500)))
    few = land(root / "sales/few.csv", "id,amount\n1,y\n2,2.5\n")
    with capture_logs() as logs:
        result = pipeline.process(_batch(inbox, many, few), 1)
    assert result.quarantined == 501 and rows(cfg.quarantine).num_rows == 501
    assert len([e for e in logs if e["event"] == "row.quarantined"]) == LOGGED_ROWS
    [summary] = [e for e in logs if e["event"] == "rows.quarantined"]
    assert summary["rows"] == 501 and summary["files"] == {"sales/many.csv": 500, "sales/few.csv": 1}


def test_a_data_column_named_like_a_partition_argument_sends_the_file_to_quarantine(setup):
    """Pattern byMonth captures `year` and `month` from the path: a file with its own `year` column cannot
    take both, and neither value is dropped silently."""
    cfg, pipeline, inbox = setup
    root = cfg.source.path
    clash = land(root / "sales/2024/01/a.csv", "id,year\n1,1999\n2,2000\n")
    fine = land(root / "sales/2024/02/b.csv", "id,amount\n3,1.5\n")
    result = pipeline.process(_batch(inbox, clash, fine), 0)
    assert (result.files, result.rows, result.quarantined) == (2, 1, 1)
    assert rows(cfg.table).select(["id", "year", "month"]).to_pylist() == [{"id": 3, "year": "2024", "month": "02"}]
    quarantine = rows(cfg.quarantine).to_pylist()
    assert [(q["source_file"], q["raw"]) for q in quarantine] == [("sales/2024/01/a.csv", "2 rows not applied")]
    assert "'year'" in quarantine[0]["reason"] and "pattern 'byMonth'" in quarantine[0]["reason"]


def test_replayed_batch_changes_nothing(setup):
    cfg, pipeline, inbox = setup
    records = _batch(inbox, land(cfg.source.path / "sales/a.csv", "id\n1\n2\n"))
    pipeline.process(records, 0)
    versions = [DeltaTable(str(p)).version() for p in (cfg.table, cfg.changelog)]
    fresh = _pipeline(cfg)  # as after a restart
    assert fresh.process(records, 0).skipped
    assert [DeltaTable(str(p)).version() for p in (cfg.table, cfg.changelog)] == versions
    assert rows(cfg.table).num_rows == 2


def test_crash_after_changelog_commit_is_completed_on_replay(setup, monkeypatch):
    cfg, pipeline, inbox = setup
    records = _batch(inbox, land(cfg.source.path / "sales/a.csv", "id\n1\n2\n"))
    original = pipeline.sinks.table.commit_files

    def crash(*args, **kwargs):
        raise RuntimeError("killed between changelog and table commit")

    monkeypatch.setattr(pipeline.sinks.table, "commit_files", crash)
    with pytest.raises(RuntimeError):
        pipeline.process(records, 0)
    monkeypatch.setattr(pipeline.sinks.table, "commit_files", original)
    assert rows(cfg.changelog)["offset"].to_pylist() == [0, 1]
    fresh = _pipeline(cfg)
    fresh.process(records, 0)
    assert rows(cfg.table).num_rows == 2
    assert rows(cfg.changelog)["offset"].to_pylist() == [0, 1]  # not appended twice
    assert _parquet_files(cfg.table) == len(DeltaTable(str(cfg.table)).file_uris())  # the first try's file removed


def _parquet_files(table: Path) -> int:
    return sum(1 for _ in table.rglob("*.parquet"))


def test_crash_before_any_table_commit_is_completed_on_replay(setup, monkeypatch):
    cfg, pipeline, inbox = setup
    records = _batch(inbox, land(cfg.source.path / "sales/a.csv", "id\n1\n2\n"))
    monkeypatch.setattr(pipeline.sinks.changelog, "commit_files",
                        lambda *a: (_ for _ in ()).throw(OSError("kill")))  # a store fault: not parked
    with pytest.raises(OSError):
        pipeline.process(records, 0)
    assert _parquet_files(cfg.changelog) == 1 and _parquet_files(cfg.table) == 1  # written, not committed
    fresh = _pipeline(cfg)
    assert not fresh.process(records, 0).skipped
    assert rows(cfg.table).num_rows == 2  # not appended twice
    assert _parquet_files(cfg.table) == 1 and _parquet_files(cfg.changelog) == 1  # the first try's files removed
    assert rows(cfg.changelog)["offset"].to_pylist() == [0, 1]
    assert fresh.process(records, 0).skipped


def test_crash_before_manifest_write_is_repaired_by_next_batch(setup, monkeypatch):
    cfg, pipeline, inbox = setup
    save = cdm_manifest.save_text
    monkeypatch.setattr(cdm_manifest, "save_text", lambda *a: (_ for _ in ()).throw(OSError("disk gone")))
    with pytest.raises(OSError):
        pipeline.process(_batch(inbox, land(cfg.source.path / "sales/a.csv", "id\n1\n")), 0)
    assert rows(cfg.table).num_rows == 1  # committed, but the manifest missed it
    monkeypatch.setattr(cdm_manifest, "save_text", save)
    pipeline.process(_batch(inbox, land(cfg.source.path / "sales/b.csv", "id\n2\n")), 1)
    entity = cdm_manifest.find_entity(cdm_manifest.load(cfg.manifest), "sales")
    assert sorted(p["location"] for p in entity["dataPartitions"]) == ["sales/a.csv", "sales/b.csv"]


def test_while_files_wait_the_manifests_take_at_most_a_tenth_of_the_time(setup, monkeypatch):
    """A backlog's batches leave the manifests for later while their upkeep would take more than SHARE of the
    time; the batch that drains it (or one long enough after) brings them current with every file before."""
    from lakefeed.pipeline.pace import ManifestPace

    cfg, pipeline, inbox = setup
    now = [0.0]
    pipeline.pace = ManifestPace(lambda: now[0])
    refresh = pipeline.keeper.refresh

    def costly() -> int:  # a large manifest's rewrite: one second
        now[0] += 1.0
        return refresh()

    monkeypatch.setattr(pipeline.keeper, "refresh", costly)

    def listed() -> list[str]:
        entity = cdm_manifest.find_entity(cdm_manifest.load(cfg.manifest), "sales")
        return sorted(p["location"] for p in entity.get("dataPartitions", []))

    pipeline.backlog = lambda end: True
    pipeline.process(_batch(inbox, land(cfg.source.path / "sales/a.csv", "id\n1\n")), 0)
    assert listed() == ["sales/a.csv"]  # the first batch's: nothing measured yet
    pipeline.process(_batch(inbox, land(cfg.source.path / "sales/b.csv", "id\n2\n")), 1)
    assert listed() == ["sales/a.csv"]  # 1 s of upkeep just now: left for later
    now[0] += 8.5
    pipeline.process(_batch(inbox, land(cfg.source.path / "sales/c.csv", "id\n3\n")), 2)
    assert listed() == ["sales/a.csv"]  # 1 s in the last 9.5: still more than a tenth
    now[0] += 0.5
    pipeline.process(_batch(inbox, land(cfg.source.path / "sales/d.csv", "id\n4\n")), 3)
    assert listed() == ["sales/a.csv", "sales/b.csv", "sales/c.csv", "sales/d.csv"]  # a tenth: current again
    pipeline.process(_batch(inbox, land(cfg.source.path / "sales/e.csv", "id\n5\n")), 4)
    assert len(listed()) == 4
    pipeline.settle()  # a stop: no later batch comes
    assert len(listed()) == 5
    pipeline.backlog = lambda end: False  # the backlog drained: current at once
    pipeline.process(_batch(inbox, land(cfg.source.path / "sales/f.csv", "id\n6\n")), 5)
    assert len(listed()) == 6 and rows(cfg.table).num_rows == 6


def test_an_unchanged_manifest_is_not_parsed_again_but_any_edit_is_seen(setup, monkeypatch):
    cfg, pipeline, inbox = setup
    pipeline.process(_batch(inbox, land(cfg.source.path / "sales/a.csv", "id\n1\n")), 0)
    loads = []
    load = cdm_manifest.load
    monkeypatch.setattr(cdm_manifest, "load", lambda path: loads.append(path) or load(path))
    pipeline.process(_batch(inbox, land(cfg.source.path / "sales/b.csv", "id\n2\n")), 1)
    assert cfg.manifest not in loads  # the batch used the document it wrote itself
    # An edit in place that keeps the file's size and time (a tick of the file system's clock) is seen all the same.
    before = cfg.manifest.stat()
    with open(cfg.manifest, "r+", encoding="utf-8") as f:
        text = f.read().replace('"default"', '"defaulT"', 1)
        f.seek(0)
        f.write(text)
    os.utime(cfg.manifest, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert cfg.manifest.stat().st_size == before.st_size
    pipeline.process(_batch(inbox, land(cfg.source.path / "sales/c.csv", "id\n3\n")), 2)
    doc = cdm_manifest.load(cfg.manifest)
    assert doc["manifestName"] == "defaulT"  # the edit is kept: the batch read the file again
    entity = cdm_manifest.find_entity(doc, "sales")
    assert sorted(p["location"] for p in entity["dataPartitions"]) == ["sales/a.csv", "sales/b.csv", "sales/c.csv"]


def test_a_manifest_deleted_after_an_upgrade_comes_back_from_the_old_state_file(setup):
    cfg, pipeline, inbox = setup
    pipeline.process(_batch(inbox, land(cfg.source.path / "sales/a.csv", "id\n1\n")), 0)
    state = cfg.state / "manifest_state.json"  # as an earlier lakefeed wrote it: the declaration in the state
    entity = cdm_manifest.find_entity(cdm_manifest.load(cfg.manifest), "sales")
    state.write_text(json.dumps(json.loads(state.read_text()) | {"entity": entity}))
    (cfg.state / "manifest_copy.cdm.json").unlink()
    cfg.manifest.unlink()
    pipeline = _pipeline(cfg)
    pipeline.process(_batch(inbox, land(cfg.source.path / "sales/b.csv", "id\n2\n")), 1)
    entity = cdm_manifest.find_entity(cdm_manifest.load(cfg.manifest), "sales")
    assert sorted(p["location"] for p in entity["dataPartitions"]) == ["sales/a.csv", "sales/b.csv"]


def test_a_declaration_deleted_while_the_entity_was_down_comes_back_with_its_partitions(setup):
    cfg, pipeline, inbox = setup
    pipeline.process(_batch(inbox, land(cfg.source.path / "sales/a.csv", "id\n1\n")), 0)
    pipeline.settle()
    cfg.manifest.write_text(json.dumps({"manifestName": "default", "entities": []}))
    _pipeline(cfg).prepare()  # a start: the config's patterns alone would declare it with no partition
    entity = cdm_manifest.find_entity(cdm_manifest.load(cfg.manifest), "sales")
    assert [p["location"] for p in entity["dataPartitions"]] == ["sales/a.csv"]


def test_invalid_manifest_stops_the_entity_and_is_left_untouched(setup):
    cfg, pipeline, inbox = setup
    cfg.manifest.write_text('{"manifestName": "default", "entities": [')
    with pytest.raises(ManifestError, match="not valid JSON.*left it untouched"):
        pipeline.process(_batch(inbox, land(cfg.source.path / "sales/a.csv", "id\n1\n")), 0)
    assert cfg.manifest.read_text() == '{"manifestName": "default", "entities": ['


def test_vanished_and_rewritten_files_are_skipped(setup):
    cfg, pipeline, inbox = setup
    gone = land(cfg.source.path / "sales/gone.csv", "id\n1\n")
    changed = land(cfg.source.path / "sales/changed.csv", "id\n2\n")
    records = _batch(inbox, gone, changed)
    gone.unlink()
    changed.write_text("id\n2\n3\n")
    assert pipeline.process(records, 0).files == 0
    later = _batch(inbox, changed)  # the rewrite has its own identity, so its own inbox record
    assert pipeline.process(later, 1).rows == 2


def test_existing_manifest_keeps_every_other_field_and_explicit_partitions(tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    manifest = {
        "manifestName": "default", "jsonSchemaSemanticVersion": "1.0.0", "customKey": {"keep": [1, 2]},
        "imports": [{"corpusPath": "cdm:/foundations.cdm.json"}],
        "entities": [
            {"type": "LocalEntity", "entityName": "sales", "entityPath": "sales.cdm.json/sales", "x-note": "mine",
             "dataPartitionPatterns": [{"name": "p", "rootLocation": "sales", "regularExpression": r"/(\w+)\.csv",
                                        "parameters": ["name"]}],
             "dataPartitions": [{"location": "sales/listed.csv", "arguments": [{"name": "name", "value": "LISTED"}],
                                 "lastFileModifiedTime": "2020-01-01T00:00:00.000Z"},
                                {"location": "sales/missing.csv"}]},
            {"type": "ReferencedEntity", "entityName": "Other", "entityPath": "other/x.manifest.cdm.json/Other"}],
        "relationships": [{"fromEntity": "a", "fromEntityAttribute": "b", "toEntity": "c", "toEntityAttribute": "d"}],
        "subManifests": [{"name": "sub", "definition": "sub/sub.manifest.cdm.json"}],
    }
    (landing / "default.manifest.cdm.json").write_text(json.dumps(manifest))
    written = (landing / "default.manifest.cdm.json").stat().st_mtime_ns
    (landing / "sales.cdm.json").write_text(json.dumps({"jsonSchemaSemanticVersion": "1.0.0", "definitions": [
        {"entityName": "sales", "hasAttributes": [{"name": "id", "dataFormat": "Int64"},
                                                  {"name": "amount", "dataFormat": "Double"}]}]}))
    cfg, pipeline, inbox = _prepared(config.load(write_config(tmp_path, [entity_yaml(patterns=[])])).entities[0])
    files = [land(landing / "sales/listed.csv", "id,amount\n1,2\n"),
             land(landing / "sales/new.csv", "id,amount\n2,x\n")]
    result = pipeline.process(_batch(inbox, *files), 0)
    assert result.quarantined == 1  # "x" is not a Double per the entity schema document
    assert rows(cfg.table).schema.field("amount").type == pa.float64()
    doc = cdm_manifest.load(cfg.manifest)
    for key in ("customKey", "imports", "relationships", "subManifests", "jsonSchemaSemanticVersion"):
        assert doc[key] == manifest[key]
    borrowed = doc["entities"][1]  # kept as it was, checked (its owner's manifest is not there to give a time)
    assert borrowed.pop("lastFileStatusCheckTime") == _sales_checked(doc) and borrowed == manifest["entities"][1]
    sales = doc["entities"][0]
    assert sales["x-note"] == "mine"
    parts = {p["location"]: p for p in sales["dataPartitions"]}
    assert parts["sales/listed.csv"]["arguments"] == [{"name": "name", "value": "LISTED"}]
    assert parts["sales/listed.csv"]["lastFileModifiedTime"] > "2020-01-01T00:00:00.000Z"
    assert parts["sales/new.csv"]["arguments"] == [{"name": "name", "value": "new"}]
    # file times propagate upwards: partition -> entity -> manifest
    child = max(p["lastFileModifiedTime"] for p in parts.values() if "lastFileModifiedTime" in p)
    assert sales["lastChildFileModifiedTime"] == child
    assert doc["lastChildFileModifiedTime"] >= child
    assert sales["dataPartitionPatterns"][0]["lastFileStatusCheckTime"] == sales["lastFileStatusCheckTime"]
    # a listed partition whose file is missing is checked all the same; the manifest's time is its file's
    assert parts["sales/missing.csv"] == {"location": "sales/missing.csv",
                                          "lastFileStatusCheckTime": sales["lastFileStatusCheckTime"]}
    assert doc["lastFileModifiedTime"] == clock.to_cdm(clock.from_ns(written))
    assert doc["lastFileStatusCheckTime"] == sales["lastFileStatusCheckTime"]


def test_an_entity_the_manifest_only_borrows_is_refused_with_what_to_do(tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    manifest = {"manifestName": "default", "jsonSchemaSemanticVersion": "1.0.0", "entities": [
        {"type": "ReferencedEntity", "entityName": "sales", "entityPath": "other/x.manifest.cdm.json/sales"}]}
    (landing / "default.manifest.cdm.json").write_text(json.dumps(manifest))
    cfg = config.load(write_config(tmp_path, [entity_yaml(patterns=[])])).entities[0]
    with pytest.raises(ManifestError, match="borrows entity 'sales' from other/x.manifest.cdm.json/sales"):
        _prepared(cfg)
    assert json.loads((landing / "default.manifest.cdm.json").read_text()) == manifest  # never written


def _sales_checked(doc) -> str:
    return next(e for e in doc["entities"] if e["entityName"] == "sales")["lastFileStatusCheckTime"]


def _removal(inbox, path):
    return inbox.offer([FileEvent(str(path), 0, 1_795_000_000_000_000_000, "v1", removed=True)])


def _partitions(cfg) -> set[str]:
    (entity,) = cdm_manifest.load(cfg.manifest)["entities"]
    return {p["location"] for p in entity.get("dataPartitions", [])}


@pytest.mark.parametrize("policy", ["keep", "retract"])
def test_a_removed_object_leaves_the_manifest_and_a_snapshot_follows_the_policy(tmp_path, policy):
    entity = entity_yaml(cdc={"strategy": "snapshot", "primary_key": ["id"], "on_snapshot_removed": policy})
    cfg, pipeline, inbox = _prepared(config.load(write_config(tmp_path, [entity])).entities[0])
    root = cfg.source.path
    old = land(root / "sales/s1.csv", "id,v\n1,a\n2,b\n")
    pipeline.process(_batch(inbox, old), 0)
    new = land(root / "sales/s2.csv", "id,v\n2,b\n3,c\n")
    pipeline.process(_batch(inbox, new), 1)
    assert _partitions(cfg) == {"sales/s1.csv", "sales/s2.csv"}
    old.unlink()
    pipeline.process(_removal(inbox, old), 2)  # an older snapshot's object: the state stays either way
    assert _partitions(cfg) == {"sales/s2.csv"}
    assert sorted(rows(cfg.table).to_pydict()["id"]) == [2, 3]
    new.unlink()
    pipeline.process(_removal(inbox, new), 3)  # the current one's
    assert _partitions(cfg) == set()
    assert sorted(rows(cfg.table).to_pydict()["id"]) == ([2, 3] if policy == "keep" else [])
    ops = rows(cfg.changelog).filter(pa.compute.equal(rows(cfg.changelog).column("batch_id"), 3)).to_pydict()
    assert sorted(ops["op"]) == ([] if policy == "keep" else [1, 1])  # retractions, ODF op 1
    again = land(root / "sales/s3.csv", "id,v\n9,z\n")
    pipeline.process(_batch(inbox, again), 4)
    assert sorted(rows(cfg.table).to_pydict()["id"]) == [9]


def test_a_file_of_a_sibling_entity_is_not_unmatched_but_a_file_of_nobody_is(tmp_path):
    from structlog.testing import capture_logs

    path = write_config(tmp_path, [entity_yaml("sales"), entity_yaml("returns")])
    sales, returns = config.load(path).entities
    for cfg in (returns, sales):  # both declared in the shared manifest
        _prepared(cfg)
    _, pipeline, inbox = sales, _pipeline(sales), Inbox(sales.state / "inbox")
    root = sales.source.path
    theirs = land(root / "returns/r.csv", "id\n1\n")
    nobodys = land(root / "misc/x.csv", "id\n2\n")
    with capture_logs() as logs:
        result = pipeline.process(_batch(inbox, theirs, nobodys), 0)
    unmatched = [e["relative"] for e in logs if e["event"] == "file.unmatched"]
    assert unmatched == ["misc/x.csv"] and result.unmatched == 2


def test_nested_unsigned_integers_are_stored_as_64_bit_ones_and_the_table_stays_readable(tmp_path):
    """A nested uint8 was kept as it was: Delta's log said `byte`, the Parquet file held 200, and no reader could read
    the table any more ("Integer value 200 not in range: 0 to 127")."""
    entity = entity_yaml(format={"kind": "parquet"},
                         patterns=[{"name": "flat", "root_location": "sales", "glob_pattern": "/*.parquet"}])
    cfg, pipeline, inbox = _prepared(config.load(write_config(tmp_path, [entity])).entities[0])
    kinds = pa.struct([("u8", pa.uint8()), ("u16", pa.uint16()), ("u32", pa.uint32())])
    path = cfg.source.path / "sales" / "a.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(pa.table({"id": [1], "s": pa.array([{"u8": 255, "u16": 65535, "u32": 2**32 - 1}], kinds),
                             "l": pa.array([[200]], pa.list_(pa.uint8()))}), path)
    result = pipeline.process(_batch(inbox, path), 0)
    assert (result.rows, result.quarantined) == (1, 0)
    table = rows(cfg.table)
    assert table.schema.field("s").type == pa.struct([(n, pa.int64()) for n in ("u8", "u16", "u32")])
    assert table.select(["id", "s", "l"]).to_pylist() == [
        {"id": 1, "s": {"u8": 255, "u16": 65535, "u32": 2**32 - 1}, "l": [200]}]
    assert rows(cfg.changelog).column("s").to_pylist() == [{"u8": 255, "u16": 65535, "u32": 2**32 - 1}]
