"""The entity's Open Data Fabric metadata chain, derived from committed Delta history as the CDM manifest is.

After every commit (`refresh`), each changelog commit the chain does not hold yet becomes an `AddData` block:
its rows are the data slice (offsets `first..last`, contiguous with the previous slice), stored as
`data/<physical hash>`: the changelog's own Parquet file, hard-linked or copied server-side (a commit the writer
split into files of consecutive offsets is a slice, and a block, per file; other multi-file commits are joined
into one: daemon/odf/commits.py), with the slice's logical hash, the watermark and the source position the batch
committed (commit metadata `lakefeed.watermark`, `lakefeed.source_state`). Blocks before the first slice: `Seed`
(a `did:odf:` id from an ed25519 key made once per entity and kept in its state folder), the sources
(odf/sources.py), and `SetDataSchema` before the first slice and whenever the changelog's schema changes.

Idempotent by construction: a slice is identified by its offsets, and a block's content (system time included:
the slice's own `system_time`) depends only on the commit, so a crash between the Delta commit and the block
write is repaired by the next refresh, and a replayed batch (which commits nothing new) adds no block. Where the
commits cannot say which file each added (their log cleaned up, or their files compacted and vacuumed: a chain
rebuilt), the slices come from the changelog's files as they are (`_whole`)."""

from __future__ import annotations

import io
import json
import posixpath
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lakefeed import clock, failpoints, log
from lakefeed.batch.event_time import WATERMARK_KEY
from lakefeed.batch.positions import SOURCE_STATE_KEY
from lakefeed.config.model import EntityConfig
from lakefeed.connectors.sinks import delta_log
from lakefeed.inbox.storage import Storage
from lakefeed.odf import keys, multiformats, slices
from lakefeed.odf.blocks import (
    AddData,
    AddPushSource,
    DataSlice,
    Event,
    MetadataBlock,
    Seed,
    SetDataSchema,
    SetPollingSource,
    SourceState,
    block_hash,
    encode,
)
from lakefeed.odf.commits import Commit, pieces, read_commit, runs
from lakefeed.odf.decode import decode
from lakefeed.odf.logical_hash import logical_multihash
from lakefeed.odf.schema import data_schema
from lakefeed.odf.sources import source_events
from lakefeed.odf.store import DatasetStore

_locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)
_HASHER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="odf-physical-hash")
_log = log.get(__name__)


@dataclass
class ChainState:
    """What appending needs to know of the chain; kept beside the entity's state (`odf-head.json`) and rebuilt
    by walking the chain when that file does not name the current head."""

    head: bytes | None = None
    sequence: int = -1
    system_time: datetime | None = None
    last_offset: int | None = None
    watermark: datetime | None = None
    schema_block: bytes | None = None
    source_blocks: list[bytes] = field(default_factory=list)
    version: int = -1  # the changelog version the chain reaches (-1: find it from last_offset)


