"""Scoped snapshots (`cdc.snapshot_scope`) through the real pipeline and real Delta tables: each file is the
whole state of its scope only (the value its path gives the scope column), against a model of that."""

from __future__ import annotations

import json

import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lakefeed.config import model as config
from lakefeed.errors import ConfigError
from tests.conftest import entity_yaml, land, write_config
from tests.test_pipeline import _batch, _prepared, _removal, rows

APPEND, RETRACT, CORRECT_FROM, CORRECT_TO = 0, 1, 2, 3
REGIONS = ["north", "south", "east"]
SCHEMA_DOC = {"jsonSchemaSemanticVersion": "1.0.0", "definitions": [{"entityName": "sales", "hasAttributes": [
    {"name": "id", "dataFormat": "Int64"}, {"name": "v", "dataFormat": "String"}]}]}


def _entity(policy: str = "keep") -> dict:
    cdc = {"strategy": "snapshot", "primary_key": ["region", "id"], "snapshot_scope": "region",
           "on_snapshot_removed": policy}
    return entity_yaml(cdc=cdc, patterns=[{"name": "byRegion", "root_location": "sales",
                                           "regular_expression": r"/(\w+)/[^/]+\.csv", "parameters": ["region"]}])


def _lake(tmp_path, policy: str = "keep"):
    (tmp_path / "landing").mkdir()
    (tmp_path / "landing" / "sales.cdm.json").write_text(json.dumps(SCHEMA_DOC))  # the types, whatever lands first
    return _prepared(config.load(write_config(tmp_path, [_entity(policy)])).entities[0])


def _state(cfg) -> dict:
    return {(r["region"], r["id"]): r["v"] for r in rows(cfg.table).to_pylist()}


def _ops(cfg, batch_id: int) -> set:
    changelog = rows(cfg.changelog)
    batch = changelog.filter(pc.equal(changelog.column("batch_id"), batch_id)).to_pylist()
    return {(r["op"], r["region"], r["id"], r["v"]) for r in batch}


def _csv(cells: list[tuple[int, str]]) -> str:
    return "id,v\n" + "".join(f"{k},{v}\n" for k, v in cells)


files = st.lists(st.tuples(st.sampled_from(REGIONS), st.lists(st.tuples(st.integers(0, 3), st.sampled_from("xy")),
                                                              max_size=4)), min_size=1, max_size=3)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(files, min_size=1, max_size=4))
# Two files of one scope in a batch (the last wins, even empty), while another scope is left alone.
@example(batches=[[("north", [(1, "x")]), ("south", [(1, "x"), (2, "y")])],
                  [("north", [(1, "y"), (3, "x")]), ("north", [])]])
def test_a_file_is_the_whole_state_of_its_scope_only(tmp_path_factory, batches):
    cfg, pipeline, inbox = _lake(tmp_path_factory.mktemp("lake"))
    state: dict = {}
    for n, batch in enumerate(batches):
        paths = [land(cfg.source.path / "sales" / region / f"b{n}_f{i}.csv", _csv(cells))
                 for i, (region, cells) in enumerate(batch)]
        pipeline.process(_batch(inbox, *paths), n)
        last = {region: dict(cells) for region, cells in batch}  # of each scope, its last file; in it the last row
        before = dict(state)
        state = {k: v for k, v in state.items() if k[0] not in last}
        state.update({(region, k): v for region, cells in last.items() for k, v in cells.items()})
        expected = {(APPEND, *k, state[k]) for k in state.keys() - before.keys()}
        expected |= {(RETRACT, *k, before[k]) for k in before.keys() - state.keys()}
        for k in before.keys() & state.keys():
            if before[k] != state[k]:
                expected |= {(CORRECT_FROM, *k, before[k]), (CORRECT_TO, *k, state[k])}
        assert _state(cfg) == state, n
        assert (_ops(cfg, n) if cfg.changelog.exists() else set()) == expected, n


@pytest.mark.parametrize("policy", ["keep", "retract"])
def test_the_removal_of_a_scope_s_current_file_retracts_that_scope_only(tmp_path, policy):
    cfg, pipeline, inbox = _lake(tmp_path, policy)
    root = cfg.source.path / "sales"
    north, south = land(root / "north" / "s1.csv", _csv([(1, "x")])), land(root / "south" / "s1.csv", _csv([(1, "y")]))
    pipeline.process(_batch(inbox, north, south), 0)
    newer = land(root / "north" / "s2.csv", _csv([(2, "x")]))
    pipeline.process(_batch(inbox, newer), 1)
    north.unlink()
    pipeline.process(_removal(inbox, north), 2)  # not north's current file: nothing changes either way
    assert _state(cfg) == {("north", 2): "x", ("south", 1): "y"}
    newer.unlink()
    pipeline.process(_removal(inbox, newer), 3)
    assert _state(cfg) == ({("north", 2): "x", ("south", 1): "y"} if policy == "keep" else {("south", 1): "y"})
    assert _ops(cfg, 3) == (set() if policy == "keep" else {(RETRACT, "north", 2, "x")})


@pytest.mark.parametrize(("changes", "says"), [
    ({"cdc": {"strategy": "snapshot", "primary_key": ["id"], "snapshot_scope": "region"}},
     "snapshot_scope 'region' needs strategy snapshot, with the scope column in primary_key"),
    ({"cdc": {"strategy": "upsert", "primary_key": ["region", "id"], "snapshot_scope": "region"}},
     "snapshot_scope 'region' needs strategy snapshot"),
    ({"push": [{"name": "api", "tokens_sha256": ["0" * 64]}]},
     "cdc.snapshot_scope takes each file's scope from its path: pushed and Kafka records have none"),
])
def test_a_scope_needs_a_snapshot_keyed_by_it_and_files(tmp_path, changes, says):
    with pytest.raises(ConfigError) as caught:
        config.load(write_config(tmp_path, [{**_entity(), **changes}]))
    assert any(says in problem for problem in caught.value.problems), caught.value.problems
