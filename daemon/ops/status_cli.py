"""The operator's commands that read state: `status`, `manifest show`, and backfill's progress bar."""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

from lakefeed.config.model import LakefeedConfig
from lakefeed.connectors.sinks import cdm_manifest
from lakefeed.errors import ManifestError
from lakefeed.intake.http_server import published

if TYPE_CHECKING:
    from lakefeed.ops.supervisor import Supervisor


def _table(header: list[str], rows: list[list[Any]]) -> str:
    cells = [header, *[[("–" if v is None else str(v)) for v in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def show_status(cfg: LakefeedConfig, url: str | None, as_json: bool) -> int:
    if url is None:
        found = published(cfg.state_dir)
        if isinstance(found, str):
            print(f"lakefeed: {found}", file=sys.stderr)
            return 1
        url = found["url"]
    try:
        with urllib.request.urlopen(f"{url}/status", timeout=10) as resp:  # noqa: S310 - the daemon's own URL
            doc = json.load(resp)
    except (urllib.error.URLError, OSError) as exc:
        print(f"lakefeed: cannot reach the daemon at {url}: {exc}", file=sys.stderr)
        return 1
    except ValueError:
        doc = None
    if not (isinstance(doc, dict) and isinstance(doc.get("daemon"), dict) and isinstance(doc.get("entities"), dict)):
        print(f"lakefeed: {url}/status did not answer as a lakefeed daemon does: is that its URL (--url), and is "
              "it still running?", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(doc, indent=2))
        return 0
    daemon = doc["daemon"]
    print(f"lakefeed pid {daemon['pid']} at {url}: {daemon['status']}")
    for problem in daemon["config_problems"]:
        print(f"  config: {problem}")
    rows = []
    for name, e in doc["entities"].items():
        for stream, s in e["streams"].items():  # each source's own figures; the watermark is the entity's
            state = "failed" if e["error"] else "running" if s["running"] else "stopped"
            rows.append([name, stream, state, s["backlog"], s["rows"], s["files"], s["quarantined"], s["batches"],
                         s["freshness_s"], e["watermark"]])
    print(_table(["entity", "source", "state", "backlog", "rows", "files", "quarantined", "batches", "freshness_s",
                  "watermark"], rows))
    for name, e in doc["entities"].items():
        if e["error"]:
            print(f"{name}: {e['error'].splitlines()[0][:300]}")
    return 1 if any(e["error"] for e in doc["entities"].values()) else 0


def show_manifest(cfg: LakefeedConfig, only: list[str] | None, as_json: bool) -> int:
    found, failed = 0, False
    for entity in cfg.entities:
        if only and entity.name not in only:
            continue
        try:
            doc = cdm_manifest.load(entity.manifest)
        except FileNotFoundError:
            print(f"{entity.name}: no manifest yet at {entity.manifest}")
            continue
        except ManifestError as exc:
            print(f"{entity.name}: {exc}", file=sys.stderr)
            failed = True
            continue
        declared = cdm_manifest.find_entity(doc, entity.name)
        if declared is None:
            print(f"{entity.name}: {entity.manifest} does not declare the entity")
            continue
        found += 1
        if as_json:
            print(json.dumps(declared, indent=2))
            continue
        rows = [[p.get("location"), json.dumps(p.get("arguments") or {}), p.get("lastFileModifiedTime")]
                for p in declared.get("dataPartitions", [])]
        rows += [[p.get("location"), json.dumps(p.get("arguments") or {}), p.get("lastFileModifiedTime")]
                 for p in declared.get("incrementalPartitions", [])]
        print(f"{entity.name} ({entity.manifest}): {len(rows)} partitions, "
              f"lastChildFileModifiedTime {declared.get('lastChildFileModifiedTime', '–')}")
        if rows:
            print(_table(["location", "arguments", "lastFileModifiedTime"], rows))
    return 0 if found and not failed else 1


class Progress:
    """backfill on a terminal: one line with files, rows, what is waiting, and the ETA."""

    def __init__(self, sup: Supervisor) -> None:
        self._sup = sup
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)
        self._started = time.monotonic()

    def __enter__(self) -> Progress:
        if sys.stderr.isatty():
            self._thread.start()
        return self

    def _totals(self) -> tuple[int, int, int]:
        snap = self._sup.metrics.snapshot()
        files = sum(e["files"] for e in snap.values())
        rows = sum(e["rows"] for e in snap.values())
        waiting = sum(r.backlog(s) for r in list(self._sup.runners.values()) for s in r.queries)
        return files, rows, waiting

    def line(self) -> str:
        files, rows, waiting = self._totals()
        elapsed = time.monotonic() - self._started
        done = files
        total = done + waiting
        width = 30
        filled = int(width * done / total) if total else 0
        eta = f"{waiting * elapsed / done:.0f}s" if done and waiting else "–"
        return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} files  {rows} rows  ETA {eta}"

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            print(f"\r{self.line()}", end="", file=sys.stderr, flush=True)

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
            print(f"\r{self.line()}", file=sys.stderr)
        files, rows, _ = self._totals()
        print(f"backfill: {files} files, {rows} rows in {time.monotonic() - self._started:.1f}s")
