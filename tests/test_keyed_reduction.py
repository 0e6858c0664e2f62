"""The keyed reduction as tasks (daemon/pipeline/keyed.py) against the reduction of the whole batch in one place:
rows cut into buckets by key where they are staged, a task per bucket (each reading the tombstones itself), give
the same changes, the same bad rows, the same counts and the same latest event time, however many buckets; the
reduction merged gives the table and quarantine of the changes applied one by one (tests/cdc_model.py); and a
row's bucket is the same in every process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakefeed.batch import cdc, event_time
from lakefeed.batch.buckets import bucket_of
from lakefeed.config import model as config
from lakefeed.inbox.storage import Storage
from lakefeed.pipeline import keyed, staged_files, tasks
from lakefeed.pipeline.sinks import delta_sink
from tests.cdc_model import DictTable, Model
from tests.conftest import entity_yaml, write_config

T0 = datetime(2024, 1, 1, tzinfo=UTC)
KINDS = {"upsert": ["upsert"], "upsert_and_delete": ["upsert_and_delete"], "ledger": ["insert"],
         "changelog": ["changelog"], "incremental": ["insert", "update", "delete", "upsert"]}

row = st.fixed_dictionaries({
    "k": st.integers(-1, 6).map(lambda k: None if k < 0 else k),
    "v": st.sampled_from(["a", "b", None]),
    "seq": st.integers(0, 3),
    "IsDelete": st.sampled_from(["true", "false", None]),
    "op": st.sampled_from(["c", "u", "d", "x"]),
    "minute": st.integers(0, 10),
})
parts = st.lists(st.lists(row, max_size=6), min_size=1, max_size=4)


def _cfg(tmp, strategy: str, sequence: bool, update_of_absent: str, late_policy: str):
    cdc_doc = {"strategy": "upsert" if strategy == "incremental" else strategy, "primary_key": ["k"],
               "sequence_by": ["seq"] if sequence else [], "update_of_absent": update_of_absent}
    entity = entity_yaml(cdc=cdc_doc, event_time={"allowed_lateness_s": 0, "late_policy": late_policy})
    return config.load(write_config(tmp, [entity])).entities[0]


KEY_TYPES = {"int64": (pa.int64(), int), "double": (pa.float64(), lambda k: -0.0 if k == 0 else float(k)),
             "decimal": (pa.decimal128(12, 3), lambda k: Decimal(k).quantize(Decimal("0.001"))),
             "decimal2": (pa.decimal128(14, 2), lambda k: Decimal(k).quantize(Decimal("0.01")))}
# Types a batch's parts may mix, as Arrow unifies them (int64 and a decimal it cannot: Arrow's own concatenation fails)
KEY_MIXES = [("int64", "double"), ("decimal", "decimal2", "double")]


def _part(rows: list[dict], kind: str, offset: int, text_keys: bool, numbered: bool,
          key_type: str = "int64") -> pa.Table:
    """`key_type`: of a number key in this part (files read before the table fixes the types may differ; 0 as a
    double is -0.0, a decimal carries its scale)."""
    kind_of_key, value = (pa.string(), lambda k: f"key-{k}") if text_keys else KEY_TYPES[key_type]
    table = pa.table({
        "k": pa.array([None if r["k"] is None else value(r["k"]) for r in rows], kind_of_key),
        "v": pa.array([r["v"] for r in rows], pa.string()),
        "seq": pa.array([r["seq"] for r in rows], pa.int64()),
        "IsDelete": pa.array([r["IsDelete"] for r in rows], pa.string()),
        "op": pa.array([r["op"] for r in rows], pa.string()),
        "source_file": pa.array([f"file{offset}"] * len(rows), pa.string()),
        event_time.EVENT_TIME: pa.array([T0 + timedelta(minutes=r["minute"]) for r in rows],
                                        pa.timestamp("us", tz="UTC")),
    })
    return cdc.tag(table, kind, 0 if numbered else offset)


def _staged(cfg, table: pa.Table, offset: int, buckets: int, folder: str) -> tasks.Staged:
    """A part staged as a stage task stages it: cut into buckets by key."""
    paths = tasks.write_buckets(Storage(cfg.storage), f"{folder}/{offset}", table, cfg.cdc.primary_key, buckets)
    return tasks.Staged(offset, f"file{offset}", True, table.num_rows, schema=table.schema, buckets=paths)


def _staging(tmp, batch_id: int) -> str:
    """A batch's staging folder, named as the daemon names it (its bad rows' files are named after it)."""
    return staged_files.folder(str(tmp), "q1token", batch_id)


def _canonical(done: keyed.Reduction, cfg=None) -> tuple:
    """`cfg`: the entity whose quarantine holds the files of the bad rows the tasks wrote (`done.quarantined`)."""
    rows = done.rows.to_pylist() if done.rows is not None else None
    written = [pq.read_table(f"{cfg.quarantine}/{f.path}") for q in done.quarantined for f in q.files]
    assert sum(t.num_rows for t in written) == sum(q.rows for q in done.quarantined)
    bad = sorted([(path, b.reason, b.raw) for path, b in done.bad]
                 + [(r["source_file"], r["reason"], r["raw"]) for t in written for r in t.to_pylist()])
    key = lambda r: (r["k"] is None, str(r["k"]), r[cdc.KIND], r[cdc.ORDER])  # noqa: E731
    return (sorted(rows, key=key) if rows is not None else None), bad, done.kept, done.late, done.latest, done.stale


def _tombstones(cfg, text_keys: bool, key_type: pa.DataType):
    """Deletions of keys 0-2 at sequence 2, keyed as the batch (conformed to the table, which the tombstones
    follow): the batch's changes of those keys older than that are stale (each bucket's task reads this table)."""
    keys = pa.array([f"key-{k}" for k in range(3)]) if text_keys else \
        pa.array([Decimal(k) for k in range(3)], pa.decimal128(5, 0)).cast(key_type)  # an int64 fits no decimal(12,3)
    write_deltalake(str(cfg.tombstones), pa.table({"k": keys, "seq": pa.array([2, 2, 2], pa.int64())}))
    return delta_sink(cfg, cfg.tombstones)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(data=parts, strategy=st.sampled_from(sorted(KINDS)), sequence=st.booleans(),
       update_of_absent=st.sampled_from(["insert", "ignore", "quarantine"]),
       late_policy=st.sampled_from(["apply", "quarantine", "drop"]), watermark_minute=st.none() | st.integers(0, 10),
       text_keys=st.booleans(), numbered=st.booleans(), buckets=st.integers(1, 5), kinds=st.randoms())
def test_a_reduction_in_buckets_is_the_reduction_of_the_whole_batch(tmp_path_factory, data, strategy, sequence,
                                                                    update_of_absent, late_policy, watermark_minute,
                                                                    text_keys, numbered, buckets, kinds):
    """Number keys come in a type of each part's (int64, double, decimal): the batch unifies them before it
    reduces, so equal values must share a bucket whatever their part's type."""
    tmp = tmp_path_factory.mktemp("keyed")
    cfg = _cfg(tmp, strategy, sequence, update_of_absent, late_policy)
    watermark = None if watermark_minute is None else T0 + timedelta(minutes=watermark_minute)
    kind_of = [kinds.choice(KINDS[strategy]) for _ in data]
    if numbered:  # a Kafka batch: one source, the parts numbered from 0 each
        kind_of = [kind_of[0]] * len(data)
    mix = kinds.choice(KEY_MIXES)
    key_types = [kinds.choice(mix) for _ in data]
    tables = [_part(rows, kind, n, text_keys, numbered, key_type)
              for n, (rows, kind, key_type) in enumerate(zip(data, kind_of, key_types, strict=True))]
    batch_id = 7
    whole = pa.concat_tables(tables, promote_options="permissive")
    if numbered:
        whole = cdc.tag(whole.drop_columns([cdc.KIND, cdc.ORDER]), kind_of[0], batch_id)
    tombstones = _tombstones(cfg, text_keys, whole.schema.field("k").type) if sequence else None
    expected = keyed.reduction(whole, cfg, watermark, None, tombstones)
    staging = _staging(tmp, batch_id)
    staged = [_staged(cfg, t, n, buckets, staging) for n, t in enumerate(tables)]
    got, workers = keyed.reduce_staged(tasks.InProcess("test"), cfg, staged, batch_id, staging, T0, watermark, None,
                                       numbered=numbered)
    assert _canonical(got, cfg) == _canonical(expected)
    assert len(workers) == len({b for s in staged for b, path in enumerate(s.buckets) if path})


