"""What a streaming query's checkpoint says of its batches: Spark's offsets log (`offsets/<batch id>`: a version
line, the batch's metadata, then one line per source with the offset it read to) and its commit log (`commits/`).
Spark writes a batch's entry before it runs the batch, and a batch run again after a restart reads the same
entry, so the range [end of the batch before, end of this one) is the batch's for good. The daemon's own sources
have one source a query, whose offsets are `{"offset": n}` (connectors/streams)."""

from __future__ import annotations

import json
from pathlib import Path


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
    except (OSError, ValueError, IndexError, KeyError, TypeError):
        return None
