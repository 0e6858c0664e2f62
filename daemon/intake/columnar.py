"""Parquet and Arrow IPC bodies decoded within a budget of bytes.

Both formats compress: a few kilobytes of zstd can hold a column of ten million zeros. The budget
(`DECODED_FACTOR` × `http.max_body_bytes`) is checked before the memory is taken, from what the
formats declare: an Arrow message's buffers carry their uncompressed lengths (read here from the
message's flatbuffer, before Arrow inflates anything), a Parquet file's column chunks theirs, and
its strings are read dictionary-encoded, in slices, so repeats cost their count, not their bytes,
until the sizes add up. Dictionary and view columns, also inside lists, structs and maps, are then
counted as the plain columns they become when conformed, each index as the value it takes.
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

# A Parquet or Arrow body may decode to this many times http.max_body_bytes (zstd inflates columns 3-10x).
DECODED_FACTOR = 8
_SLICE_ROWS = 4096
_RECORD_BATCH, _DICTIONARY_BATCH = 3, 2  # Arrow's MessageHeader union


class TooLarge(Exception):
    """The body decodes to more than the budget."""


def read_arrow(body: bytes, budget: int) -> pa.Table:
    total = 0
    for message in pa.ipc.MessageReader.open_stream(body):
        total += _message_bytes(message)
        if total > budget:
            raise TooLarge
    table = pa.ipc.open_stream(body).read_all()
    _check(table, budget)
    return table


def read_parquet(body: bytes, budget: int) -> pa.Table:
    plain = pq.ParquetFile(pa.BufferReader(body))
    meta = plain.metadata
    declared = sum(meta.row_group(g).column(c).total_uncompressed_size
                   for g in range(meta.num_row_groups) for c in range(meta.num_columns))
    if declared > budget:
        raise TooLarge
    schema = plain.schema_arrow
    file = pq.ParquetFile(pa.BufferReader(body), read_dictionary=[f.name for f in schema if _is_bytes(f.type)])
    batches, total = [], 0
    for batch in file.iter_batches(batch_size=_SLICE_ROWS):
        total += sum(_array_bytes(column) for column in batch.columns)
        if total > budget:
            raise TooLarge
        batches.append(batch)
    if not batches:
        return schema.empty_table()
    return pa.Table.from_batches(batches).cast(schema)


def _check(table: pa.Table, budget: int) -> None:
    if sum(_array_bytes(chunk) for column in table.columns for chunk in column.chunks) > budget:
        raise TooLarge


def _array_bytes(array: pa.Array) -> int:
    """The bytes of the array once dictionaries and views, at any depth, are made plain (as conforming does)."""
    t = array.type
    if pa.types.is_dictionary(t):
        # Each index counts the bytes of the value it takes: values differ in size (one long list among empty
        # ones), so an average over the dictionary would let a few kilobytes of indices decode to gigabytes.
        indices = array.indices.drop_null().to_numpy(zero_copy_only=False)
        values = _slot_bytes(array.dictionary)
        expanded = int(values[indices].sum(dtype=np.int64))
        if _expands(array.dictionary.type):  # decoding makes the whole dictionary plain first, used or not
            expanded += int(values.sum(dtype=np.int64))
        return array.indices.nbytes + expanded
    if _is_view(t):
        return array.nbytes + int(_view_lengths(array).sum(dtype=np.int64))
    if not _expands(t):
        return array.nbytes
    # A list, struct, map or union holding some: its own buffers (offsets, validity) and its children, each
    # whole (an Arrow body holds them whole).
    own = sum(b.size for b in array.buffers()[:t.num_buffers] if b is not None)
    return own + sum(_array_bytes(child) for child in _children(array))


def _slot_bytes(array: pa.Array) -> np.ndarray:
    """The bytes each value of the array takes once plain (int64, one per value)."""
    t, n = array.type, len(array)
    if pa.types.is_dictionary(t):
        indices = pc.fill_null(array.indices, 0).to_numpy(zero_copy_only=False)
        return _slot_bytes(array.dictionary)[indices] + t.index_type.bit_width // 8
    if _is_view(t):
        return _view_lengths(array).astype(np.int64) + 16
    if _is_bytes(t):
        return pc.fill_null(pc.binary_length(array), 0).to_numpy(zero_copy_only=False).astype(np.int64) + 8
    if pa.types.is_struct(t):
        return sum((_slot_bytes(array.field(i)) for i in range(t.num_fields)), np.ones(n, np.int64))
    if pa.types.is_fixed_size_list(t):
        values = array.values.slice(array.offset * t.list_size, n * t.list_size)
        return _slot_bytes(values).reshape(n, t.list_size).sum(axis=1, dtype=np.int64) + 1
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        inner = np.concatenate(([0], np.cumsum(_slot_bytes(array.values), dtype=np.int64)))
        offsets = array.offsets.to_numpy(zero_copy_only=False)
        return inner[offsets[1:]] - inner[offsets[:-1]] + 8
    if pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        inner = np.concatenate(([0], np.cumsum(_slot_bytes(array.values), dtype=np.int64)))
        starts = array.offsets.to_numpy(zero_copy_only=False)
        ends = starts + pc.fill_null(pc.list_value_length(array), 0).to_numpy(zero_copy_only=False)
        return inner[ends] - inner[starts] + 16
    if pa.types.is_primitive(t) or pa.types.is_fixed_size_binary(t) or pa.types.is_decimal(t):
        return np.full(n, max(1, t.bit_width // 8), np.int64)
    return np.full(n, _array_bytes(array) // max(1, n) + 1, np.int64)  # (a union: refused once decoded)


def _view_lengths(array: pa.Array) -> np.ndarray:
    """Each view is 16 bytes starting with the value's length (Arrow has no length kernel for views)."""
    views = np.frombuffer(array.buffers()[1], dtype=np.int32, count=4 * (array.offset + len(array))) \
        if len(array) else np.zeros(0, np.int32)
    return views[4 * array.offset::4]


