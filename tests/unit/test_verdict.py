"""The shard-failure rule and the week's verdict (avsim.verdict), and the tasks that apply them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from avsim.artifacts import RunLayout
from avsim.contracts.week import ShardSummary
from avsim.dagbuild import tasks, week_end
from avsim.dagbuild.factory import load_plan
from avsim.dagbuild.prepare import prepare_week
from avsim.ledger.breaker import Breaker
from avsim.manifest.sample import sample_manifest
from avsim.operators.exceptions import ShardNeedsAttention, WeekNeedsAttention
from avsim.phases.contract import Outcome
from avsim.settings import AvsimSettings
from avsim.storage import read_json
from avsim.verdict import NEEDS_ATTENTION, NOT_STARTED, needs_attention, shard_verdict, week_verdict

ROOT = Path(__file__).resolve().parents[2]
#: A shard summary as the ledger reads one back.
S = ShardSummary.model_validate


def _case(case_id: str, outcome: str, failing: str = "simulate") -> dict[str, Any]:
    phases = {"prepare": {"outcome": "passed"}}
    if outcome in ("passed", "scenario_failed"):
        phases["simulate"] = {"outcome": outcome}
    else:
        phases[failing] = {"outcome": outcome}
        phases["report"] = {"outcome": "upstream_failed"}
    return {"case_id": case_id, "outcome": outcome, "phases": phases}


@pytest.mark.parametrize("outcome", [o.value for o in Outcome if o.value != "upstream_failed"])
def test_only_results_keep_a_shard_green(outcome: str) -> None:
    summary = S({"shard": 4, "cases": [_case("c1", "passed"), _case("c2", outcome)]})
    verdict = shard_verdict(summary)
    is_result = outcome in ("passed", "scenario_failed")
    assert verdict.needs_attention is (not is_result)
    assert needs_attention(outcome) is (not is_result)
    if is_result:
        assert verdict.label == "" and verdict.counts == {}
    else:
        assert verdict.counts == {outcome: 1}
        assert verdict.label == " · 1 need attention"
        assert verdict.line() == f"shard 4: 1 of 2 cases need attention ({outcome} 1): c2/simulate"


def test_scenario_failures_alone_never_turn_anything_red() -> None:
    summaries = [
        S({"shard": k, "cases": [_case(f"c{k}{i}", "scenario_failed") for i in range(5)]}) for k in range(3)
    ]
    week = week_verdict(summaries)
    assert (week.state, week.needs_attention, week.attention) == ("passed", False, 0)
    assert not any(shard_verdict(s).needs_attention for s in summaries)


def test_a_line_counts_by_class_and_names_the_first_cases() -> None:
    cases = [
        _case("a", "infra_failed", "evaluate"),
        _case("b", "passed"),
        _case("c", "bad_build"),
        _case("d", "preempted"),
        _case("e", "infra_failed"),
        _case("f", "bad_input", "prepare"),
    ]
    verdict = shard_verdict(S({"shard": 7, "cases": cases}))
    assert verdict.counts == {"infra_failed": 2, "bad_build": 1, "preempted": 1, "bad_input": 1}
    # Classes in the order an engineer acts on them; the first three cases with their failing phase.
    assert verdict.line() == (
        "shard 7: 5 of 6 cases need attention (bad_build 1, bad_input 1, infra_failed 2, preempted 1): "
        "a/evaluate, c/simulate, d/simulate and 2 more"
    )
    assert set(verdict.counts) <= set(NEEDS_ATTENTION)


def test_a_week_counts_not_started_cases_as_stopped() -> None:
    ran = S({"shard": 0, "cases": [_case("x", "bad_build")]})
    never = S(
        {
            "shard": 1,
            "stopped_because": "the breaker is open",
            "cases": [{"case_id": "y", "outcome": NOT_STARTED, "phases": {}}],
        }
    )
    week = week_verdict([ran, never])
    assert (week.state, week.attention, week.not_started) == ("stopped", 1, 1)
    assert week.line().startswith("the week was stopped: 1 cases never started (the breaker is open)")
    assert "1 cases need attention (bad_build 1) in shard(s) 0" in week.line()
    # Not-started cases are not counted as failures of their shard.
    assert shard_verdict(never).needs_attention is False


@pytest.fixture
def week(tmp_path: Path) -> tuple[AvsimSettings, Any, dict[str, Any]]:
    settings = AvsimSettings(shard_size=10, artifact_root=f"file://{tmp_path / 'artifacts'}")
    plan = load_plan(ROOT / "dags" / "avsim_graphs.yaml", settings)
    manifest = tmp_path / "week.json"
    manifest.write_text(json.dumps(sample_manifest(25, canary={"share": 0.1, "min_cases": 4})))
    prepared = prepare_week(
        source=str(manifest), plan=plan, settings=settings, dag_id="avsim_weekly", run_id="manual__v"
    )
    return settings, plan, prepared


def _commit_everything(run: dict[str, Any], plan: Any, shard: int, outcome: Outcome) -> None:
    """Commit ``outcome`` for every phase of every case of ``shard`` through the real ledger."""
    from avsim.ledger.records import AttemptRecord, OutcomeRecord
    from avsim.ledger.store import Ledger
    from avsim.plan.shards import ShardPlan

    layout = RunLayout(run["artifact_root"], run["run_key"])
    ledger = Ledger(layout)
    shard_plan = ShardPlan.from_json(read_json(layout.shard_cases(shard)))
    now = "2026-12-03T00:00:00+00:00"
    for fam, entries in shard_plan.by_family.items():
        for c in entries:
            for phase in plan.family(fam).phase_names:
                claimed = ledger.claim_attempt(
                    AttemptRecord(
                        run_key=layout.run_key,
                        case_id=c["case_id"],
                        phase=phase,
                        attempt=0,
                        started_at=now,
                        ended_at="",
                        exit_code=None,
                        outcome=None,
                        reason="",
                        output_uri="",
                        host="test",
                        duration_seconds=0.0,
                        state="started",
                    )
                )
                assert ledger.commit(
                    OutcomeRecord(
                        run_key=layout.run_key,
                        case_id=c["case_id"],
                        phase=phase,
                        attempt=claimed.attempt,
                        outcome=outcome,
                        output_uri=claimed.output_uri,
                        committed_at=now,
                    )
                )


def test_a_shard_with_only_results_succeeds_and_one_that_needs_attention_fails_after_writing(week) -> None:
    _, plan, prepared = week
    run = prepared["run"]
    _commit_everything(run, plan, 1, Outcome.SCENARIO_FAILED)
    counts = tasks.summarize(prepared["shards"][0]["conf"], plan)
    assert counts["scenario_failed"] == counts["cases"] > 0
    with pytest.raises(ShardNeedsAttention, match=r"shard 2: \d+ of \d+ cases need attention"):
        tasks.summarize(prepared["shards"][1]["conf"], plan)
    layout = RunLayout(run["artifact_root"], run["run_key"])
    assert read_json(layout.shard_summary(2))["verdict"].startswith("shard 2: ")


def test_a_week_stopped_by_the_canary_gate_is_summarised_and_fails_naming_the_build(week) -> None:
    _, plan, prepared = week
    run = prepared["run"]
    layout = RunLayout(run["artifact_root"], run["run_key"])
    _commit_everything(run, plan, 0, Outcome.BAD_BUILD)
    with pytest.raises(ShardNeedsAttention):
        tasks.summarize(prepared["canary"]["conf"], plan)
    # What the canary gate does when it fails: open the build's breaker.
    digest = run["image"].rsplit("@", 1)[-1]
    assert Breaker(run["artifact_root"], digest).trip("canary gate: 4 of 4 canary cases crashed") is True
    assert Breaker(run["artifact_root"], digest).trip("again") is False  # already open

    closed = week_end.close_week(run)
    assert closed["never_started"] == run["shard_count"] == 3
    never = read_json(layout.shard_summary(1))
    assert never["started"] is False and "canary gate: 4 of 4" in never["stopped_because"]
    assert {c["outcome"] for c in never["cases"]} == {NOT_STARTED}
    # Every shard now has a summary: the run-level phases read each one's result.json.
    assert all(Path(layout.shard_summary(k).removeprefix("file://")).exists() for k in range(4))

    with pytest.raises(
        WeekNeedsAttention, match=rf"build {run['build_id']}\): the week was stopped: 21 cases"
    ):
        week_end.finish_week(run, [rp.name for rp in plan.run_phases])
    report = read_json(f"{layout.report_dir}/report.json")
    assert report["verdict"]["state"] == "stopped"
    assert report["verdict"]["not_started"] == 21 and report["totals"][NOT_STARTED] == 21
    assert report["totals"]["bad_build"] == 4
    # A second close changes nothing: shards with a summary keep it.
    assert week_end.close_week(run)["never_started"] == 0
