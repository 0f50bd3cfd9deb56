"""Starting one shard DAG run from the parent weekly run and waiting for it."""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.providers.standard.operators.trigger_dagrun import XCOM_RUN_ID, TriggerDagRunOperator

from avsim.contracts import RunDescriptor
from avsim.operators.shard_start import SHARD_WAIT_TIMEOUT, breaker_is_open, breaker_refusal, start_shard_run

if TYPE_CHECKING:
    from airflow.sdk import Context

#: States in which a task of the week's end has run (or was ruled out): a repair clears it again.
WEEK_END_DONE = frozenset({"success", "failed", "upstream_failed", "skipped"})


class ShardRunEnd(enum.Enum):
    """How a ``shards`` task finds its shard run, when there is one."""

    ENDED_WELL = "ended_well"  # in the operator's allowed states
    FAILED = "failed"  # in its failed states: cases need attention
    NOT_ENDED = "not_ended"  # queued or running


class ShardStep(enum.Enum):
    """What a ``shards`` task does next (:func:`next_step`)."""

    TAKE_END = "take_end"
    WAIT = "wait"
    REPAIR = "repair"
    START = "start"
    REFUSE_REPAIR = "refuse_repair"
    REFUSE_START = "refuse_start"


def next_step(run: ShardRunEnd | None, breaker_open: bool | None, *, retrying: bool = False) -> ShardStep:
    """The ``shards`` task's decision, from its shard run (None: none yet) and its build's breaker.

    A shard run that ended well is taken and one still going is waited for, whatever the breaker
    says: neither runs anything more. Only work still to do is refused while the breaker is open:
    a shard run to start, and a failed one to repair (its cleared phases would fail fast as
    ``breaker_open``, fail the shard run again and record nothing but that). Only a user repairs:
    an automatic retry (``retrying``, after a passing error) finds a failed shard run and reports it."""
    if run is ShardRunEnd.ENDED_WELL:
        return ShardStep.TAKE_END
    if run is ShardRunEnd.NOT_ENDED or (run is ShardRunEnd.FAILED and retrying):
        return ShardStep.WAIT
    if run is ShardRunEnd.FAILED:
        return ShardStep.REFUSE_REPAIR if breaker_open else ShardStep.REPAIR
    return ShardStep.REFUSE_START if breaker_open else ShardStep.START


