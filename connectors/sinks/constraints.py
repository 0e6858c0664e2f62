"""What a table's constraints ask of files written by tasks, checked before a commit adds them.

A Delta writer must enforce the table's CHECK constraints (`delta.constraints.<name>` in its configuration) and its
NOT NULL columns. delta-rs and Spark do so as they write rows; a commit of files that tasks wrote
(`TableSink.commit_files`) adds them without a look inside. So, before it adds them:

- NOT NULL is checked exactly from each file's statistics (its null counts). The tasks already set apart the rows
  with a null there (daemon/pipeline/tasks.py), so this fails only for a column made NOT NULL since they ran.
- A CHECK constraint is an SQL expression that lakefeed does not evaluate: a table that has one takes no files from
  lakefeed. The commit is refused, before anything is added, with the constraint and what to do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from lakefeed.connectors.sinks import cdm_manifest
from lakefeed.connectors.sinks.data_files import DataFile
from lakefeed.errors import ConstraintError
from lakefeed.inbox.storage import is_s3

PREFIX = "delta.constraints."


def check(uri: str, configuration: dict[str, Any], schema: pa.Schema, files: list[DataFile]) -> None:
    """Raise ConstraintError when the table (at `uri`, with this configuration and schema) cannot take `files`."""
    checks = {k.removeprefix(PREFIX): v for k, v in configuration.items() if k.startswith(PREFIX)}
    if checks:
        named = ", ".join(f"{name} ({expression})" for name, expression in sorted(checks.items()))
        raise _refused(uri, f"table {uri} has CHECK constraints that lakefeed does not evaluate: {named}. Its tasks "
                       "write the table's files, so it adds none to a table with one: drop them (ALTER TABLE ... "
                       "DROP CONSTRAINT <name>) and check them in a view or downstream")
    required = [f.name for f in schema if not f.nullable]
    for file in files if required else ():
        nulls = json.loads(file.stats or "{}").get("nullCount") or {}
        if found := [name for name in required if (nulls.get(name) or 0) > 0]:
            raise _refused(uri, f"table {uri} has NOT NULL columns {', '.join(found)}, and the batch's file "
                           f"{file.path} holds nulls there: the columns were made NOT NULL after its rows were "
                           "checked. The batch is tried again (its rows checked anew) once the entity starts")


def _refused(uri: str, message: str) -> ConstraintError:
    """The error, with the table's log folder and its version now when the table is local: a change to it starts the
    entity again."""
    if is_s3(uri):
        return ConstraintError(f"{message}; then reload the daemon's config (SIGHUP) or restart it, and the entity "
                               "starts again")
    log = Path(uri) / "_delta_log"
    return ConstraintError(f"{message}; the entity starts again by itself once the table's log changes", log,
                           cdm_manifest.file_version(log))
