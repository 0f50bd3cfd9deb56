"""Plan -> the shard DAG: one mapped task group per graph family, one task per phase.

``<prefix>_shard`` is triggered only by the parent run: ``load_shard`` checks the conf, whose run
descriptor the phases render (:data:`avsim.contracts.RUN_FROM_SHARD_CONF`); ``cases_<family>`` hands
each family group its cases; ``summarize`` writes the shard's summary, whatever happened. It has its
own module and DAG file, so a phase task parses only what its DAG needs
(docs/design.md, "The shape of a week: a parent run feeding shard runs").
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import DAG, BaseOperator, get_current_context, task, task_group

from avsim.contracts import RUN_FROM_SHARD_CONF
from avsim.dagbuild import tasks
from avsim.dagbuild.phase_args import backend_kwargs, phase_operator_class, phase_task_kwargs
from avsim.errors import ManifestError
from avsim.manifest.models import RunClass
from avsim.phases.policy import Role
from avsim.plan.admission import MAX_SHARD_RUNS
from avsim.plan.model import FamilyPlan, WeeklyPlan
from avsim.retries import control_retries
from avsim.settings import AvsimSettings

START_DATE = dt.datetime(2026, 1, 5, tzinfo=dt.UTC)  # a Monday


def _family_group(
    family: FamilyPlan,
    run: Any,
    operator: type[BaseOperator],
    run_class: RunClass,
    reuse_outputs: bool,
    backend: dict[str, Any],
) -> Any:
    @task_group(group_id=family.group_id, tooltip=f"graph {family.name}: one map index per case")
    def group(case: Any) -> None:
        # phase name -> the tasks that may produce its result: one, or a GPU phase's spot task and twin
        made_by: dict[str, list[BaseOperator]] = {}
        for phase in family.phases:
            ups = {up: [t.task_id for t in made_by[up]] for up in phase.upstream}
            common: dict[str, Any] = {
                "phase": phase.name,
                "upstream_phases": ups,
                "reuse_outputs": reuse_outputs,
                "map_index_template": "{{ task.case.case_id }}",
                **backend,
            }
            # After a GPU phase, wait on both its tasks with none_failed: one of them ends skipped, a
            # failure of either is not done. (A rule that needs "one success", such as
            # none_failed_min_one_success, would be judged on the group's not-yet-expanded task
            # instance for every case at once: one case's failure would fail the phase for the shard.)
            after_pair = any(len(made_by[up]) > 1 for up in phase.upstream)
            role = Role.SPOT if phase.on_demand_fallback else Role.REGULAR
            main = operator(
                task_id=phase.name,
                case=case,
                run=run,
                trigger_rule="none_failed" if after_pair else "all_success",
                **common,
                **phase_task_kwargs(phase, role, run_class),
            )
            for up in phase.upstream:
                made_by[up] >> main
            made_by[phase.name] = [main]
            if phase.on_demand_fallback:
                # The twin's only upstream is its spot task (it takes the case and the run from the spot
                # task's hand-over XCom, not from the group's inputs), so all_skipped means exactly
                # "the spot task handed over": otherwise it ends skipped without running.
                twin = operator(
                    task_id=phase.on_demand_task,
                    case=None,
                    run=None,
                    trigger_rule="all_skipped",
                    **common,
                    **phase_task_kwargs(phase, Role.ON_DEMAND, run_class),
                )
                main >> twin
                made_by[phase.name].append(twin)

    return group


def _shard_input(plan: WeeklyPlan) -> dict[str, Any]:
    """The shard run's conf, checked; a bad conf fails the task without retry."""
    try:
        return tasks.load_shard(dict(get_current_context()["dag_run"].conf or {}), plan)
    except ManifestError as exc:
        from avsim.operators.exceptions import RunRejected

        raise RunRejected(str(exc)) from None


def build_shard_dag(plan: WeeklyPlan, settings: AvsimSettings, dag_id: str) -> DAG:
    from avsim.priority import ControlTask, control_priority

    operator = phase_operator_class(settings)
    bookkeeping = control_priority(ControlTask.BOOKKEEPING, plan.run_class)
    with DAG(
        dag_id=dag_id,
        schedule=None,
        start_date=START_DATE,
        catchup=False,
        # No cap of its own: the weekly run admits its shard runs (by cases in flight, or W of them
        # with the window), and one held by a straggler must not keep an admitted one queued. Every
        # shard run of the two weeks active at once (WEEKS_AT_ONCE), their canaries included.
        max_active_runs=2 * (max(MAX_SHARD_RUNS, plan.max_active_shards) + 1),
        # Per shard run: every case may have a phase running (or two, on parallel branches).
        max_active_tasks=max(16, 2 * plan.shard_size),
        is_paused_upon_creation=False,
        tags=["avsim", "avsim-shard"],
        doc_md="A shard of an avsim weekly run: started by the weekly DAG, one mapped group per graph family.",
    ) as dag:

        @task(task_id="load_shard", **control_retries(), **bookkeeping)
        def load_shard() -> dict[str, Any]:
            """Check the shard run's conf before any phase reads its run descriptor; returns the descriptor."""
            return _shard_input(plan)["run"]

        @task(task_id="summarize", trigger_rule="all_done", **control_retries(), **bookkeeping)
        def summarize() -> dict[str, Any]:
            return tasks.summarize(dict(get_current_context()["dag_run"].conf or {}), plan)

        run = load_shard()
        done = summarize()
        for family in plan.families:
            # Mapping needs a task's return value, so each family's case list is its own small task.
            @task(task_id=f"cases_{family.name}", **control_retries(), **bookkeeping)
            def family_cases(name: str = family.name) -> list[dict[str, Any]]:
                return list(_shard_input(plan)[f"cases_{name}"])

            cases = family_cases()
            run >> cases
            # The phases render the run descriptor from the shard run's conf that load_shard checked.
            groups = _family_group(
                family,
                RUN_FROM_SHARD_CONF,
                operator,
                plan.run_class,
                settings.reuse_outputs,
                backend_kwargs(settings),
            ).expand(case=cases)
            groups >> done
    return dag
