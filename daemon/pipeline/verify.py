"""`lakefeed verify`: the changelog, replayed from offset 0, must reproduce the current table; every manifest of
the lake must agree with the tables (the CDM manifest reflects the latest version, the MSC manifests list exactly
the files of the current versions, the Kartothek dataset its files, schema and indices).

Checks that offsets are dense and never reused, that every retraction and correct-from
carries exactly the values the key had, that a correct-to immediately follows its
correct-from, and that the replayed state equals the table row for row.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pyarrow as pa

from lakefeed.batch.cdc import OP_APPEND, OP_CORRECT_FROM, OP_CORRECT_TO, OP_RETRACT
from lakefeed.batch.changelog import SYSTEM_COLUMNS
from lakefeed.config.model import EntityConfig
from lakefeed.connectors.sinks.delta_rs import DeltaRsSink
from lakefeed.inbox.storage import Storage
from lakefeed.manifests.base import manifests_of
from lakefeed.manifests.cdm import ManifestKeeper
from lakefeed.pipeline.sinks import delta_sink


def _rows(sink: DeltaRsSink) -> pa.Table | None:
    return sink.to_arrow() if sink.version() is not None else None


def verify(cfg: EntityConfig, limit: int = 20) -> list[str]:
    """Problems found (at most `limit`), empty when the changelog reproduces the table and the MSC manifests
    list the tables' files."""
    table = delta_sink(cfg, cfg.table)
    manifests = manifests_of(cfg, ManifestKeeper(cfg, table), Storage(cfg.storage))
    return (_replay(cfg, limit) + [p for m in manifests for p in m.check()])[:limit]


def _replay(cfg: EntityConfig, limit: int) -> list[str]:
    table, changelog = _rows(delta_sink(cfg, cfg.table)), _rows(delta_sink(cfg, cfg.changelog))
    if changelog is None:
        return [] if table is None or table.num_rows == 0 else [f"table has {table.num_rows} rows but no changelog"]
    columns = table.column_names if table is not None else []
    stored = {c: f"data_{c}" if c in SYSTEM_COLUMNS else c for c in columns}
    log = changelog.sort_by("offset").to_pylist()
    problems = [f"offset {r['offset']} at position {i}: offsets must be dense from 0"
                for i, r in enumerate(log) if r["offset"] != i][:limit]
    keys = cfg.cdc.primary_key
    state: dict[Any, tuple] = {}
    appended: Counter[tuple] = Counter()
    pending: tuple | None = None  # the key of a correct-from waiting for its correct-to
    for r in log:
        values = tuple(_hashable(r.get(stored[c])) for c in columns)
        key = tuple(_hashable(r.get(stored[k])) for k in keys)
        op = r["op"]
        if pending is not None and (op != OP_CORRECT_TO or key != pending):
            problems.append(f"offset {r['offset']}: a correct-from at key {pending} is not followed by its correct-to")
        pending = None
        if not keys:
            if op != OP_APPEND:
                problems.append(f"offset {r['offset']}: op {op} in an append-only entity")
            appended[values] += 1
        elif op in (OP_APPEND, OP_CORRECT_TO):
            if op == OP_APPEND and key in state:
                problems.append(f"offset {r['offset']}: append of key {key}, which is present")
            state[key] = values
        elif op in (OP_RETRACT, OP_CORRECT_FROM):
            if state.get(key) != values:
                problems.append(f"offset {r['offset']}: op {op} carries {values} but key {key} holds {state.get(key)}")
            if op == OP_RETRACT:
                state.pop(key, None)
            else:
                pending = key
        if len(problems) >= limit:
            return problems
    replayed = appended if not keys else Counter(state.values())
    current = Counter(tuple(_hashable(row[c]) for c in columns)
                      for row in (table.to_pylist() if table is not None else []))
    if replayed != current:
        missing, extra = current - replayed, replayed - current
        problems.append(f"replayed changelog differs from the table: {sum(missing.values())} table rows not "
                        f"reproduced, {sum(extra.values())} replayed rows not in the table")
    return problems[:limit]


def _hashable(value: Any) -> Any:
    """Nested values (structs, lists, maps) as canonical JSON, so rows can be counted and compared."""
    if isinstance(value, dict | list | tuple):
        return json.dumps(value, sort_keys=True, default=str)
    return value
