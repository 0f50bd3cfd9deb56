"""What avsim takes from Airflow beyond its public SDK (avsim.airflow_internals), checked against the
installed Airflow and cncf provider. An upgrade that moves or renames one of these fails here, and
provider/avsim/airflow_internals.py is the one file to change."""

from __future__ import annotations

import inspect

import pytest

from avsim import airflow_internals


@pytest.mark.parametrize("name", sorted(airflow_internals.RELIED_ON))
def test_every_column_the_pages_query_exists(name: str) -> None:
    model = airflow_internals.models()[name]
    columns = set(model.__table__.c.keys())
    missing = set(airflow_internals.RELIED_ON[name]) - columns
    assert not missing, f"{name} no longer has {sorted(missing)}"


def test_the_xcom_value_is_json_the_pages_can_index() -> None:
    # ui/progress reads X.value["outcome"]: the column must stay a JSON type.
    from sqlalchemy.types import JSON

    column = airflow_internals.models()["XComModel"].__table__.c["value"]
    assert isinstance(column.type, JSON)


def test_a_triggers_xcom_is_stored_encoded_once_more_and_pulled_back_whole() -> None:
    """The server stores a TaskSuccessEvent's XComs through XComModel.set, which JSON-encodes the value
    (a task's own push arrives serialized and is stored as is): a task pulling it gets the JSON text,
    which pulled_xcom turns back into the value. When Airflow stops encoding it, this fails: then
    pulled_xcom (and its use in the phase lifecycle) can go."""
    from airflow.sdk.serde import deserialize

    result = {"case_id": "c1", "phase": "prepare", "outcome": "passed", "attempt": 1}
    stored = airflow_internals.models()["XComModel"].serialize_value(result)
    pulled = deserialize(stored)  # what the task SDK's pull does with the stored value
    assert isinstance(pulled, str)
    assert airflow_internals.pulled_xcom(pulled) == result
    assert airflow_internals.pulled_xcom(result) == result
    assert airflow_internals.pulled_xcom("[not json") == "[not json"
    assert airflow_internals.pulled_xcom(None) is None


def test_sessions_auth_and_the_task_runner_are_where_avsim_looks() -> None:
    from airflow.utils.session import create_session

    assert "scoped" in inspect.signature(inspect.unwrap(create_session)).parameters
    assert callable(airflow_internals.requires_authenticated())
    rti = airflow_internals.runtime_task_instance()
    assert callable(rti.get_ti_count) and callable(rti.get_dr_count)


def test_the_stats_modules_keep_their_factory_global() -> None:
    import airflow._shared.observability.metrics.stats as core_stats
    import airflow.sdk._shared.observability.metrics.stats as sdk_stats

    for module in (core_stats, sdk_stats):
        assert hasattr(module, "_factory") and callable(module.initialize), module.__name__
    stats = airflow_internals.stats_module(legacy_names=True)
    for method in ("incr", "timing", "gauge"):
        assert callable(getattr(stats, method)), method


def test_the_cncf_operator_still_has_its_private_kube_config() -> None:
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    op = KubernetesPodOperator(task_id="t", image="i", config_file=None, in_cluster=False)
    assert "_config_dict" in vars(op), "the provider dropped _config_dict: pass the kube config another way"
    assert airflow_internals.pod_config_dict(op) is None  # no config file given


def test_the_cli_trigger_and_the_cluster_policy_hook_are_where_avsim_looks() -> None:
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.settings import pod_mutation_hook
    from airflow.utils.types import DagRunTriggeredByType

    params = inspect.signature(trigger_dag).parameters
    assert {"dag_id", "triggered_by", "run_id", "conf", "note"} <= set(params)
    assert DagRunTriggeredByType.CLI.value == "cli"
    assert callable(pod_mutation_hook)


def test_a_task_creates_a_dag_run_through_its_supervisor_as_the_task_runner_does() -> None:
    """start_dag_run_from_task sends what task_runner._handle_trigger_dag_run sends for a
    TriggerDagRunOperator, and reads the answer the same way."""
    from airflow.sdk.exceptions import ErrorType
    from airflow.sdk.execution_time import task_runner
    from airflow.sdk.execution_time.comms import TriggerDagRun

    assert "SUPERVISOR_COMMS" in task_runner.__annotations__ or hasattr(task_runner, "SUPERVISOR_COMMS")
    source = inspect.getsource(task_runner._handle_trigger_dag_run)
    assert "TriggerDagRun(" in source and "ErrorType.DAGRUN_ALREADY_EXISTS" in source
    # ... and defers on a plain DagStateTrigger there, which is why avsim does not take that route.
    assert "DagStateTrigger(" in source
    assert {"dag_id", "run_id", "conf", "logical_date", "reset_dag_run", "note"} <= set(
        TriggerDagRun.model_fields
    )
    assert ErrorType.DAGRUN_ALREADY_EXISTS


def test_task_instance_state_reads_the_execution_apis_keys() -> None:
    """``task_instance_state`` relies on how Airflow 3.3.2's execution API keys another task instance's
    state (``<task id>_<map index>`` for a mapped one): pinned on the route's source, so an upgrade that
    changes it fails here, and on a task instance's ``get_task_states`` taking the arguments it passes."""
    import inspect

    from airflow.api_fastapi.execution_api.routes import task_instances
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    from avsim.airflow_internals import task_instance_state

    route = inspect.getsource(task_instances.get_task_instance_states)
    assert 'f"{task.task_id}_{task.map_index}"' in route and "task.map_index < 0" in route
    params = inspect.signature(RuntimeTaskInstance.get_task_states).parameters
    assert {"dag_id", "map_index", "task_ids", "run_ids"} <= set(params)

    class Ti:
        def get_task_states(self, **kwargs: object) -> dict[str, dict[str, str]]:
            return {"r1": {"t": "success", "group.twin_3": "skipped"}}

    assert task_instance_state(Ti(), "d", "r1", "group.twin", 3) == "skipped"
    assert task_instance_state(Ti(), "d", "r1", "t") == "success"
    assert task_instance_state(Ti(), "d", "r1", "group.twin", 4) is None
