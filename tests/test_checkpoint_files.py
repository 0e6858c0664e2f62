"""A query's checkpoint files are renamed without starting processes. Spark's default file manager renames them
through Hadoop's FileContext, whose local file system runs `readlink` for each path it renames: ten processes a
second at 20 entities. The daemon's session uses the FileSystem one (daemon/ops/spark.py, DEFAULTS)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys

# The commands Hadoop's local file system runs when it has no native library (its Shell class).
PROBED = ("readlink", "stat", "ls", "chmod", "chown", "df", "du")
SCRIPT = r"""
import sys
from pathlib import Path

from lakefeed.config.model import SparkConfig
from lakefeed.ops import spark as spark_module

work, calls = Path(sys.argv[1]), Path(sys.argv[2])
spark = spark_module.session(SparkConfig(master="local[1]"))
(work / "in").mkdir(parents=True)


def run(name: str) -> str:
    calls.write_text("")
    for n in range(3):  # three batches: each writes its offsets and its commit, each a rename
        (work / "in" / f"{name}-{n}.txt").write_text("x\n")
        query = (spark.readStream.text(str(work / "in")).writeStream.format("noop")
                 .option("checkpointLocation", str(work / name)).trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None, query.exception()
        assert (work / name / "commits" / str(n)).exists(), f"batch {n} of {name} not committed"
    return calls.read_text()


print("lakefeed:" + repr(run("lakefeed")))
spark.conf.set("spark.sql.streaming.checkpointFileManagerClass",
               "org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager")
print("spark-default:" + repr(run("spark-default")))
spark.stop()
"""


def test_the_daemons_queries_rename_their_checkpoint_files_without_starting_processes(tmp_path):
    probes, calls = tmp_path / "probes", tmp_path / "calls.txt"
    probes.mkdir()
    for command in PROBED:  # each records its call, then does what it was asked
        real = shutil.which(command)
        assert real is not None, command
        probe = probes / command
        probe.write_text(f'#!/bin/sh\necho "{command} $*" >> {calls}\nexec {real} "$@"\n')
        probe.chmod(0o755)
    env = {**os.environ, "PATH": f"{probes}{os.pathsep}{os.environ['PATH']}"}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "work"), str(calls)], env=env, text=True,
                         capture_output=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    runs = {name: ast.literal_eval(value) for name, value in (line.split(":", 1) for line in out.stdout.splitlines()
                                                   if line.startswith(("lakefeed:", "spark-default:")))}
    ours, theirs = runs["lakefeed"].splitlines(), runs["spark-default"].splitlines()
    assert any(c.startswith("readlink ") for c in theirs)  # the probes see what Spark's default starts
    assert [c for c in ours if not c.startswith("chmod ")] == []  # renames and lookups start nothing
    # Left: Hadoop's local file system, without its native library, sets each new file's mode (and its checksum
    # file's) with chmod: 4 a batch, about 30 with Spark's default.
    assert len(ours) * 4 <= len(theirs), (len(ours), len(theirs))
