"""Starting one shard DAG run from the parent weekly run and waiting for it."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator

from avsim.contracts import RunDescriptor

#: The longest a ``shards`` task waits, deferred, for a shard run it found already there.
SHARD_WAIT_TIMEOUT = dt.timedelta(days=8)


class ShardRunOperator(TriggerDagRunOperator):
    """Creates one shard DAG run (deterministic run id) and waits for it, deferred in the triggerer.

    Mapped over the week's shards with ``max_active_tis_per_dagrun`` = W, it is the week's
    window: a shard run is only created when one of the W before it has ended, so queued
    shard runs and their waiting triggers never pile up, however many shards the week has.
    Returns the shard's counts; fails with the shard's verdict (:mod:`avsim.verdict`) when the
    shard run failed because cases need attention, and its map index label says how many.

    A retry or a cleared task finds its shard run already there. Shard runs are never reset,
    so nothing a shard did is lost: when the shard run failed, the task first **repairs it in
    place**: through the Airflow REST API (``airflow_api_conn_id``) it clears the shard run's
    failed task instances with their downstream (the failed phases of the failed cases, then
    ``summarize``) and the weekly run's ``report``, records the repair in the ledger, and waits
    again. So one "Clear → Only failed" on the weekly run reruns exactly the failed cases of
    every failed shard and refreshes the report (docs/design.md).
    """

    template_fields: Sequence[str] = (*TriggerDagRunOperator.template_fields, "shard", "run")
    ui_color = "#f3e4d8"

    def __init__(
        self, *, shard: Any, run: Any, airflow_api_conn_id: str = "avsim_airflow_api", **kwargs: Any
    ) -> None:
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
        self.airflow_api_conn_id = airflow_api_conn_id
        #: Appended to the map index label when the shard needs attention (" · 2 need attention").
        self.attention_label = ""

    @property
    def descriptor(self) -> RunDescriptor:
        """The week this shard run belongs to (``run``, rendered from ``prepare``'s XCom)."""
        return RunDescriptor.model_validate(self.run)

    def execute(self, context: Any) -> Any:
        if int(self.shard) == 0 and not self.descriptor.canary_count:
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
        base = getattr(context["dag_run"], "run_after", None) or getattr(
            context["dag_run"], "logical_date", None
        )
        if base is not None:
            self.logical_date = base + dt.timedelta(microseconds=int(self.shard))
        run_id = str(self.trigger_run_id)
        ti = context["ti"]
        if ti.get_dr_count(dag_id=self.trigger_dag_id, run_ids=[run_id]):
            from avsim.triggers.shard_run import ShardRunTrigger

            state = ti.get_dagrun_state(dag_id=self.trigger_dag_id, run_id=run_id)
            if state in self.allowed_states:
                # Cleared after its shard run ended well (the try that waited for it was lost or
                # failed on the way): nothing to wait for.
                self.log.info("shard run %s exists and ended %s", run_id, state)
                return self._ended(context, run_id, state)
            if state in self.failed_states:
                self._repair_in_place(context, run_id)
            else:
                self.log.info("shard run %s exists (%s): waiting for it", run_id, state)
            self.defer(
                trigger=ShardRunTrigger(
                    dag_id=self.trigger_dag_id,
                    states=[*self.allowed_states, *self.failed_states],
                    run_ids=[run_id],
                    poll_interval=self.poke_interval,
                ),
                method_name="execute_complete",
                # A bound on the wait, so no deferral is endless: a shard run of a weekly run that
                # has not ended in a week and a day is failed here (clearing the task waits again).
                timeout=SHARD_WAIT_TIMEOUT,
            )
        return super().execute(context)

    def defer(
        self, *, trigger: Any, method_name: str, kwargs: dict[str, Any] | None = None, timeout: Any = None
    ) -> Any:
        """Wait on :class:`avsim.triggers.shard_run.ShardRunTrigger` where TriggerDagRunOperator
        waits on Airflow's DagStateTrigger: a shard run that ends within seconds of the wait must
        not resume this task before the scheduler has seen the try that deferred end."""
        from airflow.providers.standard.triggers.external_task import DagStateTrigger

        from avsim.triggers.shard_run import ShardRunTrigger

        if type(trigger) is DagStateTrigger:
            trigger = ShardRunTrigger.waiting_like(trigger)
        return super().defer(trigger=trigger, method_name=method_name, kwargs=kwargs, timeout=timeout)

    def _refuse_if_breaker_open(self) -> None:
        """Start no shard run of a build whose circuit breaker is open: its phases would fail anyway."""
        from avsim.ledger.breaker import Breaker, image_digest

        run = self.descriptor
        digest = image_digest(run.image)
        state = Breaker(run.artifact_root, digest).state()
        if state.is_open:
            from avsim.operators.exceptions import BreakerOpen

            raise BreakerOpen(
                f"shard {self.shard} not started: the circuit breaker of build {run.build_id} is open "
                f"({state.reason}). Reset it with `avsim breaker reset {digest}` and clear this task, "
                "or start a run with a fixed build"
            )

    def _repair_in_place(self, context: Any, run_id: str) -> None:
        """Clear the failed shard run's failed task instances (and their downstream) and the weekly
        run's report, through the REST API; record the repair in the ledger."""
        from avsim.hooks.airflow_api import AirflowApiError, AirflowApiHook
        from avsim.ledger.store import Ledger
        from avsim.operators.exceptions import RepairFailed

        ti = context["ti"]
        parent = context["dag_run"]
        note = f"repaired in place by {ti.dag_id} {parent.run_id} {ti.task_id}[{self.shard}] (try {ti.try_number})"
        hook = AirflowApiHook(self.airflow_api_conn_id)
        try:
            cleared = hook.clear_task_instances(
                self.trigger_dag_id, run_id, only_failed=True, include_downstream=True, note=note[:1000]
            )
            self._clear_the_report(hook, ti.dag_id, parent.run_id)
        except AirflowApiError as exc:
            raise RepairFailed(
                f"shard run {run_id} failed and could not be repaired in place: {exc}. Check the Airflow "
                f"connection {self.airflow_api_conn_id!r} ([avsim] airflow_api_conn_id), or clear the shard "
                "run's failed task instances yourself (docs/operations.md, runbook 2), then clear this task"
            ) from None
        tasks = sorted({(str(t["task_id"]), int(t.get("map_index", -1))) for t in cleared})
        self.log.warning(
            "shard run %s had failed: cleared %d of its task instances (failed phases, their downstream, "
            "summarize) and the weekly report; waiting for it again",
            run_id,
            len(tasks),
        )
        layout = self.descriptor.layout
        Ledger(layout).record_repair(
            int(self.shard),
            int(ti.try_number),
            {
                "shard": int(self.shard),
                "shard_run_id": run_id,
                "parent_run_id": parent.run_id,
                "parent_try": int(ti.try_number),
                "at": dt.datetime.now(dt.UTC).isoformat(),
                "cleared": len(tasks),
                "task_instances": [list(t) for t in tasks[:200]],
            },
        )

    def _clear_the_report(self, hook: Any, dag_id: str, run_id: str) -> None:
        """Have the weekly report written again after every shard: a clear of selected map indexes
        leaves it alone. Nothing to do when it is waiting already (a clear of the whole run took it).
        Shards repairing at once may collide in the database: the hook tries a 5xx answer again."""
        if hook.task_instance_state(dag_id, run_id, "report") in (
            "success",
            "failed",
            "upstream_failed",
            "skipped",
        ):
            hook.clear_task_instances(
                dag_id,
                run_id,
                only_failed=False,
                include_downstream=False,
                task_ids=["report"],
                reset_dag_runs=False,
            )

    def execute_complete(self, context: Any, event: tuple[str, dict[str, Any]]) -> dict[str, Any]:
        from avsim.storage import exists, read_json
        from avsim.verdict import shard_verdict

        layout = self.descriptor.layout
        _, data = event
        run_id = (data.get("run_ids") or [str(self.trigger_run_id)])[0]
        if data.get(run_id) in self.failed_states:
            from airflow.sdk.exceptions import AirflowFailException

            from avsim.operators.exceptions import ShardNeedsAttention

            if not exists(layout.shard_summary(int(self.shard))):
                raise AirflowFailException(
                    f"shard run {run_id} failed before it wrote its summary: open it (Triggered DAG) to see "
                    "which task failed, then clear this task to repair it in place"
                )
            verdict = shard_verdict(read_json(layout.shard_summary(int(self.shard))))
            if not verdict.needs_attention:
                raise AirflowFailException(
                    f"shard run {run_id} failed though its summary names no case that needs attention "
                    f"({verdict.line()}): open it to see which task failed, then clear this task"
                )
            self.attention_label = verdict.label
            raise ShardNeedsAttention(f"{verdict.line()} (shard run {run_id})")
        super().execute_complete(context, event)  # raises for any other state it does not allow
        return self._ended(context, run_id, data.get(run_id))

    def _ended(self, context: Any, run_id: str, state: Any) -> dict[str, Any]:
        """The task's result once its shard run ended in an allowed state: the shard's counts."""
        from avsim.storage import read_json

        summary = read_json(self.descriptor.layout.shard_summary(int(self.shard)))
        counts = dict(summary.get("counts") or {})
        self.log.info("shard %s finished (%s): %s", self.shard, state, counts)
        return {"shard": int(self.shard), "run_id": run_id, "counts": counts}
