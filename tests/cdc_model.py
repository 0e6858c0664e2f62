"""The CDC strategies written as plainly as possible: dictionary state and a list of ops.

It follows the documented semantics (docs/cdc.md), not the implementation, which reduces a batch
to one MERGE: a batch's rows are ranked (highest sequence, then latest arrival) and applied to
the state one at a time (snapshot: the batch's last file is the state); the changelog lists each
batch's net changes in key order, a correction as (-C old, +C new).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np
import pyarrow as pa

from lakefeed.batch.cdc import MergePlan

APPEND, RETRACT, CORRECT_FROM, CORRECT_TO = 0, 1, 2, 3
KIND = {"ledger": "insert", "snapshot": "snapshot", "upsert": "upsert", "delete": "delete", "insert": "insert",
        "update": "update", "upsert_and_delete": "upsert_and_delete", "changelog": "changelog"}
OPS = {"c": "insert", "r": "upsert", "u": "upsert", "d": "delete",
       "insert": "insert", "update": "update", "upsert": "upsert", "delete": "delete"}


@dataclass
class Model:
    strategy: str
    key: str = "k"
    sequence: tuple[str, ...] = ()
    update_of_absent: str = "insert"
    event_time: str | None = None  # the event time column, if watermarks are modelled
    lateness: timedelta = timedelta(0)
    late_policy: str = "apply"
    watermark: datetime | None = None
    state: dict = field(default_factory=dict)
    tombstones: dict = field(default_factory=dict)  # key -> sequence of its newest deletion
    changelog: list = field(default_factory=list)  # (op, row)
    quarantined: int = 0

    def apply_batch(self, files: list[list[dict]]) -> None:
        """files: each a list of rows (dicts of column -> value), in arrival order."""
        changes = []  # (kind, order, row)
        for f, rows in enumerate(files):
            for i, row in enumerate(rows):
                kind = KIND[self.strategy]
                if kind == "upsert_and_delete":
                    kind = "delete" if str(row.get("IsDelete")) in ("true", "True", "1") else "upsert"
                if kind == "changelog":
                    kind = OPS.get(row.get("op") or "", "")
                if not kind or row.get(self.key) is None or any(row.get(s) is None for s in self.sequence):
                    self.quarantined += 1
                    continue
                changes.append((kind, (f, i), row))
        if self.event_time and self.watermark is not None and self.late_policy != "apply":
            late = [c for c in changes if c[2][self.event_time] < self.watermark]
            changes = [c for c in changes if c[2][self.event_time] >= self.watermark]
            if self.late_policy == "quarantine":
                self.quarantined += len(late)
        if self.event_time and changes:
            latest = max(c[2][self.event_time] for c in changes) - self.lateness
            self.watermark = latest if self.watermark is None else max(self.watermark, latest)
        if self.strategy == "snapshot":  # the batch's last file is the whole state, even when empty
            changes = [c for c in changes if c[1][0] == len(files) - 1]
        elif not changes:
            return
        rank = lambda c: (tuple(c[2][s] for s in self.sequence), c[1])  # noqa: E731
        by_key: dict = {}
        for kind, _, row in sorted(changes, key=rank):
            by_key.setdefault(row[self.key], []).append((kind, row))
        if self.strategy == "snapshot":
            ops = self._snapshot({k: rows[-1][1] for k, rows in by_key.items()})
        else:
            ops = [(k, key_ops) for k in sorted(by_key) if (key_ops := self._apply_key(k, by_key[k]))]
        for _, key_ops in sorted(ops, key=lambda o: o[0]):
            self.changelog.extend(key_ops)

    def _snapshot(self, rows: dict) -> list:
        """The batch's last file is the whole state."""
        ops = []
        for k in sorted(set(self.state) | set(rows)):
            old, new = self.state.get(k), rows.get(k)
            if new is None:
                ops.append((k, [(RETRACT, old)]))
                del self.state[k]
            elif old is None:
                ops.append((k, [(APPEND, new)]))
                self.state[k] = new
            elif old != new:
                ops.append((k, [(CORRECT_FROM, old), (CORRECT_TO, new)]))
                self.state[k] = new
        return ops

    def _apply_key(self, k, changes: list) -> list:
        """A key's changes (ranked), one at a time: an insert only if the key is absent (a ledger's rows are
        inserts: the first wins), an update only if it is present (else update_of_absent), an upsert always, a
        delete makes it absent. With a sequence, a change older than what the key is when it comes (its row, or
        the deletion that left it absent, remembered in `tombstones`) is stale: it does nothing."""
        seq = lambda row: tuple(row[s] for s in self.sequence)  # noqa: E731
        old = self.state.get(k)
        current, last = old, None  # `last`: the change that made `current` (None: the key is untouched)
        newest = seq(old) if old is not None else self.tombstones.get(k)  # of what the key is (None: nothing)
        for kind, row in changes:
            if self.sequence and newest is not None and seq(row) < newest:
                continue
            if kind == "delete":
                current, last = None, row
            elif kind == "upsert" or (kind == "insert" and current is None) or \
                    (kind == "update" and (current is not None or self.update_of_absent == "insert")):
                current, last = row, row
            else:
                if kind == "update" and current is None and self.update_of_absent == "quarantine":
                    self.quarantined += 1
                continue  # ignored: the key stays what it was
            newest = seq(row)
        if last is None:
            return []
        if current is None and self.sequence:
            self.tombstones[k] = seq(last)
        if old is None:
            return [] if current is None else self._set(k, [(APPEND, current)], current)
        if old == current:
            return []
        if current is None:
            return self._set(k, [(RETRACT, old)], None)
        return self._set(k, [(CORRECT_FROM, old), (CORRECT_TO, current)], current)

    def _set(self, k, ops: list, row: dict | None) -> list:
        if row is None:
            del self.state[k]
        else:
            self.state[k] = row
        return ops


