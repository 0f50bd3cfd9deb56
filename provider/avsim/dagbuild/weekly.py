"""Plan -> the parent weekly DAG, which feeds the shard DAG (:mod:`avsim.dagbuild.shard_dag`).

``prepare`` snapshots the manifest and cuts the week into shard runs; ``canary`` and ``canary_gate``
run and judge the canary first; the mapped ``shard_runs`` group (``shard_start`` admits and starts,
``shards`` waits) runs the rest; ``close_week``, the run-level phases, ``triage_start`` and ``triage``,
and ``report`` end the week. Only the plan shapes these DAGs; no case is read at parse time
(docs/design.md, "The shape of a week: a parent run feeding shard runs").
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from airflow.sdk import DAG, Param, TaskGroup, XComArg, get_current_context, task, task_group

from avsim.artifacts import CANARY_RUN_SUFFIX, RUN_LEVEL_CASE
from avsim.contracts import PREPARE_TASK_ID, RUN_XCOM_KEY
from avsim.dagbuild import tasks, week_end
from avsim.dagbuild.phase_args import backend_kwargs, phase_operator_class, run_phase_task_kwargs
from avsim.dagbuild.prepare import prepare_week
from avsim.dagbuild.shard_dag import START_DATE
from avsim.deadline.alert import deadline_alert
from avsim.deadline.sensor import deadline_tracker
from avsim.errors import ManifestError
from avsim.manifest.models import RunClass
from avsim.manifest.source import manifest_source
from avsim.operators.phase import AvsimPhaseOperator
from avsim.operators.shard import ShardRunOperator
from avsim.operators.shard_start import SHARD_START_TASK, SHARD_STARTS_AT_ONCE, ShardStartOperator
from avsim.plan.model import WeeklyPlan
from avsim.plan.shards import CANARY_SHARD
from avsim.plan.week_counts import case_end_tasks, cpu_end_tasks
from avsim.priority import ControlTask, control_priority
from avsim.retries import control_retries
from avsim.sensors.canary_gate import CanaryGateSensor
from avsim.settings import AvsimSettings

WEEKLY_SCHEDULE = "0 6 * * 1"  # Mondays 06:00 UTC
#: Weekly runs active at once: this week's, and a repair (a clear) of an earlier week beside it, which
#: neither waits for this week nor delays the next Monday's run; an earlier week's phases rank below
#: this week's (avsim.priority). The shard DAG holds both weeks' windows (dagbuild/shard_dag.py).
WEEKS_AT_ONCE = 2
PARENT_DOC = """
### avsim weekly regression run

Trigger with **manifest** set to a path or URI of a weekly manifest (YAML or JSON); the
scheduled run uses `[avsim] default_manifest`. `canary` runs a small share of the cases first;
`canary_gate` fails (and nothing else starts) when too many of them crash on this build. The
mapped `shard_runs` group holds one map index per shard run: `shard_start` starts it when the
week's cases in flight leave room, `shards` waits for it (open *Triggered DAG* to see its cases). A shard whose cases need attention
(infrastructure failures after their retries, preemptions beyond the budget, bad input, a bad
build) ends **failed**, its label says how many, and so does this run, after `report`; failed
scenarios are results and stay green.

**To rerun the failed cases**: *Clear* this run with *Only failed* (or clear the failed `shards`
map indexes). Each cleared shard clears its shard run's failed phases, their downstream and its
summary, waits for them, and `report` rewrites the weekly report.
"""


ADHOC_DOC = """
### avsim ad-hoc simulation run

