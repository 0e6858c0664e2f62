"""`lakefeed manifest check` against Microsoft's CDM SDK fileStatusCheck on the same folders, and on trees."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from lakefeed.batch.discovery import Discovery
from lakefeed.manifests.cdm_check import check
from tests.cdm_sdk import _load

BASE_NS = 1_700_000_000_000_000_000


@pytest.fixture(autouse=True)
def _utc():
    """The SDK reads file times as local times and labels them UTC (fromtimestamp): compare where both agree."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if before is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = before
    time.tzset()


def _sdk(root: Path, manifest: str) -> dict:
    """What the SDK's fileStatusCheck (data and incremental) makes of a manifest, in comparable form."""
    from cdm.objectmodel import CdmLocalEntityDeclarationDefinition
    from cdm.utilities.time_utils import _get_formatted_date_string as stamp

    doc = asyncio.run(_load(root, manifest, True, True))
    entities = {}
    for e in doc.entities:
        if not isinstance(e, CdmLocalEntityDeclarationDefinition):
            entities[e.entity_name] = {"lastFileModifiedTime": stamp(e.last_file_modified_time)}
            continue
        partitions = {}
        for incremental, listed in ((False, e.data_partitions), (True, e.incremental_partitions)):
            for p in listed:
                traits = [(t.fetch_object_definition_name(), [(a.name, a.value) for a in t.arguments])
                          for t in p.exhibits_traits]
                args = {k: list(v) for k, v in p.arguments.items()}
                partitions[(p.location, incremental)] = (args, traits, stamp(p.last_file_modified_time))
        entities[e.entity_name] = {"partitions": partitions, "lastFileModifiedTime": stamp(e.last_file_modified_time)}
    return {"entities": entities, "lastFileModifiedTime": stamp(doc.last_file_modified_time),
            "lastChildFileModifiedTime": stamp(doc.last_child_file_modified_time),
            "subManifests": {s.definition: stamp(s.last_file_modified_time) for s in doc.sub_manifests}}


def _ours(path: Path) -> dict:
    doc = json.loads(path.read_text())
    entities = {}
    for e in doc.get("entities", []):
        if e.get("type") == "ReferencedEntity":
            entities[e["entityName"]] = {"lastFileModifiedTime": e.get("lastFileModifiedTime")}
            continue
        partitions = {}
        for incremental, key in ((False, "dataPartitions"), (True, "incrementalPartitions")):
            for p in e.get(key, []):
                traits = [(t["traitReference"], [(a["name"], a["value"]) for a in t.get("arguments", [])])
                          for t in p.get("exhibitsTraits", [])]
                args: dict[str, list[str]] = {}
                for a in p.get("arguments", []):
                    args.setdefault(a["name"], []).append(a["value"])
                partitions[(p["location"], incremental)] = (args, traits, p.get("lastFileModifiedTime"))
        entities[e["entityName"]] = {"partitions": partitions, "lastFileModifiedTime": e.get("lastFileModifiedTime")}
    return {"entities": entities, "lastFileModifiedTime": doc.get("lastFileModifiedTime"),
            "lastChildFileModifiedTime": doc.get("lastChildFileModifiedTime"),
            "subManifests": {s["definition"]: s.get("lastFileModifiedTime") for s in doc.get("subManifests", [])}}


def _land(root: Path, files: dict[str, int]) -> None:
    for rel, ms in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("id\n1\n")
        ns = BASE_NS + ms * 1_000_000
        os.utime(path, ns=(ns, ns))


def _checked_times(doc: dict) -> set[str]:
    return {o["lastFileStatusCheckTime"] for o in _walk(doc) if "lastFileStatusCheckTime" in o}


