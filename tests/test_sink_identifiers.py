"""The table sinks against what the data brings: column names as a CSV header or a JSON key spells them (a dot, a
quote, a backtick, a space, a keyword, non-ASCII) through every MERGE, and key lookups of values that the files'
statistics record inexactly (sub-millisecond times, long strings, long decimals), which must find every key."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable, write_deltalake

from lakefeed.batch.cdc import KIND, MergePlan
from lakefeed.connectors.sinks import data_files
from lakefeed.connectors.sinks.delta_rs import DeltaRsSink
from lakefeed.connectors.sinks.delta_spark import DeltaSparkSink

NAMES = ["price.usd", 'say "hi"', "back`tick", "two words", "select", "order", "prix€_ünï", "it's"]
AT = pa.timestamp("us", tz="UTC")


def changes(key: str, seq: str, data: list[str], keys: list[int], seqs: list[int], value: str,
            kinds: list[str]) -> pa.Table:
    """Rows of `keys`, each data column holding `value` and its own index."""
    columns = {key: pa.array(keys, pa.int64()), seq: pa.array(seqs, pa.int64())}
    columns.update({c: [f"{value}{i}"] * len(keys) for i, c in enumerate(data)})
    return pa.table({**columns, KIND: kinds})


def state(path, key: str, seq: str, data: list[str]) -> dict[int, tuple[int, str]]:
    """key -> (sequence, the value its data columns hold), each column holding it under its own index."""
    got = {}
    for row in DeltaTable(str(path)).to_pyarrow_table().to_pylist():
        value = row[data[0]][0]
        assert [row[c] for c in data] == [f"{value}{i}" for i in range(len(data))], row
        got[row[key]] = (row[seq], value)
    return got


def keyed(sink, path, names: list[str]) -> None:
    """A changelog keyed by the first name, sequenced by the second, the others data: an older change ignored, a
    delete, a newer update, an insert."""
    key, seq, *data = names
    plan = MergePlan(keys=(key,), sequence=(seq,), compare=tuple(data), snapshot=False,
                     insert_updates_of_absent=False)
    sink.merge(changes(key, seq, data, [1, 2, 3], [5, 5, 5], "a", ["upsert"] * 3), plan, "q", 0, {})
    sink.merge(changes(key, seq, data, [1, 2, 3, 4], [6, 6, 4, 6], "b", ["upsert", "delete", "update", "insert"]),
               plan, "q", 1, {})
    assert state(path, key, seq, data) == {1: (6, "b"), 3: (5, "a"), 4: (6, "b")}


def snapshot(sink, path, names: list[str]) -> None:
    """A snapshot scoped by a data column: keys of the scope it lacks go, a changed row changes."""
    key, seq, scope, *data = names
    plan = MergePlan(keys=(key,), sequence=(), compare=(seq, *data), snapshot=True, insert_updates_of_absent=True,
                     scope=(scope, ("x",)))
    first = changes(key, seq, data, [1, 2, 3], [0, 0, 0], "a", ["upsert"] * 3)
    sink.merge(first.append_column(scope, pa.array(["x", "x", "y"])), plan, "q", 0, {})
    second = changes(key, seq, data, [1], [1], "b", ["upsert"]).append_column(scope, pa.array(["x"]))
    sink.merge(second, plan, "q", 1, {})
    assert state(path, key, seq, data) == {1: (1, "b"), 3: (0, "a")}


def history(sink, path, names: list[str]) -> None:
    """SCD2 keyed by the first name: a version opened, then closed and a new one opened."""
    key, *data = names
    t0, t1 = datetime(2024, 1, 1, tzinfo=UTC), datetime(2024, 1, 2, tzinfo=UTC)

    def edits(kinds: list[str], value: str, at: datetime) -> pa.Table:
        columns = {key: pa.array([7] * len(kinds), pa.int64())}
        columns.update({c: [value] * len(kinds) for c in data})
        return pa.table({**columns, "__h": kinds, "__at": pa.array([at] * len(kinds), AT)})

    sink.apply_history(edits(["open"], "a", t0), (key,), "q", 0)
    sink.apply_history(edits(["close", "open"], "b", t1), (key,), "q", 1)
    rows = sorted(DeltaTable(str(path)).to_pyarrow_table().to_pylist(), key=lambda r: r["valid_from"])
    assert [(r[key], [r[c] for c in data], r["valid_to"], r["is_current"]) for r in rows] == \
        [(7, ["a"] * len(data), t1, False), (7, ["b"] * len(data), None, True)]


def tombstones(sink, names: list[str]) -> None:
    """Deleted keys' sequences as the tombstones table keeps them, found again by key."""
    key, seq = names[:2]
    plan = MergePlan(keys=(key,), sequence=(seq,), compare=(seq,), snapshot=False, insert_updates_of_absent=True)
    deletes = pa.table({key: pa.array([1, 2], pa.int64()), seq: pa.array([5, 6], pa.int64()), KIND: ["upsert"] * 2})
    sink.merge(deletes, plan, "q", 0, {})
    sink.merge(deletes.set_column(1, seq, pa.array([4, 9], pa.int64())), plan, "q", 1, {})
    found = sink.lookup(pa.table({key: pa.array([1, 2, 3], pa.int64())}), (seq,))
    assert sorted(found.to_pylist(), key=lambda r: r[key]) == [{key: 1, seq: 5}, {key: 2, seq: 9}]


