"""YAML data manifests (seed 001; docs/data-manifests.md): text files described as entities.

    entities:
      - data_manifest: movielens/data.yml     # relative to this config
        defaults: {limits: {max_columns: 100}}
        overrides: {rating: {event_time: {source: column, column: timestamp}}}

The manifest is a list or a map of data sources (a map with `file` or `type` is one source); the `textfile`
sources of one entity type, and each derived entity, become an entity of lakefeed named by its entity type. Each
file is the whole content of its part of the entity, so the entity is merged as a `snapshot` scoped by `file`
(the file's path below the entity's folder) and keyed by `file` and `id` (the id column, or the line number when
the file has none): a file that grows adds its new lines, one that is replaced is diffed against what it
replaced, and the other files' rows stay as they are. Errors name the manifest's file, line and key.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field

from lakefeed.config import described, java_types
from lakefeed.config.base import Frozen
from lakefeed.config.java_types import ColumnType

KEY = "data_manifest"
SCOPE = "file"  # the column holding each row's file, below the entity's folder: the snapshot's scope, in the key
_SOURCE_KEYS = {"type", "file", "format", "delimiter", "entity", "builder", "header", "columns", "ids", "metadata",
                "source_type", "source_attribute", "entity_type"}
# What LensKit's entity types give attributes by default.
ATTRIBUTE_TYPES: dict[str, ColumnType] = {"id": "int64", "user": "int64", "item": "int64", "rating": "float64",
                                          "timestamp": "int64", "count": "int32", "name": "string",
                                          "title": "string"}
DEFAULT_COLUMNS = {"rating": ("user", "item", "rating", "timestamp")}
DEFAULT_DERIVED = {"rating": (("user", "user"), ("item", "item"))}  # (attribute, entity type)
_DELIMITERS = {"delimited": "\t", "tsv": "\t", "csv": ","}
# Entity builders by the names LensKit takes (`basic`, or a class name), and each entity type's default.
BUILDERS: dict[str, Literal["basic", "rating"]] = {
    "basic": "basic", "org.lenskit.data.entities.BasicEntityBuilder": "basic",
    "org.lenskit.data.ratings.RatingBuilder": "rating"}
DEFAULT_BUILDER: dict[str, Literal["basic", "rating"]] = {"rating": "rating"}
# LensKit's RatingBuilder: the attributes it takes, with their types, and those a rating must have.
RATING_ATTRIBUTES = {"id": "int64", "user": "int64", "item": "int64", "rating": "float64", "timestamp": "int64"}
RATING_REQUIRED = ("user", "item", "rating")


class Column(Frozen):
    name: str
    type: ColumnType = "string"


class RatingDomain(Frozen):
    minimum: float
    maximum: float
    precision: float | None = Field(default=None, gt=0)


class TextFile(Frozen):
    """One textfile source of a data manifest: how its delimited lines, one entity per line, hold attributes."""

    path: Path = Field(description="The file it reads.")
    delimiter: str = Field(default="\t", min_length=1)
    quoted: bool = Field(default=False, description="csv: values may be quoted (\"a,b\").")
    header_lines: int = Field(default=0, ge=0)
    columns: tuple[Column, ...] = ()
    header_labels: tuple[str, ...] | None = Field(default=None, description="Columns by header label, in order.")
    id_from_line: bool = Field(default=False, description="No id column: ids are the data lines' numbers.")
    builder: Literal["basic", "rating"] = Field(default="basic", description="rating (LensKit's RatingBuilder): "
                                                "user, item and rating required, ratings checked against the "
                                                "domain; basic: the columns as they are.")


class TextFileFormat(Frozen):
    """The textfile sources of one entity type of a data manifest (or those a derived entity takes ids from)."""

    kind: Literal["textfile"]
    files: tuple[TextFile, ...] = Field(min_length=1)
    derive: str | None = Field(default=None, description="A derived entity: the distinct values of this "
                                                         "attribute in every file, as `id`.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="The sources' metadata, merged in manifest "
                                     "order (a key two sources give takes the later's value).")
    rating_domain: RatingDomain | None = Field(default=None, description="The domain of the entity's ratings: the "
                                               "last source's that gives one, as LensKit's preference domain.")
    ids: tuple[str, ...] = Field(default=(), description="Attributes indexed for lookup.")

    def source(self, path: Path) -> TextFile:
        """The source that reads `path` (the only one, when there is one); ValueError when none does."""
        found = next((f for f in self.files if f.path == path), None)
        if found is None and len(self.files) == 1:
            return self.files[0]
        if found is None:
            raise ValueError(f"{path} is none of the data manifest's files of this entity")
        return found


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


@dataclass
class _Source:
    """A textfile source as read from the manifest, before the sources of its entity type are put together."""

    keys: tuple[Any, ...]
    label: str
    entity: str
    layout: dict[str, Any]
    metadata: dict[str, Any]
    ids: list[str]
    domain: dict[str, Any] | None

    @property
    def types(self) -> dict[str, str]:
        return {c["name"]: c["type"] for c in self.layout["columns"]}


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
        textfiles: dict[str, list[_Source]] = {}  # entity type -> its sources, in manifest order
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
                source = self._textfile(keys, label, src)
                self._joins(textfiles.setdefault(source.entity, []), source)
                textfiles[source.entity].append(source)
            else:
                raise ManifestError(self._where(*keys, "type"), f"type {kind!r}: textfile and derived are known")
        real = {entity_type: _entity(entity_type, found) for entity_type, found in textfiles.items()}
        wanted: dict[str, tuple[str, str]] = {}  # entity type -> (source entity type, attribute)
        for entity_type in real:  # default derivations: ratings give user and item entities
            for attribute, derived_type in DEFAULT_DERIVED.get(entity_type, ()):
                wanted.setdefault(derived_type, (entity_type, attribute))
        for keys, src in derived:
            for key in ("source_type", "source_attribute", "entity_type"):
                if not isinstance(src.get(key), str):
                    raise ManifestError(self._where(*keys, key), f"a derived source needs {key}")
            if src["source_type"] not in real:
                raise ManifestError(self._where(*keys, "source_type"), f"no textfile source has entity type "
                                    f"{src['source_type']!r}")
            wanted[src["entity_type"]] = (src["source_type"], src["source_attribute"])
        out = list(real.values())
        for entity_type, (source_type, attribute) in wanted.items():
            if entity_type in real:
                continue  # a real source provides it: the derived one is not used
            having = [s for s in textfiles[source_type] if attribute in s.types]
            if not having:
                raise ManifestError(self._where(), f"entity {source_type!r} has no attribute {attribute!r} to "
                                    f"derive {entity_type!r} from")
            out.append(_derived(entity_type, attribute, real[source_type], having))
        return out

    def _joins(self, others: list[_Source], source: _Source) -> None:
        """A source may join the others of its entity type: another file, and the same type for each attribute
        (the entity's table has one column per attribute)."""
        for other in others:
            if other.layout["path"] == source.layout["path"]:
                raise ManifestError(self._where(*source.keys, "file"), f"source {other.label!r} reads this file "
                                    f"as entity {source.entity!r} already")
            for name, kind in source.types.items():
                if other.types.get(name, kind) != kind:
                    raise ManifestError(self._where(*source.keys, "columns"), f"attribute {name!r} is "
                                        f"{kind} here but {other.types[name]} in source {other.label!r}: the files "
                                        f"of entity {source.entity!r} share its table, give them one type")

    def _textfile(self, keys: tuple[Any, ...], label: str, src: dict[str, Any]) -> _Source:
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
        columns, labels = self._columns(keys, src, entity_type, header_lines)
        builder = self._builder(keys, src, entity_type, columns, labels)
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
        layout = {"path": (self.path.parent / file).resolve(), "delimiter": delimiter, "quoted": fmt == "csv",
                  "header_lines": header_lines, "columns": columns, "header_labels": labels,
                  "id_from_line": "id" not in names, "builder": builder}
        return _Source(keys, label, entity_type, layout, metadata, ids, domain)

    def _builder(self, keys: tuple[Any, ...], src: dict[str, Any], entity_type: str, columns: list[dict[str, str]],
                 labels: list[str] | None) -> Literal["basic", "rating"]:
        """The source's entity builder; LensKit's RatingBuilder takes the rating attributes only, typed as it
        holds them, and needs user, item and rating."""
        name = src.get("builder")
        if name is None:
            builder = DEFAULT_BUILDER.get(entity_type, "basic")
        elif isinstance(name, str) and name in BUILDERS:
            builder = BUILDERS[name]
        else:
            raise ManifestError(self._where(*keys, "builder"), f"builder {name!r}: {', '.join(BUILDERS)} (no JVM "
                                "runs here: other builder classes cannot be loaded)")
        if builder == "basic":
            return builder
        if entity_type != "rating":
            raise ManifestError(self._where(*keys, "builder"), f"the rating builder builds rating entities, not "
                                f"{entity_type!r}: use builder: basic")
        for i, column in enumerate(columns):
            where = self._where(*keys, "columns", labels[i] if labels is not None else i)
            expected = RATING_ATTRIBUTES.get(column["name"])
            if expected is None:
                raise ManifestError(where, f"the rating builder takes {', '.join(RATING_ATTRIBUTES)}, not "
                                    f"{column['name']!r}: give builder: basic to keep other attributes")
            if column["type"] != expected:
                java = "double (Double)" if expected == "float64" else "long (Long)"
                raise ManifestError(where, f"the rating builder holds {column['name']!r} as a {java}: give it that "
                                    "type (or none), or builder: basic")
        missing = [a for a in RATING_REQUIRED if a not in [c["name"] for c in columns]]
        if missing:
            raise ManifestError(self._where(*keys, "columns"), f"the rating builder needs attributes "
                                f"{', '.join(RATING_REQUIRED)}: {', '.join(missing)} missing (builder: basic takes "
                                "the columns as they are)")
        return builder

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
        if name == SCOPE:
            raise ManifestError(where, f"attribute {SCOPE!r}: lakefeed keeps each row's file in the column "
                                f"{SCOPE!r}; name the attribute otherwise")
        if kind is None:
            return {"name": name, "type": ATTRIBUTE_TYPES.get(name, "string")}
        column_type = java_types.column_type(kind) if isinstance(kind, str) else None
        if column_type is None:
            raise ManifestError(where, f"type {kind!r} is not one lakefeed converts: {java_types.known()}")
        return {"name": name, "type": column_type}


def _entity(entity_type: str, sources: list[_Source]) -> dict[str, Any]:
    """The entity of an entity type's textfile sources: each file a snapshot of the rows scoped by its `file`."""
    root = Path(os.path.commonpath([s.layout["path"].parent for s in sources]))
    metadata: dict[str, Any] = {}
    for s in sources:
        metadata.update(s.metadata)
    return {
        "name": entity_type,
        "source": {"type": "local_dir", "path": str(root)},
        "patterns": _patterns(entity_type, sources, root, scoped=True),
        "format": {"kind": "textfile", "files": [s.layout for s in sources], "metadata": metadata,
                   "rating_domain": next((s.domain for s in reversed(sources) if s.domain is not None), None),
                   "ids": list(dict.fromkeys(i for s in sources for i in s.ids))},
        "cdc": {"strategy": "snapshot", "primary_key": [SCOPE, "id"], "snapshot_scope": SCOPE},
    }


def _derived(entity_type: str, attribute: str, source: dict[str, Any], having: list[_Source]) -> dict[str, Any]:
    """A derived entity: the distinct values of an attribute in every file of its source type that has it. Any
    of those files landing makes the whole state again, so it is merged as an unscoped snapshot keyed by `id`."""
    root = Path(source["source"]["path"])
    return {**source, "name": entity_type, "patterns": _patterns(entity_type, having, root, scoped=False),
            "format": {**source["format"], "files": [s.layout for s in having], "derive": attribute},
            "cdc": {"strategy": "snapshot", "primary_key": ["id"]}}


def _patterns(entity_type: str, sources: list[_Source], root: Path, scoped: bool) -> list[dict[str, Any]]:
    """A pattern for each file, by its path below the entity's folder; `scoped`: captured as the `file` column."""
    out = []
    for s in sources:
        name = f"{entity_type}_{s.label}" if s.label.isidentifier() or len(sources) > 1 else entity_type
        relative = re.escape(s.layout["path"].relative_to(root).as_posix())
        out.append({"name": name, "regular_expression": f"/({relative})", "parameters": [SCOPE]} if scoped
                   else {"name": name, "regular_expression": f"/{relative}"})
    return out
