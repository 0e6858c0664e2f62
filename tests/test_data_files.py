"""Data files written by tasks and committed by the driver read back as delta-rs's own writes do: the same rows, the
same partition folders and paths, the same statistics; the sweep removes only what no table holds."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakefeed.connectors.sinks import data_files
from lakefeed.connectors.sinks.delta_rs import DeltaRsSink

FS = pafs.LocalFileSystem()


def _commit(root, data: pa.Table, partition_by: tuple[str, ...] = ()) -> list[data_files.DataFile]:
    files = data_files.write(FS, str(root), data, "part-test-b0-r0", partition_by)
    DeltaRsSink(root, partition_by=partition_by).commit_files(files, data.schema, "app", 0, {"k": "v"})
    return files


def _stats(uri) -> dict:
    actions = pa.table(DeltaTable(str(uri)).get_add_actions(flatten=True))
    return {c: actions.column(c).to_pylist() for c in actions.column_names
            if c.startswith(("min.", "max.", "null_count.")) or c == "num_records"}


def test_partition_values_with_slashes_spaces_and_percents_round_trip_and_are_not_swept(tmp_path):
    data = pa.table({"v": ["x/y z", "a%b", None, "plain"], "k": [1, 2, 3, 4]})
    files = _commit(tmp_path / "ours", data, ("v",))
    write_deltalake(str(tmp_path / "theirs"), data, partition_by=["v"])
    ours, theirs = DeltaTable(str(tmp_path / "ours")), DeltaTable(str(tmp_path / "theirs"))
    assert ours.to_pyarrow_table().sort_by("k").to_pylist() == data.to_pylist()
    assert ours.transaction_version("app") == 0
    folders = {p.rsplit("/", 1)[0] for p in pa.table(ours.get_add_actions()).column("path").to_pylist()}
    assert folders == {p.rsplit("/", 1)[0] for p in pa.table(theirs.get_add_actions()).column("path").to_pylist()}
    held = DeltaRsSink(tmp_path / "ours").paths()
    assert data_files.sweep(FS, str(tmp_path / "ours"), "part-test-b0-", held, [f.path.rsplit("/", 1)[0]
                                                                              for f in files]) == 0
    orphan = tmp_path / "ours" / "v=plain" / "part-test-b0-r0-a1-0-dead.parquet"
    orphan.write_bytes(b"left by a failed attempt")
    assert data_files.sweep(FS, str(tmp_path / "ours"), "part-test-b0-", held, ["v=plain"]) == 1
    assert not orphan.exists()
    assert DeltaTable(str(tmp_path / "ours")).to_pyarrow_table().num_rows == 4


ROWS = st.lists(st.tuples(
    st.one_of(st.none(), st.integers(-2**40, 2**40)),
    st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False, width=64)),
    st.one_of(st.none(), st.text(max_size=40)),
    st.one_of(st.none(), st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30),
                                      timezones=st.just(UTC))),
    st.one_of(st.none(), st.dates(min_value=date(1970, 1, 1), max_value=date(2200, 1, 1))),
), min_size=1, max_size=30)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=ROWS)
def test_statistics_bound_every_value_as_delta_rs_s_do(tmp_path_factory, rows):
    """Against delta-rs's own statistics of the same rows: the same counts and null counts; min and max equal
    (strings: ours leave out a max longer than 32 characters, and cut a min to a prefix of it)."""
    names = ["i", "f", "s", "t", "d"]
    types = [pa.int64(), pa.float64(), pa.string(), pa.timestamp("us", tz="UTC"), pa.date32()]
    data = pa.table([pa.array([r[n] for r in rows], t) for n, t in enumerate(types)], names=names)
    folder = tmp_path_factory.mktemp("stats")
    _commit(folder / "ours", data)
    write_deltalake(str(folder / "theirs"), data)
    ours, theirs = _stats(folder / "ours"), _stats(folder / "theirs")
    assert ours["num_records"] == theirs["num_records"] == [len(rows)]
    for name in names:
        assert ours[f"null_count.{name}"] == theirs[f"null_count.{name}"]
        values = [v for v in data.column(name).to_pylist() if v is not None]
        low, high = ours.get(f"min.{name}", [None])[0], ours.get(f"max.{name}", [None])[0]
        if not values:
            continue
        if name == "s":
            assert low is not None and min(values).startswith(low)
            assert high == max(values) if len(max(values)) <= 32 else high is None
        else:
            assert (low, high) == (theirs[f"min.{name}"][0], theirs[f"max.{name}"][0])


@pytest.mark.parametrize("name", ["part-a-b1-r0-a0", "part-a-b1-r1-a2"])
def test_the_prefix_of_a_batch_names_its_files(name):
    assert name.startswith(data_files.prefix("a", 1))
    assert not name.startswith(data_files.prefix("a", 10))


def test_only_columns_whose_values_repeat_get_a_parquet_dictionary_and_every_value_reads_back(tmp_path):
    n = 20_000
    data = pa.table({
        "offset": pa.array(range(n), pa.int64()),  # every value differs
        "category": pa.array([["books", "games", None][i % 3] for i in range(n)]),
        "late": pa.array([i % 7 for i in range(10_000)] + list(range(10_000)), pa.int64()),  # repeats at first
        "nothing": pa.nulls(n, pa.string()),
    })
    files = _commit(tmp_path / "t", data)
    metadata = pq.ParquetFile(tmp_path / "t" / files[0].path).metadata.row_group(0)
    dictionary = {metadata.column(i).path_in_schema for i in range(metadata.num_columns)
                  if "RLE_DICTIONARY" in metadata.column(i).encodings}
    assert dictionary == {"category", "late", "nothing"}
    assert DeltaTable(str(tmp_path / "t")).to_pyarrow_table().sort_by("offset").equals(data)
    # a type no kernel counts (here: null) keeps the writer's default, a dictionary
    assert data_files.dictionary_columns(pa.table({"n": pa.nulls(3), "u": [1, 2, 3]})) == ["n"]
