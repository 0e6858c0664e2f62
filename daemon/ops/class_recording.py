"""The session `lakefeed jars fetch` records the Spark driver's class archive from (daemon/ops/class_archive.py), run
as a child process: `python -m lakefeed.ops.class_recording ARCHIVE WORKDIR`. Its driver does what the daemon's does
at start (its data sources, a Python worker, a streaming query's first trigger); its JVM writes the archive as it
exits."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

from pyspark import SparkContext

from lakefeed.config.model import SparkConfig
from lakefeed.connectors.streams.inbox_stream import FORMAT as INBOX
from lakefeed.ops import spark


def record(target: Path, work: Path) -> int:
    """The JVM's exit code (0 once it has written the archive)."""
    recording = f"-XX:ArchiveClassesAtExit={shlex.quote(str(target))}"
    session = spark.session(SparkConfig(conf={"spark.driver.extraJavaOptions": recording}))
    spark.warm_up(session)
    (work / "inbox").mkdir()
    query = (session.readStream.format(INBOX).option("path", str(work / "inbox")).load().writeStream
             .foreachBatch(lambda frame, _: frame.collect()).option("checkpointLocation", str(work / "checkpoint"))
             .trigger(processingTime="100 milliseconds").start())
    deadline = time.monotonic() + 120
    while query.isActive and query.lastProgress is None and time.monotonic() < deadline:
        time.sleep(0.05)
    query.stop()
    jvm = SparkContext._gateway.proc  # type: ignore[union-attr]
    session.stop()
    jvm.stdin.close()  # the JVM exits when its pipe from Python closes, and writes the archive then
    return jvm.wait(timeout=300)


if __name__ == "__main__":
    sys.exit(record(Path(sys.argv[1]), Path(sys.argv[2])))
