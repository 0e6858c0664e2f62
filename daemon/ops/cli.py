"""The `lakefeed` command."""

from __future__ import annotations

import argparse
import csv
import json
import signal
import sys
from datetime import date, time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lakefeed import log
from lakefeed.config import model as config
from lakefeed.errors import ConfigError, TerminalError

if TYPE_CHECKING:
    from lakefeed.ops.supervisor import Supervisor

DEFAULT_CONFIG = "config/lakefeed.yaml"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lakefeed", description="Keep a data lake current, continuously.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the daemon")
    run.add_argument("--config", default=DEFAULT_CONFIG, help=f"config file (default {DEFAULT_CONFIG})")
    validate = sub.add_parser("validate", help="check a config file; print every problem as file:line: field: msg")
    validate.add_argument("file")
    verify = sub.add_parser("verify", help="check that each entity's changelog replays to its current table, its "
                            "manifests agree with its tables and its ODF chain holds (docs/odf.md)")
    verify.add_argument("--config", default=DEFAULT_CONFIG, help=f"config file (default {DEFAULT_CONFIG})")
    verify.add_argument("--entity", action="append", help="only this entity (repeatable)")
    query = sub.add_parser("query", help="print an entity's rows as at a system time and as of an event time, "
                           "from its changelog (docs/bitemporal.md)")
    query.add_argument("entity")
    query.add_argument("--as-at", help="system time, ISO 8601: what the lake held then (default: now)")
    query.add_argument("--as-of", help="event time, ISO 8601: count only the changes that had happened by then "
                       "(default: all)")
    query.add_argument("--format", choices=("table", "csv", "jsonl"), default="table", help="default table")
    query.add_argument("--limit", type=int, help="at most N rows, the first written")
    query.add_argument("--config", default=DEFAULT_CONFIG, help=f"config file (default {DEFAULT_CONFIG})")
    watermark = sub.add_parser("watermark", help="about event-time watermarks")
    wm_sub = watermark.add_subparsers(dest="watermark_command", required=True)
    advance = wm_sub.add_parser("advance", help="move an entity's watermark forward (e.g. for an idle source)")
    advance.add_argument("--config", default=DEFAULT_CONFIG, help=f"config file (default {DEFAULT_CONFIG})")
    advance.add_argument("--entity", required=True)
    advance.add_argument("--to", required=True, help="ISO 8601 time, e.g. 2024-05-01T00:00:00Z")
    sub.add_parser("openapi", help="print the HTTP API's OpenAPI document (docs/openapi.json)")
    sub.add_parser("token", help="make a bearer token for a push source and print it with its sha256 for the config")
    status = sub.add_parser("status", help="ask the running daemon how each entity is doing")
    status.add_argument("--config", default=DEFAULT_CONFIG, help=f"config file (default {DEFAULT_CONFIG})")
    status.add_argument("--url", help="the daemon's HTTP address (default: from state_dir/http.json)")
    status.add_argument("--json", action="store_true", help="print the /status document as is")
    compact = sub.add_parser("compact", help="have the running daemon compact (and vacuum) entities' tables now, "
                             "due or not, and wait until it has (README: Operations)")
    compact.add_argument("--config", default=DEFAULT_CONFIG, help=f"config file (default {DEFAULT_CONFIG}): the "
                         "daemon on its state_dir is asked")
    compact.add_argument("--entity", action="append", help="only this entity (repeatable; default: every entity)")
    compact.add_argument("--no-wait", action="store_true", help="only ask; GET /compact says when it is done")
    compact.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait (default 3600)")
    backfill = sub.add_parser("backfill", help="process everything pending (files, spooled pushes), then exit")
    backfill.add_argument("--config", default=DEFAULT_CONFIG, help=f"config file (default {DEFAULT_CONFIG})")
    manifest = sub.add_parser("manifest", help="about the CDM manifests lakefeed keeps")
    m_sub = manifest.add_subparsers(dest="manifest_command", required=True)
    show = m_sub.add_parser("show", help="list an entity's partitions as the manifest records them")
    show.add_argument("--config", default=DEFAULT_CONFIG, help=f"config file (default {DEFAULT_CONFIG})")
    show.add_argument("--entity", action="append", help="only this entity (repeatable)")
    show.add_argument("--json", action="store_true", help="print the manifest's entity objects as JSON")
    check = m_sub.add_parser("check", help="bring a CDM folder's manifest tree current once (as the CDM SDK's "
                             "fileStatusCheck), print what was done as JSON, and exit")
    check.add_argument("root_manifest", help="the root *.manifest.cdm.json")
    check.add_argument("--precedence", choices=("spec", "sdk"), default="spec",
                       help="which of several matching patterns finds a file: the last (spec) or the first (sdk)")
    cfg = sub.add_parser("config", help="about the configuration")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True)
    cfg_sub.add_parser("schema", help="print the config's JSON Schema")
    jars = sub.add_parser("jars", help="about Spark's jars from Maven Central (delta-spark, Kafka, s3a)")
    jars_sub = jars.add_subparsers(dest="jars_command", required=True)
    jars_sub.add_parser("fetch", help="resolve them once into the cache beside the venv, and archive the Spark "
                        "driver's classes there for a faster start (`make setup` does)")
    return parser


