from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakefeed.inbox.files import DAMAGED, FileEvent, Inbox, InboxCursor, InboxReader


def test_offer_is_durable_dense_and_never_enqueues_an_identity_twice(tmp_path):
    inbox = Inbox(tmp_path)
    a, b = FileEvent("/l/a.csv", 10, 1), FileEvent("/l/b.csv", 20, 2)
    assert [r.offset for r in inbox.offer([a, b, a])] == [0, 1]
    assert inbox.offer([a]) == []
    rewritten = FileEvent("/l/a.csv", 11, 3)  # same path, new content: a new identity
    assert [r.offset for r in inbox.offer([rewritten])] == [2]
    inbox.close()
    reopened = Inbox(tmp_path)
    assert len(reopened) == 3
    assert reopened.offer([a, b, rewritten]) == []


def test_a_removal_is_taken_once_and_a_file_back_after_it_again(tmp_path):
    inbox = Inbox(tmp_path)
    a = FileEvent("/l/a.csv", 10, 1)
    gone = FileEvent("/l/a.csv", 0, 5, removed=True)
    assert len(inbox.offer([a, gone])) == 2
    assert inbox.offer([gone]) == []  # a removal delivered twice
    assert not inbox.present("/l/a.csv") and inbox.listed("/l") == []
    assert [r.offset for r in inbox.offer([a])] == [2]  # the same file back after its removal
    inbox.close()
    reopened = Inbox(tmp_path)
    assert reopened.present("/l/a.csv") and reopened.listed("/l") == ["/l/a.csv"] and reopened.listed("/m") == []
    assert reopened.offer([a, gone]) == []


def test_torn_last_line_is_dropped_on_open(tmp_path):
    inbox = Inbox(tmp_path)
    inbox.offer([FileEvent("/l/a.csv", 1, 1)])
    inbox.close()
    with open(tmp_path / "inbox.log", "ab") as f:
        f.write(b'{"o": 1, "p": "/l/b.c')  # a crash in the middle of an append
    reader = InboxReader(tmp_path)
    assert reader.refresh() == 1  # readers never see an incomplete record
    inbox = Inbox(tmp_path)
    assert len(inbox) == 1
    assert [r.offset for r in inbox.offer([FileEvent("/l/b.csv", 2, 2)])] == [1]
    assert [r.path for r in InboxReader(tmp_path).records(0, 2)] == ["/l/a.csv", "/l/b.csv"]


def test_damaged_lines_inside_the_log_neither_stop_it_opening_nor_move_offsets(tmp_path):
    """A tear an earlier lakefeed left inside the log (a short write followed by the record written again) and a
    line the disk damaged: the log opens, the record after a tear is read with its line's offset, a line past
    saving is a record of the damage (its file is not seen, so a listing offers it again), later offsets hold."""
    inbox = Inbox(tmp_path)
    inbox.offer([FileEvent("/l/a.csv", 1, 1)])
    inbox.close()
    b = '{"o": 1, "p": "/l/b.csv", "s": 2, "m": 2, "t": "2026-01-01T00:00:00.000Z"}'
    with open(tmp_path / "inbox.log", "ab") as f:
        f.write(b[:20].encode() + b.encode() + b"\n" + b'{"o": 2, "p": "/l/c.c\xff\x00garbage\n')
    inbox = Inbox(tmp_path)
    assert len(inbox) == 3 and not inbox.present("/l/c.csv")
    assert [r.offset for r in inbox.offer([FileEvent("/l/b.csv", 2, 2), FileEvent("/l/d.csv", 4, 4)])] == [3]
    records = InboxReader(tmp_path).records(0, 4)
    assert [(r.offset, r.path) for r in records[:2]] == [(0, "/l/a.csv"), (1, "/l/b.csv")]
    assert records[2].offset == 2 and records[2].path.startswith(DAMAGED) and "inbox line 2 is damaged" in \
        records[2].problem
    assert (records[3].offset, records[3].path) == (3, "/l/d.csv")


