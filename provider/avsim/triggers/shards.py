"""Trigger that waits for one shard DAG run to finish, logging its progress as it goes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

TERMINAL_RUN_STATES = ("success", "failed")
FINISHED_TI_STATES = ["success", "failed", "upstream_failed", "skipped", "removed"]
#: Log a running shard's progress every this many polls.
PROGRESS_EVERY = 6


class ShardRunTrigger(BaseTrigger):
    """Polls the state of a shard DAG run through the task SDK (no direct database access).

    Events: ``{"status": "done", "state": "success"|"failed", "run_id": ...}`` or
    ``{"status": "error", "message": ...}``; the trigger never raises.
    """

    def __init__(self, dag_id: str, run_id: str, poll_interval: float = 10.0) -> None:
        super().__init__()
        self.dag_id = dag_id
        self.run_id = run_id
        self.poll_interval = float(poll_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"dag_id": self.dag_id, "run_id": self.run_id, "poll_interval": self.poll_interval},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance
            from asgiref.sync import sync_to_async

            get_state = sync_to_async(RuntimeTaskInstance.get_dagrun_state)
            count = sync_to_async(RuntimeTaskInstance.get_ti_count)
            polls = 0
            while True:
                state = await get_state(dag_id=self.dag_id, run_id=self.run_id)
                if state in TERMINAL_RUN_STATES:
                    yield TriggerEvent({"status": "done", "state": state, "run_id": self.run_id})
                    return
                if state == "running" and polls % PROGRESS_EVERY == 0:
                    # Progress for the log only, and seldom: one state call per poll is the load.
                    total = await count(dag_id=self.dag_id, run_ids=[self.run_id])
                    done = await count(dag_id=self.dag_id, run_ids=[self.run_id], states=FINISHED_TI_STATES)
                    self.log.info("shard run %s: %d/%d task instances finished", self.run_id, done, total)
                polls += 1
                await asyncio.sleep(self.poll_interval)
        except Exception as exc:
            yield TriggerEvent(
                {"status": "error", "message": f"{type(exc).__name__}: {exc}", "run_id": self.run_id}
            )
