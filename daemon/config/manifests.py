"""Which lake manifests an entity keeps besides its CDM manifest: multi-storage-client (MSC) manifests of its
landing folder and of its tables' data files, and Kartothek dataset metadata of its table (docs/manifests.md)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import Field, field_validator

from lakefeed.config.base import Frozen


class MscManifest(Frozen):
    """An MSC manifest of one folder: `<folder>/<path>/<version>/msc_manifest_index.json` and its parts."""

    enabled: bool = False
    path: str = Field(default=".msc_manifests", pattern=r"^\.?[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_.-]+)*$",
                      description="The manifest folder, relative to the folder it describes (MSC's manifest_path).")
    retain_versions: int = Field(default=10, ge=1, description="Versions kept; older ones are removed.")
    compact_every: int = Field(default=50, ge=1,
                               description="Every this many versions, the listing is written again in full parts.")
    part_lines: int = Field(default=1000, ge=1,
                            description="Objects per part at most: a removal rewrites the part that listed it.")


class Msc(Frozen):
    landing: MscManifest = Field(default=MscManifest(),
                                 description="The landing folder (or bucket prefix): every object lakefeed took in.")
    tables: MscManifest = Field(default=MscManifest(),
                                description="Each output table: the data files of its current Delta version.")


class Kartothek(Frozen):
    """The entity's table as a Kartothek dataset: store = the table's grandparent folder (lake_dir), dataset uuid =
    its parent (the entity's name), table name = its own name (`table`)."""

    enabled: bool = False
    indices: tuple[str, ...] = Field(default=(), description="Columns to keep secondary (inverted) indices of.")

    @field_validator("indices")
    @classmethod
    def _indexable(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if "partition" in value:
            raise ValueError("a column named 'partition' cannot be indexed (Kartothek's index files use that name)")
        if len(set(value)) != len(value):
            raise ValueError("each column may be indexed once")
        return value


def clashes(entities: Iterable[Any]) -> None:
    """Entities that share a landing folder must keep their landing manifests in folders of their own."""
    seen: dict[str, str] = {}
    for entity in entities:
        if entity.source is not None and entity.msc.landing.enabled:
            folder = str(getattr(entity.source, "path", None) or entity.source.url).rstrip("/")
            where = f"{folder}/{entity.msc.landing.path}"
            if where in seen:
                raise ValueError(f"entities {seen[where]!r} and {entity.name!r} would both write the MSC manifest "
                                 f"{where}: give one of them another msc.landing.path")
            seen[where] = entity.name
