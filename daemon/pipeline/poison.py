"""A stage task whose process died: an input a reader crashes on (a C library's fault: a segfault, an abort), or a
worker the kernel killed for memory. Spark retries the task (`spark.task.maxFailures`; once in local mode) and then
fails the job with nothing but "Python worker exited unexpectedly". Such a death looks like the store's fault
(a lost connection), so the batch would be tried again for ever and the stream would stand behind that input.

So a stage job that died is staged again one unit (a landed file, a push frame) per task. A unit whose task dies
there, and then again alone, is quarantined with the reason (a file's rows stay in the file; a frame's bytes go to
quarantine as acknowledged, not decoded: decoding them is what may crash), and the batch goes on. A death that does
not come back for a unit alone (an executor lost, memory short only beside other tasks) costs a slower batch.

A Kafka batch's messages are decoded by the tasks that read them (`tasks.stage_messages` over `FrameParts`), so its
units are looked for in the batch itself: the part whose task died is cut into its topic-partitions' offset ranges,
each decoded alone in a job over the batch filtered to it (`probe`: decoded as staged, nothing written), and a range
whose task dies halved, until one message dies alone. That message is quarantined as its value (base64, not
decoded), and the batch staged again without it, as if it had never been sent; its offset still counts, so the
stream moves past it. A message costs a job per range of its part and one per halving, and three more. A batch
spends `_JOBS` at most so: past that, the ranges a message the task dies on may still be in are quarantined as sent
(values base64, by tasks), so that the stream still moves on. A death no piece brings back alone quarantines nothing:
the batch is staged again whole, and if it dies again, that death is raised.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

from lakefeed import log
from lakefeed.batch import positions
from lakefeed.batch.read import BadRow
from lakefeed.inbox import spool
from lakefeed.pipeline import tasks
from lakefeed.pipeline.tasks import FramesJob, MessagesJob, Parts, Spread, Staged, StagedMessages, StageJob
from lakefeed.pipeline.verdict import data_fault

_log = log.get(__name__)
# Spark's words for a job given up on because a task failed each time; a task's own exception never gets here
# (ops/spark.py returns it as the exception it is), so this is a task whose process was lost.
_ABORTED = re.compile(r"Job aborted due to stage failure: Task (\d+) in stage [\d.]+ failed")
# What the last attempt died of, less Spark's advice: "Lost task 1.3 in stage 0.0 (TID 5) (host executor 1):
# org.apache.spark.SparkException: Python worker exited unexpectedly (crashed). Consider setting ...".
_CAUSE = re.compile(r"most recent failure: (?:Lost task .*?\): )?(.*?)(?: Consider setting|\n|$)")
Stage = Callable[[Any], list[Staged]]
Message = tuple[str, int, int]  # topic, partition, offset
Range = tuple[str, int, int, int]  # topic, partition, first and last offset
_COORDINATES = ("topic", "partition", "offset", "value")
# The jobs a Kafka batch may spend finding the messages its tasks die on: some 25 for each in a part of 500,000
# messages (the default `max_offsets_per_trigger`), so ten such messages a batch at the least.
_JOBS = 256


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


@runtime_checkable
class Pieces(Protocol):
    """A Kafka batch's messages that can be taken apart and decoded in pieces (`FrameParts`, daemon/ops/spark.py)."""

    def map(self, work: Callable[[pa.Table, int], Any], whole: bool, description: str) -> list[Any]: ...

    def ranges(self, part: int | None) -> list[Range]: ...

    def only(self, topic: str, partition: int, first: int, last: int) -> Pieces: ...

    def without(self, ranges: Sequence[Range]) -> Pieces: ...

    def value(self, topic: str, partition: int, offset: int) -> bytes | None: ...


def messages(parts: Parts, job: MessagesJob, whole: bool, description: str) -> list[StagedMessages]:
    """`parts.map(stage_messages)`; if a task died, the same without the messages a task dies on alone, each
    quarantined as a part of its own. Parts in this process (no Spark) have no task to die."""
    stage = partial(tasks.stage_messages, job)
    try:
        return parts.map(stage, whole, f"{description}: decode")
    except Exception as exc:
        if died(exc) is None or not isinstance(parts, Pieces):
            raise
        return _without_dying(parts, job, whole, description, exc)


def _without_dying(parts: Pieces, job: MessagesJob, whole: bool, description: str,
                   exc: BaseException) -> list[StagedMessages]:
    stage, jobs = partial(tasks.stage_messages, job), _Jobs(_JOBS)
    dead: list[Range] = []
    quarantined: list[StagedMessages] = []
    while True:
        task = died(exc)
        _log.warning("batch.task_died", entity=job.cfg.name, stream=job.stream, task=task, error=_cause(exc),
                     action="decoding its messages apart, to find the message the task dies on")
        rest = parts.without(dead)
        found = _dying(rest, job, None if whole else task, description, exc, jobs) or None
        if isinstance(found, list):  # no jobs left to look further: the ranges still suspected go as they are
            dead.extend(found)
            quarantined.extend(_as_sent(rest, job, found, description, _cause(exc)))
        elif found is not None:
            message, cause = found
            dead.append((*message, message[2]))
            quarantined.append(_message_quarantined(rest, job, message, cause))
        try:
            return [*parts.without(dead).map(stage, whole, f"{description}: decode again"), *quarantined]
        except Exception as again:
            if died(again) is None or found is None:  # a death no message brings back alone is not a message's
                raise
            exc = again


