"""Bitemporal reads (lakefeed.query.bitemporal, docs/bitemporal.md): random changelog histories against the
definition replayed row by row, the worked example of the docs, and real ingestion against Delta time travel and
the SCD2 history table; `lakefeed query`."""

from __future__ import annotations

import csv
import io
import json
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakefeed.ops import cli
from lakefeed.pipeline.verify import verify
from lakefeed.query.bitemporal import QueryError, state
from tests.test_cdc import COLUMNS, T0, Lake

TS = pa.timestamp("us", tz="UTC")
# A data column named `op` is stored as `data_op`: part of the key here, so the key mapping is exercised too.
SCHEMA = pa.schema([("offset", pa.int64()), ("op", pa.int8()), ("system_time", TS), ("event_time", TS),
                    ("k", pa.int64()), ("data_op", pa.string()), ("v", pa.string()), ("source_file", pa.string()),
                    ("batch_id", pa.int64())])
KEY = ("k", "op")


def replay(log: list[dict], as_at: datetime | None, as_of: datetime | None, keyed: bool = True) -> list[dict]:
    """The definition, row by row: the changes known by `as_at` that had happened by `as_of` (a correction pair
    at its correct-to's event time, no event time: the system time), replayed in offset order."""
    held: dict = {}
    for i, row in enumerate(log):
        judge = log[i + 1] if row["op"] == 2 else row
        happened = judge["event_time"] or judge["system_time"]
        if (as_at is not None and row["system_time"] > as_at) or (as_of is not None and happened > as_of):
            continue
        key = (row["k"], row["data_op"]) if keyed else row["offset"]
        if row["op"] in (0, 3):
            held[key] = row
        else:
            held.pop(key, None)
    return sorted(held.values(), key=lambda r: r["offset"])


minutes = st.integers(0, 12).map(lambda m: T0 + timedelta(minutes=m))
event_times = st.one_of(minutes, minutes, minutes, st.none())  # now and then a row without an event time


@st.composite
def histories(draw, keyed: bool) -> tuple[list[list[dict]], list[tuple[datetime | None, datetime | None]]]:
    """Batches of changelog rows consistent with a keyed state (appends of absent keys, retractions and correction
    pairs of live ones; -C carrying the +C's event time, as lakefeed writes, or the old row's, as ODF allows), or
    only appends; system times rising batch by batch (ties too); then the (as_at, as_of) points to read at."""
    live: dict[tuple, dict] = {}
    log: list[dict] = []

    def emit(op: int, data: dict, event: datetime | None, batch: int, system_time: datetime) -> dict:
        log.append({"offset": len(log), "op": op, "system_time": system_time, "event_time": event, **data,
                    "source_file": f"f{batch}.csv", "batch_id": batch})
        return log[-1]

    system_time, count = T0, draw(st.integers(1, 5))
    for b in range(count):
        system_time += timedelta(minutes=draw(st.integers(0, 3)))
        for _ in range(draw(st.integers(1 if b == 0 else 0, 5))):
            keys = [(k, tag) for k in range(3) for tag in ("x", "y")]
            absent = [key for key in keys if key not in live] if keyed else keys
            kinds = (["append"] if absent else []) + (["retract", "correct"] if keyed and live else [])
            kind = draw(st.sampled_from(kinds))
            event = draw(event_times)
            value = draw(st.sampled_from(["a", "b", "c", None]))
            if kind == "append":
                k, tag = draw(st.sampled_from(absent))
                live[(k, tag)] = emit(0, {"k": k, "data_op": tag, "v": value}, event, b, system_time)
            else:
                key = draw(st.sampled_from(sorted(live)))
                old = live.pop(key)
                data = {"k": old["k"], "data_op": old["data_op"], "v": old["v"]}
                if kind == "retract":
                    emit(1, data, event, b, system_time)
                else:
                    emit(2, data, draw(st.sampled_from([event, old["event_time"]])), b, system_time)
                    live[key] = emit(3, {**data, "v": value}, event, b, system_time)
    batches = [[r for r in log if r["batch_id"] == b] for b in range(count)]
    times = sorted({r["system_time"] for rows in batches for r in rows})
    as_at = st.one_of(st.none(), st.sampled_from(times), st.sampled_from(times).map(lambda t: t - timedelta(
        microseconds=1)), st.sampled_from(times).map(lambda t: t + timedelta(seconds=30)))
    as_of = st.one_of(st.none(), minutes, minutes.map(lambda t: t - timedelta(microseconds=1)),
                      st.sampled_from(times))
    return batches, draw(st.lists(st.tuples(as_at, as_of), min_size=1, max_size=6))


