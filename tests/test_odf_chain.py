"""The ODF chain of an entity, kept by the pipeline after every commit: its blocks, its data slices, its repair
after a crash, and `verify` catching every tampered byte."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakefeed.config import model as config
from lakefeed.odf import keys, multiformats
from lakefeed.odf.chain import OdfChain
from lakefeed.odf.decode import decode
from lakefeed.odf.logical_hash import logical_multihash
from lakefeed.odf.store import DatasetStore
from lakefeed.pipeline.verify import verify
from tests.conftest import entity_yaml, land, write_config
from tests.test_pipeline import _batch, _pipeline, _prepared, rows


def _chain(cfg) -> list:
    """The chain's blocks from the Seed on, read straight from storage."""
    store = DatasetStore(str(cfg.odf), _pipeline(cfg).storage)
    out, hash_ = [], store.head()
    while hash_ is not None:
        block = decode(store.block(hash_))
        out.append((hash_, block))
        hash_ = block.prev_block_hash
    return out[::-1]


def _kinds(cfg) -> list[str]:
    return [b.event_kind for _, b in _chain(cfg)]


@pytest.fixture
def setup(tmp_path):
    return _prepared(config.load(write_config(tmp_path)).entities[0])


def _three_batches(cfg, pipeline, inbox):
    root = cfg.source.path
    pipeline.process(_batch(inbox, land(root / "sales/a.csv", "id,amount\n1,1.5\n2,2.5\n")), 0)
    pipeline.process(_batch(inbox, land(root / "sales/b.csv", "id,amount\n3,3.5\n")), 1)
    pipeline.process(_batch(inbox, land(root / "sales/2024/01/c.csv", "id,amount\n4,4.5\n5,5.5\n6,6.5\n")), 2)


def test_each_commit_becomes_an_add_data_block_with_its_slice(setup):
    cfg, pipeline, inbox = setup
    _three_batches(cfg, pipeline, inbox)
    chain = _chain(cfg)
    # the third file's path gives the rows partition arguments: new columns, so a new schema first
    assert [b.event_kind for _, b in chain] == ["Seed", "SetPollingSource", "SetDataSchema", "AddData", "AddData",
                                                "SetDataSchema", "AddData"]
    assert [b.sequence_number for _, b in chain] == list(range(7))
    seed = chain[0][1].event
    assert seed.dataset_id == multiformats.dataset_id(keys.public_key(cfg.state))
    slices = [b.event for _, b in chain if b.event_kind == "AddData"]
    assert [(s.prev_offset, s.new_data.start, s.new_data.end) for s in slices] == [(None, 0, 1), (1, 2, 2), (2, 3, 5)]
    assert [json.loads(json.dumps(s.new_source_state.value)) for s in slices] == ["1", "2", "3"]  # inbox offsets
    assert {s.new_source_state.kind for s in slices} == {"lakefeed/inbox-offset"}
    store = DatasetStore(str(cfg.odf), pipeline.storage)
    changelog = rows(cfg.changelog).sort_by("offset")
    for s in slices:
        data = store.read_data(s.new_data.physical_hash)
        assert multiformats.sha3(data) == s.new_data.physical_hash and len(data) == s.new_data.size
        table = pq.read_table(store.path("data", multiformats.to_text(s.new_data.physical_hash)))
        assert table.column("offset").to_pylist() == list(range(s.new_data.start, s.new_data.end + 1))
        assert logical_multihash(table) == s.new_data.logical_hash
        assert table.column("id").to_pylist() == \
            changelog.slice(s.new_data.start, s.new_data.end - s.new_data.start + 1).column("id").to_pylist()
    assert verify(cfg) == []


def test_a_restart_or_a_replay_adds_no_block_and_keeps_the_dataset_id(setup):
    cfg, pipeline, inbox = setup
    records = _batch(inbox, land(cfg.source.path / "sales/a.csv", "id\n1\n2\n"))
    pipeline.process(records, 0)
    before = _chain(cfg)
    fresh = _pipeline(cfg)
    assert fresh.process(records, 0).skipped
    OdfChain(cfg, fresh.storage).refresh()
    assert _chain(cfg) == before
    (cfg.state / "odf-head.json").unlink()  # no state file: the chain itself says where it stands
    fresh = _pipeline(cfg)
    fresh.process(_batch(inbox, land(cfg.source.path / "sales/b.csv", "id\n3\n")), 1)
    after = _chain(cfg)
    assert after[: len(before)] == before and [b.event_kind for _, b in after[len(before):]] == ["AddData"]
    assert verify(cfg) == []


