"""A Delta table's data files and their changes, read from its log commit by commit: O(new commits), not
O(files), for the manifests that list the files (MSC, Kartothek)."""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable

LOG = "_delta_log"
_OWN = "lakefeed."  # the prefix of lakefeed's keys in a commit's metadata


def commit_metadata(info: dict[str, Any]) -> dict[str, Any]:
    """A commit's `commitInfo` with lakefeed's keys at its top: delta-rs writes them there; delta-spark can only
    write them as `userMetadata`, a JSON object (connectors/sinks/delta_spark.py)."""
    user = info.get("userMetadata")
    if not isinstance(user, str) or _OWN not in user:
        return info
    try:
        own = json.loads(user)
    except ValueError:
        return info  # someone else's userMetadata
    if not isinstance(own, dict):
        return info
    return {**info, **{k: v for k, v in own.items() if k.startswith(_OWN)}}


@dataclass
class FileChanges:
    """Files added and removed after a version, up to `latest`; keys are paths relative to the table's root as
    they are on storage (the log escapes them once more). `whole`: the log no longer reaches back that far (or
    nothing was known), so `added` is every file of `latest` and what is not in it is gone."""

    latest: int
    added: dict[str, str] = field(default_factory=dict)  # key -> its path on the file system
    removed: set[str] = field(default_factory=set)
    whole: bool = False


def latest_version(fs: pafs.FileSystem, root: str, after: int = -1) -> int | None:
    """The table's latest version: the commits after `after` probed one by one; the log listed only when nothing
    is known yet. None: no table."""
    if after < 0:
        infos = fs.get_file_info(pafs.FileSelector(posixpath.join(root, LOG), allow_not_found=True))
        names = [i.base_name.removesuffix(".json") for i in infos if i.base_name.endswith(".json")]
        versions = [int(n) for n in names if n.isdigit()]
        return max(versions) if versions else None
    version = after
    while fs.get_file_info(posixpath.join(root, LOG, f"{version + 1:020d}.json")).type == pafs.FileType.File:
        version += 1
    return version


def changes_after(fs: pafs.FileSystem, root: str, after: int, storage_options: dict[str, str] | None,
                  location: str) -> FileChanges | None:
    """What changed after version `after` (-1: everything); None when nothing did."""
    latest = latest_version(fs, root, after)
    if latest is None or latest <= after:
        return None
    changes = FileChanges(latest)
    if after < 0:
        return _whole(changes, fs, root, storage_options, location)
    try:
        for version in range(after + 1, latest + 1):
            with fs.open_input_stream(posixpath.join(root, LOG, f"{version:020d}.json")) as stream:
                lines = stream.read().decode().splitlines()
            for action in (json.loads(line) for line in lines if line.strip()):
                if "add" in action:
                    key = unquote(action["add"]["path"])
                    changes.added[key] = posixpath.join(root, key)
                    changes.removed.discard(key)
                elif "remove" in action:
                    key = unquote(action["remove"]["path"])
                    changes.removed.add(key)
                    changes.added.pop(key, None)
    except FileNotFoundError:  # the log was cleaned up past `after`
        return _whole(FileChanges(latest), fs, root, storage_options, location)
    return changes


def _whole(changes: FileChanges, fs: pafs.FileSystem, root: str, storage_options: dict[str, str] | None,
           location: str) -> FileChanges:
    table = DeltaTable(location, version=changes.latest, storage_options=storage_options)
    changes.added = {key: posixpath.join(root, key) for key in table_files(table)}
    changes.whole = True
    return changes


def table_files(table: DeltaTable) -> list[str]:
    """The data files of the table's version, as keys relative to its root."""
    return [unquote(p) for p in pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()]
