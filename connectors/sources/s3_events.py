"""S3 event notifications: one parser for every shape a transport may carry, and their reduction.

Accepted bodies: AWS `{"Records": [...]}` (event names without the `s3:` prefix, keys
form-URL-encoded), MinIO's wrapper `{"EventName", "Key", "Records"}` (names with the prefix,
eventVersion 2.0; the records are the truth, the wrapper's Key is not read), an SNS envelope
`{"Type": "Notification", "Message": "<one of these>"}`, an SNS `SubscriptionConfirmation`
(returned as such so an HTTP endpoint can confirm it), and `s3:TestEvent` (ignored).

Nothing here raises on bad input: a body or record that cannot be used comes back as a
`Rejected` with a reason a person can act on, so a transport can move it aside and go on.
Keys are decoded once, here, and must be safe relative paths under the entity's prefix;
`key_verdict` is that rule, which listings apply too.

Delivery is at-least-once and unordered. `dedupe` collapses repeats of one object version and
`latest_per_key` keeps the outcome per key: by `sequencer` when every event of the key has one
(AWS: compare as hex after right-padding the shorter with zeros; only events of the same key
are comparable), else by event time.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal
from urllib.parse import unquote_plus

Kind = Literal["created", "removed"]
Verdict = Literal["data", "ignored", "rejected"]

_CREATED = {"ObjectCreated:Put", "ObjectCreated:Post", "ObjectCreated:Copy", "ObjectCreated:CompleteMultipartUpload"}
_REMOVED = {
    "ObjectRemoved:Delete", "ObjectRemoved:DeleteMarkerCreated", "ObjectRemoved:DeleteAllVersions",  # last: MinIO
    "LifecycleExpiration:Delete", "LifecycleExpiration:DeleteMarkerCreated",
}
# Known events that do not change an object's bytes (tags, ACLs, retention, restores, tiering,
# replication bookkeeping, MinIO's reads and scanner). Anything else is unknown and rejected.
_METADATA_ONLY = {
    "ObjectCreated:PutRetention", "ObjectCreated:PutLegalHold", "ObjectCreated:PutTagging",
    "ObjectCreated:DeleteTagging", "ObjectRemoved:NoOP",
}
_METADATA_FAMILIES = (
    "ObjectRestore:", "ObjectTagging:", "ObjectAcl:", "ObjectAccessed:", "ObjectTransition:", "Replication:",
    "LifecycleTransition", "IntelligentTiering", "ReducedRedundancyLostObject", "Scanner:", "ILM:", "Bucket",
    "LifecycleDelMarkerExpiration:",
)
_EXCERPT = 300


@dataclass(frozen=True, slots=True)
class ObjectEvent:
    bucket: str
    key: str  # decoded, checked: a relative path under the entity's prefix
    kind: Kind
    size: int | None  # AWS sends no size for removals
    etag: str | None
    version_id: str | None
    sequencer: str | None  # upper-case hex
    event_time: datetime  # timezone-aware
    name: str  # without the `s3:` prefix, e.g. "ObjectCreated:Put"

    @property
    def uri(self) -> str:
        """`s3://bucket/key` with the key as it is (not percent-encoded)."""
        return f"s3://{self.bucket}/{self.key}"


@dataclass(frozen=True, slots=True)
class Rejected:
    reason: str
    raw_excerpt: str


@dataclass(frozen=True, slots=True)
class SubscriptionConfirmation:
    """SNS asks the endpoint to confirm by fetching `subscribe_url` (after checking the signature)."""

    topic_arn: str
    token: str
    subscribe_url: str
    message_id: str


@dataclass(frozen=True, slots=True)
class Parsed:
    events: tuple[ObjectEvent, ...] = ()
    rejected: tuple[Rejected, ...] = ()
    ignored: tuple[str, ...] = ()  # why harmless records were skipped: test events, folder markers, metadata
    confirmation: SubscriptionConfirmation | None = None

    @property
    def poison(self) -> bool:
        """Something was rejected and nothing else came of the body: it only belongs aside."""
        return bool(self.rejected) and not (self.events or self.ignored or self.confirmation)


@dataclass(frozen=True, slots=True)
class Scope:
    """Where an entity's objects live: events for other buckets or outside `prefix` are rejected."""

    buckets: frozenset[str]
    prefix: str = ""
    _norm: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.buckets or not all(isinstance(b, str) and b for b in self.buckets):
            raise ValueError("Scope.buckets: name at least one bucket")
        prefix = self.prefix.strip("/")
        if prefix and (problem := unsafe_key(prefix + "/")):
            raise ValueError(f"Scope.prefix {self.prefix!r}: {problem}")
        object.__setattr__(self, "_norm", prefix + "/" if prefix else "")

    @classmethod
    def of(cls, buckets: str | Collection[str], prefix: str = "") -> Scope:
        return cls(frozenset([buckets] if isinstance(buckets, str) else buckets), prefix)

    def check(self, bucket: str, key: str) -> str | None:
        """Why the object is not the entity's, or None."""
        if bucket not in self.buckets:
            return f"bucket {bucket!r} is not one of {sorted(self.buckets)}"
        if problem := unsafe_key(key):
            return problem
        if not key.startswith(self._norm):
            return f"key {key!r} resolves outside the entity's root prefix {self._norm!r}"
        return None


