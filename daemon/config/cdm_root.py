"""`cdm_root` entries: one config entry for a whole CDM manifest tree (docs/cdm-discovery.md).

    entities:
      - cdm_root: landing/default.manifest.cdm.json
        defaults: {format: {kind: csv, header: false}}    # every entity found takes these
        overrides: {Orders: {cdc: {strategy: upsert, primary_key: [Id]}}}

Every local entity of the root manifest and of its sub-manifests (recursively) becomes an entity of lakefeed:
named as in CDM, its manifest the document that declares it, its landing folder that document's folder, its
patterns and schema document the manifest's own. Referenced entities are left out: a manifest only borrows
them, and lakefeed writes only what a manifest owns. The tree is read each time the config is loaded, so an
entity added to a manifest later joins at the next reload (SIGHUP).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lakefeed.config import data_manifest, described, synapse

KEY = "cdm_root"


class TreeError(ValueError):
    """A cdm_root entry that cannot be expanded; the message says which file and what to do. `index`: the entry."""

    def __init__(self, message: str, index: int = -1, key: str = KEY, where: str | None = None) -> None:
        super().__init__(message)
        self.index, self.key = index, key
        self.where = where  # `file:line: key` in the described file itself (a data manifest), when known


def expand(entities: list[Any], base_dir: Path) -> tuple[list[Any], list[tuple[int, str | None]], list[Path]]:
    """The entity list with each cdm_root entry replaced by the entities of its tree, and for each resulting
    entry the index of the config entry it came from, with the entity's name if a tree gave it (for error
    lines), and the files read (watched like the config: the data manifests, and the manifests of cdm_root trees,
    whose changes lakefeed made itself are not config changes). Raises TreeError."""
    out: list[Any] = []
    origin: list[tuple[int, str | None]] = []
    files: list[Path] = []
    for i, raw in enumerate(entities):
        key = next((k for k in _EXPANDERS if isinstance(raw, dict) and k in raw), None)
        if key is None:
            out.append(raw)
            origin.append((i, None))
            continue
        try:
            found, read = _EXPANDERS[key](raw, base_dir)
        except ValueError as exc:  # TreeError too
            raise TreeError(str(exc), i, key, getattr(exc, "where", None)) from exc
        except RecursionError as exc:
            raise TreeError("its manifests are nested too deeply to read", i, key) from exc
        out.extend(found)
        origin.extend((i, e["name"]) for e in found)
        files.extend(read)
    return out, origin, files


def config_loc(loc: tuple[Any, ...], origin: list[tuple[int, str | None]]) -> tuple[Any, ...]:
    """An error's place in the config as written: an entity of a cdm_root tree is shown at its cdm_root entry,
    e.g. `entities.0.[Orders].cdc` (the line of that entry)."""
    if loc[:1] != ("entities",) or len(loc) < 2 or not isinstance(loc[1], int) or loc[1] >= len(origin):
        return loc
    written, name = origin[loc[1]]
    return ("entities", written, *((f"[{name}]",) if name is not None else ()), *loc[2:])


def _entities_of(raw: dict[str, Any], base_dir: Path) -> tuple[list[dict[str, Any]], list[Path]]:
    """The entities of a tree, and its manifests (watched: an entity or sub-manifest added by hand joins)."""
    root, defaults, overrides = described.entry(raw, KEY, base_dir)
    found: list[dict[str, Any]] = []
    seen: set[Path] = set()
    for manifest, parents, entity in _local_entities(root, root.parent, seen, ()):
        name = entity["entityName"]
        entry = {**defaults, **(overrides.get(name) or {}), "name": name, "manifest": str(manifest),
                 "cdm_parents": [str(p) for p in parents]}
        entry.setdefault("source", {"type": "local_dir", "path": str(manifest.parent)})
        found.append(entry)
    described.check_overrides(overrides, [e["name"] for e in found], f"the tree of {root}")
    if not found:
        raise TreeError(f"{root} and its sub-manifests declare no local entity")
    return found, sorted(seen)


def _local_entities(path: Path, corpus: Path, seen: set[Path], parents: tuple[Path, ...]):
    """(manifest, the manifests above it nearest first, entity declaration) for each local entity of a manifest
    and its sub-manifests; `corpus`, the root manifest's folder, is where `/…` and `local:/…` paths start."""
    if path in seen:
        return
    seen.add(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise TreeError(f"no manifest at {path}: give cdm_root the path of a *.manifest.cdm.json") from exc
    except (OSError, ValueError) as exc:
        raise TreeError(f"manifest {path} cannot be read: {exc}") from exc
    except RecursionError as exc:
        raise TreeError(f"manifest {path} cannot be read: its JSON is nested too deeply") from exc
    if not isinstance(doc, dict):
        raise TreeError(f"manifest {path} is not a JSON object")
    for key in ("entities", "subManifests"):
        if not isinstance(doc.get(key) or [], list):
            raise TreeError(f"manifest {path}: {key} must be a list, not {type(doc[key]).__name__}")
    for entity in doc.get("entities") or ():
        if isinstance(entity, dict) and entity.get("type") != "ReferencedEntity" and entity.get("entityName"):
            yield path, parents, entity
    for sub in doc.get("subManifests") or ():
        definition = sub.get("definition") if isinstance(sub, dict) else None
        if not isinstance(definition, str):
            continue
        definition = definition.removeprefix("local:")
        if ":" in definition.split("/", 1)[0]:
            continue  # another namespace: nothing here can reach it
        folder = corpus if definition.startswith("/") else path.parent
        yield from _local_entities((folder / definition.lstrip("/")).resolve(), corpus, seen, (path, *parents))


def _data_manifest(raw: dict[str, Any], base_dir: Path) -> tuple[list[dict[str, Any]], list[Path]]:
    return data_manifest.entities_of(raw, base_dir), [described.entry(raw, data_manifest.KEY, base_dir)[0]]


def _synapse(raw: dict[str, Any], base_dir: Path) -> tuple[list[dict[str, Any]], list[Path]]:
    return synapse.entities_of(raw, base_dir), []


_EXPANDERS = {KEY: _entities_of, synapse.KEY: _synapse, data_manifest.KEY: _data_manifest}
