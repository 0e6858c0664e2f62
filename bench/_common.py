"""What the benchmarks share: an overall deadline, progress lines on stderr, and `--smoke`."""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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


def ratio(a: float | None, b: float | None, digits: int = 3) -> float | None:
    """a / b rounded, or None when either is missing (or b is 0)."""
    return round(a / b, digits) if a is not None and b else None


def say(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- --smoke

SMOKE_HELP = ("smoke run: tiny sizes and short phases (the bench's SMOKE settings), the same code paths, baselines "
              "and JSON report as the full run, in seconds (tests/test_benches.py); options given explicitly win")


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None, smoke: dict[str, Any]) -> argparse.Namespace:
    """Parse with a `--smoke` flag added: with it, `smoke` (argument dest -> value) replaces the defaults."""
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    known = {a.dest for a in parser._actions}
    unknown = set(smoke) - known
    if unknown:
        raise ValueError(f"smoke settings for unknown arguments: {sorted(unknown)}")
    args = parser.parse_args(argv)
    if args.smoke:
        parser.set_defaults(**smoke)
        args = parser.parse_args(argv)
    return args


# --------------------------------------------------------------------------- processes and the daemon's log

CLK_TCK = os.sysconf("SC_CLK_TCK")


def log_events(log_path: Path, start: int = 0) -> tuple[list[dict], int]:
    """JSON events of the daemon log from byte `start` on (complete lines only); next start."""
    with open(log_path, "rb") as f:
        f.seek(start)
        chunk = f.read()
    end = chunk.rfind(b"\n") + 1
    events = []
    for line in chunk[:end].splitlines():
        line = line.strip()
        if not line.startswith(b"{"):
            continue  # Spark / JVM output
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and "event" in obj:
            events.append(obj)
    return events, start + end


def log_tail(log_path: Path, n: int = 40) -> str:
    try:
        return "\n".join(log_path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def stop_process(proc: subprocess.Popen, timeout: float) -> int | None:
    """SIGTERM and wait; the exit code, or None if it did not stop in time."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
    return proc.returncode


def stop_daemon(proc: subprocess.Popen, timeout: float) -> int | None:
    """stop_process for a lakefeed daemon: one that does not stop in time prints its threads' stacks in its log
    (SIGUSR2), which says what it waits on."""
    code = stop_process(proc, timeout)
    if code is None:
        proc.send_signal(signal.SIGUSR2)
        time.sleep(1)
    return code


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL a started process's group (the daemon, its JVM and Python workers) if alive."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # start_new_session=True: pgid == pid
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def cpu_of(pid: int) -> tuple[int, float]:
    """(session id, CPU seconds incl. reaped children) of a process. A lakefeed intake process that leads a
    session of its own (the daemon gives it one when the daemon leads its own: daemon/ops/supervisor.py) counts
    in its daemon's session."""
    stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    fields = stat[stat.rfind(")") + 2:].split()  # fields[0] is field 3 (state)
    sid, cpu = int(fields[3]), sum(int(x) for x in fields[11:15]) / CLK_TCK
    if sid == pid and is_intake(pid):
        sid = int(fields[1])  # its parent, the daemon, leads the daemon's session
    return sid, cpu


@dataclass(frozen=True)
class Process:
    pid: int
    ppid: int
    cpu: float  # seconds of user and system time, its own (not its reaped children's)
    cmdline: bytes
    pss_mib: float = 0.0  # read only when asked for (smaps_rollup is slow to read)
    reaped_cpu: float = 0.0  # seconds of user and system time of the children it waited for, once they ended


def session_processes(session: int, pss: bool = False) -> dict[int, Process]:
    """Every process of a daemon's session now, by pid: its own session's and the children that lead one of their
    own (a lakefeed intake: daemon/ops/supervisor.py)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text(encoding="ascii", errors="replace")
            fields = stat[stat.rfind(")") + 2:].split()  # fields[0] is field 3 (state)
            if session not in (int(fields[3]), int(fields[1])):
                continue
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            # A child that has its parent's memory (and shows it as its own) is counted in the parent only. Asked
            # before the read: such a child only ever stops sharing (it execs), so one that shares nothing now
            # shows only its own memory next; asked after, a child that exec'd between the two showed the parent's.
            own = pss and not shares_memory(int(entry), int(fields[1]))
            rollup = Path(f"/proc/{entry}/smaps_rollup").read_text(encoding="ascii") if own else ""
        except OSError:
            continue  # gone meanwhile
        kib = next((int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:")), 0)
        cpu, reaped = (int(fields[11]) + int(fields[12])) / CLK_TCK, (int(fields[13]) + int(fields[14])) / CLK_TCK
        out[int(entry)] = Process(int(entry), int(fields[1]), cpu, cmdline, kib / 1024, reaped)
    return out


_KCMP = {"x86_64": 312, "aarch64": 272}.get(os.uname().machine)  # kcmp(2)'s syscall number here, if known
_KCMP_VM = 1
_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded once: the samplers ask for every process of every sample


def shares_memory(pid: int, other: int) -> bool:
    """Whether two processes have one address space (kcmp(2) KCMP_VM): a child a JVM or Python starts with
    vfork (posix_spawn) shares its parent's until it execs, and its /proc files then show the parent's memory and
    command line. Counting both counted the JVM twice in a sample (bench/memory.py: a JVM of 1,121 MiB PSS in one
    10-s sample of an hour whose 2-s samples of that JVM never passed 603)."""
    return _KCMP is not None and _LIBC.syscall(_KCMP, pid, other, _KCMP_VM, 0, 0) == 0


def descends_from(pid: int, procs: dict[int, Process], ancestor: Callable[[Process], bool]) -> bool:
    """Whether one of the process's ancestors among `procs` is one that `ancestor` picks."""
    parent = procs[pid].ppid if pid in procs else 0
    while parent in procs:
        if ancestor(procs[parent]):
            return True
        parent = procs[parent].ppid
    return False


# In the command line of a lakefeed intake process (`python -m lakefeed.intake`: daemon/intake/__main__.py).
INTAKE_CMDLINE = b"-m\0lakefeed.intake\0"


def is_intake(pid: int) -> bool:
    """Whether the process is a lakefeed intake."""
    try:
        return INTAKE_CMDLINE in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def machine_busy() -> float:
    """CPU seconds the whole machine spent busy (all cores), from /proc/stat."""
    with open("/proc/stat", encoding="ascii") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / CLK_TCK  # all but idle and iowait; guest is in user


# --------------------------------------------------------------------------- work folder and the report


def workdir(parser: argparse.ArgumentParser, given: Path | None, keep: bool, prefix: str) -> tuple[Path, bool]:
    """The benchmark's work folder and whether to remove it at the end (a given folder must be empty)."""
    if given is None:
        return Path(tempfile.mkdtemp(prefix=prefix)), not keep
    work = given.resolve()
    if work.exists() and any(work.iterdir()):
        parser.error(f"--workdir {work} is not empty")
    work.mkdir(parents=True, exist_ok=True)
    return work, False


def publish(report: dict, work: Path, remove: bool) -> None:
    """Print the one JSON result on stdout, then remove the work folder (or say where it was kept)."""
    print(json.dumps(report), flush=True)
    if remove:
        shutil.rmtree(work, ignore_errors=True)
    else:
        say(f"kept {work}")
