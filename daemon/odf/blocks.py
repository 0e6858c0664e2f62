"""Metadata blocks of an Open Data Fabric chain and their canonical FlatBuffers bytes (seed 002, "Metadata Block
Hashing"), byte for byte as kamu's `FlatbuffersMetadataBlockSerializer` writes them (odf.fbs, kamu-cli
`src/odf/metadata`): every table is built depth first, its vectors, strings and sub-tables in the order of the
schema's fields, then its fields in that order; optional scalars (`= null`) are written whenever present, other
scalars only when they differ from their default. The block is then nested in a `Manifest` (kind
odf-metadata-block, version 3) and the manifest's bytes are what is hashed (SHA3-256) and stored as
`blocks/<multibase hash>`. tests/test_odf_blocks.py checks the bytes against kamu's own test vectors."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Union

import flatbuffers

from lakefeed.odf import multiformats

BLOCK_VERSION = 3  # kamu's MetadataBlockVersion::StructAlignment
EVENTS = ("AddData", "ExecuteTransform", "Seed", "SetPollingSource", "SetTransform", "SetVocab", "SetAttachments",
          "SetInfo", "SetLicense", "SetDataSchema", "AddPushSource", "DisablePushSource", "DisablePollingSource")
DATA_TYPES = ("Binary", "Bool", "Date", "Decimal", "Duration", "Float16", "Float32", "Float64", "Int8", "Int16",
              "Int32", "Int64", "UInt8", "UInt16", "UInt32", "UInt64", "List", "Map", "Null", "Option", "Struct",
              "Time", "Timestamp", "String")
READ_STEPS = ("Csv", "GeoJson", "EsriShapefile", "Parquet", "Json", "NdJson", "NdGeoJson")
MERGE_STRATEGIES = ("Append", "Ledger", "Snapshot", "ChangelogStream", "UpsertStream")
TIME_UNITS = ("s", "ms", "us", "ns")  # odf.fbs TimeUnit: Second, Millisecond, Microsecond, Nanosecond


@dataclass(frozen=True)
class DataType:
    """One of odf.fbs's DataType union (`kind` in DATA_TYPES) with its parameters: `unit` (a TIME_UNITS index),
    `timezone`, `precision`/`scale`, `fixed_length`, `inner` (Option), `item` (List), `fields` (Struct),
    `key`/`value`/`keys_sorted` (Map)."""

    kind: str
    params: tuple[tuple[str, Any], ...] = ()

    def get(self, name: str, default: Any = None) -> Any:
        return dict(self.params).get(name, default)


@dataclass(frozen=True)
class DataField:
    name: str
    type: DataType
    extra: dict[str, Any] | None = None  # ExtraAttributes (e.g. Arrow's buffer encoding), as JSON


@dataclass(frozen=True)
class Seed:
    dataset_id: bytes
    dataset_kind: int = 0  # Root


@dataclass(frozen=True)
class SetDataSchema:
    fields: tuple[DataField, ...]
    extra: dict[str, Any] | None = None  # the schema's ExtraAttributes


@dataclass(frozen=True)
class ReadStep:
    """`kind` in READ_STEPS; `options` are the step's string or bool fields by their odf.fbs names."""

    kind: str
    options: tuple[tuple[str, Any], ...] = ()
    schema: tuple[DataField, ...] | None = None


@dataclass(frozen=True)
class MergeStrategy:
    kind: str  # in MERGE_STRATEGIES
    primary_key: tuple[str, ...] = ()
    compare_columns: tuple[str, ...] | None = None


@dataclass(frozen=True)
class AddPushSource:
    source_name: str
    read: ReadStep
    merge: MergeStrategy


@dataclass(frozen=True)
class SetPollingSource:
    """A files-glob fetch (lakefeed's landing folders), its event time from the file's metadata."""

    path: str
    read: ReadStep
    merge: MergeStrategy


@dataclass(frozen=True)
class SetVocab:
    offset_column: str | None = None
    operation_type_column: str | None = None
    system_time_column: str | None = None
    event_time_column: str | None = None


@dataclass(frozen=True)
class DataSlice:
    logical_hash: bytes
    physical_hash: bytes
    start: int
    end: int
    size: int


