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
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pt

from lakefeed.odf import multiformats

_CHUNK = 1 << 18  # values encoded at a time: bounds the memory their encodings take
_U64 = np.dtype("<u8")
BATCH_ROWS = 10_000  # kamu's `get_parquet_logical_hash` reads a slice in batches of this many rows


def logical_multihash(table: pa.Table | pa.RecordBatch) -> bytes:
    return multiformats.multihash(multiformats.ARROW0_SHA3_256, logical_digest(table))


def logical_digest(table: pa.Table | pa.RecordBatch, batch_rows: int = BATCH_ROWS) -> bytes:
    """The digest of `table` as kamu computes it over the slice read in batches of `batch_rows` rows (only a
    struct whose fields have nulls of their own hashes differently in other batches). The columns are hashed in
    parallel, as many at once as Arrow's CPU pool has threads (SHA3 and Arrow's kernels run outside the GIL): in a
    Spark executor those are its cores, as Spark sets OMP_NUM_THREADS and Arrow follows it, so a task takes no
    more cores than it was given."""
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    record = hashlib.sha3_256()
    columns: list[tuple[str, pa.DataType, list[tuple[pa.Array, np.ndarray | None]]]] = []
    for name, level, type_ in _walk_fields(table.schema, 0):
        record.update(struct.pack("<Q", len(name.encode())) + name.encode() + struct.pack("<Q", level))
        if not pt.is_struct(type_):
            columns.append((name, type_, []))
    leaf = 0
    for column in table.columns:
        if pt.is_struct(column.type):
            whole = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
            windows = [whole.slice(i, batch_rows) for i in range(0, len(whole), batch_rows)]
            parts = [list(_leaves([w], None)) for w in windows]
            width = sum(1 for _, _, t in _walk_fields(column.type, 0) if not pt.is_struct(t))
            for i in range(width):
                columns[leaf + i][2].extend(p[i] for p in parts)
            leaf += width
        else:
            columns[leaf][2].extend((chunk, _validity(chunk)) for chunk in column.chunks)
            leaf += 1
    workers = min(pa.cpu_count(), len(columns))
    if workers <= 1:
        digests = [_column_digest(c) for c in columns]
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            digests = list(pool.map(_column_digest, columns))
    for digest in digests:
        record.update(digest)
    return record.digest()


def _column_digest(column: tuple[str, pa.DataType, list[tuple[pa.Array, np.ndarray | None]]]) -> bytes:
    name, type_, parts = column
    hasher = hashlib.sha3_256()
    try:
        hasher.update(_type_bytes(type_))
        for array, validity in parts:
            _update(hasher, array, validity)
    except ValueError as exc:
        raise ValueError(f"column {name!r}: {exc}") from exc
    return hasher.digest()


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
        hasher.update(_fixed_values(array, width))
        return
    for start in range(0, len(array), _CHUNK):
        part = array.slice(start, _CHUNK)
        valid = None if validity is None else validity[start:start + _CHUNK]
        hasher.update(_stream(_elements(part, valid)))


def _fixed_values(array: pa.Array, width: int) -> memoryview:
    return memoryview(array.buffers()[1])[array.offset * width:(array.offset + len(array)) * width]


def _stream(encoded: pa.LargeBinaryArray) -> memoryview:
    """The values' encodings one after the other: the data buffer between the first and the last offset."""
    offsets = np.frombuffer(encoded.buffers()[1], dtype=np.int64)
    first, last = int(offsets[encoded.offset]), int(offsets[encoded.offset + len(encoded)])
    data = encoded.buffers()[2]
    return memoryview(data)[first:last] if data is not None else memoryview(b"")


_NULL = pa.scalar(b"\x00", pa.large_binary())
_NOTHING = pa.scalar(b"", pa.large_binary())


def _headers(values: np.ndarray) -> pa.Array:
    """Each value as its 8 little-endian bytes, one binary value each."""
    raw = np.ascontiguousarray(values, dtype=_U64)
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(8), len(raw), [None, pa.py_buffer(raw)]) \
        .cast(pa.large_binary())


def _elements(array: pa.Array, valid: np.ndarray | None) -> pa.LargeBinaryArray:
    """The encoding of each value, as the crate feeds it, one binary value each; `valid` is the (combined)
    validity, None when all are. A slot null in the array but valid by its struct's mask reads as zeros (as in
    arrow-rs's readers)."""
    n, t = len(array), array.type
    own = None if array.null_count == 0 else array.is_valid()
    width = _fixed_width(t)
    if pt.is_boolean(t):
        values = array.fill_null(False).to_numpy(zero_copy_only=False).astype(np.uint8) + 1
        body = np.where(True if valid is None else valid, values, 0).astype(np.uint8)
        return pa.FixedSizeBinaryArray.from_buffers(pa.binary(1), n, [None, pa.py_buffer(body)]) \
            .cast(pa.large_binary())
    if width is not None or pt.is_fixed_size_binary(t):
        size = width if width is not None else t.byte_width
        raw = np.frombuffer(array.buffers()[1], dtype=np.uint8)[array.offset * size:(array.offset + n) * size]
        if own is not None:
            raw = raw.reshape(n, size).copy()
            raw[~own.to_numpy(zero_copy_only=False)] = 0
        body = pa.FixedSizeBinaryArray.from_buffers(pa.binary(size), n, [None, pa.py_buffer(raw)]) \
            .cast(pa.large_binary())
        if width is None:  # fixed-size binary values carry their size first
            body = pc.binary_join_element_wise(_headers(np.full(n, size)), body, _NOTHING)
    elif pt.is_string(t) or pt.is_large_string(t) or pt.is_binary(t) or pt.is_large_binary(t) \
            or t in (pa.string_view(), pa.binary_view()):
        values = pc.fill_null(array.cast(pa.large_binary()), _NOTHING)
        lengths = pc.binary_length(values).to_numpy(zero_copy_only=False)
        body = pc.binary_join_element_wise(_headers(lengths), values, _NOTHING)
    elif pt.is_list(t) or pt.is_large_list(t) or pt.is_fixed_size_list(t):
        if pt.is_fixed_size_list(t):
            offsets = (array.offset + np.arange(n + 1)) * t.list_size
        else:
            offsets = np.frombuffer(array.buffers()[1], dtype=np.int64 if pt.is_large_list(t) else np.int32)[
                array.offset:array.offset + n + 1].astype(np.int64)
        counts = np.diff(offsets)
        if own is not None:  # a null list holds nothing
            keep = own.to_numpy(zero_copy_only=False)
            counts = np.where(keep, counts, 0)
        child = array.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
        items = _elements(child, None if child.null_count == 0 else child.is_valid().to_numpy(zero_copy_only=False))
        if own is not None:
            picked = np.repeat(np.arange(n), np.diff(offsets))  # the list each item belongs to
            items = items.filter(pa.array(keep[picked])) if len(picked) else items
        joined = pc.binary_join(pa.LargeListArray.from_arrays(
            pa.array(np.concatenate([[0], np.cumsum(counts)]), pa.int64()), items), _NOTHING)
        body = pc.binary_join_element_wise(_headers(counts), pc.fill_null(joined, _NOTHING), _NOTHING)
    else:
        raise ValueError(f"arrow-digest does not hash type {t}")
    if valid is None:
        return body
    return pc.if_else(pa.array(valid), body, _NULL)