Trigger with **manifest** set to a manifest (YAML or JSON). Ad-hoc runs share the weekly run's
pools (GPU spot, GPU on-demand, CPU) with lower priority weights: every phase of the weekly run
outranks every ad-hoc phase in the scheduler's queue, and on Kubernetes their pods get the ad-hoc
PriorityClass. Everything else (canary, breaker, retries, report) works as in the weekly run.
"""


@dataclasses.dataclass(frozen=True)
class _Week:
    """What the parent DAG's parts share: the plan, the settings, the shard DAG and prepare's XComs."""

    plan: WeeklyPlan
    settings: AvsimSettings
    shard_dag_id: str
    run: Any  # prepare's XCom "run": the run descriptor
    #: What a repaired shard has run again after it: every task whose inputs are all the shards.
    week_end_tasks: tuple[str, ...]

    @property
    def admission_pools(self) -> tuple[str, str, str]:
        """Where admission reads the pools' slots (REST connection, GPU spot pool, CPU pool)."""
        s = self.settings
        return (s.airflow_api_conn_id, s.gpu_spot_pool, s.cpu_pool)


def _parent_dag(plan: WeeklyPlan, settings: AvsimSettings, dag_id: str) -> DAG:
    weekly = plan.run_class is RunClass.WEEKLY
    return DAG(
        dag_id=dag_id,
        # The weekly run is scheduled; ad-hoc runs are triggered by hand and never queue behind it.
        schedule=WEEKLY_SCHEDULE if weekly else None,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=WEEKS_AT_ONCE if weekly else 4,
        tags=["avsim", "avsim-weekly" if weekly else "avsim-adhoc"],
        doc_md=PARENT_DOC if weekly else ADHOC_DOC,
        # An Airflow Deadline Alert on the manifest's deadline (read from the run when it is prepared).
        deadline=deadline_alert(settings),
        params={
            "manifest": Param(
                settings.default_manifest,
                type="string",
                title="Manifest",
                description="Path or URI (file://, s3://conn@bucket/key) of the weekly manifest, YAML or JSON.",
            ),
        },
    )


def _prepare(plan: WeeklyPlan, settings: AvsimSettings, dag_id: str) -> Any:
    admission_pools = (settings.airflow_api_conn_id, settings.gpu_spot_pool, settings.cpu_pool)

    @task(
        task_id=PREPARE_TASK_ID,
        **control_retries(),
        **control_priority(ControlTask.BOOKKEEPING, plan.run_class),
    )
    def prepare() -> list[dict[str, Any]]:
        """Returns the shard runs to start; pushes the run descriptor ("run") and shard inputs."""
        from avsim.pools import api_pool_slots  # the REST client: prepare's, not the parser's

        ctx = get_current_context()
        dag_run = ctx["dag_run"]
        try:
            source = manifest_source(dict(ctx["params"]), settings, getattr(dag_run, "logical_date", None))
            prepared = prepare_week(
                source=source,
                plan=plan,
                settings=settings,
                dag_id=dag_id,
                run_id=dag_run.run_id,
                pool_slots=lambda: api_pool_slots(*admission_pools),
            )
        except ManifestError as exc:
            from avsim.operators.exceptions import RunRejected

            raise RunRejected(str(exc)) from None
        ctx["ti"].xcom_push(key=RUN_XCOM_KEY, value=prepared["run"])
        ctx["ti"].xcom_push(key="shard_inputs", value=prepared["shard_inputs"])
        ctx["ti"].xcom_push(key="canary", value=prepared["canary"])
        return list(prepared["shards"])

    return prepare()


def _canary(week: _Week, canary_xcom: Any) -> tuple[ShardRunOperator, CanaryGateSensor]:
    plan, settings = week.plan, week.settings
    canary = ShardRunOperator(
        task_id="canary",
        trigger_dag_id=week.shard_dag_id,
        trigger_run_id="{{ run_id }}" + CANARY_RUN_SUFFIX,
        conf={"run": week.run, "shard": CANARY_SHARD},
        shard=CANARY_SHARD,
        run=week.run,
        airflow_api_conn_id=settings.airflow_api_conn_id,
        week_end_tasks=week.week_end_tasks,
        poke_interval=int(settings.shard_poll_seconds),
        **control_priority(ControlTask.CANARY, plan.run_class),
        **control_retries(),
    )
    gate = CanaryGateSensor(
        task_id="canary_gate",
        run=week.run,
        canary=canary_xcom,
        poll_interval=settings.shard_poll_seconds,
        shard_dag_id=week.shard_dag_id,
        canary_task_id=canary.task_id,
        **control_priority(ControlTask.CANARY, plan.run_class),
        **control_retries(),
    )
    return canary, gate


