"""The S3 landing's parts against a real moto server: config, object identity (HEAD = listing),
what counts as data, deliveries and listings into a real inbox, and the manifest mirror."""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote_plus

import pytest

from lakefeed.config import model as config
from lakefeed.config.sources import S3Source, S3Storage
from lakefeed.connectors.sources.s3_events import parse
from lakefeed.connectors.sources.s3_landing import S3Landing
from lakefeed.errors import ConfigError, TerminalError
from lakefeed.inbox import storage
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


def _event(key: str, name: str = "ObjectCreated:Put", sequencer: str = "0A") -> str:
    """An AWS notification body for one object of the bucket."""
    obj = {"key": quote_plus(key), "eTag": "0123", "sequencer": sequencer}
    if name.startswith("ObjectCreated"):
        obj["size"] = 5
    return json.dumps({"Records": [{"eventVersion": "2.1", "eventSource": "aws:s3", "eventName": name,
                                    "eventTime": "2026-11-22T09:00:00.000Z",
                                    "s3": {"bucket": {"name": "landing"}, "object": obj}}]})


def _records(tmp: Path):
    reader = InboxReader(tmp / "inbox")
    return reader.records(0, reader.refresh())


class _Log:
    """A structlog stand-in that keeps what `read_file` logs."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, object]]] = []

    def __getattr__(self, level: str):
        return lambda event, **kw: self.events.append((event, kw))


def _read(tmp: Path, moto, rec, key: tuple[str, str] = ("AKIDTEST", SECRET)) -> tuple[object, _Log]:
    """`read_file` of one inbox record, for an entity landing in s3://landing/sales/ of the server `moto` (or any
    with an `endpoint`), read with this access key."""
    from datetime import UTC, datetime

    from lakefeed.batch.discovery import Partition
    from lakefeed.batch.file_rows import read_file

    entity = {"name": "sales", "source": {"type": "s3", "url": "s3://landing/sales"},
              "patterns": [{"name": "p", "glob_pattern": "/**"}]}
    storage = {"access_key_id": key[0], "secret_access_key": key[1], "endpoint_override": moto.endpoint}
    (cfg,) = config.load(write_config(tmp, [entity], lake_dir=str(tmp / "lake"), storage=storage)).entities
    log = _Log()
    location = rec.path.removeprefix("s3://landing/sales/")
    return read_file(cfg, Storage(cfg.storage), rec, Partition(location), None, datetime.now(UTC), log), log


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


def test_a_removal_delivered_after_a_newer_creation_does_not_remove_the_object(tmp_path, store, moto):
    """SQS is unordered: put, delete, put again may arrive as the creation (03), then the old removal (02), in
    separate deliveries. The removal is stale: enqueuing it would drop a live partition (or retract a live snapshot)
    and make the next listing take the object a second time."""
    s3 = moto.client("s3")
    landing = _landing(tmp_path, store)
    s3.put_object(Bucket="landing", Key="sales/a.csv", Body=b"id\n1\n")
    s3.delete_object(Bucket="landing", Key="sales/a.csv")
    s3.put_object(Bucket="landing", Key="sales/a.csv", Body=b"id\n3\n")
    assert landing.deliver(list(parse(_event("sales/a.csv", sequencer="03"), landing.scope).events)) == 1
    stale = parse(_event("sales/a.csv", name="ObjectRemoved:Delete", sequencer="02"), landing.scope)
    assert landing.deliver(list(stale.events)) == 0
    assert landing.reconcile() == 0  # the inbox still says the object is there: nothing taken twice
    assert [(r.path, r.removed) for r in _records(tmp_path)] == [("s3://landing/sales/a.csv", False)]

    # A stale removal whose newer creation was not delivered yet: the object as it is now is enqueued instead.
    s3.put_object(Bucket="landing", Key="sales/b.csv", Body=b"id\n4\n")
    assert landing.deliver(list(parse(_event("sales/b.csv", name="ObjectRemoved:Delete"), landing.scope).events)) == 1
    s3.delete_object(Bucket="landing", Key="sales/b.csv")  # a removal of an object that is gone is taken
    assert landing.deliver(list(parse(_event("sales/b.csv", name="ObjectRemoved:Delete", sequencer="0B"),
                                      landing.scope).events)) == 1
    assert [(r.path, r.removed) for r in _records(tmp_path)][1:] == [("s3://landing/sales/b.csv", False),
                                                                     ("s3://landing/sales/b.csv", True)]


def test_a_record_reads_only_the_version_it_names(tmp_path, store, moto):
    """Rewritten within the same second with the same size, an object keeps its size and LastModified: only the
    ETag tells the versions apart. The older record must not read the newer bytes (one version lost, the other
    taken twice): it is superseded, and the newer record reads them."""
    import time

    s3 = moto.client("s3")
    landing = _landing(tmp_path, store)
    while time.time() % 1 > 0.3:  # both writes in one second
        time.sleep(0.05)
    for body in (b"id\n1\n", b"id\n2\n"):
        s3.put_object(Bucket="landing", Key="sales/a.csv", Body=body)
        assert landing.deliver(list(parse(_event("sales/a.csv"), landing.scope).events)) == 1
    old, new = _records(tmp_path)
    assert (old.size, old.mtime_ns) == (new.size, new.mtime_ns) and old.etag != new.etag
    assert _read(tmp_path, moto, old)[0] is None
    rows, _ = _read(tmp_path, moto, new)
    assert rows[1].column("id").to_pylist() == [2] and rows[2] == []
    with pytest.raises(storage.Replaced, match="newer version"):
        store.fetch(old.path, tmp_path / "copy", old.etag)
    assert store.fetch(new.path, tmp_path / "copy", new.etag) == store.head(new.path)
    assert (tmp_path / "copy").read_bytes() == b"id\n2\n"


def test_listings_take_keys_by_the_rule_notifications_follow(tmp_path, store, moto):
    """`a//b.csv` cannot be a path and `x/` is a folder marker: a notification rejects the one and ignores the
    other, and so does a listing (the one is quarantined with the reason). Records an inbox holds from before, and
    objects the store will not give (archived), are quarantined when read: never a dead query or endless retries."""
    from lakefeed.inbox.files import InboxRecord

    s3 = moto.client("s3")
    landing = _landing(tmp_path, store)
    keys = {"sales/a//b.csv": b"id\n1\n", "sales/date=2026-11-22/": b"", "sales/ok.csv": b"id\n2\n"}
    for key, body in keys.items():
        s3.put_object(Bucket="landing", Key=key, Body=body)
    notified = [parse(_event(key), landing.scope) for key in keys]
    assert "not normalized" in notified[0].rejected[0].reason and "folder marker" in notified[1].ignored[0]
    assert landing.reconcile() == 2 and landing.reconcile() == 0
    bad, ok = _records(tmp_path)
    assert (bad.path, ok.path, ok.problem) == ("s3://landing/sales/a//b.csv", "s3://landing/sales/ok.csv", "")
    assert "not normalized" in bad.problem and "rename the object" in bad.problem

    for n, key in enumerate(["sales/a//b.csv", "sales/date=2026-11-22/"]):
        head = store.head(f"s3://landing/{key}")
        legacy = InboxRecord(10 + n, head.path, head.size, head.mtime_ns, "", head.etag)
        (_, table, (why,)), _ = _read(tmp_path, moto, legacy)
        assert table is None and ("not normalized" in why.reason or "folder marker" in why.reason)
    s3.put_object(Bucket="landing", Key="sales/cold.csv", Body=b"id\n3\n", StorageClass="GLACIER")
    cold = store.head("s3://landing/sales/cold.csv")
    (_, table, (why,)), _ = _read(tmp_path, moto, InboxRecord(12, cold.path, cold.size, cold.mtime_ns, "", cold.etag))
    assert table is None and "InvalidObjectState" in why.reason and "restore it" in why.reason
    assert cold.path in why.reason


def test_the_local_copy_of_an_object_has_a_bounded_safe_name(tmp_path, store, moto):
    """A key's name may be 1,024 bytes, a local file name 255: the copy is named by offset and a bounded part of
    the key's name, so an object with a long name is read, not retried for ever (ENAMETOOLONG is a store fault)."""
    key = "sales/" + "é" * 200 + "a" * 300 + ".csv"
    moto.client("s3").put_object(Bucket="landing", Key=key, Body=b"id\n1\n")
    landing = _landing(tmp_path, store)
    assert landing.deliver(list(parse(_event(key), landing.scope).events)) == 1
    (rec,) = _records(tmp_path)
    rows, _ = _read(tmp_path, moto, rec)
    assert rows[1].column("id").to_pylist() == [1]
    from lakefeed.batch.file_rows import staged_name

    assert staged_name(7, f"s3://landing/{key}") == "7-" + "_" * 80 + ".csv"


