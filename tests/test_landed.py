"""Opening landed files: only regular files, through the checked descriptor, refused before parsing when over
the limits, and never committed in part when written while read (batch/landed.py)."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from lakefeed.batch.admit import json_depth, too_deep
from lakefeed.batch.landed import Landed, Superseded, Unreadable, read_landed
from lakefeed.config.limits import Limits
from lakefeed.config.model import CsvFormat, JsonFormat


def test_a_fifo_is_refused_at_once_instead_of_blocking_the_batch(tmp_path):
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []
    worker = threading.Thread(target=lambda: outcome.append(_refusal(fifo, tmp_path)), daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "opening a FIFO blocked"
    assert "a FIFO, not a regular file" in str(outcome[0])


def _refusal(path, root, follow=False) -> BaseException:
    with pytest.raises(Unreadable) as refused:
        Landed(path, root, follow)
    return refused.value


def test_sockets_and_links_are_refused_and_links_inside_the_folder_followed_when_allowed(tmp_path):
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "s.csv"))
    sock.close()
    assert "a socket" in str(_refusal(tmp_path / "s.csv", tmp_path))
    (tmp_path / "real.csv").write_text("id\n1\n")
    (tmp_path / "inside.csv").symlink_to(tmp_path / "real.csv")
    (tmp_path / "outside.csv").symlink_to("/etc/passwd")
    assert "symbolic link" in str(_refusal(tmp_path / "inside.csv", tmp_path))
    assert "outside the landing folder" in str(_refusal(tmp_path / "outside.csv", tmp_path, follow=True))
    with Landed(tmp_path / "inside.csv", tmp_path, follow_symlinks=True) as landed:
        read = read_landed(landed, CsvFormat(), None, Limits())
    assert read.table is not None and read.table.column("id").to_pylist() == [1]


def test_limits_refuse_a_file_before_a_parser_sees_it(tmp_path):
    wide = tmp_path / "wide.csv"
    wide.write_text(",".join(f"c{i}" for i in range(50)) + "\n")
    long = tmp_path / "long.csv"
    long.write_bytes(b"a" * 5000 + b"\n")
    deep = tmp_path / "deep.json"
    deep.write_bytes(b'{"ok": 1}\n{"n": ' + b"[" * 3000 + b"]" * 3000 + b"}\n")
    limits = Limits(max_columns=10, max_line_bytes=4096, max_file_bytes=1 << 20)
    for path, fmt, says in [(wide, CsvFormat(), "50 columns"), (long, CsvFormat(), "max_line_bytes"),
                            (deep, JsonFormat(kind="ndjson"), "levels deep")]:
        with Landed(path, tmp_path, False) as landed, pytest.raises(Unreadable, match=says):
            read_landed(landed, fmt, None, limits)
    with Landed(deep, tmp_path, False) as landed, pytest.raises(Unreadable, match="max_file_bytes"):
        read_landed(landed, JsonFormat(kind="ndjson"), None, Limits(max_file_bytes=100))


@pytest.mark.parametrize(("first_line", "taken"), [(100_000, True), (300_000, False)])
def test_a_first_line_longer_than_the_first_read_is_measured_to_the_limit(tmp_path, first_line, taken):
    path = tmp_path / "long.csv"
    path.write_bytes(b"a" * first_line + b"\n" + b"b\n")  # one column whose header name is the line
    limits = Limits(max_line_bytes=200_000)
    with Landed(path, tmp_path, False) as landed:
        if taken:
            read = read_landed(landed, CsvFormat(), None, limits)
            assert read.table is not None and read.table.num_rows == 1
        else:
            with pytest.raises(Unreadable, match="max_line_bytes"):
                read_landed(landed, CsvFormat(), None, limits)


def test_a_file_written_while_it_is_read_is_not_taken_in_part(tmp_path):
    path = tmp_path / "growing.csv"
    path.write_text("id\n" + "".join(f"{i}\n" for i in range(1000)))
    with Landed(path, tmp_path, False) as landed:
        with open(path, "r+") as f:
            f.truncate(100)  # a producer rewriting it in place
        assert landed.changed()
        with pytest.raises(Superseded):
            read_landed(landed, CsvFormat(), None, Limits())


@pytest.mark.parametrize("text, depth", [
    (b'{"a": [1, {"b": [2]}]}', 4), (b'{"a": "[[[[", "b": [1]}', 2), (b'{"a": "x\\"[[", "b": [[1]]}', 3),
    (b'[' * 10 + b']' * 10, 10), (b"", 0), (b'"\\\\"[[]]', 2),
])
def test_json_depth_counts_brackets_outside_strings(text, depth):
    assert json_depth(text) == depth
    assert not too_deep(text, limit=depth + 1)
    assert too_deep(text, limit=depth) or depth == 0
