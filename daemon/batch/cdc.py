"""The CDC engine: a batch of rows → one final change per key → a merge plan → ODF changelog rows.

Every row carries `__kind` (upsert, delete, insert, update, or snapshot) and `__order`
(inbox offset and row number: arrival order). A batch is reduced to one change per key, the
table it leaves being the one its changes applied one by one give: they are ranked by the
highest `sequence_by`, ties and entities without a sequence by arrival (ledger keeps the first
row of a key instead, snapshot keeps the batch's last snapshot file, of each scope with
`snapshot_scope`). The table sink applies the reduced batch in one MERGE; what
the merge changed (the table's change data feed) becomes the changelog: insert → 0 append
(+A), delete → 1 retract (-R, with the old row), update → 2 correct-from (-C, old values)
immediately followed by 3 correct-to (+C, new values).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakefeed.batch.changelog import assemble
from lakefeed.batch.event_time import EVENT_TIME
from lakefeed.batch.read import BadRow
from lakefeed.config.model import CdcConfig

KIND, ORDER = "__kind", "__order"
ROWS_PER_SOURCE = 1_000_000_000  # ORDER = source offset * this + row number
OP_APPEND, OP_RETRACT, OP_CORRECT_FROM, OP_CORRECT_TO = 0, 1, 2, 3
_OPS = {"insert": OP_APPEND, "delete": OP_RETRACT, "update_preimage": OP_CORRECT_FROM,
        "update_postimage": OP_CORRECT_TO}
INCREMENTAL_KINDS = {"Insert": "insert", "Update": "update", "Delete": "delete", "Upsert": "upsert",
                     "UpsertAndDelete": "upsert_and_delete"}
_TS = pa.timestamp("us", tz="UTC")
# Kinds of reduced rows whose outcome depends on whether the table holds the key (`resolve` settles them)
IF_HELD, IF_ABSENT, BAD_IF_ABSENT = "if_held", "if_absent", "bad_if_absent"
# The kinds of the rows of a key whose outcome depends on its stored row's sequence start so; those rows are the
# key's changes as they came (`keyed.settled` settles them)
WAITS = "waits:"


@dataclass(frozen=True)
class MergePlan:
    """What the table sink must do with a reduced batch; the sink turns it into its engine's MERGE."""

    keys: tuple[str, ...]
    sequence: tuple[str, ...]
    compare: tuple[str, ...]  # a matched row changes only if one of these differs
    snapshot: bool  # rows are the whole state: keys not in the batch are deleted
    insert_updates_of_absent: bool
    scope: tuple[str, tuple[str, ...]] | None = None  # snapshot: only rows with these values of this column


@dataclass(frozen=True)
class Snapshot:
    """What a batch of a snapshot entity makes the state: the rows of `files` (the last file of each scope,
    less those retracted), replacing the whole table, or with `snapshot_scope` only the rows of `scopes`.
    `current` is what the table's commit records as its current snapshot (a location, or scope -> location)."""

    files: tuple[str, ...]
    scopes: tuple[str, ...] | None
    current: str


def file_kind(cfg: CdcConfig, incremental_type: str | None) -> str:
    """The change kind of a file's rows: its CDM incremental type when it has one, else the strategy's."""
    if incremental_type is not None:
        return INCREMENTAL_KINDS[incremental_type]
    return {"ledger": "insert", "snapshot": "snapshot"}.get(cfg.strategy, cfg.strategy)


def tag(table: pa.Table, kind: str, offset: int) -> pa.Table:
    """Rows of one source (file, frame, batch) at `offset`: ordered by that offset, then by row."""
    return tag_rows(table, kind, np.arange(table.num_rows, dtype=np.int64) + offset * ROWS_PER_SOURCE)


def tag_rows(table: pa.Table, kind: str, order: np.ndarray) -> pa.Table:
    kinds = pa.repeat(pa.scalar(kind, pa.string()), table.num_rows)
    return table.append_column(KIND, kinds).append_column(ORDER, pa.array(order, pa.int64()))


