"""Keeping the CDM manifest current, derived from committed state.

Each data-table commit records the partitions its batch ingested (commit metadata
`lakefeed.partitions`). After every commit the keeper applies all commits the manifest
has not seen yet and rewrites the manifest atomically; a sidecar file remembers the last
applied table version. A crash between commit and manifest write is therefore repaired by
the next refresh, and re-applying a commit is harmless.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from lakefeed import clock, failpoints, log
from lakefeed.batch.discovery import INCREMENTAL_TRAIT, Partition, normalize_location
from lakefeed.batch.schema import entity_document, from_entity_document, is_generated
from lakefeed.config.model import EntityConfig, PatternSpec
from lakefeed.connectors.sinks import cdm_manifest
from lakefeed.connectors.sinks.base import TableSink
from lakefeed.errors import ManifestError
from lakefeed.manifests.cdm_checks import LISTS, check_listed, check_referenced, set_time
from lakefeed.manifests.cdm_parents import propagate

METADATA_KEY = "lakefeed.partitions"
COMPACT_ABOVE = 2000  # partitions in a manifest: written without indentation (C-fast, a fraction of the size)
_locks: defaultdict[Path, threading.Lock] = defaultdict(threading.Lock)
_log = log.get(__name__)


def manifest_lock(path: Path) -> threading.Lock:
    """Entities sharing one manifest file take turns writing it."""
    return _locks[path.resolve()]


def _incremental_trait(kind: str, pattern_name: str | None) -> dict[str, Any]:
    args = [{"name": "type", "value": kind}]
    if pattern_name:
        args.append({"name": "incrementPartitionPatternName", "value": pattern_name})
    return {"traitReference": INCREMENTAL_TRAIT, "arguments": args}


def pattern_json(spec: PatternSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"name": spec.name, "rootLocation": spec.root_location}
    if spec.glob_pattern:
        out["globPattern"] = spec.glob_pattern
    if spec.regular_expression:
        out["regularExpression"] = spec.regular_expression
    out["parameters"] = list(spec.parameters)
    if spec.incremental:
        out["exhibitsTraits"] = [_incremental_trait(spec.incremental, spec.name)]
    return out


def declaration(cfg: EntityConfig) -> dict[str, Any]:
    return {
        "type": "LocalEntity",
        "entityName": cfg.name,
        "entityPath": f"{cfg.name}.cdm.json/{cfg.name}",
        "dataPartitionPatterns": [pattern_json(p) for p in cfg.patterns if not p.incremental],
        "incrementalPartitionPatterns": [pattern_json(p) for p in cfg.patterns if p.incremental],
    }


def ensure_entity(cfg: EntityConfig) -> dict[str, Any]:
    """Load the manifest, creating it or the entity's declaration from the config's patterns if absent."""
    with manifest_lock(cfg.manifest):
        try:
            doc = cdm_manifest.load(cfg.manifest)
        except FileNotFoundError:
            doc = cdm_manifest.new_manifest(cfg.manifest.name.removesuffix(".manifest.cdm.json"))
        entity = cdm_manifest.local_entity(doc, cfg.name, cfg.manifest)
        if entity is not None:
            if cfg.patterns:
                _log.warning("config.patterns_ignored", entity=cfg.name, manifest=str(cfg.manifest),
                             reason="the manifest declares the entity; its patterns are used")
            return entity
        if not cfg.patterns and cfg.source is not None:
            raise ManifestError(
                f"manifest {cfg.manifest} does not declare entity {cfg.name!r} and the config gives no "
                "patterns: add the entity to the manifest or `patterns:` to the entity's config"
            )
        entity = declaration(cfg)
        doc.setdefault("entities", []).append(entity)
        cdm_manifest.save(cfg.manifest, doc)
        _log.info("manifest.entity_created", entity=cfg.name, manifest=str(cfg.manifest))
        return entity


def partition_record(partition: Partition, mtime: str, removed: bool = False, also: bool = False
                     ) -> dict[str, Any]:
    """A partition a batch ingested (or whose object went: `removed`), as the commit records it. `also`: the
    file's listing in the other list as well (`Discovery.also`, with `sdk` precedence)."""
    record = {
        "location": partition.location,
        "arguments": partition.arguments,
        "type": partition.incremental_type,
        "pattern": partition.pattern_name,
        "explicit": partition.explicit,
        "mtime": mtime,
    }
    if removed:  # its object was deleted: the declaration goes
        record["removed"] = True
    if also:
        record["also"] = True
    return record


