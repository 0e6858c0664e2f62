"""The S3 landing's parts against a real moto server: config, object identity (HEAD = listing),
what counts as data, deliveries and listings into a real inbox, and the manifest mirror."""

from __future__ import annotations

import json
import posixpath
from pathlib import Path
from urllib.parse import quote_plus

import pytest

from lakefeed.config import model as config
from lakefeed.config.sources import S3Source, S3Storage
from lakefeed.connectors.sources.s3_events import parse
from lakefeed.connectors.sources.s3_landing import S3Landing
from lakefeed.errors import ConfigError, TerminalError
from lakefeed.inbox.files import Inbox, InboxReader
from lakefeed.inbox.storage import Mirror, Storage
from tests import s3_server
from tests.conftest import write_config

SECRET = "do-not-log-me"


@pytest.fixture(scope="module")
def moto():
    with s3_server.running() as server:
        yield server


@pytest.fixture
def store(moto) -> Storage:
    moto.reset()
    moto.client("s3").create_bucket(Bucket="landing")
    return Storage(S3Storage(endpoint_override=moto.endpoint, region=moto.region, access_key_id="AKIDTEST",
                             secret_access_key=SECRET))


def _landing(tmp: Path, store: Storage, **source: object) -> S3Landing:
    src = S3Source(url="s3://landing/sales/", **source)
    return S3Landing("sales", src, Inbox(tmp / "inbox"), store, tmp / "state",
                     excluded=("s3://landing/sales/_lake/table",))


def _event(key: str, name: str = "ObjectCreated:Put") -> str:
    """An AWS notification body for one object of the bucket."""
    obj = {"key": quote_plus(key), "eTag": "0123", "sequencer": "0A"}
    if name.startswith("ObjectCreated"):
        obj["size"] = 5
    return json.dumps({"Records": [{"eventVersion": "2.1", "eventSource": "aws:s3", "eventName": name,
                                    "eventTime": "2026-11-22T09:00:00.000Z",
                                    "s3": {"bucket": {"name": "landing"}, "object": obj}}]})


def _records(tmp: Path):
    reader = InboxReader(tmp / "inbox")
    return reader.records(0, reader.refresh())


def test_config_of_an_s3_entity(tmp_path):
    entity = {"name": "sales", "source": {"type": "s3", "url": "s3://landing/sales"},
              "patterns": [{"name": "p", "glob_pattern": "/*.csv"}]}
    cfg = config.load(write_config(tmp_path, [entity], lake_dir="s3://lake/t/",
                                   storage={"access_key_id": "AKID", "secret_access_key": SECRET}))
    (e,) = cfg.entities
    assert e.table == "s3://lake/t/sales/table" and e.manifest_url == "s3://landing/sales/default.manifest.cdm.json"
    assert e.manifest == tmp_path / "state" / "sales" / "cdm" / "default.manifest.cdm.json"  # the working copy
    assert e.storage.access_key_id == "AKID" and SECRET not in repr(cfg) and SECRET not in str(e.storage)

    bad = {**entity, "manifest": "x.manifest.cdm.json", "source": {"type": "s3", "url": "s3://Bad_Bucket/x"}}
    with pytest.raises(ConfigError) as err:
        config.load(write_config(tmp_path, [bad], storage={"access_key_id": "AKID"}))
    text = str(err.value)
    assert "entities.0.source.s3.url" in text and "storage.secret_access_key" not in text
    assert "give both access_key_id and secret_access_key" in text
    with pytest.raises(ConfigError, match="keeps its manifest in the bucket"):
        config.load(write_config(tmp_path, [{**entity, "manifest": "x.manifest.cdm.json"}]))


