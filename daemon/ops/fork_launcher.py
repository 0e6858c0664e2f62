"""The Python that Spark starts, on local masters: a Python process that serves the driver (a streaming source's
runner, a daemon of Spark's data source planners; on a local[N] master the tasks' daemon too) is forked by lakefeed's
fork server (daemon/ops/fork_server.py) rather than started afresh; anything else is the interpreter itself.

Run as `python -I -S fork_launcher.py <server socket> <python> <scope> <stand-in> <python's arguments...>` by the
wrapper that PYSPARK_PYTHON names; scope `local` (a local[N] master) routes the tasks' daemon as well, `driver` does
not. It imports only the interpreter's built-in modules (_socket, _signal: the `socket` and `signal` modules would
double its memory). For a routed process it hands its standard streams, environment, working folder and arguments to
the fork server, which forks a child from a process that has imported pyspark, pyarrow and lakefeed's sources and
tasks already. Then something stands in for that child, as the process Spark started and will stop: signals it gets
go to the child, and it ends with the child's exit status. That is the compiled `<stand-in>` (daemon/ops/stand_in.c),
which the launcher becomes by exec, since one stays for each runner for its query's life; when there is none (an
empty argument: no C compiler at set-up) or it cannot be run, the launcher itself. When the fork server cannot be
reached, the launcher runs the module itself, as Spark meant to.
"""

import _signal
import _socket
import os
import sys

# Spark's one-process Python workers on the driver: each streaming source's runner (for the query's life) and the
# one-call planners; the daemons of the data source planners run on the driver too. The tasks' daemon (`-m
# pyspark.daemon` alone, or with pyspark.worker) is routed on a local[N] master only: on any other, it is an
# executor's, whose processes must be its own.
ROUTED = ("pyspark.sql.streaming.python_streaming_source_runner", "pyspark.sql.worker.")
FORWARDED = (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP, _signal.SIGQUIT, _signal.SIGUSR1, _signal.SIGUSR2)


def routed(args: list, tasks: bool) -> bool:
    """Whether `python <args>` is forked; `tasks`: the tasks' daemon too (a local[N] master, whose executor is the
    driver's own JVM)."""
    if len(args) < 2 or args[0] != "-m":
        return False
    if args[1] == "pyspark.daemon":
        return (len(args) > 2 and args[2].startswith("pyspark.sql.worker.")) or \
            (tasks and args[2:] in ([], ["pyspark.worker"]))
    return args[1].startswith(ROUTED)


def request(args: list) -> bytes:
    """What the fork server reads (fork_server.parse_request): NUL-separated cwd, the count of arguments, the
    arguments, then the environment's NAME=value entries."""
    fields = [os.getcwd(), str(len(args)), *args, *(f"{k}={v}" for k, v in os.environ.items())]
    return b"\0".join(os.fsencode(field) for field in fields)


def _exact(sock: "_socket.socket", size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return b""
        data += chunk
    return data


def _forked(sock_path: str, args: list) -> tuple:
    """The connection to the fork server and the child's pid once it has forked one, or None when it cannot."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(sock_path)
        payload = request(args)
        fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2))
        sock.sendmsg([len(payload).to_bytes(4, "big")], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
        sock.sendall(payload)
        reply = _exact(sock, 4)
    except OSError:
        reply = b""
    if not reply:
        sock.close()
        return None
    return sock, int.from_bytes(reply, "big", signed=True)


class _Forwarder:
    """Passes the signals the launcher gets to the child; those that come before the child exists wait for it."""

    def __init__(self) -> None:
        self.pid = 0
        self.pending: list = []
        for signum in FORWARDED:
            _signal.signal(signum, self)

    def __call__(self, signum: int, _frame: object) -> None:
        if not self.pid:
            self.pending.append(signum)
            return
        try:
            os.kill(self.pid, signum)
        except ProcessLookupError:
            pass

    def to(self, pid: int) -> None:
        self.pid = pid
        for signum in self.pending:
            self(signum, None)

    def undo(self) -> None:
        """Back to the default actions, with any signal that came meanwhile taken by this process."""
        for signum in FORWARDED:
            _signal.signal(signum, _signal.SIG_DFL)
        for signum in self.pending:
            os.kill(os.getpid(), signum)


def _stand_in(sock: "_socket.socket", pid: int) -> int:
    """Wait for the child the fork server made: its exit code (negative: the signal that ended it)."""
    status = _exact(sock, 4)
    if not status:  # the fork server is gone: so must the child be, which nothing would reap or report
        try:
            os.kill(pid, _signal.SIGKILL)
        except ProcessLookupError:
            pass
        return 1
    return int.from_bytes(status, "big", signed=True)


def _become(stand_in: str, sock: "_socket.socket", pid: int, args: list) -> None:
    """Exec the compiled stand-in for the child; back here only if that fails. The forwarded signals are blocked
    across the exec: one that comes meanwhile waits for the stand-in's handlers instead of ending it."""
    _signal.pthread_sigmask(_signal.SIG_BLOCK, FORWARDED)
    try:
        os.set_inheritable(sock.fileno(), True)
        os.execv(stand_in, [stand_in, str(sock.fileno()), str(pid), *args])  # noqa: S606 - lakefeed's own
    except OSError:
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, FORWARDED)  # what came meanwhile goes to the forwarder


def main(argv: list) -> None:
    sock_path, python, scope, stand_in, args = argv[1], argv[2], argv[3], argv[4], argv[5:]
    if routed(args, tasks=scope == "local"):
        forwarder = _Forwarder()
        child = _forked(sock_path, args)
        if child is not None:
            forwarder.to(child[1])
            if stand_in:
                _become(stand_in, *child, args)
            code = _stand_in(*child)
            if code < 0:  # ended by a signal: so does its stand-in (SIGKILL and SIGSTOP keep their default action)
                if -code not in (_signal.SIGKILL, _signal.SIGSTOP):
                    _signal.signal(-code, _signal.SIG_DFL)
                os.kill(os.getpid(), -code)
            os._exit(code & 0xFF)
        forwarder.undo()
    os.execv(python, [python, *args])  # noqa: S606 - the interpreter Spark asked for


if __name__ == "__main__":
    main(sys.argv)
