"""The CDC strategies written as plainly as possible: dictionary state and a list of ops.

It mirrors the documented semantics, not the implementation: a batch is reduced to one
change per key (highest sequence, then latest arrival; ledger keeps the first; snapshot
takes the batch's last snapshot file; a create ranked after a delete of its key replaces
the row, and an update after it finds the key absent, as batch by batch), then applied; the changelog lists each batch's
ops in key order, a correction as (-C old, +C new).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

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
        by_key: dict = {}
        deleted = set()  # keys with a delete in the batch, as far as the changes are taken in rank order
        absent = set()  # keys a delete left absent, with nothing created since
        rank = lambda c: (tuple(c[2][s] for s in self.sequence), c[1])  # noqa: E731
        for change in sorted(changes, key=rank):
            k = change[2][self.key]
            if self.strategy == "ledger":
                by_key.setdefault(k, change)
                continue
            if change[0] == "delete":
                deleted.add(k)
                absent.add(k)
            elif change[0] == "update" and k in deleted:
                if k in absent and self.update_of_absent != "insert":  # the delete left the key absent
                    self.quarantined += self.update_of_absent == "quarantine"
                    continue  # the delete stands
                change = ("upsert", *change[1:])  # the key is known to be there: created or inserted since
                absent.discard(k)
            elif change[0] in ("insert", "upsert"):
                if k in deleted:
                    change = ("upsert", *change[1:])  # the delete left the key absent: the create stands
                absent.discard(k)
            by_key[k] = change
        ops = []
        if self.strategy == "snapshot":
            for k in sorted(set(self.state) | set(by_key)):
                old, new = self.state.get(k), by_key.get(k)
                if new is None:
                    ops.append((k, [(RETRACT, old)]))
                    del self.state[k]
                elif old is None:
                    ops.append((k, [(APPEND, new[2])]))
                    self.state[k] = new[2]
                elif old != new[2]:
                    ops.append((k, [(CORRECT_FROM, old), (CORRECT_TO, new[2])]))
                    self.state[k] = new[2]
        else:
            for k in sorted(by_key):
                kind, _, row = by_key[k]
                seq = tuple(row[s] for s in self.sequence)
                if self.sequence and k in self.tombstones and seq < self.tombstones[k]:
                    continue  # older than the key's deletion: stale
                if self.sequence and kind == "delete":
                    self.tombstones[k] = max(seq, self.tombstones.get(k, seq))
                old = self.state.get(k)
                newer = old is None or tuple(row[s] for s in self.sequence) >= tuple(old[s] for s in self.sequence)
                if old is None:
                    if kind in ("upsert", "insert") or (kind == "update" and self.update_of_absent == "insert"):
                        ops.append((k, [(APPEND, row)]))
                        self.state[k] = row
                    elif kind == "update" and self.update_of_absent == "quarantine":
                        self.quarantined += 1
                elif kind == "delete" and newer:
                    ops.append((k, [(RETRACT, old)]))
                    del self.state[k]
                elif kind in ("upsert", "update") and newer and old != row:
                    ops.append((k, [(CORRECT_FROM, old), (CORRECT_TO, row)]))
                    self.state[k] = row
        for _, key_ops in sorted(ops, key=lambda o: o[0]):
            self.changelog.extend(key_ops)
