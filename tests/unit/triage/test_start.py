"""A round of triage as :func:`avsim.triage.start.plan_round` decides it: pure, over typed values."""

from __future__ import annotations

import datetime as dt
from typing import Any

from avsim.contracts import RunDescriptor
from avsim.manifest.models import PhaseSpec, RunClass
from avsim.plan.build import family_plan
from avsim.plan.model import WeeklyPlan
from avsim.settings import AvsimSettings, TriageSettings
from avsim.triage.model import BuildSide, TriageVerdict
from avsim.triage.runs import rerun_entries
from avsim.triage.start import plan_round

NOW = dt.datetime(2026, 12, 7, 12, tzinfo=dt.UTC)
IMAGE_B = "reg/sim@sha256:" + "b" * 64
IMAGE_A = "reg/sim@sha256:" + "a" * 64


def _spec(cls: str, seconds: float, *after: str) -> PhaseSpec:
    return PhaseSpec.model_validate(
        {
            "resources": {"class": cls, "gpus": 1 if cls == "gpu" else 0},
            "estimated_duration_seconds": seconds,
            "timeout_seconds": seconds * 2,
            "command": ["sim"],
            "depends_on": list(after),
        }
    )


FAMILY = family_plan(
    "driving",
    {
        "prepare": _spec("cpu", 180),
        "simulate": _spec("gpu", 1800, "prepare"),
        "report": _spec("cpu", 60, "simulate"),
    },
    AvsimSettings(),
    RunClass.ADHOC,
)
PLAN = WeeklyPlan(families=(FAMILY,), run_phases=(), pools=(), shard_size=10, max_active_shards=1)
WEEK = RunDescriptor(
    run_key="avsim_weekly__w50", artifact_root="file:///a", run_id="w50", image=IMAGE_B, iso_week="2026-W50"
)
HEAD = {
    "run": {"deadline": "2026-12-13T18:00:00Z"},
    "graphs": {"driving": {"phases": {"simulate": {"deterministic_outputs": ["trace.jsonl"]}}}},
}


def _row(case: str, outcome: str, simulate: float | None = 10.0) -> dict[str, Any]:
    return {
        "case_id": case,
        "graph": "driving",
        "outcome": outcome,
        "failing_phase": "simulate" if outcome != "passed" else "",
        "gpu_seconds": simulate or 0.0,
        "durations": {"prepare": 2.0, "simulate": simulate, "report": 1.0 if outcome == "passed" else None},
        "shard": 1,
    }


def _failing(case: str) -> dict[str, Any]:
    return {
        "case_id": case,
        "graph": "driving",
        "outcome": "scenario_failed",
        "previous_outcome": "passed",
        "failing_phase": "simulate",
    }


def _comparison(*cases: str, image: str = IMAGE_A) -> dict[str, Any]:
    return {
        "available": True,
        "week": "2026-W49",
        "previous": {"run_key": "avsim_weekly__w49", "image": image},
        "newly_failing": [_failing(c) for c in cases],
    }


def _round(rows: list[dict[str, Any]], comparison: dict[str, Any], **kw: Any) -> Any:
    return plan_round(
        WEEK,
        PLAN,
        kw.pop("settings", TriageSettings(gpu_share=0.5, reruns=2, determinism_sample=0.0)),
        rows,
        comparison,
        kw.pop("head", HEAD),
        kw.pop("book", None),
        now=kw.pop("now", NOW),
        canary_stopped=kw.pop("canary_stopped", False),
    )


def test_a_round_reruns_each_case_k_times_on_both_builds() -> None:
    rows = [_row(f"p{i}", "passed") for i in range(10)] + [_row("f1", "scenario_failed", 4.0)]
    book, rnd = _round(rows, _comparison("f1"))
    assert rnd is not None and [c.case_id for c in rnd.chosen] == ["f1"]
    assert [(r.build, r.index, r.image) for r in rnd.runs] == [
        (BuildSide.THIS, 1, IMAGE_B),
        (BuildSide.THIS, 2, IMAGE_B),
        (BuildSide.LAST, 1, IMAGE_A),
        (BuildSide.LAST, 2, IMAGE_A),
    ]
    assert all(
        r.run_id.startswith("w50__triage_1_") and r.run_key.startswith(WEEK.run_key + "__triage_1_")
        for r in rnd.runs
    )
    # Four reruns of simulate (its own 4 s) and report (the week's median of 1 s, GPU-free): 16 GPU-s.
    assert rnd.planned_gpu_seconds == 16.0
    entries = {"f1": {"case_id": "f1", "family": "driving", "seed": 3}}
    by_family = rerun_entries(rnd.runs[0], entries, rnd.chosen, {"driving": FAMILY})
    assert by_family == {
        "driving": [{"case_id": "f1", "family": "driving", "seed": 3, "fresh_phases": ["simulate", "report"]}]
    }
    assert book.previous_build_digest == "sha256:" + "a" * 64


