"""docker-compose.yml is the one source of the production settings, and the distributed stack uses it.

Without starting anything: every component of :class:`tests.support.distributed.DistributedStack`
gets exactly compose's ``x-airflow-env``, changed only where an address, a port or a path must be
this machine's (and the database's name the test server's); what the stack adds is a listed test
setting, an address, a path or a name, never a compose setting changed; and compose has every
setting the production topology needs. (The running processes' environments are checked against
the same values in tests/integration/test_distributed.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.engine import make_url
from tests.support import compose
from tests.support.distributed import (
    STACK_MARK,
    TEST_OPTIONAL,
    TEST_SETTINGS,
    WORKERS,
    DistributedStack,
    deployment_variables,
)

pytestmark = pytest.mark.distributed

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer", *WORKERS, "airflow-init")
TEST_DB = "postgresql+psycopg2://postgres@127.0.0.1:54999/airflow_test_1"
#: What the stack sets besides compose's settings, beyond TEST_SETTINGS: where a container has its
#: own filesystem, address and name, a process here has its own folder, port and name.
PLACE_AND_NAME = {
    "AIRFLOW_HOME",
    "AIRFLOW__CORE__DAGS_FOLDER",
    "AIRFLOW__CORE__PLUGINS_FOLDER",
    "AIRFLOW__API__HOST",
    "AIRFLOW__API__PORT",
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT",
    "AIRFLOW__LOGGING__TRIGGERER_LOG_SERVER_PORT",
    "AIRFLOW__CORE__HOSTNAME_CALLABLE",
    "AVSIM_COMPONENT_HOSTNAME",
    STACK_MARK,
}
#: What the production topology needs compose to say (the stack fails without any of them).
REQUIRED = {
    "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
    "AIRFLOW__CORE__AUTH_MANAGER": "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager",
    "AIRFLOW__LOGGING__REMOTE_LOGGING": "True",
    "AIRFLOW__LOGGING__REMOTE_LOG_CONN_ID": "avsim_s3",
    "AIRFLOW__AVSIM__BACKEND": "local",
    "AIRFLOW__AVSIM__AIRFLOW_API_CONN_ID": "avsim_airflow_api",
    "AIRFLOW__AVSIM__DEADLINE_API_CONN_ID": "avsim_airflow_api",
    "AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS": "avsim.celery_config.CELERY_CONFIG",
}
NAMED = (
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
    "AIRFLOW__CELERY__BROKER_URL",
    "AIRFLOW__CORE__EXECUTION_API_SERVER_URL",
    "AIRFLOW__CORE__FERNET_KEY",
    "AIRFLOW__API_AUTH__JWT_SECRET",
    "AIRFLOW__API__SECRET_KEY",
    "AIRFLOW__LOGGING__REMOTE_BASE_LOG_FOLDER",
    "AIRFLOW__AVSIM__ARTIFACT_ROOT",
    "AIRFLOW__AVSIM__GPU_QUEUE",
    "AIRFLOW__AVSIM__CPU_QUEUE",
    "AIRFLOW_CONN_AVSIM_S3",
    "AIRFLOW_CONN_AVSIM_AIRFLOW_API",
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
)


@pytest.fixture
def stack(tmp_path: Path) -> DistributedStack:
    return DistributedStack(
        base=tmp_path, database_url=TEST_DB, api_port=58080, redis_port=56379, s3_port=59000
    )


def _settings(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(("AIRFLOW", "AWS_", "AVSIM_"))}


def _unlocalized(key: str, value: str, stack: DistributedStack, original: str) -> str:
    """``value`` with the loopback addresses put back: what compose says, if only addresses differ."""
    if key == compose.DB_KEY:
        theirs = make_url(original)
        back = make_url(value).set(
            host=theirs.host,
            port=theirs.port,
            username=theirs.username,
            password=theirs.password,
            database=theirs.database,
        )
        return back.render_as_string(hide_password=False)
    for service in compose.SERVICE_ADDRESSES[1:]:
        value = value.replace(f"//{stack.loopback.address(service)}", f"//{service}")
    return value


def test_every_component_runs_with_composes_settings(stack: DistributedStack) -> None:
    production = compose.shared_env(stack.compose)
    local = stack.production_env  # compose's, localized (test_only_addresses_change)
    for name in COMPONENTS:
        env = stack.init_env() if name == "airflow-init" else stack.component_env(name)
        settings = _settings(env)
        for key in production:
            assert key in settings, f"{name} lacks compose's {key}"
            assert settings[key] == local[key], (name, key)
        added = set(settings) - set(production)
        if name == "airflow-init":  # its own service adds the accounts it creates, and the capacity file
            added -= set(compose.service_env(stack.compose, "airflow-init")) | {"AVSIM_CAPACITY_FILE"}
        assert added <= set(TEST_SETTINGS) | PLACE_AND_NAME, sorted(
            added - set(TEST_SETTINGS) - PLACE_AND_NAME
        )
        assert settings["AVSIM_COMPONENT_HOSTNAME"] == name
        assert settings["AIRFLOW_HOME"] == str(stack.base / name)  # nothing on disk shared
        assert env["HOME"] == settings["AIRFLOW_HOME"] and env["TMPDIR"].startswith(settings["AIRFLOW_HOME"])


def test_the_stack_only_adds_settings_compose_leaves_at_their_defaults() -> None:
    production = compose.shared_env(compose.load(deployment_variables(8080)))
    assert not set(TEST_SETTINGS) & set(production), "a test setting would override compose's"
    assert not set(TEST_OPTIONAL) & set(production), "a per-test option would override compose's"
    assert not PLACE_AND_NAME & set(production)
    with pytest.raises(ValueError, match="not settings a test may change"):
        DistributedStack(
            base=Path("/nonexistent"), database_url=TEST_DB, options={"AIRFLOW__CORE__EXECUTOR": "x"}
        )


def test_only_addresses_change(stack: DistributedStack) -> None:
    production = compose.shared_env(stack.compose)
    local = stack.production_env
    changed = {k for k in production if production[k] != local[k]}
    assert changed == {
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
        "AIRFLOW__CELERY__BROKER_URL",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL",
        "AIRFLOW_CONN_AVSIM_S3",
        "AIRFLOW_CONN_AVSIM_AIRFLOW_API",
        "AWS_ENDPOINT_URL",
    }
    for key in changed:  # and only their addresses (and the database's name) changed
        assert _unlocalized(key, local[key], stack, production[key]) == production[key], key
    assert local["AIRFLOW__CELERY__BROKER_URL"] == "redis://127.0.0.1:56379/0"
    assert local["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:58080/execution/"
    assert '"endpoint_url": "http://127.0.0.1:59000"' in local["AIRFLOW_CONN_AVSIM_S3"]
    db = make_url(local["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    assert db.drivername == make_url(production["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]).drivername
    assert (db.host, db.port, db.database) == ("127.0.0.1", 54999, "airflow_test_1")
    # The API's own address, which compose gives through a variable (.env), is the stack's.
    assert local["AIRFLOW__API__BASE_URL"] == "http://127.0.0.1:58080"


def test_compose_says_what_the_production_topology_needs(stack: DistributedStack) -> None:
    production = compose.shared_env(stack.compose)
    for key, value in REQUIRED.items():
        assert production.get(key) == value, key
    missing = [k for k in NAMED if not production.get(k)]
    assert not missing, f"docker-compose.yml's x-airflow-env lacks {missing}"
    assert production["AIRFLOW__AVSIM__ARTIFACT_ROOT"].startswith("s3://avsim_s3@")
    assert production["AIRFLOW__LOGGING__REMOTE_BASE_LOG_FOLDER"].startswith("s3://")
    assert production["AIRFLOW__AVSIM__GPU_QUEUE"] != production["AIRFLOW__AVSIM__CPU_QUEUE"]


def test_workers_take_composes_queues_and_a_gpu_machines(stack: DistributedStack) -> None:
    production = compose.shared_env(stack.compose)
    gpu, cpu = production["AIRFLOW__AVSIM__GPU_QUEUE"], production["AIRFLOW__AVSIM__CPU_QUEUE"]
    assert set(stack.worker_queues("worker")) == {"default", gpu, cpu}  # compose's worker command
    assert stack.worker_queues("gpu-worker") == (gpu,)  # a GPU machine's worker (docs/deployment.md)


def test_dags_and_plugins_are_composes_mounts(stack: DistributedStack) -> None:
    mounts = compose.mounts(stack.compose, "airflow-worker")
    env = stack.component_env("worker")
    assert Path(env["AIRFLOW__CORE__DAGS_FOLDER"]) == mounts["/opt/airflow/dags"] == compose.ROOT / "dags"
    assert Path(env["AIRFLOW__CORE__PLUGINS_FOLDER"]) == mounts["/opt/airflow/plugins"]
