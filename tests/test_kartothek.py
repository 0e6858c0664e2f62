"""Kartothek dataset metadata (seed 003): checked by a spec checker of our own after every batch, read by
kartothek 5.3 itself where a Python 3.9 exists, and repaired after a kill between the index and the metadata."""

from __future__ import annotations

import json
import signal

import pyarrow.parquet as pq
from deltalake import DeltaTable

from lakefeed.config import model as config
from lakefeed.inbox.files import FileEvent
from lakefeed.pipeline.verify import verify
from tests.conftest import entity_yaml, land, wait_for, write_config
from tests.kartothek_spec import check_dataset, kartothek_python, kartothek_read
from tests.test_daemon_process import Daemon
from tests.test_pipeline import _prepared

KARTOTHEK = {"enabled": True, "indices": ["k", "year"]}  # year is a partition key below: not indexed
BATCHES = [
    {"2024/01/a.csv": "id,k,v\n1,1,a\n2,2,a\n3,3,x/y z\n", "2024/02/b.csv": "id,k,v\n4,1,b\n5,2,b\n"},
    {"2025/01/c.csv": "id,k,v\n2,7,c\n6,2,c\n"},  # id 2 changes: the merge rewrites a's file (a removal)
    {"2025/02/d.csv": "id,k,v,extra\n7,3,d,x\n1,1,z,y\n"},  # a new column: _common_metadata changes
]
COLUMNS = ["id", "k", "v", "year", "month"]


def _rows(table: DeltaTable, keep=lambda row: True) -> list[str]:
    rows = table.to_pyarrow_table().to_pylist()
    return sorted(json.dumps({c: None if r.get(c) is None else str(r[c]) for c in COLUMNS}, sort_keys=True)
                  for r in rows if keep(r))


def _ingested(tmp_path, strategy: str = "upsert", partition_by: tuple[str, ...] = ("year",)):
    cdc = {"strategy": strategy, "primary_key": ["id"]} if strategy == "upsert" else {"strategy": strategy}
    entity = entity_yaml(cdc=cdc, kartothek=KARTOTHEK, partition_by=list(partition_by))
    cfg = config.load(write_config(tmp_path, [entity])).entities[0]
    cfg, pipeline, inbox = _prepared(cfg)
    store = tmp_path / "lake"
    for batch_id, files in enumerate(BATCHES):
        paths = [land(cfg.source.path / "sales" / name, text) for name, text in files.items()]
        pipeline.process(inbox.offer([FileEvent.of(p) for p in paths]), batch_id)
        assert check_dataset(store, "sales", "table") == []
        assert verify(cfg) == []
    return cfg, store


def test_the_dataset_follows_every_commit_and_meets_the_spec(tmp_path):
    cfg, store = _ingested(tmp_path)
    meta = json.loads((store / "sales.by-dataset-metadata.json").read_text())
    table = DeltaTable(str(cfg.table))
    assert meta["metadata"]["lakefeed.table_version"] == str(table.version())
    assert len(meta["partitions"]) == len(table.get_add_actions(flatten=True))
    assert meta["partition_keys"] == ["year"] and sorted(meta["indices"]) == ["k"]
    assert all(label.startswith(("year=2024/", "year=2025/")) for label in meta["partitions"])
    common = store / "sales" / "table" / "_common_metadata"
    assert "extra" in pq.read_schema(common).names
    # the current index and the one before it (for readers of the older metadata)
    assert len(list((store / "sales" / "indices" / "k").iterdir())) == 2


def test_files_kartothek_cannot_read_are_reported(tmp_path, capsys):
    """A keyed entity: delta-rs's MERGE writes string_view columns, which pyarrow < 15 cannot read."""
    _ingested(tmp_path, "upsert")
    assert "kartothek.unreadable_files" in capsys.readouterr().err
    (tmp_path / "append").mkdir()
    _ingested(tmp_path / "append", "append")
    assert "kartothek.unreadable_files" not in capsys.readouterr().err


def test_kartothek_itself_reads_the_dataset_with_predicates_on_indexed_columns(tmp_path):
    """An append entity: the files a delta-rs MERGE rewrites carry string_view in their Arrow schema, which
    kartothek's pyarrow 6 cannot read (docs/manifests.md); lakefeed warns of those (next test)."""
    python = kartothek_python()
    assert python is not None, ("no Python 3.9 on this machine, and kartothek 5.3 installs only there: install one "
                                "(`pyenv install 3.9`, or a python3.9 on PATH) and run the tests again")
    cfg, store = _ingested(tmp_path, "append", partition_by=("year", "v"))  # v holds "x/y z"
    queries = {"all": None, "k == 2": [[["k", "==", 2]]], "k in 1, 3": [[["k", "in", [1, 3]]]],
               "year == 2025": [[["year", "==", "2025"]]], "v == b or k == 7": [[["v", "==", "b"]], [["k", "==", 7]]],
               "indexed and not": [[["year", "==", "2024"], ["month", "==", "01"]]], "x/y z": [[["v", "==", "x/y z"]]]}
    read = kartothek_read(python, store, "sales", queries, COLUMNS)
    table = DeltaTable(str(cfg.table))
    expected = {
        "all": _rows(table), "k == 2": _rows(table, lambda r: r["k"] == 2),
        "k in 1, 3": _rows(table, lambda r: r["k"] in (1, 3)),
        "year == 2025": _rows(table, lambda r: r["year"] == "2025"),
        "v == b or k == 7": _rows(table, lambda r: r["v"] == "b" or r["k"] == 7),
        "indexed and not": _rows(table, lambda r: r["year"] == "2024" and r["month"] == "01"),
        "x/y z": _rows(table, lambda r: r["v"] == "x/y z"),
    }
    assert read == expected
    assert all(read[name] for name in expected)  # no query is trivially empty


def test_a_kill_between_the_index_and_the_metadata_is_repaired_at_restart(tmp_path):
    path = write_config(tmp_path, [entity_yaml(cdc={"strategy": "upsert", "primary_key": ["id"]}, kartothek=KARTOTHEK,
                                               partition_by=["year"])])
    store, landing = tmp_path / "lake", tmp_path / "landing" / "sales"
    with Daemon(path, tmp_path / "daemon.log") as daemon:
        daemon.start(env={"LAKEFEED_FAILPOINT": "kartothek.indices_written"})
        land(landing / "2024" / "01" / "a.csv", BATCHES[0]["2024/01/a.csv"])
        assert daemon.wait(60) == -signal.SIGKILL
        assert not (store / "sales.by-dataset-metadata.json").exists()  # committed, indices written, no metadata
        assert DeltaTable(str(store / "sales" / "table")).version() >= 0
        daemon.start()
        wait_for(lambda: (store / "sales.by-dataset-metadata.json").exists(), 60, 0.2, "the metadata")
        land(landing / "2024" / "02" / "b.csv", BATCHES[0]["2024/02/b.csv"])
        wait_for(lambda: daemon.events("kartothek.written") >= 2, 60, 0.2, "the second batch's metadata")
        daemon.stop(60)
        assert check_dataset(store, "sales", "table") == []
        assert verify(config.load(path).entities[0]) == []
        assert len(list((store / "sales" / "indices" / "k").iterdir())) == 2  # the crash's orphans are gone
