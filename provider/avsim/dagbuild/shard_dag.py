"""Plan -> the shard DAG: one mapped task group per graph family, one task per phase.

``<prefix>_shard`` is triggered only by the parent weekly run (at most ``max_active_shards``
runs at once): ``load_shard`` checks the conf and returns the run descriptor; ``cases_<family>``
hands each family group its cases; one mapped task group per family runs one task per phase
per case; ``summarize`` writes the shard's summary to the ledger, whatever happened.

It lives in its own module (and DAG file) so a phase task, which parses only its own DAG's
file, does not import what the parent DAG needs.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import DAG, get_current_context, task, task_group

from avsim.dagbuild import tasks
from avsim.errors import ManifestError
from avsim.operators.phase import AvsimPhaseOperator, LocalPhaseOperator
from avsim.plan.model import FamilyPlan, WeeklyPlan
from avsim.settings import AvsimSettings

START_DATE = dt.datetime(2026, 1, 5, tzinfo=dt.UTC)  # a Monday


def phase_operator_class(settings: AvsimSettings) -> type[AvsimPhaseOperator]:
    if settings.backend == "kubernetes":
        raise NotImplementedError(
            "the kubernetes backend is not available in this version; use backend = local"
        )
    return LocalPhaseOperator


def retry_kwargs(retries: int, delay: float, backoff: float, max_delay: float) -> dict[str, Any]:
    return {
        "retries": retries,
        "retry_delay": dt.timedelta(seconds=delay),
        "retry_exponential_backoff": backoff if backoff > 1 else 0,
        "max_retry_delay": dt.timedelta(seconds=max_delay),
    }


def _family_group(family: FamilyPlan, run: Any, operator: type[AvsimPhaseOperator]) -> Any:
    @task_group(group_id=family.group_id, tooltip=f"graph {family.name}: one map index per case")
    def group(case: Any) -> None:
        created: dict[str, AvsimPhaseOperator] = {}
        for phase in family.phases:
            created[phase.name] = operator(
                task_id=phase.name,
                phase=phase.name,
                case=case,
                run=run,
                upstream_phases={up: f"{family.group_id}.{up}" for up in phase.upstream},
                pool=phase.pool,
                pool_slots=phase.pool_slots,
                priority_weight=phase.priority_weight,
                weight_rule="absolute",
                map_index_template="{{ task.case.case_id }}",
                **retry_kwargs(
                    phase.retries,
                    phase.retry_delay_seconds,
                    phase.retry_backoff,
                    phase.max_retry_delay_seconds,
                ),
            )
        for phase in family.phases:
            for up in phase.upstream:
                created[up] >> created[phase.name]

    return group


def _shard_input(plan: WeeklyPlan) -> dict[str, Any]:
    """The shard run's conf, checked; a bad conf fails the task without retry."""
    try:
        return tasks.load_shard(dict(get_current_context()["dag_run"].conf or {}), plan)
    except ManifestError as exc:
        from avsim.operators.exceptions import RunRejected

        raise RunRejected(str(exc)) from None


def build_shard_dag(plan: WeeklyPlan, settings: AvsimSettings, dag_id: str) -> DAG:
    operator = phase_operator_class(settings)
    with DAG(
        dag_id=dag_id,
        schedule=None,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=plan.max_active_shards,
        max_active_tasks=max(16, plan.max_active_shards * 16),
        is_paused_upon_creation=False,
        tags=["avsim", "avsim-shard"],
        doc_md="A shard of an avsim weekly run: started by the weekly DAG, one mapped group per graph family.",
    ) as dag:

        @task(task_id="load_shard", retries=2, priority_weight=plan.base_priority * 2)
        def load_shard() -> dict[str, Any]:
            """Check the shard run's conf; its return value is the run descriptor phases read."""
            return _shard_input(plan)["run"]

        @task(task_id="summarize", trigger_rule="all_done", retries=2, priority_weight=plan.base_priority * 2)
        def summarize() -> dict[str, Any]:
            return tasks.summarize(dict(get_current_context()["dag_run"].conf or {}), plan)

        run = load_shard()
        done = summarize()
        for family in plan.families:
            # Mapping needs a task's return value, so each family's case list is its own small task.
            @task(task_id=f"cases_{family.name}", retries=2, priority_weight=plan.base_priority * 2)
            def family_cases(name: str = family.name) -> list[dict[str, Any]]:
                return list(_shard_input(plan)[f"cases_{name}"])

            cases = family_cases()
            run >> cases
            groups = _family_group(family, run, operator).expand(case=cases)
            groups >> done
    return dag
