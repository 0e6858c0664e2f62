"""`lakefeed compact`: have the running daemon compact entities' tables now (daemon/ops/compactions.py), and wait
for it to finish."""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from lakefeed.config.model import LakefeedConfig
from lakefeed.intake.http_server import published


def compact(cfg: LakefeedConfig, only: list[str] | None, wait: bool, timeout_s: float) -> int:
    """0 once every entity asked for is compacted (or, with `wait` False, once the daemon took the request); 1 when
    a table's compaction failed, an entity was left (not running), the daemon cannot be reached or the wait is up;
    2 for an entity named that the daemon does not run, or runs not now. The daemon asked is the one on the config's
    state folder: its token goes to it alone."""
    found = published(cfg.state_dir, token=True)
    if isinstance(found, str):
        print(f"lakefeed: {found}", file=sys.stderr)
        return 1
    base = found["url"]
    body = json.dumps({"entities": only}).encode() if only else b""
    try:
        answer = _call(base, "POST", body, found["admin_token"])
        runs, idle = answer["runs"], answer.get("not_running", [])
    except urllib.error.HTTPError as exc:
        print(f"lakefeed: the daemon at {base} refused: {_error(exc)}", file=sys.stderr)
        return 2 if exc.code in (400, 404, 409) else 1
    except (OSError, ValueError, KeyError) as exc:  # URLError is an OSError; ValueError: an answer not JSON
        print(f"lakefeed: cannot reach the daemon at {base}: {exc}", file=sys.stderr)
        return 1
    if idle:
        print(f"lakefeed: not running, so not compacted: {', '.join(idle)} (see `lakefeed status`)", file=sys.stderr)
    if not wait:
        print(f"compaction asked for {', '.join(sorted(runs)) or 'no entity'}; see GET {base}/compact")
        return 1 if idle else 0
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            entities = _call(base, "GET", None, None)["entities"]
        except (OSError, ValueError, KeyError) as exc:
            print(f"lakefeed: lost the daemon at {base} while it compacted: {exc}", file=sys.stderr)
            return 1
        mine = {name: entities.get(name) for name in runs}
        lost = sorted(n for n, r in mine.items() if r is None or r["run"] < runs[n])
        if lost:  # a restarted daemon knows nothing of the runs asked of the one before
            print(f"lakefeed: the daemon restarted while it compacted {', '.join(lost)}; ask again",
                  file=sys.stderr)
            return 1
        if all(r["run"] > runs[n] or r["state"] != "running" for n, r in mine.items()):
            break
        if time.monotonic() >= deadline:
            busy = sorted(n for n, r in mine.items() if r["state"] == "running")
            print(f"lakefeed: still compacting {', '.join(busy)} after {timeout_s:g} s; it goes on in the daemon "
                  f"(GET {base}/compact says when it is done)", file=sys.stderr)
            return 1
        time.sleep(0.5)
    for name in sorted(mine):
        _print_run(name, mine[name])
    return 1 if idle or any(r["state"] == "failed" for r in mine.values()) else 0


def _call(base: str, method: str, body: bytes | None, token: str | None) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(f"{base}/compact", data=body, method=method,  # noqa: S310 - the daemon's URL
                                     headers=headers)
    with urllib.request.urlopen(request, timeout=30) as resp:  # noqa: S310 - the daemon's own URL
        return json.load(resp)


def _error(exc: urllib.error.HTTPError) -> str:
    try:
        return f"{exc.code}: {json.loads(exc.read())['error']}"
    except (ValueError, KeyError, OSError):
        return f"{exc.code} {exc.reason}"


def _print_run(name: str, run: dict[str, Any]) -> None:
    print(f"{name}: {run['state']} (run {run['run']}, finished {run['finished_at'] or '–'})")
    if run.get("error"):
        print(f"  {run['error']}")
    width = max((len(t) for t in run.get("tables", {})), default=0)
    for table, done in run.get("tables", {}).items():
        what = done.get("skipped") or f"failed: {done.get('error')}"
        if "files_removed" in done:
            what = f"{done['files_removed']} files -> {done['files_added']}, version {done['version']}, " \
                   f"{done['seconds']:.2f} s" + (f"; failed: {done['error']}" if "error" in done else "")
        print(f"  {table.ljust(width)}  {what}")
