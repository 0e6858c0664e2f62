"""glibc's malloc arenas: two for the daemon and for every process it starts, not eight per core.

glibc gives a thread that allocates while the arenas in use are busy an arena of its own, up to eight per core, and
each arena keeps what is freed in it for the allocations that come to it later. The daemon's driver has a thread per
query and batch, deltalake's and pyarrow's pools; its JVM has hundreds: with an arena each, memory freed in one is
not reused by the others, and the resident set grows with the number of threads that once allocated.
Measured (`bench/memory.py --entities 20 --seconds 1200`, 2 cores, one run each): the driver 226-239 MiB PSS over the
run's first 15 minutes with two arenas, against 255-268 with glibc's default (docs/architecture.md).

glibc reads `MALLOC_ARENA_MAX` from the environment when a process starts: set here, it reaches the processes the
daemon starts (its JVM, intake, fork server and Spark's Python workers), and `mallopt` sets it for this process,
whose threads have not started yet. A value already in the environment is the operator's: it is kept, and glibc read
it for this process at its start.
"""

from __future__ import annotations

import ctypes
import os

ARENAS = 2
_M_ARENA_MAX = -8  # malloc.h


def limit_arenas() -> None:
    """Call before the daemon starts a thread or a process."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return
    os.environ["MALLOC_ARENA_MAX"] = str(ARENAS)
    ctypes.CDLL(None).mallopt(_M_ARENA_MAX, ARENAS)  # glibc, the only libc lakefeed runs on (Linux, systemd)
