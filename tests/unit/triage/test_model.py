"""The triage document: what it accepts, what it refuses, and its JSON round trip."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from avsim.phases.contract import Outcome
from avsim.triage.model import (
    BuildSide,
    CaseTriage,
    DeterminismAudit,
    OutputDifference,
    Rerun,
    TriageReport,
    TriageVerdict,
)

THIS = "sha256:" + "b" * 64
LAST = "sha256:" + "a" * 64


def rerun(case: str, build: BuildSide, index: int, outcome: Outcome | None, reason: str = "") -> Rerun:
    digest = THIS if build is BuildSide.THIS else LAST
    return Rerun(case_id=case, build=build, build_digest=digest, index=index, outcome=outcome, reason=reason)


def regression(case: str = "c1") -> CaseTriage:
    return CaseTriage(
        case_id=case,
        scenario_uri="s3://scenarios/cut_in.xosc",
        graph="driving",
        failing_phase="simulate",
        reruns=(
            rerun(case, BuildSide.THIS, 1, Outcome.SCENARIO_FAILED),
            rerun(case, BuildSide.THIS, 2, Outcome.SCENARIO_FAILED),
            rerun(case, BuildSide.LAST, 1, Outcome.PASSED),
        ),
        verdict=TriageVerdict.REGRESSION,
        reason="failed on this build in 2 of 2 reruns and passed on last week's",
    )


def test_a_report_round_trips_through_json() -> None:
    audit = DeterminismAudit.of(
        400,
        ["p1", "p2", "p3", "p4", "p5"],
        [OutputDifference(case_id="p2", phase="simulate", output="trace.jsonl", first="x", again="y")],
    )
    not_triaged = CaseTriage(
        case_id="c2", failing_phase="render", verdict=TriageVerdict.NOT_TRIAGED, reason="over budget"
    )
    report = TriageReport.of(
        "avsim_weekly__w2",
        [regression(), not_triaged],
        iso_week="2026-W50",
        build_digest=THIS,
        previous_build_digest=LAST,
        budget_gpu_seconds=720.0,
        planned_gpu_seconds=360.0,
        audit=audit,
    )
    text = report.to_json()
    doc = json.loads(text)
    assert doc["schema"] == "avsim/triage/v1"
    assert doc["counts"] == {"regression": 1, "flaky": 0, "environment": 0, "not_triaged": 1}
    assert doc["audit"]["rate"] == 0.2
    assert TriageReport.model_validate_json(text) == report
    assert [c.case_id for c in report.regressions] == ["c1"]


def test_unknown_fields_and_wrong_counts_are_refused() -> None:
    doc = json.loads(TriageReport.of("k", [regression()]).to_json())
    with pytest.raises(ValidationError, match="extra"):
        TriageReport.model_validate({**doc, "surprise": 1})
    with pytest.raises(ValidationError, match="do not match the cases' verdicts"):
        TriageReport.model_validate({**doc, "counts": {**doc["counts"], "regression": 0}})
    with pytest.raises(ValidationError):
        TriageReport.model_validate({**doc, "schema": "avsim/triage/v0"})


def test_a_rerun_that_did_not_start_says_why() -> None:
    with pytest.raises(ValidationError, match="give its reason"):
        rerun("c1", BuildSide.LAST, 1, None)
    ok = rerun("c1", BuildSide.LAST, 1, None, reason="image not pullable")
    assert not ok.is_result
    assert rerun("c1", BuildSide.THIS, 1, Outcome.INFRA_FAILED).is_result is False
    assert rerun("c1", BuildSide.THIS, 1, Outcome.SCENARIO_FAILED).is_result


def test_a_case_holds_only_its_own_reruns_and_none_when_not_triaged() -> None:
    with pytest.raises(ValidationError, match="reruns of other cases"):
        CaseTriage(
            case_id="c1",
            failing_phase="simulate",
            reruns=(rerun("c9", BuildSide.THIS, 1, Outcome.PASSED),),
            verdict=TriageVerdict.FLAKY,
            reason="passed once",
        )
    with pytest.raises(ValidationError, match="not triaged but lists reruns"):
        CaseTriage(
            case_id="c1",
            failing_phase="simulate",
            reruns=(rerun("c1", BuildSide.THIS, 1, Outcome.PASSED),),
            verdict=TriageVerdict.NOT_TRIAGED,
            reason="over budget",
        )


def test_the_audit_lists_only_differences_of_its_sample() -> None:
    diff = OutputDifference(case_id="p9", phase="simulate", output="trace.jsonl", first="x", again=None)
    with pytest.raises(ValidationError, match="not in the audit's sample"):
        DeterminismAudit.of(100, ["p1"], [diff])
    assert DeterminismAudit.of(0, [], []).rate == 0.0