def apply(doc: dict[str, Any], entity: dict[str, Any], checked: str, records: list[dict[str, Any]],
          schema_mtime: str | None, manifest_mtime: str | None = None) -> None:
    """Bring an entity declaration (inside `doc`) up to date with ingested partitions at time `checked`.
    `manifest_mtime`, the time of the manifest's file, becomes its `lastFileModifiedTime` if it has none (as the
    CDM SDK: lakefeed's own rewrites, which bring times and partitions current, are not counted)."""
    index: dict[tuple[str, str], dict[str, Any]] = {}  # (list, location) -> declaration
    for key in LISTS:
        for decl in entity.get(key) or ():
            index[key, normalize_location(decl.get("location", ""))] = decl
    for rec in records:
        location = normalize_location(rec["location"])
        own, other = LISTS[::-1] if rec["type"] else LISTS
        if rec.get("removed"):  # every listing of the file goes
            gone = [index.pop((key, location)) for key in LISTS if (key, location) in index]
            for key in LISTS if gone else ():
                entity[key] = [d for d in entity.get(key) or () if all(d is not g for g in gone)]
            continue
        existing = index.get((own, location))
        if existing is None and not rec.get("also"):  # one partition per file, wherever it is listed
            existing = index.get((other, location))
        if existing is not None and rec["explicit"]:
            # Explicit partitions keep their arguments and schema; only their file times move.
            existing["lastFileStatusCheckTime"] = checked
            existing["lastFileModifiedTime"] = clock.latest(existing.get("lastFileModifiedTime"), rec["mtime"])
            continue
        decl = existing if existing is not None else {}
        decl["location"] = rec["location"]
        traits = _pattern_traits(entity, rec["pattern"], rec["type"])
        if traits:
            decl["exhibitsTraits"] = traits
        decl["arguments"] = [{"name": n, "value": v} for n, values in rec["arguments"].items() for v in values]
        decl["lastFileStatusCheckTime"] = checked
        decl["lastFileModifiedTime"] = rec["mtime"]
        if existing is None:
            entity.setdefault(own, []).append(decl)
            index[own, location] = decl
    for key in ("dataPartitionPatterns", "incrementalPartitionPatterns"):
        for pattern in entity.get(key) or ():
            pattern["lastFileStatusCheckTime"] = checked
    children = [d.get("lastFileModifiedTime") for d in index.values()]
    set_time(entity, "lastFileStatusCheckTime", checked)
    set_time(entity, "lastFileModifiedTime", clock.latest(entity.get("lastFileModifiedTime"), schema_mtime))
    set_time(entity, "lastChildFileModifiedTime", clock.latest(entity.get("lastChildFileModifiedTime"), *children))
    set_time(doc, "lastFileStatusCheckTime", checked)
    if not doc.get("lastFileModifiedTime"):
        set_time(doc, "lastFileModifiedTime", manifest_mtime)
    set_time(doc, "lastChildFileModifiedTime", clock.latest(
        doc.get("lastChildFileModifiedTime"), entity.get("lastChildFileModifiedTime"),
        entity.get("lastFileModifiedTime")))


def _pattern_traits(entity: dict[str, Any], pattern_name: str | None, kind: str | None) -> list[Any]:
    """The traits a partition takes from the pattern that found it (a format trait with its arguments, say:
    readers need them to parse the file), as the CDM SDK copies them; an incremental one names its pattern."""
    patterns = [p for key in ("dataPartitionPatterns", "incrementalPartitionPatterns") for p in entity.get(key) or ()]
    pattern = next((p for p in patterns if isinstance(p, dict) and p.get("name") == pattern_name), {})
    traits = [json.loads(json.dumps(t)) for t in pattern.get("exhibitsTraits") or ()
              if (t.get("traitReference") if isinstance(t, dict) else t) != INCREMENTAL_TRAIT]
    return [*traits, _incremental_trait(kind, pattern_name)] if kind else traits


