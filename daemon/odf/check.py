"""`lakefeed verify` for an entity's ODF chain: walked from `refs/head` to the Seed, every block's bytes must hash
to its name, sequence numbers must count down to 0 at the Seed, slices must cover the offsets without gap or
overlap, watermarks and system times must never go back, every data file must have its physical hash, size and
logical hash, and the slices together must be the changelog, row for row. Each problem names the block (its
sequence number and hash) where the chain breaks."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from lakefeed.config.model import EntityConfig
from lakefeed.odf import multiformats
from lakefeed.odf.blocks import block_hash
from lakefeed.odf.decode import Decoded, decode
from lakefeed.odf.logical_hash import logical_multihash
from lakefeed.odf.store import DatasetStore

_MAX_BLOCKS = 50_000_000  # a loop in the links (a forged block naming a later one) ends the walk


def check_chain(store: DatasetStore, cfg: EntityConfig, limit: int = 20) -> list[str]:
    problems: list[str] = []
    where = f"entity {cfg.name}: ODF chain at {store.location}"
    try:
        head = store.head()
    except ValueError as exc:
        return [f"{where}: refs/head is not a block hash ({exc})"]
    changelog = _changelog(store, cfg)
    if head is None:
        return [f"{where}: no chain (refs/head is missing) but the changelog has {changelog.num_rows} rows"] \
            if changelog is not None and changelog.num_rows else []
    blocks = _walk(store, head, where, problems)
    if problems:
        return problems[:limit]
    _check_links(blocks, where, problems)
    slices = _check_slices(store, blocks, where, problems, limit)
    if len(problems) < limit:
        _check_changelog(changelog, slices, where, problems)
    return problems[:limit]


def _name(seq: int, hash_: bytes) -> str:
    return f"block {seq} ({multiformats.to_text(hash_)})"


def _walk(store: DatasetStore, head: bytes, where: str, problems: list[str]) -> list[tuple[bytes, Decoded]]:
    """The blocks from the Seed to the head; a block that is missing, altered or unreadable ends the walk."""
    blocks: list[tuple[bytes, Decoded]] = []
    hash_: bytes | None = head
    named_by = "refs/head"
    seen: set[bytes] = set()
    while hash_ is not None:
        text = multiformats.to_text(hash_)
        if hash_ in seen or len(blocks) > _MAX_BLOCKS:
            problems.append(f"{where}: block {text} (named by {named_by}) closes a loop in the chain")
            break
        seen.add(hash_)
        try:
            data = store.block(hash_)
        except (FileNotFoundError, OSError):
            problems.append(f"{where}: block {text}, named by {named_by}, is missing")
            break
        if block_hash(data) != hash_:
            problems.append(f"{where}: block {text} (named by {named_by}) was altered: its bytes hash to "
                            f"{multiformats.to_text(block_hash(data))}")
            break
        try:
            decoded = decode(data)
        except ValueError as exc:
            problems.append(f"{where}: block {text} cannot be read: {exc}")
            break
        blocks.append((hash_, decoded))
        named_by = _name(decoded.sequence_number, hash_)
        hash_ = decoded.prev_block_hash
    return blocks[::-1]


def _check_links(blocks: list[tuple[bytes, Decoded]], where: str, problems: list[str]) -> None:
    first_hash, first = blocks[0]
    if first.event_kind != "Seed":
        problems.append(f"{where}: the chain starts with {first.event_kind} at "
                        f"{_name(first.sequence_number, first_hash)}, not a Seed")
    for i, (hash_, block) in enumerate(blocks):
        if block.sequence_number != i:
            problems.append(f"{where}: {_name(block.sequence_number, hash_)} is block {i} from the Seed: "
                            "sequence numbers must count 0, 1, 2, …")
        if i and block.system_time < blocks[i - 1][1].system_time:
            problems.append(f"{where}: {_name(i, hash_)}'s system time goes back")
        if i and block.event_kind == "Seed":
            problems.append(f"{where}: {_name(i, hash_)} is a second Seed")


def _check_slices(store: DatasetStore, blocks: list[tuple[bytes, Decoded]], where: str, problems: list[str],
                  limit: int) -> list[tuple[int, int, bytes, str, pa.Schema]]:
    """The slices (start, end, logical hash, block name) after checking each against its data file."""
    slices: list[tuple[int, int, bytes, str, pa.Schema]] = []
    last_offset: int | None = None
    watermark = None
    for i, (hash_, block) in enumerate(blocks):
        if block.event_kind != "AddData" or len(problems) >= limit:
            continue
        name, event = _name(i, hash_), block.event
        if event.prev_offset != last_offset:
            problems.append(f"{where}: {name} says the previous slice ended at offset {event.prev_offset}, "
                            f"but it ended at {last_offset}")
        if event.new_watermark is not None:
            if watermark is not None and event.new_watermark < watermark:
                problems.append(f"{where}: {name} moves the watermark back to {event.new_watermark.isoformat()}")
            watermark = event.new_watermark
        elif watermark is not None:
            problems.append(f"{where}: {name} drops the watermark (a block after one must carry it)")
        data = event.new_data
        if data is None:
            continue
        expected = 0 if last_offset is None else last_offset + 1
        if data.start != expected or data.end < data.start:
            problems.append(f"{where}: {name} holds offsets {data.start}..{data.end}; the next slice must start "
                            f"at {expected}")
        last_offset = data.end
        file = f"data/{multiformats.to_text(data.physical_hash)}"
        try:
            content = store.read_data(data.physical_hash)
        except (FileNotFoundError, OSError):
            problems.append(f"{where}: {name}'s data file {file} is missing")
            continue
        if multiformats.sha3(content) != data.physical_hash:
            problems.append(f"{where}: {name}'s data file {file} was altered (its physical hash differs)")
            continue
        if len(content) != data.size:
            problems.append(f"{where}: {name} gives {file} {data.size} bytes, it has {len(content)}")
        try:
            table = pq.read_table(pa.BufferReader(content))
        except (pa.ArrowException, OSError) as exc:
            problems.append(f"{where}: {name}'s data file {file} is not Parquet: {exc}")
            continue
        if logical_multihash(table) != data.logical_hash:
            problems.append(f"{where}: {name}'s data file {file} does not have the slice's logical hash")
        offsets = table.column("offset").to_numpy() if "offset" in table.column_names else np.zeros(0, np.int64)
        in_order = bool(len(offsets) < 2 or (np.diff(offsets) > 0).all())
        if not np.array_equal(offsets if in_order else np.sort(offsets), np.arange(data.start, data.end + 1)):
            problems.append(f"{where}: {name}'s data file {file} does not hold exactly offsets "
                            f"{data.start}..{data.end}")
            continue
        # a file delta-rs wrote from several record batches may hold its rows out of offset order
        ordered = data.logical_hash if in_order else logical_multihash(table.sort_by("offset"))
        slices.append((data.start, data.end, ordered, name, table.schema))
    return slices


def _check_changelog(changelog: pa.Table | None, slices: list[tuple[int, int, bytes, str, pa.Schema]], where: str,
                     problems: list[str]) -> None:
    rows = 0 if changelog is None else changelog.num_rows
    end = slices[-1][1] + 1 if slices else 0
    if rows != end:
        problems.append(f"{where}: the chain's slices hold offsets 0..{end - 1} (the last in "
                        f"{slices[-1][3] if slices else 'none'}), the changelog has {rows} rows")
        return
    if changelog is None:
        return
    ordered = changelog.sort_by("offset")
    for start, stop, logical, name, schema in slices:
        rows_of = ordered.slice(start, stop - start + 1)
        try:  # as the slice's file has them (the table may have grown columns since)
            rows_of = rows_of.select(schema.names).cast(schema)
        except (KeyError, pa.ArrowException) as exc:
            problems.append(f"{where}: {name}'s slice has columns the changelog's rows {start}..{stop} lack: {exc}")
            continue
        if logical_multihash(rows_of) != logical:
            problems.append(f"{where}: {name}'s slice differs from the changelog's rows {start}..{stop}")


def _changelog(store: DatasetStore, cfg: EntityConfig) -> pa.Table | None:
    try:
        table = DeltaTable(str(cfg.changelog), storage_options=store.storage.delta_options(str(cfg.changelog)))
    except TableNotFoundError:
        return None
    return table.to_pyarrow_table()

