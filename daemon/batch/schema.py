"""Column types: from a CDM entity schema document, and made fit for Delta Lake."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from lakefeed.config.cdm_keys import attributes
from lakefeed.errors import ManifestError

# CDM data formats (foundations.cdm.json) and the common data type names, to Arrow.
_CDM_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(), "char": pa.string(), "guid": pa.string(), "json": pa.string(),
    "entityid": pa.string(),  # the type of CDM's key attributes (purpose identifiedBy)
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
            fields = [_field(a) for a in attributes(definition.get("hasAttributes") or ())]
            return pa.schema(fields) if fields else None
    raise ManifestError(f"entity schema document {document} has no definition of entity {entity_name!r}")


def _field(attribute: dict[str, Any]) -> pa.Field:
    kind = attribute.get("dataFormat") or attribute.get("dataType") or "string"
    if isinstance(kind, dict):
        kind = kind.get("dataTypeReference", "string")
    arrow = _CDM_TYPES.get(str(kind).lower())
    if arrow is None:
        raise ManifestError(f"attribute {attribute['name']!r} has data type {kind!r}, which lakefeed cannot map")
    return pa.field(attribute["name"], arrow)


def delta_compatible(schema: pa.Schema) -> pa.Schema:
    """Types Delta Lake can store: UTC microsecond timestamps, signed integers, no null type, no dictionaries."""
    fields = []
    for f in schema:
        t = decoded(f.type)
        if pa.types.is_null(t):
            t = pa.string()
        elif pa.types.is_timestamp(t):
            t = pa.timestamp("us", tz="UTC")
        elif pa.types.is_unsigned_integer(t):
            t = pa.int64()
        elif pa.types.is_large_string(t) or pa.types.is_string_view(t):
            t = pa.string()
        elif pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
            t = pa.binary()
        fields.append(pa.field(f.name, t, nullable=True))
    return pa.schema(fields)


def decoded(t: pa.DataType) -> pa.DataType:
    """`t` with every dictionary, at any depth, replaced by its value type. A dictionary (pandas' `Categorical`, read
    from Parquet) is only an encoding, which Delta stores as its values, but Arrow cannot sort by one (the keyed
    reduction sorts by key) and ODF has no type for one (the changelog): decoded once, when rows are conformed."""
    if pa.types.is_dictionary(t):
        return decoded(t.value_type)
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(decoded(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(decoded(t.key_type)), t.item_field.with_type(decoded(t.item_type)),
                       t.keys_sorted)
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(decoded(t.value_type)), t.list_size)
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(decoded(t.value_type)))
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(decoded(t.value_type)))
    return t


_FRACTION_DIGITS = {"s": 0, "ms": 3, "us": 6, "ns": 9}


def cast_to(column: pa.Array | pa.ChunkedArray | pa.Scalar, to: pa.DataType) -> pa.Array | pa.ChunkedArray | pa.Scalar:
    """`column` cast to `to`, text to a timestamp with more fractional digits than the unit holds included. Text
    without a zone offset, bound for a timestamp with a zone, is a UTC time: Arrow's CSV reader takes a column of
    only such texts as timestamps without a zone, which cast as UTC, and the same text must mean the same time
    when a neighbour in its column does not parse."""
    try:
        return column.cast(to)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        text = timestamp_text(column, to)
        if text is column:
            raise
        try:
            return text.cast(to)  # only now: truncating costs about ten times the cast
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            if to.tz is None:
                raise
            return text.cast(pa.timestamp(to.unit)).cast(to)


def timestamp_text(column: pa.Array | pa.ChunkedArray, to: pa.DataType) -> pa.Array | pa.ChunkedArray:
    """Text bound for a timestamp column, its fractions of a second truncated to the digits the column's
    unit holds: Arrow parses no more digits than the unit has, and .NET (Dataverse) writes seven
    (`2022-08-30T07:14:07.0000000Z`). Anything else is returned as it is."""
    if not pa.types.is_timestamp(to) or column.type not in (pa.string(), pa.large_string(), pa.string_view()):
        return column
    digits = _FRACTION_DIGITS[to.unit]
    seconds = rf"(:\d\d\.\d{{{digits}}})\d+" if digits else r"(:\d\d)\.\d+"
    return pc.replace_substring_regex(column.cast(pa.string()), seconds, r"\1")


GENERATED_BY = "Generated by lakefeed from the Delta table's schema; lakefeed keeps it in step."


def _cdm_format(t: pa.DataType) -> str:
    checks = [
        (pa.types.is_boolean, "Boolean"), (pa.types.is_int8, "Byte"), (pa.types.is_int16, "Int16"),
        (pa.types.is_int32, "Int32"), (pa.types.is_integer, "Int64"), (pa.types.is_float32, "Float"),
        (pa.types.is_floating, "Double"), (pa.types.is_decimal, "Decimal"), (pa.types.is_date, "Date"),
        (pa.types.is_timestamp, "DateTime"), (pa.types.is_binary, "Binary"),
    ]
    return next((name for check, name in checks if check(t)), "String")


def entity_document(entity_name: str, schema: pa.Schema) -> dict[str, Any]:
    """A CDM entity schema document describing a table's columns."""
    return {
        "jsonSchemaSemanticVersion": "1.0.0",
        "imports": [{"corpusPath": "cdm:/foundations.cdm.json"}],
        "definitions": [{
            "entityName": entity_name,
            "explanation": GENERATED_BY,
            "hasAttributes": [{"name": f.name, "dataFormat": _cdm_format(f.type)} for f in schema],
        }],
    }


def is_generated(document: Path) -> bool:
    try:
        doc = json.loads(document.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return any(d.get("explanation") == GENERATED_BY for d in doc.get("definitions") or () if isinstance(d, dict))
