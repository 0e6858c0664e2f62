"""An entity's state *as at* a system time and *as of* an event time, computed from its changelog (docs/bitemporal.md).

Open Data Fabric names the two projections: AS AT T, "as we knew at that time", and AS OF E, "as we should have
known at the time", knowing every correction and compensating event added since. Both come from the changelog
(`offset`, `op`, `system_time`, `event_time`, data, provenance; docs/cdc.md), read as a sequence of changes to a
state: an append (+A) or a correct-to (+C) puts a row version in, a retract (-R) or a correct-from (-C) takes one
out. In a keyed entity the row a change names is its key's (`cdc.primary_key`); an entity without a key is
append-only, every +A a row of its own.

- **as at T**: replay, in offset order, of the changes with `system_time <= T`: what the lake held at T. With T at
  or after the last change, it is the current table, as `lakefeed verify` checks; at other times it is the table
  at its last commit at or before T (Delta time travel), except between a batch's system time (taken when its
  processing starts) and its table commit, where the changelog already counts the batch, and, after a crash
  between a batch's table and changelog commits, until its replay (whose system time the changelog then takes).
- **as of E**: among the changes known as at T, replay only those that had happened by E, i.e. whose event time
  is at most E, still in offset order. Arrival order (the order lakefeed applied changes in) decides between
  changes; event time only decides whether a change counts for E. So as of any E at or after the latest event
  time the state is the as-at state, and where a key's event times never go back along its offsets it holds the
  key's SCD2 history version valid at E (`valid_from <= E < valid_to`).

Edge cases, the same for every strategy since all of them only write these four ops:
- a correction pair counts as one change, at its correct-to's event time: when that is after E the corrected-from
  version stays for E (lakefeed gives both rows the causing row's event time; ODF's -C repeats the old row's);
- a retraction counts at its own event time (the delete's; a key a snapshot dropped takes the system time): one
  after E leaves the row in place for E, one at or before E takes the key out even when the row it names was
  appended later in event time (a removal of a row not yet there leaves the key absent); a retraction carrying
  the retracted row's own event time, as ODF writes one, so takes the row out as of every E: it never happened;
- a correction that moves event time backwards puts the new version in from its own, earlier, event time;
- ties: `<=` on both axes (a change at exactly T or E counts), and offsets order changes with equal times;
- a row without an event time (a null in the event time column) counts from its system time.

The result holds the data columns under their own names, one row per live version in offset order; with
`with_system_columns` the changelog's columns as stored (a data column named like a system column is
`data_<name>`), the system columns being those of the change that wrote the version.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from time import perf_counter

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from lakefeed import log
from lakefeed.batch.cdc import OP_APPEND, OP_CORRECT_FROM, OP_RETRACT, data_of
from lakefeed.batch.changelog import SYSTEM_COLUMNS
from lakefeed.config.model import EntityConfig
from lakefeed.errors import LakefeedError
from lakefeed.inbox.storage import Storage

_log = log.get(__name__)
_TS = pa.timestamp("us", tz="UTC")
_OP_NAMES = {1: "retract", 2: "correct-from", 3: "correct-to"}


class QueryError(LakefeedError):
    """A changelog that cannot answer: missing, or holding changes the given key cannot place."""


def state(source: EntityConfig | str | Path, *, as_at: datetime | None = None, as_of: datetime | None = None,
          primary_key: Sequence[str] | None = None, with_system_columns: bool = False, limit: int | None = None,
          storage_options: dict[str, str] | None = None) -> pa.Table:
    """The entity's rows as at system time `as_at` and as of event time `as_of` (None: all of that axis).

    `source` is an entity's config (its changelog, storage and key) or a changelog's location (local or
    s3://, with `storage_options` as deltalake takes them); `primary_key` overrides the config's key, and is
    needed for a bare changelog of a keyed entity. Naive times are UTC. `limit`: only the first rows, in offset
    order. Only the system and key columns are read to find the live versions, then only the rows holding them.
    """
    started = perf_counter()
    changelog, keys = _open(source, primary_key, storage_options)
    dataset = changelog.to_pyarrow_dataset()
    live = _live_offsets(dataset, keys, _known(as_at, as_of), changelog.table_uri)
    if limit is not None:
        live = live.slice(0, max(limit, 0))
    rows = _rows(dataset, live)
    _log.debug("bitemporal.state", changelog=changelog.table_uri, as_at=_text(as_at), as_of=_text(as_of),
               rows=rows.num_rows, seconds=round(perf_counter() - started, 3))
    return rows if with_system_columns else data_of(rows)


def _open(source: EntityConfig | str | Path, primary_key: Sequence[str] | None,
          storage_options: dict[str, str] | None) -> tuple[DeltaTable, tuple[str, ...]]:
    """The changelog as a Delta table, and the key columns as the changelog stores them."""
    if isinstance(source, EntityConfig):
        location, options = source.changelog, Storage(source.storage).delta_options(source.changelog)
        keys = tuple(source.cdc.primary_key if primary_key is None else primary_key)
        what = f"entity {source.name!r}"
    else:
        location, options, keys, what = source, storage_options, tuple(primary_key or ()), "the changelog"
    try:
        changelog = DeltaTable(str(location), storage_options=options)
    except TableNotFoundError:
        raise QueryError(f"{what} has no changelog at {location}: nothing has been committed yet (its state is "
                         "empty at every time), or the location is wrong") from None
    return changelog, tuple(f"data_{k}" if k in SYSTEM_COLUMNS else k for k in keys)


def _utc(t: datetime) -> pa.Scalar:
    return pa.scalar(t.astimezone(UTC) if t.tzinfo else t.replace(tzinfo=UTC), _TS)


def _text(t: datetime | None) -> str | None:
    return t.isoformat() if t is not None else None


def _known(as_at: datetime | None, as_of: datetime | None) -> ds.Expression:
    """The changes that count: known by `as_at`, happened by `as_of`. A correct-from never decides a row (its
    correct-to, right after it, replaces the key's version and carries the pair's event time): left out."""
    known = ds.field("op") != OP_CORRECT_FROM
    system, event = ds.field("system_time"), ds.field("event_time")
    if as_at is not None:
        known &= system <= _utc(as_at)
    if as_of is not None:
        e = _utc(as_of)
        known &= (event <= e) | (event.is_null() & (system <= e))
    return known


def _live_offsets(dataset: ds.Dataset, keys: tuple[str, ...], known: ds.Expression, where: str) -> pa.Array:
    """The offsets of the row versions live after replaying the changes that count, ascending.

    Keyed: each key's last change that counts decides it (replaying +A, -R, +C in offset order leaves exactly
    that), and the key is live unless that change is a retraction. Append-only: every append that counts."""
    missing = [k for k in keys if k not in dataset.schema.names]
    if missing:
        raise QueryError(f"{where}: no key column {', '.join(map(repr, missing))} in the changelog (it has "
                         f"{', '.join(dataset.schema.names)}): give the entity's cdc.primary_key")
    changes = dataset.to_table(columns=["offset", "op", *keys], filter=known)
    if not keys:
        _append_only(changes, where)
        live = changes.column("offset").combine_chunks()
    else:
        last = changes.group_by(list(keys), use_threads=False).aggregate([("offset", "max")]).column("offset_max")
        decides = pc.is_in(changes.column("offset"), value_set=last.combine_chunks())
        kept = pc.and_(decides, pc.not_equal(changes.column("op"), OP_RETRACT))
        live = changes.filter(kept).column("offset").combine_chunks()
    return live.take(pc.sort_indices(live))


def _append_only(changes: pa.Table, where: str) -> None:
    """Changes other than appends need a key to say which row they change."""
    stray = changes.filter(pc.not_equal(changes.column("op"), OP_APPEND))
    if stray.num_rows:
        first = stray.sort_by("offset").slice(0, 1).to_pylist()[0]
        raise QueryError(f"{where}: offset {first['offset']} is a {_OP_NAMES.get(first['op'], first['op'])}, "
                         "but no primary key says which row it changes: give the entity's cdc.primary_key "
                         "(primary_key= in Python), or run `lakefeed verify` if the entity is append-only")


def _rows(dataset: ds.Dataset, offsets: pa.Array) -> pa.Table:
    """The changelog rows at `offsets`, in offset order (the range lets file statistics skip whole files)."""
    if len(offsets) == 0:
        return dataset.schema.empty_table()
    offset = ds.field("offset")
    bounds = pc.min_max(offsets)
    wanted = (offset >= bounds["min"]) & (offset <= bounds["max"]) & offset.isin(offsets)
    return dataset.to_table(filter=wanted).sort_by("offset")
