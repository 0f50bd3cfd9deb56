"""The phase lifecycle's decisions, fast: a real prepared run on a file:// ledger, a real breaker and
the real failure policy, driven attempt by attempt without a scheduler.

The boundary: Airflow's task instance is a small stand-in (``tests.support.lifecycle.TaskInstance``)
holding what the lifecycle reads from it (try number, max tries, map index) and an XCom table.
Everything after it — the ledger's claims, records and commits, budgets, delays, exceptions,
hand-over — is the product's.
The same journeys on the real scheduler are the long-tier ``tests/integration/test_failure_classes.py``.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from tests.support.lifecycle import Phase, TaskInstance, Week, phase_task, prepared_week, wrote_result

from avsim.attempt import PhaseAttempt
from avsim.contracts import RunDescriptor
from avsim.contracts.case import CaseEntry
from avsim.operators import exceptions as exc
from avsim.operators.lifecycle import HANDOVER_XCOM
from avsim.phases.contract import NODE_CPU, NODE_ON_DEMAND, NODE_SPOT, AttemptResult, Outcome
from avsim.phases.policy import Role


@pytest.fixture
def week(tmp_path: Path) -> Week:
    return prepared_week(tmp_path)


def _try(task: Phase, ti: TaskInstance, result: AttemptResult) -> Any:
    """One Airflow try: begin (claim), then end with ``result``; returns the XCom or raises."""
    ti.max_tries = task.retries
    ctx = {"ti": ti}
    attempt = task.lifecycle.begin_attempt(ctx)
    assert isinstance(attempt, PhaseAttempt), attempt
    if result.outcome.produced_output:  # a phase that reports a result wrote it (the contract)
        wrote_result(attempt)
    return task.lifecycle.end_attempt(ctx, attempt, result, dt.datetime.now(dt.UTC))


def _spec(task: Phase) -> dict[str, Any]:
    return dict(task.lifecycle.service.books.runtime_spec().get("retry") or {})


def test_a_passed_attempt_is_committed_and_a_later_try_reuses_it(week: Any) -> None:
    task = phase_task(week, "prepare", Role.REGULAR, 0)
    ti = TaskInstance(task.task_id)
    out = _try(task, ti, AttemptResult(Outcome.PASSED, 0))
    assert (out["outcome"], out["attempt"]) == ("passed", 1)
    ti.try_number = 2  # a cleared task: the committed result comes back, nothing is claimed
    assert task.lifecycle.begin_attempt({"ti": ti}) == out
    assert (task.task_id, "avsim_outcome", 0) not in ti.xcoms  # the return value says it
    assert [a.attempt for a in week[2].attempts(week[1]["case_id"], "prepare")] == [1]


def test_infrastructure_failures_back_off_then_use_up_the_budget(week: Any) -> None:
    task = phase_task(week, "prepare", Role.REGULAR, 0)
    rules = _spec(task)
    budget, delay, backoff = (
        rules.get("infrastructure", 2),
        rules.get("delay_seconds", 30),
        rules.get("backoff", 2.0),
    )
    ti = TaskInstance(task.task_id)
    for n in range(1, budget + 1):
        ti.try_number = n
        with pytest.raises(exc.PhaseInfrastructureError) as raised:
            _try(task, ti, AttemptResult(Outcome.INFRA_FAILED, 1, "segfault", "crash"))
        assert raised.value.retry_delay == dt.timedelta(
            seconds=min(rules.get("max_delay_seconds", 1800), delay * backoff ** (n - 1))
        )
        assert f"{n} of {budget} infra_failed retries used" in str(raised.value)
        published = ti.xcoms[(task.task_id, "avsim_outcome", 0)]  # the pages' class, without the ledger
        assert (published["outcome"], published["attempt"], published["detail"]) == (
            "infra_failed",
            n,
            "crash",
        )
    ti.try_number = budget + 1
    with pytest.raises(exc.PhaseBudgetExhausted, match="no retries left"):
        _try(task, ti, AttemptResult(Outcome.INFRA_FAILED, 1, "segfault", "crash"))
    committed = week[2].outcome(week[1]["case_id"], "prepare")
    assert committed.outcome is Outcome.INFRA_FAILED and committed.attempt == budget + 1


def test_a_vanished_cpu_pod_is_an_infrastructure_failure_not_a_preemption(week: Any) -> None:
    task = phase_task(week, "prepare", Role.REGULAR, 0)
    with pytest.raises(exc.PodLost) as raised:
        _try(
            task,
            TaskInstance(task.task_id),
            AttemptResult(Outcome.INFRA_FAILED, None, "pod gone", "vanished"),
        )
    assert not isinstance(raised.value, exc.PhasePreempted) and raised.value.outcome is Outcome.INFRA_FAILED


def test_spot_preemptions_hand_over_to_the_on_demand_twin_exactly_at_n(week: Any) -> None:
    spot = phase_task(
        week, "prepare", Role.SPOT, 1
    )  # any phase runs the same rules; this one needs no inputs
    assert spot.lifecycle.args.node_class == NODE_SPOT
    rules = _spec(spot)
    n, total = rules.get("on_demand_after_preemptions", 2), rules.get("preemption", 3)
    ti = TaskInstance(spot.task_id)
    for k in range(1, n):
        ti.try_number = k
        with pytest.raises(exc.PhasePreempted):
            _try(spot, ti, AttemptResult(Outcome.PREEMPTED, 143, "reclaimed", "evicted"))
    ti.try_number = n
    with pytest.raises(exc.PhaseFallbackToOnDemand, match=f"preempted {n} times on spot nodes"):
        _try(spot, ti, AttemptResult(Outcome.PREEMPTED, 143, "reclaimed", "evicted"))
    assert ti.xcoms[(spot.task_id, HANDOVER_XCOM, 0)]["case"] == week[1]
    assert week[2].outcome(week[1]["case_id"], "prepare") is None  # nothing committed: the twin runs next

    run, case, _ = week
    twin = Phase({}, {}, "prepare", Role.ON_DEMAND, 1)
    twin.set_retries = lambda: None  # type: ignore[method-assign]
    twin_ti = TaskInstance(twin.task_id, xcoms=ti.xcoms)
    twin.take_over({"ti": twin_ti})
    # Its map index label renders {{ task.case.case_id }} after the try (it failed a passing twin).
    assert twin.case["case_id"] == case["case_id"] and twin.run == run
    took = twin.lifecycle.args
    assert (took.case, took.run, took.node_class) == (
        CaseEntry.model_validate(case),
        RunDescriptor.model_validate(run),
        NODE_ON_DEMAND,
    )
    Phase.set_retries(twin)
    twin.take_over({"ti": twin_ti})  # as its task does when it runs, now with its retries
    left = total - n  # the preemptions the twin may still absorb, each retried
    for k in range(1, left + 1):
        twin_ti.try_number = k
        with pytest.raises(exc.PhasePreempted, match=f"{k} of {left} preempted"):
            _try(twin, twin_ti, AttemptResult(Outcome.PREEMPTED, 143, "drained", "node_shutdown"))
    twin_ti.try_number = left + 1
    with pytest.raises(exc.PhaseBudgetExhausted):
        _try(twin, twin_ti, AttemptResult(Outcome.PREEMPTED, 143, "drained", "node_shutdown"))
    assert week[2].outcome(case["case_id"], "prepare").outcome is Outcome.PREEMPTED


def test_lost_workers_attempts_are_recorded_and_count_against_the_budget(week: Any) -> None:
    task = phase_task(week, "prepare", Role.REGULAR, 0)
    budget = _spec(task).get("infrastructure", 2)
    ti = TaskInstance(task.task_id)
    ti.max_tries = task.retries
    for n in range(1, budget + 2):  # each try claims an attempt and its worker dies before reporting
        ti.try_number = n
        assert isinstance(task.lifecycle.begin_attempt({"ti": ti}), PhaseAttempt)
    ti.try_number = budget + 2
    with pytest.raises(exc.PhaseBudgetExhausted, match="lost workers used up the infrastructure budget"):
        task.lifecycle.begin_attempt({"ti": ti})
    attempts = week[2].attempts(week[1]["case_id"], "prepare")
    assert [(a.outcome, a.detail) for a in attempts] == [(Outcome.INFRA_FAILED, "abandoned")] * (budget + 1)


@pytest.mark.parametrize(
    ("result", "raised"),
    [
        (AttemptResult(Outcome.BAD_INPUT, 65, "no scenario"), exc.PhaseBadInput),
        (AttemptResult(Outcome.BAD_BUILD, None, "ErrImagePull", "image_pull"), exc.ImagePullFailed),
    ],
)
def test_bad_input_and_a_bad_build_fail_at_once(
    week: Any, result: AttemptResult, raised: type[Exception]
) -> None:
    task = phase_task(week, "prepare", Role.REGULAR, 0)
    with pytest.raises(raised):
        _try(task, TaskInstance(task.task_id), result)
    assert week[2].outcome(week[1]["case_id"], "prepare").outcome is result.outcome


def test_a_failed_scenario_is_a_result(week: Any) -> None:
    task = phase_task(week, "prepare", Role.REGULAR, 0)
    out = _try(task, TaskInstance(task.task_id), AttemptResult(Outcome.SCENARIO_FAILED, 3, "collision"))
    assert out["outcome"] == "scenario_failed" and out["output_uri"]


def test_an_open_breaker_stops_the_launch(week: Any) -> None:
    task = phase_task(week, "prepare", Role.REGULAR, 0)
    assert task.lifecycle.args.node_class == NODE_CPU
    task.lifecycle.service.books.breaker.trip("the canary gate failed")
    with pytest.raises(exc.BreakerOpen, match="circuit breaker open"):
        task.lifecycle.begin_attempt({"ti": TaskInstance(task.task_id)})
    committed = week[2].outcome(week[1]["case_id"], "prepare")
    assert (committed.outcome, committed.detail) == (Outcome.BAD_BUILD, "breaker_open")
