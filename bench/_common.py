"""What the benchmarks share: an overall deadline and progress lines on stderr."""

from __future__ import annotations

import sys
import time


class BenchError(Exception):
    pass


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def check(self, what: str) -> None:
        if self.left() <= 0:
            raise BenchError(f"overall deadline of {self.seconds:.0f}s passed while {what}")


def say(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
