"""What every part of the config model shares: frozen models and paths resolved against the config's folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo


def _resolve(value: Path, info: ValidationInfo) -> Path:
    base = (info.context or {}).get("base_dir")
    if base is not None and not value.is_absolute():
        return (Path(base) / value).resolve()
    return value


ResolvedPath = Annotated[Path, AfterValidator(_resolve)]


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


Name = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$", max_length=64)]
