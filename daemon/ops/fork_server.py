"""One process that has imported what Spark's driver-side Python processes import, and forks one for each launcher
(daemon/ops/fork_launcher.py) that asks: they share those pages instead of each holding its own copy.

Why: Spark starts one Python process per streaming source for the query's life (`python -m
pyspark.sql.streaming.python_streaming_source_runner`), two for each entity with a file and a push source, and a
daemon for each kind of data source planning. Started afresh, each held its own copy of pyspark, pyarrow and
lakefeed's sources (docs/architecture.md, "Spark's driver-side Python processes are forked").

How: on local masters the session (daemon/ops/spark.py) calls `start()`, which binds a Unix socket in a private
folder, starts this module's `serve` with it, and returns a wrapper script to be PYSPARK_PYTHON. Spark runs that
wrapper for every Python process; the launcher it runs passes what it does not route (fork_launcher.routed) to the
interpreter itself. For a routed one, the launcher sends its standard streams, environment, working folder and
arguments; the server forks, the child takes them on and runs the module as `python -m` would. The server reaps the
child and sends its exit status to the launcher, or rather to the small compiled stand-in the launcher has become
(daemon/ops/stand_in.c), which Spark waits on; if that dies first (Spark stops it forcibly), the server kills the
child. The server ends with the daemon: its standard input is a pipe the daemon holds, and at its end (the daemon
exited, however) it kills what it forked and exits."""

from __future__ import annotations

import array
import atexit
import gc
import importlib
import os
import runpy
import selectors
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import traceback
import zipimport
from pathlib import Path

from lakefeed import log
from lakefeed.ops import spark_home

_log = log.get(__name__)

# What the forked processes import: Spark's runner, planners and worker modules, the data sources lakefeed registers
# and the tasks' code (which a local[N] master's task workers import at their first task).
PRELOAD = (
    "pyspark.sql.streaming.python_streaming_source_runner",
    "pyspark.daemon",
    "pyspark.worker",
    "lakefeed.pipeline.tasks",
    "pyspark.sql.worker.plan_data_source_read",
    "pyspark.sql.worker.create_data_source",
    "pyspark.sql.worker.lookup_data_sources",
    "lakefeed.connectors.streams.inbox_stream",
    "lakefeed.connectors.streams.spool_stream",
    "lakefeed.connectors.sources.kafka_source",
)
LAUNCHER = Path(__file__).with_name("fork_launcher.py")
STAND_IN = "lakefeed-stand-in"  # daemon/ops/stand_in.c, built by `make setup` into the venv's bin
REQUEST_TIMEOUT_S = 10.0
RUNTIME_PREFIX = "lakefeed-py-"
SCOPES = ("driver", "local")
_FD_SIZE = array.array("i").itemsize

_started: dict[str, Path] = {}


def start(master: str) -> Path:
    """The wrapper to use as PYSPARK_PYTHON for a session on local `master` (local[N] or local-cluster), with this
    process's fork server started (once per process, whatever number of sessions it makes)."""
    if not _started:
        runtime = Path(tempfile.mkdtemp(prefix=RUNTIME_PREFIX))
        wrappers, server = launch(runtime, built_stand_in())
        atexit.register(_stop, server, runtime)
        _started.update(wrappers)
    return _started["driver" if master.startswith("local-cluster") else "local"]


def is_wrapper(python: str) -> bool:
    """Whether `python` (a PYSPARK_PYTHON) is a wrapper `launch` wrote, in this process or another."""
    path = Path(python)
    return path.parent.name.startswith(RUNTIME_PREFIX) and path.name in (f"python-{scope}" for scope in SCOPES)


def built_stand_in() -> Path | None:
    """The compiled stand-in (daemon/ops/stand_in.c) that `make setup` builds beside this venv's python, if built."""
    path = Path(sys.executable).parent / STAND_IN
    return path if os.access(path, os.X_OK) else None


