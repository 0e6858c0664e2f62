"""The `lakefeed` command."""

from __future__ import annotations

import argparse
import json
import sys

from lakefeed import config, log
from lakefeed.errors import ConfigError, TerminalError

DEFAULT_CONFIG = "config/lakefeed.yaml"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lakefeed", description="Keep a data lake current, continuously.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the daemon")
    run.add_argument("--config", default=DEFAULT_CONFIG, help=f"config file (default {DEFAULT_CONFIG})")
    validate = sub.add_parser("validate", help="check a config file; print every problem as file:line: field: msg")
    validate.add_argument("file")
    verify = sub.add_parser("verify", help="check that each entity's changelog replays to its current table")
    verify.add_argument("--config", default=DEFAULT_CONFIG, help=f"config file (default {DEFAULT_CONFIG})")
    verify.add_argument("--entity", action="append", help="only this entity (repeatable)")
    cfg = sub.add_parser("config", help="about the configuration")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True)
    cfg_sub.add_parser("schema", help="print the config's JSON Schema")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "config":
        print(json.dumps(config.json_schema(), indent=2))
        return 0
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
    from lakefeed.supervisor import Supervisor  # Spark is heavy: only for `run`

    try:
        return Supervisor(cfg).run()
    except TerminalError as exc:
        log.get("lakefeed").error("daemon.failed", error=str(exc))
        print(f"lakefeed: {exc}", file=sys.stderr)
        return 2


def _verify(cfg: config.LakefeedConfig, only: list[str] | None) -> int:
    from lakefeed.verify import verify

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
