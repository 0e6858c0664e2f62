"""multi-storage-client (MSC) manifests of a folder, kept current in O(changes) (seed 004, docs/manifests.md).

Layout under `<folder>/<path>` (path `.msc_manifests` by default), as MSC's ManifestMetadataProvider reads it:

    <version>/msc_manifest_index.json   {"version": "1", "format": "jsonl",
                                         "parts": [{"path": "/<path>/.parts/msc_manifest_part000007.jsonl"}, …],
                                         "lakefeed": {"applied": …}}   (MSC ignores keys it does not know)
    .parts/msc_manifest_partNNNNNN.jsonl {"key": …, "size_bytes": …, "last_modified": "…Z"} per line

MSC takes the lexicographically last version folder, so version names are UTC times to the microsecond with one
suffix (`2026-11-23T17:19:57.123456Z`), each later than the last. A part's path starts with `/`: MSC takes it as
relative to the profile's base path (the folder), on a local disk and on S3 alike (it resolves no `../` on S3).
A version is visible only when complete: on a local disk it is written under a dot-name (which MSC's glob skips)
and renamed; on S3 its index is the last object written. Parts are immutable and shared by the versions that list
them, so a version costs the changed objects: one new part for what was added, and a rewrite of each part that
listed a removed or changed object. Every `compact_every` versions the listing is written again in full parts.
Only `retain_versions` versions are kept, and parts that no kept version lists are removed (a crash between parts
and index leaves such orphans).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pyarrow.fs as pafs

from lakefeed import failpoints, log
from lakefeed.config.manifests import MscManifest

INDEX = "msc_manifest_index.json"
STATE = "lakefeed"  # the index's key for how far the version applied
PARTS = ".parts"  # a dot-name: never taken for a version
_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"
_log = log.get(__name__)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Obj:
    """An object as a manifest lists it: its size, and its modification time to the microsecond."""

    size: int
    modified_us: int

    @classmethod
    def of(cls, size: int, modified_ns: int) -> Obj:
        return cls(int(size), int(modified_ns) // 1000)

    def line(self, key: str) -> str:
        when = (_EPOCH + timedelta(microseconds=self.modified_us)).strftime(_TIME)
        return json.dumps({"key": key, "size_bytes": self.size, "last_modified": when})


def parse_line(line: str) -> tuple[str, Obj]:
    """(key, object) of a part's line."""
    row = json.loads(line)
    when = datetime.strptime(row["last_modified"], _TIME).replace(tzinfo=UTC)
    return row["key"], Obj(int(row["size_bytes"]), (when - _EPOCH) // timedelta(microseconds=1))


class MscWriter:
    """The MSC manifest of one folder (`root`, a path on `fs`), written by one process at a time."""

    def __init__(self, fs: pafs.FileSystem, root: str, cfg: MscManifest) -> None:
        self.fs, self.cfg = fs, cfg
        self.root = root.rstrip("/")
        self.base = posixpath.join(self.root, cfg.path)
        self._local = isinstance(fs, pafs.LocalFileSystem)
        self._parts: dict[str, dict[str, Obj]] | None = None  # part name -> its objects (the latest version)
        self._where: dict[str, str] = {}  # key -> the part listing it
        self._lines: dict[str, str] = {}  # key -> its line in that part
        self._kept: dict[str, set[str]] | None = None  # the versions kept -> the parts they list
        self._version = ""
        self._folders: set[str] = set()  # local folders known to exist
        self._state = {"applied": -1, "since_compaction": 0, "next_part": 1}

    @property
    def applied(self) -> int:
        """How far the folder's changes are in the manifest (an inbox offset, a Delta version); -1: nothing yet."""
        self._load()
        return int(self._state["applied"])

    def listing(self) -> dict[str, Obj]:
        """Every object the latest version lists, read again from storage."""
        self._parts = None
        self._load()
        return {key: obj for objects in (self._parts or {}).values() for key, obj in objects.items()}

    def update(self, put: dict[str, Obj], removed: Iterable[str], applied: int) -> str | None:
        """Apply changes up to `applied`; returns the new version's name, or None when nothing changed."""
        self._load()
        assert self._parts is not None
        if applied <= self.applied:
            return None
        changed = {k: o for k, o in put.items() if self._current(k) != o}
        gone = {k for k in removed if k in self._where and k not in put}
        if not changed and not gone:
            self._state["applied"] = applied  # recorded with the next version written
            return None
        state = {**self._state, "applied": applied}  # this object's own only once the version is out
        parts = dict(self._parts)
        rewrite = sorted({self._where[k] for k in (*gone, *changed) if k in self._where})
        for name in rewrite:
            del parts[name]
        for key, obj in changed.items():
            self._lines[key] = obj.line(key)
        # Objects stay in the order they came (parts are named in that order): removals, which mostly take
        # the oldest files or ones just rewritten, then touch few parts.
        kept = [k for name in rewrite for k in self._parts[name] if k not in gone and k not in changed]
        since = int(state["since_compaction"]) + 1
        compacting = since >= self.cfg.compact_every
        if compacting:
            kept = [k for name in sorted(parts) for k in parts[name] if k not in changed] + kept
            parts, since = {}, 0
        fresh = dict.fromkeys(kept)
        fresh.update(changed)
        objects = {}
        for name in (self._parts if compacting else rewrite):
            objects.update(self._parts[name])
        objects.update(changed)
        order, lines, added = list(fresh), self._lines, []
        for i in range(0, len(order), self.cfg.part_lines):
            name = f"msc_manifest_part{state['next_part']:06d}.jsonl"
            state["next_part"] = int(state["next_part"]) + 1
            keys = order[i:i + self.cfg.part_lines]
            self._write(posixpath.join(self.base, PARTS, name), "\n".join([lines[k] for k in keys]))
            parts[name] = {k: objects[k] for k in keys}
            added.append(name)
        failpoints.reached("msc.parts_written")
        state["since_compaction"] = since
        version = self._publish(sorted(parts), state)
        # What the version lists, kept in memory in O(changes) (in O(files) only when compacting).
        for name in rewrite:
            for key in self._parts[name]:
                self._where.pop(key, None)
        for key in gone:
            self._where.pop(key, None)
            self._lines.pop(key, None)
        if compacting:
            self._where = {}
        for name in added:
            self._where.update(dict.fromkeys(parts[name], name))
        self._parts, self._version, self._state = parts, version, state
        self._prune()
        return version

    def _current(self, key: str) -> Obj | None:
        part = self._where.get(key)
        return self._parts[part][key] if part is not None and self._parts is not None else None

    def _publish(self, parts: list[str], state: dict[str, int]) -> str:
        """Write the version's index; visible at once and whole (see the module's docstring)."""
        now = datetime.now(UTC)
        if self._version:
            now = max(now, datetime.strptime(self._version, _TIME).replace(tzinfo=UTC) + timedelta(microseconds=1))
        version = now.strftime(_TIME)
        index = {"version": "1", "parts": [{"path": f"/{self.cfg.path}/{PARTS}/{p}"} for p in parts], "format": "jsonl",
                 STATE: state}
        folder = posixpath.join(self.base, f".{version}.tmp" if self._local else version)
        self._write(posixpath.join(folder, INDEX), json.dumps(index), fresh_folder=True)
        if self._local:
            self.fs.move(folder, posixpath.join(self.base, version))
        return version

    def _write(self, path: str, text: str, fresh_folder: bool = False) -> None:
        folder = posixpath.dirname(path)
        if self._local and (fresh_folder or folder not in self._folders):  # S3 has none (pyarrow would write markers)
            self.fs.create_dir(folder, recursive=True)
            if not fresh_folder:
                self._folders.add(folder)
        with self.fs.open_output_stream(path) as out:
            out.write(text.encode())

    def _versions(self) -> list[str]:
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.base, allow_not_found=True))
        except (FileNotFoundError, NotADirectoryError):
            return []
        folders = (i.base_name for i in infos if i.type == pafs.FileType.Directory)
        return sorted(name for name in folders if not name.startswith("."))

    def _read(self, path: str) -> str:
        with self.fs.open_input_stream(path) as stream:
            return stream.read().decode()

    def _load(self) -> None:
        if self._parts is not None:
            return
        self._parts, self._where, self._lines = {}, {}, {}
        for version in reversed(self._versions()):
            folder = posixpath.join(self.base, version)
            try:
                index = json.loads(self._read(posixpath.join(folder, INDEX)))
                state = index[STATE]
                parts, lines = {}, {}
                for part in index["parts"]:
                    objects = {}
                    for line in self._read(posixpath.join(self.root, part["path"].lstrip("/"))).splitlines():
                        if line:
                            key, obj = parse_line(line)
                            objects[key], lines[key] = obj, line
                    parts[posixpath.basename(part["path"])] = objects
            except (FileNotFoundError, ValueError, KeyError) as exc:  # not one of lakefeed's, or incomplete
                _log.warning("msc.version_skipped", manifest=self.base, version=version, error=str(exc))
                continue
            self._parts, self._version, self._state, self._lines = parts, version, state, lines
            self._where = {k: name for name, objects in parts.items() for k in objects}
            return

    def _prune(self) -> None:
        """Keep `retain_versions` versions, the parts they list, and nothing else. The kept versions' parts are
        known in memory; storage is scanned (for what a crash left: unfinished versions, orphaned parts) at the
        first update of a writer and when compacting, so an ordinary version costs no listing."""
        assert self._parts is not None
        if self._kept is None or int(self._state["since_compaction"]) == 0:
            self._scan()
        else:
            self._kept[self._version] = set(self._parts)
            while len(self._kept) > self.cfg.retain_versions:
                version = min(self._kept)
                gone = self._kept.pop(version)
                self.fs.delete_dir(posixpath.join(self.base, version))
                for part in gone - set().union(*self._kept.values()):
                    self.fs.delete_file(posixpath.join(self.base, PARTS, part))

    def _scan(self) -> None:
        versions = self._versions()
        old, kept = versions[:-self.cfg.retain_versions], versions[-self.cfg.retain_versions:]
        for version in old:
            self.fs.delete_dir(posixpath.join(self.base, version))
        self._kept = {}
        for version in kept:
            try:
                index = json.loads(self._read(posixpath.join(self.base, version, INDEX)))
            except (FileNotFoundError, ValueError):
                if version != self._version:
                    self.fs.delete_dir(posixpath.join(self.base, version))  # on S3: a write a crash cut short
                continue
            self._kept[version] = {posixpath.basename(p["path"]) for p in index.get("parts", ())}
        listed = set().union(*self._kept.values())
        for info in self.fs.get_file_info(pafs.FileSelector(self.base, allow_not_found=True)):
            if info.type == pafs.FileType.Directory and info.base_name.endswith(".tmp"):
                self.fs.delete_dir(info.path)  # a version a crash left unfinished
        for info in self.fs.get_file_info(pafs.FileSelector(posixpath.join(self.base, PARTS), allow_not_found=True)):
            if info.base_name not in listed:
                self.fs.delete_file(info.path)
