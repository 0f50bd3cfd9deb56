"""The weekly report: one JSON document built from the shard summaries, written with its files.

:func:`build_report` is a pure function of the run's head, the shard summaries and the run-level phases'
outcomes, with one row per case; :func:`write_report` adds what needs the store (scenarios, the previous
week) and writes under ``report/``: ``cases.csv``, the plots, ``report.html`` and, last, ``report.json``.
A rerun's report has a ``rerun`` section (:mod:`avsim.report.rerun`); other runs have ``rerun: null``.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from avsim.artifacts import RunLayout
from avsim.contracts.week import NOT_STARTED, CaseSummary, ShardSummary
from avsim.phases.contract import ENDED, FAILURE_ORDER, NOT_RUN, Outcome, values
from avsim.report.cases import case_row, parse_time
from avsim.verdict import failing_phase

#: Case-level outcomes, in the order totals list them.
CASE_OUTCOMES = (*values(ENDED), NOT_STARTED)
#: Phase-level outcomes, in the order tables list them.
PHASE_OUTCOMES = (*CASE_OUTCOMES, Outcome.UPSTREAM_FAILED.value, NOT_RUN)
#: Order of failed cases: the ones that need an engineer first.
_FAILURE_ORDER = {o.value: i for i, o in enumerate(FAILURE_ORDER)}
#: Most points of the progress timeline kept in report.json.
TIMELINE_POINTS = 200
REPORT_SCHEMA = "avsim/report/v2"


def rerun_of(head: Mapping[str, Any]) -> str | None:
    """The run key the head's run reruns (``run.rerun_of``, set by ``avsim rerun-failed``), or None."""
    run = head.get("run") if isinstance(head.get("run"), Mapping) else {}
    assert isinstance(run, Mapping)
    key = run.get("rerun_of")
    return str(key) if key else None