def _walk(obj):
    if isinstance(obj, dict):
        yield obj
        for v in obj.values():
            yield from _walk(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _walk(v)


CSV_TRAIT = {"traitReference": "is.partition.format.CSV",
             "arguments": [{"name": "columnHeaders", "value": "true"}, {"name": "delimiter", "value": ","}]}
names = st.sampled_from(["a/f1.csv", "a/f2.csv", "a/g1.txt", "a/c/f3.csv", "a/c/d/f4.csv", "b/f1.csv", "b/g2.txt",
                         "a/2024/01/f5.csv", "a/2024/02/f6.csv", "top.csv"])
files = st.dictionaries(names, st.integers(0, 10_000_000), min_size=0, max_size=10)
expressions = st.sampled_from([
    ("glob", "/*.csv", []), ("glob", "/**/*.csv", []), ("glob", "/**", []), ("glob", "/c/*.csv", []),
    ("glob", "/f?.csv", []), ("glob", "*/*.csv", []),
    ("regex", "/(f)(\\d)\\.csv", ["letter", "digit"]), ("regex", "/(\\w+)/(f\\d)\\.csv", ["folder"]),
    ("regex", ".*/(g)(\\d)\\.txt", ["g", "n", "extra"]), ("regex", "/(\\d{4})/(\\d{2})/[^/]+", ["year", "month"]),
    ("regex", "/(?:(x)|f)(\\d)\\.csv", ["x", "d"]),
])
patterns = st.lists(st.tuples(st.sampled_from(["a", "a/", "b", "a/c"]), expressions,
                              st.sampled_from([None, "Insert", "Upsert", "Delete"]), st.booleans()),
                    min_size=1, max_size=4)


def _manifest(pattern_list, explicit: list[str]) -> dict:
    entity: dict = {"type": "LocalEntity", "entityName": "E", "entityPath": "E.cdm.json/E",
                    "dataPartitionPatterns": [], "incrementalPartitionPatterns": []}
    for i, (root, (kind, expression, parameters), incremental, csv) in enumerate(pattern_list):
        decl: dict = {"name": f"p{i}", "rootLocation": root,
                      "globPattern" if kind == "glob" else "regularExpression": expression}
        if parameters:
            decl["parameters"] = parameters
        traits = [CSV_TRAIT] if csv else []
        if incremental:
            traits.append({"traitReference": "is.partition.incremental",
                           "arguments": [{"name": "type", "value": incremental}]})
        if traits:
            decl["exhibitsTraits"] = traits
        entity["incrementalPartitionPatterns" if incremental else "dataPartitionPatterns"].append(decl)
    if explicit:
        entity["dataPartitions"] = [{"location": loc} for loc in explicit]
    return {"manifestName": "default", "jsonSchemaSemanticVersion": "1.0.0", "entities": [entity]}


SLOW = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]


@settings(max_examples=30, deadline=None, suppress_health_check=SLOW)
@given(landed=files, pattern_list=patterns, explicit=st.lists(names, max_size=2, unique=True))
def test_with_sdk_precedence_the_check_writes_what_the_sdk_finds(landed, pattern_list, explicit):
    """Random folders and patterns: partitions (locations, arguments, traits, file times) and the manifest's times
    equal the SDK's fileStatusCheck; a second check finds nothing to write."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _land(root, landed)
        manifest = root / "default.manifest.cdm.json"
        manifest.write_text(json.dumps(_manifest(pattern_list, explicit)))
        expected = _sdk(root, manifest.name)  # read only: the SDK writes nothing unless saved
        report = check(manifest, "sdk")
        assert _ours(manifest) == expected
        doc = json.loads(manifest.read_text())
        assert all("lastFileStatusCheckTime" in p for e in doc["entities"]
                   for p in e.get("dataPartitions", []) + e.get("incrementalPartitions", []))  # missing files too
        assert report.manifests[0]["partitions_added"] == sum(
            len(e["partitions"]) for e in expected["entities"].values()) - len(explicit)
        stamp = manifest.stat().st_mtime_ns
        again = check(manifest, "sdk")
        assert [m["written"] for m in again.manifests] == [False] and manifest.stat().st_mtime_ns == stamp


@settings(max_examples=40, deadline=None, suppress_health_check=SLOW)
@given(landed=files, pattern_list=patterns)
def test_with_spec_precedence_each_file_is_the_partition_the_daemon_would_discover(landed, pattern_list):
    """One partition per file, of the last pattern processed, as the daemon's discovery finds it."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _land(root, landed)
        manifest = root / "default.manifest.cdm.json"
        declared = _manifest(pattern_list, [])
        manifest.write_text(json.dumps(declared))
        discovery = Discovery.from_entity(declared["entities"][0])
        expected = {}
        for rel in landed:
            found = discovery.match(rel)
            if found is not None:
                location = found.location.replace("//", "/")
                expected[(location.rstrip("/"), found.incremental_type is not None)] = found.arguments
        check(manifest, "spec")
        partitions = _ours(manifest)["entities"]["E"]["partitions"]
        assert {(loc, inc): args for (loc, inc), (args, _, _) in partitions.items()} == expected


