"""A bucket as an entity's landing place, against a real daemon and a real moto server on loopback:
S3 bucket notifications to SQS and to SNS → the daemon's webhook, MinIO events on a Kafka topic,
listings that catch lost notifications, crashes around the queue, and the Delta tables and CDM
manifest kept in the bucket too."""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus

import pytest
from deltalake import DeltaTable

from lakefeed.intake.push_api import token_hash
from tests import s3_server
from tests.conftest import wait_for, write_config
from tests.kafka_broker import kafka_broker  # noqa: F401 - a fixture
from tests.test_daemon_process import Daemon

TOKEN = "hook-secret"
OBJECTS = {  # key → CSV body; keys with a space, a plus, an accent, nesting
    "sales/a b.csv": "id,v\n1,a\n2,b\n",
    "sales/x+y.csv": "id,v\n3,c\n",
    "sales/é/nested/deep/z.csv": "id,v\n4,d\n5,e\n",
}


@pytest.fixture(scope="module")
def moto():
    with s3_server.running() as server:
        yield server


@pytest.fixture
def bucket(moto):
    moto.reset()
    moto.client("s3").create_bucket(Bucket="lake")
    return moto


def _entity(notifications: list[dict[str, Any]], **source: Any) -> dict[str, Any]:
    return {"name": "sales",
            "source": {"type": "s3", "url": "s3://landing/", "notifications": notifications,
                       "reconcile_interval_s": 600, **source},
            "patterns": [{"name": "any", "root_location": "sales", "regular_expression": r"/.+\.csv"}],
            "format": {"kind": "csv", "header": True}}


SECRET = "s3cr3t-from-the-config"  # moto takes any key; the daemon must never log it


def _config(tmp: Path, server: s3_server.MotoServer, entity: dict[str, Any],
            key: tuple[str, str] = ("AKIDCONFIG", SECRET)) -> Path:
    return write_config(tmp, [entity], lake_dir="s3://lake/tables",
                        storage={"endpoint_override": server.endpoint, "region": server.region,
                                 "access_key_id": key[0], "secret_access_key": key[1]})


def _delta_options(server: s3_server.MotoServer, key: tuple[str, str] = ("testing", "testing")) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": server.endpoint, "AWS_ALLOW_HTTP": "true", "AWS_REGION": server.region,
            "AWS_ACCESS_KEY_ID": key[0], "AWS_SECRET_ACCESS_KEY": key[1]}


def _read(server: s3_server.MotoServer, table: str, key: tuple[str, str] = ("testing", "testing")
          ) -> list[dict[str, Any]]:
    try:
        delta = DeltaTable(f"s3://lake/tables/sales/{table}", storage_options=_delta_options(server, key))
    except Exception:  # not created yet
        return []
    return delta.to_pyarrow_table().to_pylist()


def _rows(server: s3_server.MotoServer, key: tuple[str, str] = ("testing", "testing")) -> list[tuple[int, str, str]]:
    """The table's rows, each with the file the changelog says it came from."""
    origin = {r["id"]: r["source_file"] for r in _read(server, "changelog", key)}
    return sorted((r["id"], r["v"], origin.get(r["id"], "?")) for r in _read(server, "table", key))


def _expected(objects: dict[str, str]) -> list[tuple[int, str, str]]:
    rows = []
    for key, body in objects.items():
        for line in body.splitlines()[1:]:
            i, v = line.split(",")
            rows.append((int(i), v, key))
    return sorted(rows)


def _manifest(server: s3_server.MotoServer) -> dict[str, Any] | None:
    try:
        body = server.client("s3").get_object(Bucket="landing", Key="default.manifest.cdm.json")["Body"].read()
    except server.client("s3").exceptions.NoSuchKey:
        return None
    return json.loads(body)


def _partitions(server: s3_server.MotoServer) -> set[str]:
    doc = _manifest(server)
    if doc is None:
        return set()
    (entity,) = doc["entities"]
    return {p["location"] for p in entity.get("dataPartitions", [])}


