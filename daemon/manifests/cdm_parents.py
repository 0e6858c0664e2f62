"""The manifests above a sub-manifest, kept current after it is written (the `cdm_root` tree).

A parent's `subManifests[]` declaration of the child gets `lastFileStatusCheckTime` (now) and
`lastFileModifiedTime` (the child document's file time), and the parent's `lastChildFileModifiedTime` takes the
latest of that and the child's own; then the same one level up, to the root. A parent is written only when one
of those times moved, atomically, under the lock every writer of that file takes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lakefeed import clock, log
from lakefeed.connectors.sinks import cdm_manifest
from lakefeed.errors import ManifestError

_log = log.get(__name__)


def propagate(child: Path, parents: tuple[Path, ...], checked: str, lock, compact_above: int) -> list[Path]:
    """Bring each parent's declaration of the manifest below it current, nearest first; return those written.
    `lock(path)` is the lock of a manifest file."""
    written, corpus = [], parents[-1].parent if parents else child.parent
    for parent in parents:
        with lock(parent):
            try:
                doc = cdm_manifest.load(parent)
                child_doc = cdm_manifest.load(child)
            except (OSError, ManifestError) as exc:  # a parent edited into something unreadable: its owner's to fix
                _log.warning("manifest.parent_unreadable", manifest=str(parent), error=str(exc))
                return written
            declaration = _declaration(doc, parent, child, corpus)
            if declaration is None:
                _log.warning("manifest.sub_manifest_undeclared", manifest=str(parent), sub_manifest=str(child))
                return written
            stamp = clock.to_cdm(clock.from_ns(child.stat().st_mtime_ns))
            times = (declaration.get("lastFileModifiedTime"), doc.get("lastChildFileModifiedTime"))
            declaration["lastFileStatusCheckTime"] = checked
            declaration["lastFileModifiedTime"] = clock.latest(declaration.get("lastFileModifiedTime"), stamp)
            doc["lastChildFileModifiedTime"] = clock.latest(
                doc.get("lastChildFileModifiedTime"), declaration["lastFileModifiedTime"],
                child_doc.get("lastChildFileModifiedTime"))
            if times == (declaration.get("lastFileModifiedTime"), doc.get("lastChildFileModifiedTime")):
                return written  # nothing moved here, so nothing above moves either
            partitions = sum(len(e.get(k) or ()) for e in doc.get("entities") or () if isinstance(e, dict)
                             for k in ("dataPartitions", "incrementalPartitions"))
            cdm_manifest.save(parent, doc, compact=partitions > compact_above)
            written.append(parent)
        child = parent
    return written


def _declaration(doc: dict[str, Any], parent: Path, child: Path, corpus: Path) -> dict[str, Any] | None:
    """The parent's subManifests entry of the child (relative paths from the parent's folder, `/…` from the
    corpus root, the root manifest's folder)."""
    for sub in doc.get("subManifests") or ():
        definition = sub.get("definition") if isinstance(sub, dict) else None
        if not isinstance(definition, str):
            continue
        definition = definition.removeprefix("local:")
        folder = corpus if definition.startswith("/") else parent.parent
        if (folder / definition.lstrip("/")).resolve() == child:
            return sub
    return None
