"""What the config takes from an entity's CDM schema document: the key, when the config names none.

A CDM entity marks the attributes that identify a row with `purpose: identifiedBy`; a keyed
entity without `cdc.primary_key` takes them. The document is the one the manifest declares for
the entity (`entityPath`), else the one lakefeed declares when it adds the entity to the
manifest (`<name>.cdm.json`, beside the manifest).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

KEY_PURPOSE = "identifiedBy"


def with_document_key(data: Any, base_dir: Path | str | None) -> Any:
    """An entity's raw config, its `cdc.primary_key` taken from its schema document if it is keyed and names
    none (relative paths are resolved against `base_dir`, the config file's folder)."""
    cdc = data.get("cdc") if isinstance(data, dict) else None
    if not isinstance(cdc, dict) or cdc.get("primary_key") or cdc.get("strategy", "append") == "append":
        return data
    manifest, name = data.get("manifest"), data.get("name")
    if not isinstance(manifest, str | Path) or not isinstance(name, str):
        return data  # validation reports what is missing
    keys = identified_by(Path(base_dir or ".") / manifest, name)
    return {**data, "cdc": {**cdc, "primary_key": list(keys)}} if keys else data


def identified_by(manifest: Path, entity: str) -> tuple[str, ...]:
    """The attributes the entity's schema document marks `purpose: identifiedBy`, in document order; () when
    the document is not there (yet), does not define the entity or marks none."""
    document = _read(_document_of(manifest, entity))
    for definition in document.get("definitions") or ():
        if isinstance(definition, dict) and definition.get("entityName") == entity:
            return tuple(a["name"] for a in attributes(definition.get("hasAttributes") or ())
                         if _purpose(a) == KEY_PURPOSE)
    return ()


def attributes(items: Any) -> list[dict[str, Any]]:
    """An entity definition's attributes, those of attribute groups included, in document order."""
    out = []
    for item in items:
        if isinstance(item, dict) and "name" in item:
            out.append(item)
        elif isinstance(item, dict) and isinstance(item.get("attributeGroupReference"), dict):
            out.extend(attributes(item["attributeGroupReference"].get("members") or ()))
    return out


def _purpose(attribute: dict[str, Any]) -> Any:
    """`purpose` is written as a name or as a reference object (`{"purposeReference": name, …}`)."""
    purpose = attribute.get("purpose")
    return purpose.get("purposeReference") if isinstance(purpose, dict) else purpose


def _document_of(manifest: Path, entity: str) -> Path:
    declared = next((e for e in _read(manifest).get("entities") or ()
                     if isinstance(e, dict) and e.get("entityName") == entity), {})
    path = str(declared.get("entityPath") or declared.get("entitySchema") or f"{entity}.cdm.json/{entity}")
    document = path.split(".cdm.json", 1)[0] + ".cdm.json"
    return manifest.parent / document.removeprefix("local:").removeprefix("./").lstrip("/")


def _read(path: Path) -> dict[str, Any]:
    """A JSON document, or {} when it cannot be read: the config then asks for what it would have given."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return document if isinstance(document, dict) else {}
