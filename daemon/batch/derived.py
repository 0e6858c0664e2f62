"""A derived entity of a data manifest (seed 001): the distinct values of an attribute in every file of its
source type, as `id`.

Any one of those files landing makes the whole state again: it is read with the others as they are now, each
opened as a landed file is. Another file's bad lines are not this batch's to quarantine (they are when that file
lands); one that is missing or cannot be taken adds no ids, and one being rewritten makes this read superseded,
since its own batch reads them all again.
"""

from __future__ import annotations

from typing import TypeGuard

import pyarrow as pa

from lakefeed.batch import textfile
from lakefeed.batch.landed import Landed, Unreadable, read_landed
from lakefeed.batch.read import FileRead
from lakefeed.config.data_manifest import TextFileFormat
from lakefeed.config.limits import Limits
from lakefeed.config.model import FileFormat


def derives(fmt: FileFormat) -> TypeGuard[TextFileFormat]:
    """Whether the entity is a derived one of a data manifest."""
    return isinstance(fmt, TextFileFormat) and fmt.derive is not None


def read_derived(landed: Landed, fmt: TextFileFormat, target: pa.Schema | None, limits: Limits) -> FileRead:
    """The ids of every file of the entity's source type, read when one of them (`landed`) landed."""
    read = read_landed(landed, fmt, target, limits)
    tables = [read.table]
    for source in fmt.files:
        if source.path == landed.origin:
            continue
        try:
            with Landed(source.path, landed.root, landed.follow_symlinks) as other:
                tables.append(read_landed(other, fmt, target, limits).table)
        except (FileNotFoundError, Unreadable):
            continue  # no ids from it; when it lands, its batch says why
    found = [t for t in tables if t is not None]
    if not found:
        return read
    return FileRead(textfile.derived(pa.concat_tables(found), "id"), read.bad)