def _shard_runs(week: _Week, shard_specs: Any) -> Any:
    """One map index per shard: shard_start[k] admits and starts shard run k, then shards[k] waits
    for it. Only the starts are capped: however long a shard run is held by its slowest case, the
    next one starts when the week has room."""
    plan, settings = week.plan, week.settings
    shard_kwargs: dict[str, Any] = {
        "trigger_dag_id": week.shard_dag_id,
        "run": week.run,
        "poke_interval": int(settings.shard_poll_seconds),
        # Below the week's phases: one waiting for its turn must not crowd them out of the query.
        **control_priority(ControlTask.SHARD_START, plan.run_class),
        **control_retries(),
        # After the try: "shard 3 · 2 need attention" in the grid when the shard failed.
        "map_index_template": "shard {{ task.shard }}{{ task.attention_label }}",
    }

    @task_group(group_id="shard_runs", prefix_group_id=False, tooltip="one map index per shard run")
    def shard_group(shard: Any, trigger_run_id: Any, conf: Any) -> None:
        start = ShardStartOperator(
            task_id=SHARD_START_TASK,
            shard=shard,
            trigger_run_id=trigger_run_id,
            conf=conf,
            max_active_tis_per_dagrun=SHARD_STARTS_AT_ONCE,
            # Admission: where a case ends, the pools its target follows, W when admitting by window.
            case_ends=[list(t) for t in case_end_tasks(plan.families)],
            cpu_case_ends=list(cpu_end_tasks(plan.families)),
            admission_pools=week.admission_pools,
            window=plan.max_active_shards,
            airflow_api_conn_id=settings.airflow_api_conn_id,
            **shard_kwargs,
        )
        wait = ShardRunOperator(
            task_id="shards",
            shard=shard,
            trigger_run_id=trigger_run_id,
            conf=conf,
            airflow_api_conn_id=settings.airflow_api_conn_id,
            week_end_tasks=week.week_end_tasks,
            **shard_kwargs,
        )
        start >> wait

    return shard_group.expand_kwargs(shard_specs)


def _run_level(week: _Week, shard_inputs: Any) -> dict[str, AvsimPhaseOperator]:
    """The run-level phases (the weekly summary), their inputs every shard's summary."""
    operator = phase_operator_class(week.settings)
    run_level = TaskGroup(group_id="run_phases", tooltip="run-level phases, after every shard")
    created: dict[str, AvsimPhaseOperator] = {}
    for rp in week.plan.run_phases:
        created[rp.name] = operator(
            task_id=rp.name,
            task_group=run_level,
            phase=rp.name,
            case={"case_id": RUN_LEVEL_CASE, "seed": 0},
            run=week.run,
            inputs=shard_inputs,
            reuse_outputs=False,
            # After every shard, whatever their outcome, as long as the week was prepared.
            trigger_rule="all_done_min_one_success",
            # Under the phases' strategy: an earlier week's summary ranks below this week's phases.
            **run_phase_task_kwargs(rp, week.plan.run_class),
            **backend_kwargs(week.settings),
        )
    for rp in week.plan.run_phases:
        for up in rp.upstream:
            created[up] >> created[rp.name]
    return created


