"""structlog set-up: JSON lines when not on a terminal, readable output on one."""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import traceback
from types import FrameType

import structlog


def configure(level: str = "INFO", json: bool | None = None) -> None:
    if json is None:
        json = not sys.stderr.isatty()
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    logging.basicConfig(stream=sys.stderr, level=level, format="%(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(_redact)
    # py4j, Spark's Python side and kafka-python are chatty at INFO; their warnings still come through.
    for noisy in ("py4j", "pyspark", "kafka"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        # sys.stderr is looked up per logger, not captured once: it may be replaced (tests, daemons).
        # WriteLogger writes each line in one write(), so a JVM sharing stderr cannot split it.
        logger_factory=lambda *_: structlog.WriteLogger(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def configure_once() -> None:
    """In a process lakefeed did not start (a Spark task's Python worker): JSON lines on stderr, as the daemon's."""
    if not structlog.is_configured():
        configure(os.environ.get("LAKEFEED_LOG_LEVEL", "INFO"), json=True)


# Credentials as they can appear in a library's log line: an HTTP parser quoting the header it failed on
# (whatever bytes it holds), a URL with a password, a repr of a request's headers.
_HEADERS = re.compile(r"(?i)((?:proxy-)?authorization|cookie|x-api-key|x-amz-security-token)([\"']?\s*[:=]\s*[\"']?)"
                      r"[^\n\"']*")  # the whole value, whatever it holds
_SECRETS = re.compile(r"(?i)(bearer|basic|token|password|secret)([\"']?\s*[:= ]\s*[\"']?)[^\s\"',}]+")
_URL_PASSWORD = re.compile(r"(://[^/\s:@]+:)[^@\s/]+@")


def redact(text: str) -> str:
    text = _SECRETS.sub(r"\1\2<redacted>", _HEADERS.sub(r"\1\2<redacted>", text))
    return _URL_PASSWORD.sub(r"\1<redacted>@", text)


def _redact(record: logging.LogRecord) -> bool:
    """Every stdlib log record (aiohttp, Spark's py4j, kafka-python, …) leaves with its secrets redacted,
    its traceback included."""
    if record.exc_info:
        record.exc_text = logging.Formatter().formatException(record.exc_info)
        record.exc_info = None
    if record.exc_text:
        record.exc_text = redact(record.exc_text)
    record.msg, record.args = redact(record.getMessage()), None
    return True


def print_stacks(_signum: int, _frame: FrameType | None) -> None:
    """The SIGUSR2 handler: every thread's Python stack in one `daemon.stacks` line, to see what a daemon that
    does not stop waits on. (faulthandler's dump is not used: it crashed the daemon while py4j threads ran.)"""
    names = {t.ident: t.name for t in threading.enumerate()}
    stacks = {f"{names.get(ident, 'unknown')} ({ident})": "".join(traceback.format_stack(frame))
              for ident, frame in sys._current_frames().items()}
    get(__name__).warning("daemon.stacks", threads=stacks)


def get(name: str) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(name)
