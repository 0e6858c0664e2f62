"""A changelog commit as the ODF chain takes it: the files it added, each with its offsets, and its metadata; and
the slices it makes (docs/odf.md)."""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from lakefeed.batch.positions import SOURCE_STATE_KEY
from lakefeed.connectors.sinks import delta_log


@dataclass(frozen=True)
class Commit:
    version: int
    files: tuple[tuple[int, int, int, str], ...]  # (first offset, last offset, rows, path) in offset order
    meta: dict[str, Any]
    start: int | None = None  # the slice's first offset, where it cuts into its first file (compacted files)

    @property
    def first(self) -> int:
        return self.files[0][0] if self.start is None else self.start

    @property
    def last(self) -> int:
        return max(f[1] for f in self.files)


def read_commit(fs: Any, root: str, version: int) -> Commit | None:
    """A changelog commit's new files with their offsets (from the add actions' statistics), None without any."""
    with fs.open_input_stream(posixpath.join(root, delta_log.LOG, f"{version:020d}.json")) as stream:
        actions = [json.loads(line) for line in stream.read().decode().splitlines() if line.strip()]
    meta = delta_log.commit_metadata(next((a["commitInfo"] for a in actions if "commitInfo" in a), {}))
    files = []
    for add in (a["add"] for a in actions if "add" in a and a["add"].get("dataChange", True)):
        stats = json.loads(add.get("stats") or "{}")
        low, high = stats.get("minValues", {}).get("offset"), stats.get("maxValues", {}).get("offset")
        if low is None or high is None:
            continue  # no rows
        rows = int(stats.get("numRecords", -1))
        files.append((int(low), int(high), rows, posixpath.join(root, unquote(add["path"]))))
    return Commit(version, tuple(sorted(files)), meta) if files else None


def pieces(commit: Commit) -> list[Commit]:
    """The slices of a commit: each of its files when each holds a run of offsets that continues the one before
    (a large batch the writer split), so that every slice is a file as written; else the commit as one slice.
    The batch's source position goes on its last slice."""
    files = commit.files
    if len(files) == 1 or commit.start is not None or not runs(files):
        return [commit]
    before = {k: v for k, v in commit.meta.items() if k != SOURCE_STATE_KEY}
    return [Commit(commit.version, (f,), commit.meta if i == len(files) - 1 else before)
            for i, f in enumerate(files)]


def runs(files: tuple[tuple[int, int, int, str], ...], after: int = -1) -> bool:
    """Whether each file holds one run of offsets past `after` that continues the one before."""
    return all(first > after and rows == last - first + 1 for first, last, rows, _ in files) and \
        all(b[0] == a[1] + 1 for a, b in zip(files, files[1:], strict=False))
