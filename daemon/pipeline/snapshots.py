"""Which files of a batch make the state of a snapshot entity (docs/cdc.md: snapshot, snapshot_scope).

The batch's last file is the whole state; with `snapshot_scope`, the last file of each scope (the value its
location gives the scope column) is the state of that scope, and the table's other scopes stay as they are. The
table's commits record the current snapshot file (of each scope, as JSON), so that the removal of that file's
object can retract its rows (`on_snapshot_removed: retract`).
"""

from __future__ import annotations

import json
from typing import Any

from lakefeed.batch.cdc import Snapshot
from lakefeed.batch.discovery import Partition
from lakefeed.config.model import CdcConfig
from lakefeed.inbox.files import InboxRecord

_WHOLE = ""  # the scope of an entity without snapshot_scope


def whole(location: str) -> Snapshot:
    """A snapshot of the whole table from one location (e.g. a push frame)."""
    return Snapshot((location,), None, location)


def of_batch(cfg: CdcConfig, recorded: str | None, records: list[InboxRecord], removed: dict[int, Partition],
             read: dict[int, Partition], log_: Any) -> tuple[Snapshot | None, list[str]]:
    """The state the batch makes (None: none of its files is one), and the locations whose rows are retracted.

    `recorded`: the table's current snapshot as its last commit records it; `removed` and `read`: the partitions
    of the batch's records whose objects were removed, and of those read, by inbox offset."""
    current = _current(recorded, cfg.snapshot_scope)
    chosen: dict[str, str] = {}  # scope -> the location that is its state after the batch
    retracted: set[str] = set()
    for rec in records:
        partition = removed.get(rec.offset) or read.get(rec.offset)
        scope = _scope(partition, cfg.snapshot_scope) if partition is not None else None
        if partition is None or scope is None:  # no scope: its rows lack a key column and go to quarantine
            continue
        location = partition.location
        if rec.offset not in removed:
            chosen[scope] = current[scope] = location
            retracted.discard(location)
        elif location == current.get(scope) and cfg.on_snapshot_removed == "retract":
            chosen[scope] = location
            retracted.add(location)
            log_.warning("snapshot.retracted", location=location,
                         reason="the object of the current snapshot was deleted (on_snapshot_removed: retract)")
    if not chosen:
        return None, []
    files = tuple(location for location in chosen.values() if location not in retracted)
    if cfg.snapshot_scope is None:
        return Snapshot(files, None, chosen[_WHOLE]), sorted(retracted)
    return Snapshot(files, tuple(sorted(chosen)), json.dumps(current, sort_keys=True)), sorted(retracted)


def _current(recorded: str | None, scope_column: str | None) -> dict[str, str]:
    if recorded is None:
        return {}
    if scope_column is None:
        return {_WHOLE: recorded}
    try:
        current = json.loads(recorded)
    except ValueError:
        return {}  # recorded before the entity had scopes: no scope's current file is known
    return current if isinstance(current, dict) else {}


def _scope(partition: Partition, scope_column: str | None) -> str | None:
    """The scope a file's partition is (its rows' value of the scope column, as the pipeline gives it them)."""
    if scope_column is None:
        return _WHOLE
    values = partition.arguments.get(scope_column)
    if not values:
        return None
    return values[0] if len(values) == 1 else json.dumps(values)