def launch(runtime: Path, stand_in: Path | None = None) -> tuple[dict[str, Path], subprocess.Popen]:
    """A fork server listening in `runtime`, and the wrapper scripts there that run Spark's Python through it, by
    scope: `driver` forks the Python processes that serve the driver, `local` the tasks' daemon as well (for a
    local[N] master). The server runs until its standard input (`.stdin` of the Popen) is closed. `stand_in`: what
    stands in for a forked child (fork_launcher.py): that program, or when None the launcher itself."""
    sock_path = runtime / "fork.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock_path))
    listener.listen(64)
    # The socket is bound before the server starts, so a launcher that comes first waits in its backlog.
    # As Spark starts its Python processes: pyspark and py4j from SPARK_HOME's zips first on the path (compiled at
    # set-up, daemon/ops/spark_home.py), then spark-core's jar, unbuffered, and one hash seed (str hashes agree across
    # workers). With the jar on the server's path, its importer and directory (7 MiB) are read once, here, and
    # shared; a child that found it only in the PYTHONPATH Spark gave it read them at its first import.
    home = Path(spark_home.effective())
    lib = home / "python" / "lib"
    path = [str(lib / "pyspark.zip"), *map(str, sorted(lib.glob("py4j-*-src.zip"))),
            *sorted(os.path.realpath(jar) for jar in home.glob("jars/spark-core_*.jar")),  # as the JVM names it
            os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path)), "PYTHONUNBUFFERED": "1",
           "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "0")}
    server = subprocess.Popen(  # noqa: S603 - this interpreter, this module
        [sys.executable, "-m", __name__, str(listener.fileno())], stdin=subprocess.PIPE,
        pass_fds=(listener.fileno(),), env=env)
    listener.close()
    python = shlex.quote(sys.executable)
    wrappers = {}
    for scope in SCOPES:
        wrapper = runtime / f"python-{scope}"
        command = (f"{python} -I -S {shlex.quote(str(LAUNCHER))} {shlex.quote(str(sock_path))} {python} {scope} "
                   f"{shlex.quote(str(stand_in or ''))}")
        script = f'#!/bin/sh\n# lakefeed: Spark\'s Python (daemon/ops/fork_launcher.py)\nexec {command} "$@"\n'
        wrapper.write_text(script, encoding="utf-8")
        wrapper.chmod(0o755)
        wrappers[scope] = wrapper
    return wrappers, server


def _stop(server: subprocess.Popen, runtime: Path) -> None:
    if server.stdin is not None:
        server.stdin.close()
    try:
        server.wait(timeout=5)
    except subprocess.TimeoutExpired:
        server.kill()
    shutil.rmtree(runtime, ignore_errors=True)


class _Server:
    def __init__(self, listener: socket.socket) -> None:
        self.listener = listener
        self.children: dict[int, socket.socket | None] = {}
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        # Ctrl-C in a terminal reaches the whole process group: the daemon stops its queries, and they their runners.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.selector.register(listener, selectors.EVENT_READ, "accept")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "reap")
        self.selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "daemon")

    def run(self) -> None:
        while True:
            for key, _ in self.selector.select():
                if key.data == "accept":
                    self._accept()
                elif key.data == "reap":
                    self._reap()
                elif key.data == "daemon":
                    if not os.read(key.fd, 4096):
                        self._end()
                        return
                else:
                    self._launcher_spoke(key.fileobj, key.data)

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except BlockingIOError:
            return
        conn.settimeout(REQUEST_TIMEOUT_S)
        fds: list[int] = []
        pid = 0
        try:
            request, fds = _request(conn)
            pid = os.fork()
            if pid == 0:
                self._child(conn, request, fds)
            conn.sendall(pid.to_bytes(4, "big", signed=True))
        except Exception as exc:  # noqa: BLE001 - no request may stop the server
            _log.warning("fork_server.request_refused", error=repr(exc))
            conn.close()
            if pid:  # forked for a launcher that has gone: nobody would stop the child
                _kill(pid)
            return
        finally:
            for fd in fds:
                os.close(fd)
        self.children[pid] = conn
        self.selector.register(conn, selectors.EVENT_READ, pid)

    def _launcher_spoke(self, conn: socket.socket, pid: int) -> None:
        """A launcher sends nothing after its request: readable means it has gone, so its child goes too."""
        try:
            conn.recv(1)
        except OSError:
            pass
        self.selector.unregister(conn)
        conn.close()
        self.children[pid] = None
        _kill(pid)

    def _reap(self) -> None:
        while True:
            try:
                os.read(self.wake_r, 4096)
            except BlockingIOError:
                break
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                self.selector.unregister(conn)
                try:
                    conn.sendall(os.waitstatus_to_exitcode(status).to_bytes(4, "big", signed=True))
                except OSError:
                    pass
                conn.close()

    def _end(self) -> None:
        for pid in self.children:
            _kill(pid)

    def _child(self, conn: socket.socket, request: dict, fds: list[int]) -> None:
        """In the forked child: become the process the launcher would have started, run the module, exit."""
        code = 70
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            self.selector.close()
            for sock in (self.listener, conn, *filter(None, self.children.values())):
                sock.close()
            os.close(self.wake_r)
            os.close(self.wake_w)
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            code = _run(request)
        except BaseException:  # noqa: BLE001 - a child must never return into the server's loop
            traceback.print_exc()
        finally:
            os._exit(code)


