"""Starting one shard DAG run from the parent weekly run and waiting for it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator

from avsim.artifacts import RunLayout


class ShardRunOperator(TriggerDagRunOperator):
    """Creates one shard DAG run (deterministic run id) and waits for it, deferred in the triggerer.

    Mapped over the week's shards with ``max_active_tis_per_dagrun`` = W, it is the week's
    window: a shard run is only created when one of the W before it has ended, so queued
    shard runs and their waiting triggers never pile up, however many shards the week has.
    A retry (or a cleared task) finds its shard run already there and only waits for it:
    shard runs are never reset, so nothing a shard did is lost. Returns the shard's counts.
    """

    template_fields: Sequence[str] = (*TriggerDagRunOperator.template_fields, "shard", "run")
    ui_color = "#f3e4d8"

    def __init__(self, *, shard: Any, run: Any, **kwargs: Any) -> None:
        kwargs.setdefault("wait_for_completion", True)
        kwargs.setdefault("deferrable", True)
        kwargs.setdefault("reset_dag_run", False)
        kwargs.setdefault("skip_when_already_exists", False)
        kwargs.setdefault("logical_date", None)
        kwargs.setdefault("openlineage_inject_parent_info", False)
        kwargs.setdefault("allowed_states", ["success"])
        kwargs.setdefault("failed_states", ["failed"])
        super().__init__(**kwargs)
        self.shard = shard
        self.run = run

    def execute(self, context: Any) -> Any:
        if int(self.shard) == 0 and not int(self.run.get("canary_count") or 0):
            # Succeed, not skip: the run-level phases and the report wait on the canary with
            # all_done_min_one_success, which in Airflow 3.3 skips a task when any upstream was
            # skipped, so a skipped canary would leave the week without its summary and report.
            message = "this week has no canary stage (canary disabled or too few cases)"
            self.log.info(message)
            return {"shard": 0, "run_id": None, "counts": {}, "message": message}
        self._refuse_if_breaker_open()
        # Shard runs get increasing logical dates (the parent's plus the shard index, in microseconds):
        # the scheduler orders equal priority weights by logical date, so earlier shards finish
        # first instead of all active shards draining in lock-step (measured with the planner).
        import datetime as dt

        base = getattr(context["dag_run"], "run_after", None) or getattr(
            context["dag_run"], "logical_date", None
        )
        if base is not None:
            self.logical_date = base + dt.timedelta(microseconds=int(self.shard))
        run_id = str(self.trigger_run_id)
        if context["ti"].get_dr_count(dag_id=self.trigger_dag_id, run_ids=[run_id]):
            from airflow.providers.standard.triggers.external_task import DagStateTrigger

            self.log.info("shard run %s exists (a retry or a cleared task): waiting for it", run_id)
            self.defer(
                trigger=DagStateTrigger(
                    dag_id=self.trigger_dag_id,
                    states=[*self.allowed_states, *self.failed_states],
                    run_ids=[run_id],
                    poll_interval=self.poke_interval,
                ),
                method_name="execute_complete",
            )
        return super().execute(context)

    def _refuse_if_breaker_open(self) -> None:
        """Start no shard run of a build whose circuit breaker is open: its phases would fail anyway."""
        from avsim.ledger.breaker import Breaker

        image = str(self.run.get("image", ""))
        state = Breaker(str(self.run["artifact_root"]), image.rsplit("@", 1)[-1]).state()
        if state.is_open:
            from avsim.operators.exceptions import BreakerOpen

            raise BreakerOpen(
                f"shard {self.shard} not started: the circuit breaker of build {self.run.get('build_id')} is open "
                f"({state.reason}). Reset it with `avsim breaker reset {image.rsplit('@', 1)[-1]}` and clear this task, "
                "or start a run with a fixed build"
            )

    def execute_complete(self, context: Any, event: tuple[str, dict[str, Any]]) -> dict[str, Any]:
        super().execute_complete(context, event)  # raises when the shard run failed
        from avsim.storage import read_json

        layout = RunLayout(self.run["artifact_root"], self.run["run_key"])
        summary = read_json(layout.shard_summary(int(self.shard)))
        counts = dict(summary.get("counts") or {})
        self.log.info("shard %s finished: %s", self.shard, counts)
        return {"shard": int(self.shard), "run_id": str(self.trigger_run_id), "counts": counts}
