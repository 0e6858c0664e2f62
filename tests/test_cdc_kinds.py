"""Per-row change kinds (`cdc.resolve_kinds`) against a row-by-row reference: delete markers of any type
(null, booleans, numbers, texts), operations known, unknown and missing, and null keys and sequences."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from lakefeed.batch import cdc
from lakefeed.config.model import CdcConfig

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