def _put(server: s3_server.MotoServer, key: str, body: str) -> None:
    server.client("s3").put_object(Bucket="landing", Key=key, Body=body.encode())


def _multipart(server: s3_server.MotoServer, key: str, body: str) -> None:
    s3 = server.client("s3")
    upload = s3.create_multipart_upload(Bucket="landing", Key=key)
    part = s3.upload_part(Bucket="landing", Key=key, UploadId=upload["UploadId"], PartNumber=1, Body=body.encode())
    s3.complete_multipart_upload(Bucket="landing", Key=key, UploadId=upload["UploadId"],
                                 MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]})


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(tmp_path / "lakefeed.yaml", tmp_path / "daemon.log")
    yield d
    d.kill()


def test_sqs_notifications_land_each_object_once_and_the_bucket_manifest_follows(tmp_path, bucket, daemon):
    queue = s3_server.bucket_to_queue(bucket, "landing", "events")
    _config(tmp_path, bucket, _entity([{"type": "sqs", "queue_url": queue, "wait_time_s": 1}]))
    daemon.start()
    objects = dict(OBJECTS)
    for key, body in objects.items():
        _put(bucket, key, body)
    big = "id,v\n" + "".join(f"{i},m\n" for i in range(100, 1100))
    _multipart(bucket, "sales/big.csv", big)  # moto notifies a multipart upload twice
    objects["sales/big.csv"] = big
    wait_for(lambda: _rows(bucket) == _expected(objects), 60, 0.3, "every object's rows, once")
    wait_for(lambda: _partitions(bucket) == set(objects), 30, 0.3, "the manifest in the bucket")

    bucket.client("s3").delete_object(Bucket="landing", Key="sales/x+y.csv")
    del objects["sales/x+y.csv"]
    wait_for(lambda: _partitions(bucket) == set(objects), 30, 0.3, "the removal in the bucket's manifest")
    (entity,) = _manifest(bucket)["entities"]
    assert entity["lastFileStatusCheckTime"] and entity["lastChildFileModifiedTime"]
    # The schema document the manifest points at is in the bucket too.
    schema = bucket.client("s3").get_object(Bucket="landing", Key="sales.cdm.json")["Body"].read()
    assert json.loads(schema)["definitions"][0]["entityName"] == "sales"
    assert s3_server.depth(bucket, queue) == 0
    daemon.stop(60)
    assert daemon.events("file.enqueued") == 4  # the duplicate multipart event was recognised
    log = daemon.log.read_text()
    assert SECRET not in log and '"access_key_id": "AKID\\u2026"' in log  # masked, and the key id shortened
    # The ODF dataset lives in the bucket beside the tables: slices copied server-side, and it verifies.
    from lakefeed.config import model as config_module
    from lakefeed.inbox.storage import Storage
    from lakefeed.odf.chain import OdfChain

    cfg = config_module.load(tmp_path / "lakefeed.yaml").entities[0]
    keys = [o["Key"] for o in bucket.client("s3").list_objects_v2(Bucket="lake", Prefix="tables/sales/odf/")
            .get("Contents", [])]
    assert "tables/sales/odf/refs/head" in keys and any("/odf/data/f1620" in k for k in keys)
    assert OdfChain(cfg, Storage(cfg.storage)).check() == []


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def _url(tmp: Path) -> str:
    return json.loads((tmp / "state" / "http.json").read_text())["url"]


