"""A push batch's frames into rows: the grouped path against the frame-by-frame reference."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from lakefeed import clock
from lakefeed.batch import cdc, event_time, frames
from lakefeed.batch.read import conform
from lakefeed.config import model as config
from lakefeed.inbox.spool import Pending, Spool, encode, read_entry
from tests.conftest import write_config

CHECKED_AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
SCHEMAS = [  # what producers send: the usual types, an extra column, and ids as text that a table may not take
    pa.schema([("id", pa.int64()), ("v", pa.string())]),
    pa.schema([("id", pa.int64()), ("v", pa.string()), ("extra", pa.float64())]),
    pa.schema([("id", pa.string()), ("v", pa.string())]),
]


def reference(cfg, stream, entries, target, checked_at):
    """The batch frame by frame, as lakefeed did before frames were grouped."""
    tables, bad = [], []
    for entry in entries:
        location = f"push/{stream}/{entry.offset}"
        read = conform(read_entry(cfg.spool(stream), entry), target, first_line=1)
        bad.extend((location, b) for b in read.bad)
        table = read.table
        target = target or table.schema
        table = table.append_column("source_file", pa.repeat(pa.scalar(location, pa.string()), table.num_rows))
        if cfg.cdc.keyed:
            table = cdc.tag(table, cdc.file_kind(cfg.cdc, None), entry.offset)
        stamp_at = clock.from_cdm(entry.event_time) if entry.event_time else checked_at
        table, _ = event_time.stamp(table, cfg.event_time, location, 0, stamp_at)
        tables.append(table)
    return pa.concat_tables(tables, promote_options="permissive"), bad


frame_specs = st.lists(st.tuples(st.integers(0, 2), st.integers(1, 5), st.sampled_from([None, "2025-05-01T00:00:00Z"])),
                       min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(specs=frame_specs, keyed=st.booleans(), with_table=st.booleans(), id_text=st.sampled_from(["7", "x"]))
def test_grouped_frames_give_the_rows_and_bad_rows_of_the_frame_by_frame_reference(
        tmp_path_factory, specs, keyed, with_table, id_text):
    tmp = tmp_path_factory.mktemp("frames")
    cdc_cfg = {"strategy": "upsert", "primary_key": ["id"]} if keyed else {"strategy": "append"}
    cfg = config.load(write_config(tmp, [{"name": "orders", "cdc": cdc_cfg,
                                          "push": [{"name": "api", "tokens_sha256": ["0" * 64]}]}])).entity("orders")
    spool = Spool(cfg.spool("api"), segment_bytes=1 << 20, ttl_s=60)
    pending, row = [], 0
    for schema_no, n, header_time in specs:
        schema = SCHEMAS[schema_no]
        columns = {"id": [row + i if schema.field("id").type == pa.int64() else id_text for i in range(n)],
                   "v": [f"v{row + i}" for i in range(n)]}
        if "extra" in schema.names:
            columns["extra"] = [0.5] * n
        pending.append(Pending(encode(pa.table(columns, schema=schema)), n, None, header_time))
        row += n
    entries = spool.append(pending)
    spool.close()
    # The table's schema, when there is one, takes int ids: a text id that is not a number no longer fits.
    target = SCHEMAS[0] if with_table else None

    got, got_bad = frames.rows_of(cfg, "api", entries, target, CHECKED_AT)
    want, want_bad = reference(cfg, "api", entries, target, CHECKED_AT)

    assert got.schema == want.schema
    assert got.to_pylist() == want.to_pylist()
    assert [(loc, b.line, b.reason) for loc, b in got_bad] == [(loc, b.line, b.reason) for loc, b in want_bad]


def test_frames_that_add_a_column_with_other_types_settle_on_the_first_and_the_misfits_are_bad_rows(tmp_path):
    """`"x": 1` in one push and `"x": "a"` in the next: no one type holds both, so the batch takes the first's
    (int64), casts what fits it ("5") and hands on what does not ("a") as bad rows, with frame and line."""
    cfg = config.load(write_config(tmp_path, [{"name": "orders", "cdc": {"strategy": "upsert", "primary_key": ["id"]},
                                               "push": [{"name": "api", "tokens_sha256": ["0" * 64]}]}]))
    cfg = cfg.entity("orders")
    spool = Spool(cfg.spool("api"), segment_bytes=1 << 20, ttl_s=60)
    tables = [pa.table({"id": [1]}), pa.table({"id": [2], "x": [1]}), pa.table({"id": [3, 4], "x": ["a", "5"]})]
    entries = spool.append([Pending(encode(t), t.num_rows, None, None) for t in tables])
    spool.close()
    for target in (None, pa.schema([("id", pa.int64())])):
        rows, bad = frames.rows_of(cfg, "api", entries, target, CHECKED_AT)
        assert rows.schema.field("x").type == pa.int64()
        assert [(r["id"], r["x"]) for r in rows.to_pylist()] == [(1, None), (2, 1), (4, 5)]
        assert [(loc, b.line, b.field) for loc, b in bad] == [("push/api/2", 1, "x")]