def test_a_crash_between_the_commit_and_the_block_is_repaired_by_the_next_batch(setup, monkeypatch):
    cfg, pipeline, inbox = setup
    pipeline.process(_batch(inbox, land(cfg.source.path / "sales/a.csv", "id\n1\n")), 0)
    from lakefeed.odf import store as store_module

    def lost(*_args):
        raise OSError("disk gone")

    monkeypatch.setattr(store_module.DatasetStore, "put_block", lost)
    with pytest.raises(OSError):
        pipeline.process(_batch(inbox, land(cfg.source.path / "sales/b.csv", "id\n2\n")), 1)
    assert rows(cfg.changelog).num_rows == 2 and _kinds(cfg).count("AddData") == 1  # committed, not chained
    monkeypatch.undo()
    fresh = _pipeline(cfg)
    fresh.process(_batch(inbox, land(cfg.source.path / "sales/c.csv", "id\n3\n")), 2)
    slices = [b.event.new_data for _, b in _chain(cfg) if b.event_kind == "AddData"]
    assert [(s.start, s.end) for s in slices] == [(0, 0), (1, 1), (2, 2)]
    assert verify(cfg) == []


def test_a_block_written_before_its_head_moved_is_written_again_identically(setup):
    cfg, pipeline, inbox = setup
    pipeline.process(_batch(inbox, land(cfg.source.path / "sales/a.csv", "id\n1\n")), 0)
    chain = _chain(cfg)
    store = DatasetStore(str(cfg.odf), pipeline.storage)
    store.set_head(chain[-2][0])  # as if killed after writing the last block, before moving the head
    (cfg.state / "odf-head.json").unlink()
    assert OdfChain(cfg, pipeline.storage).refresh() == 1
    assert _chain(cfg) == chain  # the same bytes, so the same hash


def test_a_new_column_is_a_new_schema_block_before_its_slice(setup):
    cfg, pipeline, inbox = setup
    pipeline.process(_batch(inbox, land(cfg.source.path / "sales/a.csv", "id\n1\n")), 0)
    pipeline.process(_batch(inbox, land(cfg.source.path / "sales/b.csv", "id,note\n2,x\n")), 1)
    pipeline.process(_batch(inbox, land(cfg.source.path / "sales/c.csv", "id,note\n3,y\n")), 2)
    assert _kinds(cfg)[2:] == ["SetDataSchema", "AddData", "SetDataSchema", "AddData", "AddData"]
    assert verify(cfg) == []


def test_a_keyed_entity_chains_its_retractions_and_corrections(tmp_path, monkeypatch):
    entity = entity_yaml(cdc={"strategy": "upsert", "primary_key": ["id"]}, push=[
        {"name": "orders", "tokens_sha256": ["0" * 64]}])
    cfg, pipeline, inbox = _prepared(config.load(write_config(tmp_path, [entity])).entities[0])
    # the committer describes each changelog file as it writes it: the chain links it without reading it back
    monkeypatch.setattr(OdfChain, "_slice_of", lambda *_: pytest.fail("the chain read a changelog file back"))
    root = cfg.source.path
    pipeline.process(_batch(inbox, land(root / "sales/a.csv", "id,v\n1,a\n2,b\n")), 0)
    pipeline.process(_batch(inbox, land(root / "sales/b.csv", "id,v\n1,c\n3,d\n")), 1)
    chain = _chain(cfg)
    assert [b.event_kind for _, b in chain][:4] == ["Seed", "SetPollingSource", "AddPushSource", "SetDataSchema"]
    ops = rows(cfg.changelog).sort_by("offset").column("op").to_pylist()
    assert sorted(ops) == [0, 0, 0, 2, 3]
    assert [b.event.new_data.end for _, b in chain if b.event_kind == "AddData"] == [1, 4]
    from lakefeed.odf.blocks import AddPushSource, MergeStrategy, ReadStep

    push = chain[2]
    store = DatasetStore(str(cfg.odf), pipeline.storage)
    expected = AddPushSource("orders", ReadStep("NdJson"), MergeStrategy("UpsertStream", ("id",)))
    assert OdfChain(cfg, pipeline.storage)._holds(push[0], expected)
    assert store.head() == chain[-1][0]
    assert verify(cfg) == []


# -- tampering -------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chain")
    cfg, pipeline, inbox = _prepared(config.load(write_config(folder)).entities[0])
    _three_batches(cfg, pipeline, inbox)
    assert verify(cfg) == []
    return folder


def _objects(folder) -> list:
    odf = folder / "lake" / "sales" / "odf"
    return sorted(p for p in odf.rglob("*") if p.is_file())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_flipped_byte_in_a_block_a_data_file_or_the_head_is_reported(lake, tmp_path_factory, data):
    folder = tmp_path_factory.mktemp("tampered")
    shutil.copytree(lake, folder, dirs_exist_ok=True, copy_function=shutil.copy2)  # copies: links would share
    objects = _objects(folder)
    target = data.draw(st.sampled_from(objects), label="object")
    content = bytearray(target.read_bytes())
    position = data.draw(st.integers(0, len(content) - 1), label="byte")
    content[position] ^= data.draw(st.integers(1, 255), label="xor")
    target.write_bytes(bytes(content))
    cfg = config.load(folder / "lakefeed.yaml").entities[0]
    problems = [p for p in verify(cfg) if "ODF chain" in p]
    assert problems, f"flipping byte {position} of {target.name} went unnoticed"
    if target.parent.name == "blocks":
        assert any(target.name in p for p in problems), problems  # the altered block is named
    elif target.parent.name == "data":
        assert any(f"data/{target.name}" in p for p in problems), problems
    else:
        assert any("refs/head" in p or "is missing" in p for p in problems), problems