def _dying(parts: Pieces, job: MessagesJob, part: int | None, description: str, exc: BaseException,
           jobs: _Jobs) -> tuple[Message, str] | list[Range] | None:
    """The message of partition `part` (None: of all) whose task dies alone, and what it died of; None if none does.
    The part's topic-partition ranges are decoded one at a time, the first that dies is halved, and so on. Of pieces
    one of which died, the last is not tried once the others passed: it is halved at once. The message found is:
    it must die alone. Once the batch's jobs are spent: the ranges a message the task dies on may still be in."""
    pieces = parts.ranges(part)
    if not jobs.spend(exc):
        return pieces
    while pieces:
        piece = pieces.pop(0)
        topic, partition, first, last = piece
        if pieces or first == last:
            if not jobs.spend(exc):
                return [piece, *pieces]
            if (death := _death(parts.only(*piece), job, description)) is None:
                continue
            exc = death
        if first == last:
            return (topic, partition, first), _cause(exc)
        middle = (first + last) // 2
        pieces = [(topic, partition, first, middle), (topic, partition, middle + 1, last)]
    return None


def _death(piece: Pieces, job: MessagesJob, description: str) -> BaseException | None:
    """What the task decoding `piece` alone died of; None: it did not die."""
    try:
        piece.map(partial(probe, job), True, f"{description}: apart")
    except Exception as exc:
        if died(exc) is None:
            raise
        return exc
    return None


def probe(job: MessagesJob, batch: pa.Table, part: int) -> int:
    """A piece of a Kafka batch decoded as its stage task decodes it, nothing staged: whether a task dies on it. A
    fault raised is no death (staging quarantines the messages at fault): the piece passes."""
    try:
        tasks.messages_rows(job, batch)
    except Exception as exc:
        if not data_fault(exc):
            raise
    return batch.num_rows


def as_sent(job: MessagesJob, why: str, batch: pa.Table, part: int) -> StagedMessages:
    """A piece of a Kafka batch quarantined as it was sent, its values base64, not decoded: in the task, which writes
    them as a file of the quarantine (`tasks.bad_written`). Their offsets count among the batch's."""
    where, _ = tasks.worker()
    reason = f"{why}; raw: the message's value, base64"
    bad = tuple((f"kafka/{topic}/{partition}", BadRow(offset, reason, base64.b64encode(value).decode()))
                for topic, partition, offset, value in zip(*(batch.column(c).to_pylist() for c in _COORDINATES),
                                                           strict=True) if value is not None)
    staged = tasks.bad_written(job, [Staged(part, f"kafka/{job.stream}", True, bad=bad, worker=where)])[0]
    return StagedMessages(staged, batch.num_rows, batch.column("value").null_count, positions.message_ends(batch))


def _as_sent(parts: Pieces, job: MessagesJob, ranges: list[Range], description: str,
             cause: str) -> list[StagedMessages]:
    why = (f"a task decoding the messages of {len(ranges)} offset range(s) died each time ({cause}); the search for "
           f"the message at fault gave up after {_JOBS} jobs; nothing of these was applied")
    out = []
    for topic, partition, first, last in ranges:
        _log.error("messages.unstaged", entity=job.cfg.name, stream=job.stream, topic=topic, partition=partition,
                   first=first, last=last, error=why)
        out += parts.only(topic, partition, first, last).map(partial(as_sent, job, why), True,
                                                            f"{description}: quarantined as sent")
    return out


def _message_quarantined(parts: Pieces, job: MessagesJob, message: Message, cause: str) -> StagedMessages:
    topic, partition, offset = message
    why = (f"the task decoding it died each time, alone too ({cause}); nothing of it was applied: a decoder crashes "
           "on it, or it needs more memory than a task has")
    _log.error("message.unstaged", entity=job.cfg.name, stream=job.stream, topic=topic, partition=partition,
               offset=offset, error=why)
    value = parts.value(topic, partition, offset)
    location = f"kafka/{topic}/{partition}"
    bad = () if value is None else \
        ((location, BadRow(offset, f"{why}; raw: the message's value, base64", base64.b64encode(value).decode())),)
    # Its offset counts among the batch's: the stream moves past it.
    return StagedMessages(Staged(offset, location, True, bad=bad), 1, int(value is None),
                          {topic: {str(partition): offset + 1}})


class _Jobs:
    """The jobs a batch may still spend on finding the messages its tasks die on."""

    def __init__(self, left: int) -> None:
        self.left = left

    def spend(self, exc: BaseException) -> bool:
        """One job more; False: none left (said once)."""
        if self.left == 0:
            _log.error("batch.apart_given_up", error=_cause(exc), jobs=_JOBS,
                       action="the messages still suspected are quarantined as sent, undecoded, and the batch goes on")
            self.left = -1
        if self.left < 0:
            return False
        self.left -= 1
        return True
