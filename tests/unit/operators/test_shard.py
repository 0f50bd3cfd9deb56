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


class _TI:
    """What ShardRunOperator.execute asks of the runtime task instance (Airflow's task SDK)."""

    def __init__(self, state: str | None) -> None:
        self.state = state
        self.pushed: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value

    def get_dr_count(self, dag_id: str, run_ids: list[str]) -> int:
        return 0 if self.state is None else 1

    def get_dagrun_state(self, dag_id: str, run_id: str) -> Any:
        assert self.state is not None
        from airflow.utils.state import DagRunState

        return DagRunState(self.state)  # what the execution API's answer holds


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


def test_a_cleared_task_whose_shard_run_ended_well_takes_its_end_without_waiting(tmp_path: Path) -> None:
    op = _operator(tmp_path)
    write_json(
        RunLayout(f"file://{tmp_path}", "avsim_weekly__w1").shard_summary(3), {"counts": {"passed": 4}}
    )
    result = op.execute({"ti": _TI("success"), "dag_run": _Run()})
    assert result == {"shard": 3, "run_id": RUN_ID, "counts": {"passed": 4}}


# -- the order of the checks, and the first creation of a shard run -----------------------------------

IMAGE = "registry.local/sim@sha256:" + "e" * 64


def _open_breaker(root: Path) -> None:
    from avsim.ledger.breaker import Breaker, image_digest

    assert Breaker(f"file://{root}", image_digest(IMAGE)).trip("canary gate: 20 of 20 canary cases crashed")


def _operator_of_a_build(root: Path) -> ShardRunOperator:
    return ShardRunOperator(
        task_id="shards",
        trigger_dag_id="avsim_weekly_shard",
        trigger_run_id=RUN_ID,
        shard=3,
        conf={"run": {"run_key": "avsim_weekly__w1"}, "shard": 3},
        run={
            "run_key": "avsim_weekly__w1",
            "artifact_root": f"file://{root}",
            "canary_count": 1,
            "image": IMAGE,
            "build_id": "b7",
        },
    )


def test_a_cleared_shard_whose_run_succeeded_is_taken_while_the_breaker_is_open(tmp_path: Path) -> None:
    """Issue 31 item 8: the breaker said nothing about a shard run that already ended well."""
    _open_breaker(tmp_path)
    write_json(
        RunLayout(f"file://{tmp_path}", "avsim_weekly__w1").shard_summary(3), {"counts": {"passed": 4}}
    )
    result = _operator_of_a_build(tmp_path).execute({"ti": _TI("success"), "dag_run": _Run()})
    assert result == {"shard": 3, "run_id": RUN_ID, "counts": {"passed": 4}}


def test_a_running_shard_run_is_waited_for_while_the_breaker_is_open(tmp_path: Path) -> None:
    _open_breaker(tmp_path)
    with pytest.raises(TaskDeferred) as deferred:
        _operator_of_a_build(tmp_path).execute({"ti": _TI("running"), "dag_run": _Run()})
    assert type(deferred.value.trigger) is ShardRunTrigger


def test_a_failed_shard_run_is_not_repaired_onto_an_open_breaker(tmp_path: Path) -> None:
    """Its cleared phases would fail fast as breaker_open: refused, saying what to do, and nothing cleared
    (the repair's REST connection does not exist here: a repair attempt would raise RepairFailed)."""
    from avsim.operators.exceptions import BreakerOpen

    _open_breaker(tmp_path)
    with pytest.raises(BreakerOpen) as refused:
        _operator_of_a_build(tmp_path).execute({"ti": _TI("failed"), "dag_run": _Run()})
    message = str(refused.value)
    assert f"shard run {RUN_ID} failed and is not repaired" in message
    assert "avsim breaker reset sha256:" + "e" * 64 in message and "clear this task" in message


def test_a_new_shard_run_is_refused_while_the_breaker_is_open(tmp_path: Path) -> None:
    from avsim.operators.exceptions import BreakerOpen

    _open_breaker(tmp_path)
    comms = _Supervisor()
    with _supervising(comms), pytest.raises(BreakerOpen, match="shard 3 not started"):
        _operator_of_a_build(tmp_path).execute({"ti": _TI(None), "dag_run": _Run()})
    assert comms.sent == []


class _Supervisor:
    """The task's channel to its supervisor, which calls Airflow's execution API (the boundary mocked:
    the task runner's SUPERVISOR_COMMS). Answers a TriggerDagRun as the API server does."""

    def __init__(self, exists: bool = False) -> None:
        self.exists = exists
        self.sent: list[Any] = []

    def send(self, msg: Any) -> Any:
        from airflow.sdk.exceptions import ErrorType
        from airflow.sdk.execution_time.comms import ErrorResponse, OKResponse

        self.sent.append(msg)
        if type(msg).__name__ == "TriggerDagRun" and self.exists:
            return ErrorResponse(error=ErrorType.DAGRUN_ALREADY_EXISTS)
        return OKResponse(ok=True)


class _supervising:
    def __init__(self, comms: _Supervisor) -> None:
        self.comms = comms

    def __enter__(self) -> None:
        from airflow.sdk.execution_time import task_runner

        self.had = getattr(task_runner, "SUPERVISOR_COMMS", None)
        task_runner.SUPERVISOR_COMMS = self.comms  # type: ignore[assignment]

    def __exit__(self, *exc: Any) -> None:
        from airflow.sdk.execution_time import task_runner

        task_runner.SUPERVISOR_COMMS = self.had  # type: ignore[assignment]


class _Parent:
    run_id = "w1"
    logical_date = None
    run_after = __import__("datetime").datetime(2026, 12, 7, 6, tzinfo=__import__("datetime").UTC)


class _NewTI(_TI):
    def __init__(self) -> None:
        super().__init__(None)


