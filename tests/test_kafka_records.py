"""Kafka records decoded a fetch at a time (connectors/sources/kafka_records.py) against kafka-python's own decoding,
record by record: the model. Fetches are built with kafka-python's record builders, as a broker sends them."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.consumer.fetcher import Fetcher
from kafka.errors import CorruptRecordError
from kafka.record.default_records import DefaultRecordBase
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder
from kafka.record.util import calc_crc32c
from kafka.structs import TopicPartition

from lakefeed.connectors.sources.kafka_records import ARROW_SCHEMA, ArrowPartitionRecords, rows_to_arrow

TP = TopicPartition("orders", 3)
GZIP = 1
_H = DefaultRecordBase


@dataclass(frozen=True)
class Batch:
    magic: int
    compression: int
    skip: int  # offsets left out before it (as compaction leaves them)
    records: list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]]
    log_append_time: bool = False
    control: bool = False


def fetch(batches: list[Batch], base: int = 0) -> tuple[bytes, list[int]]:
    """The bytes of a fetch response's records and each batch's base offset."""
    out, bases, offset = bytearray(), [], base
    for b in batches:
        offset += b.skip
        # As a broker stores them: v2 records carry offsets relative to their batch's base offset, and a compressed
        # v1 batch's inner messages relative offsets (0, 1, ...) under its wrapper's absolute one, that of its last
        # message. Both are patched in below; an uncompressed v1 message has its own absolute offset.
        relative = b.magic == 2 or b.compression != 0
        builder = MemoryRecordsBuilder(b.magic, b.compression, 1 << 30, offset=0 if relative else offset)
        for ts, key, value, headers in b.records:
            builder.append(ts, key, value, headers if b.magic == 2 else None)
        builder.close()
        raw = bytearray(builder.buffer())
        if relative:  # the offset field comes before the CRC and is not under it
            struct.pack_into(">q", raw, 0, offset if b.magic == 2 else offset + len(b.records) - 1)
        if b.magic == 2 and (b.log_append_time or b.control):
            attributes = struct.unpack_from(">h", raw, _H.ATTRIBUTES_OFFSET)[0]
            attributes |= (_H.TIMESTAMP_TYPE_MASK if b.log_append_time else 0) | (_H.CONTROL_MASK if b.control else 0)
            struct.pack_into(">h", raw, _H.ATTRIBUTES_OFFSET, attributes)
            _recrc(raw)
        bases.append(offset)
        out += raw
        offset += len(b.records)
    return bytes(out), bases


def _recrc(raw: bytearray) -> None:
    struct.pack_into(">I", raw, _H.CRC_OFFSET, calc_crc32c(bytes(raw[_H.ATTRIBUTES_OFFSET:])))


def kafka_python(raw: bytes, fetch_offset: int) -> tuple[pa.Table, int]:
    """The model: kafka-python's PartitionRecords, record by record, into the same Arrow columns."""
    part = Fetcher.PartitionRecords(fetch_offset, TP, MemoryRecords(raw), check_crcs=True)
    records = part.take(None)
    return pa.Table.from_batches([rows_to_arrow(TP.topic, TP.partition, records)]), part.next_fetch_offset


def lakefeed(raw: bytes, fetch_offset: int, until: int | None = None) -> tuple[pa.Table, int]:
    part = ArrowPartitionRecords(fetch_offset, TP, MemoryRecords(raw), check_crcs=True,
                                 until={TP: until} if until is not None else {})
    chunks = part.take(None)
    assert all(c.offset == c.batch.column(2)[0].as_py() for c in chunks)
    return pa.Table.from_batches([c.batch for c in chunks], schema=ARROW_SCHEMA), part.next_fetch_offset


blobs = st.one_of(st.none(), st.binary(max_size=40), st.binary(min_size=60, max_size=300), st.just(b"{}"))
headers = st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=20))), max_size=3)
stamps = st.one_of(st.integers(0, 2**41), st.just(1_700_000_000_000))


@st.composite
def batches(draw: st.DrawFn) -> Batch:
    magic = draw(st.sampled_from([2, 2, 2, 1]))
    records = draw(st.lists(st.tuples(stamps, blobs, blobs, headers), min_size=1, max_size=40))
    v2 = magic == 2
    return Batch(magic, draw(st.sampled_from([0, 0, GZIP])), draw(st.sampled_from([0, 0, 3])), records,
                 log_append_time=v2 and draw(st.booleans()), control=v2 and draw(st.integers(0, 9)) == 0)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(batches(), min_size=1, max_size=6), st.integers(0, 2**40), st.data())
def test_a_fetch_decodes_to_what_kafka_python_decodes_record_by_record(fetched, base, data):
    raw, bases = fetch(fetched, base)
    # A fetch answers from the start of the batch holding the fetch offset: anywhere in the first batch.
    fetch_offset = data.draw(st.integers(bases[0], bases[0] + len(fetched[0].records)), label="fetch_offset")
    model, model_next = kafka_python(raw, fetch_offset)
    table, next_offset = lakefeed(raw, fetch_offset)
    assert table.equals(model), (table.to_pylist()[:3], model.to_pylist()[:3])
    assert next_offset == model_next


