"""The delta-rs sink's answer to "is this batch in?" (`committed_version`) against the table's log read afresh,
whoever commits in between, and without replaying the log for each question after its own commits; and its table
object, loaded afresh once it is RELOAD_AFTER versions past its load (bench/delta_state.py measures why)."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakefeed.batch.cdc import KIND, MergePlan
from lakefeed.connectors.sinks import data_files, delta_rs
from lakefeed.connectors.sinks.delta_rs import DeltaRsSink

ROWS = pa.table({"k": pa.array([1, 2], pa.int64()), "v": ["x", "y"]})
PLAN = MergePlan(keys=("k",), sequence=(), compare=("v",), snapshot=False, insert_updates_of_absent=True)
STEPS = ("append", "files", "merge", "other_same_app", "other_app", "no_app")


def _step(step: str, sink: DeltaRsSink, other: DeltaRsSink, uri: str, version: int) -> None:
    if step == "append":
        sink.append(ROWS, "a", version, {})
    elif step == "files":
        files = data_files.write(pafs.LocalFileSystem(), uri, ROWS, f"part-t-b{version}-r0")
        sink.commit_files(files, ROWS.schema, "a", version, {})
    elif step == "merge":
        source = ROWS.append_column(KIND, pa.array(["upsert"] * ROWS.num_rows))
        sink.merge(source.set_column(1, "v", pa.array([f"m{version}"] * ROWS.num_rows)), PLAN, "a", version, {})
    elif step == "other_same_app":  # another writer with the same app id (a later life, a second process)
        other.append(ROWS, "a", version, {})
    elif step == "other_app":
        other.append(ROWS, "b", version, {})
    else:  # a commit of no app at all
        write_deltalake(uri, ROWS, mode="append", commit_properties=CommitProperties(custom_metadata={"x": "y"}))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.sampled_from(STEPS), min_size=1, max_size=8), reload_after=st.sampled_from((1, 2, 100)))
def test_committed_version_matches_the_log_read_afresh_after_any_commits(tmp_path_factory, monkeypatch, steps,
                                                                          reload_after):
    monkeypatch.setattr(delta_rs, "RELOAD_AFTER", reload_after)
    uri = str(tmp_path_factory.mktemp("table"))
    write_deltalake(uri, ROWS, commit_properties=CommitProperties(app_transactions=[Transaction("a", 0)]))
    sink, other = DeltaRsSink(uri), DeltaRsSink(uri)
    assert sink.committed_version("a") == 0
    for version, step in enumerate(steps, start=1):
        _step(step, sink, other, uri, version)
        fresh = DeltaTable(uri)
        for app in ("a", "b"):
            assert sink.committed_version(app) == fresh.transaction_version(app), (step, app)
        assert sink.version() == fresh.version()
        assert sink.paths() == set(fresh.get_add_actions(flatten=True).column("path").to_pylist())


def test_its_own_commits_are_known_without_replaying_the_log(tmp_path, monkeypatch):
    """A batch's checks after the sink's own commits (appends, task files, merges) read no commit of the log
    again: delta-rs's `transaction_version` replays every commit since the last checkpoint (on S3, a GET each)."""
    uri = str(tmp_path / "table")
    sink = DeltaRsSink(uri)
    sink.append(ROWS, "a", 0, {})  # creates the table
    replays = []
    real = DeltaTable.transaction_version
    monkeypatch.setattr(DeltaTable, "transaction_version",
                        lambda self, app_id: replays.append(app_id) or real(self, app_id))
    for version, step in zip(range(1, 31), itertools.cycle(("append", "files", "merge")), strict=False):
        assert sink.committed_version("a") == version - 1
        _step(step, sink, sink, uri, version)
        assert sink.committed_version("a") == version
    assert replays == ["a"]  # once: the first question, before any commit of this sink was seen
    write_deltalake(uri, ROWS, mode="append")  # someone else's commit: the log is read again, once
    assert sink.committed_version("a") == 30 and sink.committed_version("a") == 30
    assert replays == ["a", "a"]


def test_its_table_is_loaded_afresh_once_far_past_its_load(tmp_path, monkeypatch):
    """delta-rs keeps every commit brought into a table object as a piece of state of its own: once the sink's
    object is RELOAD_AFTER versions past its load, the table's version is checkpointed and loaded afresh from it,
    and the sink answers the same across the change."""
    loads = []

    class Counted(DeltaTable):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            loads.append(args[0])  # loaded: the load before the table exists fails

    monkeypatch.setattr(delta_rs, "RELOAD_AFTER", 5)
    monkeypatch.setattr(delta_rs, "DeltaTable", Counted)
    uri = str(tmp_path / "table")
    sink = DeltaRsSink(uri)
    sink.append(ROWS, "a", 0, {})
    for version in range(1, 13):
        _step(("append", "files", "merge")[version % 3], sink, sink, uri, version)
        assert sink.committed_version("a") == version
    fresh = DeltaTable(uri)
    assert fresh.version() in (12, 13)  # 12 batches, one more when a merge's empty table is made first
    assert loads == [uri] * 3  # about versions 0, 5 and 10: every commit through one of three table objects
    checkpoints = sorted(p.name for p in (tmp_path / "table" / "_delta_log").glob("*.checkpoint.parquet"))
    assert len(checkpoints) == 2 and int(checkpoints[-1].split(".")[0]) >= 10  # where the second and third began
    assert sink.version() == fresh.version() and sink.schema() == pa.schema(fresh.schema().to_arrow())
