"""Object-store access for s3:// locations: one place that turns `S3Storage` into clients.

Manifests and staged rows are written through `pyarrow.fs.S3FileSystem` (a single PUT or a
multipart upload becomes visible only when complete, so a reader never sees half a manifest);
listings, HEADs and the GETs of landed objects go through boto3, which returns the ETag, supports
`StartAfter` and `IfMatch` (a GET of exactly the version an inbox record names); Delta
tables get the same credentials as deltalake storage options. Credentials are resolved once by
boto3's standard chain (config keys, else environment, profile, shared files) and never logged.

An object's identity in the inbox, whoever found it (notification or listing): its URL, size,
LastModified in whole seconds (HEAD reports no finer) and ETag.

A GET the store refuses because of the object itself (archived, SSE-C, access denied to that
object alone) is `NotAFile`: the batch quarantines it and goes on. The same AccessDenied also
answers wrong credentials for the whole bucket, so it counts as the object's only when a
listing of its key with the same client succeeds; otherwise it is a store fault, retried.
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import botocore.exceptions as boto_errors
import pyarrow.fs as pafs
from botocore.config import Config as BotoConfig

from lakefeed import log
from lakefeed.config.sources import S3Storage
from lakefeed.errors import TerminalError
from lakefeed.inbox.files import FileEvent

_log = log.get(__name__)


def is_s3(location: str | Path) -> bool:
    return isinstance(location, str) and location.startswith("s3://")


def split(url: str) -> tuple[str, str]:
    """`s3://bucket/key` → (bucket, key)."""
    bucket, _, key = url.removeprefix("s3://").partition("/")
    return bucket, key


def make_folder(fs: pafs.FileSystem, folder: str) -> None:
    """Make `folder` and its parents on a local file system. An object store has no folders: pyarrow would PUT
    an empty marker object for each level (and check the bucket) before every write, doubling its requests."""
    if isinstance(fs, pafs.LocalFileSystem):
        fs.create_dir(folder, recursive=True)


class Replaced(Exception):
    """The object has a newer version than the one asked for; that version is read from its own inbox record."""


class NotAFile(Exception):
    """The object cannot be read as it is, however often it is tried: the message names it and says what to do."""


# What the store answers when it gives nothing because there is nothing.
_GONE = {"NoSuchKey", "NoSuchBucket", "404", "NotFound"}
# Refusals that may concern one object or the whole bucket (wrong credentials, a region that is not the bucket's):
# only a listing with the same client tells which (`Storage._listed`). HEAD answers have no body, so no code.
_AMBIGUOUS = {"AccessDenied", "403", "Forbidden"}
_HEAD_REFUSED = _AMBIGUOUS | {"400", "BadRequest"}  # 400: an SSE-C object HEAD without its key (AWS, SeaweedFS)


def _code(exc: boto_errors.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _own_refusal(url: str, exc: boto_errors.ClientError) -> str | None:
    """Why GetObject refuses this object whoever asks, or None: what the object is, not the store's state. Retrying
    would not mend it, and it must not hold up the objects behind it (quarantined with this reason)."""
    code, message = _code(exc), str(exc.response.get("Error", {}).get("Message", ""))
    if code == "InvalidObjectState":
        return (f"{url} is archived (InvalidObjectState: {message or 'e.g. Glacier'}): the store will not give it "
                "until it is restored: restore it (or copy it to a readable storage class), then land it again")
    if code in ("InvalidRequest", "InvalidArgument") and "server side encryption" in message.lower().replace("-", " "):
        return (f"{url} is encrypted with a customer-provided key (SSE-C; {code}: {message}), which lakefeed does "
                "not hold: land it again unencrypted, or with SSE-S3 or SSE-KMS")
    return None


def _denied(url: str) -> str:
    return (f"{url}: the store refuses to give this object (AccessDenied) although the same credentials list the "
            "bucket: grant s3:GetObject on it (and kms:Decrypt on its key if it is SSE-KMS encrypted), then land it "
            "again")


def whole_seconds_ns(t: datetime) -> int:
    return int(t.timestamp()) * 1_000_000_000


def object_event(bucket: str, key: str, size: int, last_modified: datetime, etag: str) -> FileEvent:
    return FileEvent(f"s3://{bucket}/{key}", size, whole_seconds_ns(last_modified), etag.strip('"'))


@dataclass(frozen=True)
class _Credentials:
    access_key: str | None
    secret_key: str | None
    token: str | None


@functools.lru_cache(maxsize=16)
def _s3_client(cfg: S3Storage) -> Any:
    """One S3 client per store and process (boto3's clients are thread-safe): a task makes a `Storage` of its own,
    and a client costs about 80 ms to make."""
    return Storage(cfg).client("s3")


class Storage:
    """Clients for one `S3Storage`; cheap to make, clients are created on first use and shared."""

    def __init__(self, cfg: S3Storage) -> None:
        self.cfg = cfg

    @functools.cached_property
    def _session(self) -> boto3.session.Session:
        secret = self.cfg.secret_access_key.get_secret_value() if self.cfg.secret_access_key else None
        token = self.cfg.session_token.get_secret_value() if self.cfg.session_token else None
        return boto3.session.Session(profile_name=self.cfg.profile, region_name=self.cfg.region,
                                     aws_access_key_id=self.cfg.access_key_id, aws_secret_access_key=secret,
                                     aws_session_token=token)

    @functools.cached_property
    def credentials(self) -> _Credentials:
        found = self._session.get_credentials()
        if found is None:
            return _Credentials(None, None, None)  # anonymous, e.g. a public bucket
        frozen = found.get_frozen_credentials()
        return _Credentials(frozen.access_key, frozen.secret_key, frozen.token)

    def describe(self) -> dict[str, Any]:
        """What may be logged: where, and which key id (never a secret)."""
        creds = self.credentials
        key = creds.access_key
        return {"endpoint": self.cfg.endpoint_override or "aws", "region": self.cfg.region,
                "access_key_id": f"{key[:4]}…" if key else None}

    def client(self, service: str, **config: Any) -> Any:
        return self._session.client(service, endpoint_url=self.cfg.endpoint_override,
                                    config=BotoConfig(retries={"mode": "standard"}, **config))

    @functools.cached_property
    def s3(self) -> Any:
        return _s3_client(self.cfg)

    @functools.cached_property
    def filesystem(self) -> pafs.S3FileSystem:
        creds = self.credentials
        options: dict[str, Any] = {"region": self.cfg.region, "access_key": creds.access_key,
                                   "secret_key": creds.secret_key, "session_token": creds.token,
                                   "anonymous": creds.access_key is None}
        if self.cfg.endpoint_override:
            parts = urlsplit(self.cfg.endpoint_override)
            options.update(endpoint_override=parts.netloc or parts.path, scheme=parts.scheme or "https")
        return pafs.S3FileSystem(**options)

    def fs_of(self, location: str | Path) -> tuple[pafs.FileSystem, str]:
        """A pyarrow file system for `location`, and the location's path on it (s3://bucket/key -> bucket/key)."""
        if is_s3(location):
            return self.filesystem, str(location).removeprefix("s3://").rstrip("/")
        return pafs.LocalFileSystem(), os.path.abspath(location)

    def delta_options(self, location: str | Path) -> dict[str, str] | None:
        """deltalake storage options for a table at `location` (None for a local folder)."""
        if not is_s3(location):
            return None
        creds = self.credentials
        options = {"AWS_REGION": self.cfg.region}
        if creds.access_key:
            options.update(AWS_ACCESS_KEY_ID=creds.access_key, AWS_SECRET_ACCESS_KEY=creds.secret_key or "")
        if creds.token:
            options["AWS_SESSION_TOKEN"] = creds.token
        if self.cfg.endpoint_override:
            options["AWS_ENDPOINT_URL"] = self.cfg.endpoint_override
            options["AWS_ALLOW_HTTP"] = str(self.cfg.endpoint_override.startswith("http://")).lower()
        if self.cfg.delta_commits == "conditional_put":
            options["conditional_put"] = "etag"
        else:
            options["AWS_S3_ALLOW_UNSAFE_RENAME"] = "true"
        return options

    def head(self, url: str) -> FileEvent | None:
        """The object's identity now, or None if there is no such object.

        An object HEAD may not look at (denied to these credentials, SSE-C without its key) still has an identity:
        a listing of its key gives the same one, and the batch that reads it quarantines it with the reason. Raises
        the HEAD's ClientError when the bucket cannot be listed either (wrong credentials: a store fault)."""
        bucket, key = split(url)
        try:
            got = self.s3.head_object(Bucket=bucket, Key=key)
        except boto_errors.ClientError as exc:
            if _code(exc) in _GONE:
                return None
            if _code(exc) not in _HEAD_REFUSED:
                raise
            try:
                return self._listed(bucket, key)
            except boto_errors.ClientError:
                raise exc from None
        return object_event(bucket, key, got["ContentLength"], got["LastModified"], got.get("ETag", ""))

    def _listed(self, bucket: str, key: str) -> FileEvent | None:
        """The object as a listing of its own key shows it, or None: one request that needs no right on the object,
        so it tells a refusal of one object from a refusal of the bucket (then it raises ClientError). The key
        sorts first among the keys it prefixes, so one key is enough."""
        got = self.s3.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1)
        for obj in got.get("Contents", ()):
            if obj["Key"] == key:
                return object_event(bucket, key, obj["Size"], obj["LastModified"], obj.get("ETag", ""))
        return None

    def list(self, bucket: str, prefix: str, start_after: str = "") -> Iterator[FileEvent]:
        """Every object under `prefix` (after `start_after`, in key order), a page of 1000 at a time.

        Raises (ClientError, BotoCoreError, OSError) unless the listing went to its end: a caller that takes what is
        not listed as removed must not take a listing cut short for a complete one. botocore's paginator stops
        quietly on a page that says it is truncated but gives no continuation token; that is checked here."""
        pages = self.s3.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=prefix, **({"StartAfter": start_after} if start_after else {}))
        truncated = False
        for page in pages:
            truncated = bool(page.get("IsTruncated"))
            for obj in page.get("Contents", ()):
                yield object_event(bucket, obj["Key"], obj["Size"], obj["LastModified"], obj.get("ETag", ""))
        if truncated:
            raise OSError(f"the listing of s3://{bucket}/{prefix} stopped at a truncated page without a "
                          "continuation token: the store's listing is incomplete; it is listed again later")

    def fetch(self, url: str, dest: Path, etag: str = "") -> FileEvent | None:
        """Copy the object (the version with this ETag, if given) to `dest`; the identity of the version read, from
        the GET itself (an info call before it could describe another version), or None if the object is gone.

        Raises `Replaced` when the object no longer has that ETag, `NotAFile` when the store refuses this object
        whoever asks or however often (archived, SSE-C, access denied to it alone), OSError when the store fails (a
        store fault: retried)."""
        bucket, key = split(url)
        try:
            got = self.s3.get_object(Bucket=bucket, Key=key, **({"IfMatch": f'"{etag}"'} if etag else {}))
            dest.parent.mkdir(parents=True, exist_ok=True)
            with got["Body"] as body, open(dest, "wb") as out:
                shutil.copyfileobj(body, out, 8 << 20)
        except boto_errors.ClientError as exc:
            if _code(exc) in _GONE:
                return None
            if _code(exc) in ("PreconditionFailed", "412"):
                raise Replaced(f"{url} no longer has ETag {etag}: a newer version replaced it") from exc
            if reason := _own_refusal(url, exc):
                raise NotAFile(reason) from exc
            if _code(exc) in _AMBIGUOUS:
                if self._only_this_object(url, exc):
                    raise NotAFile(_denied(url)) from exc
                return None  # the bucket is readable and has no such object
            raise OSError(f"cannot read {url}: {exc}") from exc
        except boto_errors.BotoCoreError as exc:  # the network, a read cut short
            raise OSError(f"cannot read {url}: {exc}") from exc
        return object_event(bucket, key, got["ContentLength"], got["LastModified"], got.get("ETag", ""))

    def _only_this_object(self, url: str, exc: boto_errors.ClientError) -> bool:
        """Whether an AccessDenied on GetObject concerns this object alone: the same client lists the bucket and the
        object is there (False: it is gone). Raises OSError when the bucket is refused too (wrong credentials, a
        policy that shuts the bucket): a store fault, retried, nothing quarantined."""
        bucket, key = split(url)
        try:
            return self._listed(bucket, key) is not None
        except (boto_errors.ClientError, boto_errors.BotoCoreError) as probe:
            raise OSError(f"cannot read {url}: {exc}; listing its bucket fails too ({probe}): check the "
                          "credentials and the bucket's policy") from exc

    def get(self, url: str, dest: Path) -> bool:
        """Download `url` to `dest` (atomically); False if there is no such object."""
        tmp = dest.with_name(dest.name + ".download")
        if self.fetch(url, tmp) is None:
            return False
        tmp.replace(dest)
        return True

    def put(self, source: Path, url: str) -> None:
        """Upload a local file; the object appears whole or not at all."""
        with open(source, "rb") as src, self.filesystem.open_output_stream(url.removeprefix("s3://")) as out:
            shutil.copyfileobj(src, out, 8 << 20)
        _log.info("object.written", url=url, bytes=source.stat().st_size)