def resolve_kinds(data: pa.Table, cfg: CdcConfig) -> tuple[pa.Table, list[tuple[str, BadRow]]]:
    """Per-row kinds for upsert_and_delete (delete marker) and changelog (op column); bad rows out."""
    kinds, ops = _kinds(data, cfg)
    bad_rows: dict[int, str] = {}
    if ops is not None:
        unknown = pc.and_(pc.equal(data.column(KIND), "changelog"), pc.is_null(kinds))
        for i in np.flatnonzero(pc.fill_null(unknown, False).to_numpy(zero_copy_only=False)):
            bad_rows[int(i)] = f"unknown operation {ops[int(i)].as_py()!r} in column {cfg.op_column!r}"
    for name in (*cfg.primary_key, *cfg.sequence_by):
        if name not in data.column_names:
            return data.slice(0, 0), bad_reasons(data, dict.fromkeys(range(data.num_rows),
                                                                     f"column {name!r} is missing"))
        for i in np.flatnonzero(data.column(name).is_null().to_numpy(zero_copy_only=False)):
            bad_rows.setdefault(int(i), f"{'key' if name in cfg.primary_key else 'sequence'} column {name!r} is null")
    data = data.set_column(data.schema.get_field_index(KIND), KIND, kinds)
    if not bad_rows:
        return data, []
    keep = np.ones(data.num_rows, dtype=bool)
    keep[list(bad_rows)] = False
    return data.filter(pa.array(keep)), bad_reasons(data, bad_rows)


def _text(data: pa.Table, column: str) -> pa.Array:
    """A column's values as text (null where a row has none); all null when the batch lacks the column."""
    if column not in data.column_names:
        return pa.nulls(data.num_rows, pa.string())
    return data.column(column).cast(pa.string()).combine_chunks()


def bad_rows(data: pa.Table, reason: str) -> list[tuple[str, BadRow]]:
    """Every row of `data` as a quarantined row with the same reason."""
    return bad_reasons(data, dict.fromkeys(range(data.num_rows), reason))


def _kinds(data: pa.Table, cfg: CdcConfig) -> tuple[pa.Array, pa.Array | None]:
    """Each row's kind, its delete marker or op column read (null: an unknown op), and the op column's text."""
    kinds, ops = data.column(KIND).combine_chunks(), None
    marked = pc.equal(kinds, "upsert_and_delete")
    if pc.any(marked).as_py():
        # A marker is compared as its text; a missing one (null) as "None", as Python would write it.
        marker = pc.fill_null(_text(data, cfg.delete_column), "None")
        deleted = pc.is_in(marker, value_set=pa.array(cfg.delete_values, pa.string()))
        kinds = pc.if_else(marked, pc.if_else(deleted, "delete", "upsert"), kinds)
    logged = pc.equal(kinds, "changelog")
    if pc.any(logged).as_py():
        ops = _text(data, cfg.op_column)
        names, meanings = (pa.array(list(part), pa.string()) for part in (cfg.op_values, cfg.op_values.values()))
        meant = pc.take(meanings, pc.index_in(pc.fill_null(ops, ""), value_set=names))  # null: unknown
        kinds = pc.if_else(logged, meant, kinds)
    return kinds, ops


def writes_rows(data: pa.Table, cfg: CdcConfig) -> np.ndarray:
    """Whether each tagged row would write a row to the table: not a delete, nor an update's before-image, nor a
    row of unknown op (quarantined as such by `resolve_kinds`)."""
    kinds, _ = _kinds(data, cfg)
    spared = pc.or_(pc.is_in(kinds, value_set=pa.array(["delete", "update_preimage"], pa.string())), pc.is_null(kinds))
    return ~spared.to_numpy(zero_copy_only=False).astype(bool)


def bad_reasons(data: pa.Table, reasons: dict[int, str]) -> list[tuple[str, BadRow]]:
    """The rows of `data` numbered in `reasons` as quarantined rows, each with its reason."""
    out = []
    visible = [c for c in data.column_names if c != "source_file" and not c.startswith("__")]
    for i, reason in sorted(reasons.items()):
        row = data.slice(i, 1).to_pylist()[0]
        raw = json.dumps({k: None if row[k] is None else str(row[k]) for k in visible})
        out.append((row.get("source_file") or "", BadRow(None, reason, raw)))
    return out