@settings(max_examples=100, deadline=None)
@given(st.lists(batches(), min_size=2, max_size=5), st.data())
def test_batches_from_until_on_are_left_undecoded_and_the_position_stops_there(fetched, data):
    raw, bases = fetch(fetched)
    until = data.draw(st.integers(bases[0] + 1, bases[-1] + len(fetched[-1].records) + 1), label="until")
    model, _ = kafka_python(raw, 0)
    table, next_offset = lakefeed(raw, 0, until)
    # v2 batches from `until` on are left; a v0/v1 batch only says where it ends, so it is always decoded.
    done = [i == 0 or b.magic < 2 or start < until for i, (b, start) in enumerate(zip(fetched, bases, strict=True))]
    left = done.index(False) if False in done else len(fetched)
    assert table.num_rows == sum(len(b.records) for b in fetched[:left] if not b.control)
    assert table.equals(model.slice(0, table.num_rows))
    # Every offset before `until` is read; the position goes to the first batch not decoded, where the next
    # fetch starts.
    assert next_offset == (bases[left] if left < len(fetched) else model_end(fetched, bases))
    assert set(range(until)) & set(model.column("offset").to_pylist()) <= set(table.column("offset").to_pylist())


def model_end(fetched: list[Batch], bases: list[int]) -> int:
    return bases[-1] + len(fetched[-1].records)


def test_a_fetch_of_many_large_batches_is_one_chunk_per_run_of_v2_batches():
    fetched = [Batch(2, 0, 0, [(i, None, b'{"n": %d}' % i, [])] * 500) for i in range(3)]
    fetched.append(Batch(1, 0, 0, [(7, b"k", b"v", [])] * 10))
    fetched.append(Batch(2, GZIP, 0, [(9, b"k", b"v", [("h", b"x")])] * 10))
    raw, _ = fetch(fetched)
    part = ArrowPartitionRecords(0, TP, MemoryRecords(raw), check_crcs=True, until={})
    assert [c.batch.num_rows for c in part.take(None)] == [1500, 10, 10]


@pytest.mark.parametrize("where, what", [
    ("crc", "failed crc check"),
    ("length", "unconsumed bytes|runs past|negative length"),
    ("key_length", "negative key|do not add up|runs past"),
])
def test_corrupt_batches_raise_corrupt_record_error(where, what):
    raw = bytearray(fetch([Batch(2, 0, 0, [(5, b"key", b"value", [("h", b"v")])] * 3)])[0])
    records_at = _H.HEADER_STRUCT.size
    if where == "crc":
        raw[-1] ^= 0xFF
    elif where == "length":
        raw[records_at] += 2  # the first record's length one more (zigzag)
        _recrc(raw)
    else:
        raw[records_at + 4] = 0x05  # the first record's key length: -3
        _recrc(raw)
    with pytest.raises(CorruptRecordError, match=what):
        lakefeed(bytes(raw), 0)


def test_timestamps_beyond_sparks_range_are_none_and_the_records_kept():
    far = [(10**16, None, b"a", []), (2**62, None, b"b", []), (5, None, b"c", [])]
    for batch in (Batch(2, 0, 0, far), Batch(1, 0, 0, far)):
        table, _ = lakefeed(fetch([batch])[0], 0)
        assert table.column("value").to_pylist() == [b"a", b"b", b"c"]
        assert table.column("timestamp").to_pylist()[:2] == [None, None]
        assert table.column("timestamp")[2].value == 5000


@pytest.mark.parametrize("field, value, what", [
    ("records_count", -1, "holds -1 records"),
    ("header_count", 2**50, "more headers than bytes left"),
])
def test_absurd_counts_are_corrupt_records_not_allocations(field, value, what):
    from kafka.record.util import encode_varint
    if field == "records_count":
        raw = bytearray(fetch([Batch(2, 0, 0, [(5, None, b"", [])])])[0])
        raw = raw[:_H.HEADER_STRUCT.size]  # no records
        struct.pack_into(">i", raw, 8, len(raw) - 12)
        struct.pack_into(">i", raw, _H.HEADER_STRUCT.size - 4, value)
    else:
        body = bytearray([0, 0, 0, 1])  # attributes, timestamp delta, offset delta 0, key length -1 (zigzag 1)
        body += bytes([2]) + b"v"  # value length 1
        encode_varint(value, body.append)  # the header count
        record = bytearray()
        encode_varint(len(body), record.append)
        raw = bytearray(fetch([Batch(2, 0, 0, [(5, None, b"v", [])])])[0])[:_H.HEADER_STRUCT.size] + record + body
        struct.pack_into(">i", raw, 8, len(raw) - 12)
    _recrc(raw)
    with pytest.raises(CorruptRecordError, match=what):
        lakefeed(bytes(raw), 0)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 255))
def test_any_byte_changed_in_the_records_gives_records_or_corrupt_record_error(at, byte):
    """Whatever a byte becomes (CRC made to match), decoding never fails any other way, and what it returns
    is well-formed Arrow with one row per record the batch says it holds."""
    fetched = [Batch(2, 0, 0, [(5, b"key", b"value", [("h", b"v")]), (6, None, b"x" * 200, []),
                              (7, b"", None, [("a", None), ("b", b"")])])]
    raw = bytearray(fetch(fetched)[0])
    at = _H.HEADER_STRUCT.size + at % (len(raw) - _H.HEADER_STRUCT.size)
    raw[at] = byte
    _recrc(raw)
    try:
        table, _ = lakefeed(bytes(raw), 0)
    except CorruptRecordError:
        return
    table.validate(full=True)
    assert table.num_rows == 3
