"""Compaction and vacuum of an entity's tables between its batches.

Each batch adds a file or a few to a table. A table that keeps them all costs its readers more with every batch: a
file to open each, and an entry per file in every load of the table (bench/delta_state.py: reading 40 tables of 200
one-batch files took 16 times as long as reading them compacted). So once a table has had `compaction.every`
commits since its last compaction, its small files are rewritten into larger ones (delta-rs's optimize, or
delta-spark's OPTIMIZE in Spark's tasks). That commit changes no row and carries no batch's metadata: replays, the
watermark and the manifests' partitions never take it for a batch. It comes after every commit of the batch, so a
replay never finds it in the middle of one. Then the files the table stopped using `vacuum_retain_hours` ago
(compacted, or rewritten by a MERGE) are deleted from storage, which would otherwise keep every version's.

The changelog's files are the ODF chain's data slices (docs/odf.md): the chain links each batch's file into the
dataset as its commit added it. So the changelog is compacted only once the chain holds every slice of it
(`run_changelog`, after the manifests' refresh): a file the compaction replaces is in the dataset already, and its
vacuum cannot take a slice the chain has yet to link; and a compacted file never holds an offset past the chain's
last, which the chain's rebuild from the files alone (daemon/odf/chain.py, `_whole`) would have to cut out of it.

`lakefeed compact` asks the running daemon to compact every table of an entity now, due or not (`now`, under the
entity's lock: daemon/ops/compactions.py); `every: 0` leaves the compaction to such requests alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from lakefeed import failpoints, log
from lakefeed.config.model import EntityConfig
from lakefeed.connectors.sinks.base import TableSink
from lakefeed.pipeline.sinks import Sinks

_log = log.get(__name__)
T = TypeVar("T")
OPTIMIZE = "OPTIMIZE"  # the operation of a compaction's commit, in delta-rs's and delta-spark's logs alike
CHANGELOG = "changelog"


class Compactor:
    def __init__(self, cfg: EntityConfig, sinks: Sinks, chained: Callable[[], int]) -> None:
        """`chained()`: the changelog version up to which the ODF chain holds every slice."""
        self._entity = cfg.name
        self._every = cfg.compaction.every
        self._target = cfg.compaction.target_file_mb << 20
        self._retain = cfg.compaction.vacuum_retain_hours
        named = (("table", sinks.table), ("quarantine", sinks.quarantine), ("history", sinks.history),
                 ("tombstones", sinks.tombstones))
        self._tables = {name: sink for name, sink in named if sink is not None}
        self._changelog = sinks.changelog
        self._chained = chained
        self._since: dict[str, int] = {}  # table -> the version its commits are counted from
        self._skip = dict.fromkeys([*self._tables, CHANGELOG], 0)  # table -> batches before its version is read
        self.asked = False  # compacting on demand (`now`)

    def run(self, halted: Callable[[], bool]) -> int:
        """Compact the tables that are due (not the changelog), after a batch's commits and under the entity's lock
        (no other commit of the entity's comes in between); the number of files rewritten. Stops once `halted()` (a
        stop's time is up): compaction can wait for the next start. Nothing here fails the batch, which is committed
        already: a step that fails is logged and tried again `every` commits on."""
        return sum(self._one(name, sink, halted) for name, sink in self._tables.items())

    def run_changelog(self, halted: Callable[[], bool]) -> int:
        """Compact the changelog if it is due and the ODF chain holds every slice of it (after the manifests'
        refresh); the number of files rewritten. A chain behind the changelog (its refresh deferred, or stopped
        at a slice it cannot take) leaves it as it is, to be read again next batch."""
        return self._one(CHANGELOG, self._changelog, halted, self._chained)

    def now(self, halted: Callable[[], bool]) -> dict[str, dict[str, Any]]:
        """Compact (and vacuum) every table now, due or not, the changelog too if the ODF chain holds all of it
        (the manifests are brought current before); what became of each table, to report to the operator who asked.
        From one table to the next only until `halted()`: the tables not reached say so."""
        report: dict[str, dict[str, Any]] = {}
        self.asked = True  # the batches that wait for it are not stalled (the runner's `healthy`)
        try:
            for name, sink in [*self._tables.items(), (CHANGELOG, self._changelog)]:
                if halted():
                    report[name] = {"error": "not compacted: the daemon (or the entity) is stopping"}
                    continue
                try:
                    report[name] = self._now(name, sink)
                except Exception as exc:  # reported to the operator, who may ask again; the batches go on
                    _log.warning("table.compaction_failed", entity=self._entity, table=name, on_demand=True,
                                 error=f"{type(exc).__name__}: {exc}")
                    report[name] = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            self.asked = False
        return report

    def _now(self, name: str, sink: TableSink) -> dict[str, Any]:
        version = sink.version()
        if version is None:
            return {"skipped": "no table yet"}
        if name == CHANGELOG and self._chained() < version:
            return {"skipped": f"the ODF chain holds the changelog up to version {self._chained()} of {version}; "
                               "ask again once it has caught up"}
        return self._compact(name, sink, version, on_demand=True)

    def _one(self, name: str, sink: TableSink, halted: Callable[[], bool],
             chained: Callable[[], int] | None = None) -> int:
        if not self._every or halted():
            return 0
        if self._skip[name]:
            self._skip[name] -= 1
            return 0
        version = self._attempt(name, "compaction", partial(self._due, name, sink))
        if version is None:
            return 0
        if chained is not None and chained() < version:
            _log.debug("table.compaction_waits", entity=self._entity, table=name, version=version, chain=chained())
            return 0
        done = self._attempt(name, "compaction", partial(self._compact, name, sink, version))
        if done is None:
            self._skip[name] = self._every - 1  # tried again `every` commits on
            return 0
        return done["files_removed"]

    def _due(self, name: str, sink: TableSink) -> int | None:
        """The table's version when it is due for compaction, else None. Reading the version costs a listing of
        the table's log (on S3 a LIST, a failed load for a table not made yet). A batch commits to a table once,
        as a rule, so a table `n` commits short of due is not read again for `n - 1` batches; a batch that commits
        twice (a new column, then its rows) only has the compaction come a batch late."""
        version = sink.version()
        if version is None:
            self._skip[name] = self._every - 1  # its first `every` commits are `every` batches away
            return None
        if name not in self._since:
            self._since[name] = self._last(sink, version)
        short = self._every - (version - self._since[name])
        self._skip[name] = max(short - 1, 0)
        return version if short <= 0 else None

    def _compact(self, name: str, sink: TableSink, version: int, on_demand: bool = False) -> dict[str, Any]:
        """Compact a table, then vacuum it (a vacuum that fails is only reported: the next compaction vacuums); what
        was done. The commits are counted again from here."""
        started = time.perf_counter()
        removed, added = sink.compact(self._target)
        if removed:
            failpoints.reached("compaction.committed")
            _log.info("table.compacted", entity=self._entity, table=name, files_removed=removed, files_added=added,
                      seconds=round(time.perf_counter() - started, 3), on_demand=on_demand)
        done: dict[str, Any] = {"files_removed": removed, "files_added": added, "vacuum_retain_hours": self._retain}
        if self._retain is not None:
            try:
                sink.vacuum(self._retain)
            except Exception as exc:  # upkeep: a store's error or a full disk fails neither a batch nor the compaction
                done["error"] = f"vacuum: {type(exc).__name__}: {exc}"
                _log.warning("table.vacuum_failed", entity=self._entity, table=name, error=done["error"])
        after = sink.version()
        self._since[name] = after if after is not None else version
        self._skip[name] = max(self._every - 1, 0)
        return {**done, "version": after, "seconds": round(time.perf_counter() - started, 3)}

    def _attempt(self, name: str, step: str, run: Callable[[], T]) -> T | None:
        try:
            return run()
        except Exception as exc:  # upkeep: a store's error or a full disk must not fail a committed batch
            _log.warning(f"table.{step}_failed", entity=self._entity, table=name,
                         error=f"{type(exc).__name__}: {exc}", retry=f"after {self._every} more commits")
            return None

    def _last(self, sink: TableSink, version: int) -> int:
        """Where a table's commits are counted from after a start: its newest compaction among its last `every`
        commits, else `every` commits back (so it is due now)."""
        start = max(version - self._every, -1)
        for commit in reversed(sink.commits_after(start)):
            if commit.get("operation") == OPTIMIZE:
                return int(commit["version"])
        return start
