"""Compaction and vacuum of an entity's tables between batches (daemon/pipeline/compaction.py): the files stay few,
every row stays, the changelog is compacted only once the ODF chain holds all of it (its slices stay in the dataset,
and a chain rebuilt from the compacted files is whole), the manifests list the compacted files, the vacuum deletes
only what the table stopped using, and a crash or a failure of the compaction loses nothing."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable
from structlog.testing import capture_logs

from lakefeed import failpoints
from lakefeed.config import model as config
from lakefeed.inbox.files import FileEvent
from lakefeed.pipeline.verify import verify
from tests.conftest import entity_yaml, land, write_config
from tests.test_pipeline import _pipeline, _prepared


def _lake(tmp_path, every: int, retain_hours: int | None = 168, **entity):
    doc = entity_yaml(compaction={"every": every, "vacuum_retain_hours": retain_hours},
                      msc={"tables": {"enabled": True}}, kartothek={"enabled": True}, **entity)
    return _prepared(config.load(write_config(tmp_path, [doc])).entities[0])


def _land(cfg, inbox, n: int, rows: int = 3):
    body = "id,amount\n" + "".join(f"{n * 100 + i},{i}.5\n" for i in range(rows))
    return inbox.offer([FileEvent.of(land(cfg.source.path / "sales" / f"f{n:03d}.csv", body))])


def _files(uri) -> int:
    return len(DeltaTable(str(uri)).file_uris())


def _ids(uri) -> list[int]:
    return sorted(DeltaTable(str(uri)).to_pyarrow_table().column("id").to_pylist())


def _compactions(uri) -> list[int]:
    return sorted(c["version"] for c in DeltaTable(str(uri)).history() if c.get("operation") == "OPTIMIZE")


def test_an_append_table_is_compacted_every_few_commits_and_keeps_every_row(tmp_path):
    cfg, pipeline, inbox = _lake(tmp_path, every=4)
    with capture_logs() as logs:
        for n in range(10):
            result = pipeline.process(_land(cfg, inbox, n), n)
            assert _files(cfg.table) <= 4  # never more files than commits between compactions
            assert "compaction" in result.stages
    assert _ids(cfg.table) == sorted(n * 100 + i for n in range(10) for i in range(3))
    # Commits 0-3 (the table's creation is version 0), then 5-8: two compactions, each right after its fourth.
    assert _compactions(cfg.table) == _compactions(cfg.changelog) == [4, 9]  # the changelog after the ODF chain
    compacted = [(e["table"], e["files_removed"], e["files_added"]) for e in logs if e["event"] == "table.compacted"]
    # The second takes the first's file along: it is smaller than the target too.
    assert compacted == [("table", 4, 1), ("changelog", 4, 1), ("table", 5, 1), ("changelog", 5, 1)]
    assert verify(cfg) == []  # the changelog replays to the table; the MSC and Kartothek manifests list its files
    assert len(_stored(cfg.table)) == 10 + 2  # the replaced files stay for a week (vacuum_retain_hours: 168)
    assert _slices(cfg) == [(n * 3, n * 3 + 2) for n in range(10)]  # one a batch, as committed
    assert _files(cfg.changelog) == 3 and len(list((cfg.odf / "data").iterdir())) == 10


def _stored(uri) -> list:
    return [p for p in uri.rglob("*.parquet") if not any(part.startswith(("_", ".")) for part in p.parts[-2:])]


def _slices(cfg) -> list[tuple[int, int]]:
    """The offsets of each data slice the entity's ODF chain holds."""
    from tests.test_odf_chain import _chain

    return [(b.event.new_data.start, b.event.new_data.end) for _, b in _chain(cfg) if b.event_kind == "AddData"]


def test_the_vacuum_deletes_the_files_a_compaction_replaced_once_they_are_old_enough(tmp_path):
    cfg, pipeline, inbox = _lake(tmp_path, every=3, retain_hours=0)
    with capture_logs() as logs:
        for n in range(7):
            pipeline.process(_land(cfg, inbox, n), n)
    assert _compactions(cfg.table) == [3, 9]  # each vacuum that deletes files is two commits (its start and end)
    assert len(_stored(cfg.table)) == _files(cfg.table) == 2  # the compacted file and the newest batch's
    assert [e["files_removed"] for e in logs if e["event"] == "table.compacted" and e["table"] == "table"] == [3, 4]
    assert _ids(cfg.table) == sorted(n * 100 + i for n in range(7) for i in range(3))
    assert _compactions(cfg.changelog) == [3, 9] and len(_stored(cfg.changelog)) == _files(cfg.changelog) == 2
    assert len(list((cfg.odf / "data").iterdir())) == 7  # the slices: links of their own to the deleted files
    assert verify(cfg) == []  # the MSC manifest in the table's folder (.msc_manifests) is still there, and right;
    # the chain's slices hash as recorded and are the changelog's rows
    with pytest.raises(FileNotFoundError):  # time travel before the vacuum: its files are gone
        DeltaTable(str(cfg.table), version=1).to_pyarrow_table()


