"""`cdm_root`: one config entry for a CDM manifest tree, each local entity of it an entity of lakefeed."""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path

import pytest
import yaml
from deltalake import DeltaTable

from lakefeed import clock
from lakefeed.config import model as config
from lakefeed.errors import ConfigError
from lakefeed.manifests import cdm_parents
from tests.conftest import land, wait_for, write_config

INCREMENTAL = {"traitReference": "is.partition.incremental", "arguments": [{"name": "type", "value": "Upsert"}]}


def _entity(name: str, root: str, **extra) -> dict:
    return {"type": "LocalEntity", "entityName": name, "entityPath": f"{name}.cdm.json/{name}",
            "dataPartitionPatterns": [{"name": "all", "rootLocation": root, "globPattern": "/*.csv"}], **extra}


def _tree(landing: Path) -> None:
    """default: Sales, Items and a borrowed Customers; sub-manifest shop/: Orders (with an incremental pattern)."""
    (landing / "shop").mkdir(parents=True)
    (landing / "crm").mkdir()
    (landing / "crm" / "crm.manifest.cdm.json").write_text(json.dumps({  # owns Customers; no entry of the config
        "manifestName": "crm", "jsonSchemaSemanticVersion": "1.0.0", "entities": [_entity("Customers", "people")]}))
    (landing / "default.manifest.cdm.json").write_text(json.dumps({
        "manifestName": "default", "jsonSchemaSemanticVersion": "1.0.0",
        "entities": [_entity("Sales", "sales"), _entity("Items", "items"),
                     {"type": "ReferencedEntity", "entityName": "Customers",
                      "entityPath": "crm/crm.manifest.cdm.json/Customers"}],
        "subManifests": [{"manifestName": "shop", "definition": "shop/shop.manifest.cdm.json"}]}))
    (landing / "shop" / "shop.manifest.cdm.json").write_text(json.dumps({
        "manifestName": "shop", "jsonSchemaSemanticVersion": "1.0.0",
        "entities": [{"type": "LocalEntity", "entityName": "Orders", "entityPath": "Orders.cdm.json/Orders",
                      "incrementalPartitionPatterns": [{"name": "changes", "rootLocation": "orders",
                                                        "globPattern": "/*.csv", "exhibitsTraits": [INCREMENTAL]}]}],
        "subManifests": [{"manifestName": "back", "definition": "/default.manifest.cdm.json"}]}))  # a cycle


def _config(tmp_path: Path, **entry) -> Path:
    path = write_config(tmp_path, [{"cdm_root": "landing/default.manifest.cdm.json", **entry}])
    return path


def test_every_local_entity_of_the_tree_is_an_entity_with_its_own_manifest(tmp_path):
    _tree(tmp_path / "landing")
    cfg = config.load(_config(tmp_path, defaults={"format": {"kind": "csv", "header": True}},
                              overrides={"Orders": {"cdc": {"strategy": "upsert_and_delete", "primary_key": ["id"],
                                                            "delete_column": "gone"}}}))
    found = {e.name: e for e in cfg.entities}
    assert set(found) == {"Sales", "Items", "Orders"}  # not the borrowed Customers
    landing = tmp_path / "landing"
    assert found["Sales"].manifest == found["Items"].manifest == landing / "default.manifest.cdm.json"
    assert found["Orders"].manifest == landing / "shop" / "shop.manifest.cdm.json"
    assert found["Orders"].source.path == landing / "shop" and found["Sales"].source.path == landing
    assert found["Orders"].cdc.strategy == "upsert_and_delete" and found["Sales"].cdc.strategy == "append"
    assert all(e.format.header for e in cfg.entities)
    assert found["Items"].table == tmp_path / "lake" / "Items" / "table"
    assert found["Orders"].cdm_parents == (landing / "default.manifest.cdm.json",) and found["Sales"].cdm_parents == ()

    # An entity added to a manifest joins at the next load (a reload).
    doc = json.loads((landing / "shop" / "shop.manifest.cdm.json").read_text())
    doc["entities"].append(_entity("Returns", "returns"))
    (landing / "shop" / "shop.manifest.cdm.json").write_text(json.dumps(doc))
    assert {e.name for e in config.load(tmp_path / "lakefeed.yaml").entities} == {"Sales", "Items", "Orders",
                                                                                  "Returns"}