def _run_info(head: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(run, build) from the head: its ``run`` section (the manifest's), falling back to top-level keys."""
    run = head.get("run") if isinstance(head.get("run"), Mapping) else {}
    assert isinstance(run, Mapping)

    def pick(key: str) -> Any:
        return run.get(key, head.get(key))

    build = pick("build") if isinstance(pick("build"), Mapping) else {}
    cases = head.get("cases")
    case_count = pick("case_count")
    if case_count is None and isinstance(cases, list | tuple):
        case_count = len(cases)
    info = {
        "name": pick("name"),
        "iso_week": pick("iso_week"),
        "deadline": pick("deadline"),
        "run_class": pick("run_class"),
        "case_count": case_count,
    }
    return info, {
        "build_id": build.get("build_id", head.get("build_id")),
        "image": build.get("image", head.get("image")),
    }


def _count(table: dict[str, dict[str, int]], phase: str, outcome: str) -> None:
    per = table.setdefault(phase, {})
    per[outcome] = per.get(outcome, 0) + 1


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of sorted ``values`` (not empty)."""
    return values[max(0, math.ceil(q * len(values)) - 1)]


def duration_stats(values: Iterable[float]) -> dict[str, float | int]:
    v = sorted(values)
    if not v:
        return {"count": 0}
    return {
        "count": len(v),
        "mean": round(sum(v) / len(v), 3),
        "p50": round(percentile(v, 0.5), 3),
        "p95": round(percentile(v, 0.95), 3),
        "max": round(v[-1], 3),
    }


class _Tally:
    """What the report counts over the week's cases, one case at a time."""

    def __init__(self, head: dict[str, Any]) -> None:
        self.head = head
        self.totals: dict[str, int] = dict.fromkeys(CASE_OUTCOMES, 0)
        self.overall: dict[str, dict[str, int]] = {}
        self.by_graph: dict[str, dict[str, dict[str, int]]] = {}
        self.durations: dict[str, list[float]] = {}
        self.failed: list[dict[str, Any]] = []
        self.attempts = {"total": 0, "phases": 0, "retried_phases": 0, "max_attempts": 0}
        self.rows: list[dict[str, Any]] = []

    def add(self, case: CaseSummary, shard: int) -> None:
        outcome, graph = case.outcome_name, case.graph
        self.totals[outcome] = self.totals.get(outcome, 0) + 1
        for phase, entry in case.phases.items():
            _count(self.overall, phase, entry.outcome_name)
            _count(self.by_graph.setdefault(graph, {}), phase, entry.outcome_name)
            n = entry.attempts
            self.attempts["total"] += n
            self.attempts["phases"] += 1 if n else 0
            self.attempts["retried_phases"] += 1 if n > 1 else 0
            self.attempts["max_attempts"] = max(self.attempts["max_attempts"], n)
            if entry.outcome in ENDED and entry.duration_seconds is not None:  # the phase ran and ended
                self.durations.setdefault(phase, []).append(entry.duration_seconds)
        passed = case.outcome is Outcome.PASSED
        failing = failing_phase(case) if not passed else ("", None)
        self.rows.append(case_row(case, self.head, failing, shard))
        if not passed:
            name, failed = failing
            self.failed.append(
                {
                    "case_id": case.case_id,
                    "graph": graph,
                    "outcome": outcome,
                    "phase": name,
                    "reason": failed.reason if failed else "",
                    "attempt": failed.attempt if failed else None,
                    "output_uri": failed.output_uri if failed else "",
                    "shard": shard,
                }
            )


def build_report(
    head: dict[str, Any],
    summaries: list[ShardSummary],
    run_phase_outcomes: dict[str, Any],
    *,
    run_id: str,
    generated_at: dt.datetime | str,
    manifest_sha256: str | None = None,
) -> dict[str, Any]:
    """The weekly report as a JSON-ready dict (see ``report.json``)."""
    run, build = _run_info(head)
    tally = _Tally(head)
    seen: set[str] = set()
    for summary in sorted(summaries, key=lambda s: s.shard):
        for case in summary.cases:
            if case.case_id not in seen:  # a shard summarized twice (a rerun): count the case once
                seen.add(case.case_id)
                tally.add(case, summary.shard)
    tally.failed.sort(key=lambda f: (_FAILURE_ORDER.get(f["outcome"], 9), f["graph"], f["case_id"]))
    cases = sum(tally.totals.values())
    expected = run.get("case_count")
    stamp = generated_at.isoformat() if isinstance(generated_at, dt.datetime) else str(generated_at)
    return {
        "schema": REPORT_SCHEMA,
        "run_id": run_id,
        "generated_at": stamp,
        "manifest_sha256": manifest_sha256,
        "run": run,
        "build": build,
        "rerun": {"of": key} if (key := rerun_of(head)) else None,
        "totals": {
            "cases": cases,
            **tally.totals,
            "missing": max(0, int(expected) - cases) if isinstance(expected, int) else 0,
            "shards": len(summaries),
        },
        "phase_outcomes": {"overall": tally.overall, "by_graph": tally.by_graph},
        "run_phases": {str(k): getattr(v, "value", v) for k, v in run_phase_outcomes.items()},
        "failed_cases": tally.failed,
        "attempts": tally.attempts,
        "durations": {phase: duration_stats(v) for phase, v in tally.durations.items()},
        "gpu_seconds": _gpu_seconds(tally.rows),
        "timeline": timeline(tally.rows),
        "cases": tally.rows,
    }


def _gpu_seconds(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """GPU-seconds of the committed attempts, in total and per graph."""
    by_graph: dict[str, float] = {}
    for r in rows:
        by_graph[r["graph"]] = by_graph.get(r["graph"], 0.0) + float(r["gpu_seconds"])
    return {
        "total": round(sum(by_graph.values()), 3),
        "by_graph": {k: round(v, 3) for k, v in by_graph.items()},
    }


def timeline(rows: list[dict[str, Any]], points: int = TIMELINE_POINTS) -> list[list[Any]]:
    """Cases finished against time, ``[[iso time, cases finished by then], ...]``, at most ``points``."""
    times = sorted(t for t in (parse_time(r.get("finished_at")) for r in rows) if t is not None)
    if not times:
        return []
    step = max(1, math.ceil(len(times) / points))
    picked = list(range(step - 1, len(times), step))
    if picked[-1] != len(times) - 1:
        picked.append(len(times) - 1)
    return [[times[i].isoformat(), i + 1] for i in picked]


def with_scenarios(layout: RunLayout, cases: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The report's case rows with each case's scenario URI and version (from its shard's cases file)."""
    from avsim.report.cases import scenarios_of

    rows = [dict(r) for r in cases]
    shards = sorted({int(r["shard"]) for r in rows if str(r.get("shard", "")).isdigit()})
    scenario = scenarios_of(d for d in (_read_json(layout.shard_cases(k)) for k in shards) if d)
    for r in rows:
        r["scenario_uri"], r["scenario_version"] = scenario.get(r["case_id"], ("", ""))
    return rows


def week_case_rows(layout: RunLayout, head: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The week's case rows as its report has them now (from the ledger's shard summaries); ``head``:
    the run's manifest head when the caller has read it."""
    from avsim.ledger.store import Ledger
    from avsim.storage import read_json

    head = head if head is not None else read_json(layout.head_uri)
    report = build_report(head, Ledger(layout).shard_summaries(), {}, run_id=layout.run_key, generated_at="")
    return with_scenarios(layout, report["cases"])


def write_report(layout: RunLayout, report: dict[str, Any], lead_html: str = "") -> dict[str, str]:
    """Complete ``report`` and write its files; ``report.json`` last (its presence means complete).
    ``lead_html``: a section the HTML page opens with (the week's triage).

    Returns the URIs written: ``html``, ``json``, ``csv`` and one per plot (``progress``, ...).
    """
    from avsim.report.cases import to_csv
    from avsim.report.compare import previous_week
    from avsim.report.html import render_html
    from avsim.report.plots import PLOTS, plots_available, render_plots
    from avsim.report.rerun import rerun_section
    from avsim.report.timeline_source import week_timeline
    from avsim.storage import path

    folder = layout.report_dir
    rows = with_scenarios(layout, report.get("cases") or [])
    run: dict[str, Any] = report.get("run") or {}
    doc = {k: v for k, v in report.items() if k != "cases"}
    doc["comparison"] = previous_week(layout.root, str(run.get("iso_week") or ""), rows, read_text)
    rerun = report.get("rerun") or {}
    if rerun.get("of"):
        doc["rerun"] = rerun_section(
            layout.root, str(rerun["of"]), report.get("build") or {}, rows, read_text
        )
    progress = week_timeline(
        layout,
        finished={str(r["case_id"]) for r in rows},
        fallback_deadline=run.get("deadline"),
        fallback_cases=run.get("case_count"),
    )
    doc["progress"] = progress.to_json()
    plots = render_plots(rows, run.get("case_count"), run.get("deadline"), progress)
    doc["files"] = {"csv": "cases.csv", "plots": {k: v for k, v in PLOTS.items() if v in plots}}
    if not plots_available():
        doc["files"]["plots_missing"] = True
    first = path(f"{folder}/cases.csv")
    if str(first.protocol) in ("file", "local"):
        first.parent.mkdir(parents=True, exist_ok=True)
    uris = {"csv": f"{folder}/cases.csv"}
    first.write_text(to_csv(rows))
    for key, name in PLOTS.items():
        if name in plots:
            uris[key] = f"{folder}/{name}"
            path(uris[key]).write_text(plots[name])
    uris["html"] = f"{folder}/report.html"
    path(uris["html"]).write_text(render_html(doc, lead_html))
    uris["json"] = f"{folder}/report.json"
    path(uris["json"]).write_text(json.dumps(doc, indent=1, sort_keys=True, default=str))
    return uris


def read_text(uri: str) -> str | None:
    from avsim.storage import path

    try:
        return str(path(uri).read_text())
    except FileNotFoundError:
        return None


def _read_json(uri: str) -> dict[str, Any] | None:
    text = read_text(uri)
    try:
        doc = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None
