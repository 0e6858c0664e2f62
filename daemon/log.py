"""structlog set-up: JSON lines when not on a terminal, readable output on one."""

from __future__ import annotations

import logging
import sys

import structlog


def configure(level: str = "INFO", json: bool | None = None) -> None:
    if json is None:
        json = not sys.stderr.isatty()
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    logging.basicConfig(stream=sys.stderr, level=level, format="%(message)s")
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


def get(name: str) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(name)
