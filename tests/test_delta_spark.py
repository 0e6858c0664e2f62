"""The two table writers, delta-rs and delta-spark, against the one TableSink contract, and each continuing the
other's tables. delta-spark runs in the test session's Spark (local[2], delta-spark's jars from the jar cache)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable

from lakefeed.batch.cdc import KIND, MergePlan
from lakefeed.connectors.sinks import data_files
from lakefeed.connectors.sinks.delta_rs import DeltaRsSink
from lakefeed.connectors.sinks.delta_spark import DeltaSparkSink

WRITERS = ["delta-rs", "delta-spark"]
META = {"lakefeed.app_id": "q1", "lakefeed.batch_id": "0", "lakefeed.watermark": "2024-01-01T00:00:00Z"}


@pytest.fixture(params=WRITERS)
def make(request, spark):
    def sink(path, **kwargs):
        return DeltaRsSink(path, **kwargs) if request.param == "delta-rs" else DeltaSparkSink(spark, path, **kwargs)
    sink.writer = request.param
    return sink


def rows(path, by="id") -> list[dict]:
    return sorted(DeltaTable(str(path)).to_pyarrow_table().to_pylist(), key=lambda r: (r[by] is None, r[by]))


def batch(ids, values, kinds=None, seq=None) -> pa.Table:
    columns = {"id": pa.array(ids, pa.int64()), "v": pa.array(values, pa.string())}
    if seq is not None:
        columns["seq"] = pa.array(seq, pa.int64())
    if kinds is not None:
        columns[KIND] = pa.array(kinds, pa.string())
    return pa.table(columns)


def test_appends_record_their_transaction_and_metadata(make, tmp_path):
    sink = make(tmp_path / "t")
    assert sink.committed_version("q1") is None and sink.schema() is None
    sink.append(batch([1, 2], ["a", "b"]), "q1", 0, META)
    assert sink.committed_version("q1") == 0 and sink.committed_version("q2") is None  # what tells a replay
    sink.append(batch([], []), "q1", 1, {**META, "lakefeed.batch_id": "1", "lakefeed.watermark": "later"})
    assert sink.committed_version("q1") == 1
    assert [r["id"] for r in rows(tmp_path / "t")] == [1, 2]
    commits = sink.commits_after(-1)
    assert [c.get("lakefeed.batch_id") for c in commits if "lakefeed.batch_id" in c] == ["0", "1"]
    assert sink.latest_metadata("lakefeed.watermark", "q1", 1) == "2024-01-01T00:00:00Z"  # before batch 1
    assert sink.latest_metadata("lakefeed.watermark", "q1", 2) == "later"
    assert sink.version_of("q1", 1) == sink.version()
    assert sink.max_of("id") == 2


def test_compaction_rewrites_small_files_and_keeps_rows_transactions_and_metadata(make, tmp_path):
    sink = make(tmp_path / "t", partition_by=("p",))
    assert sink.compact(1 << 20) == (0, 0)  # no table yet
    for n in range(4):
        data = batch([2 * n, 2 * n + 1], ["a", "b"]).append_column("p", pa.array(["x", "y"]))
        sink.append(data, "q1", n, {**META, "lakefeed.batch_id": str(n)})
    before = rows(tmp_path / "t")
    assert len(DeltaTable(str(tmp_path / "t")).file_uris()) == 8
    assert sink.compact(1 << 20) == (8, 2)  # one file a partition
    assert rows(tmp_path / "t") == before and len(DeltaTable(str(tmp_path / "t")).file_uris()) == 2
    assert sink.compact(1 << 20) == (0, 0)  # nothing left to rewrite: no commit
    assert sink.committed_version("q1") == 3 and sink.version_of("q1", 3) == sink.version() - 1
    assert sink.latest_metadata("lakefeed.batch_id", "q1", 9) == "3"  # the compaction carries no batch's metadata
    assert sink.commits_after(sink.version() - 1)[0]["operation"] == "OPTIMIZE"
    stored = lambda: sorted(p.name for p in (tmp_path / "t").rglob("*.parquet"))  # noqa: E731
    sink.vacuum(168)
    assert len(stored()) == 10  # the replaced files are too young
    sink.vacuum(0)
    assert len(stored()) == 2 and rows(tmp_path / "t") == before


def test_task_written_files_are_committed_with_new_columns_and_partitions(make, tmp_path):
    root = tmp_path / "t"
    sink = make(root, partition_by=("day",))
    first = pa.table({"id": [1, 2, 3], "day": ["2024-01-01", "2024-01-02", None]})
    files = data_files.write(pafs.LocalFileSystem(), str(root), first, "part-x-b0-", partition_by=("day",))
    sink.commit_files(files, first.schema, "q1", 0, META)
    second = pa.table({"id": [4], "day": ["2024-01-01"], "extra": ["new"]})
    more = data_files.write(pafs.LocalFileSystem(), str(root), second, "part-x-b1-", partition_by=("day",))
    sink.commit_files(more, second.schema, "q1", 1, {**META, "lakefeed.batch_id": "1"})
    got = rows(root)
    assert [(r["id"], r["day"], r["extra"]) for r in got] == [(1, "2024-01-01", None), (2, "2024-01-02", None),
                                                              (3, None, None), (4, "2024-01-01", "new")]
    assert sink.committed_version("q1") == 1
    assert len(sink.paths()) == 4
    assert sink.version_of("q1", 0) is not None


@pytest.mark.parametrize("sequence", [(), ("seq",)])
def test_keyed_merge_applies_newer_changes_and_its_change_data_is_readable(make, tmp_path, sequence):
    sink = make(tmp_path / "t")
    plan = MergePlan(keys=("id",), sequence=sequence, compare=("v",), snapshot=False, insert_updates_of_absent=False)
    seq = [5, 5, 5] if sequence else None
    v0 = sink.merge(batch([1, 2, 3], ["a", "b", "c"], ["upsert"] * 3, seq), plan, "q1", 0, META)
    # 1: an older change (ignored with a sequence); 2: deleted; 3: unchanged; 4: an update of an absent key.
    seq = [4, 6, 6, 6] if sequence else None
    v1 = sink.merge(batch([1, 2, 3, 4], ["old", None, "c", "x"], ["upsert", "delete", "upsert", "update"], seq),
                    plan, "q1", 1, {**META, "lakefeed.batch_id": "1"})
    assert v1 > v0
    expect = {1: "a" if sequence else "old", 3: "c"}
    assert {r["id"]: r["v"] for r in rows(tmp_path / "t")} == expect
    changes = sink.changes(v1).to_pylist()
    kinds = sorted((r["id"], r["_change_type"]) for r in changes)
    assert ((2, "delete") in kinds) and all(k[0] != 3 for k in kinds)
    assert sink.committed_version("q1") == 1
    # A batch that changes nothing is recorded all the same.
    v2 = sink.merge(batch([3], ["c"], ["upsert"], [7] if sequence else None), plan, "q1", 2,
                    {**META, "lakefeed.batch_id": "2"})
    assert v2 == v1 + 1 and sink.committed_version("q1") == 2
    assert {r["id"]: r["v"] for r in rows(tmp_path / "t")} == expect


def test_snapshot_merge_deletes_what_the_snapshot_lacks_within_its_scope(make, tmp_path):
    sink = make(tmp_path / "t")
    plan = MergePlan(keys=("id",), sequence=(), compare=("v", "s"), snapshot=True, insert_updates_of_absent=True,
                     scope=("s", ("x",)))
    data = pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"], "s": ["x", "x", "y"], KIND: ["upsert"] * 3})
    sink.merge(data, plan, "q1", 0, META)
    sink.merge(pa.table({"id": [1], "v": ["A"], "s": ["x"], KIND: ["upsert"]}), plan, "q1", 1, META)
    assert {r["id"]: r["v"] for r in rows(tmp_path / "t")} == {1: "A", 3: "c"}


def test_history_closes_and_opens_versions(make, tmp_path):
    from datetime import UTC, datetime
    sink = make(tmp_path / "h")
    t0, t1 = datetime(2024, 1, 1, tzinfo=UTC), datetime(2024, 1, 2, tzinfo=UTC)
    at = pa.timestamp("us", tz="UTC")
    sink.apply_history(pa.table({"id": [1], "v": ["a"], "__h": ["open"], "__at": pa.array([t0], at)}), ("id",),
                       "q1", 0)
    sink.apply_history(pa.table({"id": [1, 1], "v": ["a", "b"], "__h": ["close", "open"],
                                 "__at": pa.array([t1, t1], at)}), ("id",), "q1", 1)
    got = sorted(rows(tmp_path / "h"), key=lambda r: r["valid_from"])
    assert [(r["v"], r["valid_to"], r["is_current"]) for r in got] == [("a", t1, False), ("b", None, True)]
    assert sink.committed_version("q1") == 1


@pytest.mark.parametrize("write", ["append", "files", "merge", "history"])
def test_a_table_whose_creation_a_crash_cut_short_is_made_by_the_next_write(make, tmp_path, write):
    """A crash while a table is made can leave its folder with a `_delta_log/` and no commit in it (delta-spark's
    CREATE TABLE made `_delta_log/_staged_commits/` first). Every write path makes the table there all the
    same: none may take the folder for a table it then fails to find, which parked a batch once."""
    root = tmp_path / "t"
    (root / "_delta_log" / "_staged_commits").mkdir(parents=True)
    sink = make(root)
    assert sink.schema() is None and sink.committed_version("q1") is None
    if write == "append":
        sink.append(batch([1], ["a"]), "q1", 0, META)
    elif write == "files":
        data = batch([1], ["a"])
        sink.commit_files(data_files.write(pafs.LocalFileSystem(), str(root), data, "part-x-b0-"), data.schema,
                          "q1", 0, META)
    elif write == "merge":
        plan = MergePlan(keys=("id",), sequence=(), compare=("v",), snapshot=False, insert_updates_of_absent=False)
        made = sink.merge(batch([1], ["a"], ["upsert"]), plan, "q1", 0, META)
        assert [r["id"] for r in sink.changes(made).to_pylist()] == [1]  # made with its change data feed on
    else:
        from datetime import UTC, datetime
        opened = pa.array([datetime(2024, 1, 1, tzinfo=UTC)], pa.timestamp("us", tz="UTC"))
        sink.apply_history(pa.table({"id": [1], "v": ["a"], "__h": ["open"], "__at": opened}), ("id",), "q1", 0)
    assert [(r["id"], r["v"]) for r in rows(root)] == [(1, "a")]
    assert sink.committed_version("q1") == 0


def test_each_writer_continues_the_other_ones_table(spark, tmp_path):
    root = tmp_path / "t"
    rs, sp = DeltaRsSink(root), DeltaSparkSink(spark, root)
    plan = MergePlan(keys=("id",), sequence=(), compare=("v",), snapshot=False, insert_updates_of_absent=False)
    rs.merge(batch([1, 2], ["a", "b"], ["upsert"] * 2), plan, "q1", 0, META)
    sp.merge(batch([2, 3], ["B", "c"], ["upsert"] * 2), plan, "q1", 1, {**META, "lakefeed.batch_id": "1"})
    rs.merge(batch([1], [None], ["delete"]), plan, "q1", 2, {**META, "lakefeed.batch_id": "2"})
    sp.append(batch([9], ["z"]), "q1", 3, {**META, "lakefeed.batch_id": "3"})
    assert {r["id"]: r["v"] for r in rows(root)} == {2: "B", 3: "c", 9: "z"}
    assert rs.committed_version("q1") == sp.committed_version("q1") == 3
    assert [c["lakefeed.batch_id"] for c in rs.commits_after(-1) if "lakefeed.batch_id" in c] == ["0", "1", "2", "3"]
    assert spark.read.format("delta").load(str(root)).count() == 3


def test_user_metadata_of_others_is_left_alone():
    from lakefeed.connectors.sinks.delta_log import commit_metadata
    assert commit_metadata({"userMetadata": "not json lakefeed."}) == {"userMetadata": "not json lakefeed."}
    mine = commit_metadata({"version": 3, "userMetadata": json.dumps({"lakefeed.batch_id": "4", "other": 1})})
    assert mine["lakefeed.batch_id"] == "4" and "other" not in mine


def test_the_sessions_warm_up_says_when_it_is_done(spark, tmp_path, monkeypatch):
    """`spark.warmed_up`: what a benchmark of steady throughput waits for (bench/scale_out.py), once the heap's
    ratios are set (here only recorded: once set, the suite's shared JVM could not show its defaults again)."""
    from structlog.testing import capture_logs

    from lakefeed.config import model as config
    from lakefeed.ops import writers
    from tests.conftest import entity_yaml, write_config

    kept = []
    monkeypatch.setattr(writers.spark, "keep_heap_small", kept.append)
    cfg = config.load(write_config(tmp_path, [entity_yaml("e")]))
    with capture_logs() as logs:
        writers._warm(cfg, spark, delta=False)
    assert [e["event"] for e in logs] == ["spark.warmed_up"] and logs[0]["seconds"] > 0, logs
    assert kept == [spark]


def test_the_warm_up_runs_every_delta_spark_write_path_in_scratch_tables_and_removes_them(spark, tmp_path):
    """MERGE, append and a commit of task files (a new table, then one more commit): a fault in any of them is
    logged as `writer.warm_up_stopped`, not `writer.warmed`."""
    from structlog.testing import capture_logs

    from lakefeed.config import model as config
    from lakefeed.ops import writers
    from tests.conftest import entity_yaml, write_config

    cfg = config.load(write_config(tmp_path, [entity_yaml("e", writer="delta-spark")]))
    with capture_logs() as logs:
        writers._warm_delta(cfg, spark)
    assert [e["event"] for e in logs] == ["writer.warmed"], logs
    assert not (cfg.state_dir / "warm-up-delta-spark").exists()


# Column names Delta refuses in a table that does not map its columns, as CSV headers and JSON keys bring them.
ODD = ["first name", "amount (EUR)", "a,b;c{d}=e", "tab\there"]


def mapping(path) -> tuple[str | None, int]:
    """The table's column mapping mode and its protocol's reader version."""
    table = DeltaTable(str(path))
    return table.metadata().configuration.get("delta.columnMapping.mode"), table.protocol().min_reader_version


def both(spark, path, by: str) -> list[dict]:
    """The table's rows as delta-rs reads them, asserted the same as Spark's Delta reads them."""
    read = rows(path, by)
    spark_rows = [r.asDict(recursive=True) for r in spark.read.format("delta").load(str(path)).collect()]
    assert sorted(spark_rows, key=lambda r: r[by]) == read
    return read


def file_columns(path) -> set[str]:
    """The column names in the table's Parquet files: each column's own name, as in a table that maps nothing."""
    import pyarrow.parquet as pq
    table = DeltaTable(str(path))
    return {n for uri in table.file_uris() for n in pq.read_schema(uri.removeprefix("file://")).names}


def test_delta_spark_appends_and_task_files_take_names_delta_refuses_unmapped(spark, tmp_path):
    root = tmp_path / "t"
    sink = DeltaSparkSink(spark, root)
    sink.append(pa.table({"id": [1], "v": ["a"]}), "q1", 0, META)
    assert mapping(root) == (None, 1)  # only names Delta refuses turn mapping on: the protocol stays
    second = pa.table({"id": [2], "v": ["b"], ODD[0]: ["Ann"], ODD[1]: [9.5]})
    sink.append(second, "q1", 1, META)
    sink.append(second, "q1", 1, META)  # a replay: Delta's idempotent write skips it
    assert mapping(root) == ("name", 2)
    third = pa.table({"id": [3], ODD[0]: ["Bo"], ODD[2]: ["new"], ODD[3]: [True]})
    files = data_files.write(pafs.LocalFileSystem(), str(root), third, "part-x-b2-")
    sink.commit_files(files, third.schema, "q1", 2, META)
    sink.commit_files(files, third.schema, "q1", 2, META)  # a replay of the schema's commit finds the columns
    assert both(spark, root, "id") == [
        {"id": 1, "v": "a", ODD[0]: None, ODD[1]: None, ODD[2]: None, ODD[3]: None},
        {"id": 2, "v": "b", ODD[0]: "Ann", ODD[1]: 9.5, ODD[2]: None, ODD[3]: None},
        {"id": 3, "v": None, ODD[0]: "Bo", ODD[1]: None, ODD[2]: "new", ODD[3]: True}]
    assert sink.committed_version("q1") == 2
    assert file_columns(root) == {"id", "v", *ODD}  # what readers of the files alone (ODF, manifests) find
    found = DeltaRsSink(root).lookup(pa.table({"id": pa.array([2, 3])}), (ODD[0],))  # files' statistics
    assert sorted(found.to_pylist(), key=lambda r: r["id"]) == [{"id": 2, ODD[0]: "Ann"}, {"id": 3, ODD[0]: "Bo"}]
    assert sink.max_of(ODD[1]) == 9.5


def test_delta_spark_merges_take_names_delta_refuses_unmapped_and_read_back_their_change_data(spark, tmp_path):
    root = tmp_path / "t"
    sink = DeltaSparkSink(spark, root)
    name, amount = ODD[0], ODD[1]
    plan = MergePlan(keys=("id",), sequence=("seq",), compare=("v", name, amount), snapshot=False,
                     insert_updates_of_absent=False)
    sink.merge(batch([1, 2, 3], ["a", "b", "c"], ["upsert"] * 3, [5, 5, 5]), plan, "q1", 0, META)
    assert mapping(root) == (None, 1)
    # Columns Delta refuses unmapped, new to the table; an older change ignored, a delete, an update, an insert.
    second = batch([1, 2, 3, 4], ["A", None, "x", "d"], ["upsert", "delete", "update", "insert"], [6, 6, 4, 6])
    second = second.append_column(name, pa.array(["Ann", None, "Cy", "Di"])).append_column(
        amount, pa.array([1.5, None, 9.0, 2.5]))
    v1 = sink.merge(second, plan, "q1", 1, META)
    assert mapping(root) == ("name", 2)
    assert both(spark, root, "id") == [{"id": 1, "v": "A", "seq": 6, name: "Ann", amount: 1.5},
                                       {"id": 3, "v": "c", "seq": 5, name: None, amount: None},
                                       {"id": 4, "v": "d", "seq": 6, name: "Di", amount: 2.5}]
    assert sorted((r["id"], r["_change_type"], r[name]) for r in sink.changes(v1).to_pylist()) == \
        [(1, "update_postimage", "Ann"), (1, "update_preimage", None), (2, "delete", None), (4, "insert", "Di")]
    third = batch([4], ["d"], ["upsert"], [7]).append_column(name, pa.array(["Dee"]))  # no column new
    v2 = sink.merge(third, plan, "q1", 2, META)
    assert sorted((r["id"], r["_change_type"], r[name], r[amount]) for r in sink.changes(v2).to_pylist()) == \
        [(4, "update_postimage", "Dee", 2.5), (4, "update_preimage", "Di", 2.5)]
    before = both(spark, root, "id")
    assert sink.merge(third, plan, "q1", 2, META) == v2 + 1  # a replay changes nothing, recorded all the same
    assert both(spark, root, "id") == before and sink.committed_version("q1") == 2
    assert {"id", "v", "seq", name, amount} <= file_columns(root)


def test_delta_spark_maps_nested_and_partition_columns_and_compacts_a_mapped_table(spark, tmp_path):
    """A partition column and fields inside structs and lists with names Delta refuses unmapped; task files in
    Hive-style folders, Spark's files, and OPTIMIZE's rewrite of both, read by delta-rs and Spark alike."""
    root = tmp_path / "t"
    sink = DeltaSparkSink(spark, root, partition_by=("sale day",))
    inner = pa.struct([("x y", pa.int64())])
    first = pa.table({"id": [1, 2], "sale day": ["2024-01-01", "2024-01-02"],
                      "st": pa.array([{"x y": 1}, {"x y": 2}], inner)})
    files = data_files.write(pafs.LocalFileSystem(), str(root), first, "part-x-b0-", partition_by=("sale day",))
    sink.commit_files(files, first.schema, "q1", 0, META)
    wider = pa.struct([("x y", pa.int64()), ("new (z)", pa.string())])  # a field new inside the struct
    sink.append(pa.table({"id": [3], "sale day": ["2024-01-01"], "st": pa.array([{"x y": 3, "new (z)": "n"}], wider),
                          "lst": pa.array([[{"a b": 7}]], pa.list_(pa.struct([("a b", pa.int64())])))}),
                "q1", 1, META)
    expect = [{"id": 1, "sale day": "2024-01-01", "st": {"x y": 1, "new (z)": None}, "lst": None},
              {"id": 2, "sale day": "2024-01-02", "st": {"x y": 2, "new (z)": None}, "lst": None},
              {"id": 3, "sale day": "2024-01-01", "st": {"x y": 3, "new (z)": "n"}, "lst": [{"a b": 7}]}]
    assert mapping(root) == ("name", 2) and both(spark, root, "id") == expect
    assert sink.compact(1 << 20) == (2, 1)  # the two files of 2024-01-01 made one
    assert both(spark, root, "id") == expect and sink.committed_version("q1") == 1


def test_task_files_are_not_committed_to_a_table_another_writer_mapped_to_other_physical_names(spark, tmp_path):
    """Delta's own ADD COLUMNS names a column `col-<uuid>` in a mapped table's files: task files, which name it as
    the data does, would read as nulls there."""
    from lakefeed.errors import TerminalError

    root = tmp_path / "t"
    sink = DeltaSparkSink(spark, root)
    sink.append(pa.table({"id": [1], ODD[0]: ["a"]}), "q1", 0, META)
    spark.sql(f"ALTER TABLE delta.`{root}` ADD COLUMNS (other string)")
    data = pa.table({"id": [2], "other": ["b"]})
    with pytest.raises(TerminalError, match=r"\['other'\] are stored under other physical names.*new table"):
        sink.commit_files(data_files.write(pafs.LocalFileSystem(), str(root), data, "part-x-b1-"), data.schema,
                          "q1", 1, META)
    assert sink.committed_version("q1") == 0


def test_delta_spark_refuses_a_backtick_in_a_merge_with_change_data_saying_what_to_do(spark, tmp_path):
    """Delta's MERGE into a table with change data quotes column names without escaping a backtick; lakefeed's
    MERGEs into keyed tables always have change data on."""
    sink = DeltaSparkSink(spark, tmp_path / "t")
    plan = MergePlan(keys=("id",), sequence=(), compare=("back`tick",), snapshot=False, insert_updates_of_absent=False)
    data = pa.table({"id": [1], "back`tick": ["a"], KIND: ["upsert"]})
    with pytest.raises(ValueError, match=r"backtick.*`writer: delta-rs`.*rename the column"):
        sink.merge(data, plan, "q1", 0, META)
    assert sink.version() is None  # refused before anything was written
