"""The recovery demo's picture: released messages per second across the run, the crashes and
the recoveries marked, as an HTML page with an inline SVG (no script, no network), the same SVG
alone, and the data behind it as JSON beside them.

Released per second counts the real topic's records by their timestamps (copies included, so a
duplicate would show); committed per second counts when the producers told the coordinator
their commits. While the coordinator is down the first falls to zero and the second goes on;
after the restart the backlog is released.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from txstream.streaming.cli.recovery_crash import Crash, Pause
from txstream.streaming.cli.recovery_watch import Release

__all__ = ["chart_data", "write_chart", "render_html", "render_svg", "DATA_FILE", "PAGE_FILE",
           "IMAGE_FILE"]

DATA_FILE, PAGE_FILE, IMAGE_FILE = "recovery.json", "recovery.html", "recovery.svg"
_W, _H, _L, _R, _T, _B = 960, 360, 50, 20, 46, 50


def _per_second(times: Sequence[float], t0: float, n: int) -> list[int]:
    out = [0] * n
    for at in times:
        i = int(at - t0)
        if 0 <= i < n:
            out[i] += 1
    return out


def _marks(crashes: Sequence[Crash], pauses: Sequence[Pause], t0: float) -> list[dict[str, Any]]:
    marks: list[dict[str, Any]] = []

    def add(kind: str, at: float | None, label: str) -> None:
        if at is not None:
            marks.append({"kind": kind, "t": round(at - t0, 3), "label": label})

    for c in crashes:
        add("crash", c.at, f"crash {c.number}" + (f" (batch {c.batch})" if c.batch else ""))
        add("restart", c.restart_at, "restart")
        add("first_release", c.first_release_at, "first release")
        add("caught_up", c.caught_up_at, "caught up")
    for p in pauses:
        add("pause" if p.kind == "broker" else "executor_killed", p.at, p.label)
        add("resume" if p.kind == "broker" else "executor_back", p.until, p.back_label)
        add("caught_up", p.caught_up_at, "caught up")
    return sorted(marks, key=lambda m: m["t"])


def _spans(crashes: Sequence[Crash], pauses: Sequence[Pause], t0: float
           ) -> list[dict[str, Any]]:
    """Shaded spans: down (crash to restart), recovering (restart, or the broker back, to
    caught up), paused (the broker stopped), executor (no executor until the worker ran a new
    one)."""
    spans = []
    for begin, end, kind in [
            *((c.at, c.restart_at, "down") for c in crashes),
            *((c.restart_at, c.caught_up_at, "recovering") for c in crashes),
            *((p.at, p.until, "paused" if p.kind == "broker" else "executor")
              for p in pauses),
            *((p.until, p.caught_up_at, "recovering") for p in pauses)]:
        if begin is not None and end is not None:
            spans.append({"kind": kind, "from": round(begin - t0, 3), "to": round(end - t0, 3)})
    return spans


def chart_data(*, started: float, ended: float, releases: Sequence[Release],
               commits: Sequence[float], crashes: Sequence[Crash], pauses: Sequence[Pause],
               verdict: Sequence[str]) -> dict[str, Any]:
    """Per second from ``started`` (epoch seconds) to ``ended``: the run's real-topic records
    and the commits told; the marks in seconds from ``started``."""
    t0 = math.floor(started)
    n = max(1, math.ceil(ended - t0))
    return {"started_at": t0, "seconds": n,
            "released_per_second": _per_second([r.at for r in releases], t0, n),
            "committed_per_second": _per_second(commits, t0, n),
            "marks": _marks(crashes, pauses, t0), "bands": _spans(crashes, pauses, t0),
            "verdict": list(verdict)}


def _x(t: float, n: int) -> float:
    return _L + t / n * (_W - _L - _R)


def _y(v: float, top: int) -> float:
    return _T + (1 - v / top) * (_H - _T - _B)


def _bands(data: dict[str, Any]) -> list[str]:
    n, out = data["seconds"], []
    colors = {"down": "#d62728", "recovering": "#ff7f0e", "paused": "#9467bd",
              "executor": "#8c564b"}
    for band in data["bands"]:
        x0, x1 = _x(band["from"], n), _x(band["to"], n)
        out.append(f'<rect class="band {band["kind"]}" x="{x0:.1f}" y="{_T}" '
                   f'width="{max(1.0, x1 - x0):.1f}" height="{_H - _T - _B}" '
                   f'fill="{colors[band["kind"]]}" fill-opacity="0.13">'
                   f'<title>{band["kind"]}</title></rect>')
    return out


def _series(data: dict[str, Any], top: int) -> list[str]:
    n = data["seconds"]
    width = (_W - _L - _R) / n
    out = [f'<rect class="released" x="{_x(i, n) + 0.5:.1f}" y="{_y(v, top):.1f}" '
           f'width="{max(0.8, width - 1):.1f}" height="{_y(0, top) - _y(v, top):.1f}" '
           f'fill="#1f77b4"><title>{i} s: {v} released</title></rect>'
           for i, v in enumerate(data["released_per_second"]) if v]
    points = " ".join(f"{_x(i + 0.5, n):.1f},{_y(v, top):.1f}"
                      for i, v in enumerate(data["committed_per_second"]))
    out.append(f'<polyline class="committed" points="{points}" fill="none" stroke="#2ca02c" '
               'stroke-width="1.5"/>')
    return out


def _mark_lines(data: dict[str, Any]) -> list[str]:
    n, out = data["seconds"], []
    colors = {"crash": "#d62728", "restart": "#ff7f0e", "first_release": "#1f77b4",
              "caught_up": "#2ca02c", "pause": "#9467bd", "resume": "#9467bd",
              "executor_killed": "#8c564b", "executor_back": "#8c564b"}
    for i, m in enumerate(data["marks"]):
        x = _x(m["t"], n)
        label = html.escape(m["label"])
        out.append(f'<line class="mark {m["kind"]}" x1="{x:.1f}" x2="{x:.1f}" y1="{_T - 4}" '
                   f'y2="{_H - _B}" stroke="{colors.get(m["kind"], "#555")}" '
                   f'stroke-dasharray="4 3"><title>{label} at {m["t"]:.1f} s</title></line>')
        out.append(f'<text x="{x + 3:.1f}" y="{_T - 30 + 11 * (i % 3)}" font-size="10" '
                   f'fill="{colors.get(m["kind"], "#555")}">{label}</text>')
    return out


def _axes(n: int, top: int) -> list[str]:
    out = [f'<line x1="{_L}" y1="{_H - _B}" x2="{_W - _R}" y2="{_H - _B}" stroke="#333"/>',
           f'<line x1="{_L}" y1="{_T}" x2="{_L}" y2="{_H - _B}" stroke="#333"/>']
    step = max(1, 10 * math.ceil(n / 150))
    for t in range(0, n + 1, step):
        out.append(f'<text x="{_x(t, n):.1f}" y="{_H - _B + 15}" font-size="10" '
                   f'text-anchor="middle">{t}</text>')
    for v in sorted({0, top // 2, top}):
        out.append(f'<text x="{_L - 6}" y="{_y(v, top) + 3:.1f}" font-size="10" '
                   f'text-anchor="end">{v}</text>')
    out.append(f'<text x="{(_W + _L) / 2}" y="{_H - 12}" font-size="11" text-anchor="middle">'
               'seconds since the traffic began</text>')
    return out


def render_svg(data: dict[str, Any]) -> str:
    """The chart alone: a standalone SVG image (the README shows one)."""
    n = data["seconds"]
    top = max(2, *data["released_per_second"], *data["committed_per_second"])
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
           f'viewBox="0 0 {_W} {_H}" font-family="sans-serif">',
           *_bands(data), *_series(data, top), *_mark_lines(data), *_axes(n, top),
           f'<text x="{_W - _R}" y="{_H - _B + 30}" font-size="11" text-anchor="end">'
           '<tspan fill="#1f77b4">&#9632; released per second (real topic)</tspan>  '
           '<tspan fill="#2ca02c">&#8212; commits told per second (producers)</tspan></text>',
           "</svg>"]
    return "".join(svg)


def render_html(data: dict[str, Any]) -> str:
    verdict = html.escape("\n".join(data["verdict"]))
    payload = json.dumps(data).replace("</", "<\\/")
    return ("<!doctype html>\n<html><head><meta charset=\"utf-8\">"
            "<title>txstream recovery demo</title></head>\n<body style=\"font-family: "
            "sans-serif; margin: 24px\">\n<h2>txstream recovery demo: released messages per "
            f"second, the coordinator crashed under traffic</h2>\n{render_svg(data)}\n"
            f"<pre>{verdict}</pre>\n"
            f'<script type="application/json" id="recovery-data">{payload}</script>\n'
            "</body></html>\n")


def write_chart(folder: Path, data: dict[str, Any]) -> Path:
    """``recovery.json``, ``recovery.html`` and ``recovery.svg`` in ``folder``; returns the
    page's path."""
    (folder / DATA_FILE).write_text(json.dumps(data, indent=1) + "\n")
    (folder / IMAGE_FILE).write_text(render_svg(data) + "\n")
    page = folder / PAGE_FILE
    page.write_text(render_html(data))
    return page