def test_listings_find_what_lost_notifications_never_announced(tmp_path, bucket, daemon):
    queue = s3_server.bucket_to_queue(bucket, "landing", "events")
    entity = _entity([{"type": "sqs", "queue_url": queue, "wait_time_s": 1}], reconcile_interval_s=1.5,
                     dated_prefix="sales/date=%Y-%m-%d/", listing_lookback_s=86400)
    _config(tmp_path, bucket, entity)
    daemon.start()
    objects = {"sales/date=2026-11-22/a.csv": "id,v\n1,a\n"}
    _put(bucket, "sales/date=2026-11-22/a.csv", objects["sales/date=2026-11-22/a.csv"])
    wait_for(lambda: _rows(bucket) == _expected(objects), 60, 0.3, "the notified object")
    daemon.stop(60)

    # Down: two objects land, and the queue loses their notifications.
    for key, body in {"sales/date=2026-11-21/b.csv": "id,v\n2,b\n", "sales/c.csv": "id,v\n3,c\n"}.items():
        _put(bucket, key, body)
        objects[key] = body
    bucket.client("sqs").purge_queue(QueueUrl=queue)
    assert s3_server.depth(bucket, queue) == 0
    daemon.start()
    wait_for(lambda: _rows(bucket) == _expected(objects), 60, 0.3, "the startup listing's finds")
    url = _url(tmp_path)
    assert _metric(url, "lakefeed_reconcile_found_total") == 2

    # Up, notifications off: the periodic listing, narrowed to the recent dates, finds today's object...
    bucket.client("s3").put_bucket_notification_configuration(Bucket="landing", NotificationConfiguration={})
    from datetime import UTC, datetime
    today = datetime.now(UTC).strftime("sales/date=%Y-%m-%d/d.csv")
    _put(bucket, today, "id,v\n4,d\n")
    objects[today] = "id,v\n4,d\n"
    _put(bucket, "sales/date=2020-01-01/old.csv", "id,v\n5,e\n")  # ...not this one: before the lookback
    wait_for(lambda: _rows(bucket) == _expected(objects), 30, 0.3, "the periodic listing's find")
    assert _metric(url, "lakefeed_reconcile_found_total") == 3
    listed = [json.loads(line) for line in daemon.log.read_text().splitlines() if '"event": "source.listed"' in line]
    assert listed[-1]["start_after"].startswith("sales/date=") and listed[-1]["start_after"] > "sales/date=2020"
    warnings = [json.loads(line) for line in daemon.log.read_text().splitlines()
                if '"event": "source.missed_events"' in line]
    assert [w["level"] for w in warnings] == ["warning"] * 2 and sum(w["files"] for w in warnings) == 3

    # A removal whose notification is lost: the periodic listing records it, once, and the manifest drops it.
    wait_for(lambda: _partitions(bucket) == set(objects), 30, 0.3, "every object in the bucket's manifest")
    bucket.client("s3").delete_object(Bucket="landing", Key=today)
    present = set(objects) - {today}
    wait_for(lambda: _partitions(bucket) == present, 30, 0.3, "the removal found by a listing, in the manifest")
    listings = daemon.events("source.listed")
    wait_for(lambda: daemon.events("source.listed") >= listings + 2, 30, 0.3, "two more listings")
    assert daemon.events("object.removed") == 1 and daemon.events("source.missed_removals") == 1
    assert _metric(url, "lakefeed_reconcile_found_total") == 3  # removals are not objects found
    daemon.stop(60)
    bucket.client("s3").delete_object(Bucket="landing", Key="sales/c.csv")  # down, and before the narrowed range
    present -= {"sales/c.csv"}
    daemon.start()  # a full listing at start-up reaches back to every date
    objects["sales/date=2020-01-01/old.csv"] = "id,v\n5,e\n"
    present.add("sales/date=2020-01-01/old.csv")
    wait_for(lambda: _rows(bucket) == _expected(objects), 60, 0.3, "the old object, at the next start")
    wait_for(lambda: _partitions(bucket) == present, 30, 0.3, "the removal found at start-up, in the manifest")
    daemon.stop(60)
    assert daemon.events("object.removed") == 2  # the table keeps the rows of removed objects; the manifest not


