"""How landed files are read: the `format` of an entity."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from lakefeed.config.base import Frozen
from lakefeed.config.data_manifest import TextFileFormat


class CsvFormat(Frozen):
    kind: Literal["csv"] = "csv"
    header: bool = True
    delimiter: str = Field(default=",", min_length=1, max_length=1)
    quote: str = Field(default='"', min_length=1, max_length=1)
    encoding: str = "utf-8"
    null_value: str = ""
    multiline: bool = Field(default=False, description="Quoted values may span lines (parsing is slower).")

    @field_validator("encoding")
    @classmethod
    def _known_encoding(cls, value: str) -> str:
        import codecs

        try:
            codecs.lookup(value)
        except LookupError as exc:
            raise ValueError(f"unknown encoding {value!r}") from exc
        return value


class JsonFormat(Frozen):
    kind: Literal["json", "ndjson"]


class ParquetFormat(Frozen):
    kind: Literal["parquet"]


class ModelJsonFormat(Frozen):
    """Header-less CSV in a folder described by a legacy CDM model.json (Synapse Link): docs/model-json.md."""

    kind: Literal["model_json"]


FileFormat = Annotated[CsvFormat | JsonFormat | ParquetFormat | ModelJsonFormat | TextFileFormat,
                       Field(discriminator="kind")]
