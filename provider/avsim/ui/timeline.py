"""The run page's progress-over-time view: a compact SVG drawn on the server, no script, no CDN.

The series come from :func:`avsim.report.timeline_source.week_timeline` (the ledger), as in the
weekly report; here they are only drawn. :class:`TimelineCache` recomputes a run's timeline at
most every :data:`REFRESH_SECONDS` (the page refreshes more often), and its span cache re-reads
only new or still-running attempt records.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from html import escape
from typing import Any

from avsim.artifacts import RunLayout
from avsim.report.plots import time_axis
from avsim.report.timeline import Timeline
from avsim.report.timeline_source import SpanCache, week_timeline

REFRESH_SECONDS = 60.0
WIDTH, HEIGHT = 720, 230
#: Plot areas: cases on top, GPUs busy below, sharing the time axis.
LEFT, RIGHT = 52, 12
TOP_Y, TOP_H = 10, 120
GPU_Y, GPU_H = 160, 50


class TimelineCache:
    """A run's latest timeline, recomputed at most every ``ttl`` seconds, per process."""

    def __init__(self, ttl: float = REFRESH_SECONDS) -> None:
        self.ttl = ttl
        self.spans = SpanCache()
        self._lock = threading.Lock()
        self._items: dict[str, tuple[float, Timeline]] = {}

    def get(self, layout: RunLayout, fallback_deadline: Any = None, fallback_cases: Any = None) -> Timeline:
        with self._lock:
            hit = self._items.get(layout.run_key)
        if hit and time.monotonic() - hit[0] < self.ttl:
            return hit[1]
        found = week_timeline(
            layout, cache=self.spans, fallback_deadline=fallback_deadline, fallback_cases=fallback_cases
        )
        with self._lock:
            self._items[layout.run_key] = (time.monotonic(), found)
        return found


