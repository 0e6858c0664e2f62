"""Event time sources, the watermark (recorded with the commit, moved by `lakefeed watermark advance`) and late rows."""

from __future__ import annotations

import os
from datetime import UTC, datetime

import pyarrow as pa
from deltalake import DeltaTable

from lakefeed.config import model as config
from lakefeed.inbox.files import FileEvent
from lakefeed.ops import cli
from tests.conftest import entity_yaml, land, write_config
from tests.test_pipeline import _prepared


def _setup(tmp_path, event_time, cdc=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    entity = entity_yaml(event_time=event_time, cdc=cdc or {},
                         patterns=[{"name": "all", "root_location": "data", "glob_pattern": "/**/*.csv"}])
    return _prepared(config.load(write_config(tmp_path, [entity])).entities[0])


def _process(setup, batch_id, *files):
    cfg, pipeline, inbox = setup
    paths = [land(cfg.source.path / "data" / name, text) for name, text in files]
    return pipeline.process(inbox.offer([FileEvent.of(p) for p in paths]), batch_id)


def _changelog(cfg):
    return DeltaTable(str(cfg.changelog)).to_pyarrow_table().sort_by("offset").to_pylist()


def test_event_time_from_the_path_and_from_file_mtime(tmp_path):
    setup = _setup(tmp_path / "a", {"source": "path", "path_pattern": r"/(\d{4}-\d{2}-\d{2})/",
                                    "path_format": "%Y-%m-%d"})
    _process(setup, 0, ("2024-01-05/x.csv", "id\n1\n"), ("undated.csv", "id\n2\n"))
    rows = _changelog(setup[0])
    assert [(r["id"], r["event_time"]) for r in rows] == [(1, datetime(2024, 1, 5, tzinfo=UTC))]
    quarantine = DeltaTable(str(setup[0].quarantine)).to_pyarrow_table().to_pylist()
    assert quarantine[0]["source_file"] == "data/undated.csv" and "does not match" in quarantine[0]["reason"]

    cfg, pipeline, inbox = setup = _setup(tmp_path / "b", {"source": "file_mtime"})
    path = land(cfg.source.path / "data" / "m.csv", "id\n1\n")
    os.utime(path, (1_700_000_000, 1_700_000_000))
    pipeline.process(inbox.offer([FileEvent.of(path)]), 0)
    assert _changelog(cfg)[0]["event_time"] == datetime.fromtimestamp(1_700_000_000, UTC)


def test_unparseable_event_times_are_quarantined_and_the_rest_commits(tmp_path):
    """A text without a zone is a UTC time, whether the column's other texts parse (Arrow's CSV reader then reads
    a timestamp column) or not (the texts are then parsed one by one)."""
    setup = _setup(tmp_path / "a", {"source": "column", "column": "ts"})
    result = _process(setup, 0, ("a.csv", "id,ts\n1,2024-01-01T00:00:00Z\n2,yesterday\n3,2024-01-02 03:04:05.5\n"))
    assert (result.rows, result.quarantined) == (2, 1)
    quarantine = DeltaTable(str(setup[0].quarantine)).to_pyarrow_table().to_pylist()
    assert "'yesterday' in column 'ts' is not a timestamp" in quarantine[0]["reason"]
    one_by_one = {r["id"]: r["event_time"] for r in _changelog(setup[0])}

    setup = _setup(tmp_path / "b", {"source": "column", "column": "ts"})
    assert _process(setup, 0, ("b.csv", "id,ts\n3,2024-01-02 03:04:05.5\n")).rows == 1
    # The next file is read against the table's schema: its texts without a zone are UTC times too, not bad rows.
    result = _process(setup, 1, ("c.csv", "id,ts\n4,2024-01-03 00:00:00\n"))
    assert (result.rows, result.quarantined) == (1, 0)
    whole = {r["id"]: r["event_time"] for r in _changelog(setup[0])}
    assert one_by_one[3] == whole[3] == datetime(2024, 1, 2, 3, 4, 5, 500000, tzinfo=UTC)
    assert whole[4] == datetime(2024, 1, 3, tzinfo=UTC)
    assert one_by_one[1] == datetime(2024, 1, 1, tzinfo=UTC)


def test_event_times_a_watermark_cannot_hold_are_quarantined_and_the_rest_commits(tmp_path):
    """Arrow holds times far outside the years 1-9999 that Python's datetime (the watermark's) holds: a file of
    only such rows must not fail its batch again and again."""
    setup = _setup(tmp_path / "a", {"source": "column", "column": "ts"})
    result = _process(setup, 0, ("a.csv", "id,ts,when\n1,2024-01-01T00:00:00,0000-03-01T00:00:00\n"
                                          "2,0000-12-31T00:00:00,2024-01-01T00:00:00\n"))
    assert (result.rows, result.quarantined) == (1, 1)
    quarantine = DeltaTable(str(setup[0].quarantine)).to_pyarrow_table().to_pylist()
    assert "event time 0000-12-31 00:00:00.000000Z in column 'ts' is outside the years 1-9999" \
        in quarantine[0]["reason"], quarantine
    changelog = DeltaTable(str(setup[0].changelog)).to_pyarrow_table()
    assert changelog.column("id").to_pylist() == [1]
    assert changelog.column("when").cast(pa.int64()).to_pylist() == [-62162035200000000]  # data: kept as it is

    setup = _setup(tmp_path / "b", {"source": "column", "column": "ts"})
    result = _process(setup, 0, ("b.csv", "id,ts\n3,0000-06-01T00:00:00\n4,99999-01-01T00:00:00\n"))
    assert (result.rows, result.quarantined) == (0, 2)

    setup = _setup(tmp_path / "c", {"source": "column", "column": "ts"})  # texts, parsed one by one
    result = _process(setup, 0, ("c.csv", "id,ts\n5,yesterday\n6,0000-03-01T00:00:00Z\n7,2024-01-01T00:00:00Z\n"))
    assert (result.rows, result.quarantined) == (1, 2)
    reasons = sorted(row["reason"] for row in DeltaTable(str(setup[0].quarantine)).to_pyarrow_table().to_pylist())
    assert "'yesterday' in column 'ts' is not a timestamp" in reasons[0] and "outside the years 1-9999" in reasons[1]


def test_watermark_moves_forward_with_commits_and_by_command_and_late_rows_are_quarantined(tmp_path, capsys):
    setup = _setup(tmp_path, {"source": "column", "column": "ts", "allowed_lateness_s": 3600,
                              "late_policy": "quarantine"}, {"strategy": "upsert", "primary_key": ["id"]})
    cfg = setup[0]
    _process(setup, 0, ("a.csv", "id,ts\n1,2024-01-01T10:00:00Z\n2,2024-01-01T12:00:00Z\n"))
    history = DeltaTable(str(cfg.table)).history()
    assert history[0]["lakefeed.watermark"] == "2024-01-01T11:00:00.000Z"  # max event time - 1 h
    result = _process(setup, 1, ("b.csv", "id,ts\n3,2024-01-01T10:30:00Z\n4,2024-01-01T11:30:00Z\n"))
    assert (result.rows, result.late, result.quarantined) == (1, 1, 1)  # 10:30 is behind 11:00
    assert DeltaTable(str(cfg.table)).history()[0]["lakefeed.watermark"] == "2024-01-01T11:00:00.000Z"

    config_file = str(tmp_path / "lakefeed.yaml")
    assert cli.main(["watermark", "advance", "--config", config_file, "--entity", "sales",
                     "--to", "2024-01-02T00:00:00Z"]) == 0
    assert "advanced to 2024-01-02T00:00:00.000Z" in capsys.readouterr().out
    assert cli.main(["watermark", "advance", "--config", config_file, "--entity", "sales",
                     "--to", "2024-01-01T00:00:00Z"]) == 0  # never backwards
    assert "stays at 2024-01-02T00:00:00.000Z" in capsys.readouterr().out
    result = _process(setup, 2, ("c.csv", "id,ts\n5,2024-01-01T23:00:00Z\n6,2024-01-02T01:00:00Z\n"))
    assert (result.rows, result.late) == (1, 1)
    ids = sorted(r["id"] for r in DeltaTable(str(cfg.table)).to_pyarrow_table().to_pylist())
    assert ids == [1, 2, 4, 6]
    reasons = [r["reason"] for r in DeltaTable(str(cfg.quarantine)).to_pyarrow_table().to_pylist()]
    assert sorted(reasons) == ["late: event time behind the watermark 2024-01-01T11:00:00.000Z",
                               "late: event time behind the watermark 2024-01-02T00:00:00.000Z"]


def test_additive_schema_evolution_reaches_table_and_changelog_and_type_changes_are_quarantined(tmp_path):
    for cdc in ({}, {"strategy": "upsert", "primary_key": ["id"]}):
        root = tmp_path / (cdc.get("strategy") or "append")
        setup = _setup(root, {}, cdc)
        cfg = setup[0]
        _process(setup, 0, ("a.csv", "id,v\n1,a\n"))
        result = _process(setup, 1, ("b.csv", "id,v,w\n2,b,2.5\nthree,c,1\n"))
        assert (result.rows, result.quarantined) == (1, 1)  # "three" is no int64 id
        table = DeltaTable(str(cfg.table)).to_pyarrow_table().sort_by("id").to_pylist()
        assert [(r["id"], r["v"], r["w"]) for r in table] == [(1, "a", None), (2, "b", 2.5)]
        changelog = DeltaTable(str(cfg.changelog)).to_pyarrow_table().sort_by("offset").to_pylist()
        assert [(r["id"], r["w"]) for r in changelog] == [(1, None), (2, 2.5)]
