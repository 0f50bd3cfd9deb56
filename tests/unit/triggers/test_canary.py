"""The canary gate's trigger: JSON-friendly arguments, and a failed gate stops the build at once."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from avsim.artifacts import RunLayout
from avsim.contracts import RunDescriptor, ShardConf
from avsim.contracts.week import CanaryPlan
from avsim.ledger.breaker import Breaker
from avsim.ledger.documents import DocumentStore
from avsim.ledger.records import AttemptRecord
from avsim.phases.contract import Outcome
from avsim.triggers.canary import CanaryGateTrigger

IMAGE = "registry.example.com/sim/av@sha256:" + "c" * 64


def _trigger(root: str, image: str = IMAGE) -> CanaryGateTrigger:
    run = RunDescriptor(run_key="avsim_weekly__r1", artifact_root=root, build_id="sim-1", image=image)
    plan = CanaryPlan(
        shard=0,
        threshold=0.5,
        cases={"c1": ("prepare",), "c2": ("prepare",), "c3": ("prepare",)},
        trigger_run_id="r1__canary",
        conf=ShardConf(run=run, shard=0),
    )
    return CanaryGateTrigger(plan=plan.to_json(), poll_interval=0.01)


def test_serialize(tmp_path: Path) -> None:
    trigger = _trigger(f"file://{tmp_path}")
    classpath, kwargs = trigger.serialize()
    assert classpath == "avsim.triggers.canary.CanaryGateTrigger"
    json.dumps(kwargs)  # JSON-friendly: the triggerer stores it in the database
    again = CanaryGateTrigger(**kwargs)
    assert again.serialize() == (classpath, kwargs)


def _record(case_id: str, n: int, outcome: str, ended_at: str, detail: str) -> dict[str, object]:
    """An ended attempt's record as the ledger holds it."""
    return AttemptRecord(
        run_key="avsim_weekly__r1",
        case_id=case_id,
        phase="prepare",
        attempt=n,
        started_at=ended_at,
        ended_at=ended_at,
        exit_code=None,
        outcome=Outcome(outcome),
        reason="",
        output_uri="",
        host="test",
        duration_seconds=1.0,
        detail=detail,
    ).to_json()


def _first_attempts(root: str, outcomes: dict[str, str]) -> None:
    layout = RunLayout(root, "avsim_weekly__r1")
    docs = DocumentStore()
    for case_id, outcome in outcomes.items():
        docs.put(layout.attempt_record(case_id, "prepare", 1), _record(case_id, 1, outcome, "", "crash"))


def _decide(trigger: CanaryGateTrigger) -> dict[str, object]:
    async def first() -> dict[str, object]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("no event")

    return asyncio.run(asyncio.wait_for(first(), timeout=30))


def test_a_failed_gate_opens_the_builds_breaker_when_it_decides(tmp_path: Path) -> None:
    root = f"file://{tmp_path}"
    _first_attempts(root, {"c1": "infra_failed", "c2": "infra_failed", "c3": "passed"})
    event = _decide(_trigger(root))
    assert event["status"] == "failed" and event["failed_cases"] == 2
    state = Breaker(root, "sha256:" + "c" * 64).state()
    assert state.is_open and state.reason.startswith("canary gate: canary gate FAILED: 2 of 3")


def test_a_passing_gate_leaves_the_breaker_closed(tmp_path: Path) -> None:
    root = f"file://{tmp_path}"
    _first_attempts(root, {"c1": "passed", "c2": "scenario_failed", "c3": "infra_failed"})
    DocumentStore().put(RunLayout(root, "avsim_weekly__r1").shard_summary(0), {"shard": 0, "cases": []})
    event = _decide(_trigger(root))
    assert event["status"] == "passed"
    assert not Breaker(root, "sha256:" + "c" * 64).state().is_open


# -- a cleared gate judges the canary's new round (issue 31, item 1) ----------------------------------
T_FIRST, T_CLEAR, T_AFTER = (
    "2026-12-07T06:10:00+00:00",
    "2026-12-07T07:00:00+00:00",
    "2026-12-07T07:05:00+00:00",
)


