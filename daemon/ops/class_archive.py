"""A class data sharing (CDS) archive of the classes a Spark driver loads, made once at set-up.

A driver JVM that maps it starts in about half the time: on the 2 cores measured, a local session 6.5-7.1 s -> 3.7-3.8 s
and its first job 2.3-2.8 s -> 1.2 s, gained at the daemon's every start and by every test that starts one. The archive
is HotSpot's dynamic archive (`-XX:ArchiveClassesAtExit`, JDK 13+) of a session doing what the daemon does at start
(its data sources, a Python worker, a streaming query's first trigger), written when that JVM exits. It holds the
classes of the JVM's own class path (pyspark's jars), so one archive serves every session whatever `spark.jars` adds.

The executors of a `local-cluster` master run on this machine, with this JVM and pyspark's jars: they map it too
(their classes are mostly the driver's; their start took 3-4 s less, measured here). A real cluster's executors run
elsewhere and are left as they are.

It is valid for one JVM build and one pyspark only: its name carries a key of both (`java -version`, the jars), so a
Java or pyspark upgrade finds none and the driver starts as before, without it, until `lakefeed jars fetch` makes the
new one. Making it is best effort: where it cannot be made, nothing else changes.
"""

from __future__ import annotations

import hashlib
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import pyspark

from lakefeed import log
from lakefeed.ops import jars, spark_home

_log = log.get(__name__)
_OWN_FLAGS = ("SharedArchiveFile", "ArchiveClassesAtExit", "-Xshare:off")  # in spark.conf: the user's choice wins


def path(java_version: str) -> Path:
    """Where the archive for this JVM build (its `java -version` text) and this pyspark is."""
    # The class path is SPARK_HOME's jars: the compiled home's (daemon/ops/spark_home.py) or another.
    key = hashlib.sha256("\n".join([_build(java_version), pyspark.__version__, spark_home.effective(),
                                    *sorted(jars.own_jars())]).encode())
    return jars.cache_dir() / "cds" / f"spark-driver-{key.hexdigest()[:16]}.jsa"


def _build(java_version: str) -> str:
    """The JVM build in `java -version`'s text, without the launcher's note of options from the environment
    (JDK_JAVA_OPTIONS) nor the modes options set (`, emulated-client` under -XX:TieredStopAtLevel=1): the archive
    serves the build whatever they are."""
    return "\n".join(line.split(",")[0] for line in java_version.splitlines() if "Picked up " not in line)


def option(java_version: str, conf: Mapping[str, str], role: str = "driver") -> str | None:
    """The option that maps the archive into a JVM of this `role` (driver, executor), if it was made for this JVM
    and pyspark, and `spark.conf` neither sets CDS options of its own for that role nor puts jars before pyspark's on
    its class path (the archive's)."""
    if any(flag in conf.get(f"spark.{role}.extraJavaOptions", "") for flag in _OWN_FLAGS) \
            or conf.get(f"spark.{role}.extraClassPath"):
        return None
    archive = path(java_version)
    return f"-XX:SharedArchiveFile={shlex.quote(str(archive))}" if archive.is_file() else None


def make(java_version: str) -> Path | None:
    """Make the archive unless it is there (a child process runs the session it records); None if it could not be
    made, which only leaves the driver's start as slow as without it."""
    target = path(java_version)
    if target.is_file():
        _log.info("spark.class_archive_cached", archive=str(target))
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_suffix(".part")
    part.unlink(missing_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as work:
        run = subprocess.run([sys.executable, "-m", "lakefeed.ops.class_recording", str(part), work],
                             capture_output=True, text=True, timeout=600, check=False)
    if run.returncode != 0 or not part.is_file() or part.stat().st_size == 0:
        part.unlink(missing_ok=True)
        _log.warning("spark.class_archive_failed", exit_code=run.returncode, stderr=run.stderr[-2000:],
                     effect="Spark starts without it, a few seconds slower")
        return None
    for stale in target.parent.glob("spark-driver-*.jsa"):  # another Java's or pyspark's
        stale.unlink()
    part.replace(target)
    _log.info("spark.class_archive_made", archive=str(target), mib=round(target.stat().st_size / 2**20),
              seconds=round(time.monotonic() - started, 1))
    return target