def _tree(root: Path) -> None:
    """A root manifest with an entity (one explicit partition whose file is missing), an entity whose pattern finds
    nothing, a referenced entity, and a sub-manifest with its own entity."""
    _land(root, {"sales/2024/01/a.csv": 1000, "sales/2024/02/b.csv": 2000, "shop/orders/o1.csv": 3000,
                 "other/x.csv": 0, "slow/aaaaaaaaaaaaaaaaaaaa!": 0})
    (root / "other" / "other.manifest.cdm.json").write_text(json.dumps({
        "manifestName": "other", "jsonSchemaSemanticVersion": "1.0.0",
        "entities": [{"type": "LocalEntity", "entityName": "Borrowed", "entityPath": "Borrowed.cdm.json/Borrowed"}]}))
    (root / "shop" / "shop.manifest.cdm.json").write_text(json.dumps({
        "manifestName": "shop", "jsonSchemaSemanticVersion": "1.0.0",
        "entities": [{"type": "LocalEntity", "entityName": "Orders", "entityPath": "Orders.cdm.json/Orders",
                      "incrementalPartitionPatterns": [{
                          "name": "orders", "rootLocation": "orders", "globPattern": "/*.csv",
                          "exhibitsTraits": [{"traitReference": "is.partition.incremental",
                                              "arguments": [{"name": "type", "value": "Upsert"}]}]}]}]}))
    (root / "default.manifest.cdm.json").write_text(json.dumps({
        "manifestName": "default", "jsonSchemaSemanticVersion": "1.0.0",
        "entities": [
            {"type": "LocalEntity", "entityName": "Sales", "entityPath": "Sales.cdm.json/Sales",
             "dataPartitions": [{"location": "sales/gone.csv"}],
             "dataPartitionPatterns": [{"name": "monthly", "rootLocation": "sales", "parameters": ["year", "month"],
                                        "regularExpression": "/(\\d{4})/(\\d{2})/[^/]+\\.csv",
                                        "exhibitsTraits": [CSV_TRAIT]}]},
            {"type": "LocalEntity", "entityName": "Slow", "entityPath": "Slow.cdm.json/Slow",
             "dataPartitionPatterns": [{"name": "hostile", "rootLocation": "slow", "regularExpression": "/(a+)+$"}]},
            {"type": "ReferencedEntity", "entityName": "Borrowed",
             "entityPath": "other/other.manifest.cdm.json/Borrowed"}],
        "subManifests": [{"manifestName": "shop", "definition": "shop/shop.manifest.cdm.json"}]}))


