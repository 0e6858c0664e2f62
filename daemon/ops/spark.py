"""The one SparkSession of the daemon: local by default, any `spark.master` when configured."""

from __future__ import annotations

import os
import pickle
import re
import shlex
import shutil
import subprocess
import sys
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
from pyspark import TaskContext
from pyspark.java_gateway import ensure_callback_server_started
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql.functions import col

from lakefeed.config.model import SparkConfig
from lakefeed.connectors.sources.kafka_source import KafkaDataSource
from lakefeed.connectors.streams.inbox_stream import InboxDataSource
from lakefeed.connectors.streams.spool_stream import SpoolDataSource
from lakefeed.errors import TerminalError
from lakefeed.ops import class_archive, fork_server, jars, spark_home

Job = TypeVar("Job")
Out = TypeVar("Out")

# Loopback only and no UI by default: a daemon should not open ports nobody asked for.
# -Xss16m: without it query.stop() intermittently dies with a StackOverflowError.
DEFAULTS = {
    "spark.sql.shuffle.partitions": "2",
    "spark.ui.enabled": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.extraJavaOptions": "-Xss16m",
    "spark.sql.session.timeZone": "UTC",
    "spark.python.worker.reuse": "true",
    "spark.ui.showConsoleProgress": "false",
    # What Spark keeps of finished work for its UI (off by default here) and its status API, capped for a daemon
    # that runs for months with a query per stream: by default 1,000 jobs, stages and SQL executions with their
    # plans, 100,000 tasks and 100 progress reports a query, all in the driver's heap.
    "spark.ui.retainedJobs": "50",
    "spark.ui.retainedStages": "50",
    "spark.ui.retainedTasks": "1000",
    "spark.sql.ui.retainedExecutions": "50",
    "spark.sql.streaming.numRecentProgressUpdates": "10",
    # A query's checkpoint files (offsets, commits) are written to a temporary file and renamed. Spark's default
    # renames through Hadoop's FileContext, whose local file system (without Hadoop's native library, as here)
    # runs `readlink` and `chmod` processes, about 30 a batch: at 20 entities the driver's JVM started ten a
    # second. Through Hadoop's FileSystem the rename is rename(2), atomic on a local disk as on HDFS, after a check
    # that the target is not there yet; a new file's mode is still set by `chmod`, 4 a batch
    # (docs/architecture.md, "Checkpoint files without readlink").
    "spark.sql.streaming.checkpointFileManagerClass":
        "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
}
# The driver's heap holds plans, offsets and the Delta log's state, 100-140 MB live at 20 entities. The serial
# collector, from 64 MiB up, keeps it near that: G1 (the default on 2 cores and more) started at 1/64 of the
# machine's memory (380 MiB on 24 GiB) and grew toward `spark.driver.memory`, and its own structures took 50 MiB
# more (docs/architecture.md, "The driver JVM's heap").
COLLECTOR, HEAP_START = "-XX:+UseSerialGC", "-Xms64m"
# glibc keeps what the JVM frees with malloc (its compilers' arenas, buffers) for later allocations: once in an hour
# at 20 entities a burst left 145 MB of it held; trimmed every 10 s, it goes back to the system (JDK 17.0.9 and
# newer; an older JVM ignores it, as Spark starts it with -XX:+IgnoreUnrecognizedVMOptions).
TRIM_NATIVE = "-XX:TrimNativeHeapInterval=10000"
# Once the session has started, the heap keeps 10-30% of itself free after a full collection, not the JVM's 40-70%:
# some 50 MiB less of it at 20 entities. Set at run time (they are manageable flags), not as options: from the
# JVM's start the heap would grow from 64 MiB in small steps, each after a full collection, and every session's
# start would pay for them (docs/architecture.md, "The driver JVM's heap").
HEAP_FREE = (("MinHeapFreeRatio", "10"), ("MaxHeapFreeRatio", "30"))
# Spark's log4j configuration: its log on stderr at `spark.log_level` from the JVM's start on.
LOG4J2 = Path(__file__).with_name("log4j2.properties")


