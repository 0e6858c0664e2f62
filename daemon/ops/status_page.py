"""The status page: server-rendered HTML with small SVG charts of the last hour; no scripts, no build."""

from __future__ import annotations

from html import escape
from typing import Any

_STYLE = """
body{font:14px system-ui,sans-serif;margin:24px;color:#222}
h1{font-size:20px} table{border-collapse:collapse;margin:12px 0}
td,th{padding:4px 10px;border-bottom:1px solid #ddd;text-align:left}
.bad{color:#b00020} .ok{color:#0a7d28} .charts{display:flex;gap:16px;flex-wrap:wrap;margin-bottom:20px}
figure{margin:0} figcaption{font-size:12px;color:#555} svg{background:#fafafa;border:1px solid #eee}
"""
CHARTS = (("freshness_s", "freshness (s since last commit)"), ("backlog", "backlog (waiting)"),
          ("rows_per_s", "throughput (rows/s)"), ("watermark_lag_s", "watermark lag (s)"))


def _spark(points: list[float | None], width: int = 220, height: int = 48) -> str:
    values = [v for v in points if v is not None]
    if len(values) < 2:
        return f'<svg width="{width}" height="{height}" role="img"><text x="6" y="28" font-size="11" ' \
               'fill="#888">collecting…</text></svg>'
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    step = width / (len(points) - 1)
    coords = [f"{i * step:.1f},{height - 4 - (v - low) / span * (height - 8):.1f}"
              for i, v in enumerate(points) if v is not None]
    return (f'<svg width="{width}" height="{height}" role="img"><polyline fill="none" stroke="#2a6fdb" '
            f'stroke-width="1.5" points="{" ".join(coords)}"/><text x="4" y="11" font-size="10" fill="#555">'
            f'max {high:.4g}</text></svg>')


def _series(history: list[dict[str, Any]]) -> dict[str, list[float | None]]:
    out: dict[str, list[float | None]] = {key: [] for key, _ in CHARTS}
    for h in history:
        for key in ("freshness_s", "backlog", "rows_per_s"):
            out[key].append(h.get(key))
        out["watermark_lag_s"].append(h["t"] - h["watermark"] if h.get("watermark") is not None else None)
    return out


def render(status: dict[str, Any]) -> str:
    daemon = status["daemon"]
    rows, sections = [], []
    for name, e in status["entities"].items():
        state = f'<span class="bad">failed: {escape(e["error"][:200])}</span>' if e["error"] else \
            '<span class="ok">running</span>'
        backlog = sum(s["backlog"] for s in e["streams"].values())
        rate = e["history"][-1]["rows_per_s"] if e["history"] else 0
        rows.append(
            f'<tr data-entity="{escape(name)}"><td>{escape(name)}</td><td>{state}</td>'
            f'<td class="freshness">{e["freshness_s"]}</td><td class="backlog">{backlog}</td>'
            f'<td class="rate">{rate}</td><td class="watermark">{escape(str(e["watermark"] or "–"))}</td>'
            f'<td class="rows">{e["rows"]}</td><td>{e["files"]}</td><td>{e["quarantined"]}</td></tr>')
        series = _series(e["history"])
        charts = "".join(f"<figure>{_spark(series[key])}<figcaption>{escape(label)}</figcaption></figure>"
                         for key, label in CHARTS)
        sections.append(f'<h2>{escape(name)}</h2><div class="charts">{charts}</div>')
    problems = "".join(f"<li>{escape(p)}</li>" for p in daemon["config_problems"])
    notes = (f'<p class="bad">Config reload rejected; the running config is kept:</p><ul>{problems}</ul>'
             if problems else "")
    if daemon["needs_restart"]:
        notes += f'<p class="bad">Restart needed to apply: {escape(", ".join(daemon["needs_restart"]))}</p>'
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="10">
<title>lakefeed status</title><style>{_STYLE}</style></head>
<body><h1>lakefeed</h1>
<p id="summary">{escape(daemon["status"])} · pid {daemon["pid"]} · up {daemon["uptime_s"]:.0f} s</p>{notes}
<table id="entities"><tr><th>entity</th><th>state</th><th>freshness (s)</th><th>backlog</th><th>rows/s</th>
<th>watermark</th><th>rows</th><th>files</th><th>quarantined</th></tr>{"".join(rows)}</table>
{"".join(sections)}
<p><a href="/metrics">metrics</a> · <a href="/status">status JSON</a> · <a href="/openapi.json">OpenAPI</a></p>
</body></html>"""
