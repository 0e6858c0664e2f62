"""Column types: from a CDM entity schema document, and made fit for Delta Lake."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
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
        t = _storable(decoded(f.type))
        if pa.types.is_null(t):
            t = pa.string()
        elif pa.types.is_timestamp(t):
            t = pa.timestamp("us", tz="UTC")
        elif pa.types.is_unsigned_integer(t):
            t = pa.int64()
        elif pa.types.is_large_string(t):
            t = pa.string()
        elif pa.types.is_large_binary(t):
            t = pa.binary()
        fields.append(pa.field(f.name, t, nullable=True))
    return pa.schema(fields)


def _storable(t: pa.DataType) -> pa.DataType:
    """`t` with the types Delta has no type for, at any depth, made ones it has without losing a value: views plain,
    half floats single, decimals of 32, 64 or (up to 38 digits) 256 bits 128, times of day text (as CDM's `time`),
    bool8 (a boolean a byte, whose storage type Delta's log showed as `byte`) boolean,
    unsigned integers signed 64-bit ones (past 2^63 a row's failure, found when cast). A nested uint8 left as it was
    became Delta's `byte` in the log while the Parquet file held 200: no reader could read the table any more. A
    table made before with such a type keeps it: rows whose values it cannot hold are quarantined. Nested
    timestamps are left as they are: delta-rs takes them, and tables already hold the types it made of them."""
    if pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_float16(t):
        return pa.float32()
    if pa.types.is_unsigned_integer(t):
        return pa.int64()
    if pa.types.is_decimal(t) and t.precision <= 38:
        return pa.decimal128(t.precision, t.scale)
    if pa.types.is_time(t):
        return pa.string()
    if isinstance(t, pa.BaseExtensionType) and t.extension_name == "arrow.bool8":  # one byte a boolean: a boolean
        return pa.bool_()
    return _nested(t, _storable)


def _nested(t: pa.DataType, child: Callable[[pa.DataType], pa.DataType]) -> pa.DataType:
    """A struct, map or list (a fixed-size list or list view made a plain list) with `child` of each child type;
    any other type as it is."""
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(child(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(child(t.key_type)), t.item_field.with_type(child(t.item_type)),
                       t.keys_sorted)
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(child(t.value_type)), t.list_size)
    if pa.types.is_large_list(t) or pa.types.is_large_list_view(t):
        return pa.large_list(t.value_field.with_type(child(t.value_type)))
    if pa.types.is_list(t) or pa.types.is_list_view(t):
        return pa.list_(t.value_field.with_type(child(t.value_type)))
    return t


def unstorable(t: pa.DataType) -> str | None:
    """Why no table can take a value of this type (at any depth), and what to send instead; None when one can."""
    if isinstance(t, pa.BaseExtensionType) and t.extension_name != "arrow.bool8":  # (bool8 casts to a boolean)
        return f"is of the Arrow extension type {t.extension_name}: send its storage type ({t.storage_type})"
    if pa.types.is_run_end_encoded(t):
        return "is run-end encoded: send its values plainly"
    if pa.types.is_union(t):
        return f"is a union ({t}), which Delta tables have no type for: send a column (or struct field) per member"
    if pa.types.is_duration(t) or pa.types.is_interval(t):
        return f"is a {t}, which Delta tables have no type for: send it as an integer count of a unit the name says"
    if pa.types.is_decimal(t) and t.precision > 38:
        return f"is a {t}: Delta decimals hold at most 38 digits; send it as a decimal128 or as text"
    names = [t.field(i).name for i in range(t.num_fields)] if pa.types.is_struct(t) else []
    if pa.types.is_struct(t) and not names:
        return "holds a struct without fields, which Parquet cannot write: leave it out or give it a field"
    if len(set(names)) < len(names):
        return f"holds a struct naming a field twice ({next(n for n in names if names.count(n) > 1)!r})"
    children = [t.value_type] if pa.types.is_dictionary(t) else [t.field(i).type for i in range(t.num_fields)]
    return next((why for child in children if (why := unstorable(child)) is not None), None)


def decoded(t: pa.DataType) -> pa.DataType:
    """`t` with every dictionary, at any depth, replaced by its value type, and every list view by a list. A
    dictionary (pandas' `Categorical`, read from Parquet) is only an encoding, which Delta stores as its values, but
    Arrow cannot sort by one (the keyed reduction sorts by key) and ODF has no type for one (the changelog): decoded
    once, when rows are conformed."""
    if pa.types.is_dictionary(t):
        return decoded(t.value_type)
    return _nested(t, decoded)


def encoded(t: pa.DataType) -> bool:
    """Whether `t` holds a dictionary or a list view at some depth (what `decode` undoes)."""
    return pa.types.is_dictionary(t) or pa.types.is_list_view(t) or pa.types.is_large_list_view(t) or \
        any(encoded(t.field(i).type) for i in range(t.num_fields))


def decode(array: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """`array` as the type `decoded` gives. Arrow's cast decodes only dictionaries of scalars, its `take` knows no
    string views, and its cast of a list view to a list loses values (pyarrow 26): a dictionary is taken value by
    value here, a list view flattened, and a list or struct holding either rebuilt around its decoded child."""
    t = array.type
    if not encoded(t):
        return array
    if isinstance(array, pa.ChunkedArray):
        return pa.chunked_array([decode(chunk) for chunk in array.chunks], decoded(t))
    if pa.types.is_dictionary(t):
        values = decode(array.dictionary)
        if pa.types.is_string_view(values.type) or pa.types.is_binary_view(values.type):
            plain = pa.large_string() if pa.types.is_string_view(values.type) else pa.large_binary()
            return pc.take(values.cast(plain), array.indices).cast(values.type)
        return pc.take(values, array.indices)
    mask = array.is_null() if array.null_count else None
    if pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        sizes = pc.fill_null(pc.list_value_length(array), 0).to_numpy(zero_copy_only=False)
        large = pa.types.is_large_list_view(t)
        offsets = pa.array(np.concatenate(([0], np.cumsum(sizes))), pa.int64() if large else pa.int32())
        lists = pa.LargeListArray if large else pa.ListArray
        return lists.from_arrays(offsets, decode(pc.list_flatten(array)), decoded(t), mask=mask)
    if pa.types.is_struct(t):
        return pa.StructArray.from_arrays([decode(array.field(i)) for i in range(t.num_fields)],
                                          fields=list(decoded(t)), mask=mask)
    if pa.types.is_map(t):
        entries = decode(array.values)
        return pa.MapArray.from_arrays(array.offsets, entries.field(0), entries.field(1), decoded(t), mask=mask)
    if pa.types.is_fixed_size_list(t):
        size = t.list_size
        values = decode(array.values.slice(array.offset * size, len(array) * size))
        return pa.FixedSizeListArray.from_arrays(values, type=decoded(t), mask=mask)
    if pa.types.is_large_list(t):
        return pa.LargeListArray.from_arrays(array.offsets, decode(array.values), decoded(t), mask=mask)
    if pa.types.is_list(t):
        return pa.ListArray.from_arrays(array.offsets, decode(array.values), decoded(t), mask=mask)
    raise pa.ArrowNotImplementedError(f"a dictionary inside a {t} cannot be decoded: send its values plainly")


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
