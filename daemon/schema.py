"""Column types: from a CDM entity schema document, and made fit for Delta Lake."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
from lakefeed.errors import ManifestError

# CDM data formats (foundations.cdm.json) and the common data type names, to Arrow.
_CDM_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(), "char": pa.string(), "guid": pa.string(), "json": pa.string(),
    "int16": pa.int16(), "smallinteger": pa.int16(), "int32": pa.int32(), "integer": pa.int32(),
    "int64": pa.int64(), "biginteger": pa.int64(), "byte": pa.int8(),
    "float": pa.float32(), "double": pa.float64(), "decimal": pa.decimal128(38, 18),
    "boolean": pa.bool_(), "date": pa.date32(),
    "datetime": pa.timestamp("us", tz="UTC"), "datetimeoffset": pa.timestamp("us", tz="UTC"),
    "time": pa.string(), "binary": pa.binary(),
}


def from_entity_document(document: Path, entity_name: str) -> pa.Schema | None:
    """The schema of `entity_name` in a CDM entity document, or None if it lists no attributes."""
    try:
        doc = json.loads(document.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ManifestError(f"entity schema document {document} cannot be read: {exc}") from exc
    for definition in doc.get("definitions") or ():
        if isinstance(definition, dict) and definition.get("entityName") == entity_name:
            fields = [_field(a) for a in _attributes(definition.get("hasAttributes") or ())]
            return pa.schema(fields) if fields else None
    raise ManifestError(f"entity schema document {document} has no definition of entity {entity_name!r}")


def _attributes(items: list[Any]) -> list[dict[str, Any]]:
    out = []
    for item in items:
        if isinstance(item, dict) and "name" in item:
            out.append(item)
        elif isinstance(item, dict) and isinstance(item.get("attributeGroupReference"), dict):
            out.extend(_attributes(item["attributeGroupReference"].get("members") or ()))
    return out


def _field(attribute: dict[str, Any]) -> pa.Field:
    kind = attribute.get("dataFormat") or attribute.get("dataType") or "string"
    if isinstance(kind, dict):
        kind = kind.get("dataTypeReference", "string")
    arrow = _CDM_TYPES.get(str(kind).lower())
    if arrow is None:
        raise ManifestError(f"attribute {attribute['name']!r} has data type {kind!r}, which lakefeed cannot map")
    return pa.field(attribute["name"], arrow)


def delta_compatible(schema: pa.Schema) -> pa.Schema:
    """Types Delta Lake can store: UTC microsecond timestamps, signed integers, no null type."""
    fields = []
    for f in schema:
        t = f.type
        if pa.types.is_null(t):
            t = pa.string()
        elif pa.types.is_timestamp(t):
            t = pa.timestamp("us", tz="UTC")
        elif pa.types.is_unsigned_integer(t):
            t = pa.int64()
        elif pa.types.is_large_string(t):
            t = pa.string()
        fields.append(pa.field(f.name, t, nullable=True))
    return pa.schema(fields)
