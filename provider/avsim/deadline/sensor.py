"""The deadline tracker: a sensor beside the shards in the weekly run, deferred in the triggerer.

From ``prepare``'s end to the end of the week's shard runs, its trigger re-estimates the finish and
records it; when acting is configured and the run will be late, the sensor raises capacity in a worker
(:mod:`avsim.deadline.actions`) and defers again (with ``deferrable=False`` it pokes instead).
:func:`deadline_tracker` builds it for the weekly DAG. docs/design.md, "The deadline" (*The tracker*).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue

from avsim.deadline.actions import ActionResult, ScalingPolicy, act
from avsim.deadline.tracking import (
    WINDOW_TASKS,
    PhaseTasks,
    TrackedRun,
    load_planned_work,
    phase_tasks,
    track_once,
)
from avsim.deadline.trigger import DeadlineTrackerTrigger
from avsim.errors import AvsimError
from avsim.hooks.airflow_api import AirflowApiHook
from avsim.plan.week_counts import ExecutionApiCounts
from avsim.retries import control_retries

if TYPE_CHECKING:
    from airflow.sdk import Context


class DeadlineTrackerError(AvsimError):
    """The deadline tracker stopped (its trigger reported an error)."""


def actions_uri(run: TrackedRun, stamp: str) -> str:
    from avsim.artifacts import safe_key

    return f"{run.layout.deadline_dir}/actions/{safe_key(stamp)}.json"


#: What the documents say when acting is not configured.
OFF = "record only: no scaling configured ([avsim] deadline_*)"


def summarize(gpus_needed: int, results: list[ActionResult]) -> str:
    """One line for the documents and the UI: what the last action did."""
    if not results:
        return f"{gpus_needed} GPUs needed: no action configured"
    parts = []
    for r in results:
        if r.outcome == "raised":
            parts.append(f"{r.target} {r.before} -> {r.after}")
        else:
            parts.append(f"{r.target} {r.outcome} ({r.detail})")
    return f"{gpus_needed} GPUs needed: " + "; ".join(parts)


class DeadlineTrackerSensor(BaseSensorOperator):
    """Tracks the weekly run's finish estimate against its deadline until the shard runs end.

    :param run: the run descriptor ``prepare`` pushes (XCom ``run``; templated).
    :param shard_dag_id: the shard DAG.
    :param phases: the shard DAG's phase tasks (:func:`~avsim.deadline.tracking.phase_tasks` of the plan).
    :param interval_seconds: time between re-estimates.
    :param policy: :class:`ScalingPolicy` as a dict; None or nothing configured: record only.
    :param window_task_ids: the parent's tasks that start and wait for the shard runs.
    :param deferrable: wait in the triggerer (default) or poke from a worker.
    """

    template_fields: Sequence[str] = ("run",)
    ui_color = "#fbe3d6"

    def __init__(
        self,
        *,
        run: Any,
        shard_dag_id: str,
        phases: dict[str, dict[str, Any]],
        interval_seconds: float = 300.0,
        policy: dict[str, Any] | None = None,
        window_task_ids: Sequence[str] = WINDOW_TASKS,
        deferrable: bool = True,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("poke_interval", interval_seconds)
        kwargs.setdefault("mode", "reschedule")
        kwargs.setdefault("timeout", dt.timedelta(days=14).total_seconds())
        super().__init__(**kwargs)
        self.run = run
        self.shard_dag_id = shard_dag_id
        self.phases = {k: dict(v) for k, v in phases.items()}
        self.interval_seconds = float(interval_seconds)
        self.policy = dict(policy or {})
        self.window_task_ids = list(window_task_ids)
        self.deferrable = deferrable

    @property
    def scaling(self) -> ScalingPolicy:
        return ScalingPolicy(**self.policy)

    def _tracked(self) -> TrackedRun:
        if not isinstance(self.run, dict):
            raise DeadlineTrackerError(
                f"run must be the run descriptor dict that prepare pushes (XCom 'run'), got {type(self.run).__name__}"
            )
        return TrackedRun.from_descriptor(self.run, self.shard_dag_id, self.window_task_ids)

    def _phase_tasks(self) -> dict[str, PhaseTasks]:
        return {k: PhaseTasks.from_json(k, v) for k, v in self.phases.items()}

    def _gpu_capacity(self) -> int:
        """Both GPU pools' slots when the REST API is configured (a floor for the estimate), else 0."""
        policy = self.scaling
        if not policy.api_conn_id:
            return 0
        try:
            client = AirflowApiHook(policy.api_conn_id)
            return sum(client.pool_slots(p) or 0 for p in (policy.gpu_pool, policy.on_demand_pool))
        except Exception as exc:  # the estimate still works from the GPUs in use
            self.log.warning("could not read the GPU pools' slots through the API: %s", exc)
            return 0

    def execute(self, context: Context) -> Any:
        tracked = self._tracked()
        if not self.deferrable:
            return super().execute(context)
        acting = self.scaling.enabled
        self._defer(tracked, act_above_gpus=0 if acting else None, action="none yet" if acting else OFF)

    def _defer(self, tracked: TrackedRun, act_above_gpus: int | None, action: str) -> None:
        self.defer(
            trigger=DeadlineTrackerTrigger(
                run=tracked.to_json(),
                phases=self.phases,
                interval_seconds=self.interval_seconds,
                gpu_capacity=self._gpu_capacity(),
                act_above_gpus=act_above_gpus,
                action=action,
            ),
            method_name="execute_complete",
            # Every deferral ends: a week is never tracked past the sensor's timeout per deferral.
            timeout=dt.timedelta(seconds=float(self.timeout)),
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        status = event.get("status")
        tracked = self._tracked()
        if status == "done":
            est = event.get("estimate") or {}
            self.log.info("the week's shard runs are finished: %s", est.get("reason"))
            return est
        if status == "late":
            needed = int(event["gpus_needed"])
            results = self._act(tracked, needed, event.get("estimate") or {})
            self._defer(tracked, act_above_gpus=needed, action=summarize(needed, results))
            return None
        raise DeadlineTrackerError(
            f"deadline tracker of {tracked.run_key} stopped: {event.get('message', event)}"
        )

    def _act(self, tracked: TrackedRun, gpus_needed: int, estimate: dict[str, Any]) -> list[ActionResult]:
        from avsim.storage import write_json

        results = act(self.scaling, gpus_needed)
        now = dt.datetime.now(dt.UTC)
        write_json(
            actions_uri(tracked, now.strftime("%Y%m%dT%H%M%S.%fZ")),
            {
                "at": now.isoformat(),
                "gpus_needed": gpus_needed,
                "estimate": {
                    k: estimate.get(k)
                    for k in ("estimated_finish", "deadline", "seconds_late", "gpus_in_use", "reason")
                },
                "results": [r.to_json() for r in results],
            },
        )
        return results

    def poke(self, context: Context) -> PokeReturnValue:
        tracked = self._tracked()
        phases = self._phase_tasks()
        planned = load_planned_work(tracked, phases)
        action = OFF if not self.scaling.enabled else "see deadline/actions/"
        found = track_once(
            ExecutionApiCounts(), tracked, planned, phases, gpu_capacity=self._gpu_capacity(), action=action
        )
        if found.done:
            return PokeReturnValue(is_done=True, xcom_value=found.document)
        est = found.estimate
        if self.scaling.enabled and est.late and est.gpus_needed:
            self._act(tracked, est.gpus_needed, found.document)
        return PokeReturnValue(is_done=False)


def deadline_tracker(
    plan: Any,
    settings: Any,
    *,
    run: Any,
    shard_dag_id: str,
    task_id: str = "deadline_tracker",
    **kwargs: Any,
) -> DeadlineTrackerSensor:
    """The weekly DAG's deadline tracker, configured from the plan and ``[avsim] deadline_*``.

    Call it inside the weekly DAG with ``run`` = the XCom ``run`` of ``prepare``; set it after
    ``prepare`` and before ``report``.
    """
    from avsim.priority import ControlTask, control_priority

    d = settings.deadline
    policy = ScalingPolicy(
        api_conn_id=d.api_conn_id,
        gpu_pool=settings.gpu_spot_pool,
        on_demand_pool=settings.gpu_on_demand_pool,
        max_gpu_slots=d.max_gpu_slots,
        aws_conn_id=d.aws_conn_id,
        eks_cluster=d.eks_cluster,
        eks_nodegroup=d.eks_nodegroup,
        eks_max_nodes=d.eks_max_nodes,
        gpus_per_node=d.gpus_per_node,
    )
    for key, value in control_retries().items():
        kwargs.setdefault(key, value)
    for key, value in control_priority(ControlTask.BOOKKEEPING, plan.run_class).items():
        kwargs.setdefault(key, value)
    return DeadlineTrackerSensor(
        task_id=task_id,
        run=run,
        shard_dag_id=shard_dag_id,
        phases=phase_tasks(plan),
        interval_seconds=d.interval_seconds,
        policy=policy.to_json(),
        **kwargs,
    )
