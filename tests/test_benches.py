"""Every benchmark in bench/ still runs: each one in its smoke mode (`--smoke`: tiny sizes, the same code paths and
baselines as the full run, the same JSON report), with its key figures checked.

Each bench starts what it needs itself (the daemon, tansu, moto, SeaweedFS), as in a full run. A bench added to
bench/ without checks here fails until it gets some.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parent.parent
BENCHES = sorted(p.stem for p in (REPO / "bench").glob("*.py") if not p.name.startswith("_"))
# Generous: a smoke run takes seconds to about a minute (a few daemon start-ups on a busy machine), and each bench
# gives up by itself after 300 s (its --timeout in smoke mode), still printing its report.
TIMEOUT_S = 420.0
CLEAN_UP_S = 60.0  # after SIGINT: the bench's own clean-up stops its daemons and servers


def get(report: dict[str, Any], path: str) -> Any:
    value: Any = report
    for part in path.split("."):
        assert isinstance(value, dict) and part in value, f"no {path} in the report (at {part})"
        value = value[part]
    return value


def positive(report: dict[str, Any], *paths: str) -> None:
    for path in paths:
        value = get(report, path)
        assert isinstance(value, int | float) and not isinstance(value, bool), f"{path} = {value!r}"
        assert math.isfinite(value) and value > 0, f"{path} = {value!r}, expected a positive number"


def completed(report: dict[str, Any]) -> None:
    assert "error" not in report, report["error"]
    assert report["ok"] is True


def check_cdc_merge(r: dict[str, Any]) -> None:
    assert "error" not in r, r["error"]
    assert len(r["sizes"]) == 1
    for size in r["sizes"].values():
        assert size["checks"]["ok"], size["checks"]["problems"]
        positive(size, "ratio_lakefeed_vs_bare", "ratio_median", "ratio_paired_median", "ratio_if_same_merge_time",
                 "ratio_bare_cdf_vs_nocdf", "process_peak_ratio_lakefeed_vs_bare",
                 "variants.bare.seconds", "variants.lakefeed.seconds", "variants.bare_nocdf.seconds",
                 "variants.lakefeed.breakdown_s.merge_execute", "variants.lakefeed.breakdown_s.tombstones",
                 "variants.bare_spark.seconds", "ratio_bare_spark_vs_bare", "ratio_lakefeed_vs_faster_bare")
        assert size["variants"]["lakefeed"]["changes"] == size["checks"]["expected"]["change_feed_rows"]


def check_chaos(r: dict[str, Any]) -> None:
    completed(r)
    assert r["passed"] is True and r["problems"] == [], r["problems"]
    assert r["kills"] == r["kills_requested"] == 2 and r["broker_kills"] == 1
    assert r["kills_aimed"] == {"during start-up": 1, "after the first commit": 1}
    assert r["verify_ok"] is True and r["daemon_exit_code"] == 0
    records = r["records"]
    positive(records, "acknowledged_push", "landed_files", "produced_kafka", "expected", "found")
    assert records["found"] == records["expected"]
    assert records["missing"] == records["duplicated"] == records["never_sent_found"] == 0
    assert records["kafka_acknowledged_but_not_on_topic"] == records["quarantined"] == 0
    for entity in r["per_entity"].values():
        for source in ("push", "files", "kafka"):
            assert entity[source]["missing"] == entity[source]["duplicated"] == 0, (source, entity[source])
    assert r["topics"]["events"]["short"] == {}


def check_ingest_files(r: dict[str, Any]) -> None:
    completed(r)
    positive(r, "ratio", "ratio_vs_floor_with_changelog", "lakefeed_rows_per_s", "floor_rows_per_s",
             "floor_with_changelog_rows_per_s", "latency_p50_s", "latency_p99_s", "spark_peer_rows_per_s",
             "ratio_vs_spark_peer", "spark_peer_latency_p99_s")
    assert r["daemon_exit_code"] == 0 and r["spark_peer"]["exit_code"] == 0
    assert r["spark_peer"]["rows"] == r["rows"]
    assert r["batches"] >= 3  # 6 files, at most 2 per batch
    assert sum(c["rows"] for c in r["lakefeed_commits"]) == r["rows"] == r["files"] * r["rows_per_file"]
    # Where each batch's time went (`batch.timed`): every stage, and no more than the batch took.
    assert sum(b["rows"] for b in r["lakefeed_batches_from_log"]) == r["rows"]
    for b in r["lakefeed_batches_from_log"]:
        assert set(b["stages_s"]) == {"collect", "discover", "tasks", "commit", "compaction", "manifests"}, b
        assert 0 < sum(b["stages_s"].values()) <= b["batch_s"] + 0.01, b
    # The CPU of each step (bench/_row_costs.py), over every row of the files it read, and the ceiling they make.
    costs = r["row_costs"]
    assert costs["files"] == min(8, r["files"]) and costs["rows"] == costs["files"] * r["rows_per_file"]
    assert all(v > 0 for v in costs["cpu_us_per_row"].values()) and len(costs["cpu_us_per_row"]) == 8, costs
    assert math.isclose(costs["floor_cpu_us_per_row"] + costs["lakefeed_cpu_us_per_row"],
                        sum(costs["cpu_us_per_row"].values()), abs_tol=1e-3)
    ceiling = round(costs["floor_cpu_us_per_row"] / costs["lakefeed_cpu_us_per_row"], 3)
    assert r["ceiling"] == costs["ceiling"] == ceiling
    # The goal's budget: the floor's CPU a row over the goal ratio; the share of it the ODF slice's hashes take.
    assert math.isclose(costs["budget_cpu_us_per_row"], costs["floor_cpu_us_per_row"] / r["goal_ratio"], abs_tol=1e-3)
    hashes = costs["cpu_us_per_row"]["write: changelog slice hashes (ODF)"]
    assert math.isclose(costs["odf_hashes_over_budget"], hashes / costs["budget_cpu_us_per_row"], abs_tol=2e-3)


def check_scale_out(r: dict[str, Any]) -> None:
    completed(r)
    assert set(r["loads"]) == {"append", "keyed"} and r["spark_conf"] == {}
    positive(r, "machine.one_process_rows_per_s", "machine.two_processes_rows_per_s", "machine.speed_up")
    for load in r["loads"].values():
        positive(load, "speed_up", "speed_up_of_machine", "driver_over_tasks_cpu_per_row", "one_executor.rows_per_s",
                 "two_executors.rows_per_s", "two_executors.cpu_s.executor_python",
                 "two_executors.tasks_cpu_us_per_row")
        for run in (load["one_executor"], load["two_executors"]):
            assert run["rows"] == r["rows"] and run["batches"] >= 1
            assert all(v > 0 for v in run["warm_loads_rows_per_s"])  # the smoke makes none (--warm-loads 0)
            assert run["cpu_s"]["driver_jvm"] > 0  # the JVM counted as the JVM (not as the process that started it)


def check_memory(r: dict[str, Any]) -> None:
    completed(r)
    positive(r, "pss.total.max_mib", "pss.driver.max_mib", "pss.driver_jvm.max_mib", "pss.python_workers.max_mib",
             "pss.intake.max_mib", "startup_s")
    assert r["samples"] >= 2 and r["rows"] == (r["landed_files"] + r["pushes"]) * 20
    parts = r["tenths_mean_mib"]
    assert len(parts["total"]) == min(10, r["samples"])
    assert all(0 < v <= r["pss"]["total"]["max_mib"] for v in parts["total"])
    assert set(parts) == set(r["pss"])
    cores = r["cores_used"]
    assert cores["driver"] > 0 and cores["driver_jvm"] > 0 and 0 < cores["total"] <= r["cores"]
    assert abs(cores["total"] - sum(v for k, v in cores.items() if k != "total")) < 0.01


def check_kafka_ingest(r: dict[str, Any]) -> None:
    completed(r)
    positive(r, "ratio_vs_raw", "ratio_vs_raw_json", "steady_ratio_vs_raw", "cpu_ratio_raw_over_lakefeed",
             "lakefeed_per_s", "lakefeed_steady_per_s", "raw_consume_per_s", "raw_consume_json_per_s",
             "raw_consume_no_crc_check_per_s", "components.connector_read_per_s", "components.process_messages_per_s",
             "spark_peer.per_s", "ratio_vs_spark_peer")
    assert r["broker"].startswith("Apache Kafka") and r["spark_peer"]["exit_code"] == 0
    assert len(r["raw_rounds"]) == 2 and len(r["lakefeed_runs"]) == 1  # raw, lakefeed, raw
    assert r["lakefeed_runs"][0]["batches"] >= 2 and r["lakefeed_runs"][0]["exit_code"] == 0


def check_lifecycle(r: dict[str, Any]) -> None:
    completed(r)
    positive(r, "cold_start.ratio", "cold_start.median_ready_s", "cold_start.spark_session_baseline.median_s",
             "cold_start.with_2_entities.ready_s", "reload.reload_s", "reload.records_acked")
    reload = r["reload"]
    assert reload["records_lost"] == reload["duplicates"] == reload["unexpected_records"] == 0
    assert reload["exit_code"] == 0 and reload["drain_s"] is not None
    assert [c["change"].split(": ")[1] for c in reload["changes"]] == [
        "push source rate_limit_per_s", "event_time.allowed_lateness_s"]
    for change in reload["changes"]:
        positive(change, "reload_s")
    assert r["goals"]["changed_entity_restarted"] is True


def check_msc_upkeep(r: dict[str, Any]) -> None:
    completed(r)
    assert r["msc_lists_the_folder"] is True
    assert set(r["changes"]) == {"10", "100"}
    positive(r, "msc_generator.median_s", "msc_generator.bytes", "first_version_s",
             *(f"changes.{k}.{f}" for k in r["changes"] for f in ("update_s", "batch_s", "version_bytes")))
    assert all(v["version_bytes"] < r["msc_generator"]["bytes"] for v in r["changes"].values())


def check_manifest_check(r: dict[str, Any]) -> None:
    completed(r)
    assert set(r["sizes"]) == {"2000"}
    size = r["sizes"]["2000"]
    positive(r, "sizes.2000.floor_s", "sizes.2000.lakefeed.first_s", "sizes.2000.lakefeed.recheck_s",
             "sizes.2000.sdk.check_s", "sizes.2000.first_over_floor", "sizes.2000.sdk_over_lakefeed")
    assert size["lakefeed"]["manifest_bytes"] > 2000 * 100  # every file a partition


def check_push_api(r: dict[str, Any]) -> None:
    completed(r)
    phases = {"1", "100", "10000", "10000_ndjson", "10000_arrow"}
    assert set(r["closed_loop"]) == set(r["http_floor"]["closed_loop"]) == set(r["decode_floor"]) == phases
    for phase in phases:
        positive(r, f"ratios.requests_per_s_vs_http_floor.{phase}", f"ratios.records_per_s_vs_decode_floor.{phase}",
                 f"closed_loop.{phase}.records_per_s", f"http_floor.closed_loop.{phase}.records_per_s",
                 f"decode_floor.{phase}.records_per_s")
    for size in ("1", "100", "10000"):
        positive(r, f"fsync_floor.{size}.group_gain")
    positive(r, "open_loop_1k.acknowledged", "open_loop_1k.latency_ms.p99", "http_floor.open_loop.latency_ms.p99")
    for key in ("open_loop_p50_ms_minus_http_floor", "open_loop_p99_ms_minus_http_floor"):
        assert isinstance(r["ratios"][key], int | float), key
    assert r["daemon"]["exit_code"] == 0
    assert r["delta"]["visible_records"] >= r["delta"]["acked_records"] > 0


def check_read_engines(r: dict[str, Any]) -> None:
    positive(r, "pyarrow_speedup", "spark_rows_per_s", "pyarrow_rows_per_s", "spark_s", "pyarrow_s")
    assert r["rows"] == r["files"] * 2000


def check_s3_listing(r: dict[str, Any]) -> None:
    completed(r)
    assert r["failed_checks"] == []
    positive(r, "steady.ratio_full_over_narrowed_median", "steady.ratio_full_over_narrowed_min",
             "steady.objects_ratio", "first_full_reconcile.objects_per_s",
             "baselines.boto3_full.median_s", "baselines.boto3_narrowed.median_s", "baselines.pyarrow_full.median_s",
             *(f"shares.{k}" for k in r["shares"]))
    assert len(r["shares"]) == 4
    assert r["first_full_reconcile"]["found"] == r["keys"]
    assert r["lost_notifications"]["narrowed_found"] == 10


def check_delta_state(r: dict[str, Any]) -> None:
    completed(r)
    assert set(r["variants"]) == {"kept", "lakefeed", "compacted"}
    for variant in r["variants"].values():
        assert variant["ok"] is True
        assert variant["rows"] == 3 * r["commits"] * r["tables"] and variant["committed_versions"] == [r["commits"] - 1]
        positive(variant, "seconds", "commits_per_s", "rss_settled_mib", "rss_end_mib", "round_time_last_over_first")
    assert r["variants"]["lakefeed"]["files_at_end"] == r["commits"] * r["tables"]
    # Compacted every 10 of the smoke's 30 commits: the last compaction leaves each table one file.
    assert r["variants"]["compacted"]["files_at_end"] == r["tables"]
    positive(r, "ratio_seconds_lakefeed_vs_kept", "ratio_growth_lakefeed_vs_kept",
             "ratio_seconds_compacted_vs_lakefeed", "ratio_growth_compacted_vs_lakefeed",
             "ratio_read_compacted_vs_lakefeed")


def check_keyed_small(r: dict[str, Any]) -> None:
    completed(r)
    assert r["checks"]["ok"], r["checks"]["problems"]
    assert r["ways"]["fused"]["jobs_per_batch"] == 1 and r["ways"]["two_jobs"]["jobs_per_batch"] == 2
    for way in r["ways"].values():
        positive(way, "median_s", "p90_s", "mean_s")
    positive(r, "ratio_median_fused_vs_two_jobs", "ratio_mean_fused_vs_two_jobs")


def check_s3_notify(r: dict[str, Any]) -> None:
    """The smoke runs notification mode and the Spark peer; the listing mode is the same daemon with another source
    config (its listings are tested in test_s3_daemon.py, and measured by s3_listing's smoke)."""
    completed(r)
    positive(r, "notify_over_spark.p50")
    assert set(r["modes"]) == {"notify", "spark"}
    for mode in r["modes"].values():
        assert mode["exactly_once"] is True
        assert mode["latency_s"]["count"] == mode["files"] == 10
        positive(mode, "latency_s.p50", "latency_s.p99")
    positive(r["modes"]["notify"], "latency_seen_s.p50")
    assert r["modes"]["notify"]["daemon"]["exit_code"] == 0 and r["modes"]["spark"]["exit_code"] == 0
    assert r["modes"]["notify"]["daemon"]["sqs_receives"] > 0  # notified, not listed


CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "cdc_merge": check_cdc_merge,
    "chaos": check_chaos,
    "delta_state": check_delta_state,
    "ingest_files": check_ingest_files,
    "kafka_ingest": check_kafka_ingest,
    "keyed_small": check_keyed_small,
    "lifecycle": check_lifecycle,
    "manifest_check": check_manifest_check,
    "memory": check_memory,
    "msc_upkeep": check_msc_upkeep,
    "push_api": check_push_api,
    "read_engines": check_read_engines,
    "s3_listing": check_s3_listing,
    "s3_notify": check_s3_notify,
    "scale_out": check_scale_out,
}


