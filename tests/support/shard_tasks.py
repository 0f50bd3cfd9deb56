"""What the shard tasks' unit tests share: the runtime task instance and the supervisor channel they
talk to (the boundary mocked: Airflow's task SDK and its execution API), and a build's open breaker."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class FakeTI:
    """What ShardRunOperator.execute asks of the runtime task instance (Airflow's task SDK)."""

    dag_id = "avsim_weekly"

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


class FakeRun:
    run_id = "w1"
    run_after = None
    logical_date = None


IMAGE = "registry.local/sim@sha256:" + "e" * 64


#: The conf of shard run 3 of week w1.
SHARD_CONF = {"run": {"run_key": "avsim_weekly__w1"}, "shard": 3}


def run_of_a_build(root: Path, **fields: Any) -> dict[str, Any]:
    """The run descriptor (as JSON) of week w1 of build b7, its artifacts under ``root``."""
    return {
        "run_key": "avsim_weekly__w1",
        "artifact_root": f"file://{root}",
        "canary_count": 1,
        "image": IMAGE,
        "build_id": "b7",
        **fields,
    }


def open_breaker(root: Path) -> None:
    from avsim.ledger.breaker import Breaker, image_digest

    assert Breaker(f"file://{root}", image_digest(IMAGE)).trip("canary gate: 20 of 20 canary cases crashed")


class FakeSupervisor:
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


class supervising:
    def __init__(self, comms: FakeSupervisor) -> None:
        self.comms = comms

    def __enter__(self) -> None:
        from airflow.sdk.execution_time import task_runner

        self.had = getattr(task_runner, "SUPERVISOR_COMMS", None)
        task_runner.SUPERVISOR_COMMS = self.comms  # type: ignore[assignment]

    def __exit__(self, *exc: Any) -> None:
        from airflow.sdk.execution_time import task_runner

        task_runner.SUPERVISOR_COMMS = self.had  # type: ignore[assignment]


class FakeParent:
    run_id = "w1"
    logical_date = None
    run_after = __import__("datetime").datetime(2026, 12, 7, 6, tzinfo=__import__("datetime").UTC)


class NewTI(FakeTI):
    def __init__(self) -> None:
        super().__init__(None)
