"""What the config entries that describe entities elsewhere share (`cdm_root`, `synapse_root`, `data_manifest`):
the path they name, and `defaults` (for every entity found) and `overrides` (by entity name)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def entry(raw: dict[str, Any], key: str, base_dir: Path, extra: tuple[str, ...] = ()
          ) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """(the path the entry names, resolved from the config's folder, defaults, overrides); ValueError saying what
    to fix."""
    allowed = {key, "defaults", "overrides", *extra}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)} beside {key}: use {', '.join(sorted(allowed - {key}))}")
    defaults, overrides = raw.get("defaults") or {}, raw.get("overrides") or {}
    if not isinstance(defaults, dict) or not isinstance(overrides, dict):
        raise ValueError("defaults and overrides must be mappings")
    path = Path(str(raw[key]))
    return (path if path.is_absolute() else base_dir / path).resolve(), defaults, overrides


def check_overrides(overrides: dict[str, Any], names: list[str], where: str) -> None:
    """Every override must name an entity found; `where` says what was read."""
    missing = sorted(set(overrides) - set(names))
    if missing:
        raise ValueError(f"overrides name entities {where} does not describe: {', '.join(missing)}")
