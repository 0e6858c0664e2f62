"""YAML data manifests (seed 001; docs/data-manifests.md): text files described as entities.

    entities:
      - data_manifest: movielens/data.yml     # relative to this config
        defaults: {limits: {max_columns: 100}}
        overrides: {rating: {event_time: {source: column, column: timestamp}}}

The manifest is a list or a map of data sources (a map with `file` or `type` is one source); each `textfile`
source, and each derived entity, becomes an entity of lakefeed named by its entity type. The file is the
entity's whole content, so it is merged as a `snapshot` keyed by `id` (the id column, or the line number when the
file has none): a file that grows adds its new lines, one that is replaced is diffed against what it replaced.
Errors name the manifest's file, line and key.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field

from lakefeed.config import described
from lakefeed.config.base import Frozen

KEY = "data_manifest"
_SOURCE_KEYS = {"type", "file", "format", "delimiter", "entity", "builder", "header", "columns", "ids", "metadata",
                "source_type", "source_attribute", "entity_type"}
# The seed's attribute types (its Java names), and what LensKit's entity types give attributes by default.
TYPES = {"int": "int32", "integer": "int32", "long": "int64", "double": "float64", "real": "float64",
         "string": "string"}
ATTRIBUTE_TYPES = {"id": "int64", "user": "int64", "item": "int64", "rating": "float64", "timestamp": "int64",
                   "count": "int32", "name": "string", "title": "string"}
DEFAULT_COLUMNS = {"rating": ("user", "item", "rating", "timestamp")}
DEFAULT_DERIVED = {"rating": (("user", "user"), ("item", "item"))}  # (attribute, entity type)
_DELIMITERS = {"delimited": "\t", "tsv": "\t", "csv": ","}


class Column(Frozen):
    name: str
    type: Literal["int32", "int64", "float64", "string"] = "string"


class RatingDomain(Frozen):
    minimum: float
    maximum: float
    precision: float | None = Field(default=None, gt=0)


class TextFileFormat(Frozen):
    """A textfile source of a data manifest: delimited lines, one entity per line."""

    kind: Literal["textfile"]
    delimiter: str = Field(default="\t", min_length=1)
    quoted: bool = Field(default=False, description="csv: values may be quoted (\"a,b\").")
    header_lines: int = Field(default=0, ge=0)
    columns: tuple[Column, ...] = ()
    header_labels: tuple[str, ...] | None = Field(default=None, description="Columns by header label, in order.")
    id_from_line: bool = Field(default=False, description="No id column: ids are the data lines' numbers.")
    derive: str | None = Field(default=None, description="A derived entity: the distinct values of this "
                                                         "attribute, as `id`.")
    rating_domain: RatingDomain | None = None
    metadata: dict[str, Any] = Field(default_factory=dict, description="The source's metadata, as written.")
    ids: tuple[str, ...] = Field(default=(), description="Attributes indexed for lookup.")


class ManifestError(ValueError):
    """A data manifest that cannot be taken: `where` is `file:line: key`."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where