def test_a_tree_is_checked_each_manifest_in_its_own_file_and_only_what_changed_is_written(tmp_path):
    _tree(tmp_path)
    root, sub = tmp_path / "default.manifest.cdm.json", tmp_path / "shop" / "shop.manifest.cdm.json"
    borrowed = tmp_path / "other" / "other.manifest.cdm.json"
    borrowed_before = (borrowed.read_bytes(), borrowed.stat().st_mtime_ns)
    report = check(root)
    assert {Path(m["manifest"]).name: (m["written"], m["partitions_added"]) for m in report.manifests} == {
        "shop.manifest.cdm.json": (True, 1), "default.manifest.cdm.json": (True, 2)}
    doc, sub_doc = json.loads(root.read_text()), json.loads(sub.read_text())
    sales, slow, ref = doc["entities"]
    assert sorted((p["location"], p.get("arguments")) for p in sales["dataPartitions"][1:]) == [
        ("sales/2024/01/a.csv", [{"name": "year", "value": "2024"}, {"name": "month", "value": "01"}]),
        ("sales/2024/02/b.csv", [{"name": "year", "value": "2024"}, {"name": "month", "value": "02"}])]
    gone = sales["dataPartitions"][0]  # its file is missing: checked, with no file time
    assert "lastFileStatusCheckTime" in gone and "lastFileModifiedTime" not in gone
    assert sales["dataPartitions"][1]["exhibitsTraits"] == [CSV_TRAIT]  # readers need the format's arguments
    assert "dataPartitions" not in slow  # a pattern that finds nothing adds no list
    assert ref["lastFileModifiedTime"] and borrowed_before == (borrowed.read_bytes(), borrowed.stat().st_mtime_ns)
    (orders,) = sub_doc["entities"][0]["incrementalPartitions"]
    assert orders["location"] == "orders/o1.csv" and orders["exhibitsTraits"][0]["arguments"][-1] == {
        "name": "incrementPartitionPatternName", "value": "orders"}
    assert doc["subManifests"][0]["lastFileModifiedTime"] == _stamp_of(sub)
    assert doc["lastChildFileModifiedTime"] == max(doc["subManifests"][0]["lastFileModifiedTime"],
                                                   sub_doc["lastChildFileModifiedTime"], ref["lastFileModifiedTime"])
    assert len(_checked_times(doc) | _checked_times(sub_doc)) == 1  # one check, one time
    # The SDK, on the sub-manifest as a root of its own, finds the same.
    assert _ours(sub)["entities"] == _sdk(tmp_path / "shop", sub.name)["entities"]

    stamps = (root.stat().st_mtime_ns, sub.stat().st_mtime_ns)
    assert not any(m["written"] for m in check(root).manifests)  # nothing changed: nothing written
    assert stamps == (root.stat().st_mtime_ns, sub.stat().st_mtime_ns)

    _land(tmp_path, {"shop/orders/o2.csv": 9_000_000})  # the newest file of the tree, in the sub-manifest
    report = check(root)
    assert {Path(m["manifest"]).name: (m["written"], m["partitions_added"]) for m in report.manifests} == {
        "shop.manifest.cdm.json": (True, 1), "default.manifest.cdm.json": (True, 0)}
    doc, sub_doc = json.loads(root.read_text()), json.loads(sub.read_text())
    newest = [p for p in sub_doc["entities"][0]["incrementalPartitions"] if p["location"] == "orders/o2.csv"]
    assert sub_doc["lastChildFileModifiedTime"] == newest[0]["lastFileModifiedTime"]
    assert doc["subManifests"][0]["lastFileModifiedTime"] == _stamp_of(sub)  # the sub-manifest was rewritten
    assert doc["lastChildFileModifiedTime"] >= sub_doc["lastChildFileModifiedTime"]


