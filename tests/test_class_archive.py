"""The Spark driver's class archive (daemon/ops/class_archive.py): made at set-up, mapped by every session's driver
JVM, skipped where it would not fit, harmless where it is broken."""

from __future__ import annotations

import json
import subprocess
import sys

from lakefeed.ops import class_archive, jars, spark

# A session's driver JVM, logging where each class came from.
PROBE = """
import json, sys
from lakefeed.config.model import SparkConfig
from lakefeed.ops import spark
extra = json.loads(sys.argv[2])
options = f"-Xlog:class+load=info:file={sys.argv[1]} {extra.get('spark.driver.extraJavaOptions', '')}"
conf = {**extra, "spark.driver.extraJavaOptions": options}
session = spark.session(SparkConfig(conf=conf))
print(session.range(3).count())
"""


def _loaded(tmp_path, conf: dict[str, str] | None = None) -> dict[str, str]:
    """Where the driver JVM of a session took some of Spark's classes from (`-Xlog:class+load`)."""
    log = tmp_path / "classes.log"
    run = subprocess.run([sys.executable, "-c", PROBE, str(log), json.dumps(conf or {})], capture_output=True,
                         text=True, timeout=300, check=False)
    assert run.returncode == 0 and run.stdout.split() == ["3"], run.stderr[-3000:]
    assert "cds" not in run.stderr  # no warning of an archive that did not fit
    wanted = ("org.apache.spark.SparkContext ", "org.apache.spark.sql.SparkSession ")
    return {line.split()[1]: line.partition(" source: ")[2] for line in log.read_text().splitlines()
            if any(f" {name}" in line for name in wanted)}


def test_set_up_made_the_archive_and_a_session_maps_it(tmp_path):
    archive = class_archive.path(spark.check_java())
    assert archive.is_file() and archive.parent == jars.cache_dir() / "cds"  # `lakefeed jars fetch` made it
    assert set(_loaded(tmp_path).values()) == {"shared objects file (top)"}  # the dynamic archive's classes


def test_the_archive_is_left_out_where_it_would_not_fit(tmp_path):
    java = spark.check_java()
    assert class_archive.option(java, {}) == f"-XX:SharedArchiveFile={class_archive.path(java)}"
    # Another JVM build (or pyspark) has an archive of its own, not made yet.
    assert class_archive.path(java + " (another build)") != class_archive.path(java)
    assert class_archive.option(java + " (another build)", {}) is None
    # The user's own CDS options, or jars put before pyspark's on the class path, win.
    for conf in ({"spark.driver.extraJavaOptions": "-Xshare:off"},
                 {"spark.driver.extraJavaOptions": "-XX:SharedArchiveFile=/elsewhere.jsa"},
                 {"spark.driver.extraClassPath": "/opt/first.jar"}):
        assert class_archive.option(java, conf) is None
    assert class_archive.option(java, {"spark.driver.extraClassPath": "/opt/first.jar"}, "executor") is not None
    assert class_archive.option(java, {"spark.executor.extraJavaOptions": "-Xshare:off"}, "executor") is None
    assert all(source.startswith("jar:") or source.startswith("file:")
               for source in _loaded(tmp_path, {"spark.driver.extraJavaOptions": "-Xshare:off"}).values())


def test_a_broken_archive_only_slows_the_start(tmp_path, monkeypatch):
    monkeypatch.setenv("LAKEFEED_JARS_DIR", str(tmp_path / "jars"))
    java = spark.check_java()
    broken = class_archive.path(java)
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"not an archive" * 1000)
    loaded = _loaded(tmp_path)
    assert loaded and not any("shared objects file" in source for source in loaded.values())


EXECUTORS = """
import sys
from lakefeed.config.model import SparkConfig
from lakefeed.ops import spark
options = f"-Xlog:class+load=info:file={sys.argv[1]}/executor-%p.log"
conf = {"spark.executor.extraJavaOptions": options}
session = spark.session(SparkConfig(master="local-cluster[1,1,1024]", conf=conf))
print(session.sparkContext.parallelize(range(3), 1).count())
session.stop()
"""


def test_local_cluster_executors_map_it_too(tmp_path):
    """A local-cluster's executors run here, with this JVM and pyspark's jars: their classes come from the archive."""
    run = subprocess.run([sys.executable, "-c", EXECUTORS, str(tmp_path)], capture_output=True, text=True,
                         timeout=300, check=False)
    assert run.returncode == 0 and run.stdout.split() == ["3"], run.stderr[-3000:]
    logs = list(tmp_path.glob("executor-*.log"))
    assert len(logs) == 1, logs
    env = [line for line in logs[0].read_text().splitlines() if " org.apache.spark.SparkEnv " in line]
    assert env and env[0].endswith("source: shared objects file (top)"), env


def test_options_from_the_environment_keep_the_archive_of_the_jvm_build():
    """`JDK_JAVA_OPTIONS` (the suite sets C1 only) adds the launcher's note and a mode to `java -version`'s text;
    the archive is the build's, made at set-up without them."""
    plain = ('openjdk version "17.0.15" 2025-04-15\nOpenJDK Runtime Environment (build 17.0.15+6-Debian-1deb12u1)\n'
             "OpenJDK 64-Bit Server VM (build 17.0.15+6-Debian-1deb12u1, mixed mode, sharing)\n")
    noted = ("NOTE: Picked up JDK_JAVA_OPTIONS: -XX:TieredStopAtLevel=1\n"
             + plain.replace("mixed mode, sharing", "mixed mode, emulated-client, sharing"))
    assert class_archive.path(noted) == class_archive.path(plain)
    assert class_archive.path(plain.replace("17.0.15+6", "17.0.16+8")) != class_archive.path(plain)
