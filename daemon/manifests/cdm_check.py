"""`lakefeed manifest check`: bring a CDM folder's manifest tree current once, like the CDM SDK's fileStatusCheck.

For folders that no daemon watches. From a root `*.manifest.cdm.json`:

- each local entity's patterns find new partitions in its folders, listed once per folder (one `os.scandir` walk
  and one `stat` per file, shared by every pattern and entity under it); every partition's file is checked, and
  gets `lastFileStatusCheckTime` even when its file is missing;
- each referenced entity's declaration gets the time of the manifest document it points at, which is only read;
- each sub-manifest is checked in its own file, its declaration gets its document's time, and every manifest's
  `lastChildFileModifiedTime` reaches the root;
- a manifest is rewritten (atomically) only when something other than a check time changed.

`precedence` says which pattern finds a file that several match: `spec` (the last processed, one partition per
file) or `sdk` (as CDM SDK 1.7: per list, data and incremental, the first pattern to find the file).
docs/cdm-discovery.md lists where lakefeed departs from the SDK.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lakefeed import clock, log
from lakefeed.batch.discovery import MATCH_TIME_LIMIT_S, Pattern, pattern_from_json
from lakefeed.connectors.sinks import cdm_manifest
from lakefeed.errors import ManifestError
from lakefeed.manifests.cdm_json import PartitionText, Splices, Stamps

Precedence = Literal["spec", "sdk"]
COMPACT_ABOVE = 2000  # partitions in a document: written without indentation (a fraction of the time and size)
_log = log.get(__name__)


@dataclass
class Report:
    """What a check did: per manifest, whether it was written and how many partitions it found."""

    manifests: list[dict[str, Any]] = field(default_factory=list)
    files_listed: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"manifests": self.manifests, "files_listed": self.files_listed, "seconds": round(self.seconds, 4)}


class _Doc:
    """One manifest document being checked: its JSON, and whether anything but a check time changed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.doc = cdm_manifest.load(path)
        self.stat = path.stat()
        self.changed = False
        self.added = 0
        self.splices = Splices()  # the partitions found, as JSON text

    def set(self, obj: dict[str, Any], key: str, value: str | None) -> None:
        if value is not None and obj.get(key) != value:
            obj[key] = value
            self.changed = True


def _later(a: str | None, b: str | None) -> str | None:
    """The later of two CDM times; plain string order where both are in the form lakefeed writes."""
    if a and b and len(a) == len(b) == 24 and a[-1] == b[-1] == "Z" and a[10] == b[10] == "T":
        return a if a >= b else b
    return clock.latest(a, b)