def _write(path: Path, batches: list[list[dict]]) -> None:
    for rows in batches:  # one commit per batch, as the pipeline writes the changelog
        if rows:
            write_deltalake(str(path), pa.Table.from_pylist(rows, SCHEMA), mode="append")


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "append_only"])
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_state_matches_the_definition_replayed_row_by_row(keyed, data):
    batches, probes = data.draw(histories(keyed))
    log = [r for rows in batches for r in rows]
    with tempfile.TemporaryDirectory() as tmp:
        _write(Path(tmp) / "changelog", batches)
        for as_at, as_of in probes:
            expected = replay(log, as_at, as_of, keyed)
            got = state(Path(tmp) / "changelog", as_at=as_at, as_of=as_of, primary_key=KEY if keyed else None,
                        with_system_columns=True)
            assert got.to_pylist() == expected, (as_at, as_of)
            data_only = state(str(Path(tmp) / "changelog"), as_at=as_at, as_of=as_of,
                              primary_key=KEY if keyed else None, limit=2)
            assert data_only.column_names == ["k", "op", "v"]
            assert data_only.to_pylist() == [{"k": r["k"], "op": r["data_op"], "v": r["v"]} for r in expected[:2]]


def _at(day: int, hour: int = 0, minute: int = 0) -> datetime:
    """A time in March 2024 (day 0 is 29 February)."""
    return datetime(2024, 3, 1, hour, minute, tzinfo=UTC) + timedelta(days=day - 1)


# The worked example of docs/bitemporal.md: prices by sku, event time = when a price took effect.
EXAMPLE = [  # (op, system time, event time, sku, price)
    (0, _at(1, 9), _at(-1), "A", 10), (0, _at(1, 9), _at(-1), "B", 20),
    (2, _at(2, 9), _at(1), "A", 10), (3, _at(2, 9), _at(1), "A", 12),
    (1, _at(2, 9), _at(5), "B", 20),
    (0, _at(2, 9), _at(-4), "C", 30),
    (2, _at(3, 9), _at(0), "A", 12), (3, _at(3, 9), _at(0), "A", 11),
]


@pytest.mark.parametrize(("as_at", "as_of", "prices"), [
    (_at(1, 12), None, {"A": 10, "B": 20}),
    (_at(2, 12), None, {"A": 12, "C": 30}),
    (None, None, {"A": 11, "C": 30}),
    (_at(2, 12), _at(2), {"A": 12, "B": 20, "C": 30}),  # B's retraction is post-dated to 5 March
    (_at(2, 12), _at(1), {"A": 12, "B": 20, "C": 30}),  # a change at exactly E counts
    (_at(2, 12), _at(1) - timedelta(seconds=1), {"A": 10, "B": 20, "C": 30}),
    (None, _at(-3), {"C": 30}),
    (None, _at(0, 12), {"A": 11, "B": 20, "C": 30}),  # the correction moved A's change back to 29 February
    (None, _at(1, 12), {"A": 11, "B": 20, "C": 30}),  # it arrived after the change of 1 March: it wins
    (None, _at(6), {"A": 11, "C": 30}),
    (_at(1, 8), None, {}),
])
def test_the_worked_example_of_the_docs(tmp_path, as_at, as_of, prices):
    rows = [{"offset": i, "op": op, "system_time": s, "event_time": e, "sku": sku, "price": price,
             "source_file": "prices.csv", "batch_id": s.day} for i, (op, s, e, sku, price) in enumerate(EXAMPLE)]
    for batch in sorted({r["batch_id"] for r in rows}):
        write_deltalake(str(tmp_path / "changelog"), pa.Table.from_pylist([r for r in rows if r["batch_id"] == batch]),
                        mode="append")
    got = state(tmp_path / "changelog", as_at=as_at, as_of=as_of, primary_key=["sku"])
    assert {r["sku"]: r["price"] for r in got.to_pylist()} == prices
    assert got.column_names == ["sku", "price"]


def test_a_correction_pair_counts_at_its_correct_to_s_event_time_whatever_the_correct_from_carries(tmp_path):
    """ODF lets -C carry the corrected row's own event time (lakefeed gives it the +C's): between the two, the
    corrected-from version stays, with the system columns of the change that wrote it."""
    rows = [{"offset": 0, "op": 0, "system_time": T0, "event_time": T0, "k": 1, "v": "old"},
            {"offset": 1, "op": 2, "system_time": T0, "event_time": T0, "k": 1, "v": "old"},
            {"offset": 2, "op": 3, "system_time": T0, "event_time": T0 + timedelta(hours=1), "k": 1, "v": "new"}]
    write_deltalake(str(tmp_path / "changelog"), pa.Table.from_pylist(rows))
    between = state(tmp_path / "changelog", as_of=T0 + timedelta(minutes=30), primary_key=["k"],
                    with_system_columns=True)
    assert between.to_pylist() == [rows[0]]
    assert state(tmp_path / "changelog", primary_key=["k"]).to_pylist() == [{"k": 1, "v": "new"}]


def test_a_changelog_that_cannot_answer_says_what_to_do(tmp_path):
    with pytest.raises(QueryError, match="no changelog at .*nothing has been committed yet"):
        state(tmp_path / "nothing")
    rows = [{"offset": 0, "op": 0, "system_time": T0, "event_time": T0, "k": 1},
            {"offset": 1, "op": 1, "system_time": T0, "event_time": T0, "k": 1}]
    write_deltalake(str(tmp_path / "changelog"), pa.Table.from_pylist(rows))
    with pytest.raises(QueryError, match="offset 1 is a retract, but no primary key .* cdc.primary_key"):
        state(tmp_path / "changelog")
    with pytest.raises(QueryError, match="no key column 'id' in the changelog"):
        state(tmp_path / "changelog", primary_key=["id"])
    assert state(tmp_path / "changelog", primary_key=["k"]).num_rows == 0


