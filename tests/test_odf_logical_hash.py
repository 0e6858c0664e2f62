"""The logical hash of data slices against the arrow-digest crate itself (tests/arrow_digest_ref: the crate at the
version kamu uses, reading Parquet files as kamu's `get_parquet_logical_hash` does), on random tables."""

from __future__ import annotations

import shutil
import subprocess
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakefeed.odf import logical_hash, multiformats
from lakefeed.odf.logical_hash import logical_digest, logical_multihash

REF = Path(__file__).parent / "arrow_digest_ref"


@pytest.fixture(scope="session")
def reference() -> Path:
    """The reference program, built from crates.io once per session (Cargo.lock pins every crate)."""
    cargo = shutil.which("cargo")
    assert cargo, "the logical hash tests need Rust's cargo (https://rustup.rs): it builds the arrow-digest reference"
    subprocess.run([cargo, "build", "--release", "--locked", "-q", "--manifest-path", str(REF / "Cargo.toml")],
                   check=True, timeout=1800)
    return REF / "target" / "release" / "arrow-digest-ref"


def _reference(binary: Path, path: Path, batch: int) -> str:
    out = subprocess.run([str(binary), str(path)], check=True, capture_output=True, text=True, timeout=120,
                         env={"BATCH": str(batch)})
    return out.stdout.split("\t")[1].strip()


def _column(draw, type_name: str, n: int, nulls: bool) -> pa.Array:
    maybe = (lambda s: st.none() | s) if nulls else (lambda s: s)
    ints = st.integers(-(2**31), 2**31 - 1)
    values = {
        "int8": (maybe(st.integers(-128, 127)), pa.int8()),
        "uint16": (maybe(st.integers(0, 65535)), pa.uint16()),
        "int32": (maybe(ints), pa.int32()),
        "int64": (maybe(st.integers(-(2**63), 2**63 - 1)), pa.int64()),
        "uint64": (maybe(st.integers(0, 2**64 - 1)), pa.uint64()),
        "float32": (maybe(st.floats(width=32, allow_nan=False)), pa.float32()),
        "float64": (maybe(st.floats(allow_nan=False)), pa.float64()),
        "bool": (maybe(st.booleans()), pa.bool_()),
        "string": (maybe(st.text(max_size=12)), pa.string()),
        "large_string": (maybe(st.text(max_size=12)), pa.large_string()),
        "binary": (maybe(st.binary(max_size=12)), pa.binary()),
        "fixed_binary": (maybe(st.binary(min_size=3, max_size=3)), pa.binary(3)),
        "timestamp_us_utc": (maybe(st.integers(-(2**50), 2**50)), pa.timestamp("us", tz="UTC")),
        "timestamp_ms": (maybe(st.integers(-(2**50), 2**50)), pa.timestamp("ms")),
        "date32": (maybe(st.integers(-100000, 100000)), pa.date32()),
        "time64": (maybe(st.integers(0, 86_399_999_999)), pa.time64("us")),
        "decimal": (maybe(st.decimals(min_value=-(10**7), max_value=10**7, places=2, allow_nan=False,
                                      allow_infinity=False)), pa.decimal128(10, 2)),
        "list_int": (maybe(st.lists(st.none() | ints, max_size=4)), pa.list_(pa.int32())),
        "list_string": (maybe(st.lists(st.none() | st.text(max_size=5), max_size=4)), pa.list_(pa.string())),
        # Either the structs or their fields have nulls, not both: where a field is null inside a struct that is
        # not, in a batch that also has null structs, the crate hashes whatever bytes the reader left in the
        # field's null slot (undefined; logical_hash.py hashes zeros).
        "struct": (st.none() | st.fixed_dictionaries({"x": ints, "y": st.text(max_size=5)}) if nulls else
                   st.fixed_dictionaries({"x": st.none() | ints, "y": st.none() | st.text(max_size=5)}),
                   pa.struct([("x", pa.int32()), ("y", pa.string())])),
    }
    strategy, type_ = values[type_name]
    data = draw(st.lists(strategy, min_size=n, max_size=n))
    if type_name == "decimal":
        data = [None if v is None else Decimal(v) for v in data]
    return pa.array(data, type=type_)


_TYPES = ["int8", "uint16", "int32", "int64", "uint64", "float32", "float64", "bool", "string", "large_string",
          "binary", "fixed_binary", "timestamp_us_utc", "timestamp_ms", "date32", "time64", "decimal", "list_int",
          "list_string", "struct"]


@st.composite
def tables(draw) -> pa.Table:
    n = draw(st.integers(0, 40))
    names = draw(st.lists(st.sampled_from(_TYPES), min_size=1, max_size=5, unique=True))
    return pa.table({name: _column(draw, name, n, draw(st.booleans())) for name in names})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(table=tables(), batch=st.integers(1, 50), split=st.integers(1, 50), data=st.data())
def test_logical_hashes_equal_the_arrow_digest_crates(reference, tmp_path_factory, table, batch, split, data):
    """Files of several row groups, read back in chunks of any size, hashed in the reader's batches."""
    path = tmp_path_factory.mktemp("slice") / "slice.parquet"
    pq.write_table(table, path, row_group_size=data.draw(st.integers(1, 64)))
    read = pq.read_table(path)
    chunked = pa.Table.from_batches(read.to_batches(max_chunksize=split), schema=read.schema)
    assert logical_digest(chunked, batch_rows=batch).hex() == _reference(reference, path, batch)


def test_a_whole_changelog_slice_hashes_as_the_crate_hashes_it(reference, tmp_path):
    n = 5000
    table = pa.table({
        "offset": pa.array(range(n), pa.int64()), "op": pa.array([i % 4 for i in range(n)], pa.int8()),
        "system_time": pa.array([1_700_000_000_000_000 + i for i in range(n)], pa.timestamp("us", tz="UTC")),
        "name": pa.array([None if i % 7 == 0 else f"name {i}" for i in range(n)]),
        "amount": pa.array([i * 0.5 for i in range(n)]),
    })
    path = tmp_path / "slice.parquet"
    pq.write_table(table, path)
    digest = logical_digest(pq.read_table(path))
    assert digest.hex() == _reference(reference, path, 1000)
    assert logical_multihash(table) == multiformats.multihash(0x300016, digest)


def test_types_the_crate_cannot_hash_are_refused_by_name():
    with pytest.raises(ValueError, match="column 'd'.*duration"):
        logical_digest(pa.table({"d": pa.array([1], pa.duration("s"))}))
    with pytest.raises(ValueError, match="column 'm'"):
        logical_digest(pa.table({"m": pa.array([{"a": 1}], pa.map_(pa.string(), pa.int64()))}))


def test_a_task_given_one_core_hashes_in_its_own_thread_to_the_same_digest(monkeypatch):
    table = pa.table({"a": list(range(1000)), "b": [str(i % 7) for i in range(1000)], "c": [1.5] * 1000})
    spread = logical_digest(table)  # the pool's threads, the machine's cores
    before = pa.cpu_count()
    pa.set_cpu_count(1)  # as in a Spark executor of one core (OMP_NUM_THREADS=1)
    try:
        monkeypatch.setattr(logical_hash, "ThreadPoolExecutor", None)  # any pool would fail here
        assert logical_digest(table) == spread
    finally:
        pa.set_cpu_count(before)