@dataclass(frozen=True)
class Checkpoint:
    physical_hash: bytes
    size: int


@dataclass(frozen=True)
class SourceState:
    source_name: str
    kind: str
    value: str


@dataclass(frozen=True)
class AddData:
    prev_checkpoint: bytes | None = None
    prev_offset: int | None = None
    new_data: DataSlice | None = None
    new_checkpoint: Checkpoint | None = None
    new_watermark: datetime | None = None
    new_source_state: SourceState | None = None


Event = Union[Seed, SetDataSchema, AddPushSource, SetPollingSource, SetVocab, AddData]  # noqa: UP007


@dataclass(frozen=True)
class MetadataBlock:
    system_time: datetime
    prev_block_hash: bytes | None
    sequence_number: int
    event: Event


def encode(block: MetadataBlock) -> bytes:
    """The block's canonical bytes: the block's flatbuffer nested in a Manifest."""
    inner = flatbuffers.Builder(1024)
    inner.Finish(_block(inner, block))
    content = bytes(inner.Output())
    outer = flatbuffers.Builder(len(content) + 64)
    content_off = outer.CreateByteVector(content)
    outer.Finish(_table(outer, 3, [(0, "i64", multiformats.ODF_METADATA_BLOCK), (1, "i32", BLOCK_VERSION),
                                   (2, "off", content_off)]))
    return bytes(outer.Output())


def block_hash(data: bytes) -> bytes:
    """The block's multihash: SHA3-256 over its canonical bytes."""
    return multiformats.sha3(data)


def _table(b: flatbuffers.Builder, slots: int, fields: list[tuple[int, str, Any]]) -> int:
    """A table with `fields` (slot, kind, value) added in the given order; None is absent. Kinds: `off` (an
    offset), `ts` (an inline Timestamp), scalars with their default 0 (`u8`, `i32`, `u32`, `i64`, `u64`: left out
    when 0) and optional scalars (`u64?`, `i16?`, `bool?`: written whenever present)."""
    b.StartObject(slots)
    for slot, kind, value in fields:
        if value is None:
            continue
        if kind == "off":
            b.PrependUOffsetTRelativeSlot(slot, value, 0)
        elif kind == "ts":
            b.PrependStructSlot(slot, _timestamp(b, value), 0)
        else:
            default = None if kind.endswith("?") else 0
            prepend = {"u8": b.PrependUint8Slot, "i16": b.PrependInt16Slot, "i32": b.PrependInt32Slot,
                       "u32": b.PrependUint32Slot, "i64": b.PrependInt64Slot, "u64": b.PrependUint64Slot,
                       "bool": b.PrependBoolSlot}[kind.rstrip("?")]
            prepend(slot, value, default)
    return b.EndObject()


def _timestamp(b: flatbuffers.Builder, when: datetime) -> int:
    """odf.fbs `struct Timestamp {year: int32; ordinal: uint16; seconds_from_midnight: uint32; nanoseconds:
    uint32}`, inline (16 bytes, 4-aligned, 2 bytes of padding after the ordinal)."""
    when = when.astimezone(UTC)
    b.Prep(4, 16)
    b.PrependUint32(when.microsecond * 1000)
    b.PrependUint32(when.hour * 3600 + when.minute * 60 + when.second)
    b.Pad(2)
    b.PrependUint16(when.timetuple().tm_yday)
    b.PrependInt32(when.year)
    return b.Offset()


def _string(b: flatbuffers.Builder, value: str | None) -> int | None:
    return None if value is None else b.CreateString(value)


def _bytes(b: flatbuffers.Builder, value: bytes | None) -> int | None:
    return None if value is None else b.CreateByteVector(value)


def _offsets(b: flatbuffers.Builder, offsets: list[int]) -> int:
    b.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()


def _strings(b: flatbuffers.Builder, values: tuple[str, ...] | None) -> int | None:
    return None if values is None else _offsets(b, [b.CreateString(v) for v in values])


def _block(b: flatbuffers.Builder, block: MetadataBlock) -> int:
    prev = _bytes(b, block.prev_block_hash)
    kind, event = _event(b, block.event)
    return _table(b, 5, [(0, "ts", block.system_time), (1, "off", prev), (2, "u64", block.sequence_number),
                         (3, "u8", kind), (4, "off", event)])


