"""Delta table state benchmark: what long-lived writers' table objects cost per commit, in memory and time.

The daemon keeps one writer per table for its whole life (two or more tables an entity) and commits a batch at a
time. Each variant makes `--commits` one-batch commits (a few rows, an application transaction, the batch's
metadata, a check of the app's committed version first, as the daemon does) to each of `--tables` new local tables,
a round at a time (one commit to each table), in a process of its own:

* kept (the baseline, what a delta-rs user writes): one `deltalake.DeltaTable` object per table for the run,
  brought up to date before each check, every append written through it;
* lakefeed: one `connectors/sinks/delta_rs.DeltaRsSink` per table, which checkpoints the table and loads it afresh
  once its object is `RELOAD_AFTER` versions past its load;
* compacted: the same writers, each table compacted every `--compact-every` commits as the daemon does
  (daemon/pipeline/compaction.py), so that it holds a few files rather than one a commit.

Reported per variant: seconds, commits/s, the resident set (VmRSS) growth from the `--settle`-th round to the end
(the first commits set up delta-rs's runtime and DataFusion, which every process pays once), that growth per commit
in KiB, the growth over the last half of the run (flat means bounded), and the last tenth of the rounds' time over
the first tenth's (1 when a commit costs the same all along), the files the tables hold at the end, and the time
to load and read every table then (a reader's cost). Ratios are lakefeed over kept, and compacted over lakefeed.
The run checks that each table holds every row and the app's last version. One JSON object goes to stdout.

    python bench/delta_state.py [--tables 40] [--commits 200] [--settle 20] [--compact-every 50] [--workdir DIR]
                                [--keep] [--smoke]

`--smoke`: 4 tables x 30 commits, settle 5, compacted every 10.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _common import BenchError, parse_args, publish, ratio, say, workdir

REPO = Path(__file__).resolve().parent.parent
APP = "bench"
VARIANTS = ("kept", "lakefeed", "compacted")


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise BenchError("no VmRSS in /proc/self/status")


def run_variant(variant: str, work: Path, tables: int, commits: int, settle: int, every: int) -> dict:
    """Make the commits in this process, a round at a time (one commit to each table); return its figures."""
    import pyarrow as pa
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

    from lakefeed.connectors.sinks.delta_rs import DeltaRsSink

    rows = pa.table({"id": [1, 2, 3], "name": ["a", "b", "c"]})
    uris = [str(work / f"t{i:02d}") for i in range(tables)]
    sinks = [DeltaRsSink(uri) for uri in uris]
    kept: list[DeltaTable | None] = [None] * tables
    samples: list[float] = []
    rounds: list[float] = []
    start = time.perf_counter()
    for batch in range(commits):
        began = time.perf_counter()
        metadata = {"lakefeed.batch_id": str(batch), "lakefeed.app_id": APP}
        for i, uri in enumerate(uris):
            if variant != "kept":
                if (sinks[i].committed_version(APP) or -1) >= batch:
                    raise BenchError(f"batch {batch} found committed before its commit")
                sinks[i].append(rows, APP, batch, metadata)
                if variant == "compacted" and (batch + 1) % every == 0:
                    sinks[i].compact(128 << 20)
                continue
            table = kept[i]
            if table is not None:
                table.update_incremental()
                if (table.transaction_version(APP) or -1) >= batch:
                    raise BenchError(f"batch {batch} found committed before its commit")
            write_deltalake(table or uri, rows, mode="append",
                            commit_properties=CommitProperties(custom_metadata=metadata,
                                                               app_transactions=[Transaction(APP, batch)]))
            if table is None:
                kept[i] = DeltaTable(uri)
        rounds.append(time.perf_counter() - began)
        if batch + 1 >= settle:
            samples.append(rss_mib())
    seconds = time.perf_counter() - start
    read_from = time.perf_counter()  # what a reader pays at the end: each table loaded and read whole
    finals = [DeltaTable(uri) for uri in uris]
    held = sum(t.to_pyarrow_table().num_rows for t in finals)
    read_seconds = time.perf_counter() - read_from
    committed = {t.transaction_version(APP) for t in finals}
    half = samples[len(samples) // 2:]
    tenth = max(1, commits // 10)
    return {"seconds": round(seconds, 3), "rss_settled_mib": round(samples[0], 1),
            "rss_end_mib": round(samples[-1], 1), "growth_mib": round(samples[-1] - samples[0], 1),
            "growth_per_commit_kib": round((samples[-1] - samples[0]) * 1024 / max(1, len(samples) - 1) / tables, 2),
            "growth_last_half_mib": round(half[-1] - half[0], 1),
            "commits_per_s": round(commits * tables / seconds, 1),
            # the last tenth of the rounds against the first: 1 when a commit costs the same all along
            "round_time_last_over_first": round(sum(rounds[-tenth:]) / sum(rounds[:tenth]), 3),
            "ok": held == tables * commits * rows.num_rows and committed == {commits - 1},
            "rows": held, "committed_versions": sorted(v for v in committed if v is not None),
            "files_at_end": sum(len(t.file_uris()) for t in finals), "read_seconds": round(read_seconds, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", type=int, default=40)
    parser.add_argument("--commits", type=int, default=200, help="per table")
    parser.add_argument("--settle", type=int, default=20, help="rounds before the resident set is first read")
    parser.add_argument("--compact-every", type=int, default=50, help="commits to a table between compactions")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # the child's
    args = parse_args(parser, argv, {"tables": 4, "commits": 30, "settle": 5, "compact_every": 10})
    if args.variant:
        print(json.dumps(run_variant(args.variant, args.workdir, args.tables, args.commits, args.settle,
                                     args.compact_every)), flush=True)
        # Not a return: about one exit in five of such a process then aborts in a native library's teardown
        # ("terminate called without an active exception"), after the figures are out.
        os._exit(0)
    if args.settle >= args.commits:
        parser.error("--settle must be below --commits")
    work, remove = workdir(parser, args.workdir, args.keep, "lakefeed-delta-state-")
    report: dict = {"bench": "delta_state", "smoke": args.smoke, "tables": args.tables, "commits": args.commits,
                    "settle": args.settle, "compact_every": args.compact_every,
                    "cores": os.cpu_count(), "load_before": os.getloadavg()[0], "variants": {}}
    try:
        for variant in VARIANTS:
            say(f"{variant}: {args.tables} tables x {args.commits} commits")
            child = subprocess.run(
                [sys.executable, __file__, "--variant", variant, "--tables", str(args.tables),
                 "--commits", str(args.commits),
                 "--settle", str(args.settle), "--compact-every", str(args.compact_every),
                 "--workdir", str(work / variant)],
                capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"}, check=False)
            if child.returncode != 0:
                raise BenchError(f"variant {variant} exited with {child.returncode}: {child.stderr[-3000:]}")
            report["variants"][variant] = json.loads(child.stdout.splitlines()[-1])
        kept, ours = report["variants"]["kept"], report["variants"]["lakefeed"]
        report["ratio_seconds_lakefeed_vs_kept"] = ratio(ours["seconds"], kept["seconds"])
        report["ratio_growth_lakefeed_vs_kept"] = ratio(max(ours["growth_mib"], 0.1), max(kept["growth_mib"], 0.1))
        compacted = report["variants"]["compacted"]
        report["ratio_seconds_compacted_vs_lakefeed"] = ratio(compacted["seconds"], ours["seconds"])
        report["ratio_read_compacted_vs_lakefeed"] = ratio(compacted["read_seconds"], ours["read_seconds"])
        report["ratio_growth_compacted_vs_lakefeed"] = ratio(max(compacted["growth_mib"], 0.1),
                                                             max(ours["growth_mib"], 0.1))
        report["ok"] = kept["ok"] and ours["ok"] and compacted["ok"]
    except BenchError as e:
        report["error"] = str(e)
        report["ok"] = False
    report["load_after"] = os.getloadavg()[0]
    publish(report, work, remove)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
