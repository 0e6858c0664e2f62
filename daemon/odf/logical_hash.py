"""The logical hash of a data slice: arrow-digest's `RecordDigestV0<Sha3_256>` (crate arrow-digest 58.0.0, the one
kamu uses) over its records, as a multihash with ODF's code `arrow0-sha3-256` (0x300016).

The algorithm, as the crate has it:
- one SHA3-256 per leaf column (struct fields are flattened depth first), seeded with the column's type
  (`hash_data_type`: a type id, signedness and bit width, time units, the time zone);
- each value feeds its column's hasher: fixed-width values as their little-endian bytes, booleans as 1/2,
  strings and binaries as their u64 length then their bytes, lists as their u64 length then their items; a null
  as the single byte 0. Struct children take the struct's nulls as the crate combines them (a bitwise OR of the
  two validity masks when both have nulls: a child value is null only where it and its struct are);
- the record hasher takes every field's name (u64 length, bytes) and nesting level (u64), then each column's
  digest in order.

Every value's encoding depends only on the value, so the hash does not depend on how Parquet encoded them, nor
(but for a struct whose fields have nulls of their own, see `logical_digest`) on how rows are split into
batches. Types the crate does not hash (null, duration, interval, map, dictionary, union, structs inside lists)
are a ValueError naming the column. tests/test_odf_logical_hash.py checks it against the crate itself.

One case the crate leaves undefined: a struct's field that is null inside a struct that is not, in a batch where
other structs are null, counts as valid (the OR above) and is hashed from whatever bytes the Parquet reader left
in the null slot. lakefeed hashes zeros there, as arrow-rs usually leaves them; kamu may differ on such data."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.types as pt

from lakefeed.odf import multiformats

_CHUNK = 1 << 16  # values encoded at a time: bounds the memory the index arrays take
_U64 = np.dtype("<u8")


BATCH_ROWS = 10_000  # kamu's `get_parquet_logical_hash` reads a slice in batches of this many rows


def logical_multihash(table: pa.Table | pa.RecordBatch) -> bytes:
    return multiformats.multihash(multiformats.ARROW0_SHA3_256, logical_digest(table))


def logical_digest(table: pa.Table | pa.RecordBatch, batch_rows: int = BATCH_ROWS) -> bytes:
    """The digest of `table` fed in batches of `batch_rows` rows, as kamu feeds a slice (where a struct and its
    fields both have nulls the crate's result depends on the batches)."""
    schema = table.schema
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    table = table.combine_chunks()
    record = hashlib.sha3_256()
    columns: list[tuple[str, pa.DataType, list[pa.Array]]] = []
    for name, level, type_ in _walk_fields(schema, 0):
        record.update(struct.pack("<Q", len(name.encode())) + name.encode() + struct.pack("<Q", level))
        if not pt.is_struct(type_):
            columns.append((name, type_, []))
    for batch in table.to_batches(max_chunksize=batch_rows):
        leaves = list(_leaves(batch.columns, None))
        for (_, _, parts), leaf in zip(columns, leaves, strict=True):
            parts.append(leaf)
    for name, type_, parts in columns:
        hasher = hashlib.sha3_256()
        try:
            hasher.update(_type_bytes(type_))
            for array, validity in parts:
                _update(hasher, array, validity)
        except ValueError as exc:
            raise ValueError(f"column {name!r}: {exc}") from exc
        record.update(hasher.digest())
    return record.digest()


def _walk_fields(fields: pa.Schema | pa.StructType, level: int) -> Iterator[tuple[str, int, pa.DataType]]:
    for field in fields:
        yield field.name, level, field.type
        if pt.is_struct(field.type):
            yield from _walk_fields(field.type, level + 1)


def _validity(array: pa.Array) -> np.ndarray | None:
    return None if array.null_count == 0 else array.is_valid().to_numpy(zero_copy_only=False)


def _leaves(arrays: list[pa.Array], parent: np.ndarray | None) -> Iterator[tuple[pa.Array, np.ndarray | None]]:
    """Each leaf array with its validity as the crate combines it (`maybe_combine_null_buffers`)."""
    for array in arrays:
        own = _validity(array)
        if parent is not None and own is not None:
            combined = parent | own  # the crate ORs the two masks
        else:
            combined = own if own is not None else parent
        if pt.is_struct(array.type):
            yield from _leaves([array.field(i) for i in range(array.type.num_fields)], combined)
        else:
            yield array, combined


def _type_bytes(t: pa.DataType) -> bytes:
    """arrow-digest's `hash_data_type`."""
    u16, u64 = (lambda v: struct.pack("<H", v)), (lambda v: struct.pack("<Q", v))
    if pt.is_boolean(t):
        return u16(5)
    if pt.is_integer(t):
        return u16(1) + bytes([1 if pt.is_signed_integer(t) else 0]) + u64(t.bit_width)
    if pt.is_floating(t):
        return u16(2) + u64(t.bit_width)
    if pt.is_timestamp(t):
        zone = b"\x00" if t.tz is None else u64(len(t.tz.encode())) + t.tz.encode()
        return u16(9) + u16(("s", "ms", "us", "ns").index(t.unit)) + zone
    if pt.is_date32(t):
        return u16(7) + u64(32) + u16(0)
    if pt.is_date64(t):
        return u16(7) + u64(64) + u16(1)
    if pt.is_time32(t) or pt.is_time64(t):
        return u16(8) + u64(t.bit_width) + u16(("s", "ms", "us", "ns").index(t.unit))
    if pt.is_binary(t) or pt.is_large_binary(t) or pt.is_fixed_size_binary(t) or t == pa.binary_view():
        return u16(3)
    if pt.is_string(t) or pt.is_large_string(t) or t == pa.string_view():
        return u16(4)
    if pt.is_list(t) or pt.is_large_list(t) or pt.is_fixed_size_list(t):
        return u16(11) + _type_bytes(t.value_type)
    if pt.is_decimal(t):
        return u16(6) + u64(t.bit_width) + u64(t.precision) + u64(t.scale)
    raise ValueError(f"arrow-digest does not hash type {t}")


def _fixed_width(t: pa.DataType) -> int | None:
    temporal = pt.is_timestamp(t) or pt.is_date(t) or pt.is_time(t)
    if pt.is_integer(t) or pt.is_floating(t) or temporal or pt.is_decimal(t):
        return t.bit_width // 8
    return None


def _update(hasher: hashlib._Hash, array: pa.Array, validity: np.ndarray | None) -> None:
    width = _fixed_width(array.type)
    if width is not None and validity is None:  # the crate hashes the whole buffer in one go
        hasher.update(_fixed_values(array, width).tobytes())
        return
    for start in range(0, len(array), _CHUNK):
        part = array.slice(start, _CHUNK)
        valid = None if validity is None else validity[start:start + _CHUNK]
        hasher.update(_encode(part, valid).tobytes())


def _fixed_values(array: pa.Array, width: int) -> np.ndarray:
    data = np.frombuffer(array.buffers()[1], dtype=np.uint8)
    return data[array.offset * width:(array.offset + len(array)) * width]


def _encode(array: pa.Array, valid: np.ndarray | None) -> np.ndarray:
    """The bytes the crate feeds for `array`'s values, `valid` its (combined) validity, None when all are."""
    n = len(array)
    mask = np.ones(n, dtype=bool) if valid is None else valid
    t = array.type
    width = _fixed_width(t)
    own = _validity(array)  # a slot null in the array but valid by its struct's mask reads as zeros (as arrow-rs)
    if width is not None:
        values = _fixed_values(array, width)
        if own is not None:
            values = values.reshape(n, width).copy()
            values[~own] = 0
            values = values.reshape(-1)
        return _frame(mask, None, np.arange(n) * width, np.arange(1, n + 1) * width, values)
    if pt.is_boolean(t):
        values = array.fill_null(False).to_numpy(zero_copy_only=False).astype(np.uint8) + 1
        return np.where(mask, values, 0).astype(np.uint8)
    if t in (pa.string_view(), pa.binary_view()):
        array = array.cast(pa.large_string() if t == pa.string_view() else pa.large_binary())
        t = array.type
    if pt.is_string(t) or pt.is_large_string(t) or pt.is_binary(t) or pt.is_large_binary(t):
        offsets = np.frombuffer(array.buffers()[1], dtype=np.int64 if pt.is_large_string(t) or
                                pt.is_large_binary(t) else np.int32)[array.offset:array.offset + n + 1]
        data = np.frombuffer(array.buffers()[2], dtype=np.uint8) if array.buffers()[2] else np.zeros(0, np.uint8)
        begin, end = offsets[:-1].astype(np.int64), offsets[1:].astype(np.int64)
        if own is not None:
            end = np.where(own, end, begin)
        return _frame(mask, end - begin, begin, end, data)
    if pt.is_fixed_size_binary(t):
        size = t.byte_width
        data = np.frombuffer(array.buffers()[1], dtype=np.uint8)[array.offset * size:(array.offset + n) * size]
        if own is not None:
            data = data.reshape(n, size).copy()
            data[~own] = 0
            data = data.reshape(-1)
        begin = np.arange(n) * size
        return _frame(mask, np.full(n, size), begin, begin + size, data)
    if pt.is_list(t) or pt.is_large_list(t) or pt.is_fixed_size_list(t):
        if pt.is_fixed_size_list(t):
            offsets = (array.offset + np.arange(n + 1)) * t.list_size
        else:
            offsets = np.frombuffer(array.buffers()[1], dtype=np.int64 if pt.is_large_list(t) else np.int32)[
                array.offset:array.offset + n + 1].astype(np.int64)
        values = array.values
        low, high = int(offsets[0]), int(offsets[-1])
        child = values.slice(low, high - low)
        starts = _starts(child)
        data = _encode(child, _validity(child))
        begin, end = starts[offsets[:-1] - low], starts[offsets[1:] - low]
        counts = offsets[1:] - offsets[:-1]
        if own is not None:
            end, counts = np.where(own, end, begin), np.where(own, counts, 0)
        return _frame(mask, counts, begin, end, data)
    raise ValueError(f"arrow-digest does not hash type {t}")


def _starts(array: pa.Array) -> np.ndarray:
    """Where each value's encoding starts in `_encode(array)`, and its end (n + 1 entries)."""
    n = len(array)
    valid = _validity(array)
    mask = np.ones(n, dtype=bool) if valid is None else valid
    t = array.type
    if _fixed_width(t) is not None:
        sizes = np.where(mask, _fixed_width(t), 1)
    elif pt.is_boolean(t):
        sizes = np.ones(n, dtype=np.int64)
    elif pt.is_fixed_size_binary(t):
        sizes = np.where(mask, 8 + t.byte_width, 1)
    elif pt.is_list(t) or pt.is_large_list(t) or pt.is_fixed_size_list(t):
        sizes = np.diff(_list_starts(array))
        sizes = np.where(mask, 8 + sizes, 1)
    else:
        if t in (pa.string_view(), pa.binary_view()):
            array = array.cast(pa.large_string() if t == pa.string_view() else pa.large_binary())
        lengths = np.diff(np.frombuffer(array.buffers()[1], dtype=np.int64 if array.type in (
            pa.large_string(), pa.large_binary()) else np.int32)[array.offset:array.offset + n + 1])
        sizes = np.where(mask, 8 + lengths, 1)
    return np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])


