"""`synapse_root` entries: one config entry for an Azure Synapse Link for Dataverse folder (docs/model-json.md).

    entities:
      - synapse_root: /data/dataverse-org        # the container's root, holding the timestamp folders
        tables: [account, contact]               # optional: the tables to take (default: every one found)
        defaults: {limits: {max_columns: 4000}}
        overrides: {account: {cdc: {strategy: upsert, primary_key: [Id], sequence_by: [versionnumber]}}}

Each table becomes an entity: its files are `<timestamp folder>/<table>/*.csv`, taken once their folder's
model.json is complete (`complete_marker`), read by position with that model.json's attributes, and merged as
`upsert_and_delete` on `Id`, ordered by `versionnumber`, with `IsDelete` marking deletions.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from lakefeed.config import described

KEY = "synapse_root"
MODEL = "model.json"
FOLDER_PATTERN = r"\d{4}-\d{2}-\d{2}T\d{2}\.\d{2}\.\d{2}Z"  # Synapse Link's timestamp folders
CDC = {"strategy": "upsert_and_delete", "primary_key": ["Id"], "sequence_by": ["versionnumber"],
       "delete_column": "IsDelete"}


def entities_of(raw: dict[str, Any], base_dir: Path) -> list[dict[str, Any]]:
    """The entities of the Synapse Link folder; ValueError saying what to fix."""
    root, defaults, overrides = described.entry(raw, KEY, base_dir, extra=("tables",))
    tables = raw.get("tables")
    if tables is None:
        tables = sorted(found_tables(root))
        if not tables:
            raise ValueError(f"{root} holds no complete timestamp folder (one with a model.json) yet: list the "
                             "tables to take in `tables:`")
    elif not isinstance(tables, list) or not all(isinstance(t, str) for t in tables):
        raise ValueError("tables must be a list of table names")
    described.check_overrides(overrides, tables, f"the tables taken from {root}")
    return [{
        "name": table,
        "source": {"type": "local_dir", "path": str(root), "complete_marker": MODEL},
        "patterns": [{"name": table, "regular_expression":
                      f"/{FOLDER_PATTERN}/{re.escape(table)}/[^/]+\\.csv"}],
        "format": {"kind": "model_json"},
        "cdc": CDC,
        **defaults, **(overrides.get(table) or {}),
    } for table in tables]


def found_tables(root: Path) -> set[str]:
    """Every table a complete timestamp folder's model.json describes."""
    found: set[str] = set()
    try:
        folders = [p for p in root.iterdir() if p.is_dir() and re.fullmatch(FOLDER_PATTERN, p.name)]
    except OSError:
        return found
    for folder in folders:
        found |= _tables_of(folder / MODEL)
    return found


_read: dict[Path, tuple[tuple[int, int], frozenset[str]]] = {}  # model.json -> ((mtime, size), its tables)


def _tables_of(model: Path) -> frozenset[str]:
    """The tables of one model.json; each file is parsed once per version (a reload reads only the new ones)."""
    try:
        st = model.stat()
        known = _read.get(model)
        if known is not None and known[0] == (st.st_mtime_ns, st.st_size):
            return known[1]
        doc = json.loads(model.read_text(encoding="utf-8-sig"))
        tables = frozenset(e["name"] for e in doc["entities"] if isinstance(e, dict)
                           and isinstance(e.get("name"), str) and e.get("$type", "LocalEntity") == "LocalEntity")
    except (OSError, ValueError, KeyError, TypeError):
        return frozenset()  # missing, being written, or broken: its tables are found once it is whole
    _read[model] = (st.st_mtime_ns, st.st_size), tables
    return tables
