"""Reading and atomically writing CDM `*.manifest.cdm.json` documents.

The document is handled as JSON, not through an object model, so every field lakefeed does
not manage (imports, relationships, sub-manifests, traits, unknown keys) is kept verbatim.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from lakefeed.errors import ManifestError

JSON_SCHEMA_VERSION = "1.0.0"


def new_manifest(name: str) -> dict[str, Any]:
    return {
        "manifestName": name,
        "jsonSchemaSemanticVersion": JSON_SCHEMA_VERSION,
        "imports": [{"corpusPath": "cdm:/foundations.cdm.json"}],
        "entities": [],
    }


def load(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            st = os.fstat(f.fileno())
            text = f.read()
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(f"manifest {path} cannot be read: {exc}") from exc
    try:
        return _checked(path, json.loads(text))
    except ValueError as exc:
        fault = ManifestError(f"manifest {path} is not valid JSON ({exc}); fix or restore it — lakefeed left it "
                              "untouched")
        fault.stamp = (st.st_mtime_ns, st.st_size)
        raise fault from exc
    except ManifestError as fault:
        fault.stamp = (st.st_mtime_ns, st.st_size)
        raise


def _checked(path: Path, doc: Any) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise ManifestError(f"manifest {path} must hold a JSON object; lakefeed left it untouched")
    if (fault := shape_fault(doc)) is not None:
        raise ManifestError(f"manifest {path}: {fault}; fix it — lakefeed left it untouched")
    return doc


_LISTS = ("dataPartitionPatterns", "incrementalPartitionPatterns", "dataPartitions", "incrementalPartitions")
_TEXTS = ("entityName", "entityPath", "location", "rootLocation", "regularExpression", "globPattern",
          "lastFileStatusCheckTime", "lastFileModifiedTime", "lastChildFileModifiedTime")


def _is_text(value: Any) -> bool:
    return isinstance(value, str)


def shape_fault(doc: dict[str, Any]) -> str | None:
    """Where the document departs from the shape lakefeed reads (a JSON pointer and what it should be), or None.

    Only what lakefeed reads is checked; anything else is kept verbatim, whatever it holds."""

    def kind(value: Any) -> str:
        return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
            type(value), "a number")

    def objects(value: Any, where: str) -> str | None:
        if not isinstance(value, list):
            return f"{where} must be a list, not {kind(value)}"
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                return f"{where}/{i} must be an object, not {kind(item)}"
        return None

    for key in ("entities", "subManifests"):
        if key in doc and (fault := objects(doc[key], f"/{key}")):
            return fault
    for i, entity in enumerate(doc.get("entities") or ()):
        for key in _LISTS:
            if key in entity and (fault := objects(entity[key], f"/entities/{i}/{key}")):
                return fault
        parts = [(x, f"/entities/{i}/{k}/{j}") for k in _LISTS for j, x in enumerate(entity.get(k) or ())]
        for item, where in [(entity, f"/entities/{i}"), *parts]:
            for key in _TEXTS:
                if item.get(key) is not None and not isinstance(item[key], str):
                    return f"{where}/{key} must be a string, not {kind(item[key])}"
            arguments = item.get("parameters")
            if arguments is not None and not (isinstance(arguments, list) and all(map(_is_text, arguments))):
                return f"{where}/parameters must be a list of strings"
    return None


def save(path: Path, doc: dict[str, Any], compact: bool = False) -> None:
    """Write the whole document atomically. `compact`: without indentation, which json serializes in C (large
    manifests: a fraction of the time and size)."""
    save_text(path, json.dumps(doc, ensure_ascii=False, **({"separators": (",", ":")} if compact else {"indent": 2})))


def save_text(path: Path, text: str) -> None:
    """Write a document's JSON text to a temporary file beside it, fsync, then rename over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def find_entity(doc: dict[str, Any], name: str) -> dict[str, Any] | None:
    for entity in doc.get("entities") or ():
        if isinstance(entity, dict) and entity.get("entityName") == name:
            return entity
    return None


def local_entity(doc: dict[str, Any], name: str, path: Path) -> dict[str, Any] | None:
    """The entity lakefeed keeps in the manifest at `path`; a ManifestError if the manifest only borrows it."""
    entity = find_entity(doc, name)
    if entity is not None and entity.get("type") == "ReferencedEntity":
        owner = entity.get("entityPath") or entity.get("entityDeclaration") or "another manifest"
        raise ManifestError(f"manifest {path} borrows entity {name!r} from {owner} (a ReferencedEntity): lakefeed "
                            "writes only entities a manifest owns; give the entity the manifest that owns it")
    return entity