def java_binary() -> str | None:
    """The `java` Spark's launcher runs: JAVA_HOME's if set, else the one on PATH."""
    if "JAVA_HOME" in os.environ:
        return shutil.which("java", path=os.path.join(os.environ["JAVA_HOME"], "bin"))
    return shutil.which("java")


def check_java() -> str:
    """Stop with what to do unless Java 17 or newer is there; its `java -version` text."""
    java = java_binary()
    if java is None:
        raise TerminalError("Java 17 or newer is required by Spark and none was found: "
                            "install it (Debian: apt-get install openjdk-17-jre-headless) or set JAVA_HOME")
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    major = int(match.group(1)) if match else 0
    if major == 1 and match and match.group(2):
        major = int(match.group(2))
    if major < 17:
        raise TerminalError(f"Java 17 or newer is required by Spark; {java} is version {major or 'unknown'}")
    return out


def session(cfg: SparkConfig, packages: tuple[str, ...] = ()) -> SparkSession:
    """`packages`: Maven packages (daemon/ops/jars.py) to load from the jar cache, e.g. ("delta",)."""
    java_version = check_java()
    spark_home.use()
    # Spark's Python processes must run this interpreter (the one with pyspark and lakefeed), not the system python3.
    # On a local master, through the fork server's launcher (daemon/ops/fork_server.py): the processes that serve the
    # driver are forked, sharing what they import. The JVM starts its data source lookup with PYSPARK_DRIVER_PYTHON,
    # the others with PYSPARK_PYTHON. A wrapper inherited from another lakefeed process (the one that started this
    # one) is replaced: its server is that process's.
    for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        if not os.environ.get(name) or fork_server.is_wrapper(os.environ[name]):
            os.environ[name] = str(fork_server.start(cfg.master)) if cfg.master.startswith("local") \
                else sys.executable
    if cfg.master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master(cfg.master).appName(cfg.app_name)
    conf = {**DEFAULTS, **(jars.conf(*packages) if packages else {}), **cfg.conf,
            "spark.driver.extraJavaOptions": java_options(cfg, java_version)}
    if cfg.master.startswith("local-cluster") and (shared := class_archive.option(java_version, cfg.conf, "executor")):
        theirs = cfg.conf.get("spark.executor.extraJavaOptions", "")
        conf["spark.executor.extraJavaOptions"] = f"{shared} {theirs}".strip()
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    # Once more at run time: the JVM's options come too late when this process's JVM was already running.
    spark.sparkContext.setLogLevel(cfg.log_level)
    # py4j's callback server (the JVM's way to a query's foreachBatch) select()s its socket, and select() takes no
    # descriptor past 1023: started later, by the first query, in a process holding more, it would die in its thread
    # and every foreachBatch would wait for ever. Started now, its socket gets one of the first descriptors.
    ensure_callback_server_started(spark.sparkContext._gateway)
    spark.dataSource.register(InboxDataSource)
    spark.dataSource.register(SpoolDataSource)
    spark.dataSource.register(KafkaDataSource)
    return spark


def java_options(cfg: SparkConfig, java_version: str = "") -> str:
    """The driver JVM's options: lakefeed's (-Xss16m, its heap's, its native heap trimmed, the methods C2 must not
    compile, its log4j configuration at `spark.log_level`, the class archive made at set-up for this `java_version`:
    daemon/ops/class_archive.py), then those of `spark.conf`, which win where they differ (a JVM takes the last of a
    repeated option). Our collector only if theirs name none: a JVM refuses two."""
    theirs = cfg.conf.get("spark.driver.extraJavaOptions", "")
    collector = "" if re.search(r"-XX:\+Use(Serial|Parallel|G1|Z|Shenandoah|Epsilon)GC\b", theirs) else COLLECTOR
    ours = [DEFAULTS["spark.driver.extraJavaOptions"], collector, HEAP_START, TRIM_NATIVE,
            f"-Dlog4j2.configurationFile={shlex.quote(str(LOG4J2))}",
            f"-Dlakefeed.spark.logLevel={cfg.log_level}", class_archive.option(java_version, cfg.conf) or ""]
    return " ".join(option for option in [*ours, theirs] if option).strip()


