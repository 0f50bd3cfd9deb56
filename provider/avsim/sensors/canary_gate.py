"""The canary gate: the sensor that releases the rest of the week only if the canary looks healthy.

Deferred on :class:`avsim.triggers.canary.CanaryGateTrigger`, it succeeds when the canary finished with
its crash and bad-build rate within ``run.canary.max_failure_rate``, and fails (no retry, naming the
build and the counts) as soon as the rate passes it. A gate cleared to repair a stopped week judges the
canary's new round (:func:`avsim.plan.canary.round_since`). docs/design.md, "A bad build".
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator

from avsim.contracts import RunDescriptor
from avsim.contracts.week import canary_plan
from avsim.operators.exceptions import CanaryGateFailed
from avsim.plan.canary import PASSED, STALLED, round_since

if TYPE_CHECKING:
    from airflow.sdk import Context


#: The longest a canary gate waits for its canary (Airflow's sensors default to 7 days).
GATE_TIMEOUT = dt.timedelta(hours=24)


class CanaryGateSensor(BaseSensorOperator):
    """:param run: the run descriptor (XComArg of ``prepare``); :param canary: the canary plan
    (XComArg ``canary`` of ``prepare``: a :class:`avsim.contracts.week.CanaryPlan` as JSON, or empty
    for a week without a canary stage)."""

    template_fields: Sequence[str] = ("run", "canary")
    ui_color = "#f3ecd8"

    def __init__(
        self,
        *,
        run: Any,
        canary: Any,
        poll_interval: float = 30.0,
        shard_dag_id: str = "",
        canary_task_id: str = "canary",
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("mode", "reschedule")
        # A backstop only: a gate that can never decide fails at once (its trigger's ``stalled``).
        kwargs.setdefault("timeout", GATE_TIMEOUT.total_seconds())
        super().__init__(**kwargs)
        self.run = run
        self.canary = canary
        self.poll_interval = poll_interval
        #: The shard DAG and the parent's task that run the canary: a cleared gate reads their states.
        self.shard_dag_id = shard_dag_id
        self.canary_task_id = canary_task_id

    def execute(self, context: Context) -> Any:
        plan = canary_plan(self.canary)
        if plan is None:
            self.log.info("this week has no canary stage (too few cases): the gate is open")
            return {"state": PASSED, "cases": 0, "message": "no canary stage"}
        from avsim.triggers.canary import CanaryGateTrigger

        run = RunDescriptor.model_validate(self.run)
        self.defer(
            trigger=CanaryGateTrigger(
                plan=plan.to_json(),
                poll_interval=self.poll_interval,
                since=self.round_since(context, run, plan.shard),
                canary_task={
                    "dag_id": context["ti"].dag_id,
                    "run_id": context["dag_run"].run_id,
                    "task_id": self.canary_task_id,
                },
            ),
            method_name="execute_complete",
            # Every deferral ends: a canary that never finishes fails the gate after the sensor's timeout.
            timeout=dt.timedelta(seconds=float(self.timeout)),
        )

    def round_since(self, context: Context, run: RunDescriptor, canary_shard: int) -> str:
        """When this gate's round began ("" in the week's first round: every attempt is evidence)."""
        from avsim.artifacts import CANARY_RUN_SUFFIX
        from avsim.ledger.store import Ledger

        ti = context["ti"]
        max_tries = int(getattr(ti, "max_tries", 0) or 0)
        gate_round = max(1, max_tries - int(self.retries or 0) + 1)
        repairs = [r for r in Ledger(run.layout).repairs() if int(r.get("shard", -1)) == canary_shard]
        last_repair_at = max((str(r.get("at") or "") for r in repairs), default="")
        if gate_round <= 1 and not last_repair_at:
            return ""  # the week's first round: nothing to read
        from avsim import airflow_internals

        dag_run = context["dag_run"]
        run_state: str | None = None
        if self.shard_dag_id:
            canary_run = f"{dag_run.run_id}{CANARY_RUN_SUFFIX}"
            if ti.get_dr_count(dag_id=self.shard_dag_id, run_ids=[canary_run]):
                found = ti.get_dagrun_state(dag_id=self.shard_dag_id, run_id=canary_run)
                run_state = str(getattr(found, "value", found))  # Airflow 3.3.2 answers a DagRunState
        task_state = airflow_internals.task_instance_state(ti, ti.dag_id, dag_run.run_id, self.canary_task_id)
        since = round_since(
            gate_try_round=gate_round,
            canary_run_state=run_state,
            canary_task_state=task_state,
            last_repair_at=last_repair_at,
            now=dt.datetime.now(dt.UTC).isoformat(),
        )
        self.log.info(
            "canary gate round from try %d: canary shard run %s, task %s, last repaired %s: evidence since %s",
            gate_round,
            run_state,
            task_state,
            last_repair_at or "never",
            since or "the week's start",
        )
        return since

    def poke(self, context: Context) -> bool:  # pragma: no cover - the gate always defers
        raise NotImplementedError("the canary gate waits in the triggerer")

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        from avsim import metrics

        status = event.get("status")
        if status == "error":
            # The trigger could not read the ledger: a retry of this task looks again.
            from airflow.sdk.exceptions import AirflowException

            raise AirflowException(f"canary gate could not decide: {event.get('message')}")
        if status == STALLED:
            from avsim.operators.exceptions import CanaryGateStalled

            raise CanaryGateStalled(str(event.get("message")))
        passed = status == PASSED
        metrics.canary_decision(RunDescriptor.model_validate(self.run).build_id, passed)
        self.log.info("%s", event.get("message"))
        if not passed:
            raise CanaryGateFailed(str(event.get("message")))
        return event