class ManifestKeeper:
    """Applies committed partitions of one entity to its manifest."""

    def __init__(self, cfg: EntityConfig, table: TableSink,
                 publish: Callable[[list[Path]], None] = lambda paths: None) -> None:
        self.cfg = cfg
        self._table = table
        self._state_path = cfg.state / "manifest_state.json"
        self._copy_path = cfg.state / "manifest_copy.cdm.json"  # the manifest as last written (`restore`)
        self._publish = publish  # copies written documents to where readers look (the entity's bucket)
        self._state: tuple[int, set[str], dict[str, bool]] | None = None  # as saved, kept here once read
        self._parsed: tuple[tuple[int, tuple[int, ...] | None], dict[str, Any]] | None = None  # (version, doc)

    def state(self) -> tuple[int, set[str], dict[str, bool]]:
        """The table version applied, the locations whose entries lakefeed wrote, and the locations it also
        listed in their other list (in the incremental list: True)."""
        if self._state is None:
            try:
                state = json.loads(self._state_path.read_text(encoding="utf-8"))
                self._state = int(state["applied_version"]), set(state["owned"]), dict(state.get("doubled", {}))
            except FileNotFoundError:
                self._state = -1, set(), {}
        return self._state[0], set(self._state[1]), dict(self._state[2])

    def document(self) -> dict[str, Any]:
        """The manifest, parsed. A large one is parsed again only when its file changed since this keeper last
        read or wrote it (a batch would otherwise parse megabytes a few times over). FileNotFoundError if absent."""
        with manifest_lock(self.cfg.manifest):
            return self._document()

    def _document(self) -> dict[str, Any]:
        version = self._file_version()
        if self._parsed is not None and version[1] is not None and self._parsed[0] == version:
            return self._parsed[1]
        self._parsed = None
        doc = cdm_manifest.load(self.cfg.manifest)
        self._parsed = version, doc
        return doc

    def _file_version(self) -> tuple[int, tuple[int, ...] | None]:
        return cdm_manifest.writes(self.cfg.manifest), cdm_manifest.file_version(self.cfg.manifest)

    def _saved_entity(self) -> dict[str, Any] | None:
        try:
            return cdm_manifest.find_entity(cdm_manifest.load(self._copy_path), self.cfg.name)
        except FileNotFoundError:
            pass
        try:  # written by an earlier lakefeed, which kept the declaration in the state file
            return json.loads(self._state_path.read_text(encoding="utf-8")).get("entity")
        except FileNotFoundError:
            return None

    def restore(self) -> None:
        """Bring back a manifest, or the entity's declaration in it, deleted while lakefeed keeps it: from the
        copy saved at the last refresh, so no partition written before is lost. Called for every batch: a manifest
        unchanged since it was last read here is not parsed again."""
        with manifest_lock(self.cfg.manifest):
            try:
                doc: dict[str, Any] | None = self._document()
            except FileNotFoundError:
                doc = None
            if doc is not None and cdm_manifest.find_entity(doc, self.cfg.name) is not None:
                return
            saved = self._saved_entity()
            if saved is None:
                return  # nothing written yet: the declaration is made from the config (ensure_entity)
            doc = doc or cdm_manifest.new_manifest(self.cfg.manifest.name.removesuffix(".manifest.cdm.json"))
            doc.setdefault("entities", []).append(saved)
            self._parsed = None
            cdm_manifest.save(self.cfg.manifest, doc)
            _log.warning("manifest.restored", entity=self.cfg.name, manifest=str(self.cfg.manifest),
                         partitions=sum(len(saved.get(k) or ()) for k in ("dataPartitions", "incrementalPartitions")),
                         reason="the manifest or the entity's declaration was deleted; restored from committed state")
            self._publish([self.cfg.manifest])

    def owned(self) -> set[str]:
        """Locations whose manifest entries lakefeed wrote (so they are not explicit partitions)."""
        return self.state()[1]

    def doubled(self) -> dict[str, bool]:
        """Locations lakefeed listed in their other list too (`Discovery.also`): that entry is lakefeed's."""
        return self.state()[2]

    def refresh(self) -> int:
        """Apply every commit not yet in the manifest; return how many partitions were written."""
        self.restore()
        with manifest_lock(self.cfg.manifest):
            applied, owned, doubled = self.state()
            commits = [c for c in self._table.commits_after(applied) if METADATA_KEY in c]
            latest = self._table.version()
            if latest is None or latest <= applied:
                return 0
            doc = self._document()
            entity = cdm_manifest.local_entity(doc, self.cfg.name, self.cfg.manifest)
            if entity is None:
                raise ManifestError(f"manifest {self.cfg.manifest} no longer declares entity {self.cfg.name!r}")
            self._parsed = None  # changed below: parsed again if anything fails before it is written
            changed = self._describe_schema(entity)  # first: the manifest points at it, and takes its time
            written, checked = 0, None
            version = cdm_manifest.file_version(self.cfg.manifest)
            manifest_mtime = clock.to_cdm(clock.from_ns(version[1])) if version else None
            for commit in commits:
                batch = json.loads(commit[METADATA_KEY])
                checked = batch["checked"]
                apply(doc, entity, checked, batch["partitions"], self._schema_mtime(entity), manifest_mtime)
                for p in batch["partitions"]:
                    location = normalize_location(p["location"])
                    if p.get("removed"):
                        owned.discard(location)
                        doubled.pop(location, None)
                    elif p.get("also"):
                        doubled[location] = p["type"] is not None
                    elif not p["explicit"]:
                        owned.add(location)
                written += len(batch["partitions"])
            text = None
            if checked is not None:
                if getattr(self.cfg.source, "type", None) == "local_dir":  # partition files beside the manifest
                    check_listed(entity, self.cfg.manifest.parent, owned, checked, doubled)
                corpus = (self.cfg.cdm_parents[-1] if self.cfg.cdm_parents else self.cfg.manifest).parent
                check_referenced(doc, self.cfg.manifest.parent, corpus, checked)
                text = cdm_manifest.dumps(doc, compact=_partitions(doc) > COMPACT_ABOVE)
                cdm_manifest.save_text(self.cfg.manifest, text)
                self._parsed = self._file_version(), doc
                changed.append(self.cfg.manifest)
                failpoints.reached("manifest.written")
                changed += propagate(self.cfg.manifest, self.cfg.cdm_parents, checked, manifest_lock, COMPACT_ABOVE)
                _log.info("manifest.written", entity=self.cfg.name, manifest=str(self.cfg.manifest),
                          partitions=written, table_version=latest)
            self._publish(changed)
            self._save_state(latest, owned, doubled, text)
            return written

    def check(self) -> list[str]:
        """The manifest must reflect the table's latest version (refresh brings it there after every batch)."""
        applied, latest = self.state()[0], self._table.version()
        if latest is not None and applied < latest:
            return [f"CDM manifest {self.cfg.manifest} reflects table version {applied}; the table is at {latest}"]
        return []

    def _describe_schema(self, entity: dict[str, Any]) -> list[Path]:
        """Write the entity schema document the manifest points at, unless somebody else owns it."""
        document = schema_document(self.cfg.manifest.parent, entity)
        table_schema = self._table.schema()
        if document is None or table_schema is None or (document.exists() and not is_generated(document)):
            return []
        wanted = entity_document(self.cfg.name, table_schema)
        if document.exists() and cdm_manifest.load(document) == wanted:
            return []
        cdm_manifest.save(document, wanted)
        _log.info("schema_document.written", entity=self.cfg.name, document=str(document))
        return [document]

    def _schema_mtime(self, entity: dict[str, Any]) -> str | None:
        doc = schema_document(self.cfg.manifest.parent, entity)
        if doc is None or not doc.exists():
            return None
        return clock.to_cdm(clock.from_ns(doc.stat().st_mtime_ns))

    def _save_state(self, version: int, owned: set[str], doubled: dict[str, bool], text: str | None) -> None:
        """The version applied, and a copy of the manifest as written (what `restore` brings back)."""
        if text is not None:
            cdm_manifest.save_text(self._copy_path, text)
        state = {"applied_version": version, "owned": sorted(owned), "doubled": doubled}
        cdm_manifest.save_text(self._state_path, json.dumps(state))  # fsynced: a power cut leaves it whole
        self._state = version, owned, doubled


def _partitions(doc: dict[str, Any]) -> int:
    return sum(len(e.get(k) or ()) for e in doc.get("entities") or () if isinstance(e, dict)
               for k in ("dataPartitions", "incrementalPartitions"))


def schema_document(root: Path, entity: dict[str, Any]) -> Path | None:
    """The local file of an entity's schema document (`entityPath`/`entitySchema` up to `.cdm.json`)."""
    path = entity.get("entityPath") or entity.get("entitySchema")
    if not path or ".cdm.json" not in path:
        return None
    document = path[: path.index(".cdm.json") + len(".cdm.json")]
    return root / normalize_location(document)


def declared_schema(root: Path, entity: dict[str, Any], name: str) -> pa.Schema | None:
    """The schema the entity's schema document declares (None: it has none, or no such file)."""
    document = schema_document(root, entity)
    if document is None or not document.exists():
        return None
    return from_entity_document(document, name)
