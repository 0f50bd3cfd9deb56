"""The weekly report: totals and tables from constructed shard summaries, and its HTML page."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from avsim.artifacts import RunLayout
from avsim.contracts.week import NOT_STARTED, ShardSummary
from avsim.phases.contract import ENDED, NOT_RUN, Outcome
from avsim.report.build import build_report, duration_stats, write_report
from avsim.report.html import render_html

HEAD = {
    "run": {
        "name": "weekly_regression",
        "iso_week": "2026-W50",
        "run_class": "weekly",
        "deadline": "2026-12-13T18:00:00+00:00",
        "build": {"build_id": "b-2026.12.1", "image": "registry/sim@sha256:" + "a" * 64},
    },
    "case_count": 6,
}
PHASES = ("prepare", "simulate", "evaluate", "report")


def phase(outcome: str, attempt: int | None = 1, seconds: float | None = 10.0, **kw: Any) -> dict[str, Any]:
    produced = outcome in ("passed", "scenario_failed")
    return {
        "outcome": outcome,
        "attempt": attempt,
        "output_uri": kw.get("output_uri", "file:///art/x" if produced else ""),
        "reason": kw.get("reason", ""),
        "duration_seconds": seconds,
        "attempts": kw.get("attempts", 1 if attempt else 0),
    }


def case(
    case_id: str, outcome: str, phases: dict[str, dict[str, Any]], graph: str = "standard"
) -> dict[str, Any]:
    return {"case_id": case_id, "graph": graph, "outcome": outcome, "phases": phases}


def summaries() -> list[ShardSummary]:
    ok = {p: phase("passed", seconds=s) for p, s in zip(PHASES, (1.0, 20.0, 3.0, 0.5), strict=True)}
    retried = {**ok, "simulate": phase("passed", attempt=3, seconds=30.0, attempts=3)}
    sf = {**ok, "simulate": phase("scenario_failed", seconds=25.0, output_uri="file:///art/sf/simulate")}
    inf = {
        "prepare": phase("passed"),
        "simulate": phase("infra_failed", attempt=4, attempts=4, reason="OOMKilled <node-7>"),
        "evaluate": phase("upstream_failed", attempt=None, seconds=None),
        "report": phase("upstream_failed", attempt=None, seconds=None),
    }
    bad = {p: phase("upstream_failed", attempt=None, seconds=None) for p in PHASES}
    bad["prepare"] = phase("bad_input", reason="scenario v3 & map <missing>")
    docs = [
        {
            "shard": 1,
            "cases": [
                case("case-<b>&1", "bad_input", bad, graph="render"),
                case("c-sf", "scenario_failed", sf),
            ],
        },
        {
            "shard": 0,
            "cases": [
                case("c-ok", "passed", ok),
                case("c-retried", "passed", retried),
                case("c-inf", "infra_failed", inf),
            ],
        },
    ]
    return [ShardSummary.model_validate(d) for d in docs]


def report() -> dict[str, Any]:
    return build_report(
        HEAD,
        summaries(),
        {"weekly_summary": "passed"},
        run_id="scheduled__2026-12-07T06:00:00+00:00",
        generated_at=dt.datetime(2026, 12, 8, 9, 30, tzinfo=dt.UTC),
        manifest_sha256="f" * 64,
    )


def test_totals_and_phase_counts() -> None:
    r = report()
    assert r["totals"] == {
        "cases": 5,
        "passed": 2,
        "scenario_failed": 1,
        "bad_input": 1,
        "infra_failed": 1,
        "preempted": 0,
        "bad_build": 0,
        "not_started": 0,
        "missing": 1,
        "shards": 2,
    }
    overall = r["phase_outcomes"]["overall"]
    assert list(overall) == list(PHASES)
    assert overall["simulate"] == {"passed": 2, "scenario_failed": 1, "infra_failed": 1, "upstream_failed": 1}
    assert overall["prepare"] == {"passed": 4, "bad_input": 1}
    assert r["phase_outcomes"]["by_graph"]["render"]["prepare"] == {"bad_input": 1}
    assert sum(r["phase_outcomes"]["by_graph"]["standard"]["report"].values()) == 4
    assert r["run"] == {
        "name": "weekly_regression",
        "iso_week": "2026-W50",
        "run_class": "weekly",
        "deadline": "2026-12-13T18:00:00+00:00",
        "case_count": 6,
    }
    assert r["build"]["build_id"] == "b-2026.12.1"
    assert r["manifest_sha256"] == "f" * 64 and r["generated_at"] == "2026-12-08T09:30:00+00:00"
    assert r["run_phases"] == {"weekly_summary": "passed"}
    json.dumps(r)  # JSON-ready


def test_failed_cases_attempts_and_durations() -> None:
    r = report()
    failed = r["failed_cases"]
    assert [(f["case_id"], f["outcome"], f["phase"]) for f in failed] == [
        ("case-<b>&1", "bad_input", "prepare"),
        ("c-inf", "infra_failed", "simulate"),
        ("c-sf", "scenario_failed", "simulate"),
    ]
    assert failed[1]["reason"] == "OOMKilled <node-7>" and failed[1]["attempt"] == 4
    assert failed[2]["output_uri"] == "file:///art/sf/simulate" and failed[2]["shard"] == 1
    # 4 phases of c-ok, c-sf; c-retried has 3 attempts of simulate; c-inf 4 of simulate; bad 1
    assert r["attempts"] == {
        "total": 4 + 4 + 6 + 1 + 4 + 1,
        "phases": 4 + 4 + 4 + 2 + 1,
        "retried_phases": 2,
        "max_attempts": 4,
    }
    sim = r["durations"]["simulate"]
    assert sim == {"count": 4, "mean": 21.25, "p50": 20.0, "p95": 30.0, "max": 30.0}
    assert r["durations"]["evaluate"]["count"] == 3  # upstream_failed phases have no duration


def test_duration_stats() -> None:
    assert duration_stats([]) == {"count": 0}
    stats = duration_stats(float(i) for i in range(1, 101))
    assert stats == {"count": 100, "mean": 50.5, "p50": 50.0, "p95": 95.0, "max": 100.0}


def test_html_is_self_contained_and_escaped() -> None:
    page = render_html(report())
    assert page.startswith("<!doctype html>")
    assert "case-&lt;b&gt;&amp;1" in page and "case-<b>" not in page
    assert "OOMKilled &lt;node-7&gt;" in page and "scenario v3 &amp; map &lt;missing&gt;" in page
    for needle in (
        "weekly_regression",
        "2026-W50",
        "b-2026.12.1",
        "2026-12-13T18:00:00+00:00",
        "c-sf",
        "c-inf",
    ):
        assert needle in page
    assert "<script" not in page and "http://" not in page and "https://" not in page
    assert 'href="file:///art/sf/simulate"' in page
    assert "<table>" in page and "p95" in page


def test_html_of_an_empty_report() -> None:
    empty = build_report({}, [], {}, run_id="r", generated_at="now")
    assert empty["totals"]["cases"] == 0 and empty["failed_cases"] == []
    page = render_html(empty)
    assert "No failed cases." in page


def test_write_report(tmp_path: Path) -> None:
    layout = RunLayout(f"file://{tmp_path}", "rk")
    uris = write_report(layout, report())
    folder = f"{layout.report_dir}"
    assert uris == {
        "csv": f"{folder}/cases.csv",
        "durations": f"{folder}/durations.svg",
        "failures": f"{folder}/failures.svg",
        "html": f"{folder}/report.html",
        "json": f"{folder}/report.json",
    }, "no progress plot: these summaries carry no phase end times"
    on_disk = json.loads(Path(uris["json"].removeprefix("file://")).read_text())
    assert on_disk["totals"]["cases"] == 5
    assert "cases" not in on_disk, "the rows are in cases.csv, not in report.json"
    assert on_disk["files"] == {
        "csv": "cases.csv",
        "plots": {"durations": "durations.svg", "failures": "failures.svg"},
    }
    page = Path(uris["html"].removeprefix("file://")).read_text()
    assert "c-inf" in page
    assert '<img src="durations.svg"' in page and '<img src="failures.svg"' in page
    assert '<a href="cases.csv">' in page


def test_a_stopped_week_s_report_makes_no_pace_claim() -> None:
    """Issue 31: 20 of 400 cases finished when the canary gate stopped the week; "ahead by 17.4" was false."""
    progress = {
        "start": "2026-12-07T06:00:00+00:00",
        "now": "2026-12-07T06:05:00+00:00",
        "planned_cases": 400,
        "finished_cases": 20,
        "planned_by_now": 2.6,
        "ahead_by_cases": 17.4,
        "peak_gpus": 1,
    }
    stopped = render_html({**report(), "progress": progress})
    assert 'id="progress-note"' in stopped and "20 of 400 cases finished" in stopped
    assert "ahead" not in stopped and "planned pace by then" not in stopped
    done = {**progress, "finished_cases": 400, "ahead_by_cases": 397.4}
    assert "ahead by 397.40 cases" in render_html({**report(), "progress": done})


def test_every_class_the_page_shows_has_its_colour_from_the_vocabulary() -> None:
    """Issue 30 (1): the page's class colours are generated from the outcome vocabulary, not a copied
    list: every class a card, a table cell or a failed row can carry has a rule, an attempt's class in
    its plot's colour, a phase that never ran in the infrastructure failure's, and the cases a stopped
    week never started (a card the copied list had no colour for) in a neutral one."""
    import re

    from avsim.report.build import PHASE_OUTCOMES
    from avsim.report.plots import COLOURS

    page = render_html(report())
    css = page[page.index("<style>") : page.index("</style>")]
    rules = dict(re.findall(r"\.([a-z_]+)\{color:(#[0-9a-f]{6})\}", css))
    assert set(PHASE_OUTCOMES) <= set(rules), set(PHASE_OUTCOMES) - set(rules)
    assert {o.value: rules[o.value] for o in ENDED} == COLOURS
    assert rules[Outcome.UPSTREAM_FAILED.value] == rules[NOT_RUN] == COLOURS[Outcome.INFRA_FAILED.value]
    assert rules[NOT_STARTED] not in COLOURS.values()