def reduce(data: pa.Table, cfg: CdcConfig, snapshot: Snapshot | None = None,
           stored_known: bool = False) -> tuple[pa.Table, list[tuple[str, BadRow]]]:
    """One row per key: its changes of the batch as one MERGE row (a few keys carry the rows `resolve`
    settles, or with `sequence_by` all their changes, kinds marked `WAITS`), and the updates quarantined on the
    way. `stored_known`: no change is older than its key's stored row (those were left out): no key waits.

    With a snapshot strategy, the rows of the snapshot's files are the whole state (of their
    scopes; even when empty), and earlier snapshots in the batch are superseded.
    """
    if cfg.strategy == "snapshot":
        files = pa.array(snapshot.files if snapshot is not None else (), pa.string())
        data = data.filter(pc.is_in(data.column("source_file"), value_set=files))
    sort = [(k, "ascending") for k in cfg.primary_key]
    sort += [(c, "ascending") for c in cfg.sequence_by] + [(ORDER, "ascending")]
    # Only the sort's columns are sorted; the rows themselves are taken once, the winners.
    order = pc.sort_indices(data.select([name for name, _ in sort]), sort_keys=sort).to_numpy()
    n = data.num_rows
    if n == 0:
        return data, []
    new_key = np.zeros(n, dtype=bool)
    for k in cfg.primary_key:
        col = data.column(k).take(order).combine_chunks()
        new_key[1:] |= pc.not_equal(col.slice(1), col.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    new_key[0] = True
    if cfg.strategy == "ledger":  # the first row of a key wins
        return data.take(order[new_key]), []
    if cfg.strategy == "snapshot":  # the last row of a key is its state
        return data.take(order[np.append(new_key[1:], True)]), []
    return _paths(data, order, new_key, cfg.update_of_absent, bool(cfg.sequence_by) and not stored_known)


def _paths(data: pa.Table, order: np.ndarray, new_key: np.ndarray, update_of_absent: str,
           sequenced: bool) -> tuple[pa.Table, list]:
    """Each key's changes (`order`: the rows sorted by key, then rank) applied one by one, as a MERGE row.

    Whether a change applies depends on whether the key is there when it comes (an insert only on an absent
    key, an update only on a present one), so each key is followed on two paths: P, the table holds it
    before the batch; A, it does not. The pair of outcomes is one MERGE row: (untouched, j) inserts j, (i, i)
    upserts i, (i, absent) updates i, (absent, absent) deletes. Where the paths end in different rows, or an
    update would be quarantined on A only, the outcome depends on the table: those rows carry the kinds of
    `resolve`, for the driver to settle by looking the keys up.

    With a sequence (`sequenced`), a change older than the stored row is stale: it does not apply. The MERGE
    checks the outcome alone against the stored row, which is the same as checking each change, but where an
    insert or update comes after a delete of the batch: the delete leaves the key absent on both paths, unless it
    is older than the stored row. Such a key waits: its changes stay as they came, their kinds marked `WAITS`.
    """
    rows = np.arange(data.num_rows)
    kinds = data.column(KIND).take(order)
    is_ = {kind: pc.equal(kinds, kind).to_numpy(zero_copy_only=False)
           for kind in ("delete", "update", "insert", "upsert")}
    start = np.maximum.accumulate(np.where(new_key, rows, 0))
    inserting = update_of_absent == "insert"
    # Whether the key is there after a change is the same on both paths once a change sets it: a create
    # (or an update that inserts) makes it present, a delete absent; an update that does not insert keeps it.
    sets = is_["upsert"] | is_["insert"] | is_["delete"] | (is_["update"] & inserting)
    setter = np.concatenate(([-1], np.maximum.accumulate(np.where(sets, rows, -1))[:-1]))
    setter = np.where(setter >= start, setter, -1)  # the last change before the row that set it, of its key
    set_present = (setter >= 0) & ~is_["delete"][np.maximum(setter, 0)]
    before = {"P": set_present | (setter < 0), "A": set_present}  # the key there before the row, on each path
    last = rows[np.append(new_key[1:], True)]
    final = {path: _last_applied(is_, there, inserting, start, last) for path, there in before.items()}
    p, a = final["P"], final["A"]
    p_row, a_row = (p >= 0) & ~is_["delete"][p], (a >= 0) & ~is_["delete"][a]
    key_of = np.cumsum(new_key) - 1
    waits = np.zeros(len(last), dtype=bool)  # of each key
    if sequenced:
        waits[key_of[(is_["insert"] | is_["update"]) & ~before["P"]]] = True
    go, row_goes = ~waits, ~waits[key_of]
    picks: list[tuple[np.ndarray, Any]] = [
        (p[go & p_row & (p == a)], "upsert"), (a[go & (p < 0) & a_row], "insert"), (p[go & p_row & ~a_row], "update"),
        (p[go & (p >= 0) & ~p_row], "delete"), (p[go & p_row & a_row & (p != a)], IF_HELD),
        (a[go & p_row & a_row & (p != a)], IF_ABSENT)]
    bad: list = []
    if update_of_absent == "quarantine":
        # An update of an absent key is quarantined on the path the table is on: after a delete of the
        # batch both paths are absent (always); before any, only A is (when the table does not hold the key).
        always = is_["update"] & ~before["P"] & row_goes
        if always.any():
            bad = bad_reasons(data, dict.fromkeys(order[always].tolist(), "update of a key deleted before it"))
        picks.append((rows[is_["update"] & before["P"] & ~before["A"] & row_goes], BAD_IF_ABSENT))
    if waits.any():
        waiting = rows[~row_goes]
        picks.append((waiting, pc.binary_join_element_wise(WAITS, kinds.take(waiting), "").to_numpy(
            zero_copy_only=False)))
    at = np.concatenate([where for where, _ in picks])
    kind = np.concatenate([np.full(len(where), name, dtype=object) if isinstance(name, str) else name
                           for where, name in picks])
    ranked = np.argsort(at, kind="stable")  # in the rows' order: a key's rows together
    out = data.take(order[at[ranked]])
    return out.set_column(out.schema.get_field_index(KIND), KIND, pa.array(kind[ranked], pa.string())), bad


def _last_applied(is_: dict[str, np.ndarray], there: np.ndarray, inserting: bool, start: np.ndarray,
                  last: np.ndarray) -> np.ndarray:
    """Per key (`last`: its last row), the last of its changes that applies on a path (`there`: the key is
    there before each change, on that path), or -1: none does, the key stays as the path starts."""
    applies = is_["upsert"] | is_["delete"] | (is_["insert"] & ~there) | (is_["update"] & (there | inserting))
    applied = np.maximum.accumulate(np.where(applies, np.arange(len(there)), -1))[last]
    return np.where(applied >= start[last], applied, -1)


def waiting(reduced: pa.Table) -> np.ndarray:
    """The reduced rows of keys whose outcome depends on their stored row's sequence (see `_paths`)."""
    return pc.starts_with(reduced.column(KIND), WAITS).to_numpy(zero_copy_only=False)


def as_they_came(rows: pa.Table) -> pa.Table:
    """Waiting rows with the kinds of the changes they are."""
    kinds = pc.utf8_slice_codeunits(rows.column(KIND), len(WAITS))
    return rows.set_column(rows.schema.get_field_index(KIND), KIND, kinds)


def path_dependent(reduced: pa.Table) -> np.ndarray:
    """The reduced rows whose outcome depends on whether the table holds their key (see `resolve`)."""
    kinds = reduced.column(KIND)
    return pc.is_in(kinds, value_set=pa.array([IF_HELD, IF_ABSENT, BAD_IF_ABSENT])).to_numpy(zero_copy_only=False)


def resolve(reduced: pa.Table, held: np.ndarray) -> tuple[pa.Table, list[tuple[str, BadRow]]]:
    """The MERGE rows and the quarantined updates, `held` saying for each row whether the table held its key
    before the batch: a row of the path the table is on stays (IF_HELD as an upsert, IF_ABSENT as an insert);
    an update quarantined on A only (BAD_IF_ABSENT) goes to quarantine if the table did not hold its key."""
    kinds = reduced.column(KIND)
    is_ = {kind: pc.equal(kinds, kind).to_numpy(zero_copy_only=False) for kind in (IF_HELD, IF_ABSENT, BAD_IF_ABSENT)}
    bad_rows = is_[BAD_IF_ABSENT] & ~held
    bad = bad_reasons(reduced, dict.fromkeys(np.flatnonzero(bad_rows).tolist(),
                                             "update of a key the table does not hold"))
    keep = ~(is_[BAD_IF_ABSENT] | (is_[IF_HELD] & ~held) | (is_[IF_ABSENT] & held))
    out = reduced.filter(pa.array(keep))
    kind = pc.if_else(pc.equal(out.column(KIND), IF_HELD), "upsert",
                      pc.if_else(pc.equal(out.column(KIND), IF_ABSENT), "insert", out.column(KIND)))
    return out.set_column(out.schema.get_field_index(KIND), KIND, kind), bad


def plan(cfg: CdcConfig, data_columns: list[str], snapshot: Snapshot | None = None) -> MergePlan:
    keys = cfg.primary_key
    compare = cfg.compare_columns or tuple(c for c in data_columns if c not in keys)
    scope = None
    if cfg.snapshot_scope is not None:  # no scopes known: no row of the table is deleted
        scope = (cfg.snapshot_scope, (snapshot.scopes or ()) if snapshot is not None else ())
    return MergePlan(keys, cfg.sequence_by, compare, cfg.strategy == "snapshot", cfg.update_of_absent == "insert",
                     scope)


def changelog_rows(changes: pa.Table, source: pa.Table, keys: tuple[str, ...], first_offset: int, batch_id: int,
                   system_time: datetime) -> pa.Table:
    """Changelog rows from a merge's change data (`_change_type`), in key order, -C right before +C."""
    codes = pc.index_in(changes.column("_change_type"), value_set=pa.array(list(_OPS))).to_numpy(zero_copy_only=False)
    ops = pa.array(np.array(list(_OPS.values()), dtype=np.int8)[codes])
    data = changes.drop_columns([c for c in changes.column_names if c.startswith("_change") or c.startswith("_commit")])
    data = data.append_column("__op", ops).sort_by([(k, "ascending") for k in keys] + [("__op", "ascending")])
    # A key's retract and correction pair sort as (1) or (2, 3); an append (0) never shares a key with them.
    ops = data.column("__op")
    data = data.drop_columns(["__op"])
    n = data.num_rows
    # A change's event time and file are those of the batch row that caused it; a key a snapshot
    # dropped has no row, so its retraction takes the system time.
    provenance = source.select([*keys, "source_file", EVENT_TIME])
    joined = data.select(list(keys)).append_column("__row", pa.array(np.arange(n))).join(
        provenance, keys=list(keys), join_type="left outer").sort_by("__row")
    system = pa.array(np.full(n, int(system_time.timestamp() * 1_000_000), dtype="datetime64[us]")).cast(_TS)
    event = pc.coalesce(joined.column(EVENT_TIME), system)
    front = pa.table({
        "offset": pa.array(np.arange(first_offset, first_offset + n, dtype=np.int64)),
        "op": ops, "system_time": system, "event_time": event,
    })
    return assemble(front, data, joined.column("source_file"), batch_id)


def unwrap_debezium(table: pa.Table) -> pa.Table:
    """Debezium envelopes to rows: a delete's fields from `before`, every other op's from `after`;
    `op` kept, `ts_ms` (epoch milliseconds) as a UTC timestamp."""
    n = table.num_rows
    is_delete = pc.fill_null(pc.equal(table.column("op"), "d"), False)
    images = {side: _image(table, side) for side in ("before", "after")}
    columns = {}
    for name, kind in _fields(images["after"], images["before"]).items():
        before, after = (_values(images[side], name, kind, n) for side in ("before", "after"))
        columns[name] = pc.if_else(is_delete, before, after)
    columns["op"] = table.column("op")
    if "ts_ms" in table.column_names:
        columns["ts_ms"] = table.column("ts_ms").cast(pa.int64()).cast(pa.timestamp("ms", tz="UTC")).cast(_TS)
    return pa.table(columns)


def _image(table: pa.Table, side: str) -> pa.StructArray | None:
    """One side of the envelopes as a struct array, or None when no envelope of the batch has it."""
    if side not in table.column_names or not pa.types.is_struct(table.column(side).type):
        return None
    return table.column(side).combine_chunks()


def _fields(*images: pa.StructArray | None) -> dict[str, pa.DataType]:
    """Every field of either image (the full `after` first), typed to hold both sides' values.

    The images need not have the same fields or types: a delete's before-image may hold only the key
    (REPLICA IDENTITY DEFAULT), or its other fields only nulls (typed null), and a number may be an int in
    one image and a double in the other. Types are promoted as Arrow does; text only when they cannot be."""
    types: dict[str, list[pa.DataType]] = {}
    for image in images:
        for f in image.type if image is not None else ():
            types.setdefault(f.name, []).append(f.type)
    return {name: _common_type(kinds) for name, kinds in types.items()}


def _common_type(kinds: list[pa.DataType]) -> pa.DataType:
    try:
        schemas = [pa.schema([pa.field("v", kind)]) for kind in kinds]
        return pa.unify_schemas(schemas, promote_options="permissive").field("v").type
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        return pa.string()


def _values(image: pa.StructArray | None, name: str, kind: pa.DataType, n: int) -> pa.Array:
    if image is None or image.type.get_field_index(name) < 0:
        return pa.nulls(n, kind)
    return image.field(name).cast(kind)


def history_rows(changelog: pa.Table) -> pa.Table:
    """SCD type 2 edits from a batch's changelog rows: `__h` = close (a retraction or correct-from ends the
    key's current version at the change's event time) or open (an append or correct-to starts one)."""
    ops = changelog.column("op").to_numpy(zero_copy_only=False)
    data = data_of(changelog)
    is_open = np.isin(ops, (OP_APPEND, OP_CORRECT_TO))
    return data.append_column("__h", pa.array(np.where(is_open, "open", "close"), pa.string())).append_column(
        "__at", changelog.column("event_time"))


def data_of(changelog: pa.Table) -> pa.Table:
    """The data columns of changelog rows, under their own names."""
    system = {"offset", "op", "system_time", "event_time", "source_file", "batch_id"}
    data = changelog.select([c for c in changelog.column_names if c not in system])
    return data.rename_columns([c.removeprefix("data_") if c.removeprefix("data_") in system else c
                                for c in data.column_names])
