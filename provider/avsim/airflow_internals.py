"""Everything avsim takes from Airflow beyond its public task SDK, in one place.

The metadata tables the pages query (:data:`RELIED_ON` lists the columns the SQL uses), the stats
module's private backend, the cncf provider's private kube config, a trigger's XComs encoded once more
than a task's (:func:`pulled_xcom`): each is reached through a function here, checked against the
installed Airflow by ``tests/unit/test_airflow_internals.py``. Imports happen inside the functions.
docs/design.md, "What tasks hand each other".
"""

from __future__ import annotations

import contextlib
import threading
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow.sdk import Context

#: Model -> the columns avsim's SQL reads (ui/, deadline/, pools, priority).
RELIED_ON: dict[str, tuple[str, ...]] = {
    "TaskInstance": (
        "dag_id",
        "run_id",
        "task_id",
        "map_index",
        "state",
        "try_number",
        "start_date",
        "end_date",
        "duration",
        "pool",
        "pool_slots",
        "rendered_map_index",
    ),
    "TaskInstanceHistory": ("dag_id", "run_id", "map_index", "pool", "pool_slots", "duration"),
    "DagRun": (
        "id",
        "dag_id",
        "run_id",
        "state",
        "start_date",
        "end_date",
        "run_after",
        "logical_date",
        "conf",
        "clear_number",
    ),
    "XComModel": ("dag_run_id", "dag_id", "run_id", "task_id", "map_index", "key", "value"),
    "DagModel": ("dag_id",),
    "DagTag": ("dag_id", "name"),
    "Pool": ("pool", "slots"),
}


def models() -> dict[str, Any]:
    """Airflow's ORM models avsim queries, by name."""
    from airflow.models.dag import DagModel, DagTag
    from airflow.models.dagrun import DagRun
    from airflow.models.pool import Pool
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.taskinstancehistory import TaskInstanceHistory
    from airflow.models.xcom import XComModel

    return {
        "TaskInstance": TaskInstance,
        "TaskInstanceHistory": TaskInstanceHistory,
        "DagRun": DagRun,
        "XComModel": XComModel,
        "DagModel": DagModel,
        "DagTag": DagTag,
        "Pool": Pool,
    }


def create_session(**kwargs: Any) -> AbstractContextManager[Any]:
    """A metadata-database session (the api-server's and plugins' way in)."""
    from airflow.utils.session import create_session as airflow_session

    return airflow_session(**kwargs)


def requires_authenticated() -> Any:
    """The api-server's dependency that refuses a request without a valid token or session."""
    from airflow.api_fastapi.core_api.security import requires_authenticated as dependency

    return dependency


def request_user() -> Any:
    """The api-server's dependency that gives the request's user (token or session), refusing the rest."""
    from airflow.api_fastapi.core_api.security import get_user

    return get_user


def may_read_dag_runs(user: Any, dag_id: str) -> bool:
    """Whether Airflow's auth manager lets ``user`` read the runs of ``dag_id`` (per-DAG permissions,
    as the api-server's own run routes ask it)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
    from airflow.models.dag import DagModel

    return get_auth_manager().is_authorized_dag(
        method="GET",
        access_entity=DagAccessEntity.RUN,
        details=DagDetails(id=dag_id, team_name=DagModel.get_team_name(dag_id)),
        user=user,
    )


def runtime_task_instance() -> type[Any]:
    """The task runner's task-instance class (for a sensor that reads its own task instance)."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    return RuntimeTaskInstance


def trigger_dag_run(dag_id: str, run_id: str, conf: dict[str, Any], note: str) -> None:
    """Create a DAG run from the command line, as ``airflow dags trigger`` does (``avsim rerun-failed``)."""
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.utils.types import DagRunTriggeredByType

    trigger_dag(dag_id, triggered_by=DagRunTriggeredByType.CLI, run_id=run_id, conf=conf, note=note)


def pod_mutation_hook(pod: Any) -> None:
    """The cluster policy's ``pod_mutation_hook`` (``airflow_local_settings``), applied to a pod as the
    stock ``KubernetesPodOperator`` applies it to every pod it builds."""
    from airflow.settings import pod_mutation_hook as hook

    hook(pod)


def pod_config_dict(operator: Any) -> Any:
    """The kube config the cncf ``KubernetesPodOperator`` would hand its own trigger (a private
    property the provider marks for removal; None when it is gone or unset)."""
    return getattr(operator, "_config_dict", None)


_stats_lock = threading.Lock()