class CdmCheck:
    def __init__(self, root_manifest: Path, precedence: Precedence = "spec") -> None:
        self.root = root_manifest.resolve()
        self.corpus = str(self.root.parent)  # the `local:` namespace, and what `/…` paths start from
        self.precedence = precedence
        self.now = clock.to_cdm(clock.now())
        self._stamp = Stamps()
        self._listings: dict[str, list[tuple[str, int]]] = {}  # folder -> ("/relative/path", mtime_ns), os.walk order
        self._mtimes: dict[str, int] = {}  # listed files' paths -> mtime_ns, made when first asked
        self._indexed: set[str] = set()  # the listed folders in _mtimes
        self._seen: set[Path] = set()
        self.report = Report()

    def run(self) -> Report:
        started = time.perf_counter()
        self._manifest(self.root)
        self.report.seconds = time.perf_counter() - started
        return self.report

    # -- paths and files ---------------------------------------------------------------------------------------

    def _resolve(self, corpus_path: str, base: str) -> str | None:
        """A corpus path as a local path: `local:/x` and `/x` from the corpus root, others from `base`; None for
        another namespace (`remote:/…`, `adls:/…`), which nothing here can reach."""
        if corpus_path.startswith("local:"):
            corpus_path = corpus_path[len("local:"):]
        elif ":" in corpus_path.split("/", 1)[0]:
            return None
        path = (self.corpus + "/" + corpus_path.lstrip("/")) if corpus_path.startswith("/") else \
            (base + "/" + corpus_path)
        return os.path.normpath(path) if "/." in path or "//" in path or path.endswith("/") else path

    def _mtime(self, path: str) -> int | None:
        listed = next((f for f in self._listings if path.startswith(f + "/")), None)
        if listed is not None:  # a listed folder says whether the file is there
            if listed not in self._indexed:
                self._indexed.add(listed)
                self._mtimes.update((listed + rel, mtime) for rel, mtime in self._listings[listed])
            return self._mtimes.get(path)
        try:
            return os.stat(path).st_mtime_ns
        except OSError:
            return None

    def _files(self, folder: str) -> list[tuple[str, int]]:
        """Every file under a folder as ("/relative/path", mtime_ns), in os.walk's order (as the SDK lists)."""
        if folder in self._listings:
            return self._listings[folder]
        for listed, files in self._listings.items():
            if folder.startswith(listed + "/"):  # a folder inside one listed already: no second walk
                prefix = folder[len(listed):] + "/"
                cut = len(prefix) - 1
                out = [(k[cut:], m) for k, m in files if k.startswith(prefix)]
                self._listings[folder] = out
                return out
        out = []
        stack = [(folder, "")]
        while stack:
            path, rel = stack.pop()
            rel += "/"
            folders = []
            try:
                entries = list(os.scandir(path))
            except OSError:
                continue
            add = out.append
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        folders.append((entry.path, rel + entry.name))
                    else:
                        add((rel + entry.name, entry.stat().st_mtime_ns))
                except OSError:  # gone, or a link to nothing: as the SDK, not a file
                    continue
            stack.extend(reversed(folders))  # top-down, in scandir order, as os.walk
        self.report.files_listed += len(out)
        self._listings[folder] = out
        return out

    # -- manifests ---------------------------------------------------------------------------------------------

    def _manifest(self, path: Path) -> tuple[str | None, str | None]:
        """Check one manifest and its sub-manifests; return its (lastFileModifiedTime, lastChildFileModifiedTime)."""
        path = path.resolve()
        if path in self._seen:  # a cycle of sub-manifests
            _log.warning("manifest.cycle", manifest=str(path))
            return None, None
        self._seen.add(path)
        m = _Doc(path)
        doc, base = m.doc, str(path.parent)
        doc["lastFileStatusCheckTime"] = self.now
        if not doc.get("lastFileModifiedTime"):  # as the SDK: the document's time when first checked
            m.set(doc, "lastFileModifiedTime", self._stamp(m.stat.st_mtime_ns))
        child = doc.get("lastChildFileModifiedTime")
        for entity in doc.get("entities") or ():
            if not isinstance(entity, dict):
                continue
            if entity.get("type") == "ReferencedEntity":
                child = _later(child, self._referenced(m, entity, base))
            else:
                child = _later(child, self._local(m, entity, base))
        for sub in doc.get("subManifests") or ():
            if isinstance(sub, dict) and isinstance(sub.get("definition"), str):
                child = _later(child, self._sub_manifest(m, sub, base))
        m.set(doc, "lastChildFileModifiedTime", child)
        if m.changed:
            partitions = sum(len(e.get(k) or ()) for e in doc.get("entities") or () if isinstance(e, dict)
                             for k in ("dataPartitions", "incrementalPartitions")) + m.splices.count()
            cdm_manifest.save_text(path, m.splices.dumps(doc, compact=partitions > COMPACT_ABOVE))
            _log.info("manifest.checked", manifest=str(path), partitions_added=m.added, written=True)
        self.report.manifests.append({"manifest": str(path), "written": m.changed, "partitions_added": m.added})
        return doc.get("lastFileModifiedTime"), doc.get("lastChildFileModifiedTime")

    def _sub_manifest(self, m: _Doc, sub: dict[str, Any], base: str) -> str | None:
        sub["lastFileStatusCheckTime"] = self.now
        path = self._resolve(sub["definition"], base)
        if path is None or not os.path.isfile(path):
            _log.warning("manifest.sub_manifest_missing", manifest=str(m.path), definition=sub["definition"])
            return None
        try:
            _, child = self._manifest(Path(path))
        except ManifestError as exc:  # the rest of the tree is still checked
            _log.error("manifest.sub_manifest_unreadable", manifest=str(m.path), error=str(exc))
            self.report.manifests.append({"manifest": path, "error": str(exc)})
            return None
        m.set(sub, "lastFileModifiedTime", _later(sub.get("lastFileModifiedTime"),
                                                  self._stamp(os.stat(path).st_mtime_ns)))
        return _later(sub.get("lastFileModifiedTime"), child)

    def _referenced(self, m: _Doc, entity: dict[str, Any], base: str) -> str | None:
        """A borrowed entity: the time of the manifest that owns it, which is read, never written."""
        entity["lastFileStatusCheckTime"] = self.now
        target = str(entity.get("entityPath") or entity.get("entityDeclaration") or "")
        document = target[: target.index(".cdm.json") + len(".cdm.json")] if ".cdm.json" in target else ""
        path = self._resolve(document, base) if document else None
        mtime = self._mtime(path) if path is not None else None
        if mtime is None:
            _log.warning("manifest.reference_unreachable", manifest=str(m.path), entity=entity.get("entityName"),
                         entity_path=target)
            return None
        m.set(entity, "lastFileModifiedTime", _later(entity.get("lastFileModifiedTime"), self._stamp(mtime)))
        return entity.get("lastFileModifiedTime")

    # -- local entities ----------------------------------------------------------------------------------------

    def _local(self, m: _Doc, entity: dict[str, Any], base: str) -> str | None:
        """Find new partitions, check every partition's file; return the entity's latest time for its manifest."""
        data = entity.get("dataPartitions") or []
        incremental = entity.get("incrementalPartitions") or []
        known = ({self._key(p.get("location"), base) for p in data if isinstance(p, dict)},
                 {self._key(p.get("location"), base) for p in incremental if isinstance(p, dict)})
        for key in ("dataPartitionPatterns", "incrementalPartitionPatterns"):
            for pattern in entity.get(key) or ():
                if isinstance(pattern, dict):
                    pattern["lastFileStatusCheckTime"] = self.now
        new, newest = self._discover(entity, base, known)  # first: it lists the folders
        child = entity.get("lastChildFileModifiedTime")
        now, stamp, later = self.now, self._stamp, _later
        for partition in (*data, *incremental):  # those listed before: checked, whether or not their file is there
            if not isinstance(partition, dict):
                continue
            partition["lastFileStatusCheckTime"] = now
            location = partition.get("location")
            path = self._resolve(location, base) if isinstance(location, str) and location else None
            mtime = self._mtime(path) if path is not None else None
            if mtime is not None:
                m.set(partition, "lastFileModifiedTime", later(partition.get("lastFileModifiedTime"), stamp(mtime)))
            child = later(child, partition.get("lastFileModifiedTime"))
        if newest >= 0:
            child = later(child, stamp(newest))
        if new[0]:
            entity["dataPartitions"] = [*data, m.splices.token(new[0])]
        if new[1]:
            entity["incrementalPartitions"] = [*incremental, m.splices.token(new[1])]
        if new[0] or new[1]:
            m.added += len(new[0]) + len(new[1])
            m.changed = True
        entity["lastFileStatusCheckTime"] = now
        schema = self._schema_document(entity, base)
        if schema is not None and (mtime := self._mtime(schema)) is not None:
            m.set(entity, "lastFileModifiedTime", later(entity.get("lastFileModifiedTime"), stamp(mtime)))
        m.set(entity, "lastChildFileModifiedTime", child)
        return later(entity.get("lastChildFileModifiedTime"), entity.get("lastFileModifiedTime"))

    def _schema_document(self, entity: dict[str, Any], base: str) -> str | None:
        path = str(entity.get("entityPath") or entity.get("entitySchema") or "")
        if ".cdm.json" not in path:
            return None
        return self._resolve(path[: path.index(".cdm.json") + len(".cdm.json")], base)

    def _key(self, location: Any, base: str) -> str | None:
        return self._resolve(location, base) if isinstance(location, str) and location else None

    def _discover(self, entity: dict[str, Any], base: str,
                  known: tuple[set[Any], set[Any]]) -> tuple[tuple[list[str], list[str]], int]:
        """The JSON of new data and incremental partitions, for files the patterns find that no partition lists
        yet, and the latest mtime of their files (-1: none)."""
        patterns: list[tuple[dict[str, Any], Pattern, bool]] = []
        for key, is_incremental in (("dataPartitionPatterns", False), ("incrementalPartitionPatterns", True)):
            for decl in entity.get(key) or ():
                if isinstance(decl, dict) and (pattern := pattern_from_json(decl, is_incremental)) is not None:
                    patterns.append((decl, pattern, is_incremental))
        new: tuple[list[str], list[str]] = ([], [])
        newest = -1
        winners: dict[str, tuple[PartitionText, str, Any, int]] = {}
        sdk = self.precedence == "sdk"
        for decl, pattern, is_incremental in patterns:
            root_location = pattern.root_location[:-1] if pattern.root_location.endswith("/") else \
                pattern.root_location
            folder = self._resolve(root_location, base) if root_location else base
            if folder is None:
                continue
            make = PartitionText(decl, pattern, is_incremental, self.now, self._stamp)
            mine, other = known[is_incremental], known[not is_incremental]
            if len(patterns) == 1 and pattern.linear and not mine and not other:
                # The only pattern, and nothing listed yet: every find is the entity's, whatever the precedence.
                texts, latest = make.many(root_location, self._files(folder), pattern.expression.fullmatch)
                new[is_incremental].extend(texts)
                newest = max(newest, latest)
                continue
            for name, mtime in self._files(folder):
                if (mine or other) and ((key := folder + name) in mine or not sdk and key in other):
                    continue  # listed already: inferred partitions never replace one
                try:
                    match = pattern.fullmatch(name)
                except TimeoutError:
                    _log.warning("pattern.timed_out", pattern=pattern.name, file=name, limit_s=MATCH_TIME_LIMIT_S)
                    continue
                if match is None:
                    continue
                location = root_location + name if root_location else name[1:]  # the SDK's, or the folder's
                if sdk or len(patterns) == 1:
                    mine.add(folder + name)
                    new[is_incremental].append(make(location, match, mtime))
                    newest = max(newest, mtime)
                else:
                    winners[folder + name] = (make, location, match, mtime)
        for make, location, match, mtime in winners.values():
            new[make.incremental].append(make(location, match, mtime))
            newest = max(newest, mtime)
        return new, newest


def check(root_manifest: Path, precedence: Precedence = "spec") -> Report:
    return CdmCheck(root_manifest, precedence).run()
