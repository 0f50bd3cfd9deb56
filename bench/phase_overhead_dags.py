"""The DAG files ``bench/phase_overhead.py`` writes into its stack's DAGs folder.

Four shard DAGs of one shape (the shipped graph catalog's families, one mapped task group per family,
one task per phase, a GPU phase's on-demand twin after it with ``all_skipped``, the phase after a
GPU phase with ``none_failed``, a ``load_shard`` task, one ``cases_<family>`` task per family and a
``summarize`` task ``all_done``), differing only in what a phase task is:

``bench_empty_shard``   an ``EmptyOperator`` with a no-op ``on_execute_callback``: Airflow 3.3.2 marks a
                        bare ``EmptyOperator`` success in the scheduler without running it, so the
                        callback makes it a task that runs (task process, parse, execution API), doing
                        nothing: the floor of a task on this executor.
``bench_kpo_shard``     the stock deferrable ``KubernetesPodOperator``, its pod running ``sleep N``.
``bench_local_shard``   avsim's local phases, built by ``avsim.dagbuild.factory`` as the shipped
                        ``dags/avsim_weekly_shard.py`` is (backend ``local``).
``bench_k8s_shard``     the same with backend ``kubernetes``.
``bench_defer_shard``   a task that defers once on a ``TimeDeltaTrigger`` for as long as the Kubernetes
                        variants' pods run, then resumes in a worker and returns: what Airflow itself
                        costs for any deferrable task of that length (two task processes, the
                        triggerer's wait, the scheduler keeping the waiting phases for that long).
``bench_end_shard``     a task that defers once on a trigger that waits as long and then ends the task
                        itself (``TaskSuccessEvent``): Airflow's floor for a deferrable task that
                        never resumes in a worker (one task process, the triggerer's wait).

The two stock DAG files read the shape from a JSON file beside them (written from the plan by the
bench), so parsing them imports Airflow and the operator only, not avsim.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: variant -> (DAG file stem, DAG id)
DAG_IDS = {
    "empty": "bench_empty_shard",
    "avsim_local": "bench_local_shard",
    "stock_kpo": "bench_kpo_shard",
    "avsim_k8s": "bench_k8s_shard",
    "deferral": "bench_defer_shard",
    "trigger_end": "bench_end_shard",
}

#: The module (in the directory :func:`write_trigger_module` writes, on the stack's PYTHONPATH) holding
#: the trigger of ``bench_end_shard``: the triggerer imports a trigger by its classpath.
END_TRIGGER_MODULE = "avsim_bench_end_trigger"
_END_TRIGGER_SOURCE = '''"""A trigger that waits, then ends its task instance as a success (bench/phase_overhead.py, (f))."""

import asyncio

from airflow.triggers.base import BaseTrigger, TaskSuccessEvent


class EndAfter(BaseTrigger):
    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds

    def serialize(self):
        return (f"{type(self).__module__}.{type(self).__qualname__}", {"seconds": self.seconds})

    async def run(self):
        await asyncio.sleep(self.seconds)
        yield TaskSuccessEvent()
'''

_STOCK = '''"""Bench Airflow DAG ({kind}): phases of the avsim shard's shape (bench/phase_overhead.py)."""

import datetime as dt
import json
from pathlib import Path

from airflow.sdk import DAG, get_current_context, task, task_group

{imports}

SHAPE = json.loads(Path(__file__).with_suffix(".json").read_text())


def _noop(context):
    return None


def phase_task(spec, task_id, pool, trigger_rule):
    common = dict(
        task_id=task_id,
        pool=pool,
        pool_slots=spec["pool_slots"],
        priority_weight=spec["priority_weight"],
        weight_rule="absolute",
        trigger_rule=trigger_rule,
        retries=spec["retries"],
        retry_delay=dt.timedelta(seconds=1),
    )
{make_task}


def family_group(family):
    @task_group(group_id=family["group_id"])
    def group(case):
        made_by = {{}}
        for spec in family["phases"]:
            after_pair = any(len(made_by[up]) > 1 for up in spec["upstream"])
            main = phase_task(spec, spec["name"], spec["pool"], "none_failed" if after_pair else "all_success")
            for up in spec["upstream"]:
                made_by[up] >> main
            made_by[spec["name"]] = [main]
            if spec["twin"]:
                twin = phase_task(spec, spec["twin"], spec["twin_pool"], "all_skipped")
                main >> twin
                made_by[spec["name"]].append(twin)

    return group


with DAG(
    dag_id="{dag_id}",
    schedule=None,
    start_date=dt.datetime(2026, 1, 5, tzinfo=dt.timezone.utc),
    catchup=False,
    max_active_runs=SHAPE["max_active_runs"],
    max_active_tasks=SHAPE["max_active_tasks"],
    is_paused_upon_creation=False,
    tags=["avsim-bench"],
):

    @task(task_id="load_shard")
    def load_shard():
        return {{"shard": get_current_context()["dag_run"].conf.get("shard", 0)}}

    @task(task_id="summarize", trigger_rule="all_done")
    def summarize():
        return {{}}

    run = load_shard()
    done = summarize()
    for family in SHAPE["families"]:

        @task(task_id="cases_" + family["name"])
        def family_cases(name=family["name"]):
            return list(get_current_context()["dag_run"].conf["cases"].get(name, []))

        cases = family_cases()
        run >> cases
        family_group(family).expand(case=cases) >> done
