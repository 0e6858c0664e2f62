"""What a newcomer meets: `make test` naming every missing requirement with its apt-get line (and `make run`
needing only Java), the README saying the same, and a log that is lakefeed's own events, Spark's log4j lines
held back to errors (`spark.log_level`)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

from tests.conftest import entity_yaml, land, wait_for, write_config
from tests.test_daemon_process import Daemon


def test_spark_logs_only_errors_by_default_so_lakefeeds_events_stand_out(tmp_path):
    # A trigger shorter than a batch: Spark would warn that each batch is "falling behind".
    config = write_config(tmp_path, [entity_yaml()], spark={"master": "local[2]", "trigger_interval_s": 0.1})
    with Daemon(config, tmp_path / "daemon.log") as daemon:
        daemon.start()
        land(tmp_path / "landing" / "sales" / "a.csv", "id,amount\n1,2.5\n2,3.5\n")
        wait_for(lambda: daemon.events("batch.committed") >= 1, 60, 0.2, "a committed batch")
        daemon.stop()
    lines = daemon.log.read_text(errors="replace").splitlines()
    events = {json.loads(line)["event"] for line in lines if line.startswith("{")}
    assert {"daemon.ready", "file.discovered", "batch.committed", "daemon.stopped"} <= events
    spark_lines = [line for line in lines if not line.startswith("{")]
    # Without the default, log4j's WARN lines (NativeCodeLoader, ResolveWriteToStream, ProcessingTimeExecutor…)
    # came between the events, and Spark announced its own default level.
    assert not [line for line in spark_lines if " WARN " in line or "log level" in line], spark_lines


def test_spark_log_level_reaches_the_jvm_and_the_configs_own_java_options_come_last():
    from lakefeed.config.model import SparkConfig
    from lakefeed.ops import spark

    assert SparkConfig().log_level == "ERROR"
    options = spark.java_options(SparkConfig(log_level="WARN",
                                             conf={"spark.driver.extraJavaOptions": "-Dlakefeed.spark.logLevel=INFO"}))
    assert options.split() == ["-Xss16m", "-XX:+UseSerialGC", "-Xms64m", spark.TRIM_NATIVE,
                               f"-Dlog4j2.configurationFile={spark.LOG4J2}",
                               "-Dlakefeed.spark.logLevel=WARN", "-Dlakefeed.spark.logLevel=INFO"]
    assert "rootLogger.level = ${sys:lakefeed.spark.logLevel:-ERROR}" in spark.LOG4J2.read_text()


COLLECTOR_ON = r"\bUse(Serial|Parallel|G1|Z|Shenandoah|Epsilon)GC\s.*= true"  # -XX:+PrintFlagsFinal's line


def test_the_drivers_collector_is_the_serial_one_unless_the_config_names_another():
    """A JVM given two collectors refuses to start: the config's own wins by replacing ours."""
    from lakefeed.config.model import SparkConfig
    from lakefeed.ops import spark

    java = spark.java_binary()
    assert java is not None
    for theirs, flag in (("", "UseSerialGC"), ("-XX:+UseG1GC", "UseG1GC"), ("-XX:+UseParallelGC", "UseParallelGC")):
        options = spark.java_options(SparkConfig(conf={"spark.driver.extraJavaOptions": theirs}))
        run = subprocess.run([java, *shlex.split(options), "-XX:+PrintFlagsFinal", "-version"], capture_output=True,
                             text=True, timeout=60, check=False)
        assert run.returncode == 0, run.stderr
        chosen = {line.split()[1] for line in run.stdout.splitlines() if re.search(COLLECTOR_ON, line)}
        assert chosen == {flag}, (theirs, chosen)
        heap_start = next(line for line in run.stdout.splitlines() if " InitialHeapSize " in line)
        assert int(heap_start.split("=")[1].split()[0]) == 64 << 20