def _stamp_of(path: Path) -> str:
    from lakefeed import clock

    return clock.to_cdm(clock.from_ns(path.stat().st_mtime_ns // 1_000_000 * 1_000_000))


def test_a_broken_sub_manifest_is_reported_and_the_rest_of_the_tree_checked(tmp_path):
    _tree(tmp_path)
    (tmp_path / "shop" / "shop.manifest.cdm.json").write_text("{not json")
    report = check(tmp_path / "default.manifest.cdm.json")
    errors = [m for m in report.manifests if "error" in m]
    assert len(errors) == 1 and "not valid JSON" in errors[0]["error"]
    assert len(json.loads((tmp_path / "default.manifest.cdm.json").read_text())["entities"][0]["dataPartitions"]) == 3


def test_the_command_prints_its_report_and_says_what_is_wrong(tmp_path):
    _tree(tmp_path)
    shutil.rmtree(tmp_path / "slow")
    root = str(tmp_path / "default.manifest.cdm.json")
    run = subprocess.run([sys.executable, "-m", "lakefeed", "manifest", "check", root, "--precedence", "sdk"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert sum(m["partitions_added"] for m in report["manifests"]) == 3
    assert report["files_listed"] == 3  # only the folders under the patterns' roots are listed
    missing = subprocess.run([sys.executable, "-m", "lakefeed", "manifest", "check", str(tmp_path / "nope.json")],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "no manifest at" in missing.stderr


def test_large_manifests_spliced_as_text_are_the_json_a_dict_would_be(tmp_path, monkeypatch):
    """Above COMPACT_ABOVE partitions, found partitions are written as JSON text spliced into the document: the
    same document (names with quotes, backslashes and non-ASCII too), and the SDK reads it back."""
    from lakefeed.manifests import cdm_check

    names = {'a/q"uote.csv': 1, "a/back\\slash.csv": 2, "a/é tè.csv": 3, "a/2024/01/x.csv": 4, "a/tab\t.csv": 5}
    documents = []
    for compact_above in (10**9, 0):
        root = tmp_path / str(compact_above)
        _land(root, names)
        manifest = root / "default.manifest.cdm.json"
        manifest.write_text(json.dumps(_manifest([("a", ("regex", "/(\\w+)/(f)?.*", ["dir", "f"]), "Upsert", True),
                                                  ("a", ("glob", "/**", []), None, True)], ["a/gone.csv"])))
        monkeypatch.setattr(cdm_check, "COMPACT_ABOVE", compact_above)
        check(manifest, "sdk")
        doc = json.loads(manifest.read_text())
        for obj in _walk(doc):
            obj.pop("lastFileStatusCheckTime", None)  # this run's
        del doc["lastFileModifiedTime"], doc["lastChildFileModifiedTime"]  # the manifest file's own time
        documents.append(doc)
        if compact_above == 0:
            assert "\n" not in manifest.read_text().strip()  # the compact, spliced form
            assert _ours(manifest)["entities"] == _sdk(root, manifest.name)["entities"]
    assert documents[0] == documents[1]


@settings(max_examples=200, deadline=None)
@given(files=st.lists(st.tuples(st.sampled_from(["/f1.csv", "/x2.csv", "/2024/f3.csv", '/q"4.csv', "/é5.csv",
                                                 "/100%6.csv", "/f.csv", "/g7.txt"]),
                                st.integers(0, 2**62)  # and the last microseconds of a millisecond:
                                | st.tuples(st.integers(0, 4_000_000_000), st.integers(0, 999), st.integers(0, 999))
                                .map(lambda t: t[0] * 1_000_000_000 + t[1] * 1_000_000 + 999_000 + t[2])),
                      max_size=8),
       root=st.sampled_from(["", "data", "da%ta"]),
       expression=st.sampled_from(["/(?:(x)|f)(\\d)\\.csv", "/(.*?)(\\d)?\\.csv", "/.*", "(?:/(\\d{4}))?/[^/]+"]))
def test_partition_texts_made_in_one_pass_are_those_made_file_by_file(files, root, expression):
    """`PartitionText.many` (one `%` format per file where every name is plain) gives the text of one call per
    file: quotes, non-ASCII, `%` in names, parameters and traits, captures that took no part."""
    from lakefeed.batch.discovery import pattern_from_json
    from lakefeed.manifests.cdm_json import PartitionText, Stamps

    decl = {"name": "p%s", "rootLocation": root, "regularExpression": expression, "parameters": ["a%d", "b"],
            "exhibitsTraits": [{"traitReference": "is.partition.format.CSV",
                                "arguments": [{"name": "delimiter", "value": "%s"}]}]}
    pattern = pattern_from_json(decl, False)
    make = PartitionText(decl, pattern, False, "2026-11-23T10:00:00.000Z", Stamps())
    texts, newest = make.many(root, files, pattern.expression.fullmatch)
    one_by_one = [(make((root + name)[0 if root else 1:], match, mtime), mtime) for name, mtime in files
                  if (match := pattern.expression.fullmatch(name)) is not None]
    assert texts == [text for text, _ in one_by_one]
    assert newest == max((mtime for _, mtime in one_by_one), default=-1)
    assert all(json.loads(text)["location"] for text in texts)


@settings(max_examples=60, deadline=None, suppress_health_check=SLOW)
@given(landed=files, pattern_list=patterns, explicit=st.lists(names, max_size=2, unique=True))
def test_with_sdk_precedence_the_daemon_writes_what_the_sdk_finds(landed, pattern_list, explicit):
    """The daemon's manifest after a batch of the folder's files (`pattern_precedence: sdk`) equals what the SDK's
    fileStatusCheck makes of the same folder: a file both kinds of pattern find is ingested once and listed in
    both lists; partitions, arguments, traits, file times and the manifest's times agree."""
    from lakefeed.config import model as config
    from lakefeed.inbox.files import FileEvent, Inbox
    from lakefeed.pipeline.entity import EntityPipeline
    from lakefeed.pipeline.sinks import Sinks
    from tests.conftest import write_config

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        landing = work / "landing"
        landing.mkdir()
        _land(landing, landed)
        manifest = landing / "default.manifest.cdm.json"
        original = json.dumps(_manifest(pattern_list, explicit))
        manifest.write_text(original)
        os.utime(manifest, ns=(BASE_NS, BASE_NS))
        entity = {"name": "E", "source": {"type": "local_dir", "path": "landing"}, "manifest": str(manifest),
                  "format": {"kind": "csv", "header": True}, "pattern_precedence": "sdk",
                  "cdc": {"strategy": "upsert", "primary_key": ["id"]}}
        cfg = config.load(write_config(work, [entity])).entities[0]
        cfg.checkpoint.mkdir(parents=True)
        (cfg.checkpoint / "metadata").write_text(json.dumps({"id": "q-1"}))
        pipeline = EntityPipeline(cfg, Sinks.of(cfg))
        pipeline.prepare()
        inbox = Inbox(cfg.state / "inbox")
        result = pipeline.process(inbox.offer([FileEvent.of(landing / rel) for rel in sorted(landed)]), 0)
        assume(result.files > 0)  # the daemon writes the manifest after a commit; a batch of nobody's files has none

        peer = work / "peer"  # the same folder (with the schema document lakefeed wrote), the manifest as it was
        shutil.copytree(landing, peer)
        (peer / manifest.name).write_text(original)
        os.utime(peer / manifest.name, ns=(BASE_NS, BASE_NS))
        assert _ours(manifest) == _sdk(peer, manifest.name)


@settings(max_examples=300, deadline=None, suppress_health_check=SLOW)
@given(second=st.integers(0, 4_000_000_000), part=st.integers(0, 999_999_999)
       | st.integers(999_999_000, 999_999_999) | st.integers(0, 999).map(lambda n: n * 1_000_000 + 999_700))
def test_file_times_are_stamped_as_the_sdk_stamps_them(tmp_path, second, part):
    """The SDK reads a file's time as float seconds, rounds it to the microsecond and cuts it to the millisecond:
    the last ~0.5 µs of a millisecond is the next one (cutting the ns at once, as an earlier lakefeed did, made
    the SDK check's `lastFileModifiedTime` differ from the SDK's by a millisecond now and then)."""
    from datetime import UTC, datetime

    from cdm.utilities.time_utils import _get_formatted_date_string as sdk_stamp

    from lakefeed import clock
    from lakefeed.manifests.cdm_json import Stamps

    path = tmp_path / "f.csv"
    path.touch()
    os.utime(path, ns=(second * 1_000_000_000 + part,) * 2)
    sdk = sdk_stamp(datetime.fromtimestamp(os.path.getmtime(path), UTC))
    assert Stamps()(path.stat().st_mtime_ns) == sdk
    assert clock.to_cdm(clock.from_ns(path.stat().st_mtime_ns)) == sdk


def test_a_checked_manifest_keeps_its_mode_and_a_time_that_is_none_is_named(tmp_path):
    """The manifest is read by whoever reads the lake: a rewrite keeps the file's mode (a temporary file's 0600 would
    lock them out). A status time that is not ISO 8601 is an error naming it, and the file is left as it is."""
    _tree(tmp_path)
    root = tmp_path / "default.manifest.cdm.json"
    root.chmod(0o644)
    run = subprocess.run([sys.executable, "-m", "lakefeed", "manifest", "check", str(root)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["manifests"][0]["written"] and stat.S_IMODE(root.stat().st_mode) == 0o644
    doc = json.loads(root.read_text())
    doc["entities"][0]["dataPartitions"][0]["lastFileModifiedTime"] = "yesterday"
    root.write_text(json.dumps(doc))
    run = subprocess.run([sys.executable, "-m", "lakefeed", "manifest", "check", str(root)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert "/entities/0/dataPartitions/0/lastFileModifiedTime must be an ISO 8601 time" in run.stderr
    assert json.loads(root.read_text()) == doc