def _expands(t: pa.DataType) -> bool:
    """Whether the type holds a dictionary or a view at some depth."""
    return pa.types.is_dictionary(t) or _is_view(t) or any(_expands(t.field(i).type) for i in range(t.num_fields))


def _children(array: pa.Array) -> list[pa.Array]:
    t = array.type
    if pa.types.is_struct(t) or pa.types.is_union(t):
        return [array.field(i) for i in range(t.num_fields)]
    return [array.values]  # the list types; a map's values are its entries (a struct of keys and items)


def _is_view(t: pa.DataType) -> bool:
    return pa.types.is_string_view(t) or pa.types.is_binary_view(t)


def _is_bytes(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t)


def _message_bytes(message: pa.ipc.Message) -> int:
    """The bytes a record or dictionary batch message takes once decoded: its buffers' uncompressed lengths."""
    meta = message.metadata.to_pybytes()
    root = _ref(meta, 0)
    kind, header = _field(meta, root, 1), _field(meta, root, 2)
    if kind is None or header is None or meta[kind] not in (_RECORD_BATCH, _DICTIONARY_BATCH):
        return 0
    batch = _ref(meta, header)
    if meta[kind] == _DICTIONARY_BATCH:
        data = _field(meta, batch, 1)
        if data is None:
            return 0
        batch = _ref(meta, data)
    buffers, compressed = _field(meta, batch, 2), _field(meta, batch, 3) is not None
    if buffers is None:
        return 0
    vector = _ref(meta, buffers)
    body = message.body.to_pybytes() if message.body is not None else b""
    total = 0
    for i in range(struct.unpack_from("<I", meta, vector)[0]):
        offset, length = struct.unpack_from("<qq", meta, vector + 4 + 16 * i)
        if compressed and length >= 8 and offset + 8 <= len(body):
            inflated = struct.unpack_from("<q", body, offset)[0]
            total += inflated if inflated >= 0 else length - 8  # -1: the buffer was left uncompressed
        else:
            total += length
    return total


def _field(buf: bytes, table: int, index: int) -> int | None:
    """Where field `index` of the flatbuffer table at `table` is, or None when it is absent."""
    vtable = table - struct.unpack_from("<i", buf, table)[0]
    slot = 4 + 2 * index
    if slot >= struct.unpack_from("<H", buf, vtable)[0]:
        return None
    offset = struct.unpack_from("<H", buf, vtable + slot)[0]
    return table + offset if offset else None


def _ref(buf: bytes, at: int) -> int:
    return at + struct.unpack_from("<I", buf, at)[0]
