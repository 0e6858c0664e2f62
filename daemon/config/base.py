"""What every part of the config model shares: frozen models and paths resolved against the config's folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo

CENTURY_S = 100 * 365 * 86400.0  # the longest duration a setting takes: longer ones overflow the clocks' waits


def _resolve(value: Path, info: ValidationInfo) -> Path:
    base = (info.context or {}).get("base_dir")
    if base is not None and not value.is_absolute():
        return (Path(base) / value).resolve()
    return value


ResolvedPath = Annotated[Path, AfterValidator(_resolve)]


def _location(value: object, info: ValidationInfo) -> object:
    """An `s3://bucket/key` URL stays a string; anything else is a path resolved like ResolvedPath."""
    if isinstance(value, str) and value.startswith("s3://"):
        if not value.removeprefix("s3://").split("/", 1)[0]:
            raise ValueError(f"{value!r} names no bucket")
        return value.rstrip("/")
    if isinstance(value, str | Path):
        return _resolve(Path(value), info)
    return value


# Where an output lives: a local folder (Path) or an object-store URL (str, `s3://bucket/prefix`).
Location = Annotated[Path | str, BeforeValidator(_location)]


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


Name = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$", max_length=64)]
