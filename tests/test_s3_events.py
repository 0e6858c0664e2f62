"""The S3 event parser: recorded bodies from moto, MinIO's documented shape, SNS envelopes,
explicit rejections, safe keys, and the reduction of unordered, repeated deliveries."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from urllib.parse import quote_plus

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lakefeed.connectors.sources.s3_events import (
    ObjectEvent,
    Rejected,
    Scope,
    SubscriptionConfirmation,
    dedupe,
    latest_per_key,
    parse,
)
from tests import s3_server
from tests.conftest import wait_for

SCOPE = Scope.of("landing", "sales")
KEY = "sales/2024/a b+c é%.csv"

# Recorded from moto 5.2.5 (S3→SQS, the SQS message body): put_object(Key=KEY, Body=b"a\n1\n").
# moto encodes "/" as %2F in keys (real S3 leaves it), sends no sequencer and, for deletions,
# still a size and an eTag.
MOTO_PUT = (
    '{"Records": [{"eventVersion": "2.1", "eventSource": "aws:s3", "awsRegion": "us-east-1", '
    '"eventTime": "2026-11-22T02:13:25.658Z", "eventName": "ObjectCreated:Put", "s3": {"s3SchemaVersion": "1.0", '
    '"configurationId": "Wq2rqBHAlg0YEuzk9hmPZkr5REWDyiFTRWciuOPXLc4Tg80WRz", "bucket": {"name": "landing", '
    '"arn": "arn:aws:s3:::landing"}, "object": {"key": "sales%2F2024%2Fa+b%2Bc+%C3%A9%25.csv", "size": 4, '
    '"eTag": "34ff2335cbe2045ddc3b78993d1e971d"}}}]}'
)
# A single-part multipart upload: moto sends two messages, a Put and a CompleteMultipartUpload.
MOTO_MULTIPART = [
    '{"Records": [{"eventVersion": "2.1", "eventSource": "aws:s3", "awsRegion": "us-east-1", '
    f'"eventTime": "2026-11-22T02:13:25.766Z", "eventName": "{name}", "s3": {{"s3SchemaVersion": "1.0", '
    '"configurationId": "Wq2rqBHAlg0YEuzk9hmPZkr5REWDyiFTRWciuOPXLc4Tg80WRz", "bucket": {"name": "landing", '
    '"arn": "arn:aws:s3:::landing"}, "object": {"key": "sales%2Fbig.csv", "size": 5242880, '
    '"eTag": "9dc2b5968307ce171ec8a2a9251a60d9-1"}}}]}'
    for name in ("ObjectCreated:Put", "ObjectCreated:CompleteMultipartUpload")
]
MOTO_DELETE = (
    '{"Records": [{"eventVersion": "2.1", "eventSource": "aws:s3", "awsRegion": "us-east-1", '
    '"eventTime": "2026-11-22T02:13:25.792Z", "eventName": "ObjectRemoved:Delete", "s3": {"s3SchemaVersion": "1.0", '
    '"configurationId": "Wq2rqBHAlg0YEuzk9hmPZkr5REWDyiFTRWciuOPXLc4Tg80WRz", "bucket": {"name": "landing", '
    '"arn": "arn:aws:s3:::landing"}, "object": {"key": "sales%2F2024%2Fa+b%2Bc+%C3%A9%25.csv", "size": 4, '
    '"eTag": "34ff2335cbe2045ddc3b78993d1e971d"}}}]}'
)
MOTO_TEST_EVENT = (
    '{"Service": "Amazon S3", "Event": "s3:TestEvent", "Time": "2026-11-22T02:13:25.636Z", "Bucket": "landing"}'
)
# Recorded from moto 5.2.5, S3→SNS→HTTP: the POST body (Content-Type text/plain; charset=UTF-8,
# no x-amz-sns-* headers; moto confirms HTTP subscriptions itself and posts no SubscriptionConfirmation).
MOTO_SNS_HTTP = json.dumps({
    "Type": "Notification", "MessageId": "11521b86-6c9f-415d-a643-249f7e5a4832",
    "TopicArn": "arn:aws:sns:us-east-1:123456789012:landing-events",
    "Message": '{"Records": [{"eventVersion": "2.1", "eventSource": "aws:s3", "awsRegion": "us-east-1", '
               '"eventTime": "2026-11-22T02:13:34.384Z", "eventName": "ObjectCreated:Put", "s3": {"s3SchemaVersion": '
               '"1.0", "configurationId": "Sx0XRI0tDesV4xyuJhxSPrhXyvCZ5rqUvz7ejaDBI9pBClow2D", "bucket": {"name": '
               '"landing", "arn": "arn:aws:s3:::landing"}, "object": {"key": "sales%2Fx+y.csv", "size": 3, '
               '"eTag": "900150983cd24fb0d6963f7d28e17f72"}}}]}',
    "Timestamp": "2026-11-22T02:13:34.385Z", "SignatureVersion": "2", "Signature": "bfBBO5GKBWOZZudXDaEFJoNb...",
    "SigningCertURL": "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-c4414684cc50466db7c852c1ffc3319a.pem",
    "UnsubscribeURL": "https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe&SubscriptionArn="
                      "arn:aws:sns:us-east-1:123456789012:landing-events:2bcfbf39-05c3-41de-beaa-fcfcc21c8f55",
})
# MinIO's documented notification shape (bucket notification targets: webhook, AMQP, Kafka, ...):
# a wrapper with EventName and Key ("bucket/" + the key, not encoded) around Records whose
# eventName carries the "s3:" prefix, eventVersion 2.0, the key url.QueryEscape'd, and a
# sequencer of upper-case hex.
MINIO = json.dumps({
    "EventName": "s3:ObjectCreated:Put", "Key": "landing/" + KEY,
    "Records": [{
        "eventVersion": "2.0", "eventSource": "minio:s3", "awsRegion": "", "eventTime": "2024-05-02T10:15:30.123Z",
        "eventName": "s3:ObjectCreated:Put", "userIdentity": {"principalId": "minioadmin"},
        "requestParameters": {"principalId": "minioadmin", "region": "", "sourceIPAddress": "127.0.0.1"},
        "responseElements": {"x-amz-id-2": "dd9025bab4ad464b049177c95eb6ebf374d3b3fd1af9251148b658df7ac2e3e8",
                             "x-amz-request-id": "17CB7BE0B7C0D5A1", "x-minio-origin-endpoint": "http://127.0.0.1:9000",
                             "x-minio-deployment-id": "3c5f0c36-6c6e-4c4f-9a52-0d5b8f2d8a11"},
        "s3": {"s3SchemaVersion": "1.0", "configurationId": "Config",
               "bucket": {"name": "landing", "ownerIdentity": {"principalId": "minioadmin"},
                          "arn": "arn:aws:s3:::landing"},
               "object": {"key": quote_plus(KEY, safe=""), "size": 4, "eTag": "34ff2335cbe2045ddc3b78993d1e971d",
                          "contentType": "text/csv", "userMetadata": {"content-type": "text/csv"},
                          "sequencer": "17CB7BE0B7E1F3A9"}},
        "source": {"host": "127.0.0.1", "port": "", "userAgent": "MinIO (linux; amd64) minio-go/v7.0.70"},
    }],
})
# SNS's documented confirmation request, as an HTTP endpoint receives it from AWS.
SUBSCRIPTION_CONFIRMATION = json.dumps({
    "Type": "SubscriptionConfirmation", "MessageId": "165545c9-2a5c-472c-8df2-7ff2be2b3b1b",
    "Token": "2336412f37fb687f5d51e6e241d09c805a5a57b30d712f794cc5f6a988666d92768dd60a747ba6f3beb71854e285d6ad",
    "TopicArn": "arn:aws:sns:us-west-2:123456789012:MyTopic",
    "Message": "You have chosen to subscribe to the topic arn:aws:sns:us-west-2:123456789012:MyTopic.\n"
               "To confirm the subscription, visit the SubscribeURL included in this message.",
    "SubscribeURL": "https://sns.us-west-2.amazonaws.com/?Action=ConfirmSubscription&TopicArn="
                    "arn:aws:sns:us-west-2:123456789012:MyTopic&Token=2336412f37fb687f5d51e6e241d09c805a5a57b3",
    "Timestamp": "2012-04-26T20:45:04.751Z", "SignatureVersion": "1", "Signature": "EXAMPLEpH+DcEwjAPg8O9mY8dReBSwks",
    "SigningCertURL": "https://sns.us-west-2.amazonaws.com/SimpleNotificationService-f3ecfb7224c7233fe7bb5f59f96de52f.pem",
})

T0 = datetime(2026, 11, 22, 2, 13, 25, 658000, tzinfo=UTC)


def test_a_recorded_moto_put_becomes_one_created_event_with_the_decoded_key():
    parsed = parse(MOTO_PUT, SCOPE)
    assert parsed.events == (ObjectEvent("landing", KEY, "created", 4, "34ff2335cbe2045ddc3b78993d1e971d", None, None,
                                         T0, "ObjectCreated:Put"),)
    assert not parsed.rejected and not parsed.poison
    assert parsed.events[0].uri == "s3://landing/" + KEY


def test_the_two_multipart_events_of_moto_collapse_to_one_and_a_delete_is_a_removal():
    events = [ev for body in MOTO_MULTIPART for ev in parse(body, SCOPE).events]
    assert [e.name for e in events] == ["ObjectCreated:Put", "ObjectCreated:CompleteMultipartUpload"]
    assert len(dedupe(events)) == 1 and len(latest_per_key(events)) == 1
    put, removed = parse(MOTO_PUT, SCOPE).events[0], parse(MOTO_DELETE, SCOPE).events[0]
    assert removed.kind == "removed" and removed.key == KEY
    assert latest_per_key([removed, put]) == [removed]  # later by event time, whatever the arrival order


def test_test_events_are_ignored_bare_or_through_sns():
    assert parse(MOTO_TEST_EVENT, SCOPE).ignored and not parse(MOTO_TEST_EVENT, SCOPE).poison
    wrapped = json.dumps({"Type": "Notification", "Message": MOTO_TEST_EVENT, "TopicArn": "arn:aws:sns:x"})
    p = parse(wrapped, SCOPE)
    assert p.ignored and not p.events and not p.rejected


def test_a_minio_body_and_an_sns_envelope_parse_like_aws():
    (ev,) = parse(MINIO, SCOPE).events
    assert (ev.bucket, ev.key, ev.kind, ev.size, ev.sequencer, ev.name) == (
        "landing", KEY, "created", 4, "17CB7BE0B7E1F3A9", "ObjectCreated:Put")
    assert ev.event_time == datetime(2024, 5, 2, 10, 15, 30, 123000, tzinfo=UTC)
    (ev,) = parse(MOTO_SNS_HTTP, SCOPE).events
    assert (ev.key, ev.size, ev.etag) == ("sales/x y.csv", 3, "900150983cd24fb0d6963f7d28e17f72")


def test_a_subscription_confirmation_is_its_own_result():
    p = parse(SUBSCRIPTION_CONFIRMATION, SCOPE)
    assert p.confirmation == SubscriptionConfirmation(
        "arn:aws:sns:us-west-2:123456789012:MyTopic", json.loads(SUBSCRIPTION_CONFIRMATION)["Token"],
        json.loads(SUBSCRIPTION_CONFIRMATION)["SubscribeURL"], "165545c9-2a5c-472c-8df2-7ff2be2b3b1b")
    assert not p.events and not p.poison
    unsubscribed = parse(json.dumps({"Type": "UnsubscribeConfirmation", "TopicArn": "t"}), SCOPE)
    assert unsubscribed.ignored and not unsubscribed.poison


def _record(**changes):
    rec = json.loads(MOTO_PUT)["Records"][0]
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = rec
        for p in parents:
            node = node[p]
        if value is _DROP:
            del node[leaf]
        else:
            node[leaf] = value
    return json.dumps({"Records": [rec]})


_DROP = object()


@pytest.mark.parametrize(("body", "reason"), [
    ("{not json", "malformed JSON"),
    (b"\xff\xfe", "malformed JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"Records": []}', "non-empty list"),
    ('{"hello": 1}', "no Records"),
    ('{"Records": ["x"]}', "record is not a JSON object"),
    (_record(eventName=_DROP), "lacks field 'eventName'"),
    (_record(eventTime=_DROP), "lacks field 'eventTime'"),
    (_record(s3__object__key=_DROP), "lacks field 'key'"),
    (_record(s3__bucket=_DROP), "lacks field 'bucket'"),
    (_record(s3__object__size=_DROP), "size None"),
    (_record(s3__object__size="4"), "size '4'"),
    (_record(s3__object__size=True), "size True"),
    (_record(s3__object__size=-1), "size -1"),
    (_record(eventName="ObjectCreated:Teleport"), "unknown event name 'ObjectCreated:Teleport'"),
    (_record(eventName=3), "must be strings"),
    (_record(s3__bucket__name="elsewhere"), "bucket 'elsewhere' is not one of ['landing']"),
    (_record(eventTime="yesterday"), "not ISO 8601"),
    (_record(eventTime="2026-11-22T02:13:25"), "no time zone"),
    (_record(s3__object__sequencer="XYZ"), "not hexadecimal"),
    (_record(s3__object__key="sales/%FF.csv"), "not UTF-8"),
    (_record(s3__object__key="other/x.csv"), "outside the entity's root prefix 'sales/'"),
    (_record(s3__object__key="salesman/x.csv"), "outside the entity's root prefix"),
    (json.dumps({"Type": "Notification", "Message": "{oops"}), "SNS Message is malformed JSON"),
    (json.dumps({"Type": "Notification"}), "without a Message"),
    (json.dumps({"Type": "SubscriptionConfirmation", "TopicArn": "t"}), "lacks TopicArn, Token"),
    (json.dumps({"Type": "Gossip"}), "unknown SNS message Type 'Gossip'"),
    ("[" * 100_000, "recursion"),
    ('{"Records": [' + "1" * 5000 + "]}", "integer"),
    (json.dumps({"Type": "Notification", "Message": "[" * 100_000}), "SNS Message is malformed JSON"),
])
def test_bad_bodies_are_rejected_with_a_reason_and_never_raise(body, reason):
    p = parse(body, SCOPE)
    assert p.poison and not p.events
    (rejected,) = p.rejected
    assert reason in rejected.reason and isinstance(rejected, Rejected)
    assert len(rejected.raw_excerpt) <= 300


def test_harmless_records_are_ignored_and_one_bad_record_does_not_spoil_the_others():
    doc = json.loads(MOTO_PUT)
    good = doc["Records"][0]
    bad = json.loads(_record(s3__object__key="sales%2F..%2Fsecrets"))["Records"][0]
    tagging = json.loads(_record(eventName="ObjectTagging:Put"))["Records"][0]
    folder = json.loads(_record(s3__object__key="sales%2F2024%2F", s3__object__size=0))["Records"][0]
    p = parse(json.dumps({"Records": [good, bad, tagging, folder]}), SCOPE)
    assert [e.key for e in p.events] == [KEY]
    assert [r.reason for r in p.rejected] == ["key 'sales/../secrets' has a '..' segment"]
    assert len(p.ignored) == 2 and not p.poison
    # A removal without size (what AWS sends) is fine; a creation without one is not.
    assert parse(_record(eventName="ObjectRemoved:Delete", s3__object__size=_DROP), SCOPE).events[0].size is None


def test_keys_are_decoded_once():
    (ev,) = parse(_record(s3__object__key="sales%2F%252E%252E%2Fx"), SCOPE).events
    assert ev.key == "sales/%2E%2E/x"  # a literal name, not a traversal


def test_a_scope_is_checked_when_made():
    with pytest.raises(ValueError, match="name at least one bucket"):
        Scope.of([])
    with pytest.raises(ValueError, match="'..' segment"):
        Scope.of("b", "a/../b")
    assert Scope.of("b", "/sales/").check("b", "sales/x") is None


# ---- generated keys ----

_SEGMENT = st.text(st.sampled_from("ab Z09-_.+%é~=&#?!'(),;😀"), min_size=1, max_size=8).filter(
    lambda s: s not in (".", ".."))
_KEYS = st.lists(_SEGMENT, min_size=1, max_size=5).map(lambda segs: "sales/" + "/".join(segs))


def _body(raw_key: str, bucket: str = "landing") -> str:
    return _record(s3__object__key=raw_key, s3__bucket__name=bucket)


@given(key=_KEYS, aws_style=st.booleans())
def test_generated_keys_round_trip_through_form_url_encoding(key, aws_style):
    # AWS leaves "/" as it is; moto and MinIO (Go's url.QueryEscape) encode it too.
    raw = quote_plus(key, safe="/" if aws_style else "")
    (ev,) = parse(_body(raw), SCOPE).events
    assert ev.key == key


_CONTROL = st.sampled_from([chr(c) for c in [*range(0x20), 0x7F, 0x85, 0x9F]] + ["\u2028", "\u2029"])


@st.composite
def _unsafe(draw):
    segs = draw(st.lists(_SEGMENT, min_size=1, max_size=4))
    at = draw(st.integers(0, len(segs)))
    kind = draw(st.sampled_from(["dotdot", "absolute", "control", "backslash", "dot", "empty", "outside"]))
    if kind == "dotdot":
        return "sales/" + "/".join(segs[:at] + [".."] + segs[at:]), "'..' segment"
    if kind == "absolute":
        return "/sales/" + "/".join(segs), "absolute path"
    if kind == "dot":
        return "sales/" + "/".join(segs[:at] + ["."] + segs[at:]), "not normalized"
    if kind == "empty":
        return "sales/" + "/".join(segs[:at] + [""] + segs[at:]) + "/x", "not normalized"
    if kind == "outside":
        return draw(st.sampled_from(["other/", "sales", "salesx/", "Sales/"])) + "/".join(segs), "outside"
    key = "sales/" + "/".join(segs)
    pos = draw(st.integers(0, len(key)))
    inserted = draw(_CONTROL) if kind == "control" else "\\"
    return key[:pos] + inserted + key[pos:], "control character" if kind == "control" else "backslash"


@given(case=_unsafe(), aws_style=st.booleans())
def test_every_unsafe_key_is_rejected_with_its_reason(case, aws_style):
    key, reason = case
    p = parse(_body(quote_plus(key, safe="/" if aws_style else "")), SCOPE)
    assert not p.events and p.poison, key
    assert reason in p.rejected[0].reason


# ---- reduction of unordered, repeated deliveries ----

_HEX = st.text(st.sampled_from("0123456789ABCDEF"), min_size=1, max_size=4)
_EVENTS = st.lists(st.builds(
    ObjectEvent, bucket=st.just("landing"), key=st.sampled_from(["sales/a", "sales/b"]),
    kind=st.sampled_from(["created", "removed"]), size=st.integers(0, 3), etag=st.sampled_from([None, "e1", "e2"]),
    version_id=st.sampled_from([None, None, "v1"]), sequencer=st.one_of(st.none(), _HEX, _HEX, _HEX),
    event_time=st.integers(0, 3).map(lambda s: T0 + timedelta(seconds=s)), name=st.just("ObjectCreated:Put"),
), max_size=12)


def _model_order(group):
    """AWS: sequencers of one key compare as hex after right-padding the shorter with zeros."""
    if all(e.sequencer for e in group):
        width = max(len(e.sequencer) for e in group)
        return lambda e: int(e.sequencer.ljust(width, "0"), 16)
    return lambda e: e.event_time


def _groups(events):
    out = {}
    for e in events:
        out.setdefault((e.bucket, e.key), []).append(e)
    return out


@settings(max_examples=300)
@given(events=_EVENTS, seed=st.randoms())
def test_latest_per_key_is_the_latest_event_whatever_the_arrival_order(events, seed):
    got = latest_per_key(events)
    groups = _groups(events)
    assert sorted((e.bucket, e.key) for e in got) == sorted(groups)
    for ev in got:
        group = groups[(ev.bucket, ev.key)]
        order = _model_order(group)
        top = max(map(order, group))
        assert order(ev) == top and ev in group
        if any(e.kind == "created" for e in group if order(e) == top):
            assert ev.kind == "created"  # on a tie, reading a vanished file beats skipping an existing one
    shuffled = list(events)
    seed.shuffle(shuffled)
    assert latest_per_key(shuffled) == got


@settings(max_examples=300)
@given(events=_EVENTS, seed=st.randoms())
def test_dedupe_keeps_one_latest_event_per_object_version(events, seed):
    got = dedupe(events)

    def ident(e):
        return (e.bucket, e.key, e.kind, e.version_id or e.etag)

    assert len({ident(e) for e in got}) == len(got)
    assert {ident(e) for e in got} == {ident(e) for e in events}
    groups = _groups(events)
    for ev in got:
        order = _model_order(groups[(ev.bucket, ev.key)])
        assert order(ev) == max(order(e) for e in events if ident(e) == ident(ev))
    shuffled = list(events)
    seed.shuffle(shuffled)
    assert dedupe(shuffled) == got
    if len({e.sequencer is None for e in events}) < 2:  # mixed keys order by time, a subset maybe not
        assert latest_per_key(got) == latest_per_key(events)


def test_sequencers_of_different_lengths_compare_right_padded():
    def ev(seq, t):
        return ObjectEvent("landing", "sales/a", "created", 1, seq, None, seq, T0 + timedelta(seconds=t), "x")

    # Right-padded "1" is "10" > "0F": later despite the earlier event time. (Left padding would say "01" < "0F".)
    assert latest_per_key([ev("1", 0), ev("0F", 5)])[0].sequencer == "1"
    assert latest_per_key([ev("0A", 0), ev("0A1", 5)])[0].sequencer == "0A1"
    # One event without a sequencer: event times decide for the key.
    assert latest_per_key([ev("1", 0), ev(None, 5)])[0].sequencer is None


# ---- what moto sends today matches the recordings ----

@pytest.fixture(scope="module")
def moto():
    with s3_server.running() as server:
        yield server


def _stable(body):
    doc = json.loads(body)
    for rec in doc.get("Records", []):
        rec["eventTime"] = "T"
        rec["s3"]["configurationId"] = "C"
    doc.pop("Time", None)
    return doc


def test_moto_s3_to_sqs_still_sends_the_recorded_shapes(moto):
    moto.reset()
    url = s3_server.bucket_to_queue(moto, "landing", "events")
    s3 = moto.client("s3")
    s3.put_object(Bucket="landing", Key=KEY, Body=b"a\n1\n")
    upload = s3.create_multipart_upload(Bucket="landing", Key="sales/big.csv")
    part = s3.upload_part(Bucket="landing", Key="sales/big.csv", UploadId=upload["UploadId"], PartNumber=1,
                          Body=b"x" * 5 * 1024 * 1024)
    s3.complete_multipart_upload(Bucket="landing", Key="sales/big.csv", UploadId=upload["UploadId"],
                                 MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]})
    s3.delete_object(Bucket="landing", Key=KEY)
    bodies = s3_server.drain(moto, url)
    assert [_stable(b) for b in bodies] == [_stable(b) for b in
                                            [MOTO_TEST_EVENT, MOTO_PUT, *MOTO_MULTIPART, MOTO_DELETE]]


def test_moto_delivers_s3_events_through_sns_to_http(moto):
    moto.reset()
    with s3_server.http_sink() as sink:
        topic = s3_server.bucket_to_topic(moto, "landing", "landing-events")
        moto.client("sns").subscribe(TopicArn=topic, Protocol="http", Endpoint=sink.url)
        moto.client("s3").put_object(Bucket="landing", Key="sales/x y.csv", Body=b"abc")
        wait_for(lambda: any("Records" in b["Message"] for b in sink.bodies()), 10, what="the SNS POST")
    recorded = json.loads(MOTO_SNS_HTTP)
    for headers, body in sink.posts:
        doc = json.loads(body)
        assert sorted(doc) == sorted(recorded) and doc["Type"] == "Notification"
        assert headers["Content-Type"] == "text/plain; charset=UTF-8"
    events = [e for _, body in sink.posts for e in parse(body, SCOPE).events]
    assert [(e.key, e.size) for e in events] == [("sales/x y.csv", 3)]
