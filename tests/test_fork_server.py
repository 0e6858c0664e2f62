"""The fork server and its launcher (daemon/ops/fork_server.py, daemon/ops/fork_launcher.py), with real processes.

The routed process here is Spark's own daemon of a data source planner (`-m pyspark.daemon
pyspark.sql.worker.lookup_data_sources`): without a JVM it binds its socket, writes where to the stdout it was
given, and waits on its stdin, so what the launcher hands over (streams, environment, exit status, signals) shows.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from deltalake import DeltaTable

from lakefeed.config import model as config
from lakefeed.ops import fork_launcher, fork_server
from lakefeed.ops.metrics import Metrics
from lakefeed.ops.runner import EntityRunner
from tests.conftest import alive, children, land, wait_for, write_config

PLANNER = ["-m", "pyspark.daemon", "pyspark.sql.worker.lookup_data_sources"]


@pytest.fixture(params=["compiled", "launcher"])
def forks(request):
    """A fork server and its `driver` wrapper; what stands in for a child: the stand-in `make setup` compiled
    (daemon/ops/stand_in.c), or the launcher itself, as where there was no C compiler."""
    runtime = Path(tempfile.mkdtemp(prefix="lf-fork-"))  # a Unix socket's path has at most 107 bytes
    stand_in = fork_server.built_stand_in() if request.param == "compiled" else None
    assert (stand_in is None) == (request.param == "launcher"), "make setup builds the stand-in (Makefile)"
    wrappers, server = fork_server.launch(runtime, stand_in)
    yield wrappers["driver"], server
    if server.stdin and not server.stdin.closed:
        server.stdin.close()
    server.wait(timeout=30)
    shutil.rmtree(runtime, ignore_errors=True)


def _catches(pid: int, signum: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
    return bool(caught >> (signum - 1) & 1)


def _sockets(wrapper: Path) -> Path:
    """Where the planner's daemon makes its socket: in the fork server's short runtime folder (a test's tmp_path
    may be too long for a Unix socket's path)."""
    folder = wrapper.parent / "sockets"
    folder.mkdir(exist_ok=True)
    return folder


def _planner(wrapper: Path) -> tuple[subprocess.Popen, str]:
    """The planner's daemon started through `wrapper`, and the socket path it wrote to its stdout."""
    env = {**os.environ, "PYTHON_UNIX_DOMAIN_ENABLED": "true", "PYTHON_WORKER_FACTORY_SOCK_DIR": str(_sockets(wrapper))}
    proc = subprocess.Popen([str(wrapper), *PLANNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    size = struct.unpack("!i", proc.stdout.read(4))[0]
    return proc, proc.stdout.read(size).decode()


def _stands_in_compiled(wrapper: Path) -> bool:
    return fork_server.STAND_IN.encode() in wrapper.read_bytes()


def test_a_planner_is_forked_with_the_launchers_streams_environment_and_exit_status(forks):
    wrapper, server = forks
    launcher, path = _planner(wrapper)
    assert Path(path).parent == _sockets(wrapper)  # the environment reached it; its stdout was the launcher's
    forked = wait_for(lambda: children(server.pid), 30, what="the server's child")
    assert len(forked) == 1 and forked[0] != launcher.pid
    assert b"lakefeed.ops.fork_server" in Path(f"/proc/{forked[0]}/cmdline").read_bytes()
    proc = Path(f"/proc/{launcher.pid}")
    if _stands_in_compiled(wrapper):  # the launcher became the stand-in: the connection, the child, what it runs
        wait_for(lambda: os.readlink(proc / "exe").endswith(fork_server.STAND_IN), 30, what="the stand-in")
        assert _cmdline(proc).rstrip(b"\0").split(b"\0")[2:] == [str(forked[0]).encode(), *map(str.encode, PLANNER)]
    else:
        assert b"fork_launcher.py" in _cmdline(proc)
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(path)  # the child listens where it said
    launcher.stdin.close()  # Spark's way of telling the planner's daemon to end
    native = subprocess.run([sys.executable, *PLANNER], input=b"", capture_output=True, timeout=60, check=False,
                            env={**os.environ, "PYTHON_UNIX_DOMAIN_ENABLED": "true",
                                 "PYTHON_WORKER_FACTORY_SOCK_DIR": str(_sockets(wrapper))})
    assert launcher.wait(timeout=30) == native.returncode  # the status the interpreter itself ends with
    wait_for(lambda: not alive(forked[0]), 30, what="the child reaped")


def test_a_child_killed_by_a_signal_ends_its_launcher_by_that_signal(forks):
    wrapper, server = forks
    launcher, _ = _planner(wrapper)
    child = wait_for(lambda: children(server.pid), 30, what="the server's child")[0]
    os.kill(child, signal.SIGKILL)
    assert launcher.wait(timeout=30) == -signal.SIGKILL


def test_a_signal_to_the_launcher_reaches_the_child_and_its_status_comes_back(forks):
    wrapper, server = forks
    launcher, _ = _planner(wrapper)
    child = wait_for(lambda: children(server.pid), 30, what="the server's child")[0]
    wait_for(lambda: _catches(child, signal.SIGTERM), 30, what="the daemon's SIGTERM handler")  # set after its port
    launcher.send_signal(signal.SIGTERM)  # Spark's destroy(): forwarded, the daemon's handler exits 1
    assert launcher.wait(timeout=30) == 1  # not -SIGTERM: the launcher itself lived on until the child ended
    wait_for(lambda: not alive(child), 30, what="the child gone")


def test_a_launcher_killed_outright_takes_its_child_along(forks):
    wrapper, server = forks
    launcher, _ = _planner(wrapper)
    child = wait_for(lambda: children(server.pid), 30, what="the server's child")[0]
    launcher.kill()
    launcher.wait(timeout=30)
    wait_for(lambda: not alive(child), 30, what="the orphaned child killed")
    again, path = _planner(wrapper)  # and the server serves on
    assert Path(path).parent == _sockets(wrapper)
    again.stdin.close()
    assert again.wait(timeout=30) == 1


def test_the_server_ends_with_the_daemon_and_takes_its_children(forks):
    wrapper, server = forks
    launcher, _ = _planner(wrapper)
    child = wait_for(lambda: children(server.pid), 30, what="the server's child")[0]
    server.stdin.close()  # what the daemon's exit, however it comes, does to the pipe
    assert server.wait(timeout=30) == 0
    wait_for(lambda: not alive(child), 30, what="the child killed")
    assert launcher.wait(timeout=30) != 0  # nothing left to stand in for


def _stand_in(status: bytes | None, before_exec: str = "pass") -> tuple[int | None, int]:
    """Run the compiled stand-in for a `sleep` child, as a launcher would (exec'd from a Python process that ran
    `before_exec` first), the server's end of the connection then writing `status` (None: closing without one).
    The child's return code once the stand-in has ended (None: still running, then killed) and the stand-in's."""
    stand_in = str(fork_server.built_stand_in())
    child = subprocess.Popen(["sleep", "60"])
    ours, theirs = socket.socketpair()
    with ours, theirs:
        exec_it = f"import os, signal; {before_exec}; os.execv({stand_in!r}, [{stand_in!r}, " \
                  f"'{theirs.fileno()}', '{child.pid}', '-m', 'pyspark.daemon'])"
        proc = subprocess.Popen([sys.executable, "-c", exec_it], pass_fds=(theirs.fileno(),))
        theirs.close()
        if before_exec != "pass":
            child.wait(timeout=30)  # what it did reached the child before any status came
        if status is not None:
            ours.sendall(status)
    code = proc.wait(timeout=30)
    try:
        return child.wait(timeout=30 if status is None else 0.1), code
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait(timeout=30)
        return None, code


def test_the_compiled_stand_in_forwards_reports_and_cleans_up():
    # A signal that came while the launcher exec'd it (blocked, pending) reaches the child once it can.
    term = "signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM]); os.kill(os.getpid(), signal.SIGTERM)"
    assert _stand_in(struct.pack("!i", -signal.SIGTERM), term) == (-signal.SIGTERM, -signal.SIGTERM)
    assert _stand_in(struct.pack("!i", 7)) == (None, 7)  # the child's exit code, as its own
    assert _stand_in(None) == (-signal.SIGKILL, 1)  # the server gone without a word: the child is killed
    bad = subprocess.run([str(fork_server.built_stand_in()), "3", "not-a-pid"], capture_output=True, timeout=30,
                         check=False)
    assert (bad.returncode, b"usage" in bad.stderr) == (2, True)


def test_with_the_server_gone_the_launcher_runs_the_module_itself(forks):
    wrapper, server = forks
    server.stdin.close()
    server.wait(timeout=30)
    launcher, path = _planner(wrapper)
    assert Path(path).parent == _sockets(wrapper)
    assert b"pyspark.daemon" in Path(f"/proc/{launcher.pid}/cmdline").read_bytes()  # exec'd in place
    launcher.stdin.close()
    assert launcher.wait(timeout=30) == 1


def test_anything_not_routed_is_the_interpreter_itself(forks):
    wrapper, _ = forks
    done = subprocess.run([str(wrapper), "-c", "import sys; print(sys.executable); sys.exit(3)"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stdout.strip()) == (3, sys.executable)
    for tasks in (False, True):
        assert fork_launcher.routed(["-m", "pyspark.sql.streaming.python_streaming_source_runner"], tasks)
        assert fork_launcher.routed(PLANNER, tasks)
        assert fork_launcher.routed(["-m", "pyspark.sql.worker.plan_data_source_read"], tasks)
        assert not fork_launcher.routed(["-c", "pyspark.sql.worker.x"], tasks)
        assert not fork_launcher.routed(["-m", "pyspark.daemon", "my.worker"], tasks)
        # the tasks' daemon: only where the executor is the driver's own JVM (local[N])
        assert fork_launcher.routed(["-m", "pyspark.daemon"], tasks) is tasks
        assert fork_launcher.routed(["-m", "pyspark.daemon", "pyspark.worker"], tasks) is tasks


def test_hostile_requests_are_refused_and_the_server_serves_on(forks):
    wrapper, server = forks
    sock_path = str(wrapper.parent / "fork.sock")
    r, w = os.pipe()
    try:
        def with_fds(header: bytes, payload: bytes = b"") -> Callable[[socket.socket], None]:
            def send(client: socket.socket) -> None:
                client.sendmsg([header], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("3i", r, w, r))])
                client.sendall(payload)
            return send

        attempts = [
            lambda client: client.sendall(struct.pack("!I", 16)),  # a length, no descriptors
            with_fds(struct.pack("!I", 4), b"junk"),  # no count of arguments
            with_fds(struct.pack("!I", 8), b"/\x002\x00-c\x00x"),  # not a module to run
            with_fds(struct.pack("!I", 1 << 16)),  # a length, then it hangs up
        ]
        for attempt in attempts:
            with socket.socket(socket.AF_UNIX) as client:
                client.connect(sock_path)
                attempt(client)
                client.shutdown(socket.SHUT_WR)
                assert client.recv(4) == b""  # refused: no child
        assert children(server.pid) == []
    finally:
        os.close(r)
        os.close(w)
    launcher, path = _planner(wrapper)
    assert Path(path).parent == _sockets(wrapper)
    launcher.stdin.close()
    assert launcher.wait(timeout=30) == 1


def test_a_local_sessions_streaming_runners_are_forked_and_its_rows_arrive(spark, tmp_path):
    """In the suite's own session (daemon/ops/spark.py set PYSPARK_PYTHON to the wrapper): an entity's file source
    runs, its runner is a fork of this process's fork server, and the rows land as they did before. On local[N],
    the tasks' daemon is forked too; on local-cluster it is the executors' own."""
    master = spark.sparkContext.master
    assert os.environ["PYSPARK_PYTHON"] == str(fork_server.start(master))
    stand_in = fork_server.built_stand_in()
    assert stand_in is not None, "make setup builds the stand-in (Makefile)"
    servers = [pid for pid in children(os.getpid())
               if b"lakefeed.ops.fork_server" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(servers) == 1
    before = set(children(servers[0]))
    cfg = config.load(write_config(tmp_path))
    runner = EntityRunner(spark, cfg.entities[0], cfg.spark.trigger_interval_s, (cfg.lake_dir, cfg.state_dir),
                          Metrics())
    try:
        runner.start()
        land(cfg.entities[0].source.path / "sales/2024/01/a.csv", "id,amount\n1,1.5\n2,2.5\n")
        wait_for(lambda: _rows(cfg.entities[0].table) == 2, what="2 rows in the table")
        # This test's runners only: the suite's other worker may be running a daemon of its own.
        stand_ins = [pid for pid in map(Path, (f"/proc/{n}" for n in _descendants(os.getpid())))
                     if b"python_streaming_source_runner" in _cmdline(pid) and _exe(pid) == stand_in]
        assert stand_ins, "no runner was started through the launcher, or the compiled stand-in does not stand in"
        # What Spark put on the runner's path is on the server's already: its children import nothing anew.
        spark_path = _environ(stand_ins[0])["PYTHONPATH"].split(os.pathsep)
        assert set(spark_path) <= set(_environ(Path(f"/proc/{servers[0]}"))["PYTHONPATH"].split(os.pathsep))
        assert set(children(servers[0])) - before, "the fork server forked no runner"
        routed, unrouted = _task_daemons(os.getpid())
        if master.startswith("local-cluster"):
            assert (routed, unrouted > 0) == (0, True)
        else:
            assert (routed > 0, unrouted) == (True, 0)
    finally:
        runner.stop_intake()
        runner.stop(time.monotonic() + 30)


def _task_daemons(root: int) -> tuple[int, int]:
    """Under `root`: the tasks' daemons (`-m pyspark.daemon [pyspark.worker]`) forked (their launcher became the
    stand-in), and those started as the interpreter itself."""
    routed = unrouted = 0
    for pid in _descendants(root):
        args = _cmdline(Path(f"/proc/{pid}")).rstrip(b"\0").split(b"\0")
        if args[-2:] == [b"-m", b"pyspark.daemon"] or args[-3:] == [b"-m", b"pyspark.daemon", b"pyspark.worker"]:
            if _exe(Path(f"/proc/{pid}")) == fork_server.built_stand_in():
                routed += 1
            elif args[0] == sys.executable.encode():
                unrouted += 1
    return routed, unrouted


def _descendants(root: int) -> list[int]:
    found, frontier = [], [root]
    while frontier:
        found_now = children(frontier.pop())
        found += found_now
        frontier += found_now
    return found


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


def _exe(proc: Path) -> Path | None:
    try:
        return Path(os.readlink(proc / "exe"))
    except OSError:
        return None


def _environ(proc: Path) -> dict[str, str]:
    entries = (proc / "environ").read_bytes().rstrip(b"\0").split(b"\0")
    return dict(os.fsdecode(entry).partition("=")[::2] for entry in entries)


def _rows(uri: Path) -> int:
    try:
        return DeltaTable(str(uri)).to_pyarrow_table().num_rows
    except Exception:  # noqa: BLE001 - not there yet
        return 0


def test_a_wrapper_is_known_as_one_wherever_it_came_from(spark):
    """A daemon started by another lakefeed process inherits its PYSPARK_PYTHON: daemon/ops/spark.py must tell that
    it is a wrapper (of a server that is not its own) to replace it."""
    ours = fork_server.start(spark.sparkContext.master)
    assert fork_server.is_wrapper(str(ours))
    assert fork_server.is_wrapper(f"/tmp/{fork_server.RUNTIME_PREFIX}abc123/python-local")  # another process's
    assert not fork_server.is_wrapper(sys.executable)
    assert not fork_server.is_wrapper(str(ours.parent / "fork.sock"))


ZIP_IMPORTERS = """
import importlib, os, sys, zipfile, zipimport
from lakefeed.ops import fork_server
archive = sys.argv[1]
read = zipimport._read_directory
reads = []
zipimport._read_directory = lambda path: reads.append(path) or read(path)
import pkg.sub.mod
fork_server._share_zip_directories()
reads.clear()
importlib.invalidate_caches()
import pkg.sub.other  # found in the directory the importers have
print(len(reads))
with zipfile.ZipFile(archive, "a") as z:
    z.writestr("pkg/sub/new.py", "VALUE = 7")
os.utime(archive, ns=(0, 0))  # another modification time, whatever the clock's resolution
reads.clear()
importlib.invalidate_caches()
import pkg.sub.new
print(len(reads), pkg.sub.new.VALUE)
"""


def test_a_zips_importers_share_its_directory_until_it_changes(tmp_path):
    """Each forked runner invalidates the import caches once; before the fix, each of the 15 importers of
    pyspark.zip then read the directory again and kept its own copy, 18 MiB written in every child. With it (and
    on Python 3.13, which reads it again only when next needed), an unchanged zip's directory is read at most once
    and a changed one's once."""
    archive = tmp_path / "lib.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for name in ("pkg/__init__.py", "pkg/sub/__init__.py", "pkg/sub/mod.py", "pkg/sub/other.py"):
            z.writestr(name, "")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(archive), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", ZIP_IMPORTERS, str(archive)], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    unchanged, changed, value = done.stdout.split()
    assert int(unchanged) <= 1  # the archive's, pkg's and pkg.sub's importers: 3 reads without the fix
    assert (changed, value) == ("1", "7")  # the changed archive read again, once: its new module found