def keep_heap_small(spark: SparkSession) -> None:
    """HEAP_FREE, for a session that has started, unless set some other way (an option of the config's, the JVM's
    environment): a flag the JVM still holds at its default."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    kind = jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    bean = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(kind)
    if all(bean.getVMOption(name).getOrigin().toString() == "DEFAULT" for name, _ in HEAP_FREE):
        for name, value in HEAP_FREE:  # the minimum first: it may never exceed the maximum
            bean.setVMOption(name, value)


def warm_up(spark: SparkSession) -> None:
    """Start the Python workers and the JVM's code paths now, not in the first batch: one task per core side by side,
    so that every worker a first batch reuses has imported the tasks' code (about a second per worker)."""
    spread = SparkSpread(spark)
    spread.map(_import_tasks, list(range(spread.width)), "lakefeed: warm-up")


def _import_tasks(item: int) -> int:
    from lakefeed.pipeline import tasks  # noqa: F401, PLC0415 - in the Python worker, not in the driver

    return item


class SparkSpread:
    """A batch's tasks as a Spark job (one task per job item): on the executors of whatever `spark.master` is.
    A task's own exception comes back as the exception it is (so the commit protocol can tell a store fault
    from a data fault); a task whose process dies is retried by Spark. The job is a mapInArrow over one row per
    item, as FrameParts' are: both kinds of batch share one pool of Python workers (an RDD job would start a
    pool of its own, each worker importing the tasks' code again)."""

    def __init__(self, spark: SparkSession) -> None:
        self._spark = _uncompiled(spark)

    @property
    def width(self) -> int:
        return max(1, self._spark.sparkContext.defaultParallelism)

    def map(self, work: Callable[[Job], Out], jobs: list[Job], description: str) -> list[Out]:
        if not jobs:
            return []

        def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in batches:
                for index in batch.column(0).to_pylist():
                    outcome = pickle.dumps(_captured(work, jobs[index]))
                    yield pa.RecordBatch.from_pydict({"part": [index], "outcome": [outcome]}, schema=_OUTCOMES)

        return _outcomes(self._spark.range(len(jobs), numPartitions=len(jobs)), run, description)


# A spread's job is a range of its items' count (a row and a task each) into mapInArrow. Whole-stage code generation
# writes that count into the range's Java source, so each count not seen before was compiled again, in the driver and
# in every executor, and its classes compiled again by the JVMs' JIT: a batch of a new size paid for it. A range of a
# few rows gains nothing from generated code, so the spreads plan in a session of their own (the same SparkContext,
# executors and Python workers) that generates none (docs/architecture.md, "A spread's job generates no code").
_SPREADING: weakref.WeakKeyDictionary[SparkSession, SparkSession] = weakref.WeakKeyDictionary()


def _uncompiled(spark: SparkSession) -> SparkSession:
    if spark not in _SPREADING:
        spreading = spark.newSession()
        spreading.conf.set("spark.sql.codegen.wholeStage", "false")
        _SPREADING[spark] = spreading
    return _SPREADING[spark]