def _request(conn: socket.socket) -> tuple[dict, list[int]]:
    """A launcher's request: its three standard streams' descriptors, and its argv, env and cwd."""
    header, ancillary, _, _ = conn.recvmsg(4, socket.CMSG_SPACE(3 * _FD_SIZE))
    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % _FD_SIZE])
    received = list(fds)
    try:
        if len(received) != 3 or len(header) != 4:
            raise ValueError(f"a request needs 3 descriptors and a length; got {len(received)} and {len(header)} bytes")
        size = int.from_bytes(header, "big")
        payload = b""
        while len(payload) < size:
            chunk = conn.recv(size - len(payload))
            if not chunk:
                raise ValueError(f"the request ended after {len(payload)} of its {size} bytes")
            payload += chunk
        return parse_request(payload), received
    except BaseException:
        for fd in received:
            os.close(fd)
        raise


def parse_request(payload: bytes) -> dict:
    """fork_launcher.request's fields: cwd, the count of arguments, the arguments (`-m <module> ...`), the env."""
    fields = [os.fsdecode(field) for field in payload.split(b"\0")]
    count = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0
    argv, env = fields[2:2 + count], fields[2 + count:]
    if count < 2 or len(argv) != count or argv[0] != "-m":
        raise ValueError(f"not a module to run: {argv!r}")
    return {"cwd": fields[0], "argv": argv, "env": dict(entry.partition("=")[::2] for entry in env)}


def _run(request: dict) -> int:
    """Run `python -m <module> <args...>` in this process, as the launcher's environment would; its exit code."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[:0] = extra
    module = request["argv"][1]
    sys.argv = [module, *request["argv"][2:]]
    sys.modules.pop(module, None)  # run afresh as __main__; what it imports stays imported
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exit_:
        code = _exit_code(exit_.code)
    except BaseException:  # noqa: BLE001 - as `python -m` does: the traceback on stderr, status 1
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return code


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def serve(listen_fd: int) -> None:
    log.configure_once()  # its warnings as JSON lines on stderr, the daemon's
    # Nothing may run beside the one thread at a fork: no OpenBLAS thread pool (numpy), no jemalloc purging thread
    # (pyarrow). Each is read when the library loads, so it holds for the children too.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("JE_ARROW_MALLOC_CONF", "background_thread:false")
    for name in PRELOAD:
        importlib.import_module(name)
    _share_zip_directories()
    gc.collect()
    gc.freeze()  # the collector leaves the preloaded objects alone, so a child does not copy their pages
    listener = socket.socket(fileno=listen_fd)
    listener.setblocking(False)
    _Server(listener).run()


def _share_zip_directories() -> None:
    """Before Python 3.13, `importlib.invalidate_caches()` made each zip importer read its archive's whole directory
    again and keep its own copy. Every runner calls it once at its start (pyspark.worker_util.setup_spark_files); with
    pyspark imported from SPARK_HOME's pyspark.zip, the 15 importers of pyspark's packages then held 15 copies of
    that zip's directory: 18 MiB written in each forked child, which shared none of it. Here an importer re-reads
    only an archive that changed (its inode, size or modification time) and shares the directory of one that did
    not, as Python 3.13 does by reading it again only when it is next needed."""
    if sys.version_info >= (3, 13):
        return
    directories = zipimport._zip_directory_cache  # type: ignore[attr-defined]  # stdlib's, shared by importers
    reread = zipimport.zipimporter.invalidate_caches
    read_as = {archive: _identity(archive) for archive in directories}

    def invalidate_caches(importer: zipimport.zipimporter) -> None:
        identity = _identity(importer.archive)
        if identity is not None and read_as.get(importer.archive) == identity and importer.archive in directories:
            importer._files = directories[importer.archive]  # type: ignore[attr-defined]
            return
        reread(importer)
        read_as[importer.archive] = identity

    zipimport.zipimporter.invalidate_caches = invalidate_caches  # type: ignore[method-assign]


def _identity(path: str) -> tuple[int, int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


if __name__ == "__main__":
    serve(int(sys.argv[1]))