def _attempt(root: str, case_id: str, n: int, outcome: str, ended_at: str, detail: str = "crash") -> None:
    layout = RunLayout(root, "avsim_weekly__r1")
    DocumentStore().put(
        layout.attempt_record(case_id, "prepare", n), _record(case_id, n, outcome, ended_at, detail)
    )


def _since_trigger(root: str, since: str) -> CanaryGateTrigger:
    _, kwargs = _trigger(root).serialize()
    return CanaryGateTrigger(**{**kwargs, "since": since})


def test_a_cleared_gate_judges_the_repaired_round_not_the_failures_that_stopped_the_week(
    tmp_path: Path,
) -> None:
    """The first round crashed every canary case; the pool was fixed and the week cleared: the repaired
    attempts (2, and 3 after a retry) pass, and the gate passes instead of reading attempt 1 again."""
    root = f"file://{tmp_path}"
    for case in ("c1", "c2", "c3"):
        _attempt(root, case, 1, "infra_failed", T_FIRST)
    _attempt(root, "c1", 2, "passed", T_AFTER)
    _attempt(root, "c2", 2, "preempted", T_AFTER, detail="spot")  # says nothing: its next attempt does
    _attempt(root, "c2", 3, "passed", T_AFTER)
    _attempt(root, "c3", 2, "scenario_failed", T_AFTER, detail="")
    summary = RunLayout(root, "avsim_weekly__r1").shard_summary(0)
    DocumentStore().put(summary, {"shard": 0, "cases": [], "written_at": T_AFTER})
    event = _decide(_since_trigger(root, T_CLEAR))
    assert event["status"] == "passed", event
    assert event["failed_cases"] == 0 and event["finished"] == 3
    assert not Breaker(root, "sha256:" + "c" * 64).state().is_open
    # The same ledger read as the week's first round (no since) is the failure that stopped it.
    assert _decide(_trigger(root))["status"] == "failed"


def test_a_cleared_gate_waits_for_the_repaired_round_and_a_new_summary(tmp_path: Path) -> None:
    root = f"file://{tmp_path}"
    for case in ("c1", "c2", "c3"):
        _attempt(root, case, 1, "infra_failed", T_FIRST)
    # The canary shard run's summary of the round that failed is not this round's end.
    DocumentStore().put(
        RunLayout(root, "avsim_weekly__r1").shard_summary(0), {"shard": 0, "cases": [], "written_at": T_FIRST}
    )
    trigger = _since_trigger(root, T_CLEAR)
    seen: dict[str, dict[str, AttemptRecord]] = {c: {} for c in trigger.canary_cases}
    decision = trigger.check(seen)
    assert decision.state == "waiting" and decision.finished_cases == 0
    # The repaired round crashes again (the pool is still broken): that is evidence, and it fails.
    for case in ("c1", "c2"):
        _attempt(root, case, 2, "infra_failed", T_AFTER)
    assert trigger.check(seen).state == "failed"


def test_round_since() -> None:
    from avsim.plan.canary import round_since

    def since(gate_round: int, run: str | None, task: str | None, repaired: str = "") -> str:
        return round_since(
            gate_try_round=gate_round,
            canary_run_state=run,
            canary_task_state=task,
            last_repair_at=repaired,
            now=T_CLEAR,
        )

    assert since(1, "running", "running") == ""  # the week's first round: every attempt counts
    # Cleared with the canary task, which has not repaired its shard run yet: the round begins now.
    assert since(2, "failed", None) == T_CLEAR
    assert since(2, "failed", "queued", repaired=T_FIRST) == T_CLEAR
    # The canary task repaired its run before the gate started: the round began with that repair.
    assert since(2, "queued", "deferred", repaired=T_AFTER) == T_AFTER
    # The gate cleared alone: nothing reruns, so the same evidence decides again.
    assert since(2, "failed", "failed") == ""
    assert since(3, "failed", "failed", repaired=T_FIRST) == T_FIRST


