"""YAML data manifests (seed 001) on a MovieLens-shaped data set generated here: every key of the seed."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from deltalake import DeltaTable

from lakefeed.batch.read import read_file
from lakefeed.config import model as config
from lakefeed.config.data_manifest import TextFileFormat
from lakefeed.errors import ConfigError
from tests.conftest import land, wait_for, write_config

MANIFEST = """\
ratings:                          # labelled by map keys
  file: u.data                    # textfile, delimited by a tab, no header, entity rating: its default columns
  metadata:
    domain: {minimum: 1, maximum: 5, precision: 1}
movies:
  type: textfile
  file: u.item
  format: delimited
  delimiter: "|"
  header: 2                       # two header lines
  entity: movie
  builder: basic
  columns:
    - id
    - {name: title, type: String}
    - {name: year, type: Integer}
    - {name: votes, type: Long}
    - {name: score, type: real}
tags:
  file: tags.csv
  format: csv
  header: true
  entity: tag
  columns:                        # by header label
    tag: {name: label, type: string}
    movieId: {name: item, type: long}
  ids: [item]
users:
  type: derived
  source_type: rating
  source_attribute: user
  entity_type: user
"""


def _movielens(folder: Path, ratings: int = 30) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [f"{1 + i % 7}\t{100 + i % 5}\t{1 + i % 5}\t{881250000 + i}" for i in range(ratings)]
    lines[4] = "3\t101\t9\t881250004"  # outside the domain
    lines[6] = "3\t101\t2.5\t881250006"  # not a multiple of the precision
    (folder / "u.data").write_text("\n".join(lines) + "\n")
    (folder / "u.item").write_text("movie id|title|year|votes|score|unused\n--|--|--|--|--|--\n"
                                   + "".join(f"{100 + i}|Movie {i}|{1990 + i}|{i * 1000}|{i / 2}|x\n"
                                             for i in range(5)))
    (folder / "tags.csv").write_text('tag,movieId\n"funny, dark",100\nclassic,101\n')
    (folder / "data.yml").write_text(MANIFEST)


def test_every_key_of_the_seed_becomes_an_entity_setting(tmp_path):
    _movielens(tmp_path / "ml")
    cfg = config.load(write_config(tmp_path, [{"data_manifest": "ml/data.yml",
                                               "overrides": {"movie": {"limits": {"max_columns": 50}}}}]))
    found = {e.name: e for e in cfg.entities}
    assert set(found) == {"rating", "movie", "tag", "user", "item"}  # item: the rating's default derivation
    assert isinstance(found["rating"].format, TextFileFormat)
    (rating,), (movie,), (tag,) = (found[name].format.files for name in ("rating", "movie", "tag"))
    assert rating.path == tmp_path / "ml" / "u.data" and rating.delimiter == "\t" and rating.header_lines == 0
    assert [(c.name, c.type) for c in rating.columns] == [("user", "int64"), ("item", "int64"),
                                                          ("rating", "float64"), ("timestamp", "int64")]
    assert rating.id_from_line and found["rating"].format.rating_domain.precision == 1
    assert found["rating"].format.ids == ("item", "user")
    assert (movie.delimiter, movie.header_lines, movie.id_from_line) == ("|", 2, False)
    assert [(c.name, c.type) for c in movie.columns] == [("id", "int64"), ("title", "string"), ("year", "int32"),
                                                         ("votes", "int64"), ("score", "float64")]
    assert tag.quoted and tag.header_labels == ("tag", "movieId") and found["tag"].format.ids == ("item",)
    assert (rating.builder, movie.builder, tag.builder) == ("rating", "basic", "basic")  # the entity type's default
    assert found["user"].format.derive == "user" and found["item"].format.derive == "item"
    real, derived = [found[n] for n in ("rating", "movie", "tag")], [found[n] for n in ("user", "item")]
    assert all(e.cdc.strategy == "snapshot" and e.cdc.primary_key == ("file", "id") and e.cdc.snapshot_scope == "file"
               for e in real)
    assert all(e.cdc.primary_key == ("id",) and e.cdc.snapshot_scope is None for e in derived)
    assert [(p.regular_expression, p.parameters) for p in found["rating"].patterns] == [(r"/(u\.data)", ("file",))]
    assert found["movie"].limits.max_columns == 50 and found["rating"].source.path == tmp_path / "ml"
    assert cfg.described_by == (tmp_path / "ml" / "data.yml",)


def test_a_list_manifest_is_labelled_by_position_and_a_real_source_beats_a_derived_one(tmp_path):
    folder = tmp_path / "ml"
    folder.mkdir()
    (folder / "data.yml").write_text(
        "- {file: r.tsv, format: tsv, columns: [user, item, {name: rating, type: Double}]}\n"
        "- {file: users.txt, entity: user, columns: [id, {name: age, type: int}]}\n")
    cfg = config.load(write_config(tmp_path, [{"data_manifest": "ml/data.yml"}]))
    found = {e.name: e for e in cfg.entities}
    assert set(found) == {"rating", "user", "item"}
    assert found["user"].format.derive is None and found["item"].format.derive == "item"
    (folder / "single.yml").write_text("file: r.tsv\nformat: tsv\ncolumns: [user, item, rating]\n")  # one source
    assert [e.name for e in config.load(write_config(tmp_path, [{"data_manifest": "ml/single.yml"}])).entities] \
        == ["rating", "user", "item"]


@pytest.mark.parametrize(("text", "line", "expected"), [
    ("r:\n  file: u.data\n  entity: event\n  columns:\n    - user\n    - {name: at, type: java.time.Year}\n", 6,
     "r.columns.1: type 'java.time.Year' is not one lakefeed converts: int/Integer"),
    ("r:\n  file: u.data\n  entity: event\n  columns:\n    - {name: at, type: java.time.instant}\n", 5,
     "java.time.{Instant,LocalDate,LocalDateTime,OffsetDateTime,ZonedDateTime,Duration}, java.util.UUID"),
    ("r:\n  file: u.data\n  colour: red\n", 3, "r.colour: unknown key 'colour'"),
    ("r:\n  file: u.data\n  columns: {a: user}\n", 3, "r.columns: columns by header label need header: true"),
    ("a: {file: x}\nb:\n  file: x\n", 3, "b.file: source 'a' reads this file as entity 'rating' already"),
    ("a: {file: x, entity: tag, columns: [id, label]}\nb:\n  file: y\n  entity: tag\n"
     "  columns: [id, {name: label, type: int}]\n", 5,
     "b.columns: attribute 'label' is int32 here but string in source 'a': the files of entity 'tag' share"),
    ("a: {file: x}\nd:\n  type: derived\n  source_type: purchase\n  source_attribute: user\n  entity_type: user\n",
     4, "d.source_type: no textfile source has entity type 'purchase'"),
    ("r:\n  file: u.data\n  header: maybe\n", 3, "r.header: header is true, false or a count"),
    ("r:\n  file: u.data\n  builder: org.example.MyBuilder\n", 3, "r.builder: builder 'org.example.MyBuilder': "
     "basic, org.lenskit.data.entities.BasicEntityBuilder, org.lenskit.data.ratings.RatingBuilder (no JVM runs here"),
    ("r:\n  file: u.data\n  builder: [basic]\n", 3, "r.builder: builder ['basic']: basic,"),
    ("m:\n  file: m.txt\n  entity: movie\n  builder: org.lenskit.data.ratings.RatingBuilder\n  columns: [id]\n", 4,
     "m.builder: the rating builder builds rating entities, not 'movie': use builder: basic"),
    ("r:\n  file: r.tsv\n  columns: [user, item]\n", 3,
     "r.columns: the rating builder needs attributes user, item, rating: rating missing"),
    ("r:\n  file: r.tsv\n  columns:\n    - user\n    - item\n    - rating\n    - comment\n", 7,
     "r.columns.3: the rating builder takes id, user, item, rating, timestamp, not 'comment': give builder: basic"),
    ("r:\n  file: r.tsv\n  columns:\n    - user\n    - {name: item, type: int}\n", 5,
     "r.columns.1: the rating builder holds 'item' as a long (Long)"),
    ("r:\n  file: r.tsv\n  entity: doc\n  columns: [id, file]\n", 4,
     "r.columns.1: attribute 'file': lakefeed keeps each row's file in the column 'file'"),
])
def test_errors_point_at_the_data_manifest_s_line(tmp_path, text, line, expected):
    (tmp_path / "data.yml").write_text(text)
    with pytest.raises(ConfigError) as caught:
        config.load(write_config(tmp_path, [{"data_manifest": "data.yml"}]))
    (problem,) = caught.value.problems
    assert problem.startswith(f"{tmp_path / 'data.yml'}:{line}: ") and expected in problem, problem


def test_lines_are_read_by_position_with_ids_from_line_numbers_and_ratings_checked(tmp_path):
    _movielens(tmp_path / "ml", ratings=10)
    with open(tmp_path / "ml" / "u.data", "a") as f:
        f.write("5\t100\n")  # too few cells
    found = {e.name: e for e in config.load(write_config(tmp_path, [{"data_manifest": "ml/data.yml"}])).entities}
    read = read_file(tmp_path / "ml" / "u.data", found["rating"].format, None)
    rows = read.table.to_pylist()
    assert [r["id"] for r in rows] == [1, 2, 3, 4, 6, 8, 9, 10]  # line numbers: lines 5, 7 and 11 are bad
    assert rows[0] == {"id": 1, "user": 1, "item": 100, "rating": 1.0, "timestamp": 881250000}
    assert sorted((b.line, b.reason) for b in read.bad) == [
        (5, "rating 9 is outside the domain [1, 5]"), (7, "rating 2.5 is not a multiple of the domain's precision 1"),
        (11, "2 cells, but the data manifest describes 4 columns")]
    movies = read_file(tmp_path / "ml" / "u.item", found["movie"].format, None).table.to_pylist()
    assert movies[1] == {"id": 101, "title": "Movie 1", "year": 1991, "votes": 1000, "score": 0.5}
    tags = read_file(tmp_path / "ml" / "tags.csv", found["tag"].format, None).table.to_pylist()
    assert tags == [{"id": 2, "label": "funny, dark", "item": 100}, {"id": 3, "label": "classic", "item": 101}]
    users = read_file(tmp_path / "ml" / "u.data", found["user"].format, None).table
    assert users.column("id").to_pylist() == [1, 2, 3, 4, 6]  # distinct, in order of appearance, good lines only


def _rows(uri: Path) -> list[dict]:
    try:
        return DeltaTable(str(uri)).to_pyarrow_table().to_pylist()
    except Exception:
        return []


def test_the_daemon_keeps_the_entities_of_a_data_manifest_current(tmp_path):
    from tests.test_daemon_process import Daemon

    folder = tmp_path / "ml"
    _movielens(folder)
    path = write_config(tmp_path, [{"data_manifest": "ml/data.yml"}])
    lake = tmp_path / "lake"
    with Daemon(path, tmp_path / "daemon.log") as daemon:
        daemon.start()
        wait_for(lambda: len(_rows(lake / "rating" / "table")) == 28 and len(_rows(lake / "movie" / "table")) == 5
                 and len(_rows(lake / "user" / "table")) == 7 and len(_rows(lake / "item" / "table")) == 5
                 and len(_rows(lake / "tag" / "table")) == 2, 120, 0.5, "every entity")
        commits = DeltaTable(str(lake / "rating" / "table")).history()
        kept = next(json.loads(c["lakefeed.data_manifest"]) for c in commits if "lakefeed.data_manifest" in c)
        assert kept == {"metadata": {"domain": {"minimum": 1, "maximum": 5, "precision": 1}}, "ids": ["item", "user"]}
        quarantined = [r["reason"] for r in _rows(lake / "rating" / "quarantine")]
        assert sorted(quarantined) == ["rating 2.5 is not a multiple of the domain's precision 1",
                                       "rating 9 is outside the domain [1, 5]"]
        # The ratings file grows: its new lines are added, the old ones keep their ids.
        before = {r["id"]: r for r in _rows(lake / "rating" / "table")}
        with open(folder / "u.data", "a") as f:
            f.write("8\t104\t5\t881260000\n9\t104\t4\t881260001\n")
        wait_for(lambda: len(_rows(lake / "rating" / "table")) == 30, 60, 0.5, "the grown file")
        after = {r["id"]: r for r in _rows(lake / "rating" / "table")}
        assert {k: after[k] for k in before} == before and after[31]["user"] == 8
        # The users entity reads the same file in a batch of its own, which may come a moment later.
        wait_for(lambda: {r["id"] for r in _rows(lake / "user" / "table")} == {1, 2, 3, 4, 5, 6, 7, 8, 9}, 60, 0.5,
                 "the users of the grown file")
        # The movies file is replaced: a movie gone, one renamed.
        (folder / "u.item.tmp").write_text("h\n--\n100|Movie 0|1990|0|0|x\n101|Renamed|1991|1000|0.5|x\n")
        (folder / "u.item.tmp").replace(folder / "u.item")
        wait_for(lambda: sorted((r["id"], r["title"]) for r in _rows(lake / "movie" / "table")) == [
            (100, "Movie 0"), (101, "Renamed")], 60, 0.5, "the replaced file")
        # The manifest is watched: a new source joins without a restart.
        (folder / "genres.txt").write_text("1\tComedy\n2\tDrama\n")
        with open(folder / "data.yml", "a") as f:
            f.write("genres: {file: genres.txt, entity: genre, columns: [id, name]}\n")
        wait_for(lambda: sorted(r["name"] for r in _rows(lake / "genre" / "table")) == ["Comedy", "Drama"], 90,
                 0.5, "the entity the manifest gained")
        assert daemon.events("reload.applied") >= 1
        daemon.stop(60)
    assert yaml.safe_load((folder / "data.yml").read_text())["genres"]["entity"] == "genre"


JAVA_COLUMNS = [  # (attribute, its Java class, a good cell, the value read)
    ("small", "java.lang.Short", "-12", -12), ("tiny", "java.lang.Byte", "7", 7),
    ("ratio", "java.lang.Float", "1.5", 1.5), ("flag", "java.lang.Boolean", "TRUE", True),
    ("initial", "java.lang.Character", "é", "é"),
    ("price", "java.math.BigDecimal", "-12.50", Decimal("-12.5")),
    ("big", "java.math.BigInteger", "123456789012345678901234567890", Decimal("123456789012345678901234567890")),
    ("at", "java.time.Instant", "2007-12-03T10:15:30.123456789Z", datetime(2007, 12, 3, 10, 15, 30, 123456, UTC)),
    ("day", "java.time.LocalDate", "2024-02-29", date(2024, 2, 29)),
    ("local", "java.time.LocalDateTime", "2024-01-01T10:15", datetime(2024, 1, 1, 10, 15, tzinfo=UTC)),
    ("offset", "java.time.OffsetDateTime", "2024-01-01T10:00:00+02:00", datetime(2024, 1, 1, 8, tzinfo=UTC)),
    ("zoned", "java.time.ZonedDateTime", "2024-07-01T10:00+02:00[Europe/Paris]", datetime(2024, 7, 1, 8, tzinfo=UTC)),
    ("took", "java.time.Duration", "-PT1M30.5S", -90_500_000_000),
    ("uid", "java.util.UUID", "123E4567-E89B-12D3-A456-426614174000", "123e4567-e89b-12d3-a456-426614174000"),
    ("count", "java.lang.Integer", "42", 42), ("total", "java.lang.Long", "9000000000", 9_000_000_000),
    ("score", "java.lang.Double", "1.0E10", 1e10), ("label", "java.lang.String", "x|y", "x|y"),
]
HOSTILE_CELLS = [  # (attribute, a cell that does not convert, what the reason says)
    ("small", "70000", "'70000' is not a valid int16"), ("ratio", "abc", "'abc' is not a valid float"),
    ("flag", "yes", "'yes' is not a java.lang.Boolean: a Boolean is 'true' or 'false'"),
    ("initial", "ab", "'ab' is not a java.lang.Character: a Character is one UTF-16 character"),
    ("initial", "😀", "a Character is one UTF-16 character"),
    ("price", "1.2.3", "'1.2.3' is not a java.math.BigDecimal"),
    ("price", "0.0000000000000000001", "does not fit the column's decimal(38, 18)"),
    ("price", "1E+20", "does not fit the column's decimal(38, 18)"),
    ("big", "1" * 39, "does not fit the column's decimal(38, 0)"), ("big", "1.0", "not a BigInteger"),
    ("at", "2024-01-01 10:00:00Z", "not ISO-8601 as its class parses it (e.g. 2007-12-03T10:15:30.00Z)"),
    ("at", "2024-01-01T10:00Z", "is not a java.time.Instant"),  # Instant.parse needs the seconds
    ("day", "2024-02-30", "'2024-02-30' is not a java.time.LocalDate: day is out of range for month"),
    ("day", "20240131", "is not a java.time.LocalDate"), ("day", "٢٠٢٤-01-31", "is not a java.time.LocalDate"),
    ("local", "2024-01-01T24:00", "is not a java.time.LocalDateTime"),
    ("offset", "2024-01-01T10:00", "is not a java.time.OffsetDateTime"),
    ("offset", "2024-01-01T10:00+19:00", "offset +19:00 is beyond ±18:00"),
    ("zoned", "2024-01-01T10:00+01:00[Mars/Olympus]", "unknown time zone 'Mars/Olympus'"),
    ("zoned", "2024-01-01T10:00+01:00[../../etc/passwd]", "unknown time zone"),
    ("took", "PT", "not an ISO-8601 duration"), ("took", "P1Y", "not an ISO-8601 duration"),
    ("took", "PT9999999999999S", "does not fit the column's int64 nanoseconds"),
    ("uid", "123e4567-e89b-12d3-a456-4266141740001", "is not a java.util.UUID"),
    ("uid", "{123e4567-e89b-12d3-a456-426614174000}", "is not a java.util.UUID"),
]


def _java_typed(folder: Path, cells: list[list[str]]) -> TextFileFormat:
    folder.mkdir(parents=True, exist_ok=True)
    columns = "".join(f"    - {{name: {name}, type: {java}}}\n" for name, java, _, _ in JAVA_COLUMNS)
    (folder / "data.yml").write_text(f"events:\n  file: events.tsv\n  entity: event\n  columns:\n{columns}")
    (folder / "events.tsv").write_text("".join("\t".join(line) + "\n" for line in cells))
    (entity,) = config.load(write_config(folder, [{"data_manifest": "data.yml"}])).entities
    return entity.format


def test_java_class_types_are_converted_as_joda_convert_does_and_bad_cells_go_to_quarantine(tmp_path):
    good = [cell for _, _, cell, _ in JAVA_COLUMNS]
    names = [name for name, _, _, _ in JAVA_COLUMNS]
    lines = [good, ["" for _ in good[:-1]] + ["n"]]  # the values, then a line of empty cells (nulls) but the last
    for name, cell, _ in HOSTILE_CELLS:
        lines.append([cell if n == name else g for n, g in zip(names, good, strict=True)])
    fmt = _java_typed(tmp_path, lines)
    read = read_file(tmp_path / "events.tsv", fmt, None)
    rows = read.table.to_pylist()
    assert rows[0] == {"id": 1, **{name: value for name, _, _, value in JAVA_COLUMNS}}
    assert rows[1] == {"id": 2, **dict.fromkeys(names), "label": "n"} and len(rows) == 2
    types = {f.name: str(f.type) for f in read.table.schema}
    assert [types[n] for n in ("price", "big", "at", "day", "took", "tiny", "flag")] == [
        "decimal128(38, 18)", "decimal128(38, 0)", "timestamp[us, tz=UTC]", "date32[day]", "int64", "int8", "bool"]
    bad = sorted((b.line, b.field, b.reason) for b in read.bad)
    assert [(line, field) for line, field, _ in bad] == [(i + 3, name) for i, (name, _, _) in enumerate(HOSTILE_CELLS)]
    for (_, _, reason), (name, cell, says) in zip(bad, HOSTILE_CELLS, strict=True):
        assert reason.startswith(f"column {name!r}:") and says in reason, (cell, reason)
    assert json.loads(next(b.raw for b in read.bad if b.line == 3))["small"] == "70000"  # the cells as written


def test_java_typed_rows_reach_the_delta_table(tmp_path):
    from tests.test_pipeline import _batch, _prepared

    _java_typed(tmp_path / "ml", [[cell for _, _, cell, _ in JAVA_COLUMNS]])
    (entity,) = config.load(write_config(tmp_path, [{"data_manifest": "ml/data.yml"}])).entities
    cfg, pipeline, inbox = _prepared(entity)
    pipeline.process(_batch(inbox, tmp_path / "ml" / "events.tsv"), 0)
    (row,) = _rows(cfg.table)
    assert row == {"file": "events.tsv", "id": 1, **{name: value for name, _, _, value in JAVA_COLUMNS}}


def test_the_rating_builder_rejects_what_it_cannot_build_and_the_basic_builder_keeps_the_rows(tmp_path):
    for name in ("r.tsv", "k.tsv"):  # the same lines, for each builder
        (tmp_path / name).write_text("1\t10\t4\n\t11\t3\n2\t\t5\n3\t12\t\n4\t13\tNaN\n5\t14\t7\n")
    (tmp_path / "data.yml").write_text(
        "rated:\n  file: r.tsv\n  columns: [user, item, rating]\n  metadata: {domain: {minimum: 1, maximum: 5}}\n"
        "kept:\n  file: k.tsv\n  entity: rating\n  builder: basic\n  columns: [user, item, rating]\n"
        "  metadata: {domain: {minimum: 1, maximum: 5}}\n")
    found = {e.name: e for e in config.load(write_config(tmp_path, [{"data_manifest": "data.yml"}])).entities}
    rated, kept = found["rating"].format.files
    assert (rated.builder, kept.builder) == ("rating", "basic") and found["rating"].format.rating_domain.maximum == 5
    read = read_file(tmp_path / "r.tsv", found["rating"].format, None)
    assert [r["id"] for r in read.table.to_pylist()] == [1]
    assert sorted((b.line, b.field, b.reason) for b in read.bad) == [
        (2, "user", "a rating needs user, item, rating: 'user' is empty"),
        (3, "item", "a rating needs user, item, rating: 'item' is empty"),
        (4, "rating", "a rating needs user, item, rating: 'rating' is empty"),
        (5, "rating", "rating is not a number (NaN)"),
        (6, "rating", "rating 7 is outside the domain [1, 5]")]
    assert json.loads(next(b.raw for b in read.bad if b.line == 2)) == {"id": "2", "user": None, "item": "11",
                                                                        "rating": "3.0"}
    rows = read_file(tmp_path / "k.tsv", found["rating"].format, None).table.to_pylist()  # as their columns
    assert [(r["user"], r["item"], r["rating"]) for r in rows][1:3] == [(None, 11, 3.0), (2, None, 5.0)]
    assert len(rows) == 6 and rows[5]["rating"] == 7.0


TWO_RATING_FILES = """\
old:
  file: ratings-2019.tsv
  metadata: {domain: {minimum: 1, maximum: 5}}
