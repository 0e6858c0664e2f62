"""Which engine should read landed CSV files: Spark's CSV reader or pyarrow?

Both must end with an Arrow table in the driver, because the Delta writer (delta-rs) takes
Arrow there. Spark: `spark.read.csv(files, schema=…)` then `DataFrame.toArrow()`. pyarrow:
`pyarrow.csv.read_csv` per file (multi-threaded) then `concat_tables`. The same files, the
same schema, measured in one run after a warm-up of each. Prints one JSON object.

    python bench/read_engines.py [--files 40] [--rows 50000] [--repeat 3] [--smoke]

`--smoke`: 4 files x 2,000 rows, read once by each engine after the warm-up.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
from _common import parse_args  # bench/ is the script folder, so on sys.path

from lakefeed.config.model import SparkConfig
from lakefeed.ops import spark as spark_module

SCHEMA = pa.schema([("id", pa.int64()), ("customer", pa.string()), ("amount", pa.float64()),
                    ("category", pa.string())])
SPARK_SCHEMA = "id long, customer string, amount double, category string"
SMOKE = {"files": 4, "rows": 2000, "repeat": 1}


def generate(folder: Path, files: int, rows: int) -> list[str]:
    rng = np.random.default_rng(7)
    paths = []
    for n in range(files):
        table = pa.table({
            "id": np.arange(n * rows, (n + 1) * rows),
            "customer": pa.array(rng.integers(0, 100_000, rows).astype(str)),
            "amount": rng.random(rows) * 1000,
            "category": pa.array(rng.choice(["a", "bb", "ccc", "dddd"], rows)),
        })
        path = folder / f"f{n:04d}.csv"
        pacsv.write_csv(table, path)
        paths.append(str(path))
    return paths


def read_pyarrow(paths: list[str]) -> pa.Table:
    convert = pacsv.ConvertOptions(column_types={f.name: f.type for f in SCHEMA})
    return pa.concat_tables([pacsv.read_csv(p, convert_options=convert) for p in paths])


def read_spark(session, paths: list[str]) -> pa.Table:
    return session.read.csv(paths, header=True, schema=SPARK_SCHEMA).toArrow()


def best_of(repeat: int, fn) -> tuple[float, int]:
    times, rows = [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        rows = fn().num_rows
        times.append(time.perf_counter() - start)
    return min(times), rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=40)
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parse_args(parser, argv, SMOKE)
    with tempfile.TemporaryDirectory() as tmp:
        paths = generate(Path(tmp), args.files, args.rows)
        session = spark_module.session(SparkConfig(master="local[2]"))
        try:
            read_spark(session, paths[:1])  # warm-up: JVM, Python workers, codegen
            read_pyarrow(paths[:1])
            print("reading…", file=sys.stderr)
            spark_s, spark_rows = best_of(args.repeat, lambda: read_spark(session, paths))
            arrow_s, arrow_rows = best_of(args.repeat, lambda: read_pyarrow(paths))
        finally:
            session.stop()
    assert spark_rows == arrow_rows == args.files * args.rows
    print(json.dumps({
        "bench": "read_engines", "smoke": args.smoke, "files": args.files, "rows": arrow_rows,
        "spark_rows_per_s": round(spark_rows / spark_s), "pyarrow_rows_per_s": round(arrow_rows / arrow_s),
        "pyarrow_speedup": round(spark_s / arrow_s, 2), "spark_s": round(spark_s, 3), "pyarrow_s": round(arrow_s, 3),
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
