"""The ``triage`` task: it waits for its runs bounded by the deadline, stops what is left then, and
writes the verdicts; a week with nothing to rerun writes them at once.

The boundary mocked: the Airflow REST API (the hook that stops a DAG run); the week, its book and the
triage runs' summaries are real files on a ``file://`` artifact root.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from airflow.sdk.exceptions import TaskDeferred
from tests.support.lifecycle import prepared_week

from avsim.contracts import RunDescriptor
from avsim.contracts.week import CaseSummary, PhaseSummary, ShardSummary
from avsim.ledger.store import Ledger
from avsim.operators.triage import TriageOperator
from avsim.storage import write_json
from avsim.triage.decide import Candidate
from avsim.triage.model import BuildSide, TriageVerdict
from avsim.triage.runs import TriageBook, TriageRound, TriageRun, plan_uri
from avsim.triage.store import read_triage
from avsim.triggers.triage import DEADLINE_EVENT, TriageRunsTrigger


def _week(tmp_path: Path) -> tuple[RunDescriptor, TriageBook]:
    run, case, _ = prepared_week(tmp_path)
    week = RunDescriptor.model_validate(run)
    runs = tuple(
        TriageRun(
            label=f"1_{side.value}_1",
            build=side,
            index=1,
            image=week.image,
            run_id=f"w1__triage_1_{side.value}_1",
            run_key=f"{week.run_key}__triage_1_{side.value}_1",
            cases=(case["case_id"],),
        )
        for side in BuildSide
    )
    chosen = (Candidate(case_id=case["case_id"], graph=case["family"], failing_phase="simulate"),)
    book = TriageBook(week_run_key=week.run_key, rounds=(TriageRound(round=1, chosen=chosen, runs=runs),))
    write_json(plan_uri(week.layout), book.model_dump(mode="json"))
    return week, book


def _operator(week: RunDescriptor) -> TriageOperator:
    return TriageOperator(task_id="triage", run=week.to_json(), shard_dag_id="avsim_weekly_shard")


def test_it_defers_on_its_runs_until_two_minutes_before_the_deadline(tmp_path: Path) -> None:
    import datetime as dt

    from avsim.storage import read_json

    week, book = _week(tmp_path)
    with pytest.raises(TaskDeferred) as deferred:
        _operator(week).execute({})
    trigger = deferred.value.trigger
    assert isinstance(trigger, TriageRunsTrigger)
    assert trigger.run_ids == [r.run_id for r in book.runs]
    deadline = dt.datetime.fromisoformat(
        read_json(week.layout.head_uri)["run"]["deadline"].replace("Z", "+00:00")
    )
    assert trigger.until is not None
    assert deadline - dt.datetime.fromisoformat(trigger.until) == dt.timedelta(minutes=2)


def test_at_the_deadline_it_stops_the_runs_left_and_lists_their_cases_as_not_triaged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    week, book = _week(tmp_path)
    stopped: list[tuple[str, str]] = []

    class Hook:  # the REST API's side
        def __init__(self, conn_id: str) -> None:
            pass

        def stop_dag_run(self, dag_id: str, run_id: str, note: str | None = None) -> str:
            stopped.append((dag_id, run_id))
            return "failed"

    monkeypatch.setattr("avsim.hooks.airflow_api.AirflowApiHook", Hook)
    # This build's run ended (the case failed its scenario again); last week's did not.
    this = book.runs[0]
    case_id = this.cases[0]
    failed = PhaseSummary(outcome="scenario_failed", attempt=1)
    Ledger(
        RunDescriptor.model_validate({**week.to_json(), "run_key": this.run_key}).layout
    ).write_shard_summary(
        ShardSummary(
            shard=1,
            cases=(CaseSummary(case_id=case_id, outcome="scenario_failed", phases={"simulate": failed}),),
        )
    )
    counts = _operator(week).execute_complete(
        {}, (DEADLINE_EVENT, {"run_ids": [r.run_id for r in book.runs]})
    )
    assert stopped == [("avsim_weekly_shard", r.run_id) for r in book.runs]
    assert counts[TriageVerdict.NOT_TRIAGED.value] == 1
    [case] = read_triage(week.layout).cases
    assert case.verdict is TriageVerdict.NOT_TRIAGED and "deadline" in case.reason


def test_a_week_with_nothing_to_rerun_writes_its_verdicts_at_once(tmp_path: Path) -> None:
    run, _, _ = prepared_week(tmp_path)
    week = RunDescriptor.model_validate(run)
    write_json(
        plan_uri(week.layout),
        TriageBook(week_run_key=week.run_key, message="nothing to triage: x").model_dump(mode="json"),
    )
    counts = _operator(week).execute({})
    assert set(counts.values()) == {0}
    assert read_triage(week.layout).message == "nothing to triage: x"


def test_a_cleared_triage_counts_only_the_verdicts_it_adds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    week, book = _week(tmp_path)
    sent: list[dict[str, int]] = []
    monkeypatch.setattr("avsim.metrics.triage_verdicts", lambda counts: sent.append(dict(counts)))
    _operator(week).finish(book, "its triage run did not end")
    _operator(week).finish(book, "its triage run did not end")  # the same document again
    assert sent[0][TriageVerdict.NOT_TRIAGED.value] == 1 and sent[1][TriageVerdict.NOT_TRIAGED.value] == 0