def _fmt_time(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%a %d %b %H:%M")


def _polyline(points: Sequence[tuple[float, float]], colour: str, extra: str = "") -> str:
    coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    return f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="1.6"{extra}/>'


def _steps(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for x, y in points:
        if out:
            out.append((x, out[-1][1]))
        out.append((x, y))
    return out


def timeline_svg(t: Timeline, ended: bool = False) -> str:
    """The view as one ``<svg>`` element (empty string when nothing ran yet).

    The time axis spans the data up to now (an ended run's ``now`` is its end): a deadline far
    beyond it is an annotation at the right edge, a near one a line on the axis
    (:func:`avsim.report.plots.time_axis`).
    """
    if t.empty or t.start is None:
        return ""
    start = t.start
    last = [t.now, *(w for w, _ in t.finished), *(w for w, _ in t.gpus_busy)]
    axis = time_axis(start, max(last), t.deadline, ended=ended)
    end = axis.end
    span = (end - start).total_seconds()
    right = WIDTH - RIGHT

    def x(when: dt.datetime) -> float:
        return LEFT + (right - LEFT) * (when - start).total_seconds() / span

    top_max = max(t.planned_cases or 0, t.finished_cases, 1)
    gpu_max = max(t.peak_gpus, 1)

    def y_case(n: float) -> float:
        return TOP_Y + TOP_H * (1 - n / top_max)

    def y_gpu(n: float) -> float:
        return GPU_Y + GPU_H * (1 - n / gpu_max)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" id="timeline-svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="progress over time" '
        'style="background:#fff;box-shadow:0 1px 2px #0002;border-radius:8px;font:11px system-ui,sans-serif">',
        f'<line x1="{LEFT}" y1="{TOP_Y + TOP_H}" x2="{right}" y2="{TOP_Y + TOP_H}" stroke="#b7bcc6"/>',
        f'<line x1="{LEFT}" y1="{GPU_Y + GPU_H}" x2="{right}" y2="{GPU_Y + GPU_H}" stroke="#b7bcc6"/>',
        f'<text x="{LEFT - 6}" y="{TOP_Y + 8}" text-anchor="end" fill="#5b6475">{top_max:,}</text>',
        f'<text x="{LEFT - 6}" y="{TOP_Y + TOP_H}" text-anchor="end" fill="#5b6475">0</text>',
        f'<text x="{LEFT - 6}" y="{GPU_Y + 8}" text-anchor="end" fill="#5b6475">{gpu_max:,}</text>',
        f'<text x="{LEFT - 6}" y="{GPU_Y + GPU_H}" text-anchor="end" fill="#5b6475">0</text>',
        f'<text x="{LEFT}" y="{GPU_Y - 6}" fill="#2f6fb0">GPUs busy (peak {t.peak_gpus:,})</text>',
        f'<text x="{LEFT}" y="{HEIGHT - 4}" fill="#5b6475">{escape(_fmt_time(start))} UTC</text>',
        f'<text x="{right}" y="{HEIGHT - 4}" text-anchor="end" fill="#5b6475">{escape(_fmt_time(end))}</text>',
    ]
    if t.planned:
        # The planned pace up to the axis' end (the deadline may lie beyond it).
        (w0, n0), (w1, n1) = t.planned[0], t.planned[-1]
        if w1 > end and w1 > w0:
            w1, n1 = end, n0 + (n1 - n0) * (end - w0).total_seconds() / (w1 - w0).total_seconds()
        parts.append(
            _polyline(
                [(x(w0), y_case(n0)), (x(w1), y_case(n1))],
                "#5b6475",
                ' stroke-dasharray="5 4" data-series="planned"',
            )
        )
    if t.finished:
        pts = _steps([(x(w), y_case(n)) for w, n in t.finished])
        pts.append((x(t.now), pts[-1][1]))
        parts.append(_polyline(pts, "#1c7c3c", ' data-series="finished"'))
    if t.gpus_busy:
        pts = _steps([(x(w), y_gpu(n)) for w, n in t.gpus_busy])
        parts.append(_polyline(pts, "#2f6fb0", ' data-series="gpus"'))
    if axis.deadline_note:
        parts.append(
            f'<text x="{right - 4}" y="{TOP_Y + 10}" text-anchor="end" fill="#c0262d" '
            f'data-series="deadline">{escape(axis.deadline_note)}</text>'
        )
    elif axis.deadline_on_axis and t.deadline is not None:
        dx = x(t.deadline)
        parts.append(
            f'<line x1="{dx:.1f}" y1="{TOP_Y}" x2="{dx:.1f}" y2="{GPU_Y + GPU_H}" stroke="#c0262d" '
            'stroke-dasharray="2 3" data-series="deadline"/>'
            f'<text x="{dx - 4:.1f}" y="{TOP_Y + 10}" text-anchor="end" fill="#c0262d" data-series="deadline">deadline</text>'
        )
    nx = x(t.now)
    parts.append(
        f'<line x1="{nx:.1f}" y1="{TOP_Y}" x2="{nx:.1f}" y2="{GPU_Y + GPU_H}" stroke="#7fb8e6"/>'
        f'<text x="{LEFT + 4}" y="{TOP_Y + 10}" fill="#1c7c3c">cases finished</text>'
        f'<text x="{LEFT + 4}" y="{TOP_Y + 24}" fill="#5b6475">- - planned pace</text>'
    )
    parts.append("</svg>")
    return "".join(parts)


def timeline_doc(
    t: Timeline, now: dt.datetime | None = None, ended_at: dt.datetime | None = None
) -> dict[str, Any]:
    """The page's ``timeline``: the figures, what they mean, and the drawing (series left out).

    ``now``: the request's time (else the timeline's, which may be cached). ``ended_at``: when the
    run ended (None while it runs): an ended run is drawn up to its end and makes no pace claim
    (``planned_by_now`` and ``ahead_by_cases`` are None).
    """
    until = ended_at if ended_at is not None else now
    if until is not None and t.start is not None:
        t = replace(t, now=max(until, t.start))
    doc = t.to_json()
    series = {k: doc.pop(k) for k in ("finished", "planned", "gpus_busy")}
    if ended_at is not None:
        doc.update(planned_by_now=None, ahead_by_cases=None)
    return {
        **doc,
        "ended": ended_at is not None,
        "points": {k: len(v) for k, v in series.items()},
        "svg": timeline_svg(t, ended=ended_at is not None),
    }