def _list_starts(array: pa.Array) -> np.ndarray:
    """The byte range of each list's items within the encoding of the items (n + 1 entries)."""
    t, n = array.type, len(array)
    if pt.is_fixed_size_list(t):
        offsets = (array.offset + np.arange(n + 1)) * t.list_size
    else:
        offsets = np.frombuffer(array.buffers()[1], dtype=np.int64 if pt.is_large_list(t) else np.int32)[
            array.offset:array.offset + n + 1].astype(np.int64)
    low, high = int(offsets[0]), int(offsets[-1])
    return _starts(array.values.slice(low, high - low))[offsets - low]


def _frame(mask: np.ndarray, headers: np.ndarray | None, begin: np.ndarray, end: np.ndarray,
           data: np.ndarray) -> np.ndarray:
    """Per value: the null byte where `mask` is false; else the u64 header (when given) and data[begin:end]."""
    lengths = np.where(mask, end - begin, 0).astype(np.int64)
    head = 0 if headers is None else 8
    sizes = np.where(mask, head + lengths, 1)
    starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    out = np.zeros(int(starts[-1]), dtype=np.uint8)
    at = starts[:-1][mask]
    if headers is not None and at.size:
        header_bytes = np.asarray(headers)[mask].astype(_U64).view(np.uint8).reshape(-1, 8)
        out[at[:, None] + np.arange(8)] = header_bytes
    valid_lengths = lengths[mask]
    total = int(valid_lengths.sum())
    if total:
        within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(valid_lengths) - valid_lengths,
                                                              valid_lengths)
        out[np.repeat(at + head, valid_lengths) + within] = data[np.repeat(begin[mask], valid_lengths) + within]
    return out
