"""The landing-folder source with real inotify events and real files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from lakefeed.connectors.sources.local_dir import LocalDirSource, being_written
from lakefeed.inbox.files import Inbox, InboxReader
from tests.conftest import wait_for


@pytest.fixture
def source(tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    inbox = Inbox(tmp_path / "inbox")
    src = LocalDirSource("e", landing, inbox, reconcile_interval_s=3600, excluded=(landing / "lake",))
    yield src, landing, tmp_path / "inbox"
    src.stop()
    inbox.close()


def _records(folder):
    reader = InboxReader(folder)
    return reader.records(0, reader.refresh())


def test_listing_at_start_takes_finished_files_and_leaves_open_ones_to_their_close(source):
    src, landing, inbox = source
    (landing / "done.csv").write_text("a\n1\n")
    writer = open(landing / "open.csv", "w")
    writer.write("a\n")
    writer.flush()
    src.start()
    assert [os.path.basename(r.path) for r in _records(inbox)] == ["done.csv"]
    writer.write("2\n")
    writer.close()
    wait_for(lambda: len(_records(inbox)) == 2, 10, what="the closed file")
    rec = _records(inbox)[1]
    assert os.path.basename(rec.path) == "open.csv" and rec.size == 4  # its final size, once


def test_moved_in_from_outside_the_tree_is_taken_at_once(source, tmp_path):
    src, landing, inbox = source
    src.start()
    outside = tmp_path / "staging.csv"
    outside.write_text("a\n1\n")
    os.rename(outside, landing / "moved.csv")  # only IN_MOVED_TO: seen as a creation
    wait_for(lambda: len(_records(inbox)) == 1, 10, what="the file moved in")
    (landing / "sub").mkdir()
    os.rename(landing / "moved.csv", landing / "sub" / "renamed.csv")  # a rename inside the tree
    wait_for(lambda: len(_records(inbox)) == 3, 10, what="the renamed file")
    assert sorted((os.path.relpath(r.path, landing), r.removed) for r in _records(inbox)[1:]) == [
        ("moved.csv", True), ("sub/renamed.csv", False)]  # the old name's removal and the new name


def test_a_copied_tree_is_taken_whole_and_ignored_names_are_not(source, tmp_path):
    src, landing, inbox = source
    src.start()
    tree = tmp_path / "tree"
    (tree / "2024" / "01").mkdir(parents=True)
    for i in range(20):
        (tree / "2024" / "01" / f"f{i}.csv").write_text(f"a\n{i}\n")
    (tree / "2024" / ".hidden.csv").write_text("x")
    (tree / "2024" / "part.tmp").write_text("x")
    (tree / "x.manifest.cdm.json").write_text("{}")
    shutil.copytree(tree, landing / "tree")  # copy2: each file's mtime is set after it is closed
    (landing / "lake").mkdir()
    (landing / "lake" / "out.parquet").write_text("x")  # lakefeed's own output is excluded
    wait_for(lambda: len(_records(inbox)) == 20, 10, what="20 copied files")
    assert sorted(os.path.basename(r.path) for r in _records(inbox)) == sorted(f"f{i}.csv" for i in range(20))
    wait_for(lambda: not src._pending, 10, what="no file waiting for a look")
    assert src.reconcile() == 0  # nothing missed, nothing twice
    assert len(_records(inbox)) == 20


def test_being_written_sees_writers(tmp_path):
    path = tmp_path / "f"
    with open(path, "w") as f:
        f.write("x")
        f.flush()
        assert being_written(str(path)) is True
    assert being_written(str(path)) is False


def test_special_files_and_links_are_enqueued_with_why_they_cannot_be_read_and_the_source_goes_on(source):
    src, landing, inbox = source
    src.start()
    os.mkfifo(landing / "pipe.csv")
    (landing / "link.csv").symlink_to("/etc/passwd")
    (landing / os.fsdecode(b"bad\xffname.csv")).write_text("a\n1\n")
    (landing / "fine.csv").write_text("a\n1\n")
    records = wait_for(lambda: len(_records(inbox)) == 4 and _records(inbox), 30, what="four records")
    problems = {os.path.basename(r.path): r.problem for r in records}
    assert problems["pipe.csv"] == "a FIFO, not a regular file"
    assert problems["link.csv"].startswith("a symbolic link")
    assert problems["bad\ufffdname.csv"] == "the file name is not valid UTF-8; rename it"
    assert problems["fine.csv"] == "" and src.failure() is None


def test_a_stopped_watch_is_reported_as_the_source_failing(source):
    src, landing, _ = source
    src.start()
    assert src.failure() is None
    src._observer.stop()  # as if inotify's thread had died
    src._observer.join(10)
    assert "watch (inotify) has stopped" in src.failure()


def test_deletions_are_removals_whether_watched_or_found_by_a_listing(source, tmp_path):
    src, landing, inbox = source
    for name in ("a.csv", "b.csv", "c.csv"):
        (landing / name).write_text("a\n1\n")
    (landing / "_tmp").mkdir()
    (landing / "_tmp" / "part.csv").write_text("a\n1\n")  # inside a `_` folder: never data, watched or listed
    src.start()
    assert sorted(os.path.basename(r.path) for r in _records(inbox)) == ["a.csv", "b.csv", "c.csv"]
    (landing / "a.csv").unlink()
    wait_for(lambda: len(_records(inbox)) == 4, 10, what="the deletion")
    gone = _records(inbox)[3]
    assert (os.path.basename(gone.path), gone.removed, gone.size) == ("a.csv", True, 0)
    (landing / "_tmp" / "late.csv").write_text("a\n1\n")
    (landing / "_tmp" / "part.csv").unlink()
    src.stop()

    (landing / "b.csv").unlink()  # while nobody watches
    restarted = LocalDirSource("e", landing, src._inbox, reconcile_interval_s=3600)
    try:
        restarted.start()  # the listing at start finds it gone, once
        assert [(os.path.basename(r.path), r.removed) for r in _records(inbox)[4:]] == [("b.csv", True)]
        assert restarted.reconcile() == 0
        before = (landing / "c.csv").stat()
        (landing / "c.csv").unlink()
        wait_for(lambda: len(_records(inbox)) == 6, 10, what="the deletion of c")
        (landing / "c.csv").write_text("a\n1\n")  # back, with its old size and time: taken again
        os.utime(landing / "c.csv", ns=(before.st_atime_ns, before.st_mtime_ns))
        wait_for(lambda: len(_records(inbox)) == 7, 10, what="c back")
        assert [(os.path.basename(r.path), r.removed) for r in _records(inbox)[5:]] == [
            ("c.csv", True), ("c.csv", False)]
        assert restarted.reconcile() == 0  # nothing the listing would add or remove
    finally:
        restarted.stop()


# Lists the landing folder (argv 1) into the inbox (argv 2) while its `sub` folder is readable, unreadable
# (twice; b.csv deleted meanwhile), then readable again; prints what each listing enqueued.
_LISTINGS_AROUND_A_CHMOD = """
import json, os, sys
from pathlib import Path
from lakefeed import log
from lakefeed.connectors.sources.local_dir import LocalDirSource
from lakefeed.inbox.files import Inbox
log.configure("INFO", json=True)
root = Path(sys.argv[1])
src = LocalDirSource("e", root, Inbox(Path(sys.argv[2])), reconcile_interval_s=3600)
found = [src.reconcile()]
os.chmod(root / "sub", 0)
(root / "b.csv").unlink()
found += [src.reconcile(), src.reconcile()]
os.chmod(root / "sub", 0o755)
found.append(src.reconcile())
print(json.dumps(found))
"""


def test_a_folder_unreadable_for_a_while_is_neither_removed_nor_taken_again(tmp_path):
    """Its files are unknown while it cannot be listed, not gone (a removal would have them taken again once
    readable); a file really deleted meanwhile is still a removal, and the folder is logged once."""
    landing = tmp_path / "landing"
    (landing / "sub" / "deep").mkdir(parents=True)
    for name in ("sub/a.csv", "sub/deep/c.csv", "b.csv"):
        (landing / name).write_text("a\n1\n")
    # As the service user: permissions hold (root's CAP_DAC_OVERRIDE would read a mode-000 folder).
    run = subprocess.run(["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--", sys.executable,
                          "-c", _LISTINGS_AROUND_A_CHMOD, str(landing), str(tmp_path / "inbox")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == [3, 1, 0, 0]
    assert sorted((os.path.relpath(r.path, landing), r.removed) for r in _records(tmp_path / "inbox")) == [
        ("b.csv", False), ("b.csv", True), ("sub/a.csv", False), ("sub/deep/c.csv", False)]
    unlistable = [json.loads(line) for line in run.stderr.splitlines() if '"file.unlistable"' in line]
    assert [e["file"] for e in unlistable] == [str(landing / "sub")]
