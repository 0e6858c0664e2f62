"""The times a CDM manifest records for what lakefeed does not ingest itself: partitions the manifest lists on
its own (each gets the check time, and its file's time when the file is there) and entities it borrows from
other manifests (`ReferencedEntity`: the time of the manifest that owns each), as the CDM SDK records them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lakefeed import clock
from lakefeed.batch.discovery import normalize_location

LISTS = ("dataPartitions", "incrementalPartitions")


def set_time(obj: dict[str, Any], key: str, value: str | None) -> None:
    """CDM readers fail on a time without a zone (or null): an unknown time is left out."""
    if value is not None:
        obj[key] = value


def check_listed(entity: dict[str, Any], folder: Path, owned: set[str], checked: str,
                 doubled: dict[str, bool]) -> None:
    """Check the files of the partitions the manifest lists itself (not lakefeed's, see `Discovery.from_entity`):
    each gets the check time, whether or not its file is there (as the CDM SDK records the check), and the
    file's time when it is."""
    for key, incremental in zip(LISTS, (False, True), strict=True):
        for decl in entity.get(key) or ():
            location = decl.get("location") if isinstance(decl, dict) else None
            if not isinstance(location, str) or not location or normalize_location(location) in owned or \
                    doubled.get(normalize_location(location)) is incremental:
                continue
            if ":" in location.split("/", 1)[0] and not location.startswith("local:"):
                continue  # another namespace: not here to check
            decl["lastFileStatusCheckTime"] = checked
            try:
                mtime = (folder / normalize_location(location)).stat().st_mtime_ns
            except OSError:
                continue
            decl["lastFileModifiedTime"] = clock.latest(decl.get("lastFileModifiedTime"),
                                                        clock.to_cdm(clock.from_ns(mtime)))


def check_referenced(doc: dict[str, Any], folder: Path, corpus: Path, checked: str) -> None:
    """Entities the manifest borrows (`ReferencedEntity`): the check time, and the time of the manifest that owns
    each, which is read, never written (as `manifest check`, and the CDM SDK). `folder` is the manifest's,
    `corpus` the root manifest's (where `/…` paths start); another namespace (`remote:/…`) is not reachable."""
    for entity in doc.get("entities") or ():
        if not isinstance(entity, dict) or entity.get("type") != "ReferencedEntity":
            continue
        entity["lastFileStatusCheckTime"] = checked
        target = str(entity.get("entityPath") or entity.get("entityDeclaration") or "").removeprefix("local:")
        if ".cdm.json" not in target or ":" in target.split("/", 1)[0]:
            continue
        document = target[: target.index(".cdm.json") + len(".cdm.json")]
        try:
            mtime = ((corpus if document.startswith("/") else folder) / document.lstrip("/")).stat().st_mtime_ns
        except OSError:
            continue
        entity["lastFileModifiedTime"] = clock.latest(entity.get("lastFileModifiedTime"),
                                                      clock.to_cdm(clock.from_ns(mtime)))
        set_time(doc, "lastChildFileModifiedTime", clock.latest(doc.get("lastChildFileModifiedTime"),
                                                                 entity["lastFileModifiedTime"]))
