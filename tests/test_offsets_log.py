from __future__ import annotations

from structlog.testing import capture_logs

from lakefeed.ops.offsets_log import batch_range


def test_a_range_the_offsets_log_does_not_hold_as_the_daemon_reads_it_is_none_and_said_once(tmp_path):
    """A batch's entry in another format (or gone) gives no range, so the batch's records are collected from its
    frame instead; the checkpoint's log says so once, not at every batch."""
    offsets = tmp_path / "offsets"
    offsets.mkdir()
    (offsets / "0").write_text('v1\n{"batchWatermarkMs":0,"batchTimestampMs":1}\n{"offset":3}\n')
    (offsets / "1").write_text('v1\n{"batchWatermarkMs":0,"batchTimestampMs":2}\n{"offset":7}\n')
    (offsets / "2").write_text('v2\n{"batchWatermarkMs":0,"batchTimestampMs":3}\n0:{"offset":9}\n')
    assert batch_range(tmp_path, 0) == (0, 3) and batch_range(tmp_path, 1) == (3, 7)
    with capture_logs() as logs:
        assert batch_range(tmp_path, 2) is None and batch_range(tmp_path, 3) is None  # a format it does not read; gone
        assert batch_range(tmp_path, 1) == (3, 7)
    assert [(e["event"], e["batch_id"]) for e in logs] == [("stream.offsets_unread", 2)]
