"""A changelog file's ODF slice as the task that writes it describes it (daemon/odf/slices.py: from the rows and the
bytes it wrote) equals the slice read back from the file, as the chain and `lakefeed verify` read it."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakefeed.connectors.sinks import data_files
from lakefeed.odf import multiformats, slices
from lakefeed.odf.logical_hash import logical_multihash
from lakefeed.odf.schema import data_schema
from tests.test_odf_logical_hash import tables

# Floats whose bits a careless encoder could change: signed zeros, NaNs of other payloads, infinities.
_FLOATS = st.sampled_from([0.0, -0.0, float("nan"), -float("nan"), float("inf"), -float("inf"), 1.5, None])


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(table=tables(), floats=st.lists(_FLOATS, min_size=40, max_size=40), stamped=st.booleans(),
       unique=st.booleans())
def test_a_slice_described_where_it_was_written_is_the_slice_read_back(tmp_path_factory, table, floats, stamped,
                                                                       unique):
    n = table.num_rows
    if unique:  # mostly distinct values, the special ones among them: written plain, without a dictionary
        floats = [f if i % 4 == 0 else i + 0.25 for i, f in enumerate(floats)]
    table = table.append_column("float", pa.array(floats[:n], pa.float64()))
    plain = "float" not in data_files.dictionary_columns(table)
    if unique and n > 1:
        assert plain
    elif not unique and n >= 16:  # at most 8 distinct values: they repeat
        assert not plain
    if stamped:
        table = table.append_column(pa.field("system_time", pa.timestamp("us", tz="UTC"), nullable=False),
                                    pa.array([1_700_000_000_000_000 + i for i in range(n)],
                                             pa.timestamp("us", tz="UTC")))
    root = tmp_path_factory.mktemp("changelog")
    seen = []
    files = data_files.write(pafs.LocalFileSystem(), str(root), table, "part-t-b0-r0",
                             seen=lambda file, rows, data: seen.append((file, slices.describe(rows, data))))
    assert [file for file, _ in seen] == files
    (file, described), = seen
    path = root / file.path
    read = pq.read_table(path)
    try:
        fields, logical = data_schema(read.schema), logical_multihash(read)
    except ValueError:
        assert described is None  # what ODF cannot describe is left to the chain, which refuses it by name
        return
    entry = slices.described({slices.KEY: json.dumps({file.path: described})}, file.path)
    assert entry is not None
    assert (data_schema(entry.schema), entry.logical, entry.size) == (fields, logical, path.stat().st_size)
    assert entry.physical == multiformats.sha3(path.read_bytes())
    assert entry.written == (read.column("system_time")[-1].as_py() if stamped and n else None)