def test_an_objects_identity_is_the_same_from_head_and_from_a_listing(store, moto):
    s3 = moto.client("s3")
    keys = ["sales/a b.csv", "sales/x+y.csv", "sales/é/z.csv"]
    for key in keys:
        s3.put_object(Bucket="landing", Key=key, Body=b"id\n1\n")
    upload = s3.create_multipart_upload(Bucket="landing", Key="sales/big.csv")
    part = s3.upload_part(Bucket="landing", Key="sales/big.csv", UploadId=upload["UploadId"], PartNumber=1,
                          Body=b"id\n" * 1000)
    s3.complete_multipart_upload(Bucket="landing", Key="sales/big.csv", UploadId=upload["UploadId"],
                                 MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]})
    listed = sorted(store.list("landing", "sales/"), key=lambda e: e.path)
    assert [e.path for e in listed] == sorted(f"s3://landing/{k}" for k in [*keys, "sales/big.csv"])
    assert listed == sorted((store.head(e.path) for e in listed), key=lambda e: e.path)
    assert all(e.etag and not e.etag.startswith('"') and e.mtime_ns % 1_000_000_000 == 0 for e in listed)
    assert store.head("s3://landing/sales/none.csv") is None
    assert store.delta_options(Path("/tmp/t")) is None
    options = store.delta_options("s3://lake/t")
    assert options["conditional_put"] == "etag" and options["AWS_ALLOW_HTTP"] == "true"
    assert SECRET not in str(store.describe())


def test_deliveries_and_listings_enqueue_each_object_once(tmp_path, store, moto):
    s3 = moto.client("s3")
    landing = _landing(tmp_path, store)
    assert landing.wanted("sales/2024/a.csv") and not landing.wanted("sales/_lake/table/part-0.parquet")
    assert not landing.wanted("sales/_delta_log/0.json") and not landing.wanted("sales/.hidden/a.csv")
    assert not landing.wanted("sales/default.manifest.cdm.json") and not landing.wanted("sales/a.csv.tmp")

    s3.put_object(Bucket="landing", Key="sales/a.csv", Body=b"id\n1\n")
    s3.put_object(Bucket="landing", Key="sales/_lake/table/part-0.parquet", Body=b"PAR1")
    body = parse(_event("sales/a.csv"), landing.scope)
    assert landing.deliver(list(body.events)) == 1
    assert landing.deliver(list(body.events)) == 0  # a redelivery
    assert landing.reconcile() == 0  # the listing recognises the notified object
    s3.put_object(Bucket="landing", Key="sales/b.csv", Body=b"id\n2\n")  # its notification was lost
    assert landing.reconcile() == 1 and landing.reconcile() == 0
    gone = parse(_event("sales/gone.csv"), landing.scope)  # removed before it was looked at
    assert landing.deliver(list(gone.events)) == 0
    s3.delete_object(Bucket="landing", Key="sales/a.csv")
    removal = parse(_event("sales/a.csv", name="ObjectRemoved:Delete"), landing.scope)
    assert landing.deliver(list(removal.events)) == 1 and landing.deliver(list(removal.events)) == 0
    records = _records(tmp_path)
    assert [(r.path, r.removed) for r in records] == [("s3://landing/sales/a.csv", False),
                                                      ("s3://landing/sales/b.csv", False),
                                                      ("s3://landing/sales/a.csv", True)]
    assert records[0].etag and records[0].size == 5


def test_a_narrowed_listing_starts_after_the_lookback(tmp_path, store, moto):
    from datetime import UTC, datetime

    s3 = moto.client("s3")
    landing = _landing(tmp_path, store, dated_prefix="date=%Y-%m-%d/", listing_lookback_s=86400)
    today = datetime.now(UTC).strftime("sales/date=%Y-%m-%d/new.csv")
    for key in ("sales/date=2020-01-01/old.csv", today):
        s3.put_object(Bucket="landing", Key=key, Body=b"id\n1\n")
    assert landing.start_after() > "sales/date=2020" and landing.start_after().startswith("sales/date=")
    assert landing.reconcile(narrowed=True) == 1  # today's only
    assert [r.path for r in _records(tmp_path)] == [f"s3://landing/{today}"]
    assert landing.reconcile() == 1  # the full listing reaches back