def test_a_store_that_cannot_be_listed_at_start_is_listed_again_later(tmp_path, store, moto):
    """A bucket not there yet (or a store down) when the entity starts: the start goes on, says so, and the next
    listing takes what landed meanwhile."""
    from tests.conftest import wait_for

    moto.client("s3").delete_bucket(Bucket="landing")
    landing = _landing(tmp_path, store, reconcile_interval_s=0.2)
    landing.start()
    try:
        moto.client("s3").create_bucket(Bucket="landing")
        moto.client("s3").put_object(Bucket="landing", Key="sales/a.csv", Body=b"id\n1\n")
        wait_for(lambda: [r.path for r in _records(tmp_path)] == ["s3://landing/sales/a.csv"], 30, 0.1, "a.csv")
    finally:
        landing.stop()


_ADMIN = [{"Effect": "Allow", "Action": "*", "Resource": "*"}]


def test_an_object_denied_alone_is_quarantined_and_a_bucket_denied_is_a_store_fault(tmp_path, store, moto):
    """IAM denies s3:GetObject on one object, the bucket stays readable: that object is quarantined with a reason
    naming it and what to grant, and the next object is read; no retry would mend it, and retrying held up all
    behind it. The same AccessDenied for credentials the bucket refuses is a store fault: retried, not quarantined.
    HEAD is denied too (it needs s3:GetObject): a notification of the denied object takes its identity from a
    listing of its key, so the transport does not fail its message for ever either."""
    admin = s3_server.iam_user(moto, "admin", _ADMIN)
    reader = s3_server.iam_user(moto, "reader", [
        {"Effect": "Allow", "Action": "s3:*", "Resource": "*"},
        {"Effect": "Deny", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::landing/sales/secret.csv"}])
    elsewhere = ["arn:aws:s3:::elsewhere", "arn:aws:s3:::elsewhere/*"]
    outsider = s3_server.iam_user(moto, "outsider", [{"Effect": "Allow", "Action": "s3:*", "Resource": elsewhere}])
    as_reader = Storage(S3Storage(endpoint_override=moto.endpoint, region=moto.region, access_key_id=reader[0],
                                  secret_access_key=reader[1]))
    landing = _landing(tmp_path, as_reader)
    with s3_server.iam_enforced(moto):
        s3 = s3_server.client_of(moto.endpoint, admin)
        for key in ("sales/secret.csv", "sales/ok.csv"):
            s3.put_object(Bucket="landing", Key=key, Body=b"id\n1\n")
            assert landing.deliver(list(parse(_event(key), landing.scope).events)) == 1
        secret, ok = _records(tmp_path)
        etag = s3.head_object(Bucket="landing", Key="sales/secret.csv")["ETag"].strip('"')
        assert (secret.path, secret.size, secret.etag) == ("s3://landing/sales/secret.csv", 5, etag)

        (_, table, (why,)), _ = _read(tmp_path, moto, secret, reader)
        assert table is None and why.reason.startswith("s3://landing/sales/secret.csv: ")
        assert "AccessDenied" in why.reason and "grant s3:GetObject" in why.reason
        assert s3.head_object(Bucket="landing", Key="sales/secret.csv")  # left in the bucket
        rows, _ = _read(tmp_path, moto, ok, reader)
        assert rows[1].column("id").to_pylist() == [1]

        with pytest.raises(OSError, match="AccessDenied.*listing its bucket fails too.*check the credentials"):
            _read(tmp_path, moto, ok, outsider)
        as_outsider = Storage(S3Storage(endpoint_override=moto.endpoint, region=moto.region,
                                        access_key_id=outsider[0], secret_access_key=outsider[1]))
        with pytest.raises(storage.boto_errors.ClientError):
            as_outsider.head(ok.path)  # a notification's look fails: its message comes back, nothing is skipped
        s3.delete_object(Bucket="landing", Key="sales/secret.csv")
        assert _read(tmp_path, moto, secret, reader)[0] is None  # denied, and the bucket lists no such key: gone


def test_an_object_encrypted_with_a_customer_key_is_quarantined(tmp_path):
    """SSE-C: the store gives the object only to whoever sends its key, which lakefeed does not hold (GetObject
    answers 400, HEAD too). Quarantined with the reason, never retried; the object stays in the bucket.
    moto has no SSE-C; SeaweedFS has."""
    with s3_server.seaweedfs(tmp_path / "seaweed") as weed:
        s3 = weed.client()
        s3.create_bucket(Bucket="landing")
        s3.put_object(Bucket="landing", Key="sales/sealed.csv", Body=b"id\n1\n", SSECustomerAlgorithm="AES256",
                      SSECustomerKey="k" * 32)
        s3.put_object(Bucket="landing", Key="sales/open.csv", Body=b"id\n2\n")
        store = Storage(S3Storage(endpoint_override=weed.endpoint, region="us-east-1", access_key_id=weed.key[0],
                                  secret_access_key=weed.key[1]))
        landing = _landing(tmp_path, store)
        for key in ("sales/sealed.csv", "sales/open.csv"):
            assert landing.deliver(list(parse(_event(key), landing.scope).events)) == 1
        sealed, plain = _records(tmp_path)
        (_, table, (why,)), _ = _read(tmp_path, weed, sealed, weed.key)
        assert table is None and why.reason.startswith("s3://landing/sales/sealed.csv is encrypted with a "
                                                       "customer-provided key (SSE-C")
        assert "land it again unencrypted" in why.reason
        rows, _ = _read(tmp_path, weed, plain, weed.key)
        assert rows[1].column("id").to_pylist() == [2]
        assert s3.list_objects_v2(Bucket="landing", Prefix="sales/sealed.csv")["KeyCount"] == 1


def _removals(tmp: Path) -> list[str]:
    return [r.path for r in _records(tmp) if r.removed]


def test_a_listing_records_each_removal_no_notification_announced_once(tmp_path, store, moto):
    """An `ObjectRemoved` notification lost: the next complete listing of the object's range no longer finds it and
    records its removal, once, whichever of it and a late notification comes first. An object written and notified
    after the listing passed its key is not removed (the HEAD finds it); a narrowed listing removes nothing it did
    not cover."""
    s3 = moto.client("s3")
    keys = ["sales/a.csv", "sales/b.csv", "sales/c.csv", "sales/date=2020-01-01/old.csv"]
    for key in keys:
        s3.put_object(Bucket="landing", Key=key, Body=b"id\n1\n")
    landing = _landing(tmp_path, store, dated_prefix="date=%Y-%m-%d/", listing_lookback_s=86400)
    assert landing.reconcile() == 4

    s3.delete_object(Bucket="landing", Key="sales/b.csv")  # its notification is lost
    assert landing.reconcile() == 1 and landing.reconcile() == 0
    assert _removals(tmp_path) == ["s3://landing/sales/b.csv"]
    late = parse(_event("sales/b.csv", name="ObjectRemoved:Delete"), landing.scope)
    assert landing.deliver(list(late.events)) == 0  # the listing recorded it already

    s3.delete_object(Bucket="landing", Key="sales/c.csv")  # notified first this time
    assert landing.deliver(list(parse(_event("sales/c.csv", name="ObjectRemoved:Delete"), landing.scope).events)) == 1
    assert landing.reconcile() == 0
    assert _removals(tmp_path) == ["s3://landing/sales/b.csv", "s3://landing/sales/c.csv"]

    s3.delete_object(Bucket="landing", Key="sales/date=2020-01-01/old.csv")
    assert landing.reconcile(narrowed=True) == 0  # before the lookback: not listed, so not known to be gone
    assert landing.reconcile() == 1
    assert _removals(tmp_path)[-1] == "s3://landing/sales/date=2020-01-01/old.csv"

    s3.put_object(Bucket="landing", Key="sales/b.csv", Body=b"id\n2\n")  # back: taken again, and removable again
    assert landing.reconcile() == 1
    s3.delete_object(Bucket="landing", Key="sales/b.csv")
    assert landing.reconcile() == 1
    assert [(r.path, r.removed) for r in _records(tmp_path) if r.path.endswith("/b.csv")] == [
        ("s3://landing/sales/b.csv", False), ("s3://landing/sales/b.csv", True),
        ("s3://landing/sales/b.csv", False), ("s3://landing/sales/b.csv", True)]


class _WritesAfterTheListing(Storage):
    """A store on which, once a listing has gone by, an object lands and its notification is delivered (a real PUT
    and a real delivery, timed between the listing and the look at what it did not find)."""

    then: Callable[[], None] = staticmethod(lambda: None)

    def list(self, bucket: str, prefix: str, start_after: str = ""):
        yield from super().list(bucket, prefix, start_after)
        self.then()


def test_an_object_written_after_the_listing_passed_its_key_is_not_removed(tmp_path, store, moto):
    s3 = moto.client("s3")
    racing = _WritesAfterTheListing(store.cfg)
    landing = _landing(tmp_path, racing)
    s3.put_object(Bucket="landing", Key="sales/a.csv", Body=b"id\n1\n")
    assert landing.reconcile() == 1
    s3.delete_object(Bucket="landing", Key="sales/a.csv")

    def land_again() -> None:
        s3.put_object(Bucket="landing", Key="sales/a.csv", Body=b"id\n22\n")
        assert landing.deliver(list(parse(_event("sales/a.csv"), landing.scope).events)) == 1

    racing.then = land_again
    assert landing.reconcile() == 0  # the listing missed a.csv, the inbox holds it, and it is there
    assert _removals(tmp_path) == []
    racing.then = lambda: None
    assert landing.reconcile() == 0


def test_a_listing_that_fails_part_way_records_no_removal(tmp_path, store, moto):
    """The second page of a listing is refused (moto checks credentials from its second request on): what the
    listing did not reach is not gone, so nothing is removed, not even what the first page missed. The next
    complete listing records the one removal."""
    from concurrent.futures import ThreadPoolExecutor

    s3 = moto.client("s3")
    keys = [f"sales/p{i:04d}.csv" for i in range(1002)]  # two pages of a listing, one deleted
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: s3.put_object(Bucket="landing", Key=k, Body=b"id\n1\n"), keys))
    landing = _landing(tmp_path, store)
    assert landing.reconcile() == 1002
    s3.delete_object(Bucket="landing", Key="sales/p0005.csv")
    with s3_server.iam_enforced(moto, unchecked=1), pytest.raises(storage.boto_errors.ClientError,
                                                                  match="ListObjectsV2"):
        landing.reconcile()
    assert _removals(tmp_path) == []
    assert landing.reconcile() == 1 and _removals(tmp_path) == ["s3://landing/sales/p0005.csv"]
