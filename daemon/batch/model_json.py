"""Legacy CDM `model.json` folders, as Azure Synapse Link for Dataverse writes them (docs/model-json.md).

    <root>/2024-01-01T10.00.00Z/model.json           entities: attributes (name, dataType), partitions
    <root>/2024-01-01T10.00.00Z/account/2024.csv      header-less CSV, cells bound to attributes by position

A timestamp folder is complete once its model.json exists and is not empty. Each CSV is read with the
attributes of its own folder's model.json, so a column a later folder adds never shifts older rows: a row with
fewer cells than attributes gets nulls for the rest, one with more goes to quarantine. Partition locations are
absolute URLs (`https://<account>.dfs.core.windows.net/<container>/<path>`): `<path>` is taken relative to the
landing root, which is the container's root.
"""

from __future__ import annotations

import csv
import io
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa

from lakefeed.config.synapse import MODEL

_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(), "guid": pa.string(), "int64": pa.int64(), "int32": pa.int32(), "integer": pa.int64(),
    "double": pa.float64(), "decimal": pa.decimal128(38, 18), "boolean": pa.bool_(),
    "datetime": pa.timestamp("us", tz="UTC"), "datetimeoffset": pa.timestamp("us", tz="UTC"), "date": pa.date32(),
}


@dataclass(frozen=True)
class Table:
    name: str
    attributes: tuple[tuple[str, pa.DataType], ...]
    partitions: tuple[str, ...]  # locations relative to the landing root


def arrow_type(data_type: Any) -> pa.DataType:
    """A model.json dataType as Arrow (unknown ones are kept as text)."""
    return _TYPES.get(str(data_type).lower(), pa.string())


def relative_location(location: str) -> str | None:
    """A partition's location relative to the container root: the URL's path without the container."""
    parsed = urlparse(location)
    if not parsed.scheme:
        return location.lstrip("/") or None
    parts = unquote(parsed.path).lstrip("/").split("/", 1)
    return parts[1] if len(parts) == 2 and parts[1] else None


def parse(text: str) -> dict[str, Table]:
    """The local entities of a model.json document; ValueError for a document that is not one."""
    doc = json.loads(text)
    if not isinstance(doc, dict) or not isinstance(doc.get("entities"), list):
        raise ValueError("model.json has no entities list")
    tables = {}
    for entity in doc["entities"]:
        if not isinstance(entity, dict) or entity.get("$type", "LocalEntity") != "LocalEntity":
            continue
        name = entity.get("name")
        attributes = entity.get("attributes")
        if not isinstance(name, str) or not isinstance(attributes, list):
            raise ValueError(f"an entity of model.json has no name or attributes: {str(entity)[:200]}")
        columns = tuple((str(a["name"]), arrow_type(a.get("dataType"))) for a in attributes
                        if isinstance(a, dict) and isinstance(a.get("name"), str))
        partitions = tuple(loc for p in entity.get("partitions") or () if isinstance(p, dict)
                           and isinstance(p.get("location"), str) and (loc := relative_location(p["location"])))
        tables[name] = Table(name, columns, partitions)
    return tables


_cache: dict[Path, tuple[tuple[int, int], dict[str, Table]]] = {}
_cache_lock = threading.Lock()


def tables_of(folder: Path) -> dict[str, Table] | None:
    """The tables of a timestamp folder's model.json; None while it is missing or empty (not complete)."""
    path = folder / MODEL
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    if st.st_size == 0:
        return None
    stamp = (st.st_mtime_ns, st.st_size)
    with _cache_lock:
        cached = _cache.get(path)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    tables = parse(path.read_text(encoding="utf-8-sig"))
    with _cache_lock:
        _cache[path] = (stamp, tables)
    return tables


def read_rows(path: Path, origin: Path) -> tuple[pa.Table, list[int], list[tuple[int, str, str]]]:
    """A header-less CSV (read from `path`, landed at `origin` = `<folder>/<table>/x.csv`) as text columns named
    by its folder's model.json, the line of each row kept, and (line, reason, raw) for rows that cannot be
    placed."""
    table_name = origin.parent.name
    tables = tables_of(origin.parent.parent)
    if tables is None:
        raise ValueError(f"{origin.parent.parent / MODEL} is missing or empty: the folder is not complete")
    if table_name not in tables:
        raise ValueError(f"{origin.parent.parent / MODEL} does not describe table {table_name!r}")
    names = [n for n, _ in tables[table_name].attributes]
    columns: list[list[str | None]] = [[] for _ in names]
    lines, bad = [], []
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f)
        line = 1
        for row in reader:
            if len(row) > len(names):
                bad.append((line, f"{len(row)} cells, but {MODEL} names {len(names)} attributes", _raw(row)))
            elif row:
                for i, column in enumerate(columns):
                    value = row[i] if i < len(row) else None
                    column.append(value if value != "" else None)
                lines.append(line)
            line = reader.line_num + 1
    table = pa.table({n: pa.array(c, pa.string()) for n, c in zip(names, columns, strict=True)})
    return table, lines, bad


def schema_of(path: Path) -> pa.Schema:
    """The Arrow schema of a CSV's table, from its folder's model.json."""
    tables = tables_of(path.parent.parent) or {}
    return pa.schema(tables[path.parent.name].attributes) if path.parent.name in tables else pa.schema([])


def _raw(row: list[str]) -> str:
    out = io.StringIO()
    csv.writer(out).writerow(row)
    return out.getvalue().rstrip("\r\n")
