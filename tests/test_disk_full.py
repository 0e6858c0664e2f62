"""A full disk never costs an acknowledged record: on a small real tmpfs, the spool refuses what it cannot
make durable (507, nothing acknowledged) and every 202 before it is read back whole, also after more
frames were written once space came back. The file inbox likewise: a refused append is cut back and taken
for new when offered again."""

from __future__ import annotations

import errno
import http.client
import json
import os
import subprocess
from pathlib import Path

import pyarrow as pa
import pytest

from lakefeed.config import model as config
from lakefeed.inbox import segments
from lakefeed.inbox.files import LOG_NAME, FileEvent, Inbox, InboxReader
from lakefeed.inbox.segments import SpoolWriteError
from lakefeed.inbox.spool import Pending, Spool, SpoolReader, encode, read_entry
from lakefeed.intake.http_server import HttpServer
from lakefeed.intake.push_api import Endpoint, PushApi, token_hash
from tests.conftest import write_config


@pytest.fixture
def small_disk(tmp_path):
    """A real 256 KiB file system (tmpfs), unmounted after the test."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def _frame(text: str, key: str) -> Pending:
    return Pending(encode(pa.table({"v": [text]})), 1, key, None)


def _fill(folder: Path, leave: int) -> Path:
    """A file taking all but about `leave` bytes of the file system."""
    filler = folder / "filler"
    stat = os.statvfs(folder)
    try:
        filler.write_bytes(b"\0" * max(0, stat.f_bavail * stat.f_frsize - leave))
    except OSError:
        pass  # full before the last byte: as full as wanted
    return filler


def test_a_write_the_disk_cannot_take_is_refused_and_cut_back(small_disk):
    spool = Spool(small_disk / "spool", segment_bytes=1 << 30, ttl_s=60)
    acked = spool.append([_frame("a" * 1000, "k0")])
    filler = _fill(small_disk, leave=8192)
    more = []
    with pytest.raises(SpoolWriteError) as refused:
        for i in range(100):  # each 4 KiB: the disk is full within a few
            more += spool.append([_frame(chr(65 + i % 26) * 4000, f"k{i + 1}")])
    assert refused.value.no_space
    acked += more
    segment = small_disk / "spool" / acked[0].segment
    assert segment.stat().st_size == acked[-1].position + acked[-1].length, "the torn bytes were cut back"
    filler.unlink()
    acked += spool.append([_frame("z" * 1000, "after")])  # space again: the spool goes on
    spool.close()
    reopened = Spool(small_disk / "spool", segment_bytes=1 << 30, ttl_s=60)
    assert reopened.next_offset == len(acked)
    reader = SpoolReader(small_disk / "spool")
    entries = reader.entries(0, reader.refresh())
    assert [(e.offset, e.key) for e in entries] == [(e.offset, e.key) for e in acked]
    texts = [read_entry(small_disk / "spool", e).column("v")[0].as_py()[0] for e in entries]  # CRCs checked
    assert texts[0] == "a" and texts[-1] == "z" and len(texts) == len(acked)
    reopened.close()


def test_frames_of_a_refused_group_are_never_read_though_whole_on_disk_until_the_cut(small_disk, monkeypatch):
    """A group commit the disk takes only part of: its first frame is whole on disk until the cut. A reader that
    looks just then (Spark's planner, another process) must not take it: the cut gives its offset to the next
    acknowledged frame, which that reader would then never read. Readers stop at the writer's durable mark."""
    spool = Spool(small_disk / "spool", segment_bytes=1 << 30, ttl_s=60)
    spool.append([_frame("a" * 100, "k0")])
    reader = SpoolReader(small_disk / "spool")
    assert reader.refresh() == 1
    seen, cut = [], segments.os.ftruncate

    def look_then_cut(fd: int, length: int) -> None:
        seen.append((os.fstat(fd).st_size > length, reader.refresh()))
        cut(fd, length)

    filler = _fill(small_disk, leave=8192)
    monkeypatch.setattr(segments.os, "ftruncate", look_then_cut)
    with pytest.raises(SpoolWriteError):
        spool.append([_frame("b" * 1500, "k1"), _frame("c" * 200_000, "k2")])  # the first fits, the second not
    monkeypatch.undo()
    filler.unlink()
    assert seen == [(True, 1)], "a frame that was never acknowledged was read"
    spool.append([_frame("d" * 100, "k3")])
    assert reader.refresh() == 2
    [entry] = reader.entries(1, 2)
    assert entry.key == "k3" and read_entry(small_disk / "spool", entry).column("v")[0].as_py() == "d" * 100
    spool.close()


def test_inbox_records_an_append_failed_to_make_durable_are_never_read(tmp_path, monkeypatch):
    """The inbox's append is written whole and its fsync fails (EIO: the disk's doing, injected here): a reader
    in another process that looks before the cut must not take the records; their offsets go to the next ones."""
    inbox = Inbox(tmp_path)
    inbox.offer([FileEvent("/l/a.csv", 1, 1)])
    reader = InboxReader(tmp_path)
    assert reader.refresh() == 1
    seen, fsync = [], segments.os.fsync

    def look_then_fail(fd: int) -> None:
        seen.append(reader.refresh())
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(segments.os, "fsync", look_then_fail)
    with pytest.raises(SpoolWriteError):
        inbox.offer([FileEvent("/l/b.csv", 2, 2)])
    monkeypatch.setattr(segments.os, "fsync", fsync)
    assert seen == [1], "a record that was never durable was read"
    assert [r.offset for r in inbox.offer([FileEvent("/l/c.csv", 3, 3)])] == [1]
    assert reader.refresh() == 2 and [r.path for r in reader.records(0, 2)] == ["/l/a.csv", "/l/c.csv"]


def _inbox_records(folder: Path) -> list[tuple[int, str, bool]]:
    reader = InboxReader(folder)
    return [(r.offset, r.path, r.removed) for r in reader.records(0, reader.refresh())]


def test_an_inbox_append_the_disk_takes_only_part_of_is_refused_and_cut_back(small_disk):
    """The disk takes part of an append (a short write): none of it is acknowledged or counts as seen, the torn
    bytes are cut, and once there is room the same events are taken whole, readable and after a restart."""
    inbox = Inbox(small_disk / "inbox")
    first = inbox.offer([FileEvent("/landing/first.csv", 5, 1)])
    log = small_disk / "inbox" / LOG_NAME
    durable = log.stat().st_size
    filler = _fill(small_disk, leave=0)  # the log's last page still has room for the start of the next append
    events = [FileEvent(f"/landing/f{i:04d}.csv", 5, 2) for i in range(100)]
    events.append(FileEvent("/landing/first.csv", 0, 3, removed=True))
    with pytest.raises(SpoolWriteError) as refused:
        inbox.offer(events)
    assert refused.value.no_space and str(log) in str(refused.value)
    assert log.stat().st_size == durable, "the torn bytes were cut back"
    assert len(inbox) == 1 and inbox.present("/landing/first.csv")  # the refused removal is not taken either
    filler.unlink()
    taken = inbox.offer(events)  # the SQS redelivery, the next listing
    assert [r.offset for r in taken] == list(range(1, 102))
    assert _inbox_records(small_disk / "inbox") == [(r.offset, r.path, r.removed) for r in first + taken]
    inbox.close()
    reopened = Inbox(small_disk / "inbox")  # the daemon's restart
    assert len(reopened) == 102 and reopened.offer(events) == [] and not reopened.present("/landing/first.csv")
    reopened.close()


def test_file_events_a_full_disk_refused_are_taken_when_offered_again(small_disk):
    inbox = Inbox(small_disk / "inbox")  # an empty log: not a byte of room for it
    filler = _fill(small_disk, leave=0)
    landed = FileEvent("/landing/a.csv", 5, 123)
    with pytest.raises(SpoolWriteError) as refused:
        inbox.offer([landed])
    assert refused.value.no_space
    assert len(inbox) == 0 and not inbox.present(landed.path) and inbox.listed("/landing") == []
    filler.unlink()
    assert [r.offset for r in inbox.offer([landed])] == [0]  # not skipped as seen
    assert inbox.offer([landed]) == []  # and then only once
    assert _inbox_records(small_disk / "inbox") == [(0, "/landing/a.csv", False)]
    inbox.close()


def test_a_push_that_finds_the_disk_full_gets_507_and_every_202_survives(small_disk, tmp_path):
    path = write_config(tmp_path, [{"name": "orders", "push": [{"name": "api", "tokens_sha256": [token_hash("t")]}]}],
                        state_dir=str(small_disk / "state"))
    cfg = config.load(path)
    entity = cfg.entity("orders")
    endpoint = Endpoint.open(entity, entity.push[0], lambda: None)
    api = PushApi([endpoint], cfg.http.max_body_bytes)
    server = HttpServer(cfg.http, api.routes())
    host, port = server.start().split("://")[1].split(":")
    accepted, refused = [], []
    try:
        filler = _fill(small_disk, leave=64 * 1024)
        for i in range(200):
            body = json.dumps([{"id": i, "pad": "x" * 2000} for _ in range(5)]).encode()
            conn = http.client.HTTPConnection(host, int(port), timeout=30)
            conn.request("POST", "/v1/entities/orders/sources/api/records", body=body,
                         headers={"Authorization": "Bearer t", "Content-Type": "application/json",
                                  "Idempotency-Key": f"r{i}"})
            resp = conn.getresponse()
            answer = json.loads(resp.read())
            conn.close()
            if resp.status == 202:
                accepted.append(i)
            else:
                assert resp.status == 507 and int(resp.getheader("Retry-After")) > 0, (resp.status, answer)
                assert "nothing was stored" in answer["error"]
                refused.append(i)
                if len(refused) == 3:
                    break
        assert accepted and len(refused) == 3
        filler.unlink()
    finally:
        server.stop()
        api.close()
    reader = SpoolReader(entity.spool("api"))
    entries = reader.entries(0, reader.refresh())
    assert [e.key for e in entries] == [f"r{i}" for i in accepted]
    ids = [row["id"] for e in entries for row in read_entry(entity.spool("api"), e).to_pylist()]
    assert ids == [i for i in accepted for _ in range(5)]


def test_a_lake_on_a_full_disk_holds_the_batch_until_space_comes_back_and_loses_nothing(tmp_path):
    """The lake's disk fills up under a running daemon: the batch is tried again (batch.retrying), the pushes
    it holds stay in the spool (another disk), and once there is room every acknowledged record lands once."""
    import sys

    from deltalake import DeltaTable

    from tests.conftest import wait_for
    from tests.test_daemon_process import Daemon, _table_rows

    lake = tmp_path / "lake"
    lake.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(lake)], check=True)
    try:
        path = write_config(tmp_path, [{"name": "orders", "push": [{"name": "api",
                                                                      "tokens_sha256": [token_hash("t")]}]}],
                            lake_dir=str(lake), spark={"master": "local[2]", "trigger_interval_s": 0.3})
        daemon = Daemon(path, tmp_path / "daemon.log")
        daemon.start()
        url = json.loads((tmp_path / "state" / "http.json").read_text())["url"]
        host, port = url.split("://")[1].split(":")

        def push(first: int) -> None:
            body = json.dumps([{"id": i, "pad": "x" * 100} for i in range(first, first + 100)]).encode()
            conn = http.client.HTTPConnection(host, int(port), timeout=30)
            conn.request("POST", "/v1/entities/orders/sources/api/records", body=body,
                         headers={"Authorization": "Bearer t", "Content-Type": "application/json"})
            assert conn.getresponse().status == 202
            conn.close()

        table = lake / "orders" / "table"
        push(0)
        # The table's folder holds the task's data files before its first commit: count rows, not folders.
        wait_for(lambda: _table_rows(table) == 100, 90, 0.2, "the first request's records")
        filler = _fill(lake, leave=0)
        for first in range(100, 1000, 100):
            push(first)  # acknowledged: the spool is on another disk
        wait_for(lambda: daemon.events("batch.retrying") > 0, 90, 0.2, "a batch waiting for space")
        assert daemon.proc.poll() is None
        filler.unlink()
        wait_for(lambda: DeltaTable(str(table)).to_pyarrow_table().num_rows >= 1000, 120, 0.3, "every record")
        daemon.stop()
        ids = sorted(DeltaTable(str(table)).to_pyarrow_table()["id"].to_pylist())
        assert ids == list(range(1000))  # every acknowledged record, once
        verify = subprocess.run([sys.executable, "-m", "lakefeed", "verify", "--config", str(path)],
                                capture_output=True, text=True, timeout=300)
        assert verify.returncode == 0, verify.stdout + verify.stderr
    finally:
        subprocess.run(["pkill", "-f", str(path)], check=False)
        subprocess.run(["umount", "-l", str(lake)], check=True)
