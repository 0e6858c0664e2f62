"""File status times and partition entries, as the CDM manifest object defines them."""

from __future__ import annotations

from lakefeed.batch.discovery import Partition
from lakefeed.manifests.cdm import apply, partition_record


def _rec(location, mtime, kind=None, pattern="p", explicit=False, args=None):
    return partition_record(Partition(location, args or {}, kind, pattern, explicit), mtime)


def test_times_propagate_from_partitions_to_entity_to_manifest():
    doc = {"lastChildFileModifiedTime": "2019-01-01T00:00:00.000Z", "entities": []}
    entity = {"entityName": "e", "dataPartitionPatterns": [{"name": "p"}],
              "incrementalPartitionPatterns": [{"name": "u"}]}
    doc["entities"].append(entity)
    checked = "2024-05-01T10:00:00.000Z"
    apply(doc, entity, checked, [_rec("d/a.csv", "2024-04-01T00:00:00.000Z", args={"y": ["2024"]}),
                                 _rec("d/b.csv", "2024-04-03T00:00:00.000Z")], "2024-03-01T00:00:00.000Z")
    a, b = entity["dataPartitions"]
    assert a == {"location": "d/a.csv", "arguments": [{"name": "y", "value": "2024"}],
                 "lastFileStatusCheckTime": checked, "lastFileModifiedTime": "2024-04-01T00:00:00.000Z"}
    assert entity["dataPartitionPatterns"][0]["lastFileStatusCheckTime"] == checked
    assert entity["incrementalPartitionPatterns"][0]["lastFileStatusCheckTime"] == checked
    assert entity["lastFileStatusCheckTime"] == checked
    assert entity["lastFileModifiedTime"] == "2024-03-01T00:00:00.000Z"  # the schema document's time
    assert entity["lastChildFileModifiedTime"] == "2024-04-03T00:00:00.000Z"
    assert doc["lastChildFileModifiedTime"] == "2024-04-03T00:00:00.000Z"
    assert doc["lastFileStatusCheckTime"] == checked and "lastFileModifiedTime" not in doc  # no file time given

    # a later check with an older file keeps the latest child time; the manifest's file time is set once
    apply(doc, entity, "2024-05-02T00:00:00.000Z", [_rec("d/c.csv", "2024-01-01T00:00:00.000Z")], None,
          "2024-05-01T11:00:00.000Z")
    apply(doc, entity, "2024-05-03T00:00:00.000Z", [], None, "2024-05-02T11:00:00.000Z")
    assert doc["lastFileModifiedTime"] == "2024-05-01T11:00:00.000Z"  # lakefeed's own rewrites do not count
    assert entity["lastChildFileModifiedTime"] == "2024-04-03T00:00:00.000Z"
    assert entity["lastFileModifiedTime"] == "2024-03-01T00:00:00.000Z"


def test_incremental_partitions_carry_the_trait_and_pattern_name():
    doc, entity = {"entities": []}, {"entityName": "e"}
    apply(doc, entity, "2024-05-01T00:00:00.000Z",
          [_rec("/inc/2024/Upserts/1.csv", "2024-04-01T00:00:00.000Z", "Upsert", "UpsertPattern")], None)
    (p,) = entity["incrementalPartitions"]
    assert p["exhibitsTraits"] == [{"traitReference": "is.partition.incremental", "arguments": [
        {"name": "type", "value": "Upsert"}, {"name": "incrementPartitionPatternName", "value": "UpsertPattern"}]}]
    assert "dataPartitions" not in entity


