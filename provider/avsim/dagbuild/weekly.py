"""Plan -> Airflow DAGs: the parent weekly DAG and the shard DAG it feeds.

Parent ``<prefix>`` (scheduled weekly): ``prepare`` snapshots the manifest and cuts the week
into shards; the mapped group ``shards`` starts one shard run per shard and waits for it
(deferred); the run-level phases and the ``report`` run after every shard.

Shard ``<prefix>_shard`` (triggered only by the parent, at most ``max_active_shards``
running at once): ``load_shard`` hands each graph family its cases; one mapped task group
per family runs one task per phase per case; ``summarize`` writes the shard's summary.

Only the plan (the graph catalog) shapes these DAGs; no case is read at parse time.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import DAG, Param, TaskGroup, XComArg, get_current_context, task, task_group

from avsim.artifacts import RUN_LEVEL_CASE
from avsim.dagbuild import tasks
from avsim.errors import ManifestError
from avsim.operators.phase import AvsimPhaseOperator, LocalPhaseOperator
from avsim.operators.shard import ShardRunOperator
from avsim.plan.model import FamilyPlan, WeeklyPlan
from avsim.sensors.shards import ShardRunSensor
from avsim.settings import AvsimSettings

START_DATE = dt.datetime(2026, 1, 5, tzinfo=dt.UTC)  # a Monday
WEEKLY_SCHEDULE = "0 6 * * 1"  # Mondays 06:00 UTC
PARENT_DOC = """
### avsim weekly regression run

Trigger with **manifest** set to a path or URI of a weekly manifest (YAML or JSON); the
scheduled run uses `[avsim] default_manifest`. The `shards` group holds one map index per
shard run (open *Triggered DAG* on a `start` task to see its cases); failed phases are
cleared in the shard run, then `report` here is cleared to refresh the weekly report.
"""


def phase_operator_class(settings: AvsimSettings) -> type[AvsimPhaseOperator]:
    if settings.backend == "kubernetes":
        raise NotImplementedError(
            "the kubernetes backend is not available in this version; use backend = local"
        )
    return LocalPhaseOperator


def _retry_kwargs(retries: int, delay: float, backoff: float, max_delay: float) -> dict[str, Any]:
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
                **_retry_kwargs(
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
            return tasks.load_shard(dict(get_current_context()["dag_run"].conf or {}), plan)["run"]

        @task(task_id="summarize", trigger_rule="all_done", retries=2, priority_weight=plan.base_priority * 2)
        def summarize() -> dict[str, Any]:
            return tasks.summarize(dict(get_current_context()["dag_run"].conf or {}), plan)

        run = load_shard()
        done = summarize()
        for family in plan.families:
            # Mapping needs a task's return value, so each family's case list is its own small task.
            @task(task_id=f"cases_{family.name}", retries=2, priority_weight=plan.base_priority * 2)
            def family_cases(name: str = family.name) -> list[dict[str, Any]]:
                return tasks.load_shard(dict(get_current_context()["dag_run"].conf or {}), plan)[
                    f"cases_{name}"
                ]

            cases = family_cases()
            run >> cases
            groups = _family_group(family, run, operator).expand(case=cases)
            groups >> done
    return dag


def build_parent_dag(plan: WeeklyPlan, settings: AvsimSettings, dag_id: str, shard_dag_id: str) -> DAG:
    operator = phase_operator_class(settings)
    with DAG(
        dag_id=dag_id,
        schedule=WEEKLY_SCHEDULE,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        tags=["avsim", "avsim-weekly"],
        doc_md=PARENT_DOC,
        params={
            "manifest": Param(
                settings.default_manifest,
                type="string",
                title="Manifest",
                description="Path or URI (file://, s3://conn@bucket/key) of the weekly manifest, YAML or JSON.",
            ),
        },
    ) as dag:

        @task(task_id="prepare", retries=1, priority_weight=plan.base_priority * 2)
        def prepare() -> list[dict[str, Any]]:
            """Returns the shard runs to start; pushes the run descriptor ("run") and shard inputs."""
            ctx = get_current_context()
            dag_run = ctx["dag_run"]
            try:
                source = tasks.manifest_source(
                    dict(ctx["params"]), settings, getattr(dag_run, "logical_date", None)
                )
                prepared = tasks.prepare_week(
                    source=source,
                    plan=plan,
                    settings=settings,
                    dag_id=dag_id,
                    run_id=dag_run.run_id,
                    shard_dag_id=shard_dag_id,
                )
            except ManifestError as exc:
                from avsim.operators.exceptions import RunRejected

                raise RunRejected(str(exc)) from None
            ctx["ti"].xcom_push(key="run", value=prepared["run"])
            ctx["ti"].xcom_push(key="shard_inputs", value=prepared["shard_inputs"])
            return list(prepared["shards"])

        shard_specs: Any = prepare()
        run_xcom: Any = XComArg(shard_specs.operator, key="run")
        shard_inputs: Any = XComArg(shard_specs.operator, key="shard_inputs")

        @task_group(group_id="shards", tooltip="one map index per shard run")
        def shard_group(shard: Any, shard_run_id: Any, conf: Any) -> None:
            start = ShardRunOperator(
                task_id="start",
                trigger_dag_id=shard_dag_id,
                trigger_run_id=shard_run_id,
                conf=conf,
                priority_weight=plan.base_priority * 2,
            )
            wait = ShardRunSensor(
                task_id="wait",
                shard_dag_id=shard_dag_id,
                shard_run_id=shard_run_id,
                shard=shard,
                run=run_xcom,
                poll_interval=settings.shard_poll_seconds,
                trigger_rule="none_failed",
                priority_weight=plan.base_priority * 2,
            )
            start >> wait

        shard_runs = shard_group.expand_kwargs(shard_specs)

        run_level = TaskGroup(group_id="run_phases", tooltip="run-level phases, after every shard")
        created: dict[str, AvsimPhaseOperator] = {}
        for rp in plan.run_phases:
            created[rp.name] = operator(
                task_id=rp.name,
                task_group=run_level,
                phase=rp.name,
                case={"case_id": RUN_LEVEL_CASE, "seed": 0},
                run=run_xcom,
                inputs=shard_inputs,
                pool=rp.pool,
                pool_slots=rp.pool_slots,
                priority_weight=rp.priority_weight,
                weight_rule="absolute",
                # After every shard, whatever their outcome, as long as the week was prepared.
                trigger_rule="all_done_min_one_success",
                **_retry_kwargs(rp.retries, rp.retry_delay_seconds, 2.0, 3600),
            )
        for rp in plan.run_phases:
            if rp.upstream:
                for up in rp.upstream:
                    created[up] >> created[rp.name]
            else:
                shard_runs >> created[rp.name]

        @task(task_id="report", trigger_rule="all_done_min_one_success", retries=2, priority_weight=plan.base_priority)
        def report(run: dict[str, Any]) -> dict[str, str]:
            return tasks.write_week_report(run, [rp.name for rp in plan.run_phases])

        report_task = report(run_xcom)
        shard_runs >> report_task
        for op in created.values():
            op >> report_task
    return dag


def build_weekly_dags(
    plan: WeeklyPlan, settings: AvsimSettings, dag_id: str = "avsim_weekly"
) -> dict[str, DAG]:
    shard_dag_id = f"{dag_id}_shard"
    return {
        dag_id: build_parent_dag(plan, settings, dag_id, shard_dag_id),
        shard_dag_id: build_shard_dag(plan, settings, shard_dag_id),
    }
