"""The run page's progress-over-time view: a server-side SVG of the ledger's series."""

from __future__ import annotations

import datetime as dt
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from avsim.artifacts import RunLayout
from avsim.report.timeline import PlanLine, Span, build_timeline
from avsim.ui.timeline import TimelineCache, timeline_doc, timeline_svg

T0 = dt.datetime(2026, 11, 30, 6, 0, tzinfo=dt.UTC)


def h(hours: float) -> dt.datetime:
    return T0 + dt.timedelta(hours=hours)


def test_the_svg_draws_each_series_and_parses() -> None:
    spans = [Span("a", "s", h(0), h(1), 1), Span("b", "s", h(0.5), h(2), 2), Span("c", "s", h(1), None, 4)]
    t = build_timeline(spans, {"a", "b"}, PlanLine(10, h(24)), h(3))
    svg = timeline_svg(t)
    root = ET.fromstring(svg)
    series = {el.get("data-series") for el in root.iter() if el.get("data-series")}
    assert series == {"planned", "finished", "gpus", "deadline"}
    assert "GPUs busy (peak 6)" in svg
    doc = timeline_doc(t)
    assert doc["finished_cases"] == 2 and doc["points"] == {"finished": 3, "planned": 2, "gpus_busy": 5}
    assert "finished" not in doc and doc["svg"] == svg
    json.dumps(doc)


def test_nothing_to_draw_before_the_first_attempt() -> None:
    assert timeline_svg(build_timeline([], set(), PlanLine(10, h(24)), T0)) == ""


def test_the_cache_recomputes_only_after_its_ttl(tmp_path: Path) -> None:
    layout = RunLayout(f"file://{tmp_path}", "avsim_weekly__manual__w49")
    cache = TimelineCache(ttl=3600)
    first = cache.get(layout, h(24).isoformat(), 5)
    assert first.empty and first.deadline == h(24) and first.planned_cases == 5
    record = Path(layout.attempt_record("a", "s", 1).removeprefix("file://"))
    record.parent.mkdir(parents=True)
    record.write_text(
        json.dumps({"case_id": "a", "phase": "s", "started_at": T0.isoformat(), "state": "started"})
    )
    assert cache.get(layout).empty, "cached"
    assert not TimelineCache(ttl=0).get(layout).empty


def _deadline_marks(svg: str) -> tuple[list[ET.Element], list[ET.Element]]:
    root = ET.fromstring(svg)
    marks = [el for el in root.iter() if el.get("data-series") == "deadline"]
    return [m for m in marks if m.tag.endswith("line")], [m for m in marks if m.tag.endswith("text")]


def test_a_five_minute_week_fills_the_axis_and_a_far_deadline_is_an_annotation() -> None:
    """Issue 31: the axis ran to the deadline 8 hours away, so 5 minutes of data were a vertical line."""
    minutes = [T0 + dt.timedelta(minutes=m) for m in range(6)]
    spans = [Span(f"c{i}", "s", minutes[i], minutes[i + 1], 1) for i in range(5)]
    now = minutes[5]
    t = build_timeline(
        spans, {f"c{i}" for i in range(5)}, PlanLine(400, now + dt.timedelta(hours=7, minutes=55)), now
    )
    svg = timeline_svg(t)
    lines, notes = _deadline_marks(svg)
    assert not lines and [n.text for n in notes] == ["deadline in 7 h 55 min →"]
    root = ET.fromstring(svg)
    finished = next(el for el in root.iter() if el.get("data-series") == "finished")
    xs = [float(p.split(",")[0]) for p in str(finished.get("points")).split()]
    assert min(xs) == 52.0 and max(xs) == 720 - 12, "the data spans the whole axis"
    # The planned pace is drawn up to the axis' end, where it reaches 5 min / 8 h of 400 cases.
    planned = next(el for el in root.iter() if el.get("data-series") == "planned")
    (x0, _y0), (x1, y1) = [tuple(map(float, p.split(","))) for p in str(planned.get("points")).split()]
    assert (x0, x1) == (52.0, 708.0) and y1 == pytest.approx(10 + 120 * (1 - 400 * 5 / 480 / 400), abs=0.1)


def test_a_near_deadline_is_drawn_on_the_axis() -> None:
    spans = [Span("a", "s", h(0), h(2), 1)]
    t = build_timeline(spans, {"a"}, PlanLine(10, h(3)), h(2.5))
    lines, notes = _deadline_marks(timeline_svg(t))
    assert len(lines) == 1 and [n.text for n in notes] == ["deadline"]
    assert float(lines[0].get("x1") or 0) == 720 - 12, "the deadline ends the axis"
    # A deadline already passed lies within the data: on the axis too.
    lines, _ = _deadline_marks(timeline_svg(build_timeline(spans, {"a"}, PlanLine(10, h(1)), h(2.5))))
    assert len(lines) == 1 and 52 < float(lines[0].get("x1") or 0) < 708
