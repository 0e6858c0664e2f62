"""glibc's arenas limited for the daemon (daemon/ops/malloc.py): counted by glibc itself (`malloc_info`) in a fresh
interpreter whose threads allocate at once; deltalake's jemalloc's, from the options it prints; the processes the
daemon starts are checked in tests/test_push_daemon.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lakefeed.ops import malloc

_ARENAS = """
import ctypes, os, tempfile, threading
from lakefeed.ops import malloc

if {limit}:
    malloc.limit_arenas()
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
together = threading.Barrier(8)

def allocate():
    together.wait()
    kept = [bytearray(1000) for _ in range(100)]  # each thread's first allocations, all threads alive
    together.wait()

threads = [threading.Thread(target=allocate) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
with tempfile.NamedTemporaryFile("r") as out:
    stream = libc.fopen(out.name.encode(), b"w")
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    print(out.read().count("<heap nr="), os.environ.get("MALLOC_ARENA_MAX"))
"""


def _arenas(limit: bool, **env: str) -> tuple[int, str]:
    environment = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | env
    out = subprocess.run([sys.executable, "-c", _ARENAS.format(limit=limit)], env=environment, check=True,
                         capture_output=True, text=True, timeout=60).stdout.split()
    return int(out[0]), out[1]


def test_the_daemon_process_uses_two_arenas_and_passes_the_limit_on():
    # glibc's own: a thread that allocates gets an arena of its own, up to 8 per core.
    assert _arenas(limit=False) == (min(9, 8 * os.cpu_count()), "None")
    assert _arenas(limit=True) == (2, "2")


@pytest.mark.parametrize("theirs", ["1", "4"])
def test_an_operators_limit_is_kept(theirs):
    assert _arenas(limit=True, MALLOC_ARENA_MAX=theirs) == (int(theirs), theirs)


_DELTALAKE = """
import os, sys
import lakefeed.ops.cli  # what `lakefeed run` has imported when it limits the arenas: the CLI, the config
from lakefeed.config import model
from lakefeed.ops import malloc

model.load(sys.argv[2])

assert "deltalake" not in sys.modules, "deltalake was loaded before its allocator's arenas could be limited"
malloc.limit_arenas()
print(os.environ["_RJEM_MALLOC_CONF"], flush=True)
os.environ["_RJEM_MALLOC_CONF"] += ",stats_print:true"  # jemalloc prints its options at exit: the proof it read them
import pyarrow as pa
from deltalake import write_deltalake

write_deltalake(sys.argv[1], pa.table({"a": [1, 2]}))
"""


def test_deltalakes_allocator_gets_one_arena_from_the_environment_set_before_it_loads(tmp_path):
    environment = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    config = Path(__file__).resolve().parent.parent / "config" / "lakefeed.yaml"
    run = subprocess.run([sys.executable, "-c", _DELTALAKE, str(tmp_path / "t"), str(config)], env=environment,
                         check=True, capture_output=True, text=True, timeout=120)
    printed = run.stdout + run.stderr
    assert run.stdout.splitlines()[0] == "narenas:1"
    assert "opt.narenas: 1\n" in printed, printed[-3000:]


def test_an_operators_deltalake_allocator_settings_are_kept(monkeypatch):
    monkeypatch.setenv("_RJEM_MALLOC_CONF", "narenas:4")
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")  # so that this process's glibc is left alone
    malloc.limit_arenas()
    assert os.environ["_RJEM_MALLOC_CONF"] == "narenas:4"
