"""Issue 30 (3): the canary plan and the shard summary are frozen models (avsim.contracts.week).

A shard summary is a document a running week keeps reading across a deploy: the two below were
written by avsim before the models existed (``tasks.summarize`` on a canary of four cases, and
``week_end.close_week`` for a shard run the week never started; two cases kept of each), and must
parse and read the same. The canary plan is what ``prepare`` pushes and the gate reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from avsim.contracts import ShardConf
from avsim.contracts.week import NOT_STARTED, CanaryPlan, ShardSummary, canary_plan
from avsim.phases.contract import NOT_RUN, Outcome

ROOT = Path(__file__).resolve().parents[3]

#: ``tasks.summarize`` of a canary shard, as written before issue 30 (keys sorted by the writer).
WRITTEN_BY_SUMMARIZE = json.loads(
    '{"cases": [{"case_id": "case-00004", "graph": "perception", "outcome": "infra_failed", "phases": '
    '{"evaluate": {"attempt": null, "attempts": 0, "duration_seconds": null, "outcome": "not_run", '
    '"output_uri": "", "reason": ""}, "perceive": {"attempt": 1, "attempts": 1, "duration_seconds": 12.5, '
    '"outcome": "passed", "output_uri": '
    '"file:///srv/avsim/runs/avsim_weekly__manual__g/cases/case-00004/perceive/attempt-1", "reason": ""}, '
    '"prepare": {"attempt": 1, "attempts": 1, "duration_seconds": 12.5, "outcome": "passed", "output_uri": '
    '"file:///srv/avsim/runs/avsim_weekly__manual__g/cases/case-00004/prepare/attempt-1", "reason": ""}, '
    '"report": {"attempt": null, "attempts": 0, "duration_seconds": null, "outcome": "upstream_failed", '
    '"output_uri": "", "reason": ""}}}, {"case_id": "case-00015", "graph": "standard", "outcome": '
    '"bad_input", "phases": {"evaluate": {"attempt": null, "attempts": 0, "duration_seconds": null, '
    '"outcome": "upstream_failed", "output_uri": "", "reason": ""}, "prepare": {"attempt": 1, "attempts": 1, '
    '"duration_seconds": 12.5, "outcome": "bad_input", "output_uri": '
    '"file:///srv/avsim/runs/avsim_weekly__manual__g/cases/case-00015/prepare/attempt-1", "reason": "why"}, '
    '"report": {"attempt": null, "attempts": 0, "duration_seconds": null, "outcome": "upstream_failed", '
    '"output_uri": "", "reason": ""}, "simulate": {"attempt": 1, "attempts": 1, "duration_seconds": 12.5, '
    '"outcome": "bad_input", "output_uri": '
    '"file:///srv/avsim/runs/avsim_weekly__manual__g/cases/case-00015/simulate/attempt-1", "reason": "why"}}}], '
    '"counts": {"bad_build": 0, "bad_input": 1, "cases": 4, "infra_failed": 3, "passed": 0, "preempted": 0, '
    '"scenario_failed": 0}, "shard": 0, "verdict": "shard 0: 4 of 4 cases need attention (bad_input 1, '
    'infra_failed 3): case-00004/evaluate, case-00009/evaluate, case-00013/prepare and 1 more", '
    '"written_at": "2026-12-06T14:49:28.430249+00:00"}'
)
#: ``week_end.close_week``'s summary of a shard run the week never started, as written before issue 30.
WRITTEN_BY_CLOSE_WEEK = json.loads(
    '{"cases": [{"case_id": "case-00001", "graph": "standard", "outcome": "not_started", "phases": {}}, '
    '{"case_id": "case-00002", "graph": "standard", "outcome": "not_started", "phases": {}}], '
    '"counts": {"cases": 2, "not_started": 2}, "shard": 1, "started": false, "stopped_because": '
    '"their shard runs were not started (the canary gate failed or the run was stopped)", "verdict": '
    '"shard 1: never started (their shard runs were not started (the canary gate failed or the run was '
    'stopped))"}'
)


@pytest.mark.parametrize("written", [WRITTEN_BY_SUMMARIZE, WRITTEN_BY_CLOSE_WEEK], ids=["summarize", "close"])
def test_a_summary_written_before_the_models_parses_and_keeps_every_field(written: dict) -> None:
    summary = ShardSummary.model_validate(written)
    again = summary.to_json()
    # Every field the old writer wrote is read back with the same value (the model adds its defaults).
    for key, value in written.items():
        assert again[key] == value, key
    assert ShardSummary.model_validate(again) == summary


def test_a_summary_reads_typed_classes() -> None:
    ran = ShardSummary.model_validate(WRITTEN_BY_SUMMARIZE)
    assert ran.shard == 0 and ran.started and ran.written_at.startswith("2026-12-06")
    first, second = ran.cases
    assert first.outcome is Outcome.INFRA_FAILED and second.outcome is Outcome.BAD_INPUT
    assert first.phases["evaluate"].outcome == NOT_RUN and first.phases["evaluate"].attempt is None
    assert first.phases["report"].outcome is Outcome.UPSTREAM_FAILED
    assert second.phases["simulate"].duration_seconds == 12.5 and second.phases["simulate"].reason == "why"
    never = ShardSummary.model_validate(WRITTEN_BY_CLOSE_WEEK)
    assert not never.started and never.written_at == "" and {c.outcome for c in never.cases} == {NOT_STARTED}


def test_a_summary_with_an_unknown_class_fails_where_it_is_read_naming_the_field() -> None:
    bad = json.loads(json.dumps(WRITTEN_BY_SUMMARIZE))
    bad["cases"][1]["phases"]["prepare"]["outcome"] = "infra_faild"
    with pytest.raises(ValidationError, match=r"cases\.1\.phases\.prepare\.outcome"):
        ShardSummary.model_validate(bad)


def _run() -> dict:
    return {"run_key": "avsim_weekly__r1", "artifact_root": "file:///srv/avsim", "build_id": "b1"}


def test_the_canary_plan_round_trips_and_a_week_without_one_has_none() -> None:
    plan = CanaryPlan(
        shard=0,
        threshold=0.2,
        cases={"c1": ("prepare", "simulate")},
        trigger_run_id="r1__canary",
        conf=ShardConf.model_validate({"run": _run(), "shard": 0}),
    )
    doc = json.loads(json.dumps(plan.to_json()))  # through XCom
    assert (
        doc["cases"] == {"c1": ["prepare", "simulate"]}
        and doc["conf"]["run"]["run_key"] == "avsim_weekly__r1"
    )
    assert canary_plan(doc) == plan
    assert canary_plan({}) is None and canary_plan(None) is None
    with pytest.raises(ValidationError, match="threshold"):
        canary_plan({**doc, "threshold": "high"})
    with pytest.raises(ValidationError, match="cases"):
        canary_plan({**doc, "cases": {}})


def test_prepare_pushes_a_canary_plan(tmp_path: Path) -> None:
    from avsim.dagbuild.factory import load_plan
    from avsim.dagbuild.prepare import prepare_week
    from avsim.manifest.sample import sample_manifest
    from avsim.settings import AvsimSettings

    settings = AvsimSettings(shard_size=10, artifact_root=f"file://{tmp_path / 'artifacts'}")
    plan = load_plan(ROOT / "dags" / "avsim_graphs.yaml", settings)
    manifest = tmp_path / "week.json"
    manifest.write_text(
        json.dumps(sample_manifest(25, canary={"share": 0.1, "min_cases": 4, "max_failure_rate": 0.3}))
    )
    prepared = prepare_week(
        source=str(manifest), plan=plan, settings=settings, dag_id="avsim_weekly", run_id="manual__c"
    )
    json.dumps(prepared)  # XCom carries it as JSON
    canary = canary_plan(prepared["canary"])
    assert canary is not None and canary.threshold == 0.3 and len(canary.cases) == 4
    assert canary.conf.run.run_key == prepared["run"]["run_key"] and canary.conf.shard == canary.shard == 0
    assert all(phases and isinstance(phases, tuple) for phases in canary.cases.values())


def test_the_summary_names_a_phase_that_never_ran_as_the_contract_does() -> None:
    from avsim.contracts import week

    assert week.NOT_RUN == NOT_RUN