changes = st.fixed_dictionaries({"k": st.integers(0, 4), "v": st.sampled_from(["a", "b"]), "seq": st.integers(0, 3),
                                 "op": st.sampled_from(["insert", "update", "upsert", "delete"])})
change_batches = st.lists(st.lists(st.lists(changes, max_size=5), min_size=1, max_size=3), min_size=1, max_size=4)


def _applied_one_by_one(tmp, batches: list, sequence: bool, update_of_absent: str) -> int:
    """Batch after batch reduced, settled against the table (`keyed.settled`, as the commit does) and merged;
    after each, the table, the tombstones and the quarantine are those of the model. The number of lookups made."""
    cfg = _cfg(tmp, "changelog", sequence, update_of_absent, "apply")
    model = Model("changelog", sequence=("seq",) if sequence else (), update_of_absent=update_of_absent)
    table, tombstones, quarantined = DictTable(), DictTable(), 0
    for b, files in enumerate(batches):
        rows = [[{**r, "IsDelete": None, "minute": 0} for r in f] for f in files]
        data = pa.concat_tables([_part(f, "changelog", b * 10 + n, False, False) for n, f in enumerate(rows)])
        done = keyed.reduction(data, cfg, None, None, tombstones if sequence else None)
        reduced, absent = keyed.settled(done.rows, cfg.cdc, table.lookup, table.may_hold_newer)
        assert len(set(reduced.column("k").to_pylist())) == reduced.num_rows  # one MERGE row per key
        quarantined += len(done.bad) + len(absent)
        table.merge(reduced.select(["k", "v", "seq", "op", cdc.KIND]), cdc.plan(cfg.cdc, ["k", "v", "seq", "op"]))
        for row in reduced.filter(pc.equal(reduced.column(cdc.KIND), "delete")).to_pylist() if sequence else ():
            tombstones.rows[row["k"]] = max(tombstones.rows.get(row["k"], row), row, key=lambda r: r["seq"])
        model.apply_batch([[{"k": r["k"], "v": r["v"], "seq": r["seq"], "op": r["op"]} for r in f] for f in files])
        assert table.rows == model.state
        # A key's tombstone decides only while the table does not hold it. A delete older than the stored row,
        # the only change of its key in the batch, is remembered too (only the MERGE sees it is stale): older than
        # the row, it never decides anything.
        assert {k: (r["seq"],) for k, r in tombstones.rows.items() if k not in table.rows} == \
            {k: seq for k, seq in model.tombstones.items() if k not in model.state}
        assert all(tombstones.rows[k]["seq"] <= row["seq"] for k, row in table.rows.items() if k in tombstones.rows)
        assert quarantined == model.quarantined
    return table.lookups


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(batches=change_batches, sequence=st.booleans(), update_of_absent=st.sampled_from(["insert", "ignore",
                                                                                          "quarantine"]))