@pytest.mark.parametrize("already_there", [False, True])
def test_a_new_shard_run_is_created_by_the_task_and_waited_for_with_the_bound(
    tmp_path: Path, already_there: bool
) -> None:
    """Issue 31 item 10: the first creation of a shard run used to raise Airflow's DagRunTriggerException,
    whose handler in the task runner creates the run and defers on a plain DagStateTrigger, so a shard run
    that ended within seconds could resume the task early. Now the task creates it through the same
    execution API and defers on ShardRunTrigger; a run another try created meanwhile is waited for too."""
    import datetime as dt

    comms = _Supervisor(exists=already_there)
    ti = _NewTI()
    with _supervising(comms), pytest.raises(TaskDeferred) as deferred:
        _operator_of_a_build(tmp_path).execute({"ti": ti, "dag_run": _Parent()})
    [msg] = comms.sent
    assert type(msg).__name__ == "TriggerDagRun"
    assert (msg.dag_id, msg.run_id) == ("avsim_weekly_shard", RUN_ID)
    assert msg.conf == {"run": {"run_key": "avsim_weekly__w1"}, "shard": 3}
    # Shard k's logical date is the parent's run_after plus k microseconds (the scheduler's tie-break).
    assert msg.logical_date == _Parent.run_after + dt.timedelta(microseconds=3)
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


# -- admission by cases in flight ---------------------------------------------------------------


class _AdmissionTI(_TI):
    dag_id = "avsim_weekly"
    task_id = "shards"


def _admitting_operator(root: Path) -> ShardRunOperator:
    """Shard 3 of a week of 3 shard runs of 2 cases, admitted with a configured target of 4."""
    run = {
        "run_key": "avsim_weekly__w1",
        "artifact_root": f"file://{root}",
        "case_count": 6,
        "shard_count": 3,
        "shard_size": 2,
        "admission": {"configured": 4, "target": 4},
    }
    return ShardRunOperator(
        task_id="shards",
        trigger_dag_id="avsim_weekly_shard",
        trigger_run_id=RUN_ID,
        shard=3,
        run=run,
        case_ends=[["standard.report"]],
    )


def test_a_shard_without_room_defers_on_admission_and_a_failed_count_fails_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shard runs 1 and 2 run 4 unfinished cases, as many as the target of 4: the task
    defers on the admission trigger, not on its shard run, which it has not created. The boundary
    mocked: the execution API the counts go through (the supervisor's RuntimeTaskInstance)."""
    from avsim import airflow_internals
    from avsim.errors import AvsimError
    from avsim.triggers.admission import ShardAdmissionTrigger

    class ExecutionApi:
        @staticmethod
        def get_task_states(*, dag_id: str, run_ids: list[str], task_ids: list[str], **_: Any) -> dict:
            if dag_id == "avsim_weekly":
                return {"w1": {"shards_0": "deferred", "shards_1": "deferred", "shards_2": "running"}}
            return {r: {"load_shard": "success"} for r in run_ids if r.endswith(("0001", "0002"))}

        @staticmethod
        def get_ti_count(**_: Any) -> int:
            return 0  # no case has ended

    monkeypatch.setattr(airflow_internals, "runtime_task_instance", lambda: ExecutionApi)
    op = _admitting_operator(tmp_path)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": _AdmissionTI(None), "dag_run": _Run()})
    trigger = deferred.value.trigger
    assert isinstance(trigger, ShardAdmissionTrigger) and deferred.value.method_name == "execute_admitted"
    assert (trigger.shard, trigger.target) == (3, 4)
    with pytest.raises(AvsimError, match="could not be counted"):
        op.execute_admitted(
            {"ti": _AdmissionTI(None), "dag_run": _Run()}, {"status": "error", "message": "unreachable"}
        )


# -- shard_start: admits and starts, never waits for the shard run -------------------------------------


def _start_operator(root: Path) -> Any:
    from avsim.operators.shard import ShardStartOperator

    op = _operator_of_a_build(root)
    return ShardStartOperator(
        task_id="shard_start",
        trigger_dag_id=op.trigger_dag_id,
        trigger_run_id=RUN_ID,
        shard=3,
        conf=op.conf,
        run=op.run,
    )


def test_shard_start_creates_the_shard_run_and_ends_without_waiting_for_it(tmp_path: Path) -> None:
    """A shard run held by its slowest case must not hold the task that started it: the next shard's
    start needs that slot (``shard_start`` is the only capped task)."""
    comms = _Supervisor()
    ti = _NewTI()
    with _supervising(comms):
        assert _start_operator(tmp_path).execute({"ti": ti, "dag_run": _Parent()}) == RUN_ID
    [msg] = comms.sent
    assert type(msg).__name__ == "TriggerDagRun" and msg.run_id == RUN_ID
    assert ti.pushed["trigger_run_id"] == RUN_ID


def test_shard_start_leaves_an_existing_shard_run_to_shards(tmp_path: Path) -> None:
    """Another try (or a repair) finds its run there: nothing is created, whatever the breaker says."""
    _open_breaker(tmp_path)
    comms = _Supervisor()
    with _supervising(comms):
        assert _start_operator(tmp_path).execute({"ti": _TI("failed"), "dag_run": _Run()}) == RUN_ID
    assert comms.sent == []


def test_shard_start_refuses_a_new_shard_run_while_the_breaker_is_open(tmp_path: Path) -> None:
    from avsim.operators.exceptions import BreakerOpen

    _open_breaker(tmp_path)
    comms = _Supervisor()
    with _supervising(comms), pytest.raises(BreakerOpen, match="shard 3 not started"):
        _start_operator(tmp_path).execute({"ti": _TI(None), "dag_run": _Run()})
    assert comms.sent == []