def pulled_xcom(value: Any) -> Any:
    """An XCom value as a task pulled it, the same whoever stored it.

    A task's own pushes reach the server serialized and are stored as JSON. The XComs a trigger's
    ``TaskSuccessEvent`` carries are stored by the server through ``XComModel.set``, which JSON-encodes
    the value once more (Airflow 3.3.2): pulled, a dict pushed that way is its JSON text. Parse it
    back; anything else is returned as it came."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        import json

        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _initialized(module: Any) -> bool:
    # Airflow's stats modules keep their backend factory in a module global, set by initialize().
    return getattr(module, "_factory", None) is not None


def stats_module(legacy_names: bool) -> Any:
    """The stats module this process emits through: the task SDK's when the task runner set it up,
    else the core one when a core process (scheduler, triggerer, api-server) did, else the task
    SDK's, initialized here from ``[metrics]`` (a process neither had set up)."""
    from airflow.sdk._shared.observability.metrics import stats as sdk_stats

    if _initialized(sdk_stats):
        return sdk_stats
    core_stats: Any = None
    with contextlib.suppress(ImportError):  # a task-SDK-only worker has no core package
        from airflow._shared.observability.metrics import stats as core_stats
    if core_stats is not None and _initialized(core_stats):
        return core_stats
    with _stats_lock:
        if not _initialized(sdk_stats):
            from airflow.sdk.observability.metrics import stats_utils

            sdk_stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=legacy_names)
    return sdk_stats


def task_instance_state(ti: Any, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> str | None:
    """The state of another task instance of a run, as a running task reads it through the execution
    API (``RuntimeTaskInstance.get_task_states``); None when it has none (or does not exist).

    Airflow 3.3.2 keys the answer by run id, then by the task id, with ``_<map index>`` appended for a
    mapped task instance."""
    found = ti.get_task_states(
        dag_id=dag_id, task_ids=[task_id], run_ids=[run_id], map_index=None if map_index < 0 else map_index
    )
    by_task = dict((found or {}).get(run_id) or {})
    state = by_task.get(task_id if map_index < 0 else f"{task_id}_{map_index}")
    return None if state is None else str(getattr(state, "value", state))


def start_dag_run_from_task(
    dag_id: str, run_id: str, *, conf: dict[str, Any], logical_date: Any = None, note: str | None = None
) -> bool:
    """Create a DAG run from inside a running task, the way Airflow's task runner does it for a
    ``TriggerDagRunOperator`` (``_handle_trigger_dag_run``): a ``TriggerDagRun`` message to the task's
    supervisor, which calls the execution API (``POST dag-runs/{dag_id}/{run_id}``). The task can then
    defer on a trigger of its own choosing. True when this call created the run, False when a run of
    that id was already there; any other refusal raises."""
    from airflow.sdk.exceptions import ErrorType
    from airflow.sdk.execution_time import task_runner
    from airflow.sdk.execution_time.comms import ErrorResponse, TriggerDagRun

    answer = task_runner.SUPERVISOR_COMMS.send(
        TriggerDagRun(
            dag_id=dag_id, run_id=run_id, conf=conf, logical_date=logical_date, reset_dag_run=False, note=note
        )
    )
    if isinstance(answer, ErrorResponse):
        if answer.error == ErrorType.DAGRUN_ALREADY_EXISTS:
            return False
        raise RuntimeError(f"the execution API refused to create DAG run {dag_id} {run_id}: {answer}")
    return True


def later_run_ids(dag_id: str, run_id: str, limit: int = 20, engine: Any = None) -> list[str] | None:
    """Ids of the runs of ``dag_id`` that came after run ``run_id`` (a later ``run_after``), at most
    ``limit``, oldest first; None when the metadata database cannot say (no such run, or no database).

    Called by a priority weight strategy, i.e. inside the scheduler's or the API server's transaction:
    it reads on a connection of its own (``engine``, default Airflow's), so it never commits, closes
    or blocks the caller's session."""
    import sqlalchemy as sa
    from airflow import settings

    run = models()["DagRun"]
    this = sa.select(run.run_after).where(run.dag_id == dag_id, run.run_id == run_id).scalar_subquery()
    query = (
        sa.select(run.run_id)
        .where(run.dag_id == dag_id, run.run_after > this)
        .order_by(run.run_after)
        .limit(limit)
    )
    found = sa.select(sa.func.count()).where(run.dag_id == dag_id, run.run_id == run_id)
    bind = engine if engine is not None else settings.engine
    if bind is None:
        return None
    with bind.connect() as conn:
        if not conn.execute(found).scalar():
            return None
        return [str(r) for r in conn.execute(query).scalars()]


# -- the cncf KubernetesPodOperator's private members (avsim.operators.kubernetes) -----------------
def kpo_ti_pod_labels(context: Context | None) -> dict[str, str]:
    """The labels the stock ``KubernetesPodOperator`` puts on every pod it builds for a task instance
    (dag, task, run, map index, try number; its private static ``_get_ti_pod_labels``): it finds the
    pod again by them, so the phase's own pod carries them too."""
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    return dict(KubernetesPodOperator._get_ti_pod_labels(context))


def kpo_killed(operator: Any) -> bool:
    """Whether the stock operator's ``on_kill`` ran on ``operator`` (its private ``_killed`` flag, which
    makes its ``cleanup`` stand down)."""
    return bool(getattr(operator, "_killed", False))


def kpo_mark_killed(operator: Any) -> None:
    """Set the stock operator's ``_killed`` flag, as its ``on_kill`` does: its own cleanup steps stand down."""
    operator._killed = True