new:                              # another folder, another format: the same entity type
  file: more/ratings.csv
  format: csv
  header: true
  columns: {u: user, i: item, r: rating}
movies:
  file: movies.txt
  entity: movie
  columns: [id, title]
more_movies:
  file: more/movies.txt
  entity: movie
  columns: [id, title]
"""


def _by_key(uri: Path, *columns: str) -> dict:
    return {(r["file"], r["id"]): tuple(r[c] for c in columns) for r in _rows(uri)}


def _ops(uri: Path, batch_id: int) -> set:
    return {(r["op"], r["file"], r["id"]) for r in _rows(uri) if r["batch_id"] == batch_id}


def test_two_files_of_one_entity_type_each_replace_only_their_own_rows(tmp_path):
    from tests.test_pipeline import _batch, _prepared

    folder = tmp_path / "ml"
    (folder / "more").mkdir(parents=True)
    (folder / "data.yml").write_text(TWO_RATING_FILES)
    old, new = folder / "ratings-2019.tsv", folder / "more" / "ratings.csv"
    land(old, "1\t10\t4\t100\n2\t11\t5\t101\n")
    land(new, "u,i,r\n1,10,3\n3,12,2\n4,13,\n5,14,7\n")  # line 4: no rating; 5: outside old's domain
    land(folder / "movies.txt", "10\tHeat\n11\tAlien\n")
    land(folder / "more" / "movies.txt", "10\tHeat (1995)\n12\tBrazil\n")
    found = {e.name: e for e in config.load(write_config(tmp_path, [{"data_manifest": "ml/data.yml"}])).entities}
    assert found["rating"].source.path == folder and found["user"].format.files == found["rating"].format.files
    (rating, ratings, rating_inbox), (user, users, user_inbox) = _prepared(found["rating"]), _prepared(found["user"])
    ratings.process(_batch(rating_inbox, old, new), 0)
    assert _by_key(rating.table, "user", "item", "rating") == {
        ("ratings-2019.tsv", 1): (1, 10, 4.0), ("ratings-2019.tsv", 2): (2, 11, 5.0),
        ("more/ratings.csv", 2): (1, 10, 3.0), ("more/ratings.csv", 3): (3, 12, 2.0)}  # line numbers of each file
    assert sorted((r["source_file"], r["line"], r["reason"]) for r in _rows(rating.quarantine)) == [
        ("/more/ratings.csv", 4, "a rating needs user, item, rating: 'rating' is empty"),
        ("/more/ratings.csv", 5, "rating 7 is outside the domain [1, 5]")]  # the entity's domain, for every file
    users.process(_batch(user_inbox, old), 0)  # one file landed: the users of both
    assert sorted(r["id"] for r in _rows(user.table)) == [1, 2, 3]

    # One file grows while the other is replaced (a rating changed, a line gone), in one batch.
    land(old, "1\t10\t4\t100\n2\t11\t5\t101\n5\t14\t3\t102\n")
    land(new, "u,i,r\n1,10,4\n")
    ratings.process(_batch(rating_inbox, old, new), 1)
    assert _by_key(rating.table, "user", "rating") == {
        ("ratings-2019.tsv", 1): (1, 4.0), ("ratings-2019.tsv", 2): (2, 5.0), ("ratings-2019.tsv", 3): (5, 3.0),
        ("more/ratings.csv", 2): (1, 4.0)}
    assert _ops(rating.changelog, 1) == {(0, "ratings-2019.tsv", 3), (2, "more/ratings.csv", 2),
                                         (3, "more/ratings.csv", 2), (1, "more/ratings.csv", 3)}
    users.process(_batch(user_inbox, new), 1)
    assert sorted(r["id"] for r in _rows(user.table)) == [1, 2, 5]  # 3 was only in the replaced file

    # The replaced file empties: its rows are retracted, the other file's stay untouched.
    land(new, "u,i,r\n")
    ratings.process(_batch(rating_inbox, new), 2)
    assert set(_by_key(rating.table)) == {("ratings-2019.tsv", 1), ("ratings-2019.tsv", 2), ("ratings-2019.tsv", 3)}
    assert _ops(rating.changelog, 2) == {(1, "more/ratings.csv", 2)}

    # Ids from an id column: id 10 in both movie files is one movie described twice, a row for each file.
    movie, movies, movie_inbox = _prepared(found["movie"])
    movies.process(_batch(movie_inbox, folder / "movies.txt", folder / "more" / "movies.txt"), 0)
    assert _by_key(movie.table, "title") == {("movies.txt", 10): ("Heat",), ("movies.txt", 11): ("Alien",),
                                             ("more/movies.txt", 10): ("Heat (1995)",),
                                             ("more/movies.txt", 12): ("Brazil",)}


def test_the_daemon_keeps_two_rating_files_apart_across_a_replacement(tmp_path):
    from tests.test_daemon_process import Daemon

    folder = tmp_path / "ml"
    folder.mkdir()
    (folder / "data.yml").write_text("a: {file: a.tsv}\nb: {file: b.tsv}\n")  # two rating files, default columns
    land(folder / "a.tsv", "1\t10\t4\t1\n2\t11\t3\t2\n")
    land(folder / "b.tsv", "3\t10\t5\t3\n4\t12\t2\t4\n")
    lake = tmp_path / "lake"
    daemon = Daemon(write_config(tmp_path, [{"data_manifest": "ml/data.yml"}]), tmp_path / "daemon.log")

    def ids(entity: str) -> set:
        return {r["id"] for r in _rows(lake / entity / "table")}

    with daemon:
        daemon.start()
        wait_for(lambda: _by_key(lake / "rating" / "table", "user", "rating") == {
            ("a.tsv", 1): (1, 4.0), ("a.tsv", 2): (2, 3.0), ("b.tsv", 1): (3, 5.0), ("b.tsv", 2): (4, 2.0)}
            and ids("user") == {1, 2, 3, 4} and ids("item") == {10, 11, 12}, 120, 0.5, "both files")
        # b is replaced (a rating changed, a line gone) while a grows.
        land(folder / "b.tsv", "3\t10\t1\t3\n")
        with open(folder / "a.tsv", "a") as f:
            f.write("5\t13\t5\t5\n")
        wait_for(lambda: _by_key(lake / "rating" / "table", "user", "rating") == {
            ("a.tsv", 1): (1, 4.0), ("a.tsv", 2): (2, 3.0), ("a.tsv", 3): (5, 5.0), ("b.tsv", 1): (3, 1.0)}
            and ids("user") == {1, 2, 3, 5} and ids("item") == {10, 11, 13}, 90, 0.5, "the replacement and the growth")

        def ops() -> dict:
            found: dict = {}
            for r in sorted(_rows(lake / "rating" / "changelog"), key=lambda r: r["offset"]):
                found.setdefault((r["file"], r["id"]), []).append(r["op"])
            return found

        # A keyed batch commits its table before its changelog, so the changelog may trail the table for a moment.
        expected = {("a.tsv", 1): [0], ("a.tsv", 2): [0], ("a.tsv", 3): [0], ("b.tsv", 1): [0, 2, 3],
                    ("b.tsv", 2): [0, 1]}  # a's rows never touched by b's replacement
        wait_for(lambda: ops() == expected, 60, 0.5, f"the changelog's ops to become {expected}")
        daemon.stop(60)