def test_a_damaged_line_holding_a_carriage_return_moves_no_later_offset_when_the_log_opens(tmp_path):
    """Lines end at \n alone, for the writer opening the log as for its readers: a damaged line holding \r is one
    line, so the record rescued after a later tear keeps its offset and is seen, not offered (and taken) again."""
    inbox = Inbox(tmp_path)
    inbox.offer([FileEvent("/l/a.csv", 1, 1)])
    inbox.close()
    c = '{"o": 2, "p": "/l/c.csv", "s": 3, "m": 3, "t": "2026-01-01T00:00:00.000Z"}'
    with open(tmp_path / "inbox.log", "ab") as f:
        f.write(b'{"o": 1, \r damaged\n' + c[:20].encode() + c.encode() + b"\n")
    inbox = Inbox(tmp_path)
    assert len(inbox) == 3 and inbox.present("/l/c.csv")
    assert inbox.offer([FileEvent("/l/c.csv", 3, 3)]) == []
    assert [r.offset for r in inbox.offer([FileEvent("/l/d.csv", 4, 4)])] == [3]
    records = InboxReader(tmp_path).records(0, 4)
    assert [r.offset for r in records] == [0, 1, 2, 3] and records[1].path.startswith(DAMAGED)
    assert [r.path for r in records[2:]] == ["/l/c.csv", "/l/d.csv"]


def test_reader_reads_incrementally_and_by_range(tmp_path):
    inbox = Inbox(tmp_path)
    reader = InboxReader(tmp_path)
    assert reader.refresh() == 0
    inbox.offer([FileEvent(f"/l/{i}.csv", i, i) for i in range(5)])
    assert reader.refresh() == 5
    inbox.offer([FileEvent("/l/late.csv", 9, 9)])
    assert [r.offset for r in reader.records(3, 6)] == [3, 4, 5]
    assert reader.records(6, 6) == []
    assert reader.refresh() == 6


def test_more_records_than_one_writev_takes_are_all_written(tmp_path):
    """writev takes at most IOV_MAX (1024) buffers: a group commit of more pushes, or a long listing, is written
    in several calls, all of it, and made durable once."""
    from lakefeed.inbox.segments import write_durably

    frames = [f"{i:05d}\n".encode() for i in range(3000)]
    fd = os.open(tmp_path / "log", os.O_RDWR | os.O_CREAT)
    try:
        write_durably(fd, frames, 0)
    finally:
        os.close(fd)
    assert (tmp_path / "log").read_bytes() == b"".join(frames)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 12), st.booleans()), min_size=1, max_size=12), st.integers(1, 40))
def test_the_cursor_reads_what_the_reader_reads_batch_after_batch_and_again_after_a_replay(tmp_path_factory, steps,
                                                                                           total):
    """The daemon reads a file batch's records with a cursor (no index of every record): ranges one after the other,
    a range read again (a batch replayed after a restart) from the log's start. A damaged line holding `\\r` is one
    record, as the offsets count it."""
    folder = tmp_path_factory.mktemp("inbox")
    inbox = Inbox(folder)
    inbox.offer([FileEvent(f"/l/{i}.csv", i, i) for i in range(total)])
    inbox.close()
    with open(folder / "inbox.log", "ab") as f:
        f.write(b'{"o": \r damaged\n')
    Inbox(folder).close()  # reopened: the line is counted, and durable for readers
    total += 1
    reader, cursor, end = InboxReader(folder), InboxCursor(folder), 0
    for size, replay in steps:
        start = max(0, end - size) if replay else end
        end = min(total, start + size)
        assert cursor.records(start, end) == reader.records(start, end), (start, end)
    assert [r.offset for r in cursor.records(0, total)] == list(range(total))
    assert cursor.records(total - 1, total)[0].path.startswith(DAMAGED)
    with pytest.raises(OSError, match="ends before record"):
        cursor.records(total - 1, total + 1)