def _post(url: str, body: bytes, token: str | None = TOKEN, path: str = "/v1/entities/sales/notifications"
          ) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "text/plain; charset=UTF-8"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url + path, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_sns_http_notifications_reach_the_webhook_and_bad_events_are_set_aside(tmp_path, bucket, daemon):
    from tests.test_s3_events import MINIO, SUBSCRIPTION_CONFIRMATION

    topic = s3_server.bucket_to_topic(bucket, "landing", "events")
    hook = {"type": "webhook", "tokens_sha256": [token_hash(TOKEN)], "topic_arns": [topic]}
    _config(tmp_path, bucket, _entity([hook]))
    daemon.start()
    url = _url(tmp_path)
    bucket.client("sns").subscribe(TopicArn=topic, Protocol="http",
                                   Endpoint=f"{url}/v1/entities/sales/notifications?token={TOKEN}")
    for key, body in OBJECTS.items():
        _put(bucket, key, body)  # moto POSTs each notification to the daemon before it answers the PUT
    wait_for(lambda: _rows(bucket) == _expected(OBJECTS), 60, 0.3, "every object, through SNS")

    # Subscription confirmations: fetched for a listed topic at the store's endpoint, refused otherwise.
    mine = json.loads(SUBSCRIPTION_CONFIRMATION)
    mine.update(TopicArn=topic, SubscribeURL=f"{bucket.endpoint}/?Action=ConfirmSubscription&TopicArn={topic}"
                                             "&Token=2336412f")
    assert _post(url, json.dumps(mine).encode()) == (200, {"confirmed": topic})
    assert _post(url, SUBSCRIPTION_CONFIRMATION.encode())[0] == 403  # a topic not listed

    # Bad events: answered (a resend would not mend them), set aside with the reason; nothing enqueued.
    wrong_bucket = MINIO.replace('"name": "landing"', '"name": "elsewhere"')
    unknown = MINIO.replace('"eventName": "s3:ObjectCreated:Put"', '"eventName": "s3:ObjectCreated:Teleport"')
    traversal = MINIO.replace("sales%2F2024", "sales%2F..%2F..%2Fetc")
    for body in (b"{not json", wrong_bucket.encode(), unknown.encode(), traversal.encode()):
        status, answer = _post(url, body)
        assert status == 200 and answer["rejected"] == 1 and answer["enqueued"] == 0, answer
    aside = [json.loads(line) for line in (tmp_path / "state" / "sales" / "poison.jsonl").read_text().splitlines()]
    reasons = [a["reason"] for a in aside]
    assert "malformed JSON" in reasons[1] and "elsewhere" in reasons[2] and "Teleport" in reasons[3]
    assert "'..' segment" in reasons[4] and "refused" in reasons[0]
    assert _post(url, b"{}", token="wrong")[0] == 401
    assert _post(url, b"{}", token=None)[0] == 401
    assert _post(url, b"{}", path="/v1/entities/nobody/notifications")[0] == 404
    # Still running: the next object lands.
    _put(bucket, "sales/after.csv", "id,v\n9,z\n")
    wait_for(lambda: _rows(bucket) == _expected({**OBJECTS, "sales/after.csv": "id,v\n9,z\n"}), 60, 0.3, "later")
    daemon.stop(60)