def test_rewritten_file_updates_its_entry_and_explicit_entries_keep_their_arguments():
    doc = {"entities": []}
    entity = {"entityName": "e", "dataPartitions": [
        {"location": "d/listed.csv", "arguments": [{"name": "k", "value": "mine"}], "specializedSchema": "x",
         "lastFileModifiedTime": "2024-06-01T00:00:00.000Z"}]}
    apply(doc, entity, "2024-05-01T00:00:00.000Z", [_rec("d/a.csv", "2024-04-01T00:00:00.000Z", args={"v": ["1"]})],
          None)
    apply(doc, entity, "2024-05-02T00:00:00.000Z", [
        _rec("d/a.csv", "2024-04-02T00:00:00.000Z", args={"v": ["2"]}),
        _rec("/d/listed.csv", "2024-04-05T00:00:00.000Z", explicit=True, args={"k": ["mine"]})], None)
    listed, a = entity["dataPartitions"]
    assert len(entity["dataPartitions"]) == 2
    assert a["arguments"] == [{"name": "v", "value": "2"}] and a["lastFileModifiedTime"] == "2024-04-02T00:00:00.000Z"
    assert listed["arguments"] == [{"name": "k", "value": "mine"}] and listed["specializedSchema"] == "x"
    assert listed["lastFileModifiedTime"] == "2024-06-01T00:00:00.000Z"  # never moves backwards
    assert listed["lastFileStatusCheckTime"] == "2024-05-02T00:00:00.000Z"


def test_partitions_carry_their_patterns_traits_as_the_cdm_sdk_writes_them(tmp_path):
    """A pattern's format trait (and its arguments) goes onto each partition it finds, which readers need to
    parse the file; an incremental partition's incremental trait names its pattern. Compared with the SDK's
    fileStatusCheck on a copy of the same folder."""
    import json
    import shutil

    from lakefeed.config import model as config
    from lakefeed.inbox.files import FileEvent
    from tests import cdm_sdk
    from tests.conftest import entity_yaml, land, write_config
    from tests.test_cdc import SCHEMA_DOC
    from tests.test_pipeline import _prepared

    csv = {"traitReference": "is.partition.format.CSV",
           "arguments": [{"name": "columnHeaders", "value": "true"}, {"name": "delimiter", "value": ","}]}
    landing = tmp_path / "landing"
    landing.mkdir()
    manifest = {"manifestName": "default", "jsonSchemaSemanticVersion": "1.0.0", "entities": [{
        "type": "LocalEntity", "entityName": "sales", "entityPath": "sales.cdm.json/sales",
        "dataPartitionPatterns": [{"name": "full", "rootLocation": "sales", "globPattern": "/full/*.csv",
                                   "exhibitsTraits": [csv]}],
        "incrementalPartitionPatterns": [{"name": "ups", "rootLocation": "sales", "globPattern": "/ups/*.csv",
                                          "exhibitsTraits": [csv, {"traitReference": "is.partition.incremental",
                                                                   "arguments": [{"name": "type",
                                                                                  "value": "Upsert"}]}]}]}]}
    (landing / "default.manifest.cdm.json").write_text(json.dumps(manifest))
    (landing / "sales.cdm.json").write_text(json.dumps(SCHEMA_DOC))
    paths = [land(landing / "sales" / "full" / "a.csv", "k,v\n1,a\n"),
             land(landing / "sales" / "ups" / "b.csv", "k,v\n2,b\n")]
    shutil.copytree(landing, tmp_path / "sdk")
    entity = entity_yaml(patterns=[], cdc={"strategy": "upsert", "primary_key": ["k"]})
    cfg, pipeline, inbox = _prepared(config.load(write_config(tmp_path, [entity])).entities[0])
    pipeline.process(inbox.offer([FileEvent.of(p) for p in paths]), 0)

    def traits(items) -> set:
        return {(t["traitReference"], frozenset((a["name"], a["value"]) for a in t.get("arguments", ())))
                for t in items}

    ours = json.loads((landing / "default.manifest.cdm.json").read_text())["entities"][0]
    got = {p["location"]: traits(p["exhibitsTraits"]) for key in ("dataPartitions", "incrementalPartitions")
           for p in ours[key]}
    _, doc = cdm_sdk.partitions(tmp_path / "sdk", status_check=True, incremental=True)
    sdk_entity = doc.entities[0]
    wanted = {p.location: {(t.named_reference, frozenset((a.name, str(a.value)) for a in t.arguments))
                           for t in p.exhibits_traits}
              for p in [*sdk_entity.data_partitions, *sdk_entity.incremental_partitions]}
    assert got == wanted
    assert ("is.partition.format.CSV", frozenset({("columnHeaders", "true"), ("delimiter", ",")})) in got[
        "sales/full/a.csv"]
