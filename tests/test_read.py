from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq

from lakefeed.batch import event_time
from lakefeed.batch.read import conform, read_file
from lakefeed.config.model import CsvFormat, EventTimeConfig, JsonFormat, ParquetFormat


def test_csv_rows_with_wrong_column_count_are_bad_rows_with_their_line(tmp_path):
    f = tmp_path / "a.csv"
    f.write_text("id,name\n1,a\n2\n3,c\n4,d,extra\n")
    out = read_file(f, CsvFormat(), None)
    assert out.table.column("id").to_pylist() == [1, 3]
    assert [(b.line, b.raw) for b in out.bad] == [(3, "2"), (5, "4,d,extra")]
    assert "expected 2 columns, found 1" in out.bad[0].reason


def test_csv_values_that_do_not_fit_the_schema_are_bad_rows(tmp_path):
    f = tmp_path / "a.csv"
    f.write_text("id;amount;note\n1;1.5;x\n2;abc;y\n3;;z\n")
    target = pa.schema([("id", pa.int64()), ("amount", pa.float64()), ("note", pa.string())])
    out = read_file(f, CsvFormat(delimiter=";"), target)
    assert out.table.to_pydict() == {"id": [1, 3], "amount": [1.5, None], "note": ["x", "z"]}
    assert len(out.bad) == 1 and out.bad[0].line == 3
    assert "'abc' is not a valid double" in out.bad[0].reason


def test_a_bad_value_beside_a_time_python_cannot_hold_is_a_bad_row_and_zoneless_texts_are_utc(tmp_path):
    """A row quarantined for one column shows its other values, a year 0 timestamp included (Python's datetime
    cannot hold it; `to_pylist` raised OverflowError). In a text column whose values do not all parse, a time
    without a zone is UTC, as when the whole column parses."""
    f = tmp_path / "a.csv"
    f.write_text("id,when,n\n1,0000-03-01T00:00:00,abc\n2,2024-01-01T00:00:00,5\n")
    target = pa.schema([("id", pa.int64()), ("when", pa.timestamp("us", tz="UTC")), ("n", pa.int64())])
    out = read_file(f, CsvFormat(), target)
    assert out.table.column("id").to_pylist() == [2]
    assert len(out.bad) == 1 and out.bad[0].line == 2 and "'abc' is not a valid int64" in out.bad[0].reason
    assert '0000-03-01T00:00:00' in out.bad[0].raw

    f.write_text("id,when,n\n1,0000-03-01T00:00:00Z,1\n2,2024-01-01 02:03:04.5,2\n3,x,3\n4,2024-01-01T02:03:04.5Z,4\n")
    out = read_file(f, CsvFormat(), target)
    assert [b.line for b in out.bad] == [4] and "'x' is not a valid timestamp" in out.bad[0].reason
    when = out.table.column("when")
    assert when.cast(pa.int64()).to_pylist()[0] == -62162035200000000  # kept as Arrow holds it
    assert when[1] == when[2] and when[2].as_py() == datetime(2024, 1, 1, 2, 3, 4, 500000, tzinfo=UTC)


def test_missing_columns_become_null_and_new_columns_are_kept(tmp_path):
    f = tmp_path / "a.csv"
    f.write_text("id,extra\n1,e\n")
    target = pa.schema([("id", pa.int64()), ("name", pa.string())])
    out = read_file(f, CsvFormat(), target)
    assert out.table.to_pydict() == {"id": [1], "name": [None], "extra": ["e"]}


def test_undecodable_csv_is_one_bad_row_for_the_file(tmp_path):
    f = tmp_path / "a.csv"
    f.write_bytes(b"name\n\xff\xfe\x00bad\n")
    out = read_file(f, CsvFormat(), pa.schema([("name", pa.string())]))
    assert out.table is None
    assert len(out.bad) == 1 and out.bad[0].line is None
    assert "cannot be decoded" in out.bad[0].reason


def test_empty_csv_is_no_rows_and_no_error(tmp_path):
    f = tmp_path / "a.csv"
    f.write_text("")
    out = read_file(f, CsvFormat(), None)
    assert out.table is None and out.bad == []


def test_ndjson_bad_lines_are_bad_rows(tmp_path):
    f = tmp_path / "a.ndjson"
    f.write_text('{"id": 1}\n{"id": \n[1]\n{"id": 4}\n')
    out = read_file(f, JsonFormat(kind="ndjson"), None)
    assert out.table.column("id").to_pylist() == [1, 4]
    assert [b.line for b in out.bad] == [2, 3]


