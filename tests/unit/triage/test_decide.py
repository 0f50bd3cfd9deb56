"""Triage's decisions: the cases it picks, the verdict of their reruns, the budget and the audit."""

from __future__ import annotations

import random
from typing import Any

import pytest

from avsim.manifest.models import PhaseSpec, RunClass
from avsim.phases.contract import Outcome
from avsim.plan.build import family_plan
from avsim.plan.model import WeeklyPlan
from avsim.report.compare import previous_week
from avsim.settings import AvsimSettings
from avsim.triage.decide import (
    Candidate,
    audit_sample,
    differing_outputs,
    downstream_of,
    fit_budget,
    from_comparison,
    newly_failing,
    nothing_to_triage,
    rerun_cost,
    triage_case,
    verdict_of,
    with_plan,
)
from avsim.triage.model import BuildSide, Rerun, TriageVerdict

THIS = "sha256:" + "b" * 64
LAST = "sha256:" + "a" * 64
P, F, X, B = Outcome.PASSED, Outcome.SCENARIO_FAILED, Outcome.INFRA_FAILED, Outcome.BAD_BUILD


def row(case: str, outcome: str, uri: str = "", phase: str = "") -> dict[str, str]:
    return {
        "case_id": case,
        "scenario_uri": uri or f"s3://scenarios/{case}.xosc",
        "graph": "driving",
        "outcome": outcome,
        "failing_phase": phase,
    }


# ----------------------------------------------------------------------------- which cases


def test_only_cases_that_newly_fail_their_scenario_are_triaged() -> None:
    previous = [
        row("fails", "passed"),
        row("crashes", "passed"),
        row("still", "scenario_failed", phase="simulate"),
        row("fixed", "scenario_failed", phase="simulate"),
        row("old-name", "passed", uri="s3://scenarios/merge.xosc"),
    ]
    current = [
        row("fails", "scenario_failed", phase="evaluate"),
        row("crashes", "infra_failed", phase="simulate"),
        row("still", "scenario_failed", phase="simulate"),
        row("fixed", "passed"),
        row("new-name", "scenario_failed", uri="s3://scenarios/merge.xosc", phase="simulate"),
        row("brand-new", "scenario_failed", phase="simulate"),
    ]
    found = newly_failing(current, previous)
    assert [(c.case_id, c.previous_case_id, c.failing_phase) for c in found] == [
        ("fails", "fails", "evaluate"),
        ("new-name", "old-name", "simulate"),
    ]
    assert found[1].scenario_uri == "s3://scenarios/merge.xosc"


def test_no_previous_week_and_a_stopped_build_are_said_once() -> None:
    def read_text(uri: str) -> str | None:
        return None

    comparison = previous_week("file:///store", "2026-W50", [row("c", "scenario_failed")], read_text)
    assert nothing_to_triage(comparison) == (
        "nothing to triage: no weekly run recorded for 2026-W49 (file:///store/weeks/2026-W49.json)"
    )
    assert from_comparison(comparison) == ()
    assert nothing_to_triage(comparison, canary_stopped=True).startswith("the canary gate stopped")
    empty = {"available": True, "week": "2026-W49", "newly_failing": []}
    assert nothing_to_triage(empty) == "nothing to triage: no case newly fails its scenario against 2026-W49"
    entry = {"case_id": "c", "outcome": "scenario_failed", "previous_outcome": "passed", "failing_phase": "x"}
    assert nothing_to_triage({**empty, "newly_failing": [entry]}) == ""


# ----------------------------------------------------------------------------- the verdict


def reruns(this: list[Outcome | None], last: list[Outcome | None]) -> list[Rerun]:
    def make(side: BuildSide, digest: str, i: int, o: Outcome | None) -> Rerun:
        reason = "image not pullable" if o is None else ""
        return Rerun(case_id="c", build=side, build_digest=digest, index=i, outcome=o, reason=reason)

    return [make(BuildSide.THIS, THIS, i, o) for i, o in enumerate(this, 1)] + [
        make(BuildSide.LAST, LAST, i, o) for i, o in enumerate(last, 1)
    ]