def _row(k: int, v: str | None, hour: int, delete: bool = False) -> dict:
    return {"k": k, "v": v, "seq": hour, "IsDelete": delete, "op": "d" if delete else "u",
            "et": T0 + timedelta(hours=hour)}


@pytest.fixture
def lake(tmp_path) -> Lake:
    """A keyed entity ingested through the pipeline in three batches: appends, corrections, deletions and a key
    deleted and created again, event time from a column, with its SCD2 history."""
    lake = Lake(tmp_path, {"strategy": "upsert_and_delete", "primary_key": ["k"], "history": True},
                {"source": "column", "column": "et"})
    lake.batch([[_row(1, "a", 1), _row(2, "b", 1), _row(3, "c", 1)]])
    lake.batch([[_row(1, "a2", 2), _row(2, None, 2, delete=True), _row(4, "d", 2)]])
    lake.batch([[_row(3, "c2", 3), _row(2, "b2", 3), _row(4, None, 3, delete=True)]])
    assert verify(lake.cfg) == []
    return lake


def _by_key(rows: pa.Table) -> list[dict]:
    return sorted(({c: r[c] for c in COLUMNS} for r in rows.to_pylist()), key=lambda r: r["k"])


def test_as_at_is_the_table_then_and_as_of_is_the_history_valid_then(lake):
    """As at the moment before each batch began, the state is the table at its last commit before it (Delta time
    travel); with event times rising per key, as of E it is the SCD2 history's versions valid at E."""
    table = DeltaTable(str(lake.cfg.table)).to_pyarrow_table()
    assert _by_key(state(lake.cfg)) == _by_key(table)
    log = DeltaTable(str(lake.cfg.changelog)).to_pyarrow_table()
    begun = sorted({r["batch_id"]: r["system_time"] for r in log.to_pylist()}.values())
    assert len(begun) == 3
    assert state(lake.cfg, as_at=begun[0] - timedelta(microseconds=1)).num_rows == 0  # before the first batch
    for before in [*begun[1:], datetime.now(UTC)]:
        at = before - timedelta(microseconds=1)
        then = DeltaTable(str(lake.cfg.table))
        then.load_as_version(at)
        assert _by_key(state(lake.cfg, as_at=at)) == _by_key(then.to_pyarrow_table()), at
    history = DeltaTable(str(lake.cfg.history)).to_pyarrow_table().to_pylist()
    for hours in (0, 1, 1.5, 2, 2.5, 3, 4):
        as_of = T0 + timedelta(hours=hours)
        valid = [r for r in history if r["valid_from"] <= as_of and (r["valid_to"] is None or as_of < r["valid_to"])]
        assert _by_key(state(lake.cfg, as_of=as_of)) == _by_key(pa.Table.from_pylist(valid)), hours
    assert {r["k"]: r["v"] for r in state(lake.cfg, as_of=T0 + timedelta(hours=2)).to_pylist()} == \
        {1: "a2", 3: "c", 4: "d"}


def test_query_command_prints_the_state_and_refuses_a_bad_time_in_one_line(lake, tmp_path, capsys):
    config_file = str(tmp_path / "lakefeed.yaml")
    first = min(DeltaTable(str(lake.cfg.changelog)).to_pyarrow_table().column("system_time").to_pylist())
    capsys.readouterr()
    assert cli.main(["query", "sales", "--config", config_file, "--format", "jsonl"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["k"], r["v"], r["op"]) for r in rows] == [(1, "a2", "u"), (2, "b2", "u"), (3, "c2", "u")]
    assert rows[0]["et"] == (T0 + timedelta(hours=2)).isoformat()

    assert cli.main(["query", "sales", "--config", config_file, "--as-at", first.isoformat(), "--format", "csv",
                     "--limit", "2"]) == 0
    lines = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert lines[0] == COLUMNS and [line[:2] for line in lines[1:]] == [["1", "a"], ["2", "b"]]

    assert cli.main(["query", "sales", "--config", config_file, "--as-of", "2024-01-01T02:30:00Z"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == COLUMNS and out[-1] == "(3 rows)"
    assert [line.split()[:2] for line in out[2:-1]] == [["3", "c"], ["1", "a2"], ["4", "d"]]

    for flag in ("--as-at", "--as-of"):
        assert cli.main(["query", "sales", "--config", config_file, flag, "yesterday"]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err == f"lakefeed: {flag} 'yesterday' is not an ISO 8601 time; give e.g. 2024-05-01T12:00:00Z\n"
    assert cli.main(["query", "nobody", "--config", config_file]) == 2
    assert capsys.readouterr().err == "lakefeed: no entity 'nobody' in the config\n"