'''

_EMPTY_TASK = """    return EmptyOperator(on_execute_callback=_noop, **common)"""

_KPO_TASK = """    return KubernetesPodOperator(
        name=task_id.replace("_", "-"),
        image="registry.example.com/avsim/noop:bench",
        cmds=["sleep", str(SHAPE["pod_seconds"])],
        namespace=SHAPE["namespace"],
        kubernetes_conn_id="kubernetes_default",
        deferrable=True,
        on_finish_action="delete_pod",
        **common,
    )"""

_DEFER_TASK = """    return DeferOnce(seconds=SHAPE["pod_seconds"], **common)"""

_DEFER_IMPORTS = '''from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger
from airflow.sdk import BaseOperator


class DeferOnce(BaseOperator):
    """Defers for ``seconds``, then resumes in a worker and returns: the floor of a deferrable task."""

    def __init__(self, *, seconds, **kwargs):
        super().__init__(**kwargs)
        self.seconds = seconds

    def execute(self, context):
        self.defer(trigger=TimeDeltaTrigger(dt.timedelta(seconds=self.seconds)), method_name="resume")

    def resume(self, context, event=None):
        return None'''

_END_TASK = """    return DeferToEnd(seconds=SHAPE["pod_seconds"], **common)"""

_END_IMPORTS = f'''from airflow.sdk import BaseOperator


class DeferToEnd(BaseOperator):
    """Defers for ``seconds`` on a trigger that ends the task: a deferrable task that never resumes."""

    def __init__(self, *, seconds, **kwargs):
        super().__init__(**kwargs)
        self.seconds = seconds

    def execute(self, context):
        from {END_TRIGGER_MODULE} import EndAfter

        self.defer(trigger=EndAfter(self.seconds), method_name="execute_complete")

    def execute_complete(self, context, event=None):  # never called: the trigger ends the task
        return None'''

_AVSIM = '''"""Bench Airflow DAG: avsim's shard DAG on the {backend} backend, built as dags/avsim_weekly_shard.py builds it."""

import dataclasses
from pathlib import Path

from avsim.dagbuild.factory import load_weekly_dags
from avsim.settings import load_settings

globals().update(
    load_weekly_dags(
        catalog=Path(__file__).with_name("avsim_graphs.yaml"),
        dag_id="{prefix}",
        settings=dataclasses.replace(load_settings(), backend="{backend}"),
        part="shard",
    )
)
'''


def shape(plan: Any, namespace: str, pod_seconds: float) -> dict[str, Any]:
    """The plan's families as plain data for the stock DAG files."""
    return {
        "namespace": namespace,
        "pod_seconds": pod_seconds,
        "max_active_runs": plan.max_active_shards + 1,
        "max_active_tasks": max(16, 2 * plan.shard_size),
        "families": [
            {
                "name": fam.name,
                "group_id": fam.group_id,
                "phases": [
                    {
                        "name": p.name,
                        "upstream": list(p.upstream),
                        "pool": p.pool,
                        "pool_slots": p.pool_slots,
                        "priority_weight": p.priority_weight,
                        "retries": p.retries,
                        "twin": p.on_demand_task if p.on_demand_fallback else "",
                        "twin_pool": p.on_demand_pool,
                    }
                    for p in fam.phases
                ],
            }
            for fam in plan.families
        ],
    }


def write_dags(folder: Path, plan: Any, catalog: Path, namespace: str, pod_seconds: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    doc = json.dumps(shape(plan, namespace, pod_seconds), indent=1)
    stock = {
        "empty": ("from airflow.providers.standard.operators.empty import EmptyOperator", _EMPTY_TASK),
        "stock_kpo": (
            "from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator",
            _KPO_TASK,
        ),
        "deferral": (_DEFER_IMPORTS, _DEFER_TASK),
        "trigger_end": (_END_IMPORTS, _END_TASK),
    }
    for variant, (imports, make_task) in stock.items():
        dag_id = DAG_IDS[variant]
        (folder / f"{dag_id}.json").write_text(doc)
        (folder / f"{dag_id}.py").write_text(
            _STOCK.format(kind=variant, imports=imports, make_task=make_task, dag_id=dag_id)
        )
    # The catalog ships next to the DAG files, as dags/avsim_graphs.yaml does (the scheduler's preload
    # checks the one in the DAGs folder).
    (folder / "avsim_graphs.yaml").write_text(catalog.read_text())
    for variant, backend in (("avsim_local", "local"), ("avsim_k8s", "kubernetes")):
        dag_id = DAG_IDS[variant]
        (folder / f"{dag_id}.py").write_text(
            _AVSIM.format(backend=backend, prefix=dag_id.removesuffix("_shard"))
        )


def write_trigger_module(folder: Path) -> Path:
    """The bench trigger's module, in ``folder`` (put it on the stack's PYTHONPATH)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{END_TRIGGER_MODULE}.py").write_text(_END_TRIGGER_SOURCE)
    return folder


def dependencies(plan: Any) -> dict[str, list[str]]:
    """Phase task id -> the task ids of its upstream phases (a GPU phase: its spot task and its twin)."""
    deps: dict[str, list[str]] = {}
    for fam in plan.families:
        by_name = {p.name: p for p in fam.phases}
        for p in fam.phases:
            ups: list[str] = []
            for u in p.upstream:
                ups.append(f"{fam.group_id}.{u}")
                if by_name[u].on_demand_fallback:
                    ups.append(f"{fam.group_id}.{by_name[u].on_demand_task}")
            if ups:
                deps[f"{fam.group_id}.{p.name}"] = ups
    return deps