def _event(b: flatbuffers.Builder, event: Event) -> tuple[int, int]:
    name = type(event).__name__
    writer = {"Seed": _seed, "SetDataSchema": _set_data_schema, "AddPushSource": _add_push_source,
              "SetPollingSource": _set_polling_source, "SetVocab": _set_vocab, "AddData": _add_data}[name]
    return EVENTS.index(name) + 1, writer(b, event)


def _seed(b: flatbuffers.Builder, e: Seed) -> int:
    dataset_id = b.CreateByteVector(e.dataset_id)
    return _table(b, 2, [(0, "off", dataset_id), (1, "i32", e.dataset_kind)])


def _set_vocab(b: flatbuffers.Builder, e: SetVocab) -> int:
    names = [_string(b, v) for v in (e.offset_column, e.operation_type_column, e.system_time_column,
                                     e.event_time_column)]
    return _table(b, 4, [(i, "off", off) for i, off in enumerate(names)])


def _add_data(b: flatbuffers.Builder, e: AddData) -> int:
    prev_checkpoint = _bytes(b, e.prev_checkpoint)
    new_data = None if e.new_data is None else _data_slice(b, e.new_data)
    new_checkpoint = None
    if e.new_checkpoint is not None:
        physical = b.CreateByteVector(e.new_checkpoint.physical_hash)
        new_checkpoint = _table(b, 2, [(0, "off", physical), (1, "u64", e.new_checkpoint.size)])
    state = None
    if e.new_source_state is not None:
        parts = [b.CreateString(v) for v in (e.new_source_state.source_name, e.new_source_state.kind,
                                             e.new_source_state.value)]
        state = _table(b, 3, [(i, "off", off) for i, off in enumerate(parts)])
    return _table(b, 7, [(0, "off", prev_checkpoint), (1, "u64?", e.prev_offset), (2, "off", new_data),
                         (3, "off", new_checkpoint), (4, "ts", e.new_watermark), (5, "off", state)])


def _data_slice(b: flatbuffers.Builder, s: DataSlice) -> int:
    logical = b.CreateByteVector(s.logical_hash)
    physical = b.CreateByteVector(s.physical_hash)
    interval = _table(b, 2, [(0, "u64", s.start), (1, "u64", s.end)])
    return _table(b, 4, [(0, "off", logical), (1, "off", physical), (2, "off", interval), (3, "u64", s.size)])


def _set_data_schema(b: flatbuffers.Builder, e: SetDataSchema) -> int:
    schema = _schema(b, e.fields, e.extra)
    return _table(b, 2, [(1, "off", schema)])


def _schema(b: flatbuffers.Builder, fields: tuple[DataField, ...], extra: dict[str, Any] | None = None) -> int:
    vector = _offsets(b, [_field(b, f) for f in fields])
    return _table(b, 2, [(0, "off", vector), (1, "off", None if not extra else _extra(b, extra))])


def _field(b: flatbuffers.Builder, f: DataField) -> int:
    name = b.CreateString(f.name)
    kind, typ = _data_type(b, f.type)
    extra = None if not f.extra else _extra(b, f.extra)
    return _table(b, 4, [(0, "off", name), (1, "u8", kind), (2, "off", typ), (3, "off", extra)])


def _extra(b: flatbuffers.Builder, entries: dict[str, Any]) -> int:
    """ExtraAttributes: the entries as compact JSON with sorted keys, as serde_json writes kamu's map."""
    text = b.CreateString(json.dumps(entries, separators=(",", ":"), sort_keys=True))
    return _table(b, 1, [(0, "off", text)])


