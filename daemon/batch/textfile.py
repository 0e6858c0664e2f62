"""The lines of a data manifest's textfile source (seed 001): delimited text, one entity per line.

Header lines are skipped (with `header: true` the header's labels place the columns); a line's cells are taken
by position, cells past the described columns are ignored (a file may hold more than its manifest describes), a
line with fewer cells than the columns goes to quarantine. Without an id column, each line's id is its line
number in the file, so a file that grows keeps the ids of the lines it had. The source's entity builder then
rejects the rows it cannot build (LensKit's RatingBuilder: no user, item or rating, or a rating outside the
domain).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pyarrow as pa

from lakefeed.batch.joda import ARROW
from lakefeed.config.data_manifest import RATING_REQUIRED, RatingDomain, TextFile


def schema(fmt: TextFile) -> pa.Schema:
    """The source's attributes typed as the manifest says (`id` first when lines give it)."""
    fields = [pa.field(c.name, ARROW[c.type]) for c in fmt.columns]
    return pa.schema([pa.field("id", pa.int64()), *fields] if fmt.id_from_line else fields)


def read_rows(path: Path, fmt: TextFile) -> tuple[pa.Table, list[int], list[tuple[int | None, str, str]]]:
    """The lines as text columns, the line number of each, and (line, reason, raw) for lines that cannot be
    placed (line None: the whole file)."""
    names = [c.name for c in fmt.columns]
    cells: list[list[str | None]] = [[] for _ in names]
    lines: list[int] = []
    bad: list[tuple[int | None, str, str]] = []
    with open(path, encoding="utf-8", newline="") as f:
        positions = list(range(len(names)))
        for number, raw in enumerate(f, start=1):
            text = raw.rstrip("\r\n")
            if number <= fmt.header_lines:
                if number == 1 and fmt.header_labels is not None:
                    labels = _split(text, fmt)
                    missing = [label for label in fmt.header_labels if label not in labels]
                    if missing:
                        return _empty(names), [], [(None, f"the header has no column {missing[0]!r} (it has "
                                                          f"{', '.join(labels)})", text)]
                    positions = [labels.index(label) for label in fmt.header_labels]
                continue
            if not text.strip():
                continue
            row = _split(text, fmt)
            if len(row) <= max(positions, default=-1):
                bad.append((number, f"{len(row)} cells, but the data manifest describes {len(names)} columns",
                            text))
                continue
            for column, at in zip(cells, positions, strict=True):
                value = row[at]
                column.append(value if value != "" else None)
            lines.append(number)
    table = pa.table({n: pa.array(c, pa.string()) for n, c in zip(names, cells, strict=True)})
    if fmt.id_from_line:
        table = table.add_column(0, "id", pa.array(lines, pa.int64()))
    return table, lines, bad


def _split(text: str, fmt: TextFile) -> list[str]:
    if fmt.quoted:
        return next(csv.reader([text], delimiter=fmt.delimiter), [])
    return text.split(fmt.delimiter)


def _empty(names: list[str]) -> pa.Table:
    return pa.table({n: pa.array([], pa.string()) for n in names})


def derived(table: pa.Table, attribute: str) -> pa.Table:
    """A derived entity: each distinct value of the attribute once, as `id`, in order of first appearance."""
    values = [v for v in dict.fromkeys(table.column(attribute).to_pylist()) if v is not None]
    return pa.table({"id": pa.array(values, table.schema.field(attribute).type)})


def rejected(table: pa.Table, fmt: TextFile, domain: RatingDomain | None) -> dict[int, tuple[str, str]]:
    """Row index -> (attribute, why) for the rows the source's entity builder cannot build. The rating builder
    needs a user, an item and a rating that is a number, within the entity's domain (minimum, maximum,
    precision); the basic builder takes every row."""
    if fmt.builder == "basic":
        return {}
    out: dict[int, tuple[str, str]] = {}
    for name in RATING_REQUIRED:
        for i, value in enumerate(table.column(name).to_pylist()):
            if value is None:
                out.setdefault(i, (name, f"a rating needs {', '.join(RATING_REQUIRED)}: {name!r} is empty"))
            elif name == "rating" and value != value:
                out.setdefault(i, (name, "rating is not a number (NaN)"))
    if domain is None:
        return out
    for i, value in enumerate(table.column("rating").to_pylist()):
        if i in out:
            continue
        if not domain.minimum <= value <= domain.maximum:
            out[i] = ("rating", f"rating {value:g} is outside the domain [{domain.minimum:g}, {domain.maximum:g}]")
        elif domain.precision and abs((steps := (value - domain.minimum) / domain.precision) - round(steps)) > 1e-6:
            out[i] = ("rating", f"rating {value:g} is not a multiple of the domain's precision {domain.precision:g}")
    return out