def test_files_of_an_evolved_schema_are_compacted_with_the_columns_they_lack_as_nulls(tmp_path):
    cfg, pipeline, inbox = _lake(tmp_path, every=3)
    pipeline.process(_land(cfg, inbox, 0), 0)
    later = land(cfg.source.path / "sales" / "g.csv", "id,amount,note\n7,7.5,seven\n")  # a column more
    pipeline.process(inbox.offer([FileEvent.of(later)]), 1)
    pipeline.process(_land(cfg, inbox, 2), 2)
    # Batch 1 made two commits (its new column, then its files), so the table was due after it; the compactor counts
    # a commit a batch between its reads, though, and found it due a batch later, with batch 2's file to take along.
    assert _compactions(cfg.table) == [4] and _files(cfg.table) == 1
    notes = {r["id"]: r["note"] for r in DeltaTable(str(cfg.table)).to_pyarrow_table().to_pylist()}
    assert notes == {0: None, 1: None, 2: None, 7: "seven", 200: None, 201: None, 202: None}
    assert verify(cfg) == []


def test_commits_since_the_last_compaction_are_counted_across_a_restart(tmp_path):
    cfg, pipeline, inbox = _lake(tmp_path, every=3)
    for n in range(5):  # versions 0-2, a compaction (3), then 4 and 5
        pipeline.process(_land(cfg, inbox, n), n)
    assert _compactions(cfg.table) == [3]
    fresh = _pipeline(cfg)  # a restart: it finds the compaction in the log and counts on from it
    fresh.process(_land(cfg, inbox, 5), 5)
    assert _compactions(cfg.table) == [3, 7]
    again = _pipeline(cfg)
    again.process(_land(cfg, inbox, 6), 6)
    assert _compactions(cfg.table) == [3, 7]  # one commit since the last: not due
    assert _ids(cfg.table) == sorted(n * 100 + i for n in range(7) for i in range(3))


def test_every_zero_never_compacts(tmp_path):
    cfg, pipeline, inbox = _lake(tmp_path, every=0)
    for n in range(4):
        pipeline.process(_land(cfg, inbox, n), n)
    assert _compactions(cfg.table) == [] and _files(cfg.table) == 4


def test_a_table_s_version_is_read_only_when_it_may_be_due(tmp_path, monkeypatch):
    """Reading a version lists the table's log: a LIST on S3, and for a quarantine no bad row has made yet a
    failed load. The compactor reads one only once enough batches have gone by for the table to be due."""
    cfg, pipeline, inbox = _lake(tmp_path, every=5)
    reads = []
    read = pipeline.sinks.quarantine.version  # nothing but the compactor asks the quarantine for its version
    monkeypatch.setattr(pipeline.sinks.quarantine, "version", lambda: reads.append(1) or read())
    for n in range(12):
        pipeline.process(_land(cfg, inbox, n), n)
    assert not cfg.quarantine.exists() and len(reads) == 3  # at batches 0, 5 and 10
    # The table: four commits short at batch 0, so next read at batch 4 (due: versions 0-4), then at 9 (6-10).
    assert _compactions(cfg.table) == [5, 11]


def test_the_changelog_waits_for_the_odf_chain_to_hold_all_of_it(tmp_path, monkeypatch):
    """A chain behind the changelog (its refresh deferred, or stopped at a slice it cannot take) still needs the
    changelog's files as committed: the changelog is not compacted until the chain has caught up."""
    cfg, pipeline, inbox = _lake(tmp_path, every=2, retain_hours=0)
    chain = pipeline.manifests[-1]
    monkeypatch.setattr(chain, "refresh", lambda: 0)
    for n in range(4):
        pipeline.process(_land(cfg, inbox, n), n)
    assert _compactions(cfg.changelog) == [] and _compactions(cfg.table) == [2, 7]  # (a vacuum: two commits)
    monkeypatch.undo()
    pipeline.process(_land(cfg, inbox, 4), 4)  # the chain takes the five batches, then the changelog is compacted
    assert _slices(cfg) == [(n * 3, n * 3 + 2) for n in range(5)] and _compactions(cfg.changelog) == [5]
    assert len(_stored(cfg.changelog)) == 1 and verify(cfg) == []


