"""Per-row change kinds (`cdc.resolve_kinds`) against a row-by-row reference: delete markers of any type
(null, booleans, numbers, texts), operations known, unknown and missing, and null keys and sequences; and a
batch of mixed kinds reduced to one MERGE (`cdc.reduce`, `cdc.resolve`) against its changes applied one by one
(tests/cdc_model.py), on keys the table holds and keys it does not, under every `update_of_absent`; with
`sequence_by`, on keys the table holds (or deleted) at a sequence newer than some of the batch's changes."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lakefeed.batch import cdc
from lakefeed.config.model import CdcConfig
from tests.cdc_model import DictTable, Model
from tests.test_cdc import Lake, _row

KINDS = ("upsert_and_delete", "changelog", "insert", "update", "delete", "upsert")
MARKERS = {
    "bool": st.one_of(st.none(), st.booleans()),
    "int": st.one_of(st.none(), st.integers(-1, 2)),
    "text": st.one_of(st.none(), st.sampled_from(["true", "True", "TRUE", "1", "false", "yes", "", "None"])),
}
OPS = st.one_of(st.none(), st.sampled_from(["c", "u", "d", "r", "x", "", "C"]))
TYPES = {"bool": pa.bool_(), "int": pa.int64(), "text": pa.string()}


def reference(rows: list[dict], cfg: CdcConfig, marker_type: pa.DataType | None) -> tuple[list[str], dict[int, str]]:
    """Each row's kind and each bad row's reason, one row at a time, as the spec says."""
    kinds, bad = [], {}
    for i, row in enumerate(rows):
        kind = row["__kind"]
        if kind == "upsert_and_delete":
            value = row.get(cfg.delete_column) if marker_type is not None else None
            text = None if value is None else pa.scalar(value, marker_type).cast(pa.string()).as_py()
            kind = "delete" if str(text) in cfg.delete_values else "upsert"
        elif kind == "changelog":
            op = row.get(cfg.op_column)
            kind = cfg.op_values.get(op or "", "")
            if not kind:
                bad[i] = f"unknown operation {op!r} in column {cfg.op_column!r}"
        kinds.append(kind)
    for name in (*cfg.primary_key, *cfg.sequence_by):
        for i, row in enumerate(rows):
            if row[name] is None:
                bad.setdefault(i, f"{'key' if name in cfg.primary_key else 'sequence'} column {name!r} is null")
    return kinds, bad


@st.composite
def batches(draw):
    marker = draw(st.sampled_from([None, *MARKERS]))
    with_ops = draw(st.booleans())
    rows = []
    for _ in range(draw(st.integers(0, 30))):
        row = {"k": draw(st.one_of(st.none(), st.integers(0, 5))),
               "seq": draw(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1))),
               "__kind": draw(st.sampled_from(KINDS))}
        if marker is not None:
            row["IsDelete"] = draw(MARKERS[marker])
        if with_ops:
            row["op"] = draw(OPS)
        rows.append(row)
    return rows, marker, with_ops


@settings(max_examples=300, deadline=None)
@given(batches())
def test_kinds_match_the_row_by_row_reference(batch):
    rows, marker, with_ops = batch
    cfg = CdcConfig(strategy="upsert", primary_key=("k",), sequence_by=("seq",), delete_column="IsDelete")
    columns = {"k": pa.array([r["k"] for r in rows], pa.int64()), "seq": pa.array([r["seq"] for r in rows], pa.int64())}
    if marker is not None:
        columns["IsDelete"] = pa.array([r["IsDelete"] for r in rows], TYPES[marker])
    if with_ops:
        columns["op"] = pa.array([r["op"] for r in rows], pa.string())
    columns["__kind"] = pa.array([r["__kind"] for r in rows], pa.string())
    table = pa.table(columns)

    out, bad = cdc.resolve_kinds(table, cfg)

    kinds, reasons = reference(rows, cfg, TYPES[marker] if marker is not None else None)
    assert out.column("__kind").to_pylist() == [k for i, k in enumerate(kinds) if i not in reasons]
    assert out.column("k").to_pylist() == [r["k"] for i, r in enumerate(rows) if i not in reasons]
    assert [row.reason for _, row in bad] == [reasons[i] for i in sorted(reasons)]


CHANGES = ("insert", "update", "upsert", "delete")
POLICIES = ("insert", "ignore", "quarantine")


def _merged(table: DictTable, changes: list[tuple[int, str, str]], policy: str) -> int:
    """A batch of (key, kind, value) reduced and merged into `table` as the commit does; its quarantined rows."""
    cfg = CdcConfig(strategy="upsert", primary_key=("k",), update_of_absent=policy)
    data = pa.table({"k": pa.array([k for k, _, _ in changes], pa.int64()), "v": [v for _, _, v in changes],
                     "op": [kind for _, kind, _ in changes]})
    data = cdc.tag(data, "changelog", 0)
    data = data.set_column(data.schema.get_field_index(cdc.KIND), cdc.KIND, data.column("op"))
    reduced, bad = cdc.reduce(data, cfg)
    held = np.isin(reduced.column("k").to_numpy(), list(table.rows))
    reduced, absent = cdc.resolve(reduced, held)
    assert len(set(reduced.column("k").to_pylist())) == reduced.num_rows  # one MERGE row per key
    table.merge(reduced.select(["k", "v", "op", cdc.KIND]), cdc.plan(cfg, ["k", "v", "op"]))
    return len(bad) + len(absent)


@settings(max_examples=400, deadline=None)
@given(batches=st.lists(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(CHANGES), st.sampled_from("abc")),
                                 max_size=8), min_size=1, max_size=4),
       policy=st.sampled_from(POLICIES))
def test_a_reduced_batch_is_its_changes_applied_one_by_one(batches, policy):
    """Batch after batch, so that keys are held or not before each; table and quarantine as the model's."""
    model, table, quarantined = Model("changelog", update_of_absent=policy), DictTable(), 0
    for changes in batches:
        model.apply_batch([[{"k": k, "v": v, "op": kind} for k, kind, v in changes]])
        quarantined += _merged(table, changes, policy)
        assert table.rows == model.state
        assert quarantined == model.quarantined


