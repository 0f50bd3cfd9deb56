"""The weekly report: one JSON document built from the shard summaries, written with its HTML page.

:func:`build_report` is a pure function of the run's head (``head.json`` of the manifest snapshot),
the shard summaries (:func:`avsim.ledger.store.summarize_shard`) and the run-level phases' outcomes;
:func:`write_report` puts ``report.json`` and ``report.html`` under the run's ``report/`` prefix.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from avsim.artifacts import RunLayout

#: Case-level outcomes, in the order totals list them.
CASE_OUTCOMES = ("passed", "scenario_failed", "bad_input", "infra_failed")
#: Phase-level outcomes, in the order tables list them.
PHASE_OUTCOMES = (*CASE_OUTCOMES, "upstream_failed", "not_run")
#: Phase outcomes that carry a duration worth counting (the phase ran and ended).
TIMED_OUTCOMES = ("passed", "scenario_failed", "bad_input", "infra_failed")
#: Order of failed cases: the ones that need an engineer first.
_FAILURE_ORDER = {"bad_input": 0, "infra_failed": 1, "scenario_failed": 2}
REPORT_SCHEMA = "avsim/report/v1"


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


def failing_phase(case: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The phase that gave a failed case its outcome: the first one in phase order with that outcome."""
    phases: Mapping[str, Any] = case.get("phases") or {}
    outcome = case.get("outcome")
    if outcome == "infra_failed":
        wanted: tuple[str, ...] = ("infra_failed", "not_run", "upstream_failed")
    else:
        wanted = (str(outcome),)
    for target in wanted:  # an infra failure beats the not-run phases it caused
        for name, entry in phases.items():
            if isinstance(entry, Mapping) and entry.get("outcome") == target:
                return name, dict(entry)
    return "", {}


def build_report(
    head: dict[str, Any],
    summaries: list[dict[str, Any]],
    run_phase_outcomes: dict[str, Any],
    *,
    run_id: str,
    generated_at: dt.datetime | str,
    manifest_sha256: str | None = None,
) -> dict[str, Any]:
    """The weekly report as a JSON-ready dict (see ``report.json``)."""
    run, build = _run_info(head)
    totals: dict[str, int] = dict.fromkeys(CASE_OUTCOMES, 0)
    overall: dict[str, dict[str, int]] = {}
    by_graph: dict[str, dict[str, dict[str, int]]] = {}
    durations: dict[str, list[float]] = {}
    failed: list[dict[str, Any]] = []
    attempts = {"total": 0, "phases": 0, "retried_phases": 0, "max_attempts": 0}
    seen: set[str] = set()
    for summary in sorted(summaries, key=lambda s: int(s.get("shard", 0))):
        for case in summary.get("cases", []):
            cid = str(case.get("case_id"))
            if cid in seen:  # a shard summarized twice (a rerun): count the case once
                continue
            seen.add(cid)
            outcome, graph = str(case.get("outcome", "infra_failed")), str(case.get("graph") or "")
            totals[outcome] = totals.get(outcome, 0) + 1
            for phase, entry in (case.get("phases") or {}).items():
                p_out = str(entry.get("outcome", "not_run"))
                _count(overall, phase, p_out)
                _count(by_graph.setdefault(graph, {}), phase, p_out)
                n = int(entry.get("attempts") or 0)
                attempts["total"] += n
                attempts["phases"] += 1 if n else 0
                attempts["retried_phases"] += 1 if n > 1 else 0
                attempts["max_attempts"] = max(attempts["max_attempts"], n)
                seconds = entry.get("duration_seconds")
                if p_out in TIMED_OUTCOMES and isinstance(seconds, int | float):
                    durations.setdefault(phase, []).append(float(seconds))
            if outcome != "passed":
                phase, entry = failing_phase(case)
                failed.append(
                    {
                        "case_id": cid,
                        "graph": graph,
                        "outcome": outcome,
                        "phase": phase,
                        "reason": str(entry.get("reason") or ""),
                        "attempt": entry.get("attempt"),
                        "output_uri": str(entry.get("output_uri") or ""),
                        "shard": summary.get("shard"),
                    }
                )
    failed.sort(key=lambda f: (_FAILURE_ORDER.get(f["outcome"], 9), f["graph"], f["case_id"]))
    cases = sum(totals.values())
    expected = run.get("case_count")
    stamp = generated_at.isoformat() if isinstance(generated_at, dt.datetime) else str(generated_at)
    return {
        "schema": REPORT_SCHEMA,
        "run_id": run_id,
        "generated_at": stamp,
        "manifest_sha256": manifest_sha256,
        "run": run,
        "build": build,
        "totals": {
            "cases": cases,
            **totals,
            "missing": max(0, int(expected) - cases) if isinstance(expected, int) else 0,
            "shards": len(summaries),
        },
        "phase_outcomes": {"overall": overall, "by_graph": by_graph},
        "run_phases": {str(k): getattr(v, "value", v) for k, v in run_phase_outcomes.items()},
        "failed_cases": failed,
        "attempts": attempts,
        "durations": {phase: duration_stats(v) for phase, v in durations.items()},
    }


def write_report(layout: RunLayout, report: dict[str, Any]) -> dict[str, str]:
    """Write ``report.html`` then ``report.json`` (whose presence means the report is complete)."""
    from avsim.report.html import render_html
    from avsim.storage import path

    uris = {"html": f"{layout.report_dir}/report.html", "json": f"{layout.report_dir}/report.json"}
    page = path(uris["html"])
    if str(page.protocol) in ("file", "local"):
        page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(render_html(report))
    path(uris["json"]).write_text(json.dumps(report, indent=1, sort_keys=True, default=str))
    return uris