def test_a_chain_rebuilt_after_the_changelog_was_compacted_and_vacuumed_takes_the_files_it_holds_now(tmp_path):
    """Removing the odf folder and its state file rebuilds the chain from the changelog (docs/odf.md). The first
    batches' files were compacted into one and deleted: the chain takes the changelog's files as they are, the
    compacted one as a slice of three batches, and is whole: `verify` hashes every slice and compares it with the
    changelog."""
    import shutil

    from lakefeed.odf.chain import OdfChain

    cfg, pipeline, inbox = _lake(tmp_path, every=3, retain_hours=0)
    for n in range(4):
        pipeline.process(_land(cfg, inbox, n), n)
    assert _files(cfg.changelog) == 2 and len(_stored(cfg.changelog)) == 2  # batches 0-2 compacted, then batch 3
    shutil.rmtree(cfg.odf)
    (cfg.state / "odf-head.json").unlink()
    OdfChain(cfg, pipeline.storage).refresh()
    assert _slices(cfg) == [(0, 8), (9, 11)]
    assert verify(cfg) == []
    _pipeline(cfg).process(_land(cfg, inbox, 4), 4)  # the daemon restarted: the chain goes on, a slice a batch
    assert _slices(cfg) == [(0, 8), (9, 11), (12, 14)] and verify(cfg) == []


def test_a_slice_is_cut_out_of_a_compacted_file_that_straddles_the_chain_s_last_offset(tmp_path, monkeypatch):
    """A compacted file holding offsets the chain holds and others it does not (compacted while the chain was
    behind, which only a hand-run compaction does): the chain cuts the rows past its last offset out of it."""
    cfg, pipeline, inbox = _lake(tmp_path, every=0)
    for n in range(2):
        pipeline.process(_land(cfg, inbox, n), n)
    chain = pipeline.manifests[-1]
    monkeypatch.setattr(chain, "refresh", lambda: 0)
    for n in range(2, 5):
        pipeline.process(_land(cfg, inbox, n), n)
    monkeypatch.undo()
    assert pipeline.sinks.changelog.compact(128 << 20) == (5, 1)  # offsets 0-14 in one file: the chain has 0-5
    pipeline.sinks.changelog.vacuum(0)
    assert chain.refresh() == 1
    assert _slices(cfg) == [(0, 2), (3, 5), (6, 14)] and chain.check() == []  # each slice hashed, and the rows


def test_a_crash_right_after_a_compaction_loses_nothing_and_the_replay_brings_the_manifests_current(
        tmp_path, monkeypatch):
    cfg, pipeline, inbox = _lake(tmp_path, every=2)
    pipeline.process(_land(cfg, inbox, 0), 0)
    records = _land(cfg, inbox, 1)

    class Killed(BaseException):  # as the failpoint's SIGKILL: nothing in the daemon catches it
        pass

    def crash(name: str, unit: str = "") -> None:  # failpoints.reached
        if name == "compaction.committed":
            raise Killed

    monkeypatch.setattr(failpoints, "reached", crash)
    with pytest.raises(Killed):
        pipeline.process(records, 1)
    monkeypatch.undo()
    assert _compactions(cfg.table) == [2] and verify(cfg) != []  # compacted; its manifests not written
    fresh = _pipeline(cfg)
    assert fresh.process(records, 1).skipped  # Spark replays the batch: committed already
    assert verify(cfg) == []
    assert _ids(cfg.table) == [0, 1, 2, 100, 101, 102]


def test_a_compaction_that_fails_leaves_the_batch_committed_and_is_tried_again_later(tmp_path, monkeypatch):
    cfg, pipeline, inbox = _lake(tmp_path, every=2)
    monkeypatch.setattr(pipeline.sinks.table, "compact", lambda target: (_ for _ in ()).throw(OSError("disk full")))
    with capture_logs() as logs:
        for n in range(3):
            pipeline.process(_land(cfg, inbox, n), n)
    failed = [e for e in logs if e["event"] == "table.compaction_failed"]
    assert [(e["table"], e["error"]) for e in failed] == [("table", "OSError: disk full")]
    assert _ids(cfg.table) == [0, 1, 2, 100, 101, 102, 200, 201, 202] and verify(cfg) == []
    monkeypatch.undo()
    pipeline.process(_land(cfg, inbox, 3), 3)  # the second commit since the failed try
    assert _compactions(cfg.table) == [4] and _files(cfg.table) == 1


