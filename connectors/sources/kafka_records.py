"""Kafka record batches into Arrow, every record of a fetch at once.

kafka-python decodes record by record in Python: five varints, two slices and two objects per record, the
larger part of a raw consume loop's CPU. Here only the walk from one record to the next is a Python loop (one
varint each); the fields of all the records are then decoded by numpy over the whole fetch, and keys, values
and headers are gathered straight into Arrow buffers. 100,000 records of ~100 bytes: 0.9 µs per record, against
6-10 µs for kafka-python's records turned into the same Arrow columns (the way this module replaced).

`ArrowPartitionRecords` puts this in place of kafka-python's per-record `PartitionRecords` in a consumer's
fetcher (`arrow_fetches`). The fetch protocol, leader changes, the CRC check (in C), decompression, control
batches and aborted transactions stay kafka-python's. Its `poll()` then returns, per partition, `Chunk`s (an
Arrow record batch of ARROW_SCHEMA each) instead of ConsumerRecords. Message formats v0/v1 (before Kafka 0.11)
keep kafka-python's per-record decoding.

That is kafka-python's internals, so pyproject.toml pins it to 3.0.x; tests/test_kafka_records.py checks the
decoding against kafka-python's own, record by record, and that a corrupt batch raises CorruptRecordError.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
from kafka import KafkaConsumer
from kafka.consumer.fetcher import Fetcher
from kafka.errors import CorruptRecordError
from kafka.protocol.consumer.offsets import IsolationLevel
from kafka.record.default_records import DefaultRecordBatch
from kafka.structs import TopicPartition

ARROW_SCHEMA = pa.schema([
    ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")), ("key", pa.binary()), ("value", pa.binary()),
    ("headers", pa.list_(pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())])))),
])
_HEADERS = ARROW_SCHEMA.field("headers").type
_HEADER = _HEADERS.value_type
_BINARY = pa.binary()
_PAD = bytes(10)  # a varint is at most 10 bytes: reading one at the last position stays inside the buffer
_END_MS = 253_402_300_800_000  # 10000-01-01 in epoch milliseconds: Spark's timestamps end before it


@dataclass(frozen=True)
class Chunk:
    """Records of one partition in offset order, as poll() returns them in place of ConsumerRecords."""
    offset: int  # the first record's: kafka-python's fetcher skips records before the position by it
    batch: pa.RecordBatch


def arrow_fetches(consumer: KafkaConsumer, until: Mapping[TopicPartition, int] | None = None) -> KafkaConsumer:
    """Make `consumer.poll()` return Chunks; record batches that start at or after `until[tp]` are not decoded
    (a fetch brings up to max_partition_fetch_bytes, often far more than a read task's range still holds)."""
    fetcher = getattr(consumer, "_fetcher", None)
    if not isinstance(fetcher, Fetcher) or not isinstance(getattr(Fetcher, "PartitionRecords", None), type):
        raise RuntimeError("kafka-python's fetcher is not the one lakefeed was built for: install the version "
                           "pyproject.toml names (kafka-python>=3.0.12,<3.1)")
    fetcher.PartitionRecords = partial(ArrowPartitionRecords, until=dict(until or {}))  # type: ignore[attr-defined]
    return consumer


class ArrowPartitionRecords(Fetcher.PartitionRecords):  # type: ignore[misc,name-defined]
    """kafka-python's records of one fetched partition, yielded as Chunks (one per run of batches of one format)."""

    def __init__(self, *args: Any, until: Mapping[TopicPartition, int], **kwargs: Any) -> None:
        self._until = until  # before super().__init__, which makes the _unpack_records generator
        super().__init__(*args, **kwargs)

    def _unpack_records(self, tp: TopicPartition, records: Any, key_deserializer: Any,
                        value_deserializer: Any) -> Iterator[Chunk]:
        run: list[Any] = []  # consecutive batches of one message format, decoded together
        batch = records.next_batch()
        last, until = None, self._until.get(tp)
        while batch is not None:
            # (A v0/v1 batch's base offset is its last record's: it is decoded whatever `until` says.)
            if until is not None and batch.magic == 2 and batch.base_offset >= until:
                yield from self._chunk(tp, run)
                self.next_fetch_offset = max(self.next_fetch_offset, batch.base_offset)
                self.drain()
                return
            last = batch
            if self.check_crcs and not batch.validate_crc():
                raise CorruptRecordError(f"Record batch for partition {tp} at offset {batch.base_offset} "
                                         "failed crc check")
            if run and (batch.magic < 2) != (run[0].magic < 2):
                yield from self._chunk(tp, run)
                run = []
            if batch.magic < 2:
                run.append(batch)
            else:
                self.leader_epoch = batch.leader_epoch
                if self._skipped(batch):
                    self.next_fetch_offset = batch.next_offset
                else:
                    batch._maybe_uncompress()
                    run.append(batch)
            batch = records.next_batch()
        yield from self._chunk(tp, run)
        if last is not None and last.magic == 2:
            # As kafka-python: a v2 batch keeps its last offset even when compaction removed that record, and
            # fetching from there, not from the last record + 1, does not fetch the same batch again.
            self.next_fetch_offset = last.next_offset
        self.drain()

    def _skipped(self, batch: DefaultRecordBatch) -> bool:
        """Control batches, and batches of aborted transactions when reading committed (kafka-python's rules)."""
        if self.isolation_level == IsolationLevel.READ_COMMITTED and batch.has_producer_id():
            self._consume_aborted_transactions_up_to(batch.last_offset)
            if self._contains_abort_marker(batch):
                self.aborted_producer_ids.discard(batch.producer_id)
            elif self._is_batch_aborted(batch):
                return True
        return batch.is_control_batch

    def _chunk(self, tp: TopicPartition, run: list[Any]) -> Iterator[Chunk]:
        if not run:
            return
        if run[0].magic < 2:  # message formats v0/v1, before Kafka 0.11: kafka-python's records
            records = [r for batch in run for r in batch]
            if self.check_crcs and not all(r.validate_crc() for r in records):
                raise CorruptRecordError(f"a record of partition {tp} failed crc check")
            if not records:
                return
            table, next_offset = rows_to_arrow(tp.topic, tp.partition, records), records[-1].offset + 1
            size = sum(r.size_in_bytes for r in records)
        else:
            table, next_offset = decode(tp.topic, tp.partition, run), run[-1].next_offset
            size = sum(b.size_in_bytes for b in run)
        self.records_read += table.num_rows
        self.bytes_read += size
        yield from self._trimmed(table, next_offset)

    def _trimmed(self, table: pa.RecordBatch, next_offset: int) -> Iterator[Chunk]:
        """The records from the fetch offset on: a fetch answers from the start of the batch holding it."""
        offsets = table.column("offset").to_numpy()
        first = int(np.searchsorted(offsets, self.fetch_offset))
        if first < table.num_rows:
            self.next_fetch_offset = next_offset
            yield Chunk(int(offsets[first]), table.slice(first))


def decode(topic: str, partition: int, batches: list[DefaultRecordBatch]) -> pa.RecordBatch:
    """The records of v2 record batches (checked and uncompressed) as one Arrow record batch of ARROW_SCHEMA."""
    sections = [memoryview(b._buffer)[b._pos:] for b in batches]
    raw = b"".join(sections) + _PAD
    counts = [b.records_count for b in batches]
    starts = _walk(raw, [len(s) for s in sections], counts)
    n = len(starts)
    data = np.frombuffer(raw, np.uint8)
    length, pos = _varints(data, starts)
    end = pos + length
    pos += 1  # attributes: one byte (Int8), unused
    ts_delta, pos = _varints(data, pos, end)
    offset_delta, pos = _varints(data, pos, end)
    key_len, pos = _varints(data, pos, end)
    key_at, pos = pos, pos + np.maximum(key_len, 0)
    value_len, pos = _varints(data, pos, end)
    value_at, pos = pos, pos + np.maximum(value_len, 0)
    header_count, pos = _varints(data, pos, end)
    if (key_len < -1).any() or (value_len < -1).any() or (header_count < 0).any():
        raise CorruptRecordError(f"Kafka records of {topic}-{partition} with a negative key, value or header "
                                 "count other than -1 (null)")
    if (header_count > (end - pos) // 2).any():  # a header takes two bytes at least
        raise CorruptRecordError(f"Kafka records of {topic}-{partition} with more headers than bytes left")
    headers, pos = _headers(data, pos, end, header_count)
    if (pos != end).any():
        raise CorruptRecordError(f"Kafka records of {topic}-{partition} whose fields do not add up to their length")

    per_record = np.repeat(np.arange(len(batches)), counts)
    last_delta = np.array([b.last_offset_delta for b in batches], np.int64)[per_record]
    offsets = np.array([b.base_offset for b in batches], np.int64)[per_record] + offset_delta
    # The fetcher trims by offset, which needs them in order and inside their batches.
    if (offset_delta < 0).any() or (offset_delta > last_delta).any() or (np.diff(offsets) <= 0).any():
        raise CorruptRecordError(f"Kafka records of {topic}-{partition} whose offsets are outside their batch "
                                 "or do not increase")
    # A record's timestamp is its batch's first plus its delta; under LOG_APPEND_TIME, the batch's max timestamp.
    appended = np.array([b.timestamp_type for b in batches], bool)
    base_ts = np.array([b.max_timestamp if b.timestamp_type else b.first_timestamp for b in batches],
                       np.int64)[per_record]
    delta = np.where(appended[per_record], 0, ts_delta)
    # -1 means none. One outside Spark's range (or a sum that int64 would wrap: hence the floats) is kept as none
    # too, rather than failing the partition on every read; the record itself is kept.
    approx = base_ts.astype(np.float64) + delta
    known = (approx >= 0) & (approx < _END_MS)
    stamp = np.where(known, base_ts + delta, 0)
    return pa.RecordBatch.from_arrays([
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.array(offsets, pa.int64()),
        pa.array(stamp * 1000, ARROW_SCHEMA.field("timestamp").type, mask=None if known.all() else ~known),
        _binary(data, key_at, key_len),
        _binary(data, value_at, value_len),
        headers,
    ], schema=ARROW_SCHEMA)


def _walk(raw: bytes, sizes: list[int], counts: list[int]) -> np.ndarray:
    """Where each record starts: each starts with its length as a zigzag varint, so this is one pass in Python.
    Each batch's records must fill its section exactly."""
    starts: list[int] = []
    append = starts.append
    pos = 0
    for size, count in zip(sizes, counts, strict=True):
        if count < 0:
            raise CorruptRecordError(f"a Kafka batch that says it holds {count} records")
        stop = pos + size
        for _ in range(count):
            append(pos)
            v = raw[pos]
            if v < 0x80:  # lengths below 64 and below 8192 (nearly all) take one or two bytes
                pos += 1
            elif raw[pos + 1] < 0x80:
                v = (v & 0x7F) | raw[pos + 1] << 7
                pos += 2
            else:
                v, pos = _varint(raw, pos)
            if v & 1:
                raise CorruptRecordError("a Kafka record with a negative length")
            pos += v >> 1
            if pos > stop:
                raise CorruptRecordError("a Kafka record that runs past the end of its batch")
        if pos != stop:
            raise CorruptRecordError(f"{stop - pos} unconsumed bytes after all records of a Kafka batch")
    return np.array(starts, np.int64)


def _varint(raw: bytes, pos: int) -> tuple[int, int]:
    """The (not yet zigzag-decoded) varint at `pos` and the position after it."""
    value = shift = 0
    while True:
        byte = raw[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise CorruptRecordError("a Kafka varint of more than 10 bytes")


def _varints(data: np.ndarray, pos: np.ndarray, end: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The zigzag varints at `pos` (each must end before `end`): their values and the positions after them."""
    value = np.zeros(len(pos), np.uint64)
    after = pos.copy()
    todo = np.arange(len(pos))
    shift = np.uint64(0)
    while todo.size:
        if end is not None and (after[todo] >= end[todo]).any():
            raise CorruptRecordError("a Kafka record field that runs past the end of its record")
        byte = data[after[todo]]
        value[todo] |= (byte & 0x7F).astype(np.uint64) << shift
        after[todo] += 1
        todo = todo[byte >= 0x80]
        shift += np.uint64(7)
        if todo.size and shift > 63:
            raise CorruptRecordError("a Kafka varint of more than 10 bytes")
    return (value >> np.uint64(1)).astype(np.int64) ^ -(value & np.uint64(1)).astype(np.int64), after


def _binary(data: np.ndarray, at: np.ndarray, length: np.ndarray, kind: pa.DataType = _BINARY) -> pa.Array:
    """Values `data[at : at + length]` (length -1: null) as an Arrow array, gathered in one pass."""
    n = len(at)
    present = length >= 0
    size = np.where(present, length, 0)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(size, out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise CorruptRecordError("more than 2 GiB of keys or values in one Kafka fetch")
    body = data[:0]
    if offsets[-1]:
        # The values lie in `data` in order without overlapping: a mask of alternating runs (the gap before a
        # value, the value) picks them all out at once.
        runs = np.empty(2 * n + 1, np.int64)
        runs[0], runs[2:-1:2] = at[0], at[1:] - (at[:-1] + size[:-1])
        runs[1::2], runs[-1] = size, len(data) - (at[-1] + size[-1])
        body = data[np.repeat(np.arange(2 * n + 1) % 2 == 1, runs)]
    validity = None if present.all() else pa.array(present).buffers()[1]
    return pa.Array.from_buffers(kind, n, [validity, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(body)],
                                 null_count=int(n - present.sum()))


def _headers(data: np.ndarray, pos: np.ndarray, end: np.ndarray, count: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    """The records' headers (null for a record without: as Spark's Kafka source) and the positions after them."""
    n = len(pos)
    if not count.any():
        return pa.nulls(n, _HEADERS), pos
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(count, out=offsets[1:])
    total = int(offsets[-1])
    key_at, key_len = np.zeros(total, np.int64), np.zeros(total, np.int64)
    value_at, value_len = np.zeros(total, np.int64), np.zeros(total, np.int64)
    pos = pos.copy()
    for j in range(int(count.max())):
        rec = np.flatnonzero(count > j)
        slot = offsets[rec] + j
        klen, at = _varints(data, pos[rec], end[rec])
        if (klen < 0).any():
            raise CorruptRecordError("a Kafka header with a null key")
        key_at[slot], key_len[slot] = at, klen
        vlen, at = _varints(data, at + klen, end[rec])
        value_at[slot], value_len[slot] = at, vlen
        pos[rec] = at + np.maximum(vlen, 0)
    if (pos > end).any():
        raise CorruptRecordError("a Kafka header that runs past the end of its record")
    keys = _binary(data, key_at, key_len, pa.string())
    try:
        keys.validate(full=True)
    except pa.ArrowInvalid as e:
        raise CorruptRecordError(f"a Kafka header key that is not UTF-8: {e}") from e
    pairs = pa.StructArray.from_arrays([keys, _binary(data, value_at, value_len)], fields=list(_HEADER))
    mask = pa.array(count == 0)
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pairs, type=_HEADERS, mask=mask), pos


def rows_to_arrow(topic: str, partition: int, records: list[Any]) -> pa.RecordBatch:
    """Records decoded one by one (kafka-python's records of message format v0/v1) as ARROW_SCHEMA."""
    n = len(records)
    return pa.RecordBatch.from_arrays([
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.array([r.offset for r in records], pa.int64()),
        # Kafka timestamps are epoch milliseconds; -1 (or None) means the record has none (as one out of range).
        pa.array([r.timestamp * 1000 if r.timestamp is not None and 0 <= r.timestamp < _END_MS else None
                  for r in records], ARROW_SCHEMA.field("timestamp").type),
        pa.array([r.key for r in records], pa.binary()),
        pa.array([r.value for r in records], pa.binary()),
        pa.array([[{"key": k, "value": v} for k, v in r.headers] if r.headers else None for r in records],
                 _HEADERS),
    ], schema=ARROW_SCHEMA)
