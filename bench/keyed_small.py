"""Small keyed batches: one Spark job a batch (the stage task reduces too) against two, in one run.

A keyed entity's batch that is one stage task (one landed file; a push batch of a few frames) is reduced by that
task as well (daemon/pipeline/keyed.py, `stage_and_reduce`): one Spark job. The baseline is what lakefeed ran
before, and still runs for a batch of several tasks: a job that stages the rows, then a job of a task per bucket
of keys that reduces them. Both run here on the same Spark session (the daemon's settings, `--master`, default
local[2]), each on an entity of its own (upsert, `sequence_by`), the baseline with `keyed.in_one_task` declining
its batches, alternating batch by batch so that the machine's drift hits both alike.

Each round lands one CSV file of `--rows` changes to `--keys` keys for each entity and runs it as one batch through
`EntityPipeline.process` (discovery, tasks, the MERGE, changelog, tombstones, compaction check, manifests and the
ODF chain). The first `--warm` rounds are not counted. Reported per way: the median, p90 and mean seconds a batch
and the Spark jobs a batch started; the ratio of the medians (fused over two jobs) and of the means. Both entities'
tables must end equal, with each key at its last change. One JSON object goes to stdout.

    python bench/keyed_small.py [--rounds 40] [--warm 5] [--rows 200] [--keys 50] [--master local[2]]
                                [--workdir DIR] [--keep] [--smoke]

`--smoke`: 4 rounds, 1 warm, 20 rows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from _common import BenchError, parse_args, publish, ratio, say, workdir

WAYS = ("fused", "two_jobs")


def _config(work: Path, master: str) -> Path:
    import yaml

    entities = [{"name": way, "source": {"type": "local_dir", "path": "landing"},
                 "manifest": "landing/default.manifest.cdm.json",
                 "patterns": [{"name": "all", "root_location": way, "glob_pattern": "/*.csv"}],
                 "format": {"kind": "csv", "header": True},
                 "cdc": {"strategy": "upsert", "primary_key": ["key"], "sequence_by": ["seq"]}} for way in WAYS]
    doc = {"lake_dir": "lake", "state_dir": "state", "log_level": "WARNING", "spark": {"master": master},
           "http": {"host": "127.0.0.1", "port": 0}, "entities": entities}
    path = work / "lakefeed.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


class Counted:
    """A spread that counts the Spark jobs it starts."""

    def __init__(self, spread) -> None:
        self.spread, self.jobs = spread, 0

    @property
    def width(self) -> int:
        return self.spread.width

    def map(self, work, jobs, description):
        self.jobs += 1 if jobs else 0
        return self.spread.map(work, jobs, description)


def run(args: argparse.Namespace, work: Path) -> dict:
    from deltalake import DeltaTable

    from lakefeed import log
    from lakefeed.config import model as config
    from lakefeed.inbox.files import FileEvent, Inbox
    from lakefeed.ops import spark as spark_module
    from lakefeed.pipeline import keyed
    from lakefeed.pipeline.entity import EntityPipeline
    from lakefeed.pipeline.sinks import Sinks

    log.configure_once()
    lake = config.load(_config(work, args.master))
    spark = spark_module.session(lake.spark)
    spark_module.warm_up(spark)
    one_task = keyed.in_one_task
    pipelines, inboxes, spreads = {}, {}, {}
    for cfg in lake.entities:
        cfg.checkpoint.mkdir(parents=True)
        (cfg.checkpoint / "metadata").write_text(json.dumps({"id": f"bench-{cfg.name}"}))
        pipeline = EntityPipeline(cfg, Sinks.of(cfg))
        pipeline.spread = spreads[cfg.name] = Counted(spark_module.SparkSpread(spark))
        pipeline.prepare()
        pipelines[cfg.name], inboxes[cfg.name] = pipeline, Inbox(cfg.state / "inbox")
    seconds: dict[str, list[float]] = {way: [] for way in WAYS}
    jobs: dict[str, list[int]] = {way: [] for way in WAYS}
    last: dict[int, int] = {}
    for n in range(args.rounds):
        lines = [(n * args.rows + i) % args.keys for i in range(args.rows)]
        text = "key,seq,value\n" + "".join(f"{k},{n * args.rows + i},v{n}-{i}\n" for i, k in enumerate(lines))
        for i, k in enumerate(lines):
            last[k] = n * args.rows + i
        for way in (WAYS if n % 2 else WAYS[::-1]):
            cfg = pipelines[way].cfg
            path = cfg.source.path / way / f"r{n:04d}.csv"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.with_suffix(".tmp").write_text(text)
            path.with_suffix(".tmp").rename(path)
            records = inboxes[way].offer([FileEvent.of(path)])
            keyed.in_one_task = one_task if way == "fused" else _declined(one_task)
            before = spreads[way].jobs
            began = time.perf_counter()
            pipelines[way].process(records, n)
            if n >= args.warm:
                seconds[way].append(time.perf_counter() - began)
                jobs[way].append(spreads[way].jobs - before)
        keyed.in_one_task = one_task
    spark.stop()
    out: dict = {"ways": {}}
    for way in WAYS:
        s = sorted(seconds[way])
        out["ways"][way] = {"median_s": round(statistics.median(s), 4), "p90_s": round(s[int(0.9 * (len(s) - 1))], 4),
                            "mean_s": round(statistics.fmean(s), 4), "jobs_per_batch": statistics.fmean(jobs[way])}
    states = {way: {r["key"]: r["seq"] for r in DeltaTable(str(pipelines[way].cfg.table))
                    .to_pyarrow_table(columns=["key", "seq"]).to_pylist()} for way in WAYS}
    problems = [f"{way}: {len(state)} keys, {sum(state.get(k) != v for k, v in last.items())} not at their last "
                f"change" for way, state in states.items() if state != last]
    out["checks"] = {"ok": not problems, "problems": problems}
    return out


def _declined(one_task):
    """`keyed.in_one_task` as it was: a keyed batch is never reduced by its stage task."""
    def in_one_task(cfg, *args):
        return None if cfg.cdc.keyed else one_task(cfg, *args)
    return in_one_task


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40, help="batches for each entity")
    parser.add_argument("--warm", type=int, default=5, help="first rounds not counted")
    parser.add_argument("--rows", type=int, default=200, help="changes a batch")
    parser.add_argument("--keys", type=int, default=50)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--keep", action="store_true")
    args = parse_args(parser, argv, {"rounds": 4, "warm": 1, "rows": 20})
    if args.warm >= args.rounds:
        parser.error("--warm must be below --rounds")
    work, remove = workdir(parser, args.workdir, args.keep, "lakefeed-keyed-small-")
    report: dict = {"bench": "keyed_small", "smoke": args.smoke, "rounds": args.rounds, "warm": args.warm,
                    "rows": args.rows, "keys": args.keys, "master": args.master, "cores": os.cpu_count(),
                    "load_before": os.getloadavg()[0]}
    try:
        say(f"{args.rounds} rounds of {args.rows} changes, each way, on {args.master}")
        report.update(run(args, work))
        fused, two = report["ways"]["fused"], report["ways"]["two_jobs"]
        report["ratio_median_fused_vs_two_jobs"] = ratio(fused["median_s"], two["median_s"])
        report["ratio_mean_fused_vs_two_jobs"] = ratio(fused["mean_s"], two["mean_s"])
        report["ok"] = report["checks"]["ok"] and fused["jobs_per_batch"] == 1 and two["jobs_per_batch"] == 2
    except BenchError as e:
        report["error"] = str(e)
        report["ok"] = False
    report["load_after"] = os.getloadavg()[0]
    publish(report, work, remove)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
