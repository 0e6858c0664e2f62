"""What a streaming query's checkpoint says of its batches: Spark's offsets log (`offsets/<batch id>`: a version
line, the batch's metadata, then one line per source with the offset it read to) and its commit log (`commits/`).
Spark writes a batch's entry before it runs the batch, and a batch run again after a restart reads the same
entry, so the range [end of the batch before, end of this one) is the batch's for good. The daemon's own sources
have one source a query, whose offsets are `{"offset": n}` (connectors/streams)."""

from __future__ import annotations

import json
from pathlib import Path

from lakefeed import log

_log = log.get(__name__)
_UNREAD: set[Path] = set()  # the checkpoints whose offsets log could not be read as the daemon reads it: said once


def _end(checkpoint: Path, batch_id: int) -> int:
    lines = (checkpoint / "offsets" / str(batch_id)).read_text(encoding="utf-8").splitlines()
    return int(json.loads(lines[2])["offset"])


def committed_offset(checkpoint: Path) -> int | None:
    """The end offset of the last batch a query committed, if any."""
    commits = [int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")] if checkpoint.exists() else []
    return _end(checkpoint, max(commits)) if commits else None


def batch_range(checkpoint: Path, batch_id: int) -> tuple[int, int] | None:
    """The inbox offsets [start, end) of a batch (the first starts at 0, the inbox source's initial offset); None if
    the log does not hold them as expected (an entry Spark purged, a checkpoint of another kind): ask the frame."""
    try:
        return (_end(checkpoint, batch_id - 1) if batch_id > 0 else 0), _end(checkpoint, batch_id)
    except (OSError, ValueError, IndexError, KeyError, TypeError) as exc:
        if checkpoint not in _UNREAD:
            _UNREAD.add(checkpoint)
            _log.warning("stream.offsets_unread", checkpoint=str(checkpoint), batch_id=batch_id, error=repr(exc),
                         action="each such batch's records are collected by a Spark job instead, which is slower; "
                                "Spark's default offsets log (spark.sql.streaming.offsetLog.formatVersion 1) is "
                                "the one lakefeed reads")
        return None
