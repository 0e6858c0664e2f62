"""A changelog file's ODF slice, described where the file was written (a Spark task, which has it at hand) and
carried to the chain in the changelog commit's metadata (`lakefeed.odf_slices`): the chain then links the file
without reading it back in the driver. `lakefeed verify` still hashes every slice from its file
(daemon/odf/check.py), so a description that does not match the file is found there.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from lakefeed.odf import multiformats
from lakefeed.odf.logical_hash import logical_multihash
from lakefeed.odf.schema import data_schema

KEY = "lakefeed.odf_slices"  # changelog commit metadata: {file path relative to the table: described slice}


@dataclass(frozen=True)
class Described:
    logical: bytes  # multihash
    physical: bytes  # multihash
    size: int
    schema: pa.Schema
    written: datetime | None  # the slice's latest system_time


def describe(table: pa.Table, data: pa.Buffer | bytes) -> dict[str, Any] | None:
    """The slice a changelog file is, as JSON, from the rows it was written from and its bytes (Parquet restores
    what it was given: the same values and Arrow types, so the same logical hash; tests/test_odf_slices.py reads
    them back to check); None when ODF cannot describe or hash its data (the chain then reads the file itself and
    refuses it in its own words)."""
    try:
        data_schema(table.schema)
        logical = logical_multihash(table)
    except ValueError:
        return None
    written = pc.max(table.column("system_time")).as_py() if "system_time" in table.column_names else None
    return {"logical": logical.hex(), "physical": multiformats.sha3(data).hex(), "size": len(data),
            "schema": base64.b64encode(table.schema.serialize().to_pybytes()).decode(),
            "written": written.isoformat() if written else None}


def described(meta: dict[str, Any], relative: str) -> Described | None:
    """What a commit's metadata says of one of its files."""
    try:
        entry = json.loads(meta.get(KEY) or "{}").get(relative)
        if entry is None:
            return None
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(entry["schema"])))
        return Described(bytes.fromhex(entry["logical"]), bytes.fromhex(entry["physical"]), int(entry["size"]),
                         schema, datetime.fromisoformat(entry["written"]) if entry.get("written") else None)
    except (ValueError, KeyError, TypeError, pa.ArrowInvalid):
        return None  # not lakefeed's, or damaged: the chain reads the file
