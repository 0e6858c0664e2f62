"""The files of a batch's staging folder (`_staging/` beside the changelog, local or s3://): rows a stage task read,
as Arrow IPC, for the tasks that write or reduce them. The folder's name says whose batch it is (`folder`,
`batch_of`): a task writing files of its own for the batch names them after it.
"""

from __future__ import annotations

import posixpath

import pyarrow as pa

from lakefeed.batch.buckets import bucket_of
from lakefeed.config.model import EntityConfig
from lakefeed.inbox.storage import Storage, make_folder


def folder(parent: str, token: str, batch_id: int) -> str:
    """The staging folder of batch `batch_id` of the query whose files are named with `token`."""
    return f"{parent}/_staging/{token}-b{batch_id}"


def batch_of(url: str) -> tuple[str, int]:
    """The query's token and the batch of a staging folder (`folder`)."""
    token, batch_id = posixpath.basename(url.rstrip("/")).rsplit("-b", 1)
    return token, int(batch_id)


def write_buckets(store: Storage, name: str, table: pa.Table, keys: tuple[str, ...], buckets: int) -> tuple[str, ...]:
    """`table` cut into `buckets` by key, a file each (`name`.b<n>.arrow; "": a bucket without rows)."""
    which = bucket_of(table, keys, buckets)
    masks = [which == b for b in range(buckets)]
    return tuple(write_staged(store, f"{name}.b{b}.arrow", table.filter(pa.array(mask))) if mask.any() else ""
                 for b, mask in enumerate(masks))


def write_staged(store: Storage, url: str, table: pa.Table) -> str:
    fs, path = store.fs_of(url)
    make_folder(fs, posixpath.dirname(path))
    with fs.open_output_stream(path) as stream, pa.ipc.new_file(stream, table.schema) as writer:
        writer.write_table(table)
    return url


def read_staged(cfg: EntityConfig, path: str) -> pa.Table:
    fs, where = Storage(cfg.storage).fs_of(path)
    with fs.open_input_file(where) as source:
        return pa.ipc.open_file(source).read_all()