def test_what_does_not_fit_the_budget_or_the_deadline_is_listed_with_its_reason() -> None:
    rows = [_row(f"p{i}", "passed") for i in range(10)] + [
        _row("f1", "scenario_failed"),
        _row("f2", "scenario_failed"),
    ]
    _, rnd = _round(
        rows,
        _comparison("f1", "f2"),
        settings=TriageSettings(gpu_share=0.3, reruns=2, determinism_sample=0.0),
    )
    # The week used 120 GPU-s; 30 % is 36: one case's 40 GPU-s of reruns does not fit.
    assert rnd.chosen == () and {c.verdict for c in rnd.not_triaged} == {TriageVerdict.NOT_TRIAGED}
    assert "GPU-hours" in rnd.not_triaged[0].reason
    late = dt.datetime(2026, 12, 13, 17, 59, 55, tzinfo=dt.UTC)
    _, rnd = _round(rows, _comparison("f1"), now=late)
    assert "before the deadline" in rnd.not_triaged[0].reason


def test_nothing_to_triage_is_said_once_and_a_bad_build_gets_no_triage() -> None:
    rows = [_row("p1", "passed")]
    book, rnd = _round(
        rows, {"available": False, "week": "2026-W49", "message": "no weekly run recorded for 2026-W49"}
    )
    assert (
        rnd is None
        and book.message == "nothing to triage: no weekly run recorded for 2026-W49"
        and not book.rounds
    )
    book, rnd = _round([*rows, _row("f1", "scenario_failed")], _comparison("f1"), canary_stopped=True)
    assert rnd is None and "bad build" in book.message
    rerun = WEEK.model_copy(update={"rerun_of": "avsim_weekly__w50"})
    book, rnd = plan_round(
        rerun, PLAN, TriageSettings(), [*rows, _row("f1", "scenario_failed")], _comparison("f1"), HEAD, None,
        now=NOW, canary_stopped=False,
    )  # fmt: skip
    assert rnd is None and "reruns failed cases of avsim_weekly__w50" in book.message


def test_a_later_round_triages_only_the_cases_no_earlier_round_planned() -> None:
    rows = [_row(f"p{i}", "passed") for i in range(10)] + [
        _row("f1", "scenario_failed"),
        _row("f2", "scenario_failed"),
    ]
    book, _first = _round(
        rows, _comparison("f1"), settings=TriageSettings(gpu_share=1.0, determinism_sample=0.0)
    )
    again, none = _round(rows, _comparison("f1"), book=book)
    assert none is None and again == book
    later, second = _round(
        rows,
        _comparison("f1", "f2"),
        book=book,
        settings=TriageSettings(gpu_share=1.0, determinism_sample=0.0),
    )
    assert second is not None and second.round == 2 and [c.case_id for c in second.chosen] == ["f2"]
    assert all("__triage_2_" in r.run_id for r in second.runs) and len(later.runs) == 8


def test_the_audit_reruns_passed_cases_whose_graph_declares_deterministic_outputs() -> None:
    rows = [_row(f"p{i}", "passed") for i in range(10)]
    settings = TriageSettings(gpu_share=1.0, reruns=2, determinism_sample=0.005)
    _, rnd = _round(rows, _comparison(), settings=settings)
    assert rnd is not None and len(rnd.audit) == 5 and rnd.passed_cases == 10
    [run] = rnd.runs
    assert run.build is BuildSide.THIS and run.audit == rnd.audit and run.cases == ()
    book, none = _round(rows, _comparison(), settings=settings, head={"run": {}, "graphs": {}})
    assert none is None and "no case newly fails" in book.message


def test_a_case_left_without_a_verdict_of_the_build_is_taken_again_by_a_later_round() -> None:
    rows = [_row(f"p{i}", "passed") for i in range(10)] + [_row("f1", "scenario_failed")]
    wide = TriageSettings(gpu_share=1.0, determinism_sample=0.0)
    book, _ = _round(rows, _comparison("f1"), settings=wide)
    _, none = _round(rows, _comparison("f1"), book=book, settings=wide)
    assert none is None  # f1 got a verdict of its build: not again
    _, again = plan_round(
        WEEK, PLAN, wide, rows, _comparison("f1"), HEAD, book, now=NOW, canary_stopped=False,
        retry=frozenset({"f1"}),
    )  # fmt: skip
    assert again is not None and again.round == 2 and [c.case_id for c in again.chosen] == ["f1"]


def test_newly_passing_cases_are_confirmed_only_when_configured() -> None:
    rows = [_row(f"p{i}", "passed") for i in range(10)]
    comparison = {**_comparison(), "newly_passing": [{"case_id": "p3", "outcome": "passed"}]}
    _, none = _round(rows, comparison)
    assert none is None  # not configured: nothing to rerun
    on = TriageSettings(gpu_share=0.5, determinism_sample=0.0, confirm_passing=True)
    _, rnd = _round(rows, comparison, settings=on)
    assert rnd is not None and rnd.confirm == ("p3",) and [r.confirm for r in rnd.runs] == [("p3",)]
    assert rnd.planned_gpu_seconds == 10.0  # what the case cost the week
    poor = TriageSettings(gpu_share=0.05, determinism_sample=0.0, confirm_passing=True)
    assert _round(rows, comparison, settings=poor)[1].confirm == ()  # 5 GPU-s left: it does not fit