def unsafe_key(key: str) -> str | None:
    """Why a decoded key cannot be used as a relative path, or None. A trailing `/` is allowed here."""
    if not key:
        return "empty key"
    for i, ch in enumerate(key):
        if unicodedata.category(ch) in ("Cc", "Cs", "Zl", "Zp"):
            return f"key {key!r} has control character U+{ord(ch):04X} at {i}"
    if "\\" in key:
        return f"key {key!r} contains a backslash"
    if key.startswith("/"):
        return f"key {key!r} is an absolute path"
    segments = key.split("/")
    if ".." in segments:
        return f"key {key!r} has a '..' segment"
    if any(s in ("", ".") for s in segments[:-1]) or segments[-1] == ".":
        return f"key {key!r} is not normalized (a '.' or empty segment)"
    return None


def key_verdict(scope: Scope, bucket: str, key: str) -> tuple[Verdict, str]:
    """What an object is to the entity, by its decoded key, and why: the one rule for notifications and listings.
    'rejected': not the entity's, or not a safe relative path; 'ignored': a folder marker, not data at all."""
    if problem := scope.check(bucket, key):
        return "rejected", problem
    if key.endswith("/"):
        return "ignored", f"{key!r} is a folder marker"
    return "data", ""


def not_a_file(key: str) -> str | None:
    """Why an object cannot be read as a data file whatever its entity (`key_verdict`'s rule, less the scope)."""
    if key.endswith("/"):
        return f"{key!r} is a folder marker, not a file"
    return unsafe_key(key)


