"""Delta column mapping (`delta.columnMapping.mode = name`) for the delta-spark writer, in tables that need it.

Without column mapping Delta refuses a column name holding a space or one of `,;{}()=` (or a newline or tab), at
any depth: a CSV header such as `first name` or `amount (EUR)` could not be written. A table that maps its
columns takes any name. Mapping needs reader version 2 and the `columnMapping` writer feature; Delta adds them
itself with the commit that turns it on, irreversibly, so the writer turns it on only for a table that gets a
name Delta would refuse. delta-rs 1.6 reads such a table (rows, statistics, history), but not its change data,
and lakefeed's delta-rs writer cannot continue it: its appends and MERGEs allow schema evolution, which delta-rs
refuses in a mapped table even when no column is new ("Schema evolution on column-mapped tables is not yet
supported").

Delta gives each column a physical name, its name in the Parquet files (and in the files' statistics and
partition values). Its own schema evolution makes them `col-<uuid>`: delta-rs 1.6 then reads nulls for them, and
so would anything reading the files without Delta (the changelog's ODF slices, manifests), and the files the
pipeline's tasks write (data_files.py, columns named as the data names them) could not be committed. So the
writer adds every column itself, with its own name as physical name, before Delta's evolution would: the files
are then the same as in a table that maps nothing. Delta does the same to the columns a table already has when
it turns mapping on.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

MODE, MAX_ID = "delta.columnMapping.mode", "delta.columnMapping.maxColumnId"
_ID, _PHYSICAL = "delta.columnMapping.id", "delta.columnMapping.physicalName"
_REFUSED = frozenset(" ,;{}()=\n\t")  # Delta's SchemaUtils.checkFieldNames, in tables without mapping


def refused(name: str) -> bool:
    """Whether Delta refuses `name` in a table that does not map its columns."""
    return not _REFUSED.isdisjoint(name)


def paths(schema: pa.Schema) -> set[tuple[str, ...]]:
    """The schema's fields at any depth, each as the names leading to it, in lower case: Spark matches names
    ignoring case (a list's item and a map's key and value are no fields: their fields go on from the list's)."""
    found: set[tuple[str, ...]] = set()

    def walk(kind: pa.DataType, path: tuple[str, ...]) -> None:
        if pa.types.is_struct(kind):
            for i in range(kind.num_fields):
                found.add(inner := (*path, kind.field(i).name.lower()))
                walk(kind.field(i).type, inner)
        elif pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
            walk(kind.value_type, path)
        elif pa.types.is_map(kind):
            walk(kind.key_type, path)
            walk(kind.item_type, path)

    walk(pa.struct(list(schema)), ())
    return found


def evolve(current: list[dict[str, Any]], incoming: list[dict[str, Any]], max_id: int
           ) -> tuple[list[dict[str, Any]], int]:
    """The table's fields (`current`, Delta's schema JSON) with those of `incoming` it lacks, at any depth, and
    every field mapped: given an id (from `max_id` up) and its own name as physical name, unless it has them.
    Returns the fields and the largest id. Names match as Spark matches them, ignoring case; a field both have
    keeps the table's type, which Delta checks the data against as before."""
    top = max_id

    def fields(have: list[dict[str, Any]], bring: list[dict[str, Any]]) -> list[dict[str, Any]]:
        brought = {f["name"].lower(): f["type"] for f in bring}
        merged = [dict(f, metadata=mapped(f), type=kind(f["type"], brought.get(f["name"].lower()))) for f in have]
        known = {f["name"].lower() for f in have}
        merged += [dict(f, metadata=mapped(f), type=kind(f["type"], None)) for f in bring
                   if f["name"].lower() not in known]
        return merged

    def kind(have: Any, bring: Any) -> Any:
        """`have` (a type of Delta's schema JSON) with the fields of `bring` (None: nothing to add) it lacks."""
        if not isinstance(have, dict):
            return have
        if not isinstance(bring, dict) or bring.get("type") != have["type"]:
            bring = None  # another type: the table's stays, and Delta judges the data
        if have["type"] == "struct":
            return dict(have, fields=fields(have["fields"], bring["fields"] if bring else []))
        if have["type"] == "array":
            return dict(have, elementType=kind(have["elementType"], bring and bring["elementType"]))
        if have["type"] == "map":
            return dict(have, keyType=kind(have["keyType"], bring and bring["keyType"]),
                        valueType=kind(have["valueType"], bring and bring["valueType"]))
        return have

    def mapped(field: dict[str, Any]) -> dict[str, Any]:
        nonlocal top
        metadata = dict(field.get("metadata") or {})
        if _ID not in metadata:
            top += 1
            metadata[_ID] = top
        metadata.setdefault(_PHYSICAL, field["name"])
        return metadata

    return fields(current, incoming), top


def renamed(fields: list[dict[str, Any]]) -> list[str]:
    """Names whose physical name is another (at any depth): given by another Delta writer's schema evolution."""
    found: list[str] = []

    def walk(kind: Any) -> None:
        if isinstance(kind, dict):
            for f in kind.get("fields", []):
                if f.get("metadata", {}).get(_PHYSICAL, f["name"]) != f["name"]:
                    found.append(f["name"])
                walk(f["type"])
            for key in ("elementType", "keyType", "valueType"):
                walk(kind.get(key))

    walk({"fields": fields})
    return found
