"""One root exception; Transient errors are retried, Terminal ones stop the entity and are reported."""

from __future__ import annotations

from pathlib import Path


class LakefeedError(Exception):
    """Root of every error lakefeed raises on purpose."""


class TransientError(LakefeedError):
    """Worth retrying with backoff: the cause may go away (a busy file system, a slow store)."""


class TerminalError(LakefeedError):
    """Retrying will not help; the entity stops and the error is reported with what to do."""


class ManifestError(TerminalError):
    """A CDM manifest cannot be read or does not describe the entity; `path` is the file at fault (None: the
    entity's manifest) and `stamp` its version as it was read (`cdm_manifest.file_version`), so a change to it (a
    fix) can be told from the version that failed."""

    path: Path | None = None
    stamp: tuple[int, ...] | None = None


class ConstraintError(TerminalError):
    """A table has a CHECK constraint lakefeed's tasks cannot evaluate (daemon/batch/checks.py); `path` is the
    table's log folder when the table is local (a change to it, such as the constraint dropped, starts the entity
    again) and `stamp` its version as it was checked."""

    def __init__(self, message: str, path: Path | None = None, stamp: tuple[int, ...] | None = None) -> None:
        super().__init__(message)
        self.path, self.stamp = path, stamp


class Abandoned(Exception):  # noqa: N818 (not a fault: what happened to the batch)
    """A batch given up because the daemon is stopping and the shutdown timeout has passed. Nothing of it was
    acknowledged to anyone: it is replayed from the checkpoint at the next start."""


class ConfigError(LakefeedError):
    """A configuration file is invalid; `problems` holds one `file:line: field: message` per fault."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))
