"""The stack a Spark user would pick instead of lakefeed, as a bench's peer, run as its own process.

`csv`: plain PySpark Structured Streaming, `readStream.csv` on a landing folder into `writeStream.format("delta")`
(delta-spark, the jars `lakefeed jars fetch` cached) with a checkpoint. `kafka`: Spark's own Kafka source
(`readStream.format("kafka")`, JSON values parsed with `from_json`) into the same kind of table. Either prints one
line `ready` once the query runs and stops the query on SIGTERM.

`visible(commits, checkpoint)` tells the bench when each landed file became visible: a streaming Delta commit
names its micro-batch (its `txn` action), and the checkpoint's file-source log lists that batch's files.

    python bench/_spark_peer.py csv LANDING TABLE CHECKPOINT --schema DDL [--trigger 0.5] [--master local[2]]
                                    [--jars delta,s3a] [--conf KEY=VALUE ...] [--recursive]
    python bench/_spark_peer.py kafka BOOTSTRAP TOPIC TABLE CHECKPOINT --schema DDL [--max-offsets N] [...]
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from _common import BenchError, kill_group, log_tail  # bench/ is the script folder, so on sys.path

# More Spark conf for the peer in a smoke run (the benches' `--peer-conf`), sized for a table of a few files. Delta
# rebuilds a table's state after a commit in spark.databricks.delta.snapshotPartitions tasks, 50 by default, each of
# which generates code: for the s3_notify smoke's table of 11 files, on a busy 2-core machine, its peer's batch of 10
# files took 80 s and its files were visible 90 s after their PUTs; 11 s with 2 tasks.
SMOKE_CONF = ["spark.databricks.delta.snapshotPartitions=2"]


def smoke_conf() -> list[str]:
    """SMOKE_CONF, and the driver's class archive that `lakefeed jars fetch` made (daemon/ops/class_archive.py) where
    there is one: a smoke's figures are not compared, only its code paths run, and with it a peer's session and first
    Delta write took 13-15 s instead of 22 s (2 idle cores). A full run's peer starts as a Spark user's would."""
    from lakefeed.ops import class_archive, spark

    archive = class_archive.option(spark.check_java(), {})
    return [*SMOKE_CONF, *([f"spark.driver.extraJavaOptions={archive}"] if archive else [])]


def add_conf_argument(parser: argparse.ArgumentParser) -> None:
    """A bench's `--peer-conf KEY=VALUE` (repeatable): Spark conf the peer gets beside its own (none by default)."""
    parser.add_argument("--peer-conf", action="append", default=[], metavar="KEY=VALUE",
                        help="Spark conf for the Spark peer (repeatable; none by default, smoke: "
                             f"{' '.join(SMOKE_CONF)} and the driver's class archive)")


def conf_args(conf: list[str]) -> list[str]:
    """`--peer-conf` values as the peer's own `--conf` arguments."""
    return [f"--conf={item}" for item in conf]


def start(args: list[str], log_path: Path) -> subprocess.Popen:
    """Run this file with `args` (its stderr into `log_path`) until it prints `ready`; the caller stops it."""
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen([sys.executable, __file__, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=log_file, start_new_session=True, text=True)
    if proc.stdout.readline().strip() != "ready":  # the peer prints `ready` or exits
        kill_group(proc)
        raise BenchError(f"the Spark peer did not start ({proc.returncode}): {log_tail(log_path)}")
    return proc


def session(packages: list[str], master: str, conf: dict[str, str]) -> Any:
    """A plain Spark session, as a Spark user would make it, with lakefeed's cached jars of `packages`."""
    from pyspark.sql import SparkSession

    from lakefeed.ops import jars

    conf = {**jars.conf(*packages), "spark.ui.enabled": "false", "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1", "spark.sql.shuffle.partitions": "2",
            "spark.sql.session.timeZone": "UTC", "spark.ui.showConsoleProgress": "false", **conf}
    builder = SparkSession.builder.master(master).appName("spark-peer")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run(args: argparse.Namespace) -> int:
    from pyspark.sql.functions import col, from_json

    spark = session(args.jars.split(","), args.master, dict(item.split("=", 1) for item in args.conf))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if args.kind == "csv":
        stream = (spark.readStream.schema(args.schema).option("header", "true")
                  .option("recursiveFileLookup", str(args.recursive).lower()).csv(args.landing))
    else:
        messages = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", args.bootstrap)
                    .option("subscribe", args.topic).option("startingOffsets", "earliest")
                    .option("maxOffsetsPerTrigger", str(args.max_offsets)).load())
        stream = messages.select(from_json(col("value").cast("string"), args.schema).alias("v")).select("v.*")
    query = (stream.writeStream.format("delta").option("checkpointLocation", args.checkpoint)
             .trigger(processingTime=f"{args.trigger} seconds").start(args.table))
    print("ready", flush=True)
    while not stop.wait(0.2):
        if query.exception() is not None:
            print(f"query failed: {query.exception()}", file=sys.stderr)
            return 1
    query.stop()
    spark.stop()
    return 0


def local_commits(table: Path) -> list[str]:
    """The texts of a local Delta table's commit files, oldest first."""
    return [commit.read_text() for commit in sorted((table / "_delta_log").glob("*.json"))]


def visible(commits: list[str], checkpoint: Path) -> dict[str, float]:
    """File name -> time (s) of the Delta commit that made its rows visible, for these commits (their texts)."""
    out: dict[str, float] = {}
    for commit in commits:
        actions = [json.loads(line) for line in commit.splitlines() if line.strip()]
        batch = next((a["txn"]["version"] for a in actions if "txn" in a), None)
        when = next((a["commitInfo"]["timestamp"] / 1000 for a in actions if "commitInfo" in a), None)
        if batch is None or when is None:
            continue
        for name in _batch_files(checkpoint / "sources" / "0", batch):
            out.setdefault(name, when)
    return out


def _batch_files(log: Path, batch: int) -> list[str]:
    """The files of one micro-batch in the file source's log (a batch's own file, or a compacted one)."""
    candidates = [log / str(batch), log / f"{batch}.compact", *sorted(log.glob("*.compact"))]
    for path in candidates:
        if not path.is_file():
            continue
        entries = [json.loads(line) for line in path.read_text().splitlines()[1:] if line.strip()]
        names = [Path(unquote(urlparse(e["path"]).path)).name for e in entries if e.get("batchId", batch) == batch]
        if names:
            return names
    return []


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="kind", required=True)
    csv = sub.add_parser("csv")
    csv.add_argument("landing")
    kafka = sub.add_parser("kafka")
    kafka.add_argument("bootstrap")
    kafka.add_argument("topic")
    kafka.add_argument("--max-offsets", type=int, default=200_000, help="maxOffsetsPerTrigger")
    csv.add_argument("--recursive", action="store_true", help="files in subfolders too (recursiveFileLookup)")
    for kind in (csv, kafka):
        kind.add_argument("table")
        kind.add_argument("checkpoint")
        kind.add_argument("--schema", required=True, help="the rows' columns as Spark DDL")
        kind.add_argument("--trigger", type=float, default=0.5)
        kind.add_argument("--master", default="local[2]")
        kind.add_argument("--jars", default="delta", help="which of lakefeed's cached Spark packages to load")
        kind.add_argument("--conf", action="append", default=[], help="more Spark conf, KEY=VALUE")
    return run(p.parse_args())


if __name__ == "__main__":
    sys.exit(main())