def parse(body: str | bytes, scope: Scope) -> Parsed:
    """Everything one notification body says, for objects in `scope`."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as exc:  # not JSON or not UTF-8; an integer of 5,000 digits; deep nesting
        return Parsed(rejected=(Rejected(f"malformed JSON: {str(exc)[:200]}", _excerpt(body)),))
    return _document(doc, scope, depth=0)


def _document(doc: Any, scope: Scope, depth: int) -> Parsed:
    if not isinstance(doc, dict):
        return _reject(f"not a JSON object but {type(doc).__name__}", doc)
    if "Type" in doc and depth == 0:
        return _sns(doc, scope)
    if doc.get("Event") == "s3:TestEvent":
        return Parsed(ignored=(f"s3:TestEvent for bucket {doc.get('Bucket')!r}",))
    if "Records" not in doc:
        return _reject("no Records, not an SNS envelope, not a test event", doc)
    records = doc["Records"]
    if not isinstance(records, list) or not records:
        return _reject("Records is not a non-empty list", doc)
    events, rejected, ignored = [], [], []
    for rec in records:
        outcome = _record(rec, scope)
        if isinstance(outcome, ObjectEvent):
            events.append(outcome)
        elif isinstance(outcome, Rejected):
            rejected.append(outcome)
        else:
            ignored.append(outcome)
    return Parsed(tuple(events), tuple(rejected), tuple(ignored))


def _sns(doc: dict[str, Any], scope: Scope) -> Parsed:
    kind = doc["Type"]
    if kind == "Notification":
        message = doc.get("Message")
        if not isinstance(message, str):
            return _reject("SNS Notification without a Message string", doc)
        try:
            inner = json.loads(message)
        except (ValueError, RecursionError) as exc:
            return _reject(f"SNS Message is malformed JSON: {str(exc)[:200]}", doc)
        return _document(inner, scope, depth=1)
    if kind == "SubscriptionConfirmation":
        fields = [doc.get(k) for k in ("TopicArn", "Token", "SubscribeURL", "MessageId")]
        if not all(isinstance(f, str) and f for f in fields):
            return _reject("SNS SubscriptionConfirmation lacks TopicArn, Token, SubscribeURL or MessageId", doc)
        return Parsed(confirmation=SubscriptionConfirmation(*map(str, fields)))
    if kind == "UnsubscribeConfirmation":
        return Parsed(ignored=(f"SNS UnsubscribeConfirmation for {doc.get('TopicArn')!r}",))
    return _reject(f"unknown SNS message Type {kind!r}", doc)


def _record(rec: Any, scope: Scope) -> ObjectEvent | Rejected | str:
    """One record: an event, a rejection, or the reason it is harmlessly ignored."""
    if not isinstance(rec, dict):
        return Rejected("record is not a JSON object", _excerpt(rec))
    try:
        name = rec["eventName"]
        s3 = rec["s3"]
        bucket = s3["bucket"]["name"]
        obj = s3["object"]
        raw_key = obj["key"]
        raw_time = rec["eventTime"]
    except (KeyError, TypeError) as exc:
        return Rejected(f"record lacks field {exc}", _excerpt(rec))
    if not all(isinstance(v, str) for v in (name, bucket, raw_key, raw_time)):
        return Rejected("eventName, bucket name, object key and eventTime must be strings", _excerpt(rec))
    name = name.removeprefix("s3:")
    if name in _METADATA_ONLY or name.startswith(_METADATA_FAMILIES):
        return f"{name} changes no data"
    if name in _CREATED:
        kind: Kind = "created"
    elif name in _REMOVED:
        kind = "removed"
    else:
        return Rejected(f"unknown event name {name!r}", _excerpt(rec))
    try:
        key = unquote_plus(raw_key, errors="strict")
    except UnicodeDecodeError:
        return Rejected(f"key {raw_key!r} is not UTF-8 once decoded", _excerpt(rec))
    verdict, why = key_verdict(scope, bucket, key)
    if verdict == "rejected":
        return Rejected(why, _excerpt(rec))
    if verdict == "ignored":
        return why
    try:
        event_time = datetime.fromisoformat(raw_time)
    except ValueError:
        return Rejected(f"eventTime {raw_time!r} is not ISO 8601", _excerpt(rec))
    if event_time.tzinfo is None:
        return Rejected(f"eventTime {raw_time!r} has no time zone", _excerpt(rec))
    size = obj.get("size")
    if not (size is None and kind == "removed") and (type(size) is not int or size < 0):
        return Rejected(f"object size {size!r} is not a non-negative integer", _excerpt(rec))
    etag, version_id, sequencer = (obj.get(k) or None for k in ("eTag", "versionId", "sequencer"))
    if not all(v is None or isinstance(v, str) for v in (etag, version_id, sequencer)):
        return Rejected("eTag, versionId and sequencer must be strings", _excerpt(rec))
    if sequencer is not None:
        try:
            int(sequencer, 16)
        except ValueError:
            return Rejected(f"sequencer {sequencer!r} is not hexadecimal", _excerpt(rec))
        sequencer = sequencer.upper()
    return ObjectEvent(bucket, key, kind, size, etag and etag.strip('"'), version_id, sequencer, event_time, name)


def dedupe(events: Iterable[ObjectEvent]) -> list[ObjectEvent]:
    """One event per (bucket, key, kind, eTag or versionId), the latest of its repeats, oldest first.

    A multipart upload that moto reports twice, or a message SQS delivers twice, becomes one.
    """
    best: dict[tuple[Any, ...], ObjectEvent] = {}
    groups = _by_key(events)
    for group in groups.values():
        rank = _ranker(group)
        for ev in group:
            ident = (ev.bucket, ev.key, ev.kind, ev.version_id or ev.etag)
            if ident not in best or rank(ev) > rank(best[ident]):
                best[ident] = ev
    return sorted(best.values(), key=_oldest_first)


def latest_per_key(events: Iterable[ObjectEvent]) -> list[ObjectEvent]:
    """The outcome per (bucket, key): its latest event, created or removed; oldest first."""
    out = []
    for group in _by_key(events).values():
        out.append(max(group, key=_ranker(group)))
    return sorted(out, key=_oldest_first)


def _by_key(events: Iterable[ObjectEvent]) -> dict[tuple[str, str], list[ObjectEvent]]:
    groups: dict[tuple[str, str], list[ObjectEvent]] = {}
    for ev in events:
        groups.setdefault((ev.bucket, ev.key), []).append(ev)
    return groups


def _ranker(group: list[ObjectEvent]):
    """Order within one key. Sequencers only when all have one (they are the store's own order);
    mixing them with times would compare unlike things. On a tie a creation wins: reading a file
    that has gone fails loudly, skipping one that exists loses it quietly."""
    width = max(len(ev.sequencer or "") for ev in group)
    by_sequencer = all(ev.sequencer for ev in group)

    def rank(ev: ObjectEvent) -> tuple[Any, ...]:
        order = ev.sequencer.ljust(width, "0") if by_sequencer and ev.sequencer else ev.event_time
        # The rest only makes the choice among exact ties independent of arrival order.
        return (order, ev.kind == "created", ev.size or 0, ev.etag or "", ev.version_id or "", ev.sequencer or "",
                ev.event_time, ev.name)

    return rank


def _oldest_first(ev: ObjectEvent) -> tuple[Any, ...]:
    """By time, then every field: the output does not depend on the arrival order."""
    return (ev.event_time, ev.bucket, ev.key, ev.kind, ev.size or 0, ev.etag or "", ev.version_id or "",
            ev.sequencer or "", ev.name)


def _excerpt(raw: Any) -> str:
    if isinstance(raw, bytes):
        text = raw[: _EXCERPT * 4].decode("utf-8", "replace")
    elif isinstance(raw, str):
        text = raw
    else:
        text = json.dumps(raw, ensure_ascii=False, default=str)
    return text[:_EXCERPT]


def _reject(reason: str, raw: Any) -> Parsed:
    return Parsed(rejected=(Rejected(reason, _excerpt(raw)),))
