"""YAML data manifests (seed 001) on a MovieLens-shaped data set generated here: every key of the seed."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import yaml
from deltalake import DeltaTable

from lakefeed.batch.read import read_file
from lakefeed.config import model as config
from lakefeed.config.data_manifest import TextFileFormat
from lakefeed.errors import ConfigError
from tests.conftest import wait_for, write_config

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
    rating, movie, tag = found["rating"].format, found["movie"].format, found["tag"].format
    assert isinstance(rating, TextFileFormat) and rating.delimiter == "\t" and rating.header_lines == 0
    assert [(c.name, c.type) for c in rating.columns] == [("user", "int64"), ("item", "int64"),
                                                          ("rating", "float64"), ("timestamp", "int64")]
    assert rating.id_from_line and rating.rating_domain.precision == 1 and rating.ids == ("item", "user")
    assert (movie.delimiter, movie.header_lines, movie.id_from_line) == ("|", 2, False)
    assert [(c.name, c.type) for c in movie.columns] == [("id", "int64"), ("title", "string"), ("year", "int32"),
                                                         ("votes", "int64"), ("score", "float64")]
    assert tag.quoted and tag.header_labels == ("tag", "movieId") and tag.ids == ("item",)
    assert found["user"].format.derive == "user" and found["item"].format.derive == "item"
    assert all(e.cdc.strategy == "snapshot" and e.cdc.primary_key == ("id",) for e in cfg.entities)
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
    ("r:\n  file: u.data\n  columns:\n    - user\n    - {name: at, type: java.time.Instant}\n", 5,
     "r.columns.1: type 'java.time.Instant'"),
    ("r:\n  file: u.data\n  colour: red\n", 3, "r.colour: unknown key 'colour'"),
    ("r:\n  file: u.data\n  columns: {a: user}\n", 3, "r.columns: columns by header label need header: true"),
    ("a: {file: x}\nb:\n  file: y\n  entity: rating\n", 4, "b.entity: a second source of entity 'rating'"),
    ("a: {file: x}\nd:\n  type: derived\n  source_type: purchase\n  source_attribute: user\n  entity_type: user\n",
     4, "d.source_type: no textfile source has entity type 'purchase'"),
    ("r:\n  file: u.data\n  header: maybe\n", 3, "r.header: header is true, false or a count"),
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
    daemon = Daemon(path, tmp_path / "daemon.log")
    try:
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
        assert {r["id"] for r in _rows(lake / "user" / "table")} == {1, 2, 3, 4, 5, 6, 7, 8, 9}
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
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(60) == 0
    finally:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.proc.kill()
    assert yaml.safe_load((folder / "data.yml").read_text())["genres"]["entity"] == "genre"