def test_a_keyed_entity_s_tables_are_compacted_and_still_replay(tmp_path):
    from tests.test_cdc import T0, Lake

    lake = Lake(tmp_path, {"strategy": "upsert", "primary_key": ["k"], "history": True}, compact_every=2)
    expected = {}
    for n in range(6):  # each batch brings two new keys, and a row without a key
        rows = [{"k": k, "v": f"v{n}", "seq": n, "IsDelete": False, "op": "u", "et": T0} for k in (2 * n, 2 * n + 1)]
        lake.batch([rows + [{"k": None, "v": "x", "seq": n, "IsDelete": False, "op": "u", "et": T0}]])
        expected.update({r["k"]: r["v"] for r in rows})
    assert {k: row["v"] for k, row in lake.state().items()} == expected
    assert lake.quarantined() == 6
    for table in (lake.cfg.table, lake.cfg.history, lake.cfg.quarantine):
        assert _compactions(table) and _files(table) <= 2, (table, _files(table))
    assert verify(lake.cfg) == []


def test_compaction_on_demand_compacts_every_table_now_and_the_count_starts_again_from_it(tmp_path):
    """`lakefeed compact` (daemon/ops/compactions.py) calls `compact_now`: every table, due or not, the changelog
    too once the chain holds it; the next compaction comes `every` commits after this one."""
    cfg, pipeline, inbox = _lake(tmp_path, every=4, retain_hours=0)
    for n in range(3):  # three commits: not due
        pipeline.process(_land(cfg, inbox, n), n)
    report = pipeline.compact_now(lambda: False)
    assert report["quarantine"] == {"skipped": "no table yet"}  # no bad row has made it
    for name, uri in (("table", cfg.table), ("changelog", cfg.changelog)):
        done = report[name]
        assert (done["files_removed"], done["files_added"], done["vacuum_retain_hours"]) == (3, 1, 0), name
        assert done["version"] == DeltaTable(str(uri)).version()
        assert _files(uri) == len(_stored(uri)) == 1  # vacuumed at once (retain_hours 0)
    assert _compactions(cfg.table) == [3] and _compactions(cfg.changelog) == [3]
    assert _slices(cfg) == [(n * 3, n * 3 + 2) for n in range(3)] and verify(cfg) == []
    for n in range(3, 7):  # commits 6-9 after the vacuum's two (4, 5): the fourth is due
        pipeline.process(_land(cfg, inbox, n), n)
    assert _compactions(cfg.table) == [3, 10]
    assert _ids(cfg.table) == sorted(n * 100 + i for n in range(7) for i in range(3)) and verify(cfg) == []


def test_compaction_on_demand_leaves_the_changelog_to_a_chain_that_cannot_hold_it(tmp_path, monkeypatch):
    cfg, pipeline, inbox = _lake(tmp_path, every=0)
    monkeypatch.setattr(pipeline.manifests[-1], "refresh", lambda: 0)  # a chain stopped at a slice it cannot take
    for n in range(2):
        pipeline.process(_land(cfg, inbox, n), n)
    report = pipeline.compact_now(lambda: False)
    assert report["changelog"] == {"skipped": "the ODF chain holds the changelog up to version -1 of 1; ask again "
                                              "once it has caught up"}
    assert report["table"]["files_removed"] == 2 and _files(cfg.changelog) == 2
    monkeypatch.undo()
    assert pipeline.compact_now(lambda: False)["changelog"]["files_removed"] == 2  # the chain took both slices first
    assert _slices(cfg) == [(0, 2), (3, 5)] and verify(cfg) == []


def test_compaction_on_demand_reports_a_table_that_fails_and_compacts_the_others(tmp_path, monkeypatch):
    cfg, pipeline, inbox = _lake(tmp_path, every=0)
    for n in range(2):
        pipeline.process(_land(cfg, inbox, n), n)

    def full(_target: int) -> tuple[int, int]:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pipeline.sinks.table, "compact", full)
    with capture_logs() as logs:
        report = pipeline.compact_now(lambda: False)
    assert report["table"] == {"error": "OSError: [Errno 28] No space left on device"}
    assert report["changelog"]["files_removed"] == 2 and _files(cfg.table) == 2
    assert [e["table"] for e in logs if e["event"] == "table.compaction_failed"] == ["table"]
    pipeline.process(_land(cfg, inbox, 2), 2)  # the batches go on
    assert _ids(cfg.table) == sorted(n * 100 + i for n in range(3) for i in range(3)) and verify(cfg) == []


def test_compaction_on_demand_ends_between_two_tables_once_halted(tmp_path):
    cfg, pipeline, inbox = _lake(tmp_path, every=0)
    for n in range(2):
        pipeline.process(_land(cfg, inbox, n), n)
    asked = []
    report = pipeline.compact_now(lambda: asked.append(1) or len(asked) > 1)  # a stop once the first table is done
    assert report["table"]["files_removed"] == 2
    assert report["changelog"] == {"error": "not compacted: the daemon (or the entity) is stopping"}
    assert _files(cfg.changelog) == 2 and not pipeline.compactor.asked