# (the table before, the batch's changes of key 1, update_of_absent, the table after, rows quarantined)
CASES = {
    "insert then update of an absent key": ({}, [("insert", "a"), ("update", "b")], "ignore", {1: "b"}, 0),
    "insert then update, quarantine": ({}, [("insert", "a"), ("update", "b")], "quarantine", {1: "b"}, 0),
    "upsert then update of an absent key": ({}, [("upsert", "a"), ("update", "b")], "ignore", {1: "b"}, 0),
    "upsert then insert of a present key": ({1: "old"}, [("upsert", "new"), ("insert", "dup")], "insert",
                                            {1: "new"}, 0),
    "two inserts of an absent key": ({}, [("insert", "a"), ("insert", "b")], "insert", {1: "a"}, 0),
    "update then insert of an absent key": ({}, [("update", "b"), ("insert", "c")], "quarantine", {1: "c"}, 1),
    "update then insert of a present key": ({1: "old"}, [("update", "b"), ("insert", "c")], "quarantine",
                                            {1: "b"}, 0),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_change_that_depends_on_an_earlier_one_of_its_batch(case):
    before, changes, policy, after, quarantined = CASES[case]
    table = DictTable()
    table.rows = {k: {"k": k, "v": v, "op": "upsert"} for k, v in before.items()}
    assert _merged(table, [(1, kind, v) for kind, v in changes], policy) == quarantined
    assert {k: row["v"] for k, row in table.rows.items()} == after


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_change_that_depends_on_an_earlier_one_of_its_batch_in_delta(case):
    """The same through the pipeline and a Delta table: the commit looks the keys up (`Committer._settled`)."""
    before, changes, policy, after, quarantined = CASES[case]
    op = {"insert": "c", "upsert": "u", "update": "update", "delete": "d"}
    with tempfile.TemporaryDirectory() as tmp:
        lake = Lake(Path(tmp), {"strategy": "changelog", "primary_key": ["k"], "update_of_absent": policy})
        if before:
            lake.batch([[_row(k, v, 0, "u") for k, v in before.items()]])
        lake.batch([[_row(1, v, n + 1, op[kind]) for n, (kind, v) in enumerate(changes)]])
        assert {k: row["v"] for k, row in lake.state().items()} == after
        assert lake.quarantined() == quarantined


# With `sequence_by`: (the table before: key -> (value, sequence), value None for a key deleted at that sequence;
# the batch's (kind, value, sequence) of key 1; update_of_absent; the table after; rows quarantined)
SEQUENCED = {
    "a delete older than the stored row, then an insert": ({1: ("old", 3)}, [("delete", None, 1), ("insert", "new", 5)],
                                                           "insert", {1: "old"}, 0),
    "a delete older than the stored row, then an update": ({1: ("old", 3)}, [("delete", None, 1), ("update", "new", 5)],
                                                           "ignore", {1: "new"}, 0),
    "a delete older than the stored row, then an update, quarantine": (
        {1: ("old", 3)}, [("delete", None, 1), ("update", "new", 5)], "quarantine", {1: "new"}, 0),
    "a delete as new as the stored row, then an insert": ({1: ("old", 3)}, [("delete", None, 3), ("insert", "new", 5)],
                                                          "ignore", {1: "new"}, 0),
    "a newer delete, then an update, quarantine": ({1: ("old", 3)}, [("delete", None, 4), ("update", "new", 5)],
                                                   "quarantine", {}, 1),
    "both older than the stored row": ({1: ("old", 3)}, [("delete", None, 1), ("insert", "new", 2)], "insert",
                                       {1: "old"}, 0),
    "a delete older than the stored row, an update, an insert": (
        {1: ("old", 3)}, [("delete", None, 1), ("update", "upd", 4), ("insert", "new", 5)], "ignore", {1: "upd"}, 0),
    "a deleted key: a newer delete, then an insert": ({1: (None, 3)}, [("delete", None, 4), ("insert", "new", 5)],
                                                      "ignore", {1: "new"}, 0),
}
OP = {"insert": "c", "upsert": "u", "update": "update", "delete": "d"}


def _sequenced_case(tmp: Path, case: str, writer: str = "delta-rs") -> None:
    """A case of SEQUENCED through the pipeline into a Delta table written by `writer`, and through the model."""
    before, changes, policy, after, quarantined = SEQUENCED[case]
    lake = Lake(tmp, {"strategy": "changelog", "primary_key": ["k"], "sequence_by": ["seq"],
                      "update_of_absent": policy}, writer=writer)
    model = Model("changelog", sequence=("seq",), update_of_absent=policy)
    batches = [[[_row(k, v or "x", 0 if v is None else seq, "u") for k, (v, seq) in before.items()]],
               [[_row(k, None, seq, "d") for k, (v, seq) in before.items() if v is None]],
               [[_row(1, v, seq, OP[kind]) for kind, v, seq in changes]]]
    for files in [b for b in batches if b[0]]:
        lake.batch(files)
        model.apply_batch(files)
    assert {k: row["v"] for k, row in model.state.items()} == after and model.quarantined == quarantined
    assert {k: row["v"] for k, row in lake.state().items()} == after
    assert lake.quarantined() == quarantined
    assert lake.changelog() == model.changelog


@pytest.mark.parametrize("case", sorted(SEQUENCED))
def test_a_change_older_than_the_stored_row_does_nothing_in_delta(tmp_path, case):
    """With `sequence_by`, each change of a key is checked against what the key is when it comes, as applied one by
    one (docs/cdc.md): a delete older than the stored row does not apply, so what comes after it in the batch finds
    the key there. The commit looks up the stored row's sequence of such keys (`keyed.settled`)."""
    _sequenced_case(tmp_path, case)


def test_a_change_older_than_the_stored_row_does_nothing_in_delta_spark(spark, tmp_path):
    """The same, the table written by delta-spark (one case: a MERGE there takes seconds)."""
    _sequenced_case(tmp_path, "a delete older than the stored row, then an insert", "delta-spark")