def _check_manifest(root: Path, precedence: str) -> int:
    from lakefeed.errors import ManifestError
    from lakefeed.manifests.cdm_check import check

    log.configure("WARNING")  # stdout is the report's
    try:
        report = check(root, precedence)  # type: ignore[arg-type]
    except FileNotFoundError as exc:
        print(f"lakefeed: no manifest at {exc.filename or root}: give the path of a *.manifest.cdm.json",
              file=sys.stderr)
        return 2
    except ManifestError as exc:
        print(f"lakefeed: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report.as_dict()))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "config":
        print(json.dumps(config.json_schema(), indent=2))
        return 0
    if args.command == "openapi":
        from lakefeed.intake.openapi import document

        print(json.dumps(document(), indent=2))
        return 0
    if args.command == "token":
        import hashlib
        import secrets

        token = secrets.token_urlsafe(32)
        print(f"token:          {token}\ntokens_sha256:  {hashlib.sha256(token.encode()).hexdigest()}")
        return 0
    if args.command == "jars":
        from concurrent.futures import ThreadPoolExecutor

        from lakefeed.ops import class_archive, jars, spark, spark_home

        log.configure("INFO")
        java_version = spark.check_java()

        def home_and_archive() -> None:
            spark_home.make()  # before the archive: it is of the class path this home gives
            class_archive.make(java_version)  # best effort: without it, Spark only starts slower

        # The archive is of pyspark's own jars, not of those fetched: it is recorded (a minute of CPU) while Ivy
        # downloads (the network's time).
        with ThreadPoolExecutor(1, thread_name_prefix="class-archive") as pool:
            archived = pool.submit(home_and_archive)
            jars.fetch()
            archived.result()
        return 0
    if args.command == "manifest" and args.manifest_command == "check":
        return _check_manifest(Path(args.root_manifest), args.precedence)
    if args.command == "validate":
        try:
            config.load(args.file)
        except ConfigError as exc:
            print("\n".join(exc.problems), file=sys.stderr)
            return 1
        print(f"{args.file}: ok")
        return 0
    try:
        cfg = config.load(args.config)
    except ConfigError as exc:
        print("\n".join(exc.problems), file=sys.stderr)
        return 2
    log.configure(cfg.log_level)
    if args.command == "verify":
        return _verify(cfg, args.entity)
    if args.command == "watermark":
        return _advance_watermark(cfg, args.entity, args.to)
    if args.command == "query":
        return _query(cfg, args.entity, args.as_at, args.as_of, args.format, args.limit)
    if args.command == "status":
        from lakefeed.ops.status_cli import show_status

        return show_status(cfg, args.url, args.json)
    if args.command == "compact":
        from lakefeed.ops.compact_cli import compact

        return compact(cfg, args.entity, not args.no_wait, args.timeout)
    if args.command == "manifest":
        from lakefeed.ops.status_cli import show_manifest

        return show_manifest(cfg, args.entity, args.json)
    from lakefeed.ops import malloc

    malloc.limit_arenas()  # before the supervisor's imports load deltalake
    from lakefeed.ops.supervisor import Supervisor  # Spark is heavy: only for `run` and `backfill`

    # `kill -USR2`: what a daemon that does not stop waits on (from Spark's start, the supervisor's `signals` thread)
    signal.signal(signal.SIGUSR2, log.print_stacks)

    try:
        if args.command == "backfill":
            return _backfill(Supervisor(cfg, drain=True))
        return Supervisor(cfg, Path(args.config)).run()
    except TerminalError as exc:
        log.get("lakefeed").error("daemon.failed", error=str(exc))
        print(f"lakefeed: {exc}", file=sys.stderr)
        return 2


def _backfill(supervisor: Supervisor) -> int:
    """Process what is pending, then exit: 1, naming each entity that failed and why, when one did (the others
    are drained all the same), so that a script or CI running a backfill notices."""
    from lakefeed.ops.status_cli import Progress

    with Progress(supervisor):
        supervisor.run()
    failed = {name: runner.error for name, runner in supervisor.runners.items() if runner.error is not None}
    for name, error in failed.items():
        print(f"lakefeed: backfill: entity {name!r} failed: {error.strip().splitlines()[0]}", file=sys.stderr)
    if failed:
        print(f"lakefeed: backfill incomplete: {len(failed)} of {len(supervisor.runners)} entities failed; fix "
              "the cause and run backfill again (what was committed stays committed, the rest is taken then)",
              file=sys.stderr)
    return 1 if failed else 0


def _verify(cfg: config.LakefeedConfig, only: list[str] | None) -> int:
    from lakefeed.pipeline.verify import verify

    failed = 0
    for entity in cfg.entities:
        if only and entity.name not in only:
            continue
        problems = verify(entity)
        print(f"{entity.name}: {'ok' if not problems else f'{len(problems)} problem(s)'}")
        for problem in problems:
            print(f"  {problem}")
        failed += bool(problems)
    return 1 if failed else 0


def _query(cfg: config.LakefeedConfig, entity: str, as_at: str | None, as_of: str | None, form: str,
           limit: int | None) -> int:
    from lakefeed import clock
    from lakefeed.query.bitemporal import QueryError, state

    times = {}
    for flag, text in (("--as-at", as_at), ("--as-of", as_of)):
        try:
            times[flag] = clock.from_cdm(text) if text is not None else None
        except ValueError:
            print(f"lakefeed: {flag} {text!r} is not an ISO 8601 time; give e.g. 2024-05-01T12:00:00Z",
                  file=sys.stderr)
            return 2
    if entity not in {e.name for e in cfg.entities}:
        print(f"lakefeed: no entity {entity!r} in the config", file=sys.stderr)
        return 2
    try:
        rows = state(cfg.entity(entity), as_at=times["--as-at"], as_of=times["--as-of"], limit=limit)
    except QueryError as exc:
        print(f"lakefeed: {exc}", file=sys.stderr)
        return 1
    _print_rows(rows.to_pylist(), rows.column_names, form)
    return 0


def _print_rows(rows: list[dict[str, Any]], columns: list[str], form: str) -> None:
    """Rows as JSON lines, CSV or an aligned text table; times in ISO 8601, nested values as JSON, nulls as
    JSON null or an empty cell."""
    if form == "jsonl":
        for row in rows:
            print(json.dumps(row, default=_json_value, ensure_ascii=False))
        return
    cells = [[_cell(row[c]) for c in columns] for row in rows]
    if form == "csv":
        csv.writer(sys.stdout, lineterminator="\n").writerows([columns, *cells])
        return
    widths = [max(len(text) for text in column) for column in zip(columns, *cells, strict=True)]
    for line in [columns, ["-" * w for w in widths], *cells]:
        print("  ".join(text.ljust(w) for text, w in zip(line, widths, strict=True)).rstrip())
    print(f"({len(rows)} row{'' if len(rows) == 1 else 's'})")


def _json_value(value: Any) -> Any:
    if isinstance(value, date | time):
        return value.isoformat()
    return value.hex() if isinstance(value, bytes) else str(value)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, default=_json_value, ensure_ascii=False)
    return _json_value(value) if isinstance(value, date | time | bytes) else str(value)