class Mirror:
    """The local working copy of documents kept in a bucket folder (an S3 entity's manifests).

    Documents are written locally first (atomically, as for a local lake) and then published
    whole, so the bucket holds either the previous or the new version of each. The working copy
    is the truth for what lakefeed wrote: after a crash between a local write and its upload,
    `publish` of everything at start-up repairs the bucket.
    """

    def __init__(self, storage: Storage, folder: Path, url: str) -> None:
        self._storage = storage
        self.folder = folder
        self.url = url.rstrip("/") + "/"

    def url_of(self, path: Path) -> str:
        return self.url + path.relative_to(self.folder).as_posix()

    def pull(self, path: Path) -> bool:
        """Fetch a document absent from the working copy; False if the bucket has none either."""
        if path.exists():
            return True
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            return self._storage.get(self.url_of(path), path)
        except (OSError, NotAFile) as exc:
            raise TerminalError(f"cannot read {self.url_of(path)}: {exc}. Check that the bucket exists and the "
                                "credentials may read it.") from exc

    def publish(self, paths: list[Path]) -> None:
        for path in paths:
            if not path.exists():
                continue
            try:
                self._storage.put(path, self.url_of(path))
            except OSError as exc:
                raise TerminalError(f"cannot write {self.url_of(path)}: {exc}. Check that the bucket exists and "
                                    "the credentials may write to it.") from exc
