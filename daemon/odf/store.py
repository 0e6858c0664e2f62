"""An ODF dataset's objects on storage, laid out as the seed's "Dataset Layout" and kamu's local repositories:

    <odf>/refs/head              the hash of the last block (multibase text)
    <odf>/blocks/<hash>          each metadata block, named by its hash
    <odf>/data/<physical hash>   each data slice (a Parquet file)
    <odf>/checkpoints/<hash>     checkpoints (lakefeed writes none: its sources resume from the inbox)

Everything but `refs/head` is content-addressed, so writing it again is harmless; `refs/head` moves last, in
one atomic step (rename on a local disk, one PUT on an object store), after the objects it points to exist."""

from __future__ import annotations

import os
import posixpath
import uuid

import pyarrow.fs as pafs

from lakefeed import log
from lakefeed.inbox.storage import Storage, make_folder
from lakefeed.odf import multiformats

_log = log.get(__name__)


class DatasetStore:
    def __init__(self, location: str, storage: Storage) -> None:
        self.location, self.storage = location, storage
        self.fs, self.root = storage.fs_of(location)
        self.local = isinstance(self.fs, pafs.LocalFileSystem)

    def path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    def head(self) -> bytes | None:
        """The head block's hash, None for a dataset with no chain yet."""
        try:
            with self.fs.open_input_stream(self.path("refs", "head")) as stream:
                text = stream.read().decode().strip()
        except FileNotFoundError:
            return None
        return multiformats.from_text(text)

    def block(self, hash_: bytes) -> bytes:
        with self.fs.open_input_stream(self.path("blocks", multiformats.to_text(hash_))) as stream:
            return stream.read()

    def put_block(self, hash_: bytes, data: bytes) -> None:
        self._put(self.path("blocks", multiformats.to_text(hash_)), data)

    def set_head(self, hash_: bytes) -> None:
        self._put(self.path("refs", "head"), multiformats.to_text(hash_).encode())

    def has_data(self, physical: bytes) -> bool:
        info = self.fs.get_file_info(self.path("data", multiformats.to_text(physical)))
        return info.type == pafs.FileType.File

    def read_data(self, physical: bytes) -> bytes:
        with self.fs.open_input_stream(self.path("data", multiformats.to_text(physical))) as stream:
            return stream.read()

    def link_data(self, physical: bytes, source: str) -> None:
        """Make `source` (a changelog file, on the same storage) the slice `data/<physical>` without copying
        where the storage can: a hard link on a local disk, a server-side copy on an object store."""
        target = self.path("data", multiformats.to_text(physical))
        if self.has_data(physical):
            return
        make_folder(self.fs, self.path("data"))
        if self.local:
            try:
                os.link(source, target)
                return
            except FileExistsError:
                return
            except OSError as exc:  # another device, or links not supported: a copy has the same bytes
                _log.info("odf.data_copied", reason=str(exc), file=target)
        tmp = f"{target}.{uuid.uuid4().hex}.tmp"
        self.fs.copy_file(source, tmp)
        self.fs.move(tmp, target)

    def put_data(self, physical: bytes, data: bytes) -> None:
        if not self.has_data(physical):
            self._put(self.path("data", multiformats.to_text(physical)), data)

    def _put(self, path: str, data: bytes) -> None:
        make_folder(self.fs, posixpath.dirname(path))
        if not self.local:  # one PUT: readers see all of it or none
            with self.fs.open_output_stream(path) as out:
                out.write(data)
            return
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
