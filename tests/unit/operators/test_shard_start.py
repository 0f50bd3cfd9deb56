"""``shard_start``: admits a shard run and creates it, never waits for it; defers on the admission
trigger while the week has no room, and fails with what to do when the week cannot be counted."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred
from tests.support.shard_tasks import (
    IMAGE,
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

from avsim.operators.shard_start import ShardStartOperator

RUN_ID = "w1__shard_0003"


def _start_operator(root: Path, **run: Any) -> ShardStartOperator:
    return ShardStartOperator(
        task_id="shard_start",
        trigger_dag_id="avsim_weekly_shard",
        trigger_run_id=RUN_ID,
        shard=3,
        conf=SHARD_CONF,
        run=run_of_a_build(root, **run),
        case_ends=[["standard.report"]],
    )


def _admitting(root: Path, target: int) -> ShardStartOperator:
    """Shard 3 of a week of 3 shard runs of 2 cases, admitted by ``target`` cases in flight."""
    admission = {"configured": target, "target": target}
    return _start_operator(
        root, canary_count=0, case_count=6, shard_count=3, shard_size=2, admission=admission
    )


def test_shard_start_creates_the_shard_run_and_ends_without_waiting_for_it(tmp_path: Path) -> None:
    """A shard run held by its slowest case must not hold the task that started it: the next shard's
    start needs that slot (``shard_start`` is the only capped task)."""
    import datetime as dt

    comms = FakeSupervisor()
    ti = NewTI()
    with supervising(comms):
        assert _start_operator(tmp_path).execute({"ti": ti, "dag_run": FakeParent()}) == RUN_ID
    [msg] = comms.sent
    assert type(msg).__name__ == "TriggerDagRun" and msg.run_id == RUN_ID
    # Shard k's logical date is the parent's run_after plus k microseconds (the scheduler's tie-break).
    assert msg.logical_date == FakeParent.run_after + dt.timedelta(microseconds=3)
    assert ti.pushed["trigger_run_id"] == RUN_ID


def test_shard_start_leaves_an_existing_shard_run_to_shards(tmp_path: Path) -> None:
    """Another try (or a repair) finds its run there: nothing is created, whatever the breaker says."""
    open_breaker(tmp_path)
    comms = FakeSupervisor()
    with supervising(comms):
        assert _start_operator(tmp_path).execute({"ti": FakeTI("failed"), "dag_run": FakeRun()}) == RUN_ID
    assert comms.sent == []


def test_shard_start_refuses_a_new_shard_run_while_the_breaker_is_open(tmp_path: Path) -> None:
    from avsim.operators.exceptions import BreakerOpen

    open_breaker(tmp_path)
    comms = FakeSupervisor()
    with supervising(comms), pytest.raises(BreakerOpen, match="shard 3 not started"):
        _start_operator(tmp_path).execute({"ti": FakeTI(None), "dag_run": FakeRun()})
    assert comms.sent == []


class _AdmissionTI(FakeTI):
    task_id = "shard_start"


class _FullWeek:
    """The execution API the counts go through (the boundary mocked: the supervisor's
    RuntimeTaskInstance): shard runs 1 and 2 exist, no case has ended."""

    @staticmethod
    def get_task_states(*, dag_id: str, run_ids: list[str], task_ids: list[str], **_: Any) -> dict:
        if dag_id == "avsim_weekly":
            return {
                "w1": {"shard_start_0": "success", "shard_start_1": "success", "shard_start_2": "running"}
            }
        return {r: {"load_shard": "success"} for r in run_ids if r.endswith(("0001", "0002"))}

    @staticmethod
    def get_ti_count(**_: Any) -> int:
        return 0


def test_a_shard_without_room_defers_on_admission_and_a_failed_count_fails_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shard runs 1 and 2 hold 4 unfinished cases, as many as the target of 4: the task defers on the
    admission trigger and creates nothing; an error event fails it saying what to do."""
    from avsim import airflow_internals
    from avsim.errors import AvsimError
    from avsim.triggers.admission import ShardAdmissionTrigger

    monkeypatch.setattr(airflow_internals, "runtime_task_instance", lambda: _FullWeek)
    op = _admitting(tmp_path, 4)
    assert op.admission.patience_seconds == 6  # counts again in the worker before it defers
    op.admission = replace(op.admission, patience_seconds=0)
    comms = FakeSupervisor()
    with supervising(comms), pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": _AdmissionTI(None), "dag_run": FakeRun()})
    assert comms.sent == []
    trigger = deferred.value.trigger
    assert isinstance(trigger, ShardAdmissionTrigger) and deferred.value.method_name == "execute_admitted"
    assert (trigger.shard, trigger.target) == (3, 4)
    assert trigger.week["shards_task_id"] == "shard_start"
    # Admitted, the trigger creates the run itself, as the task would have.
    assert trigger.start is not None and trigger.start["run_id"] == RUN_ID
    assert (trigger.start["dag_id"], trigger.start["api_conn_id"]) == (
        "avsim_weekly_shard",
        "avsim_airflow_api",
    )
    assert trigger.start["image"] == IMAGE
    with pytest.raises(AvsimError, match="could not be counted"):
        op.execute_admitted(
            {"ti": _AdmissionTI(None), "dag_run": FakeRun()}, {"status": "error", "message": "unreachable"}
        )


def test_a_shard_with_room_starts_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same week with a target of 6: 4 unfinished leave room for shard 3's 2 cases."""
    from avsim import airflow_internals

    monkeypatch.setattr(airflow_internals, "runtime_task_instance", lambda: _FullWeek)
    op = _admitting(tmp_path, 6)
    comms = FakeSupervisor()
    with supervising(comms):
        assert op.execute({"ti": _AdmissionTI(None), "dag_run": FakeParent()}) == RUN_ID
    [msg] = comms.sent
    assert msg.run_id == RUN_ID
