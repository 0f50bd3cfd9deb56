"""A repair's round, in the phase lifecycle: what a cleared task reuses and what it runs again.

Same boundary as ``test_lifecycle.py`` (a real prepared run on a file:// ledger, the real
breaker and policy; Airflow's task instance is its small stand-in, there with the states of the run's
other task instances as the execution API answers them). The journeys on the real scheduler are in
``tests/integration/test_repair_journeys.py``.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from tests.support.lifecycle import Phase, TaskInstance, phase_task, prepared_week

from avsim.artifacts import RUN_LEVEL_CASE
from avsim.attempt import PhaseAttempt
from avsim.operators import exceptions as exc
from avsim.phases.contract import AttemptResult, Outcome
from avsim.phases.policy import Role
from avsim.storage import write_json

RETRIES = 2  # the run-level phase's retries in these tests


@pytest.fixture
def week(tmp_path: Path) -> Any:
    return prepared_week(tmp_path)


def _summary(week: Any) -> Phase:
    run, _case, _ = week
    task = Phase(run, {"case_id": RUN_LEVEL_CASE, "seed": 0}, "weekly_summary", Role.REGULAR, 0)
    task.task_id = "run_phases.weekly_summary"
    task.inputs = {"shards": "file:///unused"}
    task.reuse_outputs = False
    task.retries = RETRIES
    return task


def _ti(task: Phase, try_number: int, round_start: int) -> TaskInstance:
    """The try ``try_number`` of a task whose current round began at try ``round_start``."""
    return TaskInstance(
        task.task_id, try_number=try_number, max_tries=round_start - 1 + RETRIES, map_index=-1
    )


def _run(task: Phase, ti: TaskInstance, result: AttemptResult) -> Any:
    """One try: begin, then (when it launched) the phase writes its outputs and ends with ``result``."""
    ctx = {"ti": ti}
    attempt = task.lifecycle.begin_attempt(ctx)
    if not isinstance(attempt, PhaseAttempt):
        return attempt
    write_json(f"{attempt.output_uri}/result.json", {"outcome": result.outcome.value, "metrics": {}})
    return task.lifecycle.end_attempt(ctx, attempt, result, dt.datetime.now(dt.UTC))


def test_a_cleared_run_level_phase_runs_again_and_its_new_result_replaces_the_old(week: Any) -> None:
    """Issue 31 item 3: after a repair the weekly summary kept its first committed result."""
    task = _summary(week)
    first = _run(task, _ti(task, 1, 1), AttemptResult(Outcome.PASSED, 0))
    assert first["attempt"] == 1
    # The same round (a retry after a lost worker): the committed result stands, nothing runs.
    assert task.lifecycle.begin_attempt({"ti": _ti(task, 2, 1)}) == first
    # The task was cleared (a repair): a new round, whose inputs changed. It runs and recommits.
    again = _run(task, _ti(task, 3, 3), AttemptResult(Outcome.PASSED, 0))
    assert again["attempt"] == 2
    committed = week[2].outcome(RUN_LEVEL_CASE, "weekly_summary")
    assert committed is not None and committed.attempt == 2


def test_a_case_phase_keeps_its_first_result_through_a_clear(week: Any) -> None:
    task = phase_task(week, "prepare", Role.REGULAR, 0)
    ti = TaskInstance(task.task_id, max_tries=task.retries)
    out = _run(task, ti, AttemptResult(Outcome.PASSED, 0))
    cleared = TaskInstance(task.task_id, try_number=4, max_tries=3 + task.retries)
    assert task.lifecycle.begin_attempt({"ti": cleared}) == out  # pinned inputs: the result stands


def test_a_stopped_weeks_run_level_phase_runs_despite_the_open_breaker(week: Any) -> None:
    """Issue 31 item 11: the summary of a week the canary stopped was failed as bad_build/breaker_open."""
    task = _summary(week)
    task.lifecycle.service.books.breaker.trip("canary gate: canary gate FAILED")
    out = _run(task, _ti(task, 1, 1), AttemptResult(Outcome.PASSED, 0))
    assert out["outcome"] == "passed"
    case_phase = phase_task(week, "prepare", Role.REGULAR, 0)  # the build's cases stay stopped
    with pytest.raises(exc.BreakerOpen):
        case_phase.lifecycle.begin_attempt({"ti": TaskInstance(case_phase.task_id)})


def _preempt_until_hand_over(spot: Phase, ti: TaskInstance) -> None:
    n = int(
        (spot.lifecycle.service.books.runtime_spec().get("retry") or {}).get("on_demand_after_preemptions", 2)
    )
    for k in range(1, n + 1):
        ti.try_number = k
        ti.max_tries = spot.retries
        ctx = {"ti": ti}
        attempt = spot.lifecycle.begin_attempt(ctx)
        assert isinstance(attempt, PhaseAttempt)
        try:
            spot.lifecycle.end_attempt(
                ctx,
                attempt,
                AttemptResult(Outcome.PREEMPTED, 143, "reclaimed", "evicted"),
                dt.datetime.now(dt.UTC),
            )
        except exc.PhasePreempted:
            continue


def test_a_hand_over_to_an_undecided_twin_calls_nothing_else(week: Any) -> None:
    spot = phase_task(week, "prepare", Role.SPOT, 1)
    ti = TaskInstance(spot.task_id)  # the twin has no state yet: the first round
    with pytest.raises(exc.PhaseFallbackToOnDemand):
        _preempt_until_hand_over(spot, ti)


def test_a_hand_over_to_a_twin_an_earlier_round_skipped_clears_it_first(week: Any, monkeypatch: Any) -> None:
    """Issue 31 item 2: the spot task failed in the first round, so Airflow skipped its twin; the repair
    (clear failed) left the twin skipped, and the hand-over in the repair's round went nowhere. The
    spot task now clears the twin before it hands over: here with no API connection configured, so the
    clear cannot be made, and the task fails naming the twin instead of handing over into nothing."""
    monkeypatch.setenv("AIRFLOW__AVSIM__AIRFLOW_API_CONN_ID", "avsim_missing_conn")
    spot = phase_task(week, "prepare", Role.SPOT, 1)
    ti = TaskInstance(spot.task_id, states={(f"{spot.task_id}_on_demand", 0): "skipped"})
    with pytest.raises(
        exc.RepairFailed,
        match=r"must hand over to standard\.prepare_on_demand, which an earlier round left skipped",
    ):
        _preempt_until_hand_over(spot, ti)
