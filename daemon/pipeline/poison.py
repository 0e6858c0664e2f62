"""A stage task whose process died: an input a reader crashes on (a C library's fault: a segfault, an abort), or a
worker the kernel killed for memory. Spark retries the task (`spark.task.maxFailures`; once in local mode) and then
fails the job with nothing but "Python worker exited unexpectedly". Such a death looks like the store's fault
(a lost connection), so the batch would be tried again for ever and the stream would stand behind that input.

So a stage job that died is staged again one unit (a landed file, a push frame) per task. A unit whose task dies
there, and then again alone, is quarantined with the reason (a file's rows stay in the file; a frame's bytes go to
quarantine as acknowledged, not decoded: decoding them is what may crash), and the batch goes on. A death that does
not come back for a unit alone (an executor lost, memory short only beside other tasks) costs a slower batch.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from lakefeed import log
from lakefeed.batch.read import BadRow
from lakefeed.inbox import spool
from lakefeed.pipeline.tasks import FramesJob, Spread, Staged, StageJob

_log = log.get(__name__)
# Spark's words for a job given up on because a task failed each time; a task's own exception never gets here
# (ops/spark.py returns it as the exception it is), so this is a task whose process was lost.
_ABORTED = re.compile(r"Job aborted due to stage failure: Task (\d+) in stage [\d.]+ failed")
# What the last attempt died of, less Spark's advice: "Lost task 1.3 in stage 0.0 (TID 5) (host executor 1):
# org.apache.spark.SparkException: Python worker exited unexpectedly (crashed). Consider setting ...".
_CAUSE = re.compile(r"most recent failure: (?:Lost task .*?\): )?(.*?)(?: Consider setting|\n|$)")
Stage = Callable[[Any], list[Staged]]


def died(exc: BaseException) -> int | None:
    """Which task of the job (its place in the job's list) died each time Spark ran it; None: not a task's death."""
    found = _ABORTED.search(str(exc))
    return int(found.group(1)) if found else None


def staged(spread: Spread, stage: Stage, jobs: list[StageJob | FramesJob], description: str) -> list[list[Staged]]:
    """`spread.map(stage, jobs)`; if a task died, the same from one task per unit, less the units it dies on."""
    try:
        return spread.map(stage, jobs, f"{description}: read")
    except Exception as exc:
        if died(exc) is None:
            raise
        return _apart(spread, stage, jobs, description, exc)


def _apart(spread: Spread, stage: Stage, jobs: list[StageJob | FramesJob], description: str,
           exc: BaseException) -> list[list[Staged]]:
    singles = [replace(job, **{_UNITS[type(job)]: (unit,)}) for job in jobs for unit in _units(job)]
    _log.warning("batch.task_died", entity=jobs[0].cfg.name, units=len(singles), error=_cause(exc),
                 action="staging the batch again one unit per task, to find the unit the task dies on")
    done: dict[int, list[Staged]] = {}
    pending = list(range(len(singles)))
    while pending:
        try:
            done.update(zip(pending, spread.map(stage, [singles[i] for i in pending], f"{description}: apart"),
                            strict=True))
            break
        except Exception as again:
            task, failure = died(again), again
            if task is None or task >= len(pending):
                raise
        suspect = pending.pop(task)
        done[suspect] = _alone(spread, stage, singles[suspect], description, failure)
    return [done[i] for i in range(len(singles))]


def _alone(spread: Spread, stage: Stage, job: StageJob | FramesJob, description: str,
           exc: BaseException) -> list[Staged]:
    """The unit staged in a job of its own; quarantined if its task dies there too."""
    try:
        return spread.map(stage, [job], f"{description}: alone")[0]
    except Exception as again:
        if died(again) is None:
            raise
        return [_quarantined(job, _cause(again) or _cause(exc))]


def _quarantined(job: StageJob | FramesJob, cause: str) -> Staged:
    why = (f"the task staging it died each time, alone too ({cause}); nothing of it was applied: a reader crashes "
           "on it, or it needs more memory than a task has")
    if isinstance(job, StageJob):
        rec, partition = job.files[0]
        _log.error("file.unstaged", entity=job.cfg.name, file=rec.path, error=why)
        return Staged(rec.offset, partition.location, True,
                      bad=((partition.location, BadRow(None, f"{why}: mend the file and land it again", "")),))
    entry = job.entries[0]
    location = f"push/{job.stream}/{entry.offset}"
    _log.error("frame.unstaged", entity=job.cfg.name, stream=job.stream, frame=entry.offset, error=why)
    raw = base64.b64encode(spool.frame_bytes(job.cfg.spool(job.stream), entry)).decode("ascii")
    return Staged(entry.offset, location, True, bad=((location, BadRow(None, f"{why}; raw: the spooled frame, "
                                                                                "base64", raw)),))


_UNITS = {StageJob: "files", FramesJob: "entries"}


def _units(job: StageJob | FramesJob) -> tuple:
    return getattr(job, _UNITS[type(job)])


def _cause(exc: BaseException) -> str:
    found = _CAUSE.search(str(exc))
    return found.group(1)[:300] if found else ""

