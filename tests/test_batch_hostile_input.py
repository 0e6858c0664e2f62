"""Landed input that used to crash a batch, through the real pipeline and real Delta tables (no Spark): each case's
rows are applied or quarantined (or the file left unmatched) with the reason, and the entity goes on."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from structlog.testing import capture_logs

from lakefeed.config import model as config
from lakefeed.inbox.files import FileEvent
from lakefeed.pipeline.verify import verify
from tests.conftest import entity_yaml, land, write_config
from tests.test_cdc import SCHEMA_DOC, _csv, _row
from tests.test_pipeline import _prepared

INCREMENTAL = "is.partition.incremental"


def _rows(table: Path) -> list[dict]:
    return DeltaTable(str(table)).to_pyarrow_table().to_pylist() if (table / "_delta_log").exists() else []


def _process(pipeline, inbox, batch_id: int, *paths: Path):
    return pipeline.process(inbox.offer([FileEvent.of(str(p)) for p in paths]), batch_id)


def _listed(location: str, *arguments: dict) -> dict:
    """An explicit incremental partition whose trait carries `arguments` (none: the trait is left out)."""
    traits = [{"traitReference": INCREMENTAL, "arguments": list(arguments)}] if arguments else []
    return {"location": location, "exhibitsTraits": traits}


def test_explicit_incremental_partitions_without_a_valid_type_are_unmatched_with_what_to_fix(tmp_path):
    """`type` is required and has no default (foundations.cdm.json): a lowercase one, none, or no trait at all
    leaves the file unmatched with the reason, once; the pattern that also matches it does not take it (an
    inferred partition never overwrites a listed one); the valid partition of the same batch and the next file
    are applied."""
    landing = tmp_path / "landing"
    landing.mkdir()
    upsert = {"name": "type", "value": "Upsert"}
    entity = {"type": "LocalEntity", "entityName": "sales", "entityPath": "sales.cdm.json/sales",
              "incrementalPartitions": [
                  _listed("inc/lower.csv", {"name": "type", "value": "upsert"}),
                  _listed("inc/untyped.csv", {"name": "incrementPartitionPatternName", "value": "p"}),
                  _listed("inc/untraited.csv"),
                  _listed("inc/good.csv", upsert)],
              "incrementalPartitionPatterns": [{"name": "all", "rootLocation": "inc", "globPattern": "/*.csv",
                                                "exhibitsTraits": [{"traitReference": INCREMENTAL,
                                                                    "arguments": [upsert]}]}]}
    (landing / "default.manifest.cdm.json").write_text(json.dumps(
        {"manifestName": "default", "jsonSchemaSemanticVersion": "1.0.0", "entities": [entity]}))
    (landing / "sales.cdm.json").write_text(json.dumps(SCHEMA_DOC))
    cdc = {"strategy": "upsert_and_delete", "primary_key": ["k"]}  # not the kind a missing type would become
    cfg, pipeline, inbox = _prepared(config.load(write_config(tmp_path, [entity_yaml(patterns=[], cdc=cdc)]))
                                     .entities[0])
    names = ("lower", "untyped", "untraited", "good")
    paths = [land(landing / "inc" / f"{n}.csv", _csv([_row(i, n, 0, "d")])) for i, n in enumerate(names)]
    with capture_logs() as logs:
        result = _process(pipeline, inbox, 0, *paths)
    assert (result.files, result.unmatched, result.quarantined) == (1, 3, 0)
    assert [(r["k"], r["v"]) for r in _rows(cfg.table)] == [(3, "good")]  # IsDelete is no delete for Upsert
    assert _rows(cfg.quarantine) == []
    invalid = {e["location"]: e["reason"] for e in logs if e["event"] == "partition.invalid"}
    assert len([e for e in logs if e["event"] == "partition.invalid"]) == 3  # once each
    assert "write 'Upsert' (types are case-sensitive)" in invalid["inc/lower.csv"]
    assert "has no `type` (it has no default)" in invalid["inc/untyped.csv"]
    assert f"carries no trait {INCREMENTAL}" in invalid["inc/untraited.csv"]
    unmatched = {e["relative"]: e["reason"] for e in logs if e["event"] == "file.unmatched"}
    assert set(unmatched) == {"inc/lower.csv", "inc/untyped.csv", "inc/untraited.csv"}
    assert all(r.endswith("fix the manifest, then land the file again") for r in unmatched.values())

    later = land(landing / "inc" / "later.csv", _csv([_row(9, "later", 0, "c")]))
    result = _process(pipeline, inbox, 1, later)
    assert (result.files, result.unmatched) == (1, 0)
    assert sorted((r["k"], r["v"]) for r in _rows(cfg.table)) == [(3, "good"), (9, "later")]
    assert verify(cfg) == []


def _parquet(path: Path, keys: list[str], value: str) -> Path:
    """A file as pandas writes a `Categorical`: dictionary-encoded columns, here also nested in a struct and a list."""
    path.parent.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame({"k": pd.Categorical(keys), "v": pd.Categorical([value] * len(keys))})
    table = pa.Table.from_pandas(frame, preserve_index=False)
    dictionary = pa.dictionary(pa.int8(), pa.string())
    table = table.append_column("s", pa.array([{"tag": value}] * len(keys)).cast(pa.struct([("tag", dictionary)])))
    table = table.append_column("l", pa.array([[value]] * len(keys)).cast(pa.list_(dictionary)))
    pq.write_table(table, path)
    assert pa.types.is_dictionary(pq.read_schema(path).field("k").type)
    return path


@pytest.mark.parametrize("cdc", [{"strategy": "upsert", "primary_key": ["k"]}, {}], ids=["keyed", "append"])
def test_dictionary_encoded_columns_are_read_as_their_values(tmp_path, cdc):
    """A `Categorical` key used to fail every batch in the keyed reduction (no sort kernel for dictionaries), and a
    non-key one stopped the ODF chain (no ODF type): every dictionary is decoded as the file is conformed."""
    (tmp_path / "landing").mkdir()
    pattern = {"name": "all", "root_location": "data", "glob_pattern": "/*.parquet"}
    entity = entity_yaml(patterns=[pattern], cdc=cdc, format={"kind": "parquet"})
    cfg, pipeline, inbox = _prepared(config.load(write_config(tmp_path, [entity])).entities[0])
    data = cfg.source.path / "data"
    with capture_logs() as logs:
        first = _process(pipeline, inbox, 0, _parquet(data / "b0.parquet", ["x", "y"], "a"))
        second = _process(pipeline, inbox, 1, _parquet(data / "b1.parquet", ["y", "z"], "b"))
    assert (first.rows, first.quarantined, second.rows, second.quarantined) == (2, 0, 2, 0)
    assert [e for e in logs if e["log_level"] == "error"] == []  # odf.slice_refused, batch.parked, …
    schema = DeltaTable(str(cfg.table)).to_pyarrow_table().schema
    assert [(f.name, f.type) for f in schema if f.name in ("k", "v", "s", "l")] == [
        ("k", pa.string()), ("v", pa.string()), ("s", pa.struct([("tag", pa.string())])), ("l", pa.list_(pa.string()))]
    got = sorted((r["k"], r["v"], r["s"]["tag"], tuple(r["l"])) for r in _rows(cfg.table))
    b = ("b", "b", ("b",))
    expected = [("x", "a", "a", ("a",)), ("y", *b), ("z", *b)] if cdc else \
        [("x", "a", "a", ("a",)), ("y", "a", "a", ("a",)), ("y", *b), ("z", *b)]
    assert got == expected
    assert _rows(cfg.quarantine) == []
    assert verify(cfg) == []


def test_a_path_pattern_alternative_without_the_time_group_quarantines_the_file(tmp_path):
    """`day=(…)|undated` matches `data/undated/a.csv` without its group: no time to read, so the file's rows are
    quarantined with the reason (as for a date that does not parse), and the other files are applied."""
    (tmp_path / "landing").mkdir()
    pattern = {"name": "all", "root_location": "data", "regular_expression": r"/.+\.csv"}
    event_time = {"source": "path", "path_pattern": r"day=(\d{4}-\d\d-\d\d)|undated", "path_format": "%Y-%m-%d"}
    entity = entity_yaml(patterns=[pattern], event_time=event_time)
    cfg, pipeline, inbox = _prepared(config.load(write_config(tmp_path, [entity])).entities[0])
    data = cfg.source.path / "data"
    undated = land(data / "undated" / "a.csv", "id\n1\n2\n")
    dated = land(data / "day=2024-01-02" / "b.csv", "id\n3\n")
    result = _process(pipeline, inbox, 0, undated, dated)
    assert (result.files, result.rows, result.quarantined) == (2, 1, 1)
    assert [r["id"] for r in _rows(cfg.table)] == [3]
    (bad,) = _rows(cfg.quarantine)
    assert (bad["source_file"], bad["raw"]) == ("data/undated/a.csv", "2 rows")
    assert "event time from path 'data/undated/a.csv'" in bad["reason"]
    assert "its first group captures nothing" in bad["reason"]

    later = land(data / "day=2024-01-03" / "c.csv", "id\n4\n")
    result = _process(pipeline, inbox, 1, later)
    assert (result.rows, result.quarantined) == (1, 0)
    assert sorted(r["id"] for r in _rows(cfg.table)) == [3, 4]
    times = {r["id"]: r["event_time"] for r in _rows(cfg.changelog)}
    assert times == {3: datetime(2024, 1, 2, tzinfo=UTC), 4: datetime(2024, 1, 3, tzinfo=UTC)}
