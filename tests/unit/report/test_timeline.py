"""Progress over time from the ledger: cases finished, the planned pace, GPUs busy (no Airflow)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from avsim.artifacts import RunLayout
from avsim.report.plots import render_plots, timeline_svg
from avsim.report.timeline import PlanLine, Span, build_timeline, case_finish_times, span_of
from avsim.report.timeline_source import SpanCache, read_spans, week_timeline

T0 = dt.datetime(2026, 11, 30, 6, 0, tzinfo=dt.UTC)
DEADLINE = dt.datetime(2026, 12, 6, 18, 0, tzinfo=dt.UTC)


def h(hours: float) -> dt.datetime:
    return T0 + dt.timedelta(hours=hours)


SPANS = [
    # case a: prepare (CPU), simulate failed once on spot then passed, evaluate.
    Span("a", "prepare", h(0), h(0.1), 0),
    Span("a", "simulate", h(0.1), h(0.6), 1),
    Span("a", "simulate", h(0.7), h(1.2), 1),
    Span("a", "evaluate", h(1.2), h(1.3), 0),
    # case b: two GPUs for its simulate, overlapping a's.
    Span("b", "prepare", h(0.2), h(0.3), 0),
    Span("b", "simulate", h(0.3), h(2.0), 2),
    # case c: still running (no end), not finished.
    Span("c", "simulate", h(1.5), None, 1),
]


def test_a_finished_case_ends_with_its_last_attempt() -> None:
    assert case_finish_times(SPANS, ["a", "b", "c", "x"]) == {"a": h(1.3), "b": h(2.0)}


def test_the_series_from_known_attempts() -> None:
    now = h(3)
    t = build_timeline(SPANS, {"a", "b"}, PlanLine(planned_cases=4, deadline=h(4)), now)
    assert t.start == h(0) and t.finished_cases == 2
    assert t.finished == ((h(0), 0), (h(1.3), 1), (h(2.0), 2))
    # Planned pace: a straight line from the first attempt's start to every case at the deadline.
    assert t.planned == ((h(0), 0.0), (h(4), 4.0))
    assert t.planned_at(h(2)) == 2.0 and t.planned_at(h(9)) == 4.0
    # GPUs busy: a's 1 from 0.1, b's 2 from 0.3, a's retry, c running up to now.
    assert t.gpus_busy == (
        (h(0.1), 1),
        (h(0.3), 3),
        (h(0.6), 2),
        (h(0.7), 3),
        (h(1.2), 2),
        (h(1.5), 3),
        (h(2.0), 1),
        (h(3), 0),
    )
    assert t.peak_gpus == 3
    doc = t.to_json()
    assert doc["planned_by_now"] == 3.0 and doc["ahead_by_cases"] == -1.0
    assert doc["finished"][-1] == [h(2.0).isoformat(), 2]
    assert json.loads(json.dumps(doc)) == doc


def test_an_attempt_ending_as_another_starts_does_not_count_both() -> None:
    spans = [Span("a", "s", h(0), h(1), 2), Span("a", "s", h(1), h(2), 2)]
    t = build_timeline(spans, set(), PlanLine(None, None), h(3))
    assert t.gpus_busy == ((h(0), 2), (h(1), 2), (h(2), 0)) and t.peak_gpus == 2
    assert t.planned == () and t.finished == () and t.to_json()["planned_by_now"] is None


def test_nothing_ran_yet() -> None:
    t = build_timeline([], set(), PlanLine(10, DEADLINE), T0)
    assert t.empty and t.gpus_busy == () and t.peak_gpus == 0
    assert timeline_svg(t) is None


def test_a_big_week_keeps_few_points_and_the_peak() -> None:
    spans = [Span(f"c{i}", "simulate", h(i * 0.01), h(i * 0.01 + 0.5), 1) for i in range(10_000)]
    spans.append(Span("peak", "simulate", h(50), h(50.001), 500))
    t = build_timeline(spans, {s.case_id for s in spans}, PlanLine(10_001, DEADLINE), h(200), points=100)
    assert len(t.finished) <= 100 and t.finished[-1][1] == 10_001
    assert len(t.gpus_busy) <= 101
    assert t.peak_gpus == 500 + 50, "the short burst survives the thinning"


def test_attempt_records_as_the_ledger_stores_them() -> None:
    ended = {
        "case_id": "a",
        "phase": "simulate",
        "started_at": "2026-11-30T06:00:00+00:00",
        "ended_at": "2026-11-30T06:30:00+00:00",
        "state": "ended",
        "gpus": 2,
    }
    assert span_of(ended) == Span("a", "simulate", h(0), h(0.5), 2)
    running = {**ended, "state": "started", "ended_at": ""}
    assert span_of(running) == Span("a", "simulate", h(0), None, 2)
    no_end = {**ended, "ended_at": "", "duration_seconds": 60.0}
    assert span_of(no_end) == Span("a", "simulate", h(0), h(0) + dt.timedelta(minutes=1), 2)
    assert span_of({"case_id": "a", "started_at": ""}) is None


def _write(uri: str, doc: object) -> None:
    p = Path(uri.removeprefix("file://"))
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(doc))


def test_read_from_a_run_s_ledger_with_a_cache(tmp_path: Path) -> None:
    layout = RunLayout(f"file://{tmp_path}", "avsim_weekly__manual__w49")
    _write(layout.plan_uri, {"cases": 3, "deadline": DEADLINE.isoformat()})
    for n, (case_id, start, end, state) in enumerate(
        [("a", h(0), h(1), "ended"), ("b", h(0.5), None, "started")], start=1
    ):
        _write(
            layout.attempt_record(case_id, "simulate", n),
            {
                "case_id": case_id,
                "phase": "simulate",
                "attempt": n,
                "started_at": start.isoformat(),
                "ended_at": end.isoformat() if end else "",
                "state": state,
                "gpus": 1,
            },
        )
    _write(layout.shard_summary(1), {"shard": 1, "cases": [{"case_id": "a"}]})
    cache = SpanCache()
    t = week_timeline(layout, now=h(2), cache=cache)
    assert t.finished_cases == 1 and t.planned_cases == 3 and t.deadline == DEADLINE
    assert t.gpus_busy == ((h(0), 1), (h(0.5), 2), (h(1), 1), (h(2), 0))
    # b ends: its record is read again (it was running); a's comes from the cache.
    _write(
        layout.attempt_record("b", "simulate", 2),
        {
            "case_id": "b",
            "phase": "simulate",
            "started_at": h(0.5).isoformat(),
            "ended_at": h(1.5).isoformat(),
            "state": "ended",
            "gpus": 1,
        },
    )
    Path(layout.attempt_record("a", "simulate", 1).removeprefix("file://")).write_text("not read again")
    spans = read_spans(layout, cache)
    assert sorted((s.case_id, s.end) for s in spans) == [("a", h(1)), ("b", h(1.5))]


def test_the_report_plot_draws_both_panels() -> None:
    t = build_timeline(SPANS, {"a", "b"}, PlanLine(4, h(4)), h(3))
    svg = render_plots([], 4, None, t)["progress.svg"]
    for words in ("cases finished", "planned pace", "deadline", "GPUs busy"):
        assert words in svg


def test_the_time_axis_spans_the_data_and_reaches_a_deadline_only_when_near() -> None:
    from avsim.report.plots import time_axis

    five = T0 + dt.timedelta(minutes=5)
    far = time_axis(T0, five, five + dt.timedelta(hours=7, minutes=55))
    assert (far.start, far.end, far.deadline_on_axis) == (T0, five, False)
    assert far.deadline_note == "deadline in 7 h 55 min →"
    ended = time_axis(T0, five, five + dt.timedelta(days=3, hours=4, minutes=10), ended=True)
    assert ended.deadline_note == "deadline 3 d 4 h later →"
    near = time_axis(T0, h(2), h(3))  # an hour beyond two hours of data: on the axis
    assert (near.end, near.deadline_on_axis, near.deadline_note) == (h(3), True, "")
    passed = time_axis(T0, h(2), h(1))  # a deadline already passed lies within the data
    assert (passed.end, passed.deadline_on_axis) == (h(2), True)
    assert time_axis(T0, T0, None).end == T0 + dt.timedelta(seconds=10)


def test_the_report_plot_of_a_five_minute_week_notes_a_far_deadline() -> None:
    """Issue 31: the report's chart ran to the deadline too (matplotlib's axvline stretched the axis)."""
    minutes = [T0 + dt.timedelta(minutes=m) for m in range(6)]
    spans = [Span(f"c{i}", "simulate", minutes[i], minutes[i + 1], 1) for i in range(5)]
    deadline = minutes[5] + dt.timedelta(hours=8)
    t = build_timeline(spans, {f"c{i}" for i in range(5)}, PlanLine(400, deadline), minutes[5])
    svg = render_plots([], 400, deadline.isoformat(), t)["progress.svg"]
    assert "deadline 8 h 0 min later →" in svg
    rows = [{"finished_at": m.isoformat()} for m in minutes[1:]]
    fallback = render_plots(rows, 400, deadline.isoformat())["progress.svg"]
    assert "deadline 8 h 0 min later →" in fallback