class DictTable:
    """A table sink on a dictionary, for tests of the reduction without Delta: `lookup` as TableSink's (counted),
    `may_hold_newer` as DeltaRsSink's with exact statistics, and `merge` as the sinks' keyed MERGE
    (connectors/sinks/delta_rs.py): a key the table holds is deleted or updated by a change at least as new as its
    row; a key it does not hold inserted by a create (or an update, when updates of absent keys insert)."""

    def __init__(self, key: str = "k") -> None:
        self.key = key
        self.rows: dict = {}
        self.lookups = 0

    def lookup(self, keys: pa.Table, columns: tuple[str, ...] = ()) -> pa.Table:
        held = [k for k in dict.fromkeys(keys.column(self.key).to_pylist()) if k in self.rows]
        self.lookups += 1
        return pa.table({self.key: pa.array(held, keys.schema.field(self.key).type),
                         **{c: pa.array([self.rows[k][c] for k in held], pa.int64()) for c in columns}})

    def may_hold_newer(self, rows: pa.Table, columns: tuple[str, ...]) -> np.ndarray:
        """As file statistics tell it: whether a row's sequence is below the largest the table holds."""
        top = max((tuple(row[c] for c in columns) for row in self.rows.values()), default=None)
        return np.array([top is not None and tuple(r[c] for c in columns) < top for r in rows.to_pylist()], bool)

    def merge(self, source: pa.Table, plan: MergePlan) -> None:
        for row in source.to_pylist():
            kind, k = row.pop("__kind"), row[self.key]
            old = self.rows.get(k)
            if old is None:
                if kind in ("upsert", "insert") or (kind == "update" and plan.insert_updates_of_absent):
                    self.rows[k] = row
            elif tuple(row[s] for s in plan.sequence) >= tuple(old[s] for s in plan.sequence):
                if kind == "delete":
                    del self.rows[k]
                elif kind in ("upsert", "update"):
                    self.rows[k] = row
