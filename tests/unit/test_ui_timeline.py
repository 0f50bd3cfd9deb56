"""The run page's progress-over-time view: a server-side SVG of the ledger's series."""

from __future__ import annotations

import datetime as dt
import json
import xml.etree.ElementTree as ET
from pathlib import Path

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
