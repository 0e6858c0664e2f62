"""A checker of Kartothek datasets written from the seed (shared/seeds/003_*.txt), independent of lakefeed's writer,
and the Python 3.9 environment in which kartothek 5.3 itself reads them."""

from __future__ import annotations

import glob
import json
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
_NAME = re.compile(r"^[A-Za-z0-9+\-_]+$")  # the seed's characters of a filename component
_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}$")
# Kartothek 5.3 (its last release) installs only on Python 3.9 with pyarrow < 7; pip alone resolves numpy 2 and
# pandas 2, with which it fails to import. These install from wheels only (checked: ~10 s).
KARTOTHEK = ["kartothek==5.3.0", "pyarrow==6.0.1", "pandas==1.3.5", "numpy==1.21.6", "dask[dataframe]==2021.12.0",
             "msgpack==1.0.3", "simplekv==0.14.1", "storefact==0.11.0"]


def check_dataset(store: Path, uuid: str, table: str) -> list[str]:
    """Every rule of the seed the dataset breaks (empty: a valid dataset)."""
    problems = []
    meta_path = store / f"{uuid}.by-dataset-metadata.json"
    meta = json.loads(meta_path.read_text())
    if meta.get("dataset_metadata_version") != 4 or type(meta.get("dataset_metadata_version")) is not int:
        problems.append("dataset_metadata_version must be the INT 4")
    if meta.get("dataset_uuid") != uuid or not _NAME.match(uuid):
        problems.append("dataset_uuid must be the uuid of the file name, of letters, digits, + - _")
    metadata = meta.get("metadata", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        problems.append("metadata must be a MAP<STRING, STRING>")
    partitions = meta.get("partitions", {})
    tables = {frozenset(p["files"]) for p in partitions.values()}
    if len(tables) > 1:
        problems.append("all partitions shall have the same set of tables")
    keys = meta.get("partition_keys", [])
    for label, partition in partitions.items():
        for name, key in partition["files"].items():
            if not key.startswith(f"{uuid}/{name}/") or not key.endswith(".parquet"):
                problems.append(f"partition {label}: file {key} is not <uuid>/<table>/….parquet")
            elif not (store / key).is_file():
                problems.append(f"partition {label}: file {key} does not exist")
            # Partition content encoding: URL-encoded col=value folders, in key order (a "/" in a value is %2F,
            # else it would make a folder of its own, without "=").
            folders = key.split("/")[2:-1]
            if [f.split("=", 1)[0] for f in folders] != [quote(k, safe="") for k in keys] or \
                    any(f.count("=") != 1 for f in folders):
                problems.append(f"partition {label}: folders {folders} do not encode the keys {keys}")
    common = store / uuid / table / "_common_metadata"
    if not common.is_file():
        return [*problems, f"{common} is missing"]
    schema = pq.read_schema(common)
    if pq.ParquetFile(common).metadata.num_rows != 0:
        problems.append("_common_metadata must be an empty Parquet file")
    data_files = [store / p["files"][table] for p in partitions.values() if table in p["files"]]
    if not set(keys) <= set(schema.names):
        problems.append(f"_common_metadata lacks the partition keys {sorted(set(keys) - set(schema.names))}")
    for path in data_files:
        names = set(pq.read_schema(path).names)
        if names - set(schema.names) or names & set(keys):
            problems.append(f"{path.name} has columns {sorted(names - set(schema.names))} that _common_metadata "
                            f"does not declare, or partition keys {sorted(names & set(keys))} stored in the file")
    for column, key in meta.get("indices", {}).items():
        folder, _, name = key.rpartition("/")
        if folder != f"{uuid}/indices/{column}" or not name.endswith(".by-dataset-index.parquet") or \
                not _TIME.match(unquote(name.removesuffix(".by-dataset-index.parquet"))):
            problems.append(f"index {key} is not <uuid>/indices/<column>/<URL-encoded time>.by-dataset-index.parquet")
            continue
        index = pq.read_table(store / key)
        kind = index.schema.field("partition").type if "partition" in index.schema.names else pa.null()
        is_list = pa.types.is_list(kind) or pa.types.is_large_list(kind)
        if index.schema.names != [column, "partition"] or not is_list or not (
                pa.types.is_string(kind.value_type) or pa.types.is_large_string(kind.value_type)):
            problems.append(f"index {key} must hold {column!r} and partition: list<string>, not {index.schema}")
            continue
        stored = {r[column]: set(r["partition"]) for r in index.to_pylist()}
        wanted: dict = {}
        for label, partition in partitions.items():
            values = pq.read_table(store / partition["files"][table], columns=[column]).column(column)
            for value in set(values.drop_null().to_pylist()):
                wanted.setdefault(value, set()).add(label)
        if stored != wanted:
            problems.append(f"index {key} does not map each value to exactly the partitions holding it")
    return problems


def python39() -> str | None:
    """A Python 3.9 interpreter that runs on this machine (pyenv's versions, then PATH, where a pyenv shim may
    name one it cannot run), if any."""
    candidates = sorted(glob.glob(str(Path.home() / ".pyenv/versions/3.9*/bin/python3.9")), reverse=True)
    candidates += [found] if (found := shutil.which("python3.9")) else []
    for python in candidates:
        if subprocess.run([python, "-c", "pass"], capture_output=True, timeout=60).returncode == 0:
            return python
    return None


def kartothek_python() -> str | None:
    """The interpreter of a Python 3.9 virtualenv with kartothek 5.3 (made once, under .venv/)."""
    python = python39()
    if python is None:
        return None
    venv = ROOT / ".venv" / "kartothek-py39"
    ready = venv / "installed.txt"
    if not ready.exists() or ready.read_text() != " ".join(KARTOTHEK):
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=300)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--only-binary", ":all:", *KARTOTHEK],
                       check=True, timeout=900)
        ready.write_text(" ".join(KARTOTHEK))
    return str(venv / "bin" / "python")


READ = """
import json, sys
from functools import partial
import storefact
from kartothek.io.eager import read_table
store = partial(storefact.get_store_from_url, "hfs://" + sys.argv[1])
out = {}
for name, predicates in json.loads(sys.argv[3]).items():
    predicates = [[tuple(clause) for clause in conjunction] for conjunction in predicates] if predicates else None
    frame = read_table(dataset_uuid=sys.argv[2], store=store, table="table", predicates=predicates,
                       predicate_pushdown_to_io=False)
    out[name] = sorted(json.dumps({c: (None if v != v else str(v)) for c, v in row.items()}, sort_keys=True)
                       for row in frame[json.loads(sys.argv[4])].to_dict("records"))
print(json.dumps(out))
"""


def kartothek_read(python: str, store: Path, uuid: str, queries: dict, columns: list[str]) -> dict:
    proc = subprocess.run([python, "-c", READ, str(store), uuid, json.dumps(queries), json.dumps(columns)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)
