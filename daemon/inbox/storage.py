"""Object-store access for s3:// locations: one place that turns `S3Storage` into clients.

Manifests and staged rows are written through `pyarrow.fs.S3FileSystem` (a single PUT or a
multipart upload becomes visible only when complete, so a reader never sees half a manifest);
listings, HEADs and the GETs of landed objects go through boto3, which returns the ETag, supports
`StartAfter` and `IfMatch` (a GET of exactly the version an inbox record names); Delta
tables get the same credentials as deltalake storage options. Credentials are resolved once by
boto3's standard chain (config keys, else environment, profile, shared files) and never logged.

An object's identity in the inbox, whoever found it (notification or listing): its URL, size,
LastModified in whole seconds (HEAD reports no finer) and ETag.
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
    """The object cannot be read as it is, however often it is tried: the message says why."""


# What GetObject answers about the object itself, not the store: archived (restore it, then land it again).
# Retrying would not mend it, and it must not hold up the objects behind it.
_NOT_A_FILE = {"InvalidObjectState"}


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
        """The object's identity now, or None if there is no such object."""
        bucket, key = split(url)
        try:
            got = self.s3.head_object(Bucket=bucket, Key=key)
        except boto_errors.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise
        return object_event(bucket, key, got["ContentLength"], got["LastModified"], got.get("ETag", ""))

    def list(self, bucket: str, prefix: str, start_after: str = "") -> Iterator[FileEvent]:
        """Every object under `prefix` (after `start_after`, in key order), a page of 1000 at a time."""
        pages = self.s3.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=prefix, **({"StartAfter": start_after} if start_after else {}))
        for page in pages:
            for obj in page.get("Contents", ()):
                yield object_event(bucket, obj["Key"], obj["Size"], obj["LastModified"], obj.get("ETag", ""))

    def fetch(self, url: str, dest: Path, etag: str = "") -> FileEvent | None:
        """Copy the object (the version with this ETag, if given) to `dest`; the identity of the version read, from
        the GET itself (an info call before it could describe another version), or None if the object is gone.

        Raises `Replaced` when the object no longer has that ETag, `NotAFile` when the store refuses to give it as
        it is (an archived object), OSError when the store fails (a store fault: retried)."""
        bucket, key = split(url)
        try:
            got = self.s3.get_object(Bucket=bucket, Key=key, **({"IfMatch": f'"{etag}"'} if etag else {}))
            dest.parent.mkdir(parents=True, exist_ok=True)
            with got["Body"] as body, open(dest, "wb") as out:
                shutil.copyfileobj(body, out, 8 << 20)
        except boto_errors.ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code in ("NoSuchKey", "NoSuchBucket", "404"):
                return None
            if code in ("PreconditionFailed", "412"):
                raise Replaced(f"{url} no longer has ETag {etag}: a newer version replaced it") from exc
            if code in _NOT_A_FILE:
                raise NotAFile(f"the store will not give it ({exc}): restore it, then land it again") from exc
            raise OSError(f"cannot read {url}: {exc}") from exc
        except boto_errors.BotoCoreError as exc:  # the network, a read cut short
            raise OSError(f"cannot read {url}: {exc}") from exc
        return object_event(bucket, key, got["ContentLength"], got["LastModified"], got.get("ETag", ""))

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
        except OSError as exc:
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
