"""Raising the GPU spot pool through the REST API of a real Airflow API server, as a worker would.

The API server runs the simple auth manager with a real user and password (not all-admins), so
the action logs in with the credentials of an Airflow connection, as in production.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from tests.support.airflow_run import query

from avsim.deadline.actions import ScalingPolicy, act, raise_gpu_pool
from avsim.devstack.stack import LocalStack
from avsim.hooks.airflow_api import AirflowApiError, AirflowApiHook

pytestmark = pytest.mark.integration

PASSWORD = "correct-horse-battery"


@pytest.fixture(scope="module")
def api_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    home = tmp_path_factory.mktemp("deadline-api") / "airflow"
    home.mkdir()
    passwords = home / "passwords.json"
    passwords.write_text(json.dumps({"avsim": PASSWORD}))
    stack = LocalStack(
        home=home,
        dags_folder=home / "dags",
        extra_env={
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "avsim:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        },
    )
    (home / "dags").mkdir()
    stack.migrate()
    stack.set_pools({"avsim_gpu_spot": (8, "spot GPUs"), "avsim_gpu_on_demand": (2, "on-demand GPUs")})
    stack.start(["api-server"])
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture
def connection(api_stack: LocalStack, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(
        "AIRFLOW_CONN_AIRFLOW_API",
        json.dumps(
            {
                "conn_type": "http",
                "host": "127.0.0.1",
                "port": api_stack.port,
                "login": "avsim",
                "password": PASSWORD,
            }
        ),
    )
    return "airflow_api"


def _slots(stack: LocalStack, pool: str) -> int:
    [(slots,)] = query(stack, "SELECT slots FROM slot_pool WHERE pool = :p", p=pool)
    return int(slots)


def test_raises_the_spot_pool_within_its_bound(api_stack: LocalStack, connection: str) -> None:
    policy = ScalingPolicy(api_conn_id=connection, max_gpu_slots=20)
    client = AirflowApiHook(connection)
    # 14 GPUs needed, 2 on demand: the spot pool goes from 8 to 12 slots.
    result = raise_gpu_pool(client, policy, 14)
    assert (result.outcome, result.before, result.after) == ("raised", 8, 12)
    assert result.detail == "14 GPUs needed, 2 on demand: spot pool 8 -> 12"
    assert _slots(api_stack, "avsim_gpu_spot") == 12
    # Already enough: nothing changes.
    again = raise_gpu_pool(client, policy, 10)
    assert (again.outcome, again.after) == ("unchanged", 12)
    # Never beyond max_gpu_slots, however late the run.
    capped = raise_gpu_pool(client, policy, 500)
    assert (capped.outcome, capped.after) == ("raised", 20)
    assert capped.detail.endswith("(capped by max_gpu_slots)")
    assert _slots(api_stack, "avsim_gpu_spot") == 20
    at_bound = raise_gpu_pool(client, policy, 500)
    assert (at_bound.outcome, at_bound.detail) == ("unchanged", "the bound max_gpu_slots=20 is reached")
    # The pool keeps everything else it had (the stack creates its pools counting deferred phases).
    [(include_deferred, description)] = query(
        api_stack, "SELECT include_deferred, description FROM slot_pool WHERE pool = 'avsim_gpu_spot'"
    )
    assert description == "spot GPUs" and include_deferred


def test_wrong_credentials_and_missing_pools_are_reported(
    api_stack: LocalStack, connection: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_AIRFLOW_API_BAD",
        json.dumps(
            {
                "conn_type": "http",
                "host": f"http://127.0.0.1:{api_stack.port}",
                "login": "avsim",
                "password": "no",
            }
        ),
    )
    with pytest.raises(
        AirflowApiError, match=r"refused the login of connection 'airflow_api_bad' \(HTTP 401\)"
    ):
        AirflowApiHook("airflow_api_bad").pool_slots("avsim_gpu_spot")
    results = act(ScalingPolicy(api_conn_id=connection, max_gpu_slots=50, gpu_pool="avsim_gpu_missing"), 30)
    assert [(r.action, r.outcome) for r in results] == [("pool_slots", "failed")]
    assert "there is no pool 'avsim_gpu_missing'; create it with 'avsim pools sync'" in results[0].detail


def test_pool_names_with_odd_characters_are_quoted(api_stack: LocalStack, connection: str) -> None:
    api_stack.set_pools({"gpu spot/eu": (1, "odd name")})
    client = AirflowApiHook(connection)
    assert client.set_pool_slots("gpu spot/eu", 3) == 3
    assert _slots(api_stack, "gpu spot/eu") == 3


def test_client_base_url_from_the_connection(api_stack: LocalStack, connection: str) -> None:
    assert AirflowApiHook(connection).base_url == f"http://127.0.0.1:{api_stack.port}"