def test_the_mirror_publishes_whole_documents_and_says_what_is_wrong(tmp_path, store, moto):
    mirror = Mirror(store, tmp_path / "cdm", "s3://landing/sales")
    doc = tmp_path / "cdm" / "default.manifest.cdm.json"
    doc.parent.mkdir()
    doc.write_text('{"manifestName": "default"}')
    mirror.publish([doc, tmp_path / "cdm" / "absent.cdm.json"])
    got = moto.client("s3").get_object(Bucket="landing", Key="sales/default.manifest.cdm.json")["Body"].read()
    assert got == b'{"manifestName": "default"}'
    doc.unlink()
    assert mirror.pull(doc) and doc.read_text() == '{"manifestName": "default"}'
    assert not mirror.pull(tmp_path / "cdm" / "other.manifest.cdm.json")
    with pytest.raises(TerminalError, match="cannot write s3://nobucket/x/default.manifest.cdm.json.*bucket exists"):
        Mirror(store, tmp_path / "cdm", "s3://nobucket/x").publish([doc])


def test_data_files_in_a_bucket_are_written_without_folder_markers_and_swept_by_prefix(store, moto):
    """An object store has no folders: writing a partitioned table's files PUTs the files only (no empty
    `…/` marker objects per level, which doubled the requests of each file), and `sweep` still finds them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lakefeed.connectors.sinks import data_files

    fs, root = store.fs_of("s3://landing/lake/table")
    rows = pa.table({"day": ["2026-11-01", "2026-11-01", "2026-11-02"], "v": [1, 2, 3]})
    written = data_files.write(fs, root, rows, data_files.prefix("t0", 7) + "a", partition_by=("day",))
    keys = sorted(o["Key"] for o in moto.client("s3").list_objects_v2(Bucket="landing")["Contents"])
    assert keys == sorted(f"lake/table/{f.path}" for f in written) and len(keys) == 2
    assert not [k for k in keys if k.endswith("/")]
    assert sorted(pq.read_table(f"{root}/{written[0].path}", filesystem=fs).column("v").to_pylist()) == [1, 2]
    kept = [written[0].path]
    folders = [posixpath.dirname(f.path) for f in written]
    assert data_files.sweep(fs, root, data_files.prefix("t0", 7), kept, folders) == 1
    left = [o["Key"] for o in moto.client("s3").list_objects_v2(Bucket="landing")["Contents"]]
    # pyarrow keeps a folder it emptied as a marker object; only the kept file holds data.
    assert [k for k in left if not k.endswith("/")] == [f"lake/table/{written[0].path}"]


def test_a_table_in_a_bucket_is_compacted_and_vacuumed(store, moto):
    """Compaction and vacuum (daemon/pipeline/compaction.py) of a table in a bucket, through the sink: a commit that
    changes no row, then the replaced objects deleted."""
    import pyarrow as pa

    from lakefeed.connectors.sinks.delta_rs import DeltaRsSink

    sink = DeltaRsSink("s3://landing/lake/t", storage_options=store.delta_options("s3://landing/lake/t"))
    for n in range(4):
        sink.append(pa.table({"id": [2 * n, 2 * n + 1]}), "q1", n, {"lakefeed.batch_id": str(n)})

    def data() -> list[str]:
        objects = moto.client("s3").list_objects_v2(Bucket="landing", Prefix="lake/t/")["Contents"]
        return [o["Key"] for o in objects if o["Key"].endswith(".parquet") and "/_delta_log/" not in o["Key"]]

    assert len(data()) == 4
    assert sink.compact(1 << 20) == (4, 1)
    sink.vacuum(0)
    assert len(data()) == 1 and sorted(sink.to_arrow().column("id").to_pylist()) == list(range(8))
    assert sink.committed_version("q1") == 3