class ShardRunOperator(TriggerDagRunOperator):
    """Creates one shard DAG run (deterministic run id) and waits for it, deferred in the triggerer.

    In the weekly DAG each shard is a map index of the ``shard_runs`` group:
    :class:`avsim.operators.shard_start.ShardStartOperator` (``shard_start``) admits and starts the
    shard run, then this task (``shards``) waits for it, with no cap on how many wait: a shard run held
    by a straggler never keeps the next one from starting (docs/design.md, "Admission by cases in
    flight"). It starts a shard run itself only where no start task did: the canary, or a
    ``shard_start`` a user marked successful (which skips admission, as asked).
    Returns the shard's counts; fails with the shard's verdict (:mod:`avsim.verdict`) when the
    shard run failed because cases need attention, and its map index label says how many.

    A retry or a cleared task finds its shard run already there. Shard runs are never reset,
    so nothing a shard did is lost: when the shard run failed, the task first **repairs it in
    place**: through the Airflow REST API (``airflow_api_conn_id``) it clears the shard run's
    failed task instances with their downstream (the failed phases of the failed cases, then
    ``summarize``) and the weekly run's ``report``, records the repair in the ledger, and waits
    again. So one "Clear → Only failed" on the weekly run reruns exactly the failed cases of
    every failed shard and refreshes the report (docs/design.md).

    What it does is :func:`next_step`: a shard run that ended well is taken and one still going is
    waited for whatever the build's circuit breaker says; while the breaker is open it starts no
    shard run and repairs none. It creates a new shard run itself (through the execution API, as
    Airflow's task runner would) rather than raising TriggerDagRunOperator's
    ``DagRunTriggerException``, so every wait is :meth:`_wait_for`'s bounded one.
    """

    template_fields: Sequence[str] = (*TriggerDagRunOperator.template_fields, "shard", "run")
    ui_color = "#f3e4d8"

    def __init__(
        self,
        *,
        shard: Any,
        run: Any,
        airflow_api_conn_id: str = "avsim_airflow_api",
        week_end_tasks: Sequence[str] = ("report",),
        **kwargs: Any,
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
        #: The weekly run's tasks whose inputs are every shard (``close_week``, the run-level phases,
        #: ``report``): a repair has them run again after the repaired shards.
        self.week_end_tasks = tuple(week_end_tasks)
        #: Appended to the map index label when the shard needs attention (" · 2 need attention").
        self.attention_label = ""

    @property
    def descriptor(self) -> RunDescriptor:
        """The week this shard run belongs to (``run``, rendered from ``prepare``'s XCom)."""
        return RunDescriptor.model_validate(self.run)

    def execute(self, context: Context) -> Any:
        if int(self.shard) == 0 and not self.descriptor.canary_count:
            # Succeed, not skip: the run-level phases and the report wait on the canary with
            # all_done_min_one_success, which in Airflow 3.3 skips a task when any upstream was
            # skipped, so a skipped canary would leave the week without its summary and report.
            message = "this week has no canary stage (canary disabled or too few cases)"
            self.log.info(message)
            return {"shard": 0, "run_id": None, "counts": {}, "message": message}
        run_id = str(self.trigger_run_id)
        ti = context["ti"]
        state: Any = None
        if ti.get_dr_count(dag_id=self.trigger_dag_id, run_ids=[run_id]):
            # A DagRunState (a str enum: compared by value, never through str(), which names the member).
            state = ti.get_dagrun_state(dag_id=self.trigger_dag_id, run_id=run_id)
        ended = self._ended_as(state)
        # The breaker is asked only where it decides something: a shard run to start or to repair.
        # A try after the first of its round is Airflow's retry of a passing error, not a user's clear.
        retrying = int(getattr(ti, "try_number", 1)) > max(
            1, int(getattr(ti, "max_tries", 0) or 0) - int(self.retries or 0) + 1
        )
        breaker = (
            breaker_is_open(self.descriptor)
            if ended is None or (ended is ShardRunEnd.FAILED and not retrying)
            else None
        )
        step = next_step(ended, breaker, retrying=retrying)
        if step is ShardStep.TAKE_END:
            # Cleared after its shard run ended well (the try that waited for it was lost or failed on
            # the way): nothing to wait for, whatever the breaker says now.
            self.log.info("shard run %s exists and ended %s", run_id, state)
            return self._ended(run_id, state)
        if step is ShardStep.REFUSE_START:
            raise breaker_refusal(self.descriptor, f"shard {self.shard} not started")
        if step is ShardStep.REFUSE_REPAIR:
            raise breaker_refusal(
                self.descriptor,
                f"shard run {run_id} failed and is not repaired (its cleared phases would fail fast as "
                "breaker_open)",
            )
        if step is ShardStep.REPAIR:
            self._repair_in_place(context, run_id)
        elif step is ShardStep.START:
            start_shard_run(self, context, int(self.shard), run_id)
        else:
            self.log.info("shard run %s exists (%s): waiting for it", run_id, state)
            context["ti"].xcom_push(key=XCOM_RUN_ID, value=run_id)
        self._wait_for(run_id)

    def _ended_as(self, state: Any) -> ShardRunEnd | None:
        """How the shard run stands: None when there is none yet."""
        if state is None:
            return None
        if state in self.allowed_states:
            return ShardRunEnd.ENDED_WELL
        if state in self.failed_states:
            return ShardRunEnd.FAILED
        return ShardRunEnd.NOT_ENDED

    def _wait_for(self, run_id: str) -> None:
        """The one wait of this task: deferred on :class:`avsim.triggers.shard_run.ShardRunTrigger`,
        which never resumes it before the scheduler has seen the deferring try end (a shard run can
        end within seconds, and Airflow 3.3.2 can fail a task resumed sooner: :mod:`avsim.resume`)."""
        from avsim.triggers.shard_run import ShardRunTrigger

        self.defer(
            trigger=ShardRunTrigger(
                dag_id=self.trigger_dag_id,
                states=[*self.allowed_states, *self.failed_states],
                run_ids=[run_id],
                poll_interval=self.poke_interval,
            ),
            method_name="execute_complete",
            # A bound on the wait, so no deferral is endless: a shard run of a weekly run that has not
            # ended in a week and a day is failed here (clearing the task waits again).
            timeout=SHARD_WAIT_TIMEOUT,
        )

    def _repair_in_place(self, context: Context, run_id: str) -> None:
        """Clear the failed shard run's failed task instances (and their downstream) and the weekly
        run's report, through the REST API; record the repair in the ledger."""
        from avsim.hooks.airflow_api import AirflowApiError, AirflowApiHook
        from avsim.ledger.store import Ledger
        from avsim.operators.exceptions import RepairFailed

        ti = context["ti"]
        parent = context["dag_run"]
        note = f"repaired in place by {ti.dag_id} {parent.run_id} {ti.task_id}[{self.shard}] (try {ti.try_number})"
        ledger = Ledger(self.descriptor.layout)
        repair = {
            "shard": int(self.shard),
            "shard_run_id": run_id,
            "parent_run_id": parent.run_id,
            "parent_try": int(ti.try_number),
            "at": dt.datetime.now(dt.UTC).isoformat(),
        }
        # Recorded before the shard run leaves "failed": the canary gate dates its round from it.
        ledger.record_repair(
            int(self.shard), int(ti.try_number), {**repair, "cleared": 0, "task_instances": []}
        )
        hook = AirflowApiHook(self.airflow_api_conn_id)
        try:
            cleared = hook.clear_task_instances(
                self.trigger_dag_id, run_id, only_failed=True, include_downstream=True, note=note[:1000]
            )
            self._clear_the_week_end(hook, ti.dag_id, parent.run_id)
        except AirflowApiError as exc:
            raise RepairFailed(
                f"shard run {run_id} failed and could not be repaired in place: {exc}. Check the Airflow "
                f"connection {self.airflow_api_conn_id!r} ([avsim] airflow_api_conn_id), or clear the shard "
                "run's failed task instances yourself (docs/operations.md, runbook 2), then clear this task"
            ) from None
        tasks = sorted({(str(t["task_id"]), int(t.get("map_index", -1))) for t in cleared})
        self.log.warning(
            "shard run %s had failed: cleared %d of its task instances (failed phases, their downstream, "
            "summarize) and the weekly run's %s; waiting for it again",
            run_id,
            len(tasks),
            ", ".join(self.week_end_tasks),
        )
        ledger.record_repair(
            int(self.shard),
            int(ti.try_number),
            {**repair, "cleared": len(tasks), "task_instances": [list(t) for t in tasks[:200]]},
        )

    def _clear_the_week_end(self, hook: Any, dag_id: str, run_id: str) -> None:
        """Have the week's end run again after every shard: ``close_week``, the run-level phases (their
        inputs are the shards' summaries, which the repair changes) and the report. A clear of the whole
        run with *Only failed* leaves the ones that succeeded alone, a clear of selected map indexes all
        of them. One that is waiting already (cleared by another shard's repair) is left as it is.
        Shards repairing at once may collide in the database: the hook tries a 5xx answer again."""
        ended = [
            task_id
            for task_id in self.week_end_tasks
            if hook.task_instance_state(dag_id, run_id, task_id) in WEEK_END_DONE
        ]
        if ended:
            hook.clear_task_instances(
                dag_id,
                run_id,
                only_failed=False,
                include_downstream=False,
                task_ids=ended,
                reset_dag_runs=False,
            )

    def execute_complete(self, context: Context, event: tuple[str, dict[str, Any]]) -> dict[str, Any]:
        from avsim.ledger.store import Ledger
        from avsim.verdict import shard_verdict

        _, data = event
        run_id = (data.get("run_ids") or [str(self.trigger_run_id)])[0]
        if data.get(run_id) in self.failed_states:
            from airflow.sdk.exceptions import AirflowFailException

            from avsim.operators.exceptions import ShardNeedsAttention

            summary = Ledger(self.descriptor.layout).shard_summary(int(self.shard))
            if summary is None:
                raise AirflowFailException(
                    f"shard run {run_id} failed before it wrote its summary: open it (Triggered DAG) to see "
                    "which task failed, then clear this task to repair it in place"
                )
            verdict = shard_verdict(summary)
            if not verdict.needs_attention:
                raise AirflowFailException(
                    f"shard run {run_id} failed though its summary names no case that needs attention "
                    f"({verdict.line()}): open it to see which task failed, then clear this task"
                )
            self.attention_label = verdict.label
            raise ShardNeedsAttention(f"{verdict.line()} (shard run {run_id})")
        super().execute_complete(context, event)  # raises for any other state it does not allow
        return self._ended(run_id, data.get(run_id))

    def _ended(self, run_id: str, state: Any) -> dict[str, Any]:
        """The task's result once its shard run ended in an allowed state: the shard's counts."""
        from avsim.ledger.store import Ledger

        summary = Ledger(self.descriptor.layout).shard_summary(int(self.shard))
        counts = dict(summary.counts) if summary is not None else {}
        self.log.info("shard %s finished (%s): %s", self.shard, state, counts)
        return {"shard": int(self.shard), "run_id": run_id, "counts": counts}