@pytest.mark.parametrize(
    ("this", "last", "verdict", "says"),
    [
        ([F, F], [P], TriageVerdict.REGRESSION, "failed its scenario in 2 of 2 reruns of this build"),
        ([F, P], [P], TriageVerdict.FLAKY, "passed on 1 of 2 reruns of this build"),
        ([P, P], [F], TriageVerdict.FLAKY, "passed on 2 of 2"),
        ([F, F], [F], TriageVerdict.FLAKY, "on last week's build (sha256:aaaaaaaaaaaa) too"),
        ([X, P], [None], TriageVerdict.FLAKY, "passed on 1 of 2"),
        ([F, F], [None], TriageVerdict.ENVIRONMENT, "rerun 1 on last week's build could not start"),
        ([F, F], [B], TriageVerdict.ENVIRONMENT, "ended bad_build"),
        ([F, X], [P], TriageVerdict.ENVIRONMENT, "rerun 2 on this build ended infra_failed"),
        ([F], [P], TriageVerdict.ENVIRONMENT, "1 of 2 reruns of this build ran"),
        ([F, F], [], TriageVerdict.ENVIRONMENT, "no rerun on last week's build ran"),
        ([], [], TriageVerdict.ENVIRONMENT, "0 of 2 reruns of this build ran"),
    ],
)
def test_the_verdict_follows_the_rules(
    this: list[Outcome | None], last: list[Outcome | None], verdict: TriageVerdict, says: str
) -> None:
    found, reason = verdict_of(reruns(this, last), k=2)
    assert found is verdict and says in reason, reason


def test_a_case_keeps_its_own_reruns_only() -> None:
    candidate = Candidate(case_id="c", failing_phase="simulate", graph="driving")
    stranger = Rerun(case_id="d", build=BuildSide.THIS, build_digest=THIS, index=1, outcome=P)
    done = triage_case(candidate, [*reruns([F, F], [P]), stranger])
    assert done.verdict is TriageVerdict.REGRESSION and len(done.reruns) == 3


# ----------------------------------------------------------------------------- the budget


def spec(cls: str, seconds: float, *after: str) -> PhaseSpec:
    resources: dict[str, Any] = {"class": cls, "gpus": 1 if cls == "gpu" else 0}
    return PhaseSpec.model_validate(
        {
            "resources": resources,
            "estimated_duration_seconds": seconds,
            "timeout_seconds": seconds * 2,
            "command": ["sim"],
            "depends_on": list(after),
        }
    )


PHASES = {
    "prepare": spec("cpu", 180),
    "simulate": spec("gpu", 1800, "prepare"),
    "evaluate": spec("cpu", 300, "simulate"),
    "render": spec("gpu", 600, "simulate"),
    "report": spec("cpu", 60, "evaluate", "render"),
}
FAMILY = family_plan("driving", PHASES, AvsimSettings(), RunClass.ADHOC)
PLAN = WeeklyPlan(families=(FAMILY,), run_phases=(), pools=(), shard_size=10, max_active_shards=1)


def test_a_rerun_costs_the_failing_phase_and_its_downstream() -> None:
    assert downstream_of(FAMILY, "simulate") == ("simulate", "evaluate", "render", "report")
    assert downstream_of(FAMILY, "render") == ("render", "report")
    cost = rerun_cost(FAMILY, "simulate", 3)
    assert cost.gpu_seconds == 3 * (1800 + 600)
    assert cost.wall_seconds == 1800 + 600 + 60
    assert rerun_cost(FAMILY, "evaluate", 3).gpu_seconds == 0
    with pytest.raises(KeyError):
        downstream_of(FAMILY, "nope")


def test_cases_are_ranked_by_their_plan_weight_and_fit_in_the_budget_in_that_order() -> None:
    found = [
        Candidate(case_id="a-render", graph="driving", failing_phase="render"),
        Candidate(case_id="b-sim", graph="driving", failing_phase="simulate"),
        Candidate(case_id="c-sim", graph="driving", failing_phase="simulate"),
        Candidate(case_id="d-other", graph="other", failing_phase="simulate"),
    ]
    ranked, costs = with_plan(PLAN, found, reruns=3)
    assert set(costs) == {"a-render", "b-sim", "c-sim"}
    # 3 x 2,400 GPU-s per simulate case, 3 x 600 per render case; a budget of 9,000 takes one
    # simulate case (rank first: the longer path) and the render case.
    decision = fit_budget(ranked, costs, week_gpu_seconds=450_000, seconds_left=86_400, share=0.02)
    assert [c.case_id for c in decision.chosen] == ["b-sim", "a-render"]
    assert decision.budget_gpu_seconds == 9_000 and decision.planned_gpu_seconds == 7_200 + 1_800
    skipped = {c.case_id: c.reason for c in decision.not_triaged}
    assert set(skipped) == {"c-sim", "d-other"}
    assert skipped["c-sim"] == (
        "its reruns need 2.00 GPU-hours and 0.50 were left of the triage budget "
        "(2.0% of the week's 125.0 GPU-hours)"
    )
    assert "the plan has no phase 'simulate' in graph 'other'" in skipped["d-other"]
    assert all(c.verdict is TriageVerdict.NOT_TRIAGED for c in decision.not_triaged)