def test_a_reduction_merged_is_the_changes_applied_one_by_one(tmp_path_factory, batches, sequence,
                                                               update_of_absent):
    """Mixed inserts, updates, upserts and deletes, batch after batch (keys held or not before each), with and
    without `sequence_by` (older changes arriving later, deletions' tombstones): the table, the tombstones and the
    quarantine are those of the model, once the commit has settled the rows that depend on the table."""
    _applied_one_by_one(tmp_path_factory.mktemp("model"), batches, sequence, update_of_absent)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(stored=st.dictionaries(st.integers(0, 3), st.tuples(st.sampled_from(["upsert", "delete"]), st.integers(0, 6)),
                              max_size=4),
       batch=st.lists(st.fixed_dictionaries({"k": st.integers(0, 3), "v": st.sampled_from(["a", "b"]),
                                             "seq": st.integers(0, 6),
                                             "op": st.sampled_from(["insert", "update", "upsert", "delete"])}),
                      min_size=1, max_size=8),
       update_of_absent=st.sampled_from(["insert", "ignore", "quarantine"]))
def test_with_a_sequence_a_change_older_than_the_stored_row_does_nothing(tmp_path_factory, stored, batch,
                                                                          update_of_absent):
    """Keys the table holds at a sequence of their own, or deleted at one (a tombstone), then a batch of a key's
    several changes, some older than that: as applied one by one, each checked against what the key is when it
    comes (docs/cdc.md); a delete then an insert or update of its key is where the MERGE alone would differ."""
    first = [{"k": k, "v": "s", "seq": seq, "op": op} for k, (op, seq) in stored.items()]
    _applied_one_by_one(tmp_path_factory.mktemp("stored"), [[first], [batch]], True, update_of_absent)


