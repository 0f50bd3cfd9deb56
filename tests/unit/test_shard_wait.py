"""The ``shards`` task's wait for its shard run: the trigger never resumes the task within its bound
(Airflow 3.3.2 fails a task resumed before the scheduler saw its deferring try end), the operator
waits on it wherever Airflow's TriggerDagRunOperator would wait on DagStateTrigger, and a cleared
task whose shard run already ended well takes its end without waiting."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from airflow.providers.standard.triggers.external_task import DagStateTrigger
from airflow.sdk.exceptions import TaskDeferred
from airflow.utils.state import DagRunState

from avsim.airflow_internals import RESUME_AFTER_DEFER_MIN_SECONDS
from avsim.artifacts import RunLayout
from avsim.operators.shard import ShardRunOperator
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


class _TI:
    """What ShardRunOperator.execute asks of the runtime task instance (Airflow's task SDK)."""

    def __init__(self, state: str | None) -> None:
        self.state = state

    def get_dr_count(self, dag_id: str, run_ids: list[str]) -> int:
        return 0 if self.state is None else 1

    def get_dagrun_state(self, dag_id: str, run_id: str) -> str:
        assert self.state is not None
        return self.state


def _operator(root: Path) -> ShardRunOperator:
    return ShardRunOperator(
        task_id="shards",
        trigger_dag_id="avsim_weekly_shard",
        trigger_run_id=RUN_ID,
        shard=3,
        run={"run_key": "avsim_weekly__w1", "artifact_root": f"file://{root}", "canary_count": 1},
    )


class _Run:
    run_id = "w1"
    run_after = None
    logical_date = None


def test_a_shard_run_still_running_is_waited_for_with_the_bound(tmp_path: Path) -> None:
    op = _operator(tmp_path)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": _TI("running"), "dag_run": _Run()})
    trigger = deferred.value.trigger
    assert type(trigger) is ShardRunTrigger and trigger.run_ids == [RUN_ID]
    assert trigger.min_wait_seconds == RESUME_AFTER_DEFER_MIN_SECONDS


def test_the_operator_swaps_airflows_wait_for_the_bounded_one(tmp_path: Path) -> None:
    """TriggerDagRunOperator.execute (a new shard run) defers on DagStateTrigger: the same wait,
    bounded, is what gets deferred on."""
    op = _operator(tmp_path)
    airflows = DagStateTrigger(
        dag_id="avsim_weekly_shard",
        states=[DagRunState.SUCCESS, DagRunState.FAILED],
        run_ids=[RUN_ID],
        poll_interval=7,
    )
    with pytest.raises(TaskDeferred) as deferred:
        op.defer(trigger=airflows, method_name="execute_complete")
    trigger = deferred.value.trigger
    assert type(trigger) is ShardRunTrigger
    _, ours = trigger.serialize()
    _, theirs = airflows.serialize()
    assert ours == {**theirs, "min_wait_seconds": RESUME_AFTER_DEFER_MIN_SECONDS}
    assert deferred.value.method_name == "execute_complete"


def test_a_cleared_task_whose_shard_run_ended_well_takes_its_end_without_waiting(tmp_path: Path) -> None:
    op = _operator(tmp_path)
    write_json(
        RunLayout(f"file://{tmp_path}", "avsim_weekly__w1").shard_summary(3), {"counts": {"passed": 4}}
    )
    result = op.execute({"ti": _TI("success"), "dag_run": _Run()})
    assert result == {"shard": 3, "run_id": RUN_ID, "counts": {"passed": 4}}
