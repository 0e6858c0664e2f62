"""One landed file's rows, as a batch takes them: read, conformed, given partition arguments, provenance, change
kind and event time. Pure row work: it runs wherever the file is read (a Spark task on an executor, or the driver)."""

from __future__ import annotations

import posixpath
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from lakefeed import failpoints
from lakefeed.batch import cdc, event_time
from lakefeed.batch.derived import derives, read_derived
from lakefeed.batch.discovery import Partition, argument_clash
from lakefeed.batch.landed import Landed, Superseded, Unreadable, read_landed
from lakefeed.batch.provenance import file_schema, with_arguments
from lakefeed.batch.read import BadRow, FileRead, conform
from lakefeed.config.model import EntityConfig
from lakefeed.config.sources import LocalDirSource
from lakefeed.connectors.sources.s3_events import not_a_file
from lakefeed.inbox import storage
from lakefeed.inbox.files import InboxRecord
from lakefeed.inbox.storage import Storage

Rows = tuple[str, pa.Table | None, list[BadRow]]  # (partition location, rows, bad rows)


def read_file(cfg: EntityConfig, store: Storage, rec: InboxRecord, partition: Partition, target: pa.Schema | None,
              checked_at: datetime, log_: Any) -> Rows | None:
    """(location, rows with partition columns, provenance, change kind and event time, bad rows),
    or None when the file is not there to read (or has a newer version, with its own inbox record)."""
    if rec.problem:  # the source saw it cannot be taken (a link, a FIFO, a name that is not UTF-8…)
        return partition.location, None, [BadRow(None, rec.problem, "")]
    failpoints.reached("stage.file", rec.path)
    local = not storage.is_s3(rec.path)
    path = Path(rec.path) if local else cfg.state / "staging" / staged_name(rec.offset, rec.path)
    file_target = file_schema(target, partition.arguments)
    source = cfg.source
    follow = local and isinstance(source, LocalDirSource) and source.follow_symlinks
    try:
        if not local:  # read from a local copy, made once
            _copy(store, rec, path)
        with Landed(path, source.path if isinstance(source, LocalDirSource) else path.parent, follow) as landed:
            if local and landed.identity() != (rec.size, rec.mtime_ns):
                raise Superseded("rewritten since it was enqueued")
            fmt, wanted = cfg.format, None if cfg.cdc.debezium else file_target
            read = read_derived(landed, fmt, wanted, cfg.limits) if derives(fmt) else \
                read_landed(landed, fmt, wanted, cfg.limits)
    except FileNotFoundError:
        log_.warning("file.vanished", file=rec.path, reason="deleted before it was read; skipped")
        return None
    except Superseded as exc:  # its new version has its own, later inbox record
        log_.info("file.superseded", file=rec.path, reason=str(exc))
        return None
    except Unreadable as exc:
        read = FileRead(None, [BadRow(None, str(exc), "")])
    finally:
        if not local:
            path.unlink(missing_ok=True)
    if cfg.cdc.debezium and read.table is not None:
        unwrapped = conform(cdc.unwrap_debezium(read.table), file_target)
        read = FileRead(unwrapped.table, [*read.bad, *unwrapped.bad])
    location = partition.location
    if read.table is None:
        return location, None, read.bad
    clash = argument_clash(partition, read.table.column_names)
    if clash is not None:
        return location, None, [*read.bad, BadRow(None, clash, f"{read.table.num_rows} rows not applied")]
    table = with_arguments(read.table, partition, location)
    if cfg.cdc.keyed:
        table = cdc.tag(table, cdc.file_kind(cfg.cdc, partition.incremental_type), rec.offset)
    elif partition.incremental_type not in (None, "Insert"):
        reason = (f"a {partition.incremental_type} partition needs a keyed entity: set cdc.strategy and "
                  "cdc.primary_key to apply it")
        return location, None, [*read.bad, BadRow(None, reason, f"{table.num_rows} rows not applied")]
    table, bad_times = event_time.stamp(table, cfg.event_time, location, rec.mtime_ns, checked_at)
    return location, table, [*read.bad, *bad_times]


def staged_name(offset: int, url: str) -> str:
    """The local copy's name: unique by inbox offset, with a bounded, safe part of the key's name for whoever looks
    in the folder (a local name takes 255 bytes, a key's up to 1,024) and its extension."""
    stem, ext = posixpath.splitext(re.sub(r"[^A-Za-z0-9._=-]", "_", posixpath.basename(url)))
    return f"{offset}-{stem[:80]}{ext[:16]}"


def _copy(store: Storage, rec: InboxRecord, path: Path) -> None:
    """Copy the object's version that `rec` names to `path`. FileNotFoundError: it is gone; Superseded: a newer
    version replaced it (read from its own inbox record); Unreadable: it cannot be read as a file, or the store
    refuses this object alone (archived, SSE-C, denied to it): quarantined, so it holds up nothing behind it.
    OSError: the store fails (retried)."""
    if problem := not_a_file(storage.split(rec.path)[1]):  # inbox records from before listings checked keys
        raise Unreadable(f"{problem}; rename the object to take it")
    try:
        found = store.fetch(rec.path, path, rec.etag)
    except storage.Replaced as exc:
        raise Superseded(str(exc)) from exc
    except storage.NotAFile as exc:
        raise Unreadable(str(exc)) from exc
    if found is None:
        raise FileNotFoundError(rec.path)
    if (found.size, found.mtime_ns) != (rec.size, rec.mtime_ns) or (rec.etag and found.etag != rec.etag):
        raise Superseded("rewritten since it was enqueued")
