"""An input whose reader crashes the process (a C library's segfault, a worker the kernel kills for memory) must not
stand a stream still: a real daemon on local Spark, the task's Python worker SIGKILLed each time it reaches the
input (`poison:` failpoint), as such an input would. The unit is quarantined with the reason, the rest of its batch
and everything after it commit, and the daemon stays up. Before, Spark's "Python worker exited unexpectedly"
counted as a store fault and the batch was tried again for ever."""

from __future__ import annotations

import base64
import signal

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from lakefeed.config import model as config_module
from lakefeed.inbox import spool
from lakefeed.intake.push_api import token_hash
from tests.conftest import entity_yaml, land, wait_for, write_config
from tests.test_daemon_process import Daemon
from tests.test_push_daemon import TOKEN, _post, _url


def _rows(table) -> list[dict]:
    return DeltaTable(str(table)).to_pyarrow_table().to_pylist() if DeltaTable.is_deltatable(str(table)) else []


@pytest.mark.parametrize("master", ["local[2]", "local-cluster[2,1,1024]"])  # on a cluster, Spark tries a task 4 times
def test_a_landed_file_the_reader_dies_on_is_quarantined_and_its_batch_commits(tmp_path, master):
    config = write_config(tmp_path, [entity_yaml()], spark={"master": master, "trigger_interval_s": 0.3})
    landing = tmp_path / "landing" / "sales"
    for n, name in enumerate(("a", "poison", "c")):  # one batch: they are there before the start
        land(landing / f"{name}.csv", f"id,note\n{n},{name}\n")
    cfg = config_module.load(config).entities[0]
    with Daemon(config, tmp_path / "daemon.log") as daemon:
        daemon.start(env={"LAKEFEED_FAILPOINT": "poison:stage.file:poison"})
        wait_for(lambda: len(_rows(cfg.table)) == 2, 120, what="the batch's other files committed")
        [parked] = wait_for(lambda: _rows(cfg.quarantine), 30, what="the file quarantined")
        assert parked["source_file"] == "sales/poison.csv" and parked["raw"] == ""
        assert "the task staging it died each time, alone too" in parked["reason"]
        assert "Python worker exited unexpectedly" in parked["reason"]
        assert sorted(r["note"] for r in _rows(cfg.table)) == ["a", "c"]
        land(landing / "d.csv", "id,note\n3,d\n")  # the stream goes on
        wait_for(lambda: len(_rows(cfg.table)) == 3, 60, what="a later file committed")
        assert daemon.events("batch.task_died") >= 1 and daemon.events("file.unstaged") == 1
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(90) == 0


@pytest.mark.parametrize("strategy", ["append", "upsert"])
def test_a_push_frame_the_decoder_dies_on_is_quarantined_as_acknowledged(tmp_path, strategy):
    """Upsert: a batch of a few frames is one task that stages and reduces them (keyed.in_one_task); it dies too,
    and the batch is staged as any other."""
    entity = {"name": "events", "push": [{"name": "api", "tokens_sha256": [token_hash(TOKEN)]}]}
    if strategy == "upsert":
        entity["cdc"] = {"strategy": "upsert", "primary_key": ["id"]}
    config = write_config(tmp_path, [entity], spark={"master": "local[2]", "trigger_interval_s": 2.0})
    cfg = config_module.load(config).entities[0]
    with Daemon(config, tmp_path / "daemon.log") as daemon:
        daemon.start(env={"LAKEFEED_FAILPOINT": "poison:stage.frame:poison"})
        url = wait_for(lambda: _url(tmp_path), 60, what="the push API")
        _post(url, [{"id": 0, "v": "first"}], key="warm", starting_for=60)
        wait_for(lambda: len(_rows(cfg.table)) == 1, 60, what="the first push committed")
        # Three frames within one trigger interval: one batch.
        _post(url, [{"id": 1, "v": "a"}], key="k-1")
        poison = _post(url, [{"id": 2, "v": "b"}, {"id": 3, "v": "c"}], key="poison-1")
        _post(url, [{"id": 4, "v": "d"}], key="k-3")
        wait_for(lambda: len(_rows(cfg.table)) == 3, 120, what="the batch's other frames committed")
        [parked] = wait_for(lambda: _rows(cfg.quarantine), 30, what="the frame quarantined")
        assert parked["source_file"] == f"push/api/{poison['batch']}"
        assert "the task staging it died each time, alone too" in parked["reason"]
        frame = base64.b64decode(parked["raw"])  # the frame as acknowledged, not decoded: decoding it crashes
        _, head, body, _ = spool._HEAD.unpack_from(frame)
        acknowledged = pa.ipc.open_stream(frame[spool._HEAD.size + head:]).read_all()
        assert acknowledged.num_rows == 2 and acknowledged.to_pylist()[0]["v"] == "b"
        assert sorted(r["v"] for r in _rows(cfg.table)) == ["a", "d", "first"]
        _post(url, [{"id": 5, "v": "e"}], key="k-4")  # the stream goes on
        wait_for(lambda: len(_rows(cfg.table)) == 4, 60, what="a later push committed")
        assert daemon.events("batch.task_died") >= 1 and daemon.events("frame.unstaged") == 1
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(90) == 0