def run_smoke(name: str) -> tuple[int, str, str]:
    """Run bench/NAME.py --smoke; on a timeout, SIGINT lets it stop what it started before it is killed."""
    proc = subprocess.Popen([sys.executable, str(REPO / "bench" / f"{name}.py"), "--smoke"], cwd=REPO,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=CLEAN_UP_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the bench and what it did not move out of it
            out, err = proc.communicate()
        pytest.fail(f"bench/{name}.py --smoke did not finish within {TIMEOUT_S:.0f} s\n{err[-5000:]}")
    return proc.returncode, out, err


@pytest.mark.parametrize("name", BENCHES)
def test_bench_smoke(name: str) -> None:
    assert name in CHECKS, f"bench/{name}.py has no checks in tests/test_benches.py"
    code, out, err = run_smoke(name)
    lines = [line for line in out.splitlines() if line.strip()]
    assert lines, f"bench/{name}.py printed nothing on stdout (exit {code})\n{err[-5000:]}"
    try:
        report = json.loads(lines[-1])
    except ValueError:
        pytest.fail(f"the last line of bench/{name}.py is not JSON: {lines[-1][:500]!r}\n{err[-5000:]}")
    assert code == 0, f"bench/{name}.py --smoke exited with {code}: {report.get('error')}\n{err[-5000:]}"
    assert report.get("smoke") is True, "the report does not say it was a smoke run"
    CHECKS[name](report)


SHARED_MEMORY_CHILD = r"""
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
static int child(void *arg) {  /* shares the parent's memory until a byte on stdin: then it execs */
    char c;
    if (read(0, &c, 1) == 1) execl("/bin/sleep", "sleep", "60", (char *) NULL);
    pause();
    return 0;
}
int main(void) {
    char *stack = malloc(1 << 16);
    int pid = clone(child, stack + (1 << 16), CLONE_VM | SIGCHLD, NULL);
    printf("%d\n", pid);
    fflush(stdout);
    waitpid(pid, NULL, 0);
    return 0;
}
"""


def test_a_child_that_has_its_parents_memory_is_counted_once(tmp_path, monkeypatch):
    """A child started with vfork (posix_spawn: how a JVM starts a process) has its parent's address space until it
    execs, and /proc shows it as its own: bench/memory.py counted the JVM twice in such a sample. Here a child made
    with clone(CLONE_VM) stays in that state until told to exec; the benches' process sampling counts its memory in
    the parent only, also when it execs just after its memory would have been read, and as its own once it has."""
    import importlib.util
    import pathlib
    import time

    spec = importlib.util.spec_from_file_location("bench_common", REPO / "bench" / "_common.py")
    assert spec is not None and spec.loader is not None
    common = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = common  # its dataclasses look their module up there
    spec.loader.exec_module(common)
    source, binary = tmp_path / "shared.c", tmp_path / "shared"
    source.write_text(SHARED_MEMORY_CHILD)
    subprocess.run(["cc", "-O1", "-o", str(binary), str(source)], check=True, timeout=120)
    parent = subprocess.Popen([str(binary)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              start_new_session=True)

    def execs() -> None:
        parent.stdin.write("x")
        parent.stdin.flush()
        deadline = time.monotonic() + 10
        while common.shares_memory(child, parent.pid):
            assert time.monotonic() < deadline, "the child did not exec"
            time.sleep(0.01)

    class ExecsOnceRead(pathlib.PosixPath):
        def read_text(self, *args, **kwargs):
            text = super().read_text(*args, **kwargs)
            if str(self) == f"/proc/{child}/smaps_rollup":
                execs()  # between the read and anything asked after it
            return text

    try:
        child = int(parent.stdout.readline())
        procs = common.session_processes(parent.pid, pss=True)
        assert set(procs) == {parent.pid, child}
        assert common.shares_memory(child, parent.pid) and not common.shares_memory(child, os.getpid())
        assert procs[parent.pid].pss_mib > 0 and procs[child].pss_mib == 0
        with monkeypatch.context() as patched:
            patched.setattr(common, "Path", ExecsOnceRead)
            raced = common.session_processes(parent.pid, pss=True)
        assert raced[parent.pid].pss_mib > 0 and raced[child].pss_mib == 0
        if common.shares_memory(child, parent.pid):
            execs()
        exec_ed = common.session_processes(parent.pid, pss=True)
        assert b"sleep" in exec_ed[child].cmdline and exec_ed[child].pss_mib > 0  # its own now
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