def _week_end(week: _Week) -> tuple[Any, Any]:
    """``close_week`` and ``report``: after every shard whatever their outcome, as long as the week was
    prepared (a rejected manifest leaves nothing to close: then both end upstream_failed)."""
    plan = week.plan

    @task(
        task_id="close_week",
        trigger_rule="all_done_min_one_success",
        **control_retries(),
        **control_priority(ControlTask.WEEK_END, plan.run_class),
    )
    def close_week(run: dict[str, Any]) -> dict[str, Any]:
        """Accounts for every shard: one that never started gets a summary saying so, and why."""
        return week_end.close_week(run)

    @task(
        task_id="report",
        trigger_rule="all_done_min_one_success",
        **control_retries(),
        **control_priority(ControlTask.WEEK_END, plan.run_class),
    )
    def report(run: dict[str, Any]) -> dict[str, str]:
        return week_end.finish_week(run, [rp.name for rp in plan.run_phases])

    return close_week(week.run), report(week.run)


def build_parent_dag(plan: WeeklyPlan, settings: AvsimSettings, dag_id: str, shard_dag_id: str) -> DAG:
    weekly = plan.run_class is RunClass.WEEKLY
    with _parent_dag(plan, settings, dag_id) as dag:
        shard_specs: Any = _prepare(plan, settings, dag_id)
        xcom = functools.partial(XComArg, shard_specs.operator)
        run_phases = tuple(f"run_phases.{rp.name}" for rp in plan.run_phases)
        triage = ("triage_start", "triage") if weekly else ()
        week = _Week(
            plan,
            settings,
            shard_dag_id,
            xcom(key=RUN_XCOM_KEY),
            ("close_week", *triage, *run_phases, "report"),
        )
        canary, gate = _canary(week, xcom(key="canary"))
        shard_specs >> [canary, gate]
        # Beside the shards: re-estimates the finish, records it, and adds capacity where configured.
        tracker = deadline_tracker(plan, settings, run=week.run, shard_dag_id=shard_dag_id)
        shard_specs >> tracker
        shard_runs = _shard_runs(week, shard_specs)
        gate >> shard_runs
        created = _run_level(week, xcom(key="shard_inputs"))
        closed, report_task = _week_end(week)
        [shard_runs, canary] >> closed
        for rp in plan.run_phases:
            if not rp.upstream:
                # The shards too, not only close_week: a repair clears the run-level phases (their inputs
                # change) while close_week stays done, and they must wait for the repaired shards.
                [closed, shard_runs, canary] >> created[rp.name]
        [shard_runs, canary, tracker, closed, *created.values()] >> report_task
        if weekly:
            week_triage(plan, settings, week.run, shard_dag_id, after=closed) >> report_task
    return dag


def week_triage(
    plan: WeeklyPlan, settings: AvsimSettings, run_xcom: Any, shard_dag_id: str, *, after: Any
) -> Any:
    """``after`` (``close_week``) >> ``triage_start`` >> ``triage``: the newly failing cases rerun on
    both builds once every case ran once, below every week (docs/design.md, "Triage"); returns the
    last task."""
    from avsim.operators.triage import TriageOperator

    @task(
        task_id="triage_start",
        trigger_rule="all_done_min_one_success",
        **control_retries(),
        **control_priority(ControlTask.WEEK_END, plan.run_class),
    )
    def triage_start(run: dict[str, Any]) -> list[str]:
        """Decides which newly failing cases rerun, within the budget and the deadline, and starts them."""
        return tasks.start_triage(run, plan, settings, shard_dag_id)

    started = triage_start(run_xcom)
    after >> started
    wait = TriageOperator(
        task_id="triage",
        run=run_xcom,
        run_ids=started,
        shard_dag_id=shard_dag_id,
        airflow_api_conn_id=settings.airflow_api_conn_id,
        poll_interval=settings.shard_poll_seconds,
        reruns=settings.triage.reruns,
        trigger_rule="all_done_min_one_success",
        **control_retries(),
        **control_priority(ControlTask.WEEK_END, plan.run_class),
    )
    started >> wait
    return wait