class FrameParts:
    """A micro-batch's DataFrame as `tasks.Parts`: each partition's rows go to `work` in the task that reads them
    (mapInArrow); only what `work` returns, pickled, comes back to the driver."""

    def __init__(self, frame: DataFrame) -> None:
        self._frame = frame

    def map(self, work: Callable[[pa.Table, int], Out], whole: bool, description: str) -> list[Out]:
        def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            chunks = list(batches)  # a partition without rows may have no batch at all
            rows = pa.Table.from_batches(chunks) if chunks else None
            if rows is not None and rows.num_rows:
                part = TaskContext.get().partitionId()  # type: ignore[union-attr]
                outcome = pickle.dumps(_captured(lambda r: work(r, part), rows))
                yield pa.RecordBatch.from_pydict({"part": [part], "outcome": [outcome]}, schema=_OUTCOMES)

        return _outcomes(self._frame.coalesce(1) if whole else self._frame, run, description)

    # A Kafka batch's messages apart, to find the one a task dies on (daemon/pipeline/poison.py). Each is a job over
    # the same micro-batch (Spark reads its offsets again), its messages decoded by `map`'s tasks, never here.

    def ranges(self, part: int | None) -> list[tuple[str, int, int, int]]:
        """(topic, partition, first offset, last offset) of the messages in the frame's partition `part` (None: in
        all of it), in that order: each task sums up its own (one stage; a groupBy would shuffle)."""
        def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            chunks = list(batches)
            if chunks and part in (None, TaskContext.get().partitionId()):  # type: ignore[union-attr]
                found = pa.Table.from_batches(chunks).group_by(["topic", "partition"]).aggregate(
                    [("offset", "min"), ("offset", "max")])
                yield from found.select(["topic", "partition", "offset_min", "offset_max"]).to_batches()

        found = self._frame.select("topic", "partition", "offset").mapInArrow(
            run, "topic string, partition int, offset_min long, offset_max long").collect()
        return sorted((row[0], row[1], row[2], row[3]) for row in found)

    def only(self, topic: str, partition: int, first: int, last: int) -> FrameParts:
        """The messages of a topic-partition from offset `first` to `last`."""
        return FrameParts(self._frame.where(_at(topic, partition, first, last)))

    def without(self, ranges: Sequence[tuple[str, int, int, int]]) -> FrameParts:
        """All but the messages of these ranges (topic, partition, first and last offset), in the same partitions."""
        frame = self._frame
        for topic, partition, first, last in ranges:
            frame = frame.where(~_at(topic, partition, first, last))
        return FrameParts(frame)

    def value(self, topic: str, partition: int, offset: int) -> bytes | None:
        """A message's value as it was sent (None: a tombstone, or not in the batch)."""
        found = self._frame.where(_at(topic, partition, offset, offset)).select("value").collect()
        return bytes(found[0].value) if found and found[0].value is not None else None


def _at(topic: str, partition: int, first: int, last: int) -> Column:
    return (col("topic") == topic) & (col("partition") == partition) & col("offset").between(first, last)


def _outcomes(frame: DataFrame, run: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
              description: str) -> list[Any]:
    """What `run`'s tasks returned, in part order; the first task's exception is raised."""
    frame.sparkSession.sparkContext.setJobDescription(description)
    try:
        collected = frame.mapInArrow(run, "part int, outcome binary").collect()
    finally:
        frame.sparkSession.sparkContext.setJobDescription(None)  # type: ignore[arg-type]
    # Pickled by this daemon's own tasks, as Spark's own results are.
    outcomes = [pickle.loads(row.outcome) for row in sorted(collected, key=lambda row: row.part)]  # noqa: S301
    for failed, value in outcomes:
        if failed:
            raise value
    return [value for _, value in outcomes]


_OUTCOMES = pa.schema([("part", pa.int32()), ("outcome", pa.binary())])


def _captured(work: Callable[[Job], Out], job: Job) -> tuple[bool, Any]:
    try:
        return False, work(job)
    except Exception as exc:
        return True, _travelling(exc)


def _travelling(exc: Exception) -> Exception:
    """`exc`, or, if it cannot be pickled, its text as the nearest built-in exception it is: what kind of fault it
    is (an OSError the store's, an AttributeError a bug: pipeline/verdict.py) must reach the driver, which a
    RuntimeError would have made a data fault, parking the batch."""
    try:
        pickle.dumps(exc)
        return exc
    except Exception:  # noqa: BLE001 - an exception that cannot travel goes as its text
        builtin = next(c for c in type(exc).__mro__ if c.__module__ == "builtins")
        try:
            return builtin(f"{type(exc).__name__}: {exc}")
        except Exception:  # noqa: BLE001 - one whose constructor wants more (UnicodeDecodeError)
            return RuntimeError(f"{type(exc).__name__}: {exc}")
