"""Reading and atomically writing CDM `*.manifest.cdm.json` documents.

The document is handled as JSON, not through an object model, so every field lakefeed does
not manage (imports, relationships, sub-manifests, traits, unknown keys) is kept verbatim.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from lakefeed import clock
from lakefeed.errors import ManifestError

JSON_SCHEMA_VERSION = "1.0.0"
_writes: Counter[Path] = Counter()
_written: dict[Path, tuple[int, int, int]] = {}  # (inode, mtime, size) of each file as this process last wrote it


def new_manifest(name: str) -> dict[str, Any]:
    return {
        "manifestName": name,
        "jsonSchemaSemanticVersion": JSON_SCHEMA_VERSION,
        "imports": [{"corpusPath": "cdm:/foundations.cdm.json"}],
        "entities": [],
    }


def file_version(path: Path) -> tuple[int, ...] | None:
    """(inode, mtime, ctime, size) of a file: changes when anybody replaces or edits it (None: no file)."""
    try:
        return _version(path.stat())
    except OSError:
        return None


def _version(st: os.stat_result) -> tuple[int, ...]:
    return st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size


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
    except (ValueError, RecursionError) as exc:
        fault = ManifestError(f"manifest {path} is not valid JSON ({exc}); fix or restore it — lakefeed left it "
                              "untouched")
        fault.path, fault.stamp = path, _version(st)
        raise fault from exc
    except ManifestError as fault:
        fault.path, fault.stamp = path, _version(st)
        raise


def _checked(path: Path, doc: Any) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise ManifestError(f"manifest {path} must hold a JSON object; lakefeed left it untouched")
    if (fault := shape_fault(doc)) is not None:
        raise ManifestError(f"manifest {path}: {fault}; fix it — lakefeed left it untouched")
    return doc


_LISTS = ("dataPartitionPatterns", "incrementalPartitionPatterns", "dataPartitions", "incrementalPartitions")
_TEXTS = ("entityName", "entityPath", "location", "rootLocation", "regularExpression", "globPattern")
_TIMES = ("lastFileStatusCheckTime", "lastFileModifiedTime", "lastChildFileModifiedTime")


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
    subs = [(sub, f"/subManifests/{i}") for i, sub in enumerate(doc.get("subManifests") or ())]
    for item, where in [(doc, ""), *subs]:
        if fault := _time_fault(item, where):
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
            if fault := _time_fault(item, where):
                return fault
    return None


def _time_fault(item: dict[str, Any], where: str) -> str | None:
    """The first of an object's file status times that is not an ISO 8601 time lakefeed can compare, or None."""
    for key in _TIMES:
        value = item.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            return f"{where}/{key} must be a string, not {type(value).__name__}"
        try:
            clock.from_cdm(value)
        except ValueError:
            return f"{where}/{key} must be an ISO 8601 time such as 2024-01-31T12:00:00.000Z, not {value!r}"
    return None


def dumps(doc: dict[str, Any], compact: bool = False) -> str:
    """A document's JSON text. `compact`: without indentation, which json serializes in C (large manifests: a
    fraction of the time and size)."""
    return json.dumps(doc, ensure_ascii=False, **({"separators": (",", ":")} if compact else {"indent": 2}))


def save(path: Path, doc: dict[str, Any], compact: bool = False) -> None:
    """Write the whole document atomically."""
    save_text(path, dumps(doc, compact))


def writes(path: Path) -> int:
    """How many times this process has written the file: a copy parsed before the last write is stale, even when
    the new file has the old one's size and time (two writes within one tick of the file system's clock)."""
    return _writes[path.resolve()]


def written_here(path: Path) -> bool:
    """Whether the file is as this process last wrote it (a change it made itself, not somebody else's edit)."""
    resolved = path.resolve()
    try:
        st = resolved.stat()
    except OSError:
        return False
    return _written.get(resolved) == (st.st_ino, st.st_mtime_ns, st.st_size)


def save_text(path: Path, text: str) -> None:
    """Write a document's JSON text to a temporary file beside it, fsync, then rename over it."""
    _writes[path.resolve()] += 1  # before the rename: a reader that parses between the two sees a count it lacks
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    # Not mkstemp's 0600: the manifest is read by whoever reads the lake. A new one gets the umask's mode, a
    # rewritten one keeps the mode it had.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            with contextlib.suppress(FileNotFoundError):
                os.fchmod(f.fileno(), stat.S_IMODE(os.stat(path).st_mode))
            f.write(text)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
            st = os.fstat(f.fileno())
        # Known before the rename: a watcher told of it may ask at once (the rename moves the change time only).
        _written[path.resolve()] = st.st_ino, st.st_mtime_ns, st.st_size
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
