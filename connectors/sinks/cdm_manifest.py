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
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise ManifestError(f"manifest {path} cannot be read: {exc}") from exc
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ManifestError(
            f"manifest {path} is not valid JSON ({exc}); fix or restore it — lakefeed left it untouched"
        ) from exc
    if not isinstance(doc, dict):
        raise ManifestError(f"manifest {path} must hold a JSON object; lakefeed left it untouched")
    return doc


def save(path: Path, doc: dict[str, Any]) -> None:
    """Write the whole document to a temporary file beside it, fsync, then rename over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2, ensure_ascii=False)
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
