"""py4j's callback server (through which the JVM calls a query's foreachBatch) select()s its listening socket, and
select() takes no descriptor past 1023: a server started by then dies in its thread, and every foreachBatch query of
the process waits for ever. The daemon's session starts it at once, while its descriptors are few
(daemon/ops/spark.py, `session`)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import os
import sys
from pathlib import Path

from lakefeed.config.model import SparkConfig
from lakefeed.ops import spark as spark_module

work = Path(sys.argv[1])
spark = spark_module.session(SparkConfig(master="local[1]"))
held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]  # what a busy daemon may hold by its first query
assert held[-1] > 1023, held[-1]
(work / "in").mkdir(parents=True)
(work / "in" / "a.txt").write_text("x\n")
seen = []
query = (spark.readStream.text(str(work / "in")).writeStream
         .foreachBatch(lambda frame, batch: seen.append(frame.count()))
         .option("checkpointLocation", str(work / "checkpoint")).trigger(availableNow=True).start())
ended = query.awaitTermination(60)
print(f"ended={ended} seen={seen}", flush=True)
os._exit(0 if ended and seen == [1] else 1)  # a hung callback would hang the session's stop too
"""


def test_foreach_batch_runs_when_the_process_holds_more_than_1024_descriptors(tmp_path):
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], text=True, capture_output=True, timeout=240)
    assert out.returncode == 0, (out.stdout, out.stderr[-3000:])
    assert "ended=True seen=[1]" in out.stdout