class OdfChain:
    """The entity's ODF dataset (`cfg.odf`), one writer per process."""

    def __init__(self, cfg: EntityConfig, storage: Storage) -> None:
        self.cfg = cfg
        self.store = DatasetStore(str(cfg.odf), storage)
        self._storage = storage
        self._schema: tuple | None = None  # the fields the chain's last SetDataSchema holds, once checked
        self._changelog_fs, self._changelog_root = storage.fs_of(str(cfg.changelog))
        self._sidecar = Path(cfg.state) / "odf-head.json"
        self._state: ChainState | None = None
        self._sources_checked = False
        self._stuck: int | None = None  # a changelog version the chain could not take (logged once)
        self._broken = False  # the chain on storage could not be read: left alone until a restart

    def refresh(self) -> int:
        """Append what the changelog committed since the last refresh; the number of blocks appended. A chain
        that cannot be read (a block altered or gone) is left as it is, logged once: ingestion goes on, and
        `lakefeed verify` says which block breaks it."""
        if self._broken:
            return 0
        try:
            return self._refresh()
        except (ValueError, FileNotFoundError) as exc:  # a block, or a changelog file it needs, unreadable
            self._broken = True
            _log.error("odf.chain_unreadable", entity=self.cfg.name, error=str(exc), odf=self.store.location,
                       hint="run lakefeed verify; the chain is not extended until it is repaired and the daemon "
                            "restarted (removing the odf folder and state/<entity>/odf-head.json rebuilds it)")
            return 0

    def _refresh(self) -> int:
        started = time.perf_counter()
        with _locks[self.store.location]:
            state = self._state or self._load()
            before = state.sequence
            if state.head is None:
                self._append(state, Seed(multiformats.dataset_id(keys.public_key(self.cfg.state))), clock.now())
            if not self._sources_checked:
                for event in source_events(self.cfg):
                    if not any(self._holds(h, event) for h in state.source_blocks):
                        self._append(state, event, clock.now())
                self._sources_checked = True
            commits = self._new_commits(state)
            for commit in commits:
                try:
                    if not all(self._add_slice(state, piece) for piece in pieces(commit)):
                        break
                except FileNotFoundError:  # its file compacted away and vacuumed (a chain rebuilt): the files
                    latest = delta_log.latest_version(self._changelog_fs, self._changelog_root, commit.version)
                    if all(self._add_slice(state, piece) for piece in self._whole(state, latest)):  # as they are
                        state.version = latest
                    break
                state.version = commit.version
            self._state = state
            if state.sequence != before:
                self._save(state)
                _log.info("odf.appended", entity=self.cfg.name, blocks=state.sequence - before,
                          last_offset=state.last_offset, seconds=round(time.perf_counter() - started, 3))
            return state.sequence - before

    def reached(self) -> int:
        """The changelog version up to which the chain holds every slice (-1: not known in this process yet)."""
        return self._state.version if self._state is not None else -1

    def check(self) -> list[str]:
        from lakefeed.odf.check import check_chain

        return check_chain(self.store, self.cfg)

    # -- appending ---------------------------------------------------------------------------------------------

    def _append(self, state: ChainState, event: Event, when: datetime) -> None:
        if state.system_time is not None and when < state.system_time:
            when = state.system_time  # system times never go back along the chain
        block = MetadataBlock(when, state.head, state.sequence + 1, event)
        data = encode(block)
        hash_ = block_hash(data)
        self.store.put_block(hash_, data)
        if isinstance(event, AddData):
            failpoints.reached("odf.block_written")  # a slice's block written, the head not moved to it
        self.store.set_head(hash_)
        state.head, state.sequence, state.system_time = hash_, block.sequence_number, when
        if isinstance(event, SetDataSchema):
            state.schema_block = hash_
        elif isinstance(event, SetPollingSource | AddPushSource):
            state.source_blocks.append(hash_)
        elif isinstance(event, AddData):
            if event.new_data is not None:
                state.last_offset = event.new_data.end
            state.watermark = event.new_watermark or state.watermark
        _log.debug("odf.block_appended", entity=self.cfg.name, sequence=block.sequence_number,
                   kind=type(event).__name__, block=multiformats.to_text(hash_))

    def _holds(self, hash_: bytes, event: Event) -> bool:
        """Whether block `hash_` carries `event` (the same block with this event has the same bytes)."""
        data = self.store.block(hash_)
        d = decode(data)
        return encode(MetadataBlock(d.system_time, d.prev_block_hash, d.sequence_number, event)) == data

    def _add_slice(self, state: ChainState, commit: Commit) -> bool:
        expected = 0 if state.last_offset is None else state.last_offset + 1
        if commit.last < expected:
            return True  # in the chain already (a replay, or a rewrite of old files)
        if commit.first != expected:
            if self._stuck != commit.version:
                _log.error("odf.offset_gap", entity=self.cfg.name, version=commit.version, first=commit.first,
                           expected=expected, hint="the changelog's offsets are not contiguous: run lakefeed verify")
            self._stuck = commit.version
            return False
        try:
            fields, logical, physical, size, written = self._facts(commit)
        except ValueError as exc:  # data ODF cannot describe or hash: the chain stops here, ingestion goes on
            if self._stuck != commit.version:
                _log.error("odf.slice_refused", entity=self.cfg.name, version=commit.version, error=str(exc),
                           hint="the changelog holds a type Open Data Fabric cannot hash; the chain stays at "
                                "the slice before (lakefeed verify reports it)")
            self._stuck = commit.version
            return False
        if fields != self._schema and (state.schema_block is None or
                                       not self._holds(state.schema_block, SetDataSchema(fields))):
            self._append(state, SetDataSchema(fields), clock.now())
        self._schema = fields
        watermark = clock.from_cdm(commit.meta[WATERMARK_KEY]) if commit.meta.get(WATERMARK_KEY) else None
        if state.watermark is not None and (watermark is None or watermark < state.watermark):
            watermark = state.watermark  # carried, never moved back
        event = AddData(prev_offset=state.last_offset,
                        new_data=DataSlice(logical, physical, commit.first, commit.last, size),
                        new_watermark=watermark, new_source_state=_source_state(commit.meta.get(SOURCE_STATE_KEY)))
        self._append(state, event, written or clock.now())
        return True

    def _facts(self, commit: Commit) -> tuple[tuple, bytes, bytes, int, datetime | None]:
        """(schema fields, logical hash, physical hash, size, latest system_time) of a slice, its data stored in the
        dataset: as the task that wrote its file described it (odf/slices.py), or read back and hashed here."""
        path = commit.files[0][3]
        known = slices.described(commit.meta, path.removeprefix(self._changelog_root.rstrip("/") + "/")) \
            if len(commit.files) == 1 else None
        if known is not None:
            self.store.link_data(known.physical, path)
            return data_schema(known.schema), known.logical, known.physical, known.size, known.written
        table, data, source = self._slice_of(commit)
        physical_of = _HASHER.submit(multiformats.sha3, data)  # beside the logical hash: SHA3 frees the GIL
        fields, logical = data_schema(table.schema), logical_multihash(table)
        physical = physical_of.result()
        if source is not None:
            self.store.link_data(physical, source)
        else:
            self.store.put_data(physical, data)
        return fields, logical, physical, len(data), pc.max(table.column("system_time")).as_py()

    def _slice_of(self, commit: Commit) -> tuple[pa.Table, bytes, str | None]:
        """The slice's rows and bytes, and the file they are (None: several files, joined into new bytes)."""
        contents = []
        for *_, path in commit.files:
            with self._changelog_fs.open_input_stream(path) as stream:
                contents.append(stream.read())
        tables = [pq.read_table(pa.BufferReader(c)) for c in contents]
        if len(tables) == 1 and commit.start is None:
            return tables[0], contents[0], commit.files[0][3]
        table = pa.concat_tables(tables, promote_options="default").sort_by("offset")
        if commit.start is not None:  # compacted files: the rows past the chain's last offset
            table = table.filter(pc.greater_equal(table.column("offset"), commit.start))
        sink = io.BytesIO()
        pq.write_table(table, sink)
        return table, sink.getvalue(), None

    # -- what is new ---------------------------------------------------------------------------------------------

    def _new_commits(self, state: ChainState) -> list[Commit]:
        fs, root = self._changelog_fs, self._changelog_root
        latest = delta_log.latest_version(fs, root, state.version)
        if latest is None or latest <= state.version:
            return []
        commits: list[Commit] = []
        version = latest
        try:
            while version > state.version:
                commit = read_commit(fs, root, version)
                if commit is not None:
                    if state.last_offset is not None and commit.last <= state.last_offset:
                        break
                    commits.append(commit)
                version -= 1
        except FileNotFoundError:  # the log was cleaned up: the files themselves, one slice per file
            return self._whole(state, latest)
        return commits[::-1]

    def _whole(self, state: ChainState, latest: int) -> list[Commit]:
        """The slices past the chain's last offset from the changelog's files at `latest`, when its commits cannot
        say which files each added: a slice a file where each file is one run of offsets after the one before (a
        batch's file as written); else one slice of them all, cut and joined (files compacted: runs of batches,
        packed by size, one maybe straddling the chain's last offset)."""
        from deltalake import DeltaTable

        table = DeltaTable(str(self.cfg.changelog), version=latest,
                           storage_options=self._storage.delta_options(str(self.cfg.changelog)))
        adds = pa.table(table.get_add_actions(flatten=True)).to_pylist()
        after = -1 if state.last_offset is None else state.last_offset
        files = sorted((a["min.offset"], a["max.offset"], a["num_records"],
                        posixpath.join(self._changelog_root, unquote(a["path"])))
                       for a in adds if a.get("min.offset") is not None and a["max.offset"] > after)
        if runs(tuple(files), after):
            return [Commit(latest, (f,), {}) for f in files]
        return [Commit(latest, tuple(files), {}, after + 1)] if files else []

    # -- the chain's state ---------------------------------------------------------------------------------------

    def _load(self) -> ChainState:
        head = self.store.head()
        if head is None:
            return ChainState()
        try:
            saved = json.loads(self._sidecar.read_text())
            if saved.get("head") == multiformats.to_text(head):
                return _from_json(saved)
        except (OSError, ValueError, KeyError):
            pass
        return self._walk(head)

    def _walk(self, head: bytes) -> ChainState:
        """The state from the chain itself, newest block first (after a crash, or without the state file)."""
        state, hash_, first = ChainState(head=head), head, True
        seen_data = seen_watermark = False
        while hash_ is not None:
            d = decode(self.store.block(hash_))
            if first:
                state.sequence, state.system_time, first = d.sequence_number, d.system_time, False
            if d.event_kind == "SetDataSchema" and state.schema_block is None:
                state.schema_block = hash_
            elif d.event_kind in ("SetPollingSource", "AddPushSource"):
                state.source_blocks.append(hash_)
            elif d.event_kind == "AddData":
                if not seen_data and (d.event.new_data is not None or d.event.prev_offset is not None):
                    state.last_offset = d.event.new_data.end if d.event.new_data else d.event.prev_offset
                    seen_data = True
                if not seen_watermark and d.event.new_watermark is not None:
                    state.watermark, seen_watermark = d.event.new_watermark, True
            hash_ = d.prev_block_hash
        _log.info("odf.chain_walked", entity=self.cfg.name, blocks=state.sequence + 1)
        return state

    def _save(self, state: ChainState) -> None:
        self._sidecar.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._sidecar.with_suffix(".tmp")
        tmp.write_text(json.dumps(_to_json(state)))
        tmp.replace(self._sidecar)


def _source_state(text: str | None) -> SourceState | None:
    if not text:
        return None
    value = json.loads(text)
    return SourceState(value["source"], value["kind"], value["value"])


def _parse_time(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def _to_json(state: ChainState) -> dict[str, Any]:
    text = multiformats.to_text
    return {"head": text(state.head) if state.head else None, "sequence": state.sequence,
            "system_time": state.system_time.isoformat() if state.system_time else None,
            "last_offset": state.last_offset, "watermark": state.watermark.isoformat() if state.watermark else None,
            "schema_block": text(state.schema_block) if state.schema_block else None,
            "source_blocks": [text(h) for h in state.source_blocks], "version": state.version}


def _from_json(saved: dict[str, Any]) -> ChainState:
    parse = multiformats.from_text
    return replace(ChainState(), head=parse(saved["head"]), sequence=saved["sequence"],
                   system_time=_parse_time(saved["system_time"]), last_offset=saved["last_offset"],
                   watermark=_parse_time(saved["watermark"]),
                   schema_block=parse(saved["schema_block"]) if saved["schema_block"] else None,
                   source_blocks=[parse(h) for h in saved["source_blocks"]], version=saved["version"])