@pytest.mark.parametrize(("entry", "expected"), [
    ({"cdm_root": "landing/none.manifest.cdm.json"}, "entities.0.cdm_root: no manifest at"),
    ({"overrides": {"Nope": {}}}, "entities.0.cdm_root: overrides name entities the tree of"),
    ({"colour": "red"}, "entities.0.cdm_root: unknown key(s) colour beside cdm_root"),
    ({"overrides": {"Orders": {"cdc": {"strategy": "sometimes"}}}}, "entities.0.[Orders].cdc.strategy"),
])
def test_a_bad_tree_entry_is_reported_at_its_line(tmp_path, entry, expected):
    _tree(tmp_path / "landing")
    path = tmp_path / "lakefeed.yaml"
    entities = [{"name": "plain", "source": {"type": "local_dir", "path": "landing"},
                 "patterns": [{"name": "p", "root_location": "x", "glob_pattern": "/*.csv"}]},
                {"cdm_root": "landing/default.manifest.cdm.json", **entry}]
    path.write_text(yaml.safe_dump({"lake_dir": "lake", "state_dir": "state", "entities": entities}, sort_keys=False))
    with pytest.raises(ConfigError) as caught:
        config.load(path)
    expected = expected.replace("entities.0", "entities.1")
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "cdm_root" in text)
    assert any(expected in p and p.startswith(f"{path}:{line}:") for p in caught.value.problems), \
        caught.value.problems


def test_the_daemon_keeps_each_manifest_of_the_tree(tmp_path):
    from tests.test_daemon_process import Daemon

    landing = tmp_path / "landing"
    _tree(landing)
    path = _config(tmp_path, overrides={"Orders": {"cdc": {"strategy": "upsert", "primary_key": ["id"]}}})
    with Daemon(path, tmp_path / "daemon.log") as daemon:
        daemon.start()
        land(landing / "sales" / "a.csv", "id,v\n1,a\n2,a\n")
        land(landing / "shop" / "orders" / "o1.csv", "id,v\n1,x\n")

        def partitions(manifest: Path, name: str, key: str) -> list[str]:
            doc = json.loads(manifest.read_text())
            entity = next(e for e in doc["entities"] if e["entityName"] == name)
            return sorted(p["location"] for p in entity.get(key, []))

        root, shop = landing / "default.manifest.cdm.json", landing / "shop" / "shop.manifest.cdm.json"
        wait_for(lambda: partitions(shop, "Orders", "incrementalPartitions") == ["orders/o1.csv"], 90, 0.5, "o1")
        land(landing / "shop" / "orders" / "o2.csv", "id,v\n1,y\n2,y\n")  # after o1: its upsert wins
        wait_for(lambda: partitions(root, "Sales", "dataPartitions") == ["sales/a.csv"]
                 and partitions(shop, "Orders", "incrementalPartitions") == ["orders/o1.csv", "orders/o2.csv"],
                 90, 0.5, "both manifests")

        def root_knows_shop() -> bool:  # the root's declaration of the sub-manifest follows its file
            doc, sub = json.loads(root.read_text()), json.loads(shop.read_text())
            declared = doc["subManifests"][0]
            return declared.get("lastFileModifiedTime") == clock.to_cdm(clock.from_ns(
                shop.stat().st_mtime_ns)) and doc.get("lastChildFileModifiedTime", "") >= sub[
                "lastChildFileModifiedTime"] and "lastFileStatusCheckTime" in declared

        wait_for(root_knows_shop, 30, 0.2, "the root's subManifests declaration current")
        orders = DeltaTable(str(tmp_path / "lake" / "Orders" / "table")).to_pyarrow_table()
        assert sorted(zip(orders["id"].to_pylist(), orders["v"].to_pylist(), strict=True)) == [(1, "y"), (2, "y")]
        crm = landing / "crm" / "crm.manifest.cdm.json"
        customers = next(e for e in json.loads(root.read_text())["entities"] if e["entityName"] == "Customers")
        assert customers["lastFileModifiedTime"] == clock.to_cdm(clock.from_ns(crm.stat().st_mtime_ns))
        assert "lastFileStatusCheckTime" in customers  # the borrowed entity is checked; its owner is only read
        assert "lastFileStatusCheckTime" not in crm.read_text()

        # An entity added to a manifest of the tree by hand joins without a SIGHUP; the daemon's own writes of
        # the manifests (every batch above) were no config change.
        assert daemon.events("config.changed") == 0
        doc = json.loads(shop.read_text())
        doc["entities"].append(_entity("Returns", "returns"))
        shop.write_text(json.dumps(doc))
        wait_for(lambda: daemon.events("reload.applied") == 1, 60, 0.2, "the reload an edit of the tree makes")
        land(landing / "shop" / "returns" / "r1.csv", "id,v\n7,r\n")
        wait_for(lambda: partitions(shop, "Returns", "dataPartitions") == ["returns/r1.csv"], 90, 0.5, "Returns")
        returns = DeltaTable(str(tmp_path / "lake" / "Returns" / "table")).to_pyarrow_table()
        assert returns["id"].to_pylist() == [7]
        assert partitions(shop, "Orders", "incrementalPartitions") == ["orders/o1.csv", "orders/o2.csv"]
        assert daemon.events("config.changed") == 1
        daemon.stop(60)