def test_a_plan_that_does_not_parse_is_an_error_event_naming_the_field() -> None:
    """The triggerer stores the plan as JSON; one it cannot read is the gate's error, not a crash."""
    trigger = CanaryGateTrigger(plan={"threshold": 0.5, "cases": {}}, poll_interval=0.01)
    assert trigger.serialize()[1]["plan"] == {"threshold": 0.5, "cases": {}}
    event = _decide(trigger)
    assert event["status"] == "error" and "cases" in str(event["message"])


# -- a gate whose canary task ended without running the canary cannot wait for ever --------------------
class _Supervisor:
    """The triggerer's supervisor as the trigger's state read reaches it (the honest boundary: the
    execution API); it answers the ``canary`` task's state, or fails like an unreachable API."""

    def __init__(self, state: str | None, fails: bool = False) -> None:
        self.state, self.fails, self.asked = state, fails, 0

    def send(self, msg: object) -> object:
        from airflow.sdk.execution_time.comms import GetTaskStates, TaskStatesResult

        assert isinstance(msg, GetTaskStates), msg
        self.asked += 1
        if self.fails:
            raise ConnectionError("the API server is not answering")
        return TaskStatesResult(task_states={"r1": {"canary": self.state}})


def _watching_trigger(root: str, since: str) -> CanaryGateTrigger:
    _, kwargs = _trigger(root).serialize()
    task = {"dag_id": "avsim_weekly", "run_id": "r1", "task_id": "canary"}
    return CanaryGateTrigger(**{**kwargs, "since": since, "canary_task": task})


def _round_that_cannot_start(root: str) -> None:
    """The canary crashed and the gate opened the breaker; the week was cleared, and the gate's round
    began "now" while the `canary` task was pending: it then refused (the breaker still open)."""
    for case in ("c1", "c2", "c3"):
        _attempt(root, case, 1, "infra_failed", T_FIRST)


def test_a_gate_whose_canary_task_refused_fails_at_once_without_tripping_the_breaker(
    tmp_path: Path, monkeypatch
) -> None:
    from airflow.sdk.execution_time import task_runner

    root = f"file://{tmp_path}"
    _round_that_cannot_start(root)
    supervisor = _Supervisor("failed")
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", supervisor, raising=False)
    event = _decide(_watching_trigger(root, T_CLEAR))
    assert event["status"] == "stalled", event
    assert "canary task ended failed" in str(event["message"]) and "clear canary and canary_gate" in str(
        event["message"]
    )
    assert supervisor.asked == 1
    assert not Breaker(root, "sha256:" + "c" * 64).state().is_open  # no verdict on the build


def test_a_gate_waits_while_its_canary_task_may_still_run_or_cannot_be_read(
    tmp_path: Path, monkeypatch
) -> None:
    from airflow.sdk.execution_time import task_runner

    root = f"file://{tmp_path}"
    _round_that_cannot_start(root)
    for supervisor in (_Supervisor("scheduled"), _Supervisor(None, fails=True)):
        monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", supervisor, raising=False)
        trigger = _watching_trigger(root, T_CLEAR)
        assert trigger.canary_task_ended() == ""
        seen: dict[str, dict[str, AttemptRecord]] = {c: {} for c in trigger.canary_cases}
        assert trigger.check(seen).state == "waiting"


def test_the_gate_sensor_fails_a_stalled_gate_without_retry_and_bounds_its_wait() -> None:
    import pytest
    from airflow.sdk.exceptions import AirflowFailException

    from avsim.sensors.canary_gate import GATE_TIMEOUT, CanaryGateSensor

    gate = CanaryGateSensor(task_id="canary_gate", run={}, canary={})
    assert gate.timeout == GATE_TIMEOUT.total_seconds() <= 24 * 3600
    with pytest.raises(AirflowFailException, match="cannot decide"):
        gate.execute_complete({}, {"status": "stalled", "message": "canary gate cannot decide: ..."})
