"""An Arrow schema as an ODF `DataSchema` (the SetDataSchema event), mapped as kamu's
`DataSchema::new_from_arrow` maps it: a nullable field is `Option` of its type, and the Arrow buffer layout that
ODF's logical types leave open (32 or 64-bit offsets, views, Date64, decimal width) is kept as the field's
`arrow.apache.org/...Encoding` extra attribute, so that a reader can rebuild the exact Arrow type."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.types as pt

from lakefeed.odf.blocks import TIME_UNITS, DataField, DataType

_SIMPLE = {
    pa.null(): "Null", pa.bool_(): "Bool", pa.int8(): "Int8", pa.int16(): "Int16", pa.int32(): "Int32",
    pa.int64(): "Int64", pa.uint8(): "UInt8", pa.uint16(): "UInt16", pa.uint32(): "UInt32", pa.uint64(): "UInt64",
    pa.float16(): "Float16", pa.float32(): "Float32", pa.float64(): "Float64", pa.date32(): "Date",
}
_BUFFER = "arrow.apache.org/bufferEncoding"


def data_schema(schema: pa.Schema) -> tuple[DataField, ...]:
    """The ODF fields of an Arrow schema; a type ODF cannot describe is a ValueError naming the column."""
    return tuple(_field(f) for f in schema)


def _field(field: pa.Field) -> DataField:
    try:
        odf_type, encoding = _type(field.type, field.nullable)
    except ValueError as exc:
        raise ValueError(f"column {field.name!r}: {exc}") from exc
    return DataField(field.name, odf_type, encoding)


def _type(t: pa.DataType, nullable: bool) -> tuple[DataType, dict[str, Any] | None]:
    odf_type, encoding = _inner(t)
    return (DataType("Option", (("inner", odf_type),)) if nullable else odf_type), encoding


def _contiguous(bits: int) -> dict[str, Any]:
    return {_BUFFER: {"kind": "Contiguous", "offsetBitWidth": bits}}


def _inner(t: pa.DataType) -> tuple[DataType, dict[str, Any] | None]:
    if t in _SIMPLE:
        return DataType(_SIMPLE[t]), None
    if pt.is_timestamp(t):
        return DataType("Timestamp", (("unit", TIME_UNITS.index(t.unit)), ("timezone", t.tz))), None
    if pt.is_date64(t):
        return DataType("Date"), {"arrow.apache.org/dateEncoding": {"unit": "Millisecond"}}
    if pt.is_time(t):
        return DataType("Time", (("unit", TIME_UNITS.index(t.unit)),)), None
    if pt.is_duration(t):
        return DataType("Duration", (("unit", TIME_UNITS.index(t.unit)),)), None
    if pt.is_string(t) or pt.is_binary(t):
        return DataType("String" if pt.is_string(t) else "Binary"), _contiguous(32)
    if pt.is_large_string(t) or pt.is_large_binary(t):
        return DataType("String" if pt.is_large_string(t) else "Binary"), _contiguous(64)
    if t in (pa.string_view(), pa.binary_view()):
        kind = "String" if t == pa.string_view() else "Binary"
        return DataType(kind), {_BUFFER: {"kind": "View", "offsetBitWidth": 32}}
    if pt.is_fixed_size_binary(t):
        return DataType("Binary", (("fixed_length", t.byte_width),)), None
    if pt.is_decimal(t):
        width = t.byte_width * 8
        return DataType("Decimal", (("precision", t.precision), ("scale", t.scale))), \
            {"arrow.apache.org/decimalEncoding": {"bitWidth": width}}
    if pt.is_list(t) or pt.is_large_list(t) or pt.is_fixed_size_list(t):
        item, _ = _type(t.value_type, t.value_field.nullable)
        fixed = t.list_size if pt.is_fixed_size_list(t) else None
        encoding = None if fixed is not None else _contiguous(64 if pt.is_large_list(t) else 32)
        return DataType("List", (("item", item), ("fixed_length", fixed))), encoding
    if pt.is_struct(t):
        return DataType("Struct", (("fields", tuple(_field(t.field(i)) for i in range(t.num_fields))),)), None
    if pt.is_map(t):
        (key, key_encoding), (value, value_encoding) = _type(t.key_type, False), \
            _type(t.item_type, t.item_field.nullable)
        if key_encoding or value_encoding:  # as kamu: string or binary keys and values have no ODF form yet
            raise ValueError(f"type {t}: ODF maps take no keys or values with an Arrow buffer encoding")
        return DataType("Map", (("key", key), ("value", value), ("keys_sorted", t.keys_sorted))), None
    raise ValueError(f"type {t} has no Open Data Fabric equivalent")