def test_once_started_the_drivers_heap_keeps_less_of_itself_free_unless_set_otherwise(spark):
    """10-30% free after a full collection, set at run time; a ratio set any other way (here: at run time before)
    is kept. The test session's JVM gets the JVM's defaults back."""
    from lakefeed.ops import spark as sessions

    jvm = spark.sparkContext._jvm
    bean = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean"))
    values = {name: bean.getVMOption(name) for name, _ in sessions.HEAP_FREE}
    assert {name: (v.getValue(), v.getOrigin().toString()) for name, v in values.items()} == {
        "MinHeapFreeRatio": ("40", "DEFAULT"), "MaxHeapFreeRatio": ("70", "DEFAULT")}
    try:
        sessions.keep_heap_small(spark)
        assert {name: bean.getVMOption(name).getValue() for name in values} == dict(sessions.HEAP_FREE)
        bean.setVMOption("MaxHeapFreeRatio", "50")
        sessions.keep_heap_small(spark)
        assert bean.getVMOption("MaxHeapFreeRatio").getValue() == "50"
    finally:
        bean.setVMOption("MaxHeapFreeRatio", "70")
        bean.setVMOption("MinHeapFreeRatio", "40")


def test_the_drivers_jvm_gives_back_what_it_frees_of_its_native_heap(spark):
    """glibc would keep it for the JVM's next allocations (145 MB after one burst in an hour's run)."""
    jvm = spark.sparkContext._jvm
    bean = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean"))
    assert bean.getVMOption("TrimNativeHeapInterval").getValue() == "10000"


def test_a_spreads_jobs_generate_no_code_whatever_their_count(spark):
    """Whole-stage code generation wrote a spread's count of items into its range's Java source: each new count was
    compiled again (in the driver and in each executor) and the JVM's C2 once took 229 MB compiling the generator.
    A spread plans without it; the daemon's other queries keep it."""
    from lakefeed.ops import spark as sessions

    metrics = spark.sparkContext._jvm.org.apache.spark.metrics.source.CodegenMetrics
    spread = sessions.SparkSpread(spark)
    spread.map(str, [0, 1, 2, 3], "test")  # the first compiles the projections of its rows, as the warm-up's does
    compiled = metrics.METRIC_COMPILATION_TIME().getCount()
    for count in (1, 3, 2, 5):
        assert spread.map(lambda item: item * 10, list(range(count)), "test") == [i * 10 for i in range(count)]
    assert metrics.METRIC_COMPILATION_TIME().getCount() == compiled
    assert spark.conf.get("spark.sql.codegen.wholeStage") == "true"
    spark.range(7).selectExpr("id * 7919 + 104729 AS x").collect()  # a plan of the session's own: compiled
    assert metrics.METRIC_COMPILATION_TIME().getCount() > compiled


def test_the_session_keeps_a_short_history_of_finished_jobs(spark):
    """A daemon's session runs jobs for months: the status store keeps the last 50, not Spark's 1,000."""
    context = spark.sparkContext
    for _ in range(60):
        context.parallelize([1], 1).count()
    kept = context.statusTracker().getJobIdsForGroup(None)
    assert 0 < len(kept) <= 50, len(kept)
    assert context.getConf().get("spark.sql.ui.retainedExecutions") == "50"


def test_make_test_names_every_missing_requirement_and_how_to_install_it_and_make_run_needs_only_java(tmp_path):
    repo = Path(__file__).resolve().parents[1]
    make = shutil.which("make")
    assert make is not None, "make is missing: apt-get install make"
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    bare = subprocess.run([make, "-s", "test-requirements"], cwd=repo, capture_output=True, text=True, timeout=60,
                          env={**env, "PATH": str(tmp_path)})  # a machine with none of them
    assert bare.returncode != 0
    assert "java (17 or newer)" in bare.stderr and "chromium:" in bare.stderr and "systemd-analyze" in bare.stderr
    assert "sudo apt-get install openjdk-17-jre-headless chromium systemd" in bare.stderr
    assert subprocess.run([make, "-s", "test-requirements"], cwd=repo, capture_output=True, text=True,
                          timeout=60).returncode == 0  # this machine has them (.ci/run installs them)
    dry_run = subprocess.run([make, "-n", "-W", "pyproject.toml", "run"], cwd=repo, capture_output=True, text=True,
                             timeout=60)
    assert "check_java" in dry_run.stdout and "chromium" not in dry_run.stdout
    readme = (repo / "README.md").read_text(encoding="utf-8")
    assert readme.split("```sh\n", 1)[1].startswith("make run\nmake test\n```")
    requirements = readme.split("Requirements:", 1)[1].split("\n\n", 1)[0]
    assert "apt-get install python3-venv openjdk-17-jre-headless chromium systemd" in requirements.replace("\n", " ")
