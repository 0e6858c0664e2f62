"""Malloc arenas: glibc's, two for the daemon and for every process it starts, not eight per core; and one for
deltalake's own allocator.

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

deltalake's Rust code allocates with a jemalloc of its own, linked into the wheel, which makes four arenas per core
and spreads its threads (a tokio runtime's, 12-42 in a driver of 20 entities) over them. Over the last 50 minutes of
an hour at 20 entities (2026-11-29), the driver's resident set grew 20 MB, 15 of it outside glibc's heaps, in the
mappings where deltalake's code took the page faults. With one arena, the driver's deltalake work alone (20 tables,
a commit to each and two fresh loads of each per round, 150 rounds, two runs each) held 15 MiB less and stopped
growing after the first 30 rounds (+4.4 and +6.8 MiB from there with the default), in 4.6-6.5% more time
(docs/architecture.md). That jemalloc reads `_RJEM_MALLOC_CONF` when it starts, at the process's first deltalake
call: set here, before deltalake is imported, it holds for this process and reaches those the daemon starts; an
operator's value is kept.
"""

from __future__ import annotations

import ctypes
import os

ARENAS = 2
_M_ARENA_MAX = -8  # malloc.h
DELTALAKE_CONF = "_RJEM_MALLOC_CONF"  # deltalake's jemalloc: tikv-jemallocator's prefix, `_rjem_`
DELTALAKE_ARENAS = "narenas:1"


def limit_arenas() -> None:
    """Call before the daemon starts a thread or a process, and before it imports deltalake."""
    os.environ.setdefault(DELTALAKE_CONF, DELTALAKE_ARENAS)
    if "MALLOC_ARENA_MAX" in os.environ:
        return
    os.environ["MALLOC_ARENA_MAX"] = str(ARENAS)
    ctypes.CDLL(None).mallopt(_M_ARENA_MAX, ARENAS)  # glibc, the only libc lakefeed runs on (Linux, systemd)