@pytest.mark.parametrize(("point", "writer"), [("sqs.received", "delta-rs"), ("sqs.offered", "delta-spark")])
def test_a_sigkill_around_the_queue_loses_nothing_and_duplicates_nothing(tmp_path, bucket, daemon, point, writer):
    """Killed around the queue, restarted: every object once, with the lake's tables in S3 written by either
    writer (delta-spark through s3a, told the config's endpoint and keys)."""
    # Notified for the data's prefix only, as one would set it up: lakefeed's manifest uploads stay quiet.
    queue = s3_server.bucket_to_queue(bucket, "landing", "events", prefix="sales/", VisibilityTimeout="2")
    s3_server.drain(bucket, queue)  # the s3:TestEvent: the failpoint is for the objects' messages
    _config(tmp_path, bucket, {**_entity([{"type": "sqs", "queue_url": queue, "wait_time_s": 1,
                                           "visibility_timeout_s": 2}]), "writer": writer})
    daemon.start(env={"LAKEFEED_FAILPOINT": point})
    for key, body in OBJECTS.items():
        _put(bucket, key, body)
    assert daemon.wait(60) == -signal.SIGKILL
    assert s3_server.depth(bucket, queue) >= 1  # not deleted: it comes back
    daemon.start()
    wait_for(lambda: _rows(bucket) == _expected(OBJECTS) and s3_server.depth(bucket, queue) == 0, 60, 0.3,
             "every object once, and the queue empty")
    daemon.stop(60)
    assert _rows(bucket) == _expected(OBJECTS)
    # The commits, read with boto3: delta-rs's history() holds the GIL that this process's moto needs to answer.
    s3 = bucket.client("s3")
    logs = s3.list_objects_v2(Bucket="lake", Prefix="tables/sales/table/_delta_log/")["Contents"]
    engines = {json.loads(line)["commitInfo"].get("engineInfo", "") for log in logs if log["Key"].endswith(".json")
               for line in s3.get_object(Bucket="lake", Key=log["Key"])["Body"].read().decode().splitlines()
               if "commitInfo" in line}
    assert {"Delta-Lake/" in engine for engine in engines} == {writer == "delta-spark"}, engines
    assert SECRET not in daemon.log.read_text()


def _minio_record(bucket: s3_server.MotoServer, key: str) -> dict[str, Any]:
    """A MinIO Kafka-target value for an object as the store has it (recorded shape, real key/size/eTag)."""
    from tests.test_s3_events import MINIO

    head = bucket.client("s3").head_object(Bucket="landing", Key=key)
    value = json.loads(MINIO)
    value["Key"] = f"landing/{key}"
    obj = value["Records"][0]["s3"]["object"]
    obj.update(key=quote_plus(key, safe=""), size=head["ContentLength"], eTag=head["ETag"].strip('"'))
    value["Records"][0]["eventTime"] = head["LastModified"].isoformat()
    return value


def test_minio_events_on_a_kafka_topic_are_ingested_and_committed(tmp_path, bucket, daemon,
                                                                 kafka_broker):  # noqa: F811
    from kafka import KafkaAdminClient, TopicPartition

    bucket.client("s3").create_bucket(Bucket="landing")
    topic = kafka_broker.create_topic(f"minio-events-{tmp_path.name[-8:]}", 1)
    group = f"lakefeed-{tmp_path.name[-8:]}"
    notifications = [{"type": "kafka", "bootstrap_servers": kafka_broker.bootstrap, "topic": topic,
                      "group_id": group}]
    _config(tmp_path, bucket, _entity(notifications))
    daemon.start()  # the bucket is empty: only the topic can announce what lands now
    for key, body in OBJECTS.items():
        _put(bucket, key, body)
    values = [_minio_record(bucket, key) for key in OBJECTS]
    values.append({"EventName": "s3:ObjectCreated:Put", "Key": "landing/sales/../x", "Records": "nope"})
    kafka_broker.produce(topic, values, partition=0)
    wait_for(lambda: _rows(bucket) == _expected(OBJECTS), 60, 0.3, "every object, through Kafka")

    def committed() -> int:
        admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
        try:
            offsets = admin.list_group_offsets(group).get(group, {})
        finally:
            admin.close()
        meta = offsets.get(TopicPartition(topic, 0))
        return meta.offset if meta else -1

    wait_for(lambda: committed() == len(values), 30, 0.3, "the group's offset past every record")
    aside = (tmp_path / "state" / "sales" / "poison.jsonl").read_text()
    assert f"kafka/{topic}/0/3" in aside and "Records is not a non-empty list" in aside
    daemon.stop(60)
    assert daemon.events("file.enqueued") == len(OBJECTS)


