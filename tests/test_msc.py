"""MSC manifests (seed 004), read back by NVIDIA's multi-storage-client itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow.fs as pafs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from multistorageclient import StorageClient, StorageClientConfig

from lakefeed.config.manifests import MscManifest
from lakefeed.manifests.msc import INDEX, PARTS, MscWriter, Obj


def msc_listing(root: Path, manifest_path: str = ".msc_manifests") -> dict[str, tuple[int, int]]:
    """key -> (size, whole seconds of last_modified), as multi-storage-client lists the folder."""
    config = StorageClientConfig.from_dict({"profiles": {"lake": {
        "storage_provider": {"type": "file", "options": {"base_path": str(root)}},
        "metadata_provider": {"type": "manifest", "options": {"manifest_path": manifest_path}},
    }}}, profile="lake")
    return {o.key: (o.content_length, int(o.last_modified.timestamp())) for o in StorageClient(config).list("")}


def _versions(base: Path) -> list[str]:
    return sorted(p.name for p in base.iterdir() if p.is_dir() and not p.name.startswith("."))


def _check_layout(base: Path, retain: int) -> None:
    versions = _versions(base)
    assert len(versions) <= retain
    listed = set()
    for version in versions:
        index = json.loads((base / version / INDEX).read_text())
        assert index["version"] == "1" and index["format"] == "jsonl"
        listed |= {Path(p["path"]).name for p in index["parts"]}
    assert {p.name for p in (base / PARTS).iterdir()} == listed  # no part that no kept version lists
    assert not [p for p in base.iterdir() if p.name.endswith(".tmp")]


keys = st.sampled_from([f"d{i % 3}/f{i}.csv" for i in range(12)])
steps = st.lists(st.tuples(st.dictionaries(keys, st.integers(0, 3), max_size=6), st.sets(keys, max_size=4)),
                 min_size=1, max_size=12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=steps, part_lines=st.integers(1, 4), compact_every=st.integers(1, 5), retain=st.integers(1, 3))
def test_every_version_lists_what_the_model_says(steps, part_lines, compact_every, retain):
    """Random adds, rewrites and removals: after each update the latest version, as MSC reads it, equals a dict."""
    cfg = MscManifest(enabled=True, part_lines=part_lines, compact_every=compact_every, retain_versions=retain)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        writer = MscWriter(pafs.LocalFileSystem(), str(root), cfg)
        model: dict[str, Obj] = {}
        for applied, (put, removed) in enumerate(steps):
            objects = {k: Obj(size, 1_700_000_000_000_000 + size * 1_000_000) for k, size in put.items()}
            writer.update(objects, removed, applied)
            model = {k: o for k, o in model.items() if k not in removed or k in objects} | objects
            expected = {k: (o.size, o.modified_us // 1_000_000) for k, o in model.items()}
            assert msc_listing(root) == expected
            assert MscWriter(pafs.LocalFileSystem(), str(root), cfg).listing() == model  # a restarted writer
            if (root / ".msc_manifests").exists():
                _check_layout(root / ".msc_manifests", retain)


def test_an_update_writes_only_the_changes(tmp_path):
    cfg = MscManifest(enabled=True, part_lines=100, compact_every=1000)
    writer = MscWriter(pafs.LocalFileSystem(), str(tmp_path), cfg)
    writer.update({f"f{i:04d}": Obj(i, 0) for i in range(1000)}, (), 0)
    parts = tmp_path / ".msc_manifests" / PARTS
    before = {p.name for p in parts.iterdir()}
    assert len(before) == 10
    writer.update({"new": Obj(1, 0)}, {"f0005"}, 1)  # the part of f0005 rewritten without it, with "new"
    (fresh,) = {p.name for p in parts.iterdir()} - before  # the old part stays: the older version lists it
    assert len((parts / fresh).read_text().splitlines()) == 100
    version = _versions(tmp_path / ".msc_manifests")[-1]
    index = json.loads((tmp_path / ".msc_manifests" / version / INDEX).read_text())
    assert len(index["parts"]) == 10 and all(p["path"].startswith(f"/.msc_manifests/{PARTS}/") for p in index["parts"])
    listing = msc_listing(tmp_path)
    assert len(listing) == 1000 and "f0005" not in listing and "new" in listing


_CRASH = """
import sys
import pyarrow.fs as pafs
from lakefeed.config.manifests import MscManifest
from lakefeed.manifests.msc import MscWriter, Obj
writer = MscWriter(pafs.LocalFileSystem(), sys.argv[1], MscManifest(enabled=True, part_lines=2))
writer.update({"late.csv": Obj(7, 0), "later.csv": Obj(8, 0), "last.csv": Obj(9, 0)}, {"a.csv"}, 1)
"""


def test_a_kill_between_the_parts_and_the_index_leaves_the_last_version_whole(tmp_path):
    cfg = MscManifest(enabled=True, part_lines=2)
    MscWriter(pafs.LocalFileSystem(), str(tmp_path), cfg).update({"a.csv": Obj(1, 0), "b.csv": Obj(2, 0)}, (), 0)
    proc = subprocess.run([sys.executable, "-c", _CRASH, str(tmp_path)], capture_output=True, timeout=60,
                          env={**os.environ, "LAKEFEED_FAILPOINT": "msc.parts_written"})
    assert proc.returncode == -9, proc.stderr
    base = tmp_path / ".msc_manifests"
    assert len(list((base / PARTS).iterdir())) == 1 + 2  # the new parts were written, no index names them
    assert msc_listing(tmp_path) == {"a.csv": (1, 0), "b.csv": (2, 0)}
    writer = MscWriter(pafs.LocalFileSystem(), str(tmp_path), cfg)
    assert writer.applied == 0  # what a restart applies again
    writer.update({"late.csv": Obj(7, 0)}, {"a.csv"}, 1)
    assert msc_listing(tmp_path) == {"b.csv": (2, 0), "late.csv": (7, 0)}
    _check_layout(base, cfg.retain_versions)  # the orphaned parts are gone


def _on_disk(folder: Path, keys: list[str]) -> dict[str, tuple[int, int]]:
    stats = {k: (folder / k).stat() for k in keys}
    return {k: (s.st_size, int(s.st_mtime)) for k, s in stats.items()}


def _table_files(table: Path) -> dict[str, tuple[int, int]]:
    from deltalake import DeltaTable

    from lakefeed.connectors.sinks.delta_log import table_files

    return _on_disk(table, table_files(DeltaTable(str(table))))


def _landed(landing: Path) -> dict[str, tuple[int, int]]:
    keys = [p.relative_to(landing).as_posix() for p in landing.rglob("*") if p.is_file()
            and ".msc_manifests" not in p.parts and not p.name.endswith(".cdm.json")]
    return _on_disk(landing, keys)


def test_the_daemon_keeps_msc_manifests_of_its_landing_folder_and_tables_through_a_kill_and_deletions(tmp_path):
    from lakefeed.config import model as config
    from lakefeed.pipeline.verify import verify
    from tests.conftest import entity_yaml, land, wait_for, write_config
    from tests.test_daemon_process import Daemon

    entity = entity_yaml(cdc={"strategy": "upsert", "primary_key": ["id"]},
                         msc={"landing": {"enabled": True}, "tables": {"enabled": True, "retain_versions": 3}})
    path = write_config(tmp_path, [entity])
    landing, lake = tmp_path / "landing", tmp_path / "lake" / "sales"
    with Daemon(path, tmp_path / "daemon.log") as daemon:
        daemon.start()
        land(landing / "sales" / "a.csv", "id,v\n1,a\n2,a\n3,a\n")
        wait_for(lambda: daemon.events("batch.committed") >= 1, 60, 0.2, "the first batch")
        land(landing / "sales" / "b.csv", "id,v\n2,b\n3,b\n4,b\n5,b\n")  # the merge rewrites a's file: a remove

        def current() -> bool:
            return msc_listing(landing) == _landed(landing) and msc_listing(lake / "table") == _table_files(
                lake / "table") and msc_listing(lake / "changelog") == _table_files(lake / "changelog")

        wait_for(lambda: len(_landed(landing)) == 2 and current(), 60, 0.5, "manifests of both batches")
        assert len(msc_listing(landing)) == 2  # sales/a.csv and sales/b.csv; lakefeed's own files are not listed
        daemon.stop(60)

        daemon.start(env={"LAKEFEED_FAILPOINT": "msc.parts_written"})  # killed after the commit, before an index
        land(landing / "sales" / "c.csv", "id,v\n5,c\n6,c\n")
        assert daemon.wait(60) == -9
        assert not current()
        daemon.start()  # the batch is replayed, found committed, and the manifests brought up to date
        wait_for(current, 60, 0.5, "the manifests repaired")
        assert len(msc_listing(landing)) == 3
        cfg = config.load(path).entities[0]
        assert verify(cfg) == []

        def partitions() -> set[str]:
            doc = json.loads(cfg.manifest.read_text())
            (entity,) = doc["entities"]
            return {Path(p["location"]).name for p in entity.get("dataPartitions", [])}

        assert partitions() == {"a.csv", "b.csv", "c.csv"}
        (landing / "sales" / "a.csv").unlink()  # a local deletion: a removal, in the manifests but not the table
        wait_for(lambda: len(_landed(landing)) == 2 and current() and partitions() == {"b.csv", "c.csv"}, 60, 0.5,
                 "the deletion in the manifests")
        daemon.stop(60)
        (landing / "sales" / "b.csv").unlink()  # while the daemon is down: its listing at start finds it gone
        daemon.start()
        wait_for(lambda: current() and partitions() == {"c.csv"}, 60, 0.5, "the deletion found by the listing")
        assert msc_listing(landing).keys() == {"sales/c.csv"} and verify(cfg) == []
        daemon.stop(60)


def test_on_s3_a_version_is_visible_only_once_its_index_is_written(tmp_path):
    """On S3 nothing is renamed: a version's index is the last object written. MSC reads the bucket through boto3."""
    from tests.s3_server import REGION, running

    with running() as server:
        server.client("s3").create_bucket(Bucket="lake")
        fs = pafs.S3FileSystem(endpoint_override=server.endpoint.removeprefix("http://"), scheme="http",
                               access_key="testing", secret_key="testing", region=REGION)
        cfg = MscManifest(enabled=True, part_lines=2, retain_versions=2)

        def listed() -> dict[str, int]:  # the config reads the manifest when it is made
            config = StorageClientConfig.from_dict({"profiles": {"s3": {
                "storage_provider": {"type": "s3", "options": {"base_path": "lake/landing", "region_name": REGION,
                                                                 "endpoint_url": server.endpoint}},
                "metadata_provider": {"type": "manifest", "options": {"manifest_path": ".msc_manifests"}},
            }}}, profile="s3")
            return {o.key: o.content_length for o in StorageClient(config).list("")}

        writer = MscWriter(fs, "lake/landing", cfg)
        writer.update({"a.csv": Obj(1, 0), "b.csv": Obj(2, 0), "c.csv": Obj(3, 0)}, (), 0)
        writer.update({"d.csv": Obj(4, 0)}, {"a.csv"}, 1)
        assert listed() == {"b.csv": 2, "c.csv": 3, "d.csv": 4}
        s3 = server.client("s3")
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket="lake", Prefix="landing/.msc_manifests/")["Contents"]]
        versions = sorted({k.split("/")[2] for k in keys if not k.split("/")[2].startswith(".")})
        assert len(versions) == 2
        # A version folder without an index (an older lakefeed's sidecar): invisible to MSC, removed by the next update.
        s3.put_object(Bucket="lake", Key="landing/.msc_manifests/9999-12-31T00:00:00.000000Z/lakefeed.json", Body=b"{}")
        assert listed() == {"b.csv": 2, "c.csv": 3, "d.csv": 4}
        MscWriter(fs, "lake/landing", cfg).update({"e.csv": Obj(5, 0)}, {"b.csv"}, 2)
        assert listed() == {"c.csv": 3, "d.csv": 4, "e.csv": 5}
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket="lake", Prefix="landing/.msc_manifests/")["Contents"]]
        assert not [k for k in keys if "9999" in k]


def test_an_update_that_failed_is_applied_whole_when_tried_again(tmp_path, monkeypatch):
    """A full disk or a lost bucket while writing: the batch is retried, and so is the manifest's update."""
    writer = MscWriter(pafs.LocalFileSystem(), str(tmp_path), MscManifest(enabled=True))
    writer.update({"a.csv": Obj(1, 0)}, (), 0)
    publish = writer._publish
    monkeypatch.setattr(writer, "_publish", lambda *a: (_ for _ in ()).throw(OSError(28, "No space left")))
    try:
        writer.update({"b.csv": Obj(2, 0)}, {"a.csv"}, 1)
    except OSError:
        pass
    monkeypatch.setattr(writer, "_publish", publish)
    assert writer.applied == 0
    writer.update({"b.csv": Obj(2, 0)}, {"a.csv"}, 1)
    assert msc_listing(tmp_path) == {"b.csv": (2, 0)}
