"""The weekly-run page tells a repaired or stopped week's truth (issue 31, item 11).

Weeks are built as the page finds them: the metadata database's rows (``bench.ui_progress``'s
:func:`build_week` on SQLite, then the rows a stopped week leaves: parent run ended ``failed``,
canary shard run failed, no shard run started) and the artifact store's documents (manifest head,
plan, canary gate decision, breaker record, the tracker's last estimate, the ledger's attempt
records and outcome records), then read through :func:`week_progress` like the API does.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from bench.ui_progress import NOW, WeekSpec, build_week, metadata_engine
from sqlalchemy import update
from sqlalchemy.orm import Session

from avsim.artifacts import RUN_LEVEL_CASE, RunLayout, breaker_uri, run_key_for
from avsim.ledger.records import AttemptRecord, OutcomeRecord
from avsim.phases.contract import Outcome
from avsim.ui.progress import Digest
from avsim.ui.week import resolve_week, week_progress
from avsim.verdict import needs_attention

DAG, SHARD_DAG = "avsim_weekly", "avsim_weekly_shard"
GPU_POOLS = ("avsim_gpu_spot", "avsim_gpu_on_demand")
DIGEST = "sha256:" + "c" * 64


def put(uri: str, doc: Any) -> None:
    p = Path(uri.removeprefix("file://"))
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(doc))


def read(uri: str) -> Any:
    return json.loads(Path(uri.removeprefix("file://")).read_text())


def progress(engine: Any, run_id: str, now: dt.datetime = NOW, **kw: Any) -> dict[str, Any]:
    with Session(engine) as s:
        ref = resolve_week(s, DAG, run_id, "file:///elsewhere")
        assert ref is not None
        return week_progress(s, ref, gpu_pools=GPU_POOLS, now=now, **kw)


def _attempts(layout: RunLayout, cases: list[str], start: dt.datetime, minutes: float) -> None:
    """One ended simulate attempt per case, spread over ``minutes`` from ``start``, and their summary."""
    step = dt.timedelta(minutes=minutes) / max(1, len(cases))
    for i, case_id in enumerate(cases):
        begin = start + step * i
        rec = AttemptRecord(
            run_key=layout.run_key,
            case_id=case_id,
            phase="simulate",
            attempt=1,
            started_at=begin.isoformat(),
            ended_at=(begin + step).isoformat(),
            exit_code=1,
            outcome=Outcome.INFRA_FAILED,
            reason="crash",
            output_uri="",
            host="node-1",
            duration_seconds=step.total_seconds(),
            gpus=1,
        )
        put(layout.attempt_record(case_id, "simulate", 1), rec.to_json())
    put(
        layout.shard_summary(0),
        {"shard": 0, "cases": [{"case_id": c, "outcome": "infra_failed", "phases": {}} for c in cases]},
    )


@pytest.fixture
def stopped(tmp_path: Path) -> Any:
    """A 400-case week stopped by the canary gate: 20 canary cases ran, 380 never started.

    The weekly run ended ``failed`` five minutes after it started; its deadline is 8 hours later.
    """
    engine = metadata_engine(tmp_path / "airflow.db")
    root = f"file://{tmp_path}/artifacts"
    run_id = "scheduled__2026-12-07T06:00:00+00:00"
    spec = WeekSpec(
        run_id=run_id, cases=400, shard_size=100, canary_cases=20, active_shards=0, pending_shards=4
    )
    with engine.begin() as conn:
        build_week(conn, spec, root)
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance

    start = NOW - dt.timedelta(minutes=10)
    ended = start + dt.timedelta(minutes=5)
    deadline = ended + dt.timedelta(hours=8)
    with Session(engine) as s:
        s.execute(
            update(DagRun)
            .where(DagRun.dag_id == DAG, DagRun.run_id == run_id)
            .values(state="failed", start_date=start, end_date=ended)
        )
        s.execute(
            update(DagRun)
            .where(DagRun.dag_id == SHARD_DAG, DagRun.run_id == f"{run_id}__canary")
            .values(state="failed", start_date=start, end_date=ended)
        )
        # The run-level summary as the breaker left it before issue 31: refused as bad_build.
        from bench.ui_progress import _ti_row

        row = _ti_row(DAG, run_id, "run_phases.weekly_summary", -1, "failed", 1, ended, 0.1, "avsim_cpu", 1)
        s.execute(TaskInstance.__table__.insert(), [row])
        s.commit()
    layout = RunLayout(root, run_key_for(DAG, run_id))
    head = read(layout.head_uri)
    head["run"]["deadline"] = deadline.isoformat()
    head["run"]["canary"] = {"enabled": True, "share": 0.05, "min_cases": 20, "max_failure_rate": 0.2}
    head["run_phases"] = {"weekly_summary": {"kind": "summary"}}
    put(layout.head_uri, head)
    plan = read(layout.plan_uri)
    put(layout.plan_uri, {**plan, "deadline": deadline.isoformat(), "canary_cases": 20})
    put(
        layout.canary_gate,
        {"state": "failed", "cases": 20, "finished": 20, "failures": 20, "rate": 1.0, "threshold": 0.2},
    )
    put(breaker_uri(root, DIGEST), {"state": "open", "failures": 20, "finished": 20, "threshold": 0.5})
    # The tracker's last estimate, written while the canary ran: an estimate for a run now ended.
    put(
        layout.deadline_latest,
        {
            "at": (start + dt.timedelta(minutes=4)).isoformat(),
            "estimated_finish": (start + dt.timedelta(hours=3)).isoformat(),
            "deadline": deadline.isoformat(),
            "gpus_needed": 12,
            "action": "hold",
        },
    )
    _attempts(layout, [f"case-{i:05d}" for i in range(20)], start, 4.0)
    refused = OutcomeRecord(
        run_key=layout.run_key,
        case_id=RUN_LEVEL_CASE,
        phase="weekly_summary",
        attempt=1,
        outcome=Outcome.BAD_BUILD,
        output_uri="",
        committed_at=ended.isoformat(),
        reason=f"circuit breaker open for build sim-2026.50.1 ({DIGEST}): 20 of 20 failed; nothing launched",
        detail="breaker_open",
    )
    put(layout.outcome_record(RUN_LEVEL_CASE, "weekly_summary"), refused.to_json())
    return engine, run_id, layout, deadline


# -- 1. failed scenarios are results: never in the red count ----------------------------------------
def test_a_repaired_week_of_passed_and_failed_scenarios_needs_no_attention() -> None:
    """The repaired 40-case week: 35 passed, 5 scenario_failed. Nothing is red."""
    from avsim.ui.week_parts import cases_doc as _cases

    repaired = Digest(cases={("done", "passed"): 35, ("done", "scenario_failed"): 5})
    cases = _cases([repaired], 40)
    assert cases["done"] == 40 and cases["attention"] == 0
    assert cases["results"] == {"passed": 35, "scenario_failed": 5}
    assert "failed" not in cases, "no count mixes results with failures"


def test_the_red_count_is_the_classes_the_verdict_says_need_attention(tmp_path: Path) -> None:
    engine = metadata_engine(tmp_path / "airflow.db")
    spec = WeekSpec(run_id="r", cases=530, shard_size=100, active_shards=2, canary_cases=30)
    with engine.begin() as conn:
        truth = build_week(conn, spec, f"file://{tmp_path}/artifacts")
    cases = progress(engine, "r")["cases"]
    assert truth.done_by_class["scenario_failed"] > 0
    assert cases["attention"] == sum(n for c, n in truth.done_by_class.items() if needs_attention(c))
    assert cases["results"]["scenario_failed"] == truth.done_by_class["scenario_failed"]


# -- 2. a week without a canary --------------------------------------------------------------------
def test_a_week_whose_manifest_disables_the_canary_says_so_without_a_storage_path(tmp_path: Path) -> None:
    engine = metadata_engine(tmp_path / "airflow.db")
    root = f"file://{tmp_path}/artifacts"
    spec = WeekSpec(run_id="r", cases=200, shard_size=100, active_shards=1)
    with engine.begin() as conn:
        build_week(conn, spec, root)
    layout = RunLayout(root, run_key_for(DAG, "r"))
    head = read(layout.head_uri)
    head["run"]["canary"] = {"enabled": False, "share": 0.01, "min_cases": 20, "max_failure_rate": 0.2}
    put(layout.head_uri, head)
    put(layout.plan_uri, {**read(layout.plan_uri), "canary_cases": 0})
    doc = progress(engine, "r")
    canary = doc["canary"]
    assert canary["state"] == "off" and "off for this week" in canary["message"]
    assert "disables" in canary["message"]
    assert "file://" not in json.dumps({k: v for k, v in doc.items() if k != "links"})


def test_a_week_too_small_for_a_canary_and_one_still_waiting_for_its_gate(tmp_path: Path) -> None:
    engine = metadata_engine(tmp_path / "airflow.db")
    root = f"file://{tmp_path}/artifacts"
    spec = WeekSpec(run_id="r", cases=15, shard_size=100, active_shards=1)
    with engine.begin() as conn:
        build_week(conn, spec, root)
    layout = RunLayout(root, run_key_for(DAG, "r"))
    head = read(layout.head_uri)
    head["run"]["canary"] = {"enabled": True, "share": 0.01, "min_cases": 20, "max_failure_rate": 0.2}
    put(layout.head_uri, head)
    put(layout.plan_uri, {**read(layout.plan_uri), "canary_cases": 0})
    canary = progress(engine, "r")["canary"]
    assert canary["state"] == "off" and "15 cases" in canary["message"], canary
    # A week with a canary whose gate has not decided yet: no decision, and no path either.
    put(layout.plan_uri, {**read(layout.plan_uri), "canary_cases": 20})
    canary = progress(engine, "r")["canary"]
    assert canary["state"] == "waiting" and "file://" not in json.dumps(canary), canary


# -- 3. a week stopped by the canary gate ----------------------------------------------------------
def test_cases_of_a_stopped_week_are_not_started_not_waiting(stopped: Any) -> None:
    engine, run_id, _layout, _deadline = stopped
    doc = progress(engine, run_id)
    cases = doc["cases"]
    assert doc["run"]["state"] == "failed"
    assert cases["planned"] == 400 and cases["done"] == 20
    assert cases["waiting"] == 0 and cases["not_started"] == 380
    assert cases["stopped_because"] == "stopped by the canary gate"


def test_an_ended_run_makes_no_pace_or_finish_claim(stopped: Any) -> None:
    engine, run_id, _layout, _deadline = stopped
    doc = progress(engine, run_id, timelines=None)
    tl = doc["timeline"]
    assert tl["available"] and tl["finished_cases"] == 20
    assert tl["ended"] is True and tl["planned_by_now"] is None and tl["ahead_by_cases"] is None
    dl = doc["deadline"]
    assert dl["verdict"]["state"] == "ended" and "ended" in dl["verdict"]["text"]
    assert dl["estimated_finish"] is None and dl["gpus_needed"] is None


def test_a_running_week_keeps_its_pace(stopped: Any) -> None:
    """The same week before it ended: the pace and the estimate are shown."""
    from airflow.models.dagrun import DagRun

    engine, run_id, _layout, _deadline = stopped
    with Session(engine) as s:
        s.execute(update(DagRun).where(DagRun.run_id == run_id).values(state="running", end_date=None))
        s.commit()
    doc = progress(engine, run_id)
    assert doc["timeline"]["ended"] is False and doc["timeline"]["ahead_by_cases"] is not None
    assert doc["deadline"]["verdict"]["state"] == "early" and doc["deadline"]["gpus_needed"] == 12
    assert doc["cases"]["waiting"] == 380 and doc["cases"]["not_started"] == 0


# -- 4. the run-level summary of a stopped week -----------------------------------------------------
def test_a_stopped_weeks_summary_refused_by_the_breaker_is_no_victim_of_the_build(stopped: Any) -> None:
    engine, run_id, _layout, _deadline = stopped
    phases = progress(engine, run_id)["run_phases"]
    assert [p["phase"] for p in phases] == ["weekly_summary"]
    summary = phases[0]
    assert summary["shown"] == "not_run" and summary["attention"] is False, summary
    assert summary["task_state"] == "failed" and "breaker" in summary["text"]
    assert "bad_build" not in summary["text"]


def test_a_stopped_weeks_summary_that_ran_shows_its_result(stopped: Any) -> None:
    engine, run_id, layout, _deadline = stopped
    ran = OutcomeRecord(
        run_key=layout.run_key,
        case_id=RUN_LEVEL_CASE,
        phase="weekly_summary",
        attempt=2,
        outcome=Outcome.PASSED,
        output_uri="",
        committed_at=NOW.isoformat(),
    )
    put(layout.outcome_record(RUN_LEVEL_CASE, "weekly_summary"), ran.to_json())
    from airflow.models.taskinstance import TaskInstance

    with Session(engine) as s:
        s.execute(update(TaskInstance).where(TaskInstance.dag_id == DAG).values(state="success"))
        s.commit()
    (summary,) = progress(engine, run_id)["run_phases"]
    assert summary["shown"] == "passed" and summary["attention"] is False
    assert "stopped week" in summary["text"] and "380" in summary["text"]


# -- 5. the time axis --------------------------------------------------------------------------------
def test_the_chart_of_a_five_minute_week_spans_its_data_and_marks_a_far_deadline(stopped: Any) -> None:
    import xml.etree.ElementTree as ET

    engine, run_id, _layout, _deadline = stopped
    svg = progress(engine, run_id)["timeline"]["svg"]
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    finished = root.find(f".//{ns}polyline[@data-series='finished']")
    assert finished is not None
    xs = [float(p.split(",")[0]) for p in str(finished.get("points")).split()]
    # The finished line spans most of the plot's width, not a sliver at its left edge.
    assert max(xs) - min(xs) > 0.6 * (720 - 52 - 12), xs
    assert root.find(f".//{ns}line[@data-series='deadline']") is None, "not drawn on the axis"
    note = root.find(f".//{ns}text[@data-series='deadline']")
    assert note is not None and note.text == "deadline 8 h 0 min later →", (
        note.text if note is not None else None
    )