def _advance_watermark(cfg: config.LakefeedConfig, entity: str, to: str) -> int:
    from lakefeed import clock
    from lakefeed.batch.event_time import WATERMARK_KEY
    from lakefeed.pipeline.sinks import delta_sink

    if entity not in {e.name for e in cfg.entities}:
        print(f"lakefeed: no entity {entity!r} in the config", file=sys.stderr)
        return 2
    try:
        target = clock.from_cdm(to)
    except ValueError:
        print(f"lakefeed: --to {to!r} is not an ISO 8601 time", file=sys.stderr)
        return 2
    sink = delta_sink(cfg.entity(entity), cfg.entity(entity).table)
    schema = sink.schema()
    if schema is None:
        print(f"lakefeed: entity {entity!r} has no table yet; nothing to advance", file=sys.stderr)
        return 1
    current = sink.latest_metadata(WATERMARK_KEY, "", 0)
    if current is not None and clock.from_cdm(current) >= target:
        print(f"{entity}: watermark stays at {current} (not behind {clock.to_cdm(target)})")
        return 0
    sink.record(schema.empty_table(), {WATERMARK_KEY: clock.to_cdm(target), "lakefeed.entity": entity})
    print(f"{entity}: watermark advanced to {clock.to_cdm(target)}")
    return 0
