"""Sensor that waits for a shard DAG run and returns the counts of its cases' outcomes."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowException

from avsim.artifacts import RunLayout
from avsim.triggers.shards import TERMINAL_RUN_STATES, ShardRunTrigger


class ShardRunSensor(BaseSensorOperator):
    """Waits (deferred, in the triggerer) until shard run ``shard_run_id`` of ``shard_dag_id`` ends.

    Returns the shard's outcome counts from its summary in the ledger, so the parent run
    shows, per shard, how many cases passed and failed and why.
    """

    template_fields: Sequence[str] = ("shard_run_id", "shard", "run")
    ui_color = "#e8f0d8"

    def __init__(
        self,
        *,
        shard_dag_id: str,
        shard_run_id: Any,
        shard: Any,
        run: Any,
        poll_interval: float = 10.0,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("deferrable", True)
        kwargs.setdefault("mode", "reschedule")
        kwargs.setdefault("timeout", timedelta(days=7).total_seconds())
        self.deferrable = kwargs.pop("deferrable")
        super().__init__(poke_interval=poll_interval, **kwargs)
        self.shard_dag_id = shard_dag_id
        self.shard_run_id = shard_run_id
        self.shard = shard
        self.run = run
        self.poll_interval = poll_interval

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            return super().execute(context)
        self.defer(
            trigger=ShardRunTrigger(self.shard_dag_id, str(self.shard_run_id), self.poll_interval),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout) if self.timeout else None,
        )

    def poke(self, context: Any) -> bool:
        state = context["ti"].get_dagrun_state(dag_id=self.shard_dag_id, run_id=str(self.shard_run_id))
        if state not in TERMINAL_RUN_STATES:
            return False
        self._finish(state)
        return True

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("status") != "done":
            raise AirflowException(f"waiting for shard run {self.shard_run_id}: {event.get('message')}")
        return self._finish(event["state"])

    def _finish(self, state: str) -> dict[str, Any]:
        if state != "success":
            raise AirflowException(
                f"shard run {self.shard_run_id} ended {state}: its summary did not finish; "
                f"open the run of {self.shard_dag_id} to see which task failed"
            )
        from avsim.storage import read_json

        layout = RunLayout(self.run["artifact_root"], self.run["run_key"])
        summary = read_json(layout.shard_summary(int(self.shard)))
        counts = dict(summary.get("counts") or {})
        self.log.info("shard %s finished: %s", self.shard, counts)
        return {"shard": int(self.shard), "run_id": str(self.shard_run_id), "counts": counts}