def test_landed_json_records_naming_a_key_twice_are_bad_rows_as_written_and_the_others_are_kept(tmp_path):
    """As for pushes (daemon/batch/json_text.py): storing either value of a key named twice would lose the other.
    The record is quarantined as it was written, both values in it; large files are checked too (counted)."""
    many = ", ".join(f'{{"id": {i}, "v": {{"x": 1}}}}' for i in range(3, 200))
    j = tmp_path / "a.json"
    j.write_text(f'[{{"id": 1, "v": {{"x": 1, "x": 2}}}},\n  {{"id": 2,"id" :9}}, {many}]')
    out = read_file(j, JsonFormat(kind="json"), None)
    assert out.table.column("id").to_pylist() == list(range(3, 200))
    assert [(b.field, b.raw) for b in out.bad] == [("v", '{"id": 1, "v": {"x": 1, "x": 2}}'),
                                                   ("id", '{"id": 2,"id" :9}')]
    assert "record 1: column 'v' holds an object naming 'x' twice" in out.bad[0].reason
    assert "record 2: the record names 'id' twice" in out.bad[1].reason
    n = tmp_path / "a.ndjson"
    n.write_bytes(b'\xef\xbb\xbf{"id": 1}\n{"id": 2, "id": 3}\n{"id": 4}\n')  # a BOM, which Arrow takes too
    out = read_file(n, JsonFormat(kind="ndjson"), None)
    assert out.table.column("id").to_pylist() == [1, 4]
    assert [(b.line, b.field, b.raw) for b in out.bad] == [(2, "id", '{"id": 2, "id": 3}')]


def test_landed_json_must_be_utf8_and_its_byte_order_mark_is_dropped(tmp_path):
    j = tmp_path / "a.json"
    j.write_bytes(b'\xef\xbb\xbf[{"id": 1}]')
    assert read_file(j, JsonFormat(kind="json"), None).table.column("id").to_pylist() == [1]
    j.write_bytes('[{"id": 1}]'.encode("utf-16"))
    out = read_file(j, JsonFormat(kind="json"), None)
    assert out.table is None and "the file is UTF-16, and JSON must be sent as UTF-8" in out.bad[0].reason


def test_json_array_document_and_parquet(tmp_path):
    j = tmp_path / "a.json"
    j.write_text('[{"id": 1, "v": "a"}, {"id": 2, "v": "b"}]')
    assert read_file(j, JsonFormat(kind="json"), None).table.column("v").to_pylist() == ["a", "b"]
    p = tmp_path / "a.parquet"
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.uint32())}), p)
    table = read_file(p, ParquetFormat(kind="parquet"), None).table
    assert table.schema.field("id").type == pa.int64()  # Delta has no unsigned types
    broken = tmp_path / "b.parquet"
    broken.write_bytes(b"PAR1 not really")
    out = read_file(broken, ParquetFormat(kind="parquet"), None)
    assert out.table is None and "cannot be decoded" in out.bad[0].reason


def test_json_keys_missing_from_the_first_object_are_kept(tmp_path):
    # Arrow's Table.from_pylist takes the first object's keys only: "b" and "c" were dropped silently.
    j = tmp_path / "a.json"
    j.write_text('[{"a": 1}, {"a": 2, "b": "x"}, {"c": 1180591620717411303424}]')
    out = read_file(j, JsonFormat(kind="json"), None).table
    assert out.to_pylist() == [{"a": 1, "b": None, "c": None}, {"a": 2, "b": "x", "c": None},
                               {"a": None, "b": None, "c": "1180591620717411303424"}]  # beyond 64 bits: text


DOTNET = ["2022-08-30T07:14:07.0000000Z", "2022-08-30T07:14:07.1234567Z", "2022-08-30T07:14:07.123456789+02:00"]
PARSED = [datetime(2022, 8, 30, 7, 14, 7, tzinfo=UTC), datetime(2022, 8, 30, 7, 14, 7, 123456, tzinfo=UTC),
          datetime(2022, 8, 30, 5, 14, 7, 123456, tzinfo=UTC)]  # truncated to the column's microseconds


def test_timestamps_with_more_fractional_digits_than_the_column_holds_are_truncated(tmp_path):
    target = pa.schema([("id", pa.int64()), ("at", pa.timestamp("us", tz="UTC"))])
    csv = tmp_path / "a.csv"
    csv.write_text("id,at\n" + "".join(f"{i},{t}\n" for i, t in enumerate([*DOTNET, "yesterday"])))
    ndjson = tmp_path / "a.ndjson"
    ndjson.write_text("".join(f'{{"id": {i}, "at": "{t}"}}\n' for i, t in enumerate([*DOTNET, "yesterday"])))
    for path, fmt in ((csv, CsvFormat()), (ndjson, JsonFormat(kind="ndjson"))):
        out = read_file(path, fmt, target)
        assert out.table.column("at").to_pylist() == PARSED, fmt
        assert [b.reason for b in out.bad] == ["column 'at': 'yesterday' is not a valid timestamp[us, tz=UTC]"]


