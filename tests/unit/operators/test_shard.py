"""The ``shards`` task's wait for its shard run: the trigger never resumes the task within its bound
(Airflow 3.3.2 fails a task resumed before the scheduler saw its deferring try end), the operator
waits on it on every route (a shard run it creates, one still running, one it repaired), a cleared
task whose shard run already ended well takes its end without waiting, and the build's breaker only
stops work still to do."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred
from tests.support.shard_tasks import (
    SHARD_CONF,
    FakeParent,
    FakeRun,
    FakeSupervisor,
    FakeTI,
    NewTI,
    open_breaker,
    run_of_a_build,
    supervising,
)

from avsim.artifacts import RunLayout
from avsim.operators.shard import ShardRunOperator
from avsim.resume import FALLBACK_SECONDS as RESUME_AFTER_DEFER_MIN_SECONDS
from avsim.storage import write_json
from avsim.triggers.shard_run import ShardRunTrigger

RUN_ID = "w1__shard_0003"


def _trigger(**kwargs: Any) -> ShardRunTrigger:
    return ShardRunTrigger(
        dag_id="avsim_weekly_shard", states=["success", "failed"], run_ids=[RUN_ID], poll_interval=1, **kwargs
    )


def test_serialize() -> None:
    classpath, kwargs = _trigger().serialize()
    assert classpath == "avsim.triggers.shard_run.ShardRunTrigger"
    assert kwargs["min_wait_seconds"] == RESUME_AFTER_DEFER_MIN_SECONDS
    json.dumps(kwargs)  # JSON-friendly: the triggerer stores it in the database
    assert ShardRunTrigger(**kwargs).serialize() == (classpath, kwargs)


class _EndedAtOnce(ShardRunTrigger):
    """The shard run already ended when the trigger starts. The boundary mocked: Airflow's
    execution API, which DagStateTrigger asks for the run's state (the triggerer's supervisor)."""

    async def validate_count_dags_af_3(self, runs_ids_or_dates_len: int = 0) -> dict[str, str]:
        return {RUN_ID: "success"}


async def _first_event(trigger: ShardRunTrigger) -> tuple[float, Any]:
    began = time.monotonic()
    async for event in trigger.run():
        return time.monotonic() - began, event.payload
    raise AssertionError("no event")


def test_a_shard_run_that_ended_at_once_is_reported_after_the_bound_not_before() -> None:
    waited, payload = asyncio.run(
        _first_event(
            _EndedAtOnce(
                dag_id="avsim_weekly_shard",
                states=["success", "failed"],
                run_ids=[RUN_ID],
                min_wait_seconds=0.4,
            )
        )
    )
    assert waited >= 0.4
    classpath, data = payload
    assert classpath.endswith("_EndedAtOnce") and data[RUN_ID] == "success"
    # No bound (0): at once, as Airflow's own trigger.
    waited, _ = asyncio.run(
        _first_event(
            _EndedAtOnce(
                dag_id="avsim_weekly_shard", states=["success"], run_ids=[RUN_ID], min_wait_seconds=0
            )
        )
    )
    assert waited < 0.4


def _operator(root: Path) -> ShardRunOperator:
    return ShardRunOperator(
        task_id="shards",
        trigger_dag_id="avsim_weekly_shard",
        trigger_run_id=RUN_ID,
        shard=3,
        run={"run_key": "avsim_weekly__w1", "artifact_root": f"file://{root}", "canary_count": 1},
    )


def test_a_shard_run_still_running_is_waited_for_with_the_bound(tmp_path: Path) -> None:
    op = _operator(tmp_path)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": FakeTI("running"), "dag_run": FakeRun()})
    trigger = deferred.value.trigger
    assert type(trigger) is ShardRunTrigger and trigger.run_ids == [RUN_ID]
    assert trigger.min_wait_seconds == RESUME_AFTER_DEFER_MIN_SECONDS


def test_a_cleared_task_whose_shard_run_ended_well_takes_its_end_without_waiting(tmp_path: Path) -> None:
    op = _operator(tmp_path)
    write_json(
        RunLayout(f"file://{tmp_path}", "avsim_weekly__w1").shard_summary(3), {"counts": {"passed": 4}}
    )
    result = op.execute({"ti": FakeTI("success"), "dag_run": FakeRun()})
    assert result == {"shard": 3, "run_id": RUN_ID, "counts": {"passed": 4}}


# -- the order of the checks, and the first creation of a shard run -----------------------------------


def _operator_of_a_build(root: Path) -> ShardRunOperator:
    return ShardRunOperator(
        task_id="shards",
        trigger_dag_id="avsim_weekly_shard",
        trigger_run_id=RUN_ID,
        shard=3,
        conf=SHARD_CONF,
        run=run_of_a_build(root),
    )


def test_a_cleared_shard_whose_run_succeeded_is_taken_while_the_breaker_is_open(tmp_path: Path) -> None:
    """Issue 31 item 8: the breaker said nothing about a shard run that already ended well."""
    open_breaker(tmp_path)
    write_json(
        RunLayout(f"file://{tmp_path}", "avsim_weekly__w1").shard_summary(3), {"counts": {"passed": 4}}
    )
    result = _operator_of_a_build(tmp_path).execute({"ti": FakeTI("success"), "dag_run": FakeRun()})
    assert result == {"shard": 3, "run_id": RUN_ID, "counts": {"passed": 4}}


def test_a_running_shard_run_is_waited_for_while_the_breaker_is_open(tmp_path: Path) -> None:
    open_breaker(tmp_path)
    with pytest.raises(TaskDeferred) as deferred:
        _operator_of_a_build(tmp_path).execute({"ti": FakeTI("running"), "dag_run": FakeRun()})
    assert type(deferred.value.trigger) is ShardRunTrigger


def test_a_failed_shard_run_is_not_repaired_onto_anopen_breaker(tmp_path: Path) -> None:
    """Its cleared phases would fail fast as breaker_open: refused, saying what to do, and nothing cleared
    (the repair's REST connection does not exist here: a repair attempt would raise RepairFailed)."""
    from avsim.operators.exceptions import BreakerOpen

    open_breaker(tmp_path)
    with pytest.raises(BreakerOpen) as refused:
        _operator_of_a_build(tmp_path).execute({"ti": FakeTI("failed"), "dag_run": FakeRun()})
    message = str(refused.value)
    assert f"shard run {RUN_ID} failed and is not repaired" in message
    assert "avsim breaker reset sha256:" + "e" * 64 in message and "clear this task" in message


def test_a_new_shard_run_is_refused_while_the_breaker_is_open(tmp_path: Path) -> None:
    from avsim.operators.exceptions import BreakerOpen

    open_breaker(tmp_path)
    comms = FakeSupervisor()
    with supervising(comms), pytest.raises(BreakerOpen, match="shard 3 not started"):
        _operator_of_a_build(tmp_path).execute({"ti": FakeTI(None), "dag_run": FakeRun()})
    assert comms.sent == []


@pytest.mark.parametrize("already_there", [False, True])
def test_a_new_shard_run_is_created_by_the_task_and_waited_for_with_the_bound(
    tmp_path: Path, already_there: bool
) -> None:
    """Issue 31 item 10: the first creation of a shard run used to raise Airflow's DagRunTriggerException,
    whose handler in the task runner creates the run and defers on a plain DagStateTrigger, so a shard run
    that ended within seconds could resume the task early. Now the task creates it through the same
    execution API and defers on ShardRunTrigger; a run another try created meanwhile is waited for too."""
    import datetime as dt

    comms = FakeSupervisor(exists=already_there)
    ti = NewTI()
    with supervising(comms), pytest.raises(TaskDeferred) as deferred:
        _operator_of_a_build(tmp_path).execute({"ti": ti, "dag_run": FakeParent()})
    [msg] = comms.sent
    assert type(msg).__name__ == "TriggerDagRun"
    assert (msg.dag_id, msg.run_id) == ("avsim_weekly_shard", RUN_ID)
    assert msg.conf == {"run": {"run_key": "avsim_weekly__w1"}, "shard": 3}
    # Shard k's logical date is the parent's run_after plus k microseconds (the scheduler's tie-break).
    assert msg.logical_date == FakeParent.run_after + dt.timedelta(microseconds=3)
    assert not msg.reset_dag_run
    trigger = deferred.value.trigger
    assert type(trigger) is ShardRunTrigger and trigger.run_ids == [RUN_ID]
    assert trigger.min_wait_seconds == RESUME_AFTER_DEFER_MIN_SECONDS
    assert deferred.value.method_name == "execute_complete"
    assert ti.pushed["trigger_run_id"] == RUN_ID  # the "Triggered DAG" link


def test_the_breaker_stops_only_work_still_to_do() -> None:
    from avsim.operators.shard import ShardRunEnd, ShardStep, next_step

    table = {
        (ShardRunEnd.ENDED_WELL, False): ShardStep.TAKE_END,
        (ShardRunEnd.ENDED_WELL, True): ShardStep.TAKE_END,
        (ShardRunEnd.NOT_ENDED, False): ShardStep.WAIT,
        (ShardRunEnd.NOT_ENDED, True): ShardStep.WAIT,
        (ShardRunEnd.FAILED, False): ShardStep.REPAIR,
        (ShardRunEnd.FAILED, True): ShardStep.REFUSE_REPAIR,
        (None, False): ShardStep.START,
        (None, True): ShardStep.REFUSE_START,
    }
    for (run, breaker_open), step in table.items():
        assert next_step(run, breaker_open) is step, (run, breaker_open)


def test_an_automatic_retry_reports_a_failed_shard_run_and_never_repairs_it() -> None:
    """`shards` retries a passing error (the API server away); only a user's clear repairs a failed
    shard run, so a retry that finds one failed waits on it, which reports its verdict."""
    from avsim.operators.shard import ShardRunEnd, ShardStep, next_step

    assert next_step(ShardRunEnd.FAILED, False, retrying=True) is ShardStep.WAIT
    assert next_step(ShardRunEnd.FAILED, None, retrying=True) is ShardStep.WAIT
    assert next_step(None, False, retrying=True) is ShardStep.START
    assert next_step(ShardRunEnd.ENDED_WELL, True, retrying=True) is ShardStep.TAKE_END