def test_objects_that_cannot_be_paths_never_stall_the_entity(tmp_path, bucket, daemon):
    """A key with a 300-byte name (a local copy named after it: ENAMETOOLONG, a store fault retried for ever) and a
    key with an empty segment (`x//b.csv`: pyarrow refuses the path and the query died), found by a listing, then a
    good object: the long name is read, `x//b.csv` is quarantined with the reason, the good object's rows arrive,
    and no batch is retried."""
    bucket.client("s3").create_bucket(Bucket="landing")
    _config(tmp_path, bucket, _entity([], reconcile_interval_s=1.0))
    long_name = "sales/" + "a" * 300 + ".csv"
    objects = {long_name: "id,v\n1,a\n"}
    _put(bucket, long_name, objects[long_name])
    _put(bucket, "sales/x//b.csv", "id,v\n2,b\n")
    daemon.start()  # the start-up listing finds both
    wait_for(lambda: daemon.events("batch.committed") >= 1, 60, 0.3, "the first objects' batch")
    _put(bucket, "sales/c.csv", "id,v\n3,c\n")
    objects["sales/c.csv"] = "id,v\n3,c\n"
    wait_for(lambda: _rows(bucket) == _expected(objects), 60, 0.3, "the long-named and the later object")
    parked = [(r["source_file"], r["reason"]) for r in _read(bucket, "quarantine")]
    assert len(parked) == 1 and "x//b.csv" in parked[0][0] and "not normalized" in parked[0][1], parked
    assert daemon.events("batch.retrying") == 0 and daemon.events("entity.failed") == 0
    daemon.stop(60)


def test_an_object_the_store_refuses_alone_never_holds_up_the_objects_behind_it(tmp_path, bucket, daemon,
                                                                               monkeypatch):
    """The daemon's credentials may list and read the bucket, but IAM denies s3:GetObject on one object (moto checks
    every request against its IAM users here). That object was retried for ever and every object after it waited
    behind it; now it is quarantined with the reason, stays in the bucket, and the others' rows arrive."""
    monkeypatch.delenv("AWS_SESSION_TOKEN")  # delta-rs adds it to the users' keys: moto then refuses them
    admin = s3_server.iam_user(bucket, "admin", [{"Effect": "Allow", "Action": "*", "Resource": "*"}])
    reader = s3_server.iam_user(bucket, "reader", [
        {"Effect": "Allow", "Action": "s3:*", "Resource": "*"},
        {"Effect": "Deny", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::landing/sales/secret.csv"}])
    s3 = s3_server.client_of(bucket.endpoint, admin)
    s3.create_bucket(Bucket="landing")
    _config(tmp_path, bucket, _entity([], reconcile_interval_s=1.0), key=reader)
    objects = {"sales/a.csv": "id,v\n1,a\n"}
    with s3_server.iam_enforced(bucket):
        s3.put_object(Bucket="landing", Key="sales/secret.csv", Body=b"id,v\n2,b\n")
        s3.put_object(Bucket="landing", Key="sales/a.csv", Body=objects["sales/a.csv"].encode())
        daemon.start()  # the start-up listing finds both
        wait_for(lambda: daemon.events("batch.committed") >= 1, 60, 0.3, "the first objects' batch")
        s3.put_object(Bucket="landing", Key="sales/c.csv", Body=b"id,v\n3,c\n")
        objects["sales/c.csv"] = "id,v\n3,c\n"
        wait_for(lambda: _rows(bucket, admin) == _expected(objects), 60, 0.3, "the objects beside the refused one")
        parked = [(r["source_file"], r["reason"]) for r in _read(bucket, "quarantine", admin)]
        assert len(parked) == 1 and parked[0][0].endswith("sales/secret.csv"), parked
        assert "s3://landing/sales/secret.csv" in parked[0][1] and "grant s3:GetObject" in parked[0][1], parked
        assert daemon.events("batch.retrying") == 0 and daemon.events("entity.failed") == 0
        assert s3.head_object(Bucket="landing", Key="sales/secret.csv")["ContentLength"] == 9  # still there
        daemon.stop(60)