def _data_type(b: flatbuffers.Builder, t: DataType) -> tuple[int, int]:
    kind = DATA_TYPES.index(t.kind) + 1
    if t.kind == "Timestamp":
        tz = _string(b, t.get("timezone"))
        return kind, _table(b, 2, [(0, "i16?", t.get("unit")), (1, "off", tz)])
    if t.kind in ("Time", "Duration"):
        return kind, _table(b, 1, [(0, "i16?", t.get("unit"))])
    if t.kind == "Decimal":
        return kind, _table(b, 2, [(0, "u32", t.get("precision")), (1, "i32", t.get("scale"))])
    if t.kind == "Binary":
        return kind, _table(b, 1, [(0, "u64?", t.get("fixed_length"))])
    if t.kind == "Option":
        inner_kind, inner = _data_type(b, t.get("inner"))
        return kind, _table(b, 2, [(0, "u8", inner_kind), (1, "off", inner)])
    if t.kind == "List":
        item_kind, item = _data_type(b, t.get("item"))
        return kind, _table(b, 3, [(0, "u8", item_kind), (1, "off", item), (2, "u64?", t.get("fixed_length"))])
    if t.kind == "Struct":
        vector = _offsets(b, [_field(b, f) for f in t.get("fields")])
        return kind, _table(b, 1, [(0, "off", vector)])
    if t.kind == "Map":
        key_kind, key = _data_type(b, t.get("key"))
        value_kind, value = _data_type(b, t.get("value"))
        return kind, _table(b, 5, [(0, "u8", key_kind), (1, "off", key), (2, "u8", value_kind), (3, "off", value),
                                   (4, "bool?", t.get("keys_sorted"))])
    return kind, _table(b, 0, [])


_READ_FIELDS = {  # odf.fbs field order of each read step, and the kind of each field
    "Csv": (("ddl_schema", "strings"), ("separator", "str"), ("encoding", "str"), ("quote", "str"),
            ("escape", "str"), ("header", "bool?"), ("infer_schema", "bool?"), ("null_value", "str"),
            ("date_format", "str"), ("timestamp_format", "str"), ("schema", "schema")),
    "Json": (("sub_path", "str"), ("ddl_schema", "strings"), ("date_format", "str"), ("encoding", "str"),
             ("timestamp_format", "str"), ("schema", "schema")),
    "NdJson": (("ddl_schema", "strings"), ("date_format", "str"), ("encoding", "str"), ("timestamp_format", "str"),
               ("schema", "schema")),
    "Parquet": (("ddl_schema", "strings"), ("schema", "schema")),
}


def _read_step(b: flatbuffers.Builder, r: ReadStep) -> tuple[int, int]:
    options = dict(r.options)
    fields: list[tuple[int, str, Any]] = []
    for slot, (name, kind) in enumerate(_READ_FIELDS[r.kind]):
        if kind == "str":
            fields.append((slot, "off", _string(b, options.get(name))))
        elif kind == "strings":
            fields.append((slot, "off", _strings(b, options.get(name))))
        elif kind == "schema":
            fields.append((slot, "off", None if r.schema is None else _schema(b, r.schema)))
        else:
            fields.append((slot, kind, options.get(name)))
    return READ_STEPS.index(r.kind) + 1, _table(b, len(fields), fields)


def _merge(b: flatbuffers.Builder, m: MergeStrategy) -> tuple[int, int]:
    kind = MERGE_STRATEGIES.index(m.kind) + 1
    if m.kind == "Append":
        return kind, _table(b, 0, [])
    key = _strings(b, m.primary_key)
    if m.kind == "Snapshot":
        return kind, _table(b, 2, [(0, "off", key), (1, "off", _strings(b, m.compare_columns))])
    return kind, _table(b, 1, [(0, "off", key)])


def _add_push_source(b: flatbuffers.Builder, e: AddPushSource) -> int:
    name = b.CreateString(e.source_name)
    read_kind, read = _read_step(b, e.read)
    merge_kind, merge = _merge(b, e.merge)
    return _table(b, 7, [(0, "off", name), (1, "u8", read_kind), (2, "off", read), (5, "u8", merge_kind),
                         (6, "off", merge)])


def _set_polling_source(b: flatbuffers.Builder, e: SetPollingSource) -> int:
    path = b.CreateString(e.path)
    event_time = _table(b, 0, [])  # EventTimeSourceFromMetadata: the file's time
    fetch = _table(b, 6, [(0, "off", path), (1, "u8", 1), (2, "off", event_time)])
    read_kind, read = _read_step(b, e.read)
    merge_kind, merge = _merge(b, e.merge)
    return _table(b, 9, [(0, "u8", 2), (1, "off", fetch), (3, "u8", read_kind), (4, "off", read),
                         (7, "u8", merge_kind), (8, "off", merge)])