def test_event_times_with_seven_fractional_digits_are_read():
    table = pa.table({"at": [*DOTNET, "yesterday"]})
    rows, bad = event_time.stamp(table, EventTimeConfig(source="column", column="at"), "", 0, PARSED[0])
    assert rows.column(event_time.EVENT_TIME).to_pylist() == PARSED
    assert [b.raw for b in bad] == ["yesterday"]


def _dictionary(indices: list[int | None], values: pa.Array) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), values)


def test_dictionaries_of_any_values_at_any_depth_are_conformed_to_their_values():
    """Arrow's cast decodes only dictionaries of scalars: one of lists, structs or string views failed the file."""
    columns = {
        "lists": _dictionary([0, 1, None, 0], pa.array([[1, 2], None])),
        "structs": _dictionary([1, 0, 1, 1], pa.array([{"a": "x"}, {"a": None}])),
        "views": _dictionary([0, 0, 1, None], pa.array(["v", None], pa.string_view())),
        "in_list": pa.ListArray.from_arrays(pa.array([0, 1, 1, 3, 3]), _dictionary([1, 0, 1], pa.array([[5], [6]]))),
        "in_fixed": pa.FixedSizeListArray.from_arrays(_dictionary([0, 1] * 4, pa.array([{"b": 1}, {"b": 2}])), 2),
    }
    table = pa.table(columns)
    for sent in (table, table.slice(1)):
        read = conform(sent, None)
        assert not read.bad and read.table.to_pylist() == sent.to_pylist()
        assert not any(pa.types.is_dictionary(t) for t in read.table.schema.types)
        assert read.table.schema.field("views").type == pa.string()
    # Against a table's types (those of the values): the same rows.
    target = conform(table, None).table.schema
    assert conform(table, target).table.to_pylist() == table.to_pylist()


def _bool8(values: list) -> pa.ExtensionArray:
    return pa.ExtensionArray.from_storage(pa.bool8(), pa.array(values, pa.int8()))


def test_landed_parquet_types_delta_has_not_are_read_as_ones_it_has_and_a_lost_nanosecond_is_a_bad_row(tmp_path):
    path = tmp_path / "odd.parquet"
    pq.write_table(pa.table({
        "id": [1, 2, 3],
        "half": pa.array([1.5, 2, None], pa.float32()).cast(pa.float16()),
        "time": pa.array([1, 2, None], pa.time64("us")),
        "tags": pa.ListArray.from_arrays(pa.array([0, 1, 2, 3]), _dictionary([0, 1, 0], pa.array(["x", "y"]))),
        "at": pa.array([1000, 1001, None], pa.timestamp("ns")),
        "flag": _bool8([1, 0, 7]),
        "flags": pa.ListArray.from_arrays(pa.array([0, 2, 2, 3]), _bool8([0, 1, None])),
    }), path)
    read = read_file(path, ParquetFormat(kind="parquet"), None)
    assert [(b.field, b.reason.split(":")[0]) for b in read.bad] == [("at", "column 'at'")]  # row 2 alone
    assert read.table.schema.field("half").type == pa.float32() and read.table.schema.field("time").type == pa.string()
    # bool8 (a byte a boolean) is a boolean: its storage type, int8, would have made the table's column a `byte`
    assert read.table.schema.field("flag").type == pa.bool_()
    assert read.table.schema.field("flags").type == pa.list_(pa.bool_())
    assert read.table.to_pylist() == [
        {"id": 1, "half": 1.5, "time": "00:00:00.000001", "tags": ["x"], "at": datetime(1970, 1, 1, 0, 0, 0, 1, UTC),
         "flag": True, "flags": [False, True]},
        {"id": 3, "half": None, "time": None, "tags": ["x"], "at": None, "flag": True, "flags": [None]}]


def test_a_landed_decimal_of_more_than_38_digits_refuses_its_file_with_what_to_send(tmp_path):
    """Delta's decimals hold 38 digits: no row of such a column can be placed, at any depth, so the file is one bad
    row saying so (quarantined by name), not a table that would fail later."""
    wide = pa.decimal256(40, 2)
    for name, column in (("plain", pa.array([Decimal("1.50")], wide)),
                         ("nested", pa.array([[Decimal("1.50")]], pa.list_(wide)))):
        path = tmp_path / f"{name}.parquet"
        pq.write_table(pa.table({"id": [1], "amount": column}), path)
        read = read_file(path, ParquetFormat(kind="parquet"), None)
        assert read.table is None
        [bad] = read.bad
        assert bad.field == "amount" and "Delta decimals hold at most 38 digits" in bad.reason, bad