def _lookups(tmp, batches: list) -> int:
    tmp.mkdir()
    return _applied_one_by_one(tmp, batches, True, "ignore")


def test_keys_of_one_change_or_only_newer_changes_are_not_looked_up(tmp_path):
    """A key waits for its stored row's sequence only where a delete comes before an insert or update of it in
    the batch, and is looked up only when a change of it may be older than a row the table holds (its files'
    statistics): a batch of one change per key, or of changes newer than anything stored, asks the table nothing."""
    stored = [{"k": k, "v": "s", "seq": 3, "op": "upsert"} for k in range(3)]
    one_each = [{"k": k, "v": "a", "seq": 1, "op": op} for k, op in enumerate(["delete", "insert", "update"])]
    assert _lookups(tmp_path / "one", [[stored], [one_each]]) == 0
    newer = [{"k": 1, "v": "a", "seq": 4, "op": "delete"}, {"k": 1, "v": "b", "seq": 5, "op": "insert"},
             {"k": 2, "v": "a", "seq": 4, "op": "delete"}, {"k": 2, "v": "b", "seq": 5, "op": "update"}]
    assert _lookups(tmp_path / "newer", [[stored], [newer]]) == 0
    older = [{"k": 1, "v": "a", "seq": 1, "op": "delete"}, {"k": 1, "v": "b", "seq": 5, "op": "insert"}]
    assert _lookups(tmp_path / "older", [[stored], [older]]) == 1


def test_the_snapshot_files_and_retracted_files_are_taken_in_each_bucket(tmp_path):
    """A snapshot batch: only the rows of the snapshot's files count, less those of files retracted."""
    cfg = _cfg(tmp_path, "snapshot", False, "insert", "apply")
    rows = [{"k": k, "v": "a", "seq": 0, "IsDelete": None, "op": "c", "minute": 0} for k in range(6)]
    tables = [_part(rows[:3], "snapshot", 0, False, False), _part(rows, "snapshot", 1, False, False),
              _part(rows[3:], "snapshot", 2, False, False)]
    snapshot = cdc.Snapshot(("file1", "file2"), None, "file2")
    staged = [_staged(cfg, t, n, 3, _staging(tmp_path, 1)) for n, t in enumerate(tables)]
    got, _ = keyed.reduce_staged(tasks.InProcess("test"), cfg, staged, 1, _staging(tmp_path, 1), T0, None, snapshot,
                                 retracted=("file1",))
    assert sorted(got.rows.column("k").to_pylist()) == [3, 4, 5]
    assert set(got.rows.column("source_file").to_pylist()) == {"file2"}


def test_parts_cut_into_different_numbers_of_buckets_are_refused(tmp_path):
    """The count is fixed once per batch; parts that disagree would leave buckets unread or split a key."""
    cfg = _cfg(tmp_path, "upsert", False, "insert", "apply")
    rows = [{"k": k, "v": "a", "seq": 0, "IsDelete": None, "op": "c", "minute": 0} for k in range(6)]
    staged = [_staged(cfg, _part(rows, "upsert", n, False, False), n, n + 2, _staging(tmp_path, 1))
              for n in range(2)]
    with pytest.raises(AssertionError, match="different numbers of buckets"):
        keyed.reduce_staged(tasks.InProcess("test"), cfg, staged, 1, _staging(tmp_path, 1), T0, None, None)


def test_a_rows_bucket_is_the_same_in_every_process():
    """Text keys hash by SipHash with pandas' fixed key, not Python's hash: another interpreter (another hash seed)
    puts every row in the same bucket; every bucket gets rows."""
    table = pa.table({"k": [f"key-{i}" for i in range(500)], "n": list(range(500))})
    here = bucket_of(table, ["k", "n"], 4).tolist()
    script = ("import json, pyarrow as pa; from lakefeed.batch.buckets import bucket_of; "
              "t = pa.table({'k': [f'key-{i}' for i in range(500)], 'n': list(range(500))}); "
              "print(json.dumps(bucket_of(t, ['k', 'n'], 4).tolist()))")
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": seed})
        assert json.loads(out.stdout) == here
    assert sorted(set(here)) == [0, 1, 2, 3] and min(here.count(b) for b in range(4)) > 80
