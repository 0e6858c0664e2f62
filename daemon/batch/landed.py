"""Opening a landed file so that nothing in a landing folder can hang, crash or mislead a batch.

Only a regular file is read, through the descriptor that was checked: a FIFO would block the
read forever, a link may lead anywhere (`/etc/passwd`), and a file swapped between a check and
an open by name would be read unchecked. Whatever is wrong is an `Unreadable` with the reason,
which the batch puts in quarantine. A file's first line is looked at before a parser sees it,
so a 100,000-column CSV is refused at once instead of taking a core for minutes.
"""

from __future__ import annotations

import csv
import errno
import os
from pathlib import Path

import pyarrow as pa

from lakefeed.batch.admit import PARSER_DEPTH, schema_problems, too_deep, utf8_problem
from lakefeed.batch.read import BadRow, FileRead, read_file
from lakefeed.config.limits import Limits
from lakefeed.config.model import CsvFormat, FileFormat
from lakefeed.inbox.files import not_regular

_FIRST_READ = 64 << 10  # bytes read for the first line before all that limits.max_line_bytes allows


class Unreadable(Exception):
    """The file cannot be taken; the message is the quarantine's reason."""


class Landed:
    """A landed file opened for reading; `path` names the checked descriptor (`/proc/self/fd/N`)."""

    def __init__(self, path: Path, root: Path, follow_symlinks: bool) -> None:
        self.origin = path  # where it landed (a model.json folder's file is read with that folder's model)
        self.root, self.follow_symlinks = root, follow_symlinks  # how a file beside it is opened alike
        target = path
        if follow_symlinks and path.is_symlink():
            target = Path(os.path.realpath(path))
            real_root = os.path.realpath(root)
            if os.path.commonpath([str(target), real_root]) != real_root:
                raise Unreadable(f"a symbolic link to {target}, outside the landing folder")
        try:
            self._fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise Unreadable(_open_failure(exc)) from exc
        self.stat = os.fstat(self._fd)
        if problem := not_regular(self.stat.st_mode):
            os.close(self._fd)
            raise Unreadable(problem)
        self.path = Path(f"/proc/self/fd/{self._fd}")

    def identity(self) -> tuple[int, int]:
        return self.stat.st_size, self.stat.st_mtime_ns

    def changed(self) -> bool:
        """Whether the file was written (or truncated) since it was opened."""
        now = os.fstat(self._fd)
        return (now.st_size, now.st_mtime_ns) != self.identity()

    def check(self, fmt: FileFormat, limits: Limits) -> None:
        """Refuse, before parsing, what the limits say no to: size, the first line's length and columns."""
        if self.stat.st_size > limits.max_file_bytes:
            raise Unreadable(f"{self.stat.st_size} bytes, more than limits.max_file_bytes ({limits.max_file_bytes})")
        if fmt.kind == "ndjson":
            self._check_depth(limits)
        if fmt.kind == "parquet" or fmt.kind == "json":  # json: parsed by Python, whose depth limit is caught
            return
        head = os.pread(self._fd, min(_FIRST_READ, limits.max_line_bytes + 1), 0)
        if b"\n" not in head and len(head) == _FIRST_READ:  # a long first line: read as far as the limit
            head = os.pread(self._fd, limits.max_line_bytes + 1, 0)
        end = head.find(b"\n")
        if end == -1 and len(head) > limits.max_line_bytes:
            raise Unreadable(f"the first line is longer than limits.max_line_bytes ({limits.max_line_bytes})")
        if isinstance(fmt, CsvFormat):
            line = head[: end if end != -1 else len(head)].decode(fmt.encoding, "replace")
            columns = len(next(csv.reader([line], delimiter=fmt.delimiter, quotechar=fmt.quote), []))
            if columns > limits.max_columns:
                raise Unreadable(f"{columns} columns, more than limits.max_columns ({limits.max_columns})")

    def _check_depth(self, limits: Limits, piece: int = 16 << 20) -> None:
        """NDJSON nested deeper than a parser survives (pyarrow's crashes the process) is refused unparsed."""
        carry, position, size = b"", 0, self.stat.st_size
        while position < size:
            data = os.pread(self._fd, piece, position)
            if not data:
                break
            position += len(data)
            text = carry + data
            cut = text.rfind(b"\n") + 1 if position < size else len(text)
            if too_deep(text[:cut]):
                raise Unreadable(f"nests more than {PARSER_DEPTH} levels deep (limits.max_nesting is "
                                 f"{limits.max_nesting})")
            carry = text[cut:]
            if len(carry) > limits.max_line_bytes:
                raise Unreadable(f"a line is longer than limits.max_line_bytes ({limits.max_line_bytes})")

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> Landed:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _open_failure(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "a symbolic link; links are not followed (source.follow_symlinks takes those inside the folder)"
    if exc.errno == errno.ENXIO:
        return "a socket, not a regular file"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "cannot be read: permission denied (give the lakefeed user read access, then land it again)"
    return f"cannot be opened: {exc.strerror or exc}"


class Superseded(Exception):
    """The file changed since it was enqueued or while it was read: its new version has its own inbox record."""


def read_landed(landed: Landed, fmt: FileFormat, target: pa.Schema | None, limits: Limits) -> FileRead:
    """The file's rows, or one bad row with line None saying why none can be taken."""
    landed.check(fmt, limits)
    try:
        read = read_file(landed.path, fmt, target, landed.origin)
    except FileNotFoundError:
        raise
    except RecursionError:
        return FileRead(None, [BadRow(None, f"nests too deeply to decode (limits.max_nesting is "
                                            f"{limits.max_nesting})", "")])
    except (KeyError, IndexError, TypeError, ValueError, pa.ArrowException) as exc:
        # Whatever else a parser makes of a hostile file is that file's fault: it goes to quarantine, not the stream.
        return FileRead(None, [BadRow(None, f"file cannot be read: {type(exc).__name__}: {exc}", "")])
    if landed.changed():
        raise Superseded("written while it was read")
    if read.table is None:
        return read
    problems = schema_problems(read.table.schema, target, limits)
    if problems:
        return FileRead(None, [BadRow(None, "; ".join(message for _, message in problems), "", problems[0][0])])
    if (invalid := utf8_problem(read.table)) is not None:
        return FileRead(None, [BadRow(None, invalid, "")])
    return read