def _changelog_commit(cfg, files: list[list[int]], **meta: str) -> None:
    """A changelog commit of several files (as the writer splits a large batch), each with the given offsets."""
    import time
    import uuid

    from deltalake import CommitProperties, DeltaTable
    from deltalake.transaction import AddAction

    table = DeltaTable(str(cfg.changelog))
    like = table.to_pyarrow_table().slice(0, 1)
    actions = []
    for offsets in files:
        rows = pa.concat_tables([like] * len(offsets)).set_column(0, "offset", pa.array(offsets, pa.int64()))
        name = f"part-{uuid.uuid4()}.parquet"
        pq.write_table(rows, cfg.changelog / name)
        stats = {"numRecords": len(offsets), "minValues": {"offset": min(offsets)},
                 "maxValues": {"offset": max(offsets)}, "nullCount": {"offset": 0}}
        actions.append(AddAction(name, (cfg.changelog / name).stat().st_size, {}, int(time.time() * 1000), True,
                                 json.dumps(stats)))
    table.create_write_transaction(actions, "append", like.schema, commit_properties=CommitProperties(
        custom_metadata=meta))


def test_a_commit_the_writer_split_into_files_is_a_slice_per_file_and_a_shuffled_one_is_joined(setup):
    cfg, pipeline, inbox = setup
    pipeline.process(_batch(inbox, land(cfg.source.path / "sales/a.csv", "id\n1\n")), 0)
    state = json.dumps({"source": "files", "kind": "lakefeed/inbox-offset", "value": "9"})
    _changelog_commit(cfg, [[1, 2], [3], [4, 5, 6]], **{"lakefeed.source_state": state})
    chain = OdfChain(cfg, pipeline.storage)
    chain.refresh()
    slices = [b.event for _, b in _chain(cfg) if b.event_kind == "AddData"][1:]
    assert [(s.new_data.start, s.new_data.end) for s in slices] == [(1, 2), (3, 3), (4, 6)]
    assert [s.new_source_state for s in slices[:2]] == [None, None] and slices[2].new_source_state.value == "9"
    _changelog_commit(cfg, [[7, 9], [8, 10]])  # files whose offsets interleave: one slice, joined
    chain.refresh()
    last = [b.event for _, b in _chain(cfg) if b.event_kind == "AddData"][-1]
    assert (last.new_data.start, last.new_data.end) == (7, 10)
    assert chain.check() == []


def test_an_unreadable_chain_stops_only_the_chain_and_verify_names_the_block(setup):
    cfg, pipeline, inbox = setup
    pipeline.process(_batch(inbox, land(cfg.source.path / "sales/a.csv", "id\n1\n")), 0)
    store = DatasetStore(str(cfg.odf), pipeline.storage)
    schema_block = [h for h, b in _chain(cfg) if b.event_kind == "SetDataSchema"][0]
    path = cfg.odf / "blocks" / multiformats.to_text(schema_block)
    path.write_bytes(b"garbage")
    (cfg.state / "odf-head.json").unlink()  # so the next start walks the chain and meets the garbage
    head = store.head()
    fresh = _pipeline(cfg)
    result = fresh.process(_batch(inbox, land(cfg.source.path / "sales/b.csv", "id\n2\n")), 1)
    assert result.rows == 1 and rows(cfg.changelog).num_rows == 2  # ingestion went on
    assert store.head() == head  # the chain was left as it is
    problems = verify(cfg)
    assert any(multiformats.to_text(schema_block) in p for p in problems), problems


def test_commits_whose_log_was_cleaned_up_are_chained_from_the_tables_files(setup):
    from deltalake import DeltaTable

    cfg, pipeline, inbox = setup
    for n in range(3):
        pipeline.process(_batch(inbox, land(cfg.source.path / f"sales/{n}.csv", f"id\n{n}\n")), n)
    DeltaTable(str(cfg.changelog)).create_checkpoint()
    for log_file in sorted((cfg.changelog / "_delta_log").glob("*.json"))[:-1]:
        log_file.unlink()  # as log retention does, once a checkpoint holds the state
    shutil.rmtree(cfg.odf)
    (cfg.state / "odf-head.json").unlink()
    OdfChain(cfg, pipeline.storage).refresh()
    slices = [b.event.new_data for _, b in _chain(cfg) if b.event_kind == "AddData"]
    assert [(s.start, s.end) for s in slices] == [(0, 0), (1, 1), (2, 2)]
    assert OdfChain(cfg, pipeline.storage).check() == []
