"""A push source's micro-batch: spool frames into one table of rows, ready for the commit.

Frames were validated when they were acknowledged, so a batch of a thousand small requests is
mostly alike: consecutive frames with the same Arrow schema (and, where the event time
depends on the frame, the same event time) are concatenated and conformed, tagged and stamped
once, instead of a thousand times under the driver's GIL, which the HTTP intake shares. Only
a group in which a row no longer fits the table (the table was created or evolved after the
frame was acknowledged) is conformed frame by frame again, so every bad row keeps its frame
and line.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import numpy as np
import pyarrow as pa

from lakefeed import clock, failpoints
from lakefeed.batch import cdc, event_time
from lakefeed.batch.read import BadRow, conform
from lakefeed.config.model import EntityConfig
from lakefeed.inbox import spool
from lakefeed.inbox.spool import Entry


def rows_of(cfg: EntityConfig, stream: str, entries: Sequence[Entry], target: pa.Schema | None,
            checked_at: datetime) -> tuple[pa.Table, list[tuple[str, BadRow]]]:
    """The frames' rows with `source_file` (`push/<stream>/<offset>`), CDC tags and event time; bad rows."""
    folder = cfg.spool(stream)
    for entry in entries:
        failpoints.reached("stage.frame", entry.key or "")
    tables = [spool.read_entry(folder, e) for e in entries]
    if target is None and tables:  # no table yet: the first frame's types are the ones the others must fit
        first = conform(tables[0], None).table
        assert first is not None
        target = first.schema
    out, bad = _groups(cfg, stream, entries, tables, target, checked_at)
    try:
        return pa.concat_tables(out, promote_options="permissive"), bad
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        # Frames gave a new column types no one type holds (`"x": 1` in one, `"x": "a"` in another): the batch
        # settles on the type the first of them gave, and rows that do not fit it go to quarantine.
        out, bad = _groups(cfg, stream, entries, tables, _settled(tables, target), checked_at)
        return pa.concat_tables(out, promote_options="permissive"), bad


def _groups(cfg: EntityConfig, stream: str, entries: Sequence[Entry], tables: Sequence[pa.Table],
            target: pa.Schema | None, checked_at: datetime) -> tuple[list[pa.Table], list[tuple[str, BadRow]]]:
    out, bad = [], []
    start = 0
    for stop in range(1, len(entries) + 1):
        if stop < len(entries) and _group_key(cfg, entries[stop], tables[stop]) == \
                _group_key(cfg, entries[start], tables[start]):
            continue
        rows, rows_bad = _group(cfg, stream, entries[start:stop], tables[start:stop], target, checked_at)
        out.append(rows)
        bad.extend(rows_bad)
        start = stop
    return out, bad


def _settled(tables: Sequence[pa.Table], target: pa.Schema | None) -> pa.Schema:
    """`target` with each new column of the frames, typed as the first frame that has it (conformed) gives it."""
    fields = list(target or [])
    for table in tables:
        known = {f.name for f in fields}
        if known.issuperset(table.column_names):
            continue
        conformed = conform(table, None).table
        if conformed is None:
            continue  # a column named twice: `_group` parks the frame's rows with the reason
        fields += [f for f in conformed.schema if f.name not in known]
    return pa.schema(fields)


def _group_key(cfg: EntityConfig, entry: Entry, table: pa.Table) -> tuple:
    # A path-based event time reads each frame's own location; otherwise only a frame's Event-Time header differs.
    per_frame = entry.offset if cfg.event_time.source == "path" else None
    return table.schema, entry.event_time, per_frame


def _group(cfg: EntityConfig, stream: str, entries: Sequence[Entry], tables: Sequence[pa.Table],
           target: pa.Schema | None, checked_at: datetime) -> tuple[pa.Table, list[tuple[str, BadRow]]]:
    locations = [f"push/{stream}/{e.offset}" for e in entries]
    read = conform(pa.concat_tables(tables) if len(tables) > 1 else tables[0], target, first_line=1)
    if read.bad and len(tables) > 1:
        out, bad = [], []
        for entry, table in zip(entries, tables, strict=True):
            rows, rows_bad = _group(cfg, stream, [entry], [table], target, checked_at)
            out.append(rows)
            bad.extend(rows_bad)
        return pa.concat_tables(out, promote_options="permissive"), bad
    table = read.table
    assert table is not None
    # Rows that no longer fit are out of the table (only in a group of one frame: see above).
    counts = np.array([t.num_rows for t in tables] if len(tables) > 1 else [table.num_rows], dtype=np.int64)
    frame_of = np.repeat(np.arange(len(tables)), counts)
    table = table.append_column("source_file", pa.array(locations, pa.string()).take(pa.array(frame_of)))
    if cfg.cdc.keyed:
        # As cdc.tag per frame: the frame's offset orders frames, the row number rows within one.
        first_row = np.repeat(np.cumsum(counts) - counts, counts)
        offsets = np.array([e.offset for e in entries], dtype=np.int64)[frame_of]
        order = offsets * cdc.ROWS_PER_SOURCE + (np.arange(table.num_rows, dtype=np.int64) - first_row)
        table = cdc.tag_rows(table, cdc.file_kind(cfg.cdc, None), order)
    stamp_at = clock.from_cdm(entries[0].event_time) if entries[0].event_time else checked_at
    # Validated when acknowledged: event times that no longer parse cannot occur here.
    table, _ = event_time.stamp(table, cfg.event_time, locations[0], 0, stamp_at)
    return table, [(locations[0], b) for b in read.bad]