@pytest.mark.parametrize(("document", "expected"), [
    ('{"manifestName": "default", "entities": 5}', "entities must be a list, not int"),
    ('{"manifestName": "default", "entities": [], "subManifests": true}', "subManifests must be a list, not bool"),
    ('{"manifestName": "default", "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    ("{ oops", "cannot be read"),
])
def test_a_tree_manifest_edited_into_a_bad_shape_is_a_config_problem_at_its_entry(tmp_path, document, expected):
    """The tree's manifests are read at every (re)load: whatever one holds is a problem the reload reports (and the
    running config is kept), never an exception that ends the daemon."""
    (tmp_path / "landing").mkdir()
    (tmp_path / "landing" / "default.manifest.cdm.json").write_text(document)
    path = _config(tmp_path)
    with pytest.raises(ConfigError) as caught:
        config.load(path)
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "cdm_root" in text)
    assert any(expected in p and p.startswith(f"{path}:{line}: entities.0.cdm_root") for p in caught.value.problems), \
        caught.value.problems


def test_a_parent_manifest_that_cannot_be_read_is_left_to_its_owner(tmp_path):
    """A sub-manifest's entity goes on when a manifest above it is broken: the parent is logged and left as it is."""
    _tree(tmp_path / "landing")
    landing = tmp_path / "landing"
    root, shop = landing / "default.manifest.cdm.json", landing / "shop" / "shop.manifest.cdm.json"
    for broken in ("{ oops", json.dumps({"manifestName": "default", "lastChildFileModifiedTime": "yesterday"})):
        root.write_text(broken)
        assert cdm_parents.propagate(shop, (root,), clock.to_cdm(clock.now()), lambda _: nullcontext(), 1000) == []
        assert root.read_text() == broken
    root.write_text(json.dumps({"manifestName": "default", "subManifests": [
        {"manifestName": "shop", "definition": "shop/shop.manifest.cdm.json"}]}))
    assert cdm_parents.propagate(shop, (root,), clock.to_cdm(clock.now()), lambda _: nullcontext(), 1000) == [root]
    assert json.loads(root.read_text())["subManifests"][0]["lastFileModifiedTime"] == clock.to_cdm(
        clock.from_ns(shop.stat().st_mtime_ns))
