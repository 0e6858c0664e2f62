"""Whose fault an error is: the store's (it may go away: retried), lakefeed's own (a bug: raised, never hidden),
or the data's (it will not go away: the rows at fault are parked in quarantine with the reason, and the stream
goes on). Decided where the error is raised, in the driver or in a task (daemon/pipeline/tasks.py).
"""

from __future__ import annotations

import re

import pyarrow as pa
from botocore.exceptions import BotoCoreError, ClientError
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from pyspark.errors import PySparkException

from lakefeed.errors import LakefeedError, TransientError

# What Rust (delta-rs, object_store) and boto say when the store, not the data, is at fault.
_STORE = re.compile(r"os error \d+|no space left|disk quota|i/o error|timed? ?out|connection|broken pipe|"
                    r"generic s3 error|dispatch failure|service unavailable|throttl|slowdown|too many open files",
                    re.IGNORECASE)
# A table the commit found missing (delta-spark's error classes): the lake's state is at fault, not the batch's
# rows. It is retried, as a store fault is, never parked: parking would put acknowledged rows in quarantine
# for what a retry or the operator mends.
_MISSING = re.compile(r"\[(DELTA_TABLE_NOT_FOUND|DELTA_MISSING_DELTA_TABLE|PATH_NOT_FOUND)\b")


def store_fault(exc: BaseException) -> bool:
    if isinstance(exc, LakefeedError) and not isinstance(exc, TransientError):
        return False  # lakefeed decided already: a terminal error stops the entity with what to do
    if isinstance(exc, OSError | TimeoutError | TransientError | CommitFailedError | TableNotFoundError):
        return True
    if isinstance(exc, BotoCoreError | ClientError):  # what boto3 raises is the store's (an object the store
        return True  # refuses whoever asks is a NotAFile by then, quarantined: daemon/inbox/storage.py)
    return bool(_STORE.search(str(exc)) or _MISSING.search(str(exc)))


# Errors of lakefeed's own code, not of the data: parking would hide them behind a quarantine. A TypeError is
# one too (a call with the wrong arguments), but not Arrow's or Spark's: ArrowTypeError is a cast the data
# cannot take, PySparkTypeError a type Spark cannot convert ("uint64 is not supported in conversion to Arrow").
_BUGS = (AttributeError, NameError, AssertionError, ImportError, RecursionError, TypeError)


def _bug(exc: BaseException) -> bool:
    return isinstance(exc, _BUGS) and not isinstance(exc, pa.ArrowException | PySparkException)


def data_fault(exc: BaseException) -> bool:
    """Not the store's fault, not a bug: delta-rs raises its schema refusals as bare Exceptions ("Schema error:
    Duplicate field name"), Arrow its casts as ArrowInvalid, and so on."""
    if store_fault(exc) or isinstance(exc, LakefeedError) or _bug(exc):  # lakefeed's own errors say what to do
        return False
    return isinstance(exc, Exception)