def entities_of(raw: dict[str, Any], base_dir: Path) -> list[dict[str, Any]]:
    path, defaults, overrides = described.entry(raw, KEY, base_dir)
    try:
        text = path.read_text(encoding="utf-8")
        node, doc = yaml.compose(text, Loader=yaml.SafeLoader), yaml.safe_load(text)
    except OSError as exc:
        raise ValueError(f"no data manifest at {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ManifestError(f"{path}:{mark.line + 1 if mark else 1}: (yaml)", str(getattr(exc, "problem", exc))) \
            from exc
    found = _Reader(path, node).entities(doc)
    described.check_overrides(overrides, [e["name"] for e in found], str(path))
    return [{**e, **defaults, **(overrides.get(e["name"]) or {})} for e in found]


class _Reader:
    def __init__(self, path: Path, node: yaml.Node | None) -> None:
        self.path, self.node = path, node

    def _where(self, *keys: Any) -> str:
        node, line = self.node, (self.node.start_mark.line + 1 if self.node is not None else 1)
        for key in keys:
            if isinstance(node, yaml.MappingNode):
                pair = next(((k, v) for k, v in node.value if k.value == str(key)), None)
                if pair is None:
                    break
                node, line = pair[1], pair[0].start_mark.line + 1
            elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
                node = node.value[key]
                line = node.start_mark.line + 1
        return f"{self.path}:{line}: {'.'.join(map(str, keys)) or '(root)'}"

    def entities(self, doc: Any) -> list[dict[str, Any]]:
        if isinstance(doc, dict) and ("file" in doc or "type" in doc):
            sources = [((), "0", doc)]
        elif isinstance(doc, dict):
            sources = [((label,), str(label), src) for label, src in doc.items()]
        elif isinstance(doc, list):
            sources = [((i,), str(i), src) for i, src in enumerate(doc)]
        else:
            raise ManifestError(self._where(), "a data manifest is a list or a map of data sources")
        real: dict[str, dict[str, Any]] = {}
        derived: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        for keys, label, src in sources:
            if not isinstance(src, dict):
                raise ManifestError(self._where(*keys), "a data source is a map (file, format, entity, …)")
            unknown = sorted(set(src) - _SOURCE_KEYS)
            if unknown:
                raise ManifestError(self._where(*keys, unknown[0]), f"unknown key {unknown[0]!r}")
            kind = src.get("type", "textfile")
            if kind == "derived":
                derived.append((keys, src))
            elif kind == "textfile":
                entity = self._textfile(keys, label, src)
                if entity["name"] in real:
                    raise ManifestError(self._where(*keys, "entity"), f"a second source of entity "
                                        f"{entity['name']!r}: lakefeed takes one file per entity type")
                real[entity["name"]] = entity
            else:
                raise ManifestError(self._where(*keys, "type"), f"type {kind!r}: textfile and derived are known")
        out = list(real.values())
        wanted: dict[str, tuple[dict[str, Any], str]] = {}  # entity type -> (source entity, attribute)
        for entity in real.values():  # default derivations: a rating gives user and item entities
            for attribute, entity_type in DEFAULT_DERIVED.get(entity["_entity"], ()):
                wanted.setdefault(entity_type, (entity, attribute))
        for keys, src in derived:
            for key in ("source_type", "source_attribute", "entity_type"):
                if not isinstance(src.get(key), str):
                    raise ManifestError(self._where(*keys, key), f"a derived source needs {key}")
            source = next((e for e in real.values() if e["_entity"] == src["source_type"]), None)
            if source is None:
                raise ManifestError(self._where(*keys, "source_type"), f"no textfile source has entity type "
                                    f"{src['source_type']!r}")
            wanted[src["entity_type"]] = (source, src["source_attribute"])
        for entity_type, (source, attribute) in wanted.items():
            if entity_type in real:
                continue  # a real source provides it: the derived one is not used
            if attribute not in [c["name"] for c in source["format"]["columns"]]:
                raise ManifestError(self._where(), f"entity {source['name']!r} has no attribute {attribute!r} to "
                                    f"derive {entity_type!r} from")
            out.append({**source, "name": entity_type, "_entity": entity_type,
                        "format": {**source["format"], "derive": attribute, "id_from_line": False}})
        for entity in out:
            del entity["_entity"]
        return out

    def _textfile(self, keys: tuple[Any, ...], label: str, src: dict[str, Any]) -> dict[str, Any]:
        file = src.get("file")
        if not isinstance(file, str) or not file:
            raise ManifestError(self._where(*keys, "file"), "a textfile source needs file")
        fmt = src.get("format", "delimited")
        if fmt not in _DELIMITERS:
            raise ManifestError(self._where(*keys, "format"), f"format {fmt!r}: delimited, csv or tsv")
        delimiter = src.get("delimiter", _DELIMITERS[fmt]) if fmt == "delimited" else _DELIMITERS[fmt]
        if not isinstance(delimiter, str) or not delimiter:
            raise ManifestError(self._where(*keys, "delimiter"), "delimiter must be a non-empty string")
        header = src.get("header", False)
        if isinstance(header, bool):
            header_lines = int(header)
        elif isinstance(header, int) and header >= 0:
            header_lines = header
        else:
            raise ManifestError(self._where(*keys, "header"), "header is true, false or a count of header lines")
        entity_type = src.get("entity", "rating")
        if not isinstance(entity_type, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", entity_type):
            raise ManifestError(self._where(*keys, "entity"), "entity must be a name (letters, digits, _)")
        builder = src.get("builder")
        if builder is not None and not isinstance(builder, str):
            raise ManifestError(self._where(*keys, "builder"), "builder must be a name (e.g. basic)")
        columns, labels = self._columns(keys, src, entity_type, header_lines)
        ids = src.get("ids")
        if ids is not None and not (isinstance(ids, list) and all(isinstance(i, str) for i in ids)):
            raise ManifestError(self._where(*keys, "ids"), "ids is a list of attribute names")
        names = [c["name"] for c in columns]
        ids = ids if ids is not None else [a for a in ("item", "user") if a in names]
        metadata = src.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise ManifestError(self._where(*keys, "metadata"), "metadata is a map")
        domain = metadata.get("rating") or metadata.get("domain")
        if domain is not None:
            if not (isinstance(domain, dict) and {"minimum", "maximum"} <= set(domain)
                    and all(isinstance(v, int | float) for v in domain.values())):
                raise ManifestError(self._where(*keys, "metadata", "rating" if "rating" in metadata else "domain"),
                                    "a rating domain is a map of numbers: minimum, maximum and precision")
        target = (self.path.parent / file).resolve()
        return {
            "name": entity_type, "_entity": entity_type,
            "source": {"type": "local_dir", "path": str(target.parent)},
            "patterns": [{"name": f"{entity_type}_{label}" if label.isidentifier() else entity_type,
                          "regular_expression": "/" + re.escape(target.name)}],
            "format": {"kind": "textfile", "delimiter": delimiter, "quoted": fmt == "csv",
                       "header_lines": header_lines, "columns": columns, "header_labels": labels,
                       "id_from_line": "id" not in names, "rating_domain": domain, "metadata": metadata,
                       "ids": ids},
            "cdc": {"strategy": "snapshot", "primary_key": ["id"]},
        }

    def _columns(self, keys: tuple[Any, ...], src: dict[str, Any], entity_type: str, header_lines: int
                 ) -> tuple[list[dict[str, str]], list[str] | None]:
        given = src.get("columns")
        if given is None:
            default = DEFAULT_COLUMNS.get(entity_type)
            if default is None:
                raise ManifestError(self._where(*keys), f"entity {entity_type!r} has no default columns: give "
                                    "columns")
            return [self._column(keys, i, name) for i, name in enumerate(default)], None
        if isinstance(given, dict):
            if header_lines != 1:
                raise ManifestError(self._where(*keys, "columns"), "columns by header label need header: true")
            return [self._column(keys, label, d) for label, d in given.items()], [str(k) for k in given]
        if isinstance(given, list):
            return [self._column(keys, i, d) for i, d in enumerate(given)], None
        raise ManifestError(self._where(*keys, "columns"), "columns is a list, or a map from header labels")

    def _column(self, keys: tuple[Any, ...], at: Any, descriptor: Any) -> dict[str, str]:
        where = self._where(*keys, "columns", at)
        if isinstance(descriptor, str):
            name, kind = descriptor, None
        elif isinstance(descriptor, dict) and isinstance(descriptor.get("name"), str):
            name, kind = descriptor["name"], descriptor.get("type")
        else:
            raise ManifestError(where, "a column is a name, or a map with name and type")
        if kind is None:
            return {"name": name, "type": ATTRIBUTE_TYPES.get(name, "string")}
        if not isinstance(kind, str) or kind.lower() not in TYPES:
            raise ManifestError(where, f"type {kind!r}: int/Integer, long/Long, double/real/Double or "
                                "string/String (Java class names are not taken)")
        return {"name": name, "type": TYPES[kind.lower()]}