def test_cases_whose_reruns_would_end_after_the_deadline_are_not_triaged() -> None:
    pair = [
        Candidate(case_id=k, graph="driving", failing_phase=p)
        for k, p in (("s", "simulate"), ("r", "render"))
    ]
    _, costs = with_plan(PLAN, pair, reruns=3)
    found = [Candidate(case_id=k, graph="driving", failing_phase="x") for k in ("s", "r")]
    decision = fit_budget(found, costs, week_gpu_seconds=10**9, seconds_left=1_000)
    assert [c.case_id for c in decision.chosen] == ["r"]  # render + report: 660 s
    [late] = decision.not_triaged
    assert late.reason == "its reruns take about 41 min and 17 min are left before the deadline"


# ----------------------------------------------------------------------------- the audit


def test_the_audit_sample_is_a_share_with_a_floor_and_the_same_for_the_same_week() -> None:
    passed = [f"case-{i:05d}" for i in range(10_000)]
    sample = audit_sample(passed, "2026-W50")
    assert len(sample) == 50 and set(sample) <= set(passed)
    shuffled = passed[:]
    random.Random(7).shuffle(shuffled)
    assert audit_sample(shuffled, "2026-W50") == sample
    assert audit_sample(passed, "2026-W51") != sample
    assert len(audit_sample(passed[:200], "2026-W50")) == 5
    assert audit_sample(passed[:3], "2026-W50") == tuple(passed[:3])
    assert len(audit_sample(passed, "w", share=0.01, minimum=5)) == 100


def test_declared_outputs_that_differ_or_are_missing_are_listed() -> None:
    declared = {"simulate": ["trace.jsonl", "result.json"], "render": ["frames.json"]}
    first = {"simulate": {"trace.jsonl": "d1", "result.json": "r1"}, "render": {"frames.json": "f1"}}
    again = {"simulate": {"trace.jsonl": "d2", "result.json": "r1"}}
    diffs = differing_outputs("c", declared, first, again)
    assert [(d.phase, d.output, d.first, d.again) for d in diffs] == [
        ("render", "frames.json", "f1", None),
        ("simulate", "trace.jsonl", "d1", "d2"),
    ]
    assert differing_outputs("c", declared, first, first) == []


# ----------------------------------------------------------------------------- the whole chain


def test_a_week_with_regressions_flakes_and_a_broken_pool_is_classified() -> None:
    """Three cases regress on this build, two flake, one meets a broken pool; one more does not fit."""
    from avsim.triage.decide import triage_report
    from avsim.triage.model import TriageReport

    kinds = {"reg-1": "regress", "reg-2": "regress", "reg-3": "regress", "flk-1": "flake",
             "flk-2": "flake", "pool-1": "pool", "late-1": "regress"}  # fmt: skip
    previous = [row(c, "passed") for c in kinds] + [row("ok", "passed")]
    current = [row(c, "scenario_failed", phase="render" if c != "late-1" else "simulate") for c in kinds]
    current += [row("ok", "passed")]
    found = newly_failing(current, previous)
    ranked, costs = with_plan(PLAN, found, reruns=3)
    # A render case's reruns cost 3 x 600 GPU-s and take 660 s: the 10,800 GPU-s budget (2 % of the
    # week) fits the six of them; the simulate case's take 2,460 s, more than the 1,200 s left.
    decision = fit_budget(ranked, costs, week_gpu_seconds=540_000, seconds_left=1_200)
    assert {c.case_id for c in decision.chosen} == set(kinds) - {"late-1"}

    def outcomes(case: str, side: BuildSide) -> list[Outcome | None]:
        kind = kinds[case]
        if kind == "pool":
            return [X, X] if side is BuildSide.THIS else [X]
        if side is BuildSide.LAST:
            return [P]
        return [F, F] if kind == "regress" else [F, P]

    runs = [
        Rerun(case_id=c.case_id, build=side, build_digest=THIS if side is BuildSide.THIS else LAST,
              index=i, outcome=o, reason="node pool gpu-a has no driver" if o is X else "")
        for c in decision.chosen
        for side in BuildSide
        for i, o in enumerate(outcomes(c.case_id, side), 1)
    ]  # fmt: skip
    report = triage_report("avsim_weekly__w2", decision, runs, k=2, iso_week="2026-W50", build_digest=THIS)
    verdicts = {c.case_id: c.verdict.value for c in report.cases}
    assert verdicts == {"reg-1": "regression", "reg-2": "regression", "reg-3": "regression",
                        "flk-1": "flaky", "flk-2": "flaky", "pool-1": "environment",
                        "late-1": "not_triaged"}  # fmt: skip
    assert "node pool gpu-a has no driver" in {c.case_id: c.reason for c in report.cases}["pool-1"]
    assert report.counts == {"regression": 3, "flaky": 2, "environment": 1, "not_triaged": 1}
    assert report.planned_gpu_seconds <= report.budget_gpu_seconds == 0.02 * 540_000
    assert TriageReport.model_validate_json(report.to_json()) == report
