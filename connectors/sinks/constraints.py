"""What a table's constraints ask of files written by tasks, checked before a commit adds them.

A Delta writer must enforce the table's CHECK constraints (`delta.constraints.<name>` in its configuration) and its
NOT NULL columns. delta-rs and Spark do so as they write rows; lakefeed's tasks write the files, so they set apart
the rows that break one (daemon/batch/checks.py), and a commit of those files (`TableSink.commit_files`) checks,
before it adds them, that nothing changed since:

- NOT NULL is checked exactly from each file's statistics (its null counts), and the table's CHECK constraints must
  be the ones the tasks evaluated. A column made NOT NULL, or a constraint added or changed, since the tasks ran
  fails the commit as a store fault would: the batch is tried again, planned anew, its rows checked then.
- A CHECK constraint lakefeed cannot evaluate (`evaluable`) stops an append entity with the constraint and what to
  do. A keyed entity's rows reach the table through a MERGE, which delta-rs and Spark check themselves.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from lakefeed.batch import checks
from lakefeed.batch.checks import Checks
from lakefeed.connectors.sinks import cdm_manifest
from lakefeed.connectors.sinks.data_files import DataFile
from lakefeed.errors import ConstraintError, TransientError
from lakefeed.inbox.storage import is_s3

PREFIX = "delta.constraints."


def of(configuration: dict[str, Any]) -> Checks:
    """The CHECK constraints in a table's configuration, by name."""
    return tuple(sorted((k.removeprefix(PREFIX), v) for k, v in configuration.items() if k.startswith(PREFIX)))


def evaluable(uri: str, configuration: dict[str, Any], schema: pa.Schema, merged: bool) -> Checks:
    """The table's CHECK constraints that lakefeed evaluates on rows of `schema`. One it cannot refuses the batch;
    unless the rows are `merged` (a keyed entity's): its MERGE, delta-rs's or Spark's, enforces that one."""
    found = []
    for name, expression in of(configuration):
        try:
            checks.Check(name, expression, schema)
        except checks.Unsupported as e:
            if not merged:
                raise _refused(uri, f"table {uri}: {e}. lakefeed's tasks write the table's files and check their "
                               "rows themselves, so it adds none to a table with such a constraint: drop it (ALTER "
                               "TABLE ... DROP CONSTRAINT <name>) or write it with what lakefeed evaluates "
                               "(docs/bad-input.md)") from None
            continue
        found.append((name, expression))
    return tuple(found)


def check(uri: str, configuration: dict[str, Any], schema: pa.Schema, files: list[DataFile],
          checked: Checks = ()) -> None:
    """Raise when the table (at `uri`, with this configuration and schema) cannot take `files`, whose rows were
    checked against the CHECK constraints `checked`."""
    if changed := [c for c in of(configuration) if c not in checked]:
        named = ", ".join(f"{name} ({expression})" for name, expression in changed)
        raise TransientError(f"table {uri} has CHECK constraints the batch's rows were not checked against, added "
                             f"or changed since its tasks ran: {named}. The batch is tried again, its rows checked "
                             "against them")
    required = [f.name for f in schema if not f.nullable]
    for file in files if required else ():
        nulls = json.loads(file.stats or "{}").get("nullCount") or {}
        if found := [name for name in required if (nulls.get(name) or 0) > 0]:
            raise TransientError(f"table {uri} has NOT NULL columns {', '.join(found)}, and the batch's file "
                                 f"{file.path} holds nulls there: the columns were made NOT NULL after its rows were "
                                 "checked. The batch is tried again, its rows checked anew")


def _refused(uri: str, message: str) -> ConstraintError:
    """The error, with the table's log folder and its version now when the table is local: a change to it starts the
    entity again."""
    if is_s3(uri):
        return ConstraintError(f"{message}; then reload the daemon's config (SIGHUP) or restart it, and the entity "
                               "starts again")
    log = Path(uri) / "_delta_log"
    return ConstraintError(f"{message}; the entity starts again by itself once the table's log changes", log,
                           cdm_manifest.file_version(log))