@pytest.mark.parametrize("first", range(len(NAMES)), ids=NAMES)
def test_delta_rs_merges_take_any_column_name_as_key_or_data(tmp_path, first):
    names = NAMES[first:] + NAMES[:first]  # each name the key once, and the sequence, scope and data otherwise
    keyed(DeltaRsSink(tmp_path / "k"), tmp_path / "k", names)
    snapshot(DeltaRsSink(tmp_path / "s"), tmp_path / "s", names)
    history(DeltaRsSink(tmp_path / "h"), tmp_path / "h", names)
    tombstones(DeltaRsSink(tmp_path / "t"), names)


def test_delta_spark_merges_take_any_column_name_as_key_or_data(spark, tmp_path):
    # A name Delta refuses unmapped (the space) makes the table map its columns; a backtick is refused in a MERGE
    # into a table with change data (the keyed ones: Delta quotes the name unescaped) and taken in the others.
    names = [n for n in NAMES if "`" not in n]
    keyed(DeltaSparkSink(spark, tmp_path / "k"), tmp_path / "k", names[2:] + names[:2])  # the space in the key
    snapshot(DeltaSparkSink(spark, tmp_path / "s"), tmp_path / "s", names[1:])
    history(DeltaSparkSink(spark, tmp_path / "h"), tmp_path / "h", NAMES[3:] + NAMES[:3])
    for path in ("k", "s", "h"):
        assert DeltaTable(str(tmp_path / path)).metadata().configuration["delta.columnMapping.mode"] == "name"


def found(sink: DeltaRsSink, keys: pa.Array) -> list:
    """The keys the sink finds, as typed in `keys` (a lookup gives times without a zone in UTC)."""
    return sorted(sink.lookup(pa.table({"k": keys}), ("n",)).column("k").cast(keys.type).to_pylist())


def all_found(uri: str, parts: list[list], kind: pa.DataType | None = None) -> None:
    """Every key is found: all at once, and each alone (a file is read when any key sought lies in its bounds)."""
    sink, every = DeltaRsSink(uri), sorted(v for part in parts for v in part)
    assert found(sink, pa.array(every, kind)) == every
    assert [found(sink, pa.array([v], kind)) for v in every] == [[v] for v in every]


@pytest.mark.parametrize("kind", [AT, pa.timestamp("us")], ids=["timestamp", "timestamp_ntz"])
def test_lookups_find_timestamps_between_the_milliseconds_their_statistics_are_cut_to(tmp_path, kind):
    """Delta writers record a time's statistics to the millisecond, cut: a file of 12:00:00.000900 says its max is
    12:00:00.000. Each file here holds times its statistics' bounds miss, before 1970 too."""
    tz = UTC if kind.tz else None
    bases = [datetime(2024, 1, 1, 12, tzinfo=tz), datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=tz)]
    times = [[b + timedelta(microseconds=us) for us in (100, 900)] for b in bases]
    times.append([datetime(2024, 1, 1, 12, 0, 0, 500, tzinfo=tz), datetime(2024, 1, 1, 12, 0, 5, 999999, tzinfo=tz)])
    uri = str(tmp_path / "t")
    for n, part in enumerate(times):  # a file each
        write_deltalake(uri, pa.table({"k": pa.array(part, kind), "n": [n] * len(part)}), mode="append")
    all_found(uri, times, kind)


def test_lookups_find_decimals_whose_statistics_went_through_a_float(tmp_path):
    """delta-rs records decimal statistics as JSON floats: a file of 2.999999999999999999 says its min is 3.0."""
    kind = pa.decimal128(38, 18)
    parts = [[Decimal("2.999999999999999999"), Decimal("4.000000000000000001")], [Decimal("7.5"), Decimal("8")]]
    uri = str(tmp_path / "t")
    for n, part in enumerate(parts):
        write_deltalake(uri, pa.table({"k": pa.array(part, kind), "n": [n] * len(part)}), mode="append")
    all_found(uri, parts, kind)


LONG = "x" * 32  # delta-spark cuts string statistics to 32 characters, delta-rs to 64 bytes


def test_lookups_find_long_strings_sharing_a_long_prefix_in_files_delta_rs_wrote(tmp_path):
    parts = [[LONG * 3 + "a", LONG * 3 + "b"], [LONG * 3 + "z" + "q" * 10, LONG * 3 + "\U0001f600"], ["a", "b"]]
    uri = str(tmp_path / "t")
    for n, part in enumerate(parts):
        write_deltalake(uri, pa.table({"k": part, "n": [n] * len(part)}), mode="append")
    all_found(uri, parts)


@pytest.mark.parametrize("cut", ["\ufffd", ""], ids=["older-delta-spark", "bare-prefix"])
def test_lookups_find_long_strings_past_a_max_cut_to_a_prefix(tmp_path, cut):
    """A max cut to 32 characters and given a tie-breaker: older delta-spark releases appended U+FFFD, which sorts
    below the emoji the values go on with; a writer may also leave the prefix bare."""
    uri, schema = str(tmp_path / "t"), pa.schema([("k", pa.string()), ("n", pa.int64())])
    sink = DeltaRsSink(uri)
    parts = [[LONG + "\U0001f600a", LONG + "\U0001f600b"], [LONG + "é", LONG + "ü"], ["a", "b"]]
    for n, part in enumerate(parts):
        rows = pa.table({"k": part, "n": [n] * len(part)}, schema)
        files = data_files.write(pafs.LocalFileSystem(), uri, rows, f"part-{n}")
        stats = json.loads(files[0].stats)
        stats["minValues"]["k"], stats["maxValues"]["k"] = min(part)[:32], max(part)[:32] + cut
        sink.commit_files([dataclasses.replace(files[0], stats=json.dumps(stats))], schema, "q", n, {})
    all_found(uri, parts)
    assert found(DeltaRsSink(uri), pa.array([LONG + "\U0001f600c", "c"])) == []
