"""Reading metadata blocks back from their FlatBuffers bytes: the header of every block and the events a chain
check needs (Seed, SetDataSchema's presence, AddData in full). Malformed bytes raise ValueError, never crash the
reader: `lakefeed verify` reports them against the block they break."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import flatbuffers.number_types as N
from flatbuffers.table import Table

from lakefeed.odf import multiformats
from lakefeed.odf.blocks import EVENTS, AddData, Checkpoint, DataSlice, Seed, SourceState


@dataclass(frozen=True)
class Decoded:
    system_time: datetime
    prev_block_hash: bytes | None
    sequence_number: int
    event_kind: str
    event: Any  # Seed or AddData decoded; other events: None


def decode(data: bytes) -> Decoded:
    try:
        return _decode(bytearray(data))
    except (IndexError, ValueError, OverflowError, TypeError, struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"not a metadata block: {exc}") from exc


def _decode(buf: bytearray) -> Decoded:
    manifest = _root(buf, 0)
    kind = _scalar(manifest, 0, N.Int64Flags, 0)
    version = _scalar(manifest, 1, N.Int32Flags, 0)
    if kind != multiformats.ODF_METADATA_BLOCK:
        raise ValueError(f"manifest kind {kind:#x} is not odf-metadata-block")
    if version not in (2, 3):
        raise ValueError(f"block version {version} is not supported (2 and 3 are)")
    content = _bytes(manifest, 2)
    if content is None:
        raise ValueError("the manifest has no content")
    block = _root(bytearray(content), 0)
    when = _timestamp(block, 0)
    if when is None:
        raise ValueError("the block has no system time")
    event_type = _scalar(block, 3, N.Uint8Flags, 0)
    if not 1 <= event_type <= len(EVENTS):
        raise ValueError(f"unknown event type {event_type}")
    name = EVENTS[event_type - 1]
    event_table = _table(block, 4)
    if event_table is None:
        raise ValueError("the block has no event")
    event = _add_data(event_table) if name == "AddData" else _seed(event_table) if name == "Seed" else None
    return Decoded(when, _bytes(block, 1), _scalar(block, 2, N.Uint64Flags, 0), name, event)


def _root(buf: bytearray, pos: int) -> Table:
    if len(buf) < 8:
        raise ValueError("too short")
    return Table(buf, pos + int.from_bytes(buf[pos:pos + 4], "little"))


def _field(t: Table, slot: int) -> int:
    return t.Offset(4 + 2 * slot)


def _scalar(t: Table, slot: int, flags: Any, default: Any) -> Any:
    o = _field(t, slot)
    return t.Get(flags, o + t.Pos) if o else default


def _optional(t: Table, slot: int, flags: Any) -> Any:
    o = _field(t, slot)
    return t.Get(flags, o + t.Pos) if o else None


def _bytes(t: Table, slot: int) -> bytes | None:
    o = _field(t, slot)
    if not o:
        return None
    start, length = t.Vector(o), t.VectorLen(o)
    if start + length > len(t.Bytes):
        raise ValueError("a vector runs past the end of the buffer")
    return bytes(t.Bytes[start:start + length])


def _string(t: Table, slot: int) -> str | None:
    o = _field(t, slot)
    return None if not o else t.String(o + t.Pos).decode()


def _table(t: Table, slot: int) -> Table | None:
    o = _field(t, slot)
    return None if not o else Table(t.Bytes, t.Indirect(o + t.Pos))


def _timestamp(t: Table, slot: int) -> datetime | None:
    o = _field(t, slot)
    if not o:
        return None
    pos = o + t.Pos
    year = t.Get(N.Int32Flags, pos)
    ordinal = t.Get(N.Uint16Flags, pos + 4)
    seconds = t.Get(N.Uint32Flags, pos + 8)
    nanos = t.Get(N.Uint32Flags, pos + 12)
    return datetime(year, 1, 1, tzinfo=UTC) + timedelta(days=ordinal - 1, seconds=seconds,
                                                        microseconds=nanos // 1000)


def _seed(t: Table) -> Seed:
    dataset_id = _bytes(t, 0)
    if dataset_id is None:
        raise ValueError("the Seed has no dataset id")
    return Seed(dataset_id, _scalar(t, 1, N.Int32Flags, 0))


def _add_data(t: Table) -> AddData:
    new_data = checkpoint = state = None
    if (s := _table(t, 2)) is not None:
        interval = _table(s, 2)
        if interval is None:
            raise ValueError("a data slice without its offset interval")
        new_data = DataSlice(_bytes(s, 0) or b"", _bytes(s, 1) or b"", _scalar(interval, 0, N.Uint64Flags, 0),
                             _scalar(interval, 1, N.Uint64Flags, 0), _scalar(s, 3, N.Uint64Flags, 0))
    if (c := _table(t, 3)) is not None:
        checkpoint = Checkpoint(_bytes(c, 0) or b"", _scalar(c, 1, N.Uint64Flags, 0))
    if (st := _table(t, 5)) is not None:
        state = SourceState(_string(st, 0) or "", _string(st, 1) or "", _string(st, 2) or "")
    return AddData(_bytes(t, 0), _optional(t, 1, N.Uint64Flags), new_data, checkpoint, _timestamp(t, 4), state)
