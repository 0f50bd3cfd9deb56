"""The arguments of a phase task, from the plan: one builder for the case phases and the run-level phases.

Pool, slots, GPUs, queue, priority (the path part under the run class's strategy, :mod:`avsim.priority`)
and retries; the operator of the configured backend and what it takes besides.
"""

from __future__ import annotations

from typing import Any

from avsim.manifest.models import RunClass
from avsim.operators.retry import PhaseRetryPolicy
from avsim.phases.policy import Role, task_retries
from avsim.plan.model import PhasePlan, RunPhasePlan
from avsim.retries import retry_kwargs
from avsim.settings import AvsimSettings


def phase_operator_class(settings: AvsimSettings) -> type[Any]:
    """The operator of the configured backend (``[avsim] backend``); both take the same phase arguments."""
    if settings.backend == "kubernetes":
        from avsim.operators.kubernetes import KubernetesPhaseOperator

        return KubernetesPhaseOperator
    from avsim.operators.phase import LocalPhaseOperator

    return LocalPhaseOperator


def backend_kwargs(settings: AvsimSettings) -> dict[str, Any]:
    """What the configured backend's operator takes besides the phase arguments: the Kubernetes
    operator gets the cluster settings already read, instead of reading ``[avsim]`` again for each of
    the DAG's phase tasks (at every parse, in every task process)."""
    return {"kube": settings.kubernetes} if settings.backend == "kubernetes" else {}


def phase_task_kwargs(phase: PhasePlan, role: Role, run_class: RunClass) -> dict[str, Any]:
    """The arguments of a case phase's task: a spot task, its on-demand twin, or a regular one.

    ``retries`` covers every failure the class budgets allow (:func:`avsim.phases.policy.task_retries`);
    the phase's lifecycle fails fast when one class's budget is used up, and :class:`PhaseRetryPolicy`
    gives each retry its class's delay. The task's ``retry_delay`` (the infrastructure delay) is what
    Airflow uses when the scheduler itself retries a try whose worker was lost.
    """
    retries = task_retries(role, phase.retries, phase.preemption_retries, phase.on_demand_after_preemptions)
    pool = phase.on_demand_pool if role is Role.ON_DEMAND else phase.pool
    return _task_kwargs(phase, pool, retries, role, run_class)


def run_phase_task_kwargs(phase: RunPhasePlan, run_class: RunClass) -> dict[str, Any]:
    """The arguments of a run-level phase's task: one regular task, its retries both budgets together."""
    return _task_kwargs(phase, phase.pool, phase.retries, Role.REGULAR, run_class)


def _task_kwargs(
    phase: PhasePlan | RunPhasePlan, pool: str, retries: int, role: Role, run_class: RunClass
) -> dict[str, Any]:
    from avsim.priority import strategy_for

    return {
        "pool": pool,
        "pool_slots": phase.pool_slots,
        "gpus": phase.gpus,
        "priority_weight": phase.path_weight,
        "weight_rule": strategy_for(run_class),
        "retry_policy": PhaseRetryPolicy(),
        "role": role,
        # GPU and CPU phases on their own executor queues (Celery: machines of their kind); "" keeps the
        # default queue. Executors without queues ignore it.
        **({"queue": phase.queue} if phase.queue else {}),
        **retry_kwargs(
            retries, phase.retry_delay_seconds, phase.retry_backoff, phase.max_retry_delay_seconds
        ),
    }
