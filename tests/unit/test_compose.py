"""docker-compose.yml and docker/: valid for docker-compose, wired the way the provider needs.

No Docker daemon runs in CI, so the stack is checked without starting it: Debian's
docker-compose (v1) renders and validates the file (`config -q`, skipped only where the binary
is missing; .ci/run installs it), the Airflow and [avsim] settings are checked against the
options Airflow and the provider really have, the image against pyproject's pins, and the
artifact-store step of the init service runs against a real S3 API (moto's server) with the
connection the compose file defines.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.support.compose import interpolate

from avsim.settings import BACKENDS, OPTIONS

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
INIT = ROOT / "docker" / "airflow-init.sh"
ENSURE = ROOT / "docker" / "ensure_artifact_store.py"
NEW_ENV = ROOT / "docker" / "new-env.sh"

#: Values for the variables the compose file requires (what docker/new-env.sh writes).
SECRETS = {
    "POSTGRES_PASSWORD": "pg-secret",
    "AIRFLOW_FERNET_KEY": "fernet-secret",
    "AIRFLOW_JWT_SECRET": "jwt-secret",
    "AIRFLOW_API_SECRET_KEY": "api-secret",
    "AVSIM_S3_SECRET_KEY": "s3-secret-key",
    "AVSIM_ADMIN_PASSWORD": "admin-secret",
    "AVSIM_SERVICE_PASSWORD": "service-secret",
}


def compose(env: dict[str, str] | None = None) -> dict[str, Any]:
    return yaml.safe_load(interpolate(COMPOSE.read_text(), SECRETS if env is None else env))


def airflow_services(cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services that run the image docker/Dockerfile builds."""
    return {
        name: svc
        for name, svc in cfg["services"].items()
        if svc.get("build", {}).get("dockerfile") == "docker/Dockerfile"
    }


def required_variables() -> list[str]:
    return sorted(set(re.findall(r"\$\{(\w+):?\?", COMPOSE.read_text())))


# ------------------------------------------------------------------------- docker-compose


def _compose_cli(env_file: Path, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.skip("docker-compose is not installed (.ci/run installs Debian's docker-compose)")
    names = set(re.findall(r"\$\{?(\w+)", COMPOSE.read_text()))
    env = {k: v for k, v in os.environ.items() if k not in names}  # only what the test gives
    env.update(extra_env or {})
    return subprocess.run(
        [binary, "-f", str(COMPOSE), "--env-file", str(env_file), "config", "-q"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_docker_compose_accepts_the_file(tmp_path: Path) -> None:
    env_file = tmp_path / "stack.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in SECRETS.items()))
    done = _compose_cli(env_file)
    assert done.returncode == 0, done.stderr


def test_docker_compose_refuses_to_render_without_its_secrets(tmp_path: Path) -> None:
    # Every secret is required (no silent default) ...
    assert set(required_variables()) == set(SECRETS)
    for name in SECRETS:
        with pytest.raises(KeyError, match=rf"{name}: set {name} - run docker/new-env.sh"):
            compose({k: v for k, v in SECRETS.items() if k != name})
    # ... and docker-compose itself stops on a missing one and says how to make it.
    empty = tmp_path / "empty.env"
    empty.write_text("")
    done = _compose_cli(empty, {k: v for k, v in SECRETS.items() if k != "AIRFLOW_JWT_SECRET"})
    assert done.returncode != 0, "rendered without AIRFLOW_JWT_SECRET"
    assert "AIRFLOW_JWT_SECRET" in done.stderr and "docker/new-env.sh" in done.stderr, done.stderr


def test_new_env_writes_every_secret_once(tmp_path: Path) -> None:
    from cryptography.fernet import Fernet

    out = tmp_path / ".env"
    done = subprocess.run(["bash", str(NEW_ENV), str(out)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    values = dict(
        line.split("=", 1) for line in out.read_text().splitlines() if line and not line.startswith("#")
    )
    assert set(SECRETS) <= set(values)
    Fernet(values["AIRFLOW_FERNET_KEY"].encode())  # a valid fernet key, or this raises
    assert len({values[k] for k in SECRETS}) == len(SECRETS), "two secrets are the same"
    assert out.stat().st_mode & 0o077 == 0, "the secrets file is readable by others"
    cfg = compose(values)  # the file renders with exactly what new-env.sh wrote
    assert (
        env_of(cfg["services"]["airflow-scheduler"])["AIRFLOW__CORE__FERNET_KEY"]
        == values["AIRFLOW_FERNET_KEY"]
    )
    again = subprocess.run(["bash", str(NEW_ENV), str(out)], capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and "not overwriting" in again.stderr
    if shutil.which("docker-compose"):
        assert _compose_cli(out).returncode == 0


# ------------------------------------------------------------------------- the services


def env_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    assert isinstance(env, dict), "write environment as a mapping"
    return {k: str(v) for k, v in env.items()}


def test_stack_has_the_airflow_3_components_and_their_services() -> None:
    cfg = compose()
    commands = {name: svc.get("command") for name, svc in airflow_services(cfg).items()}
    assert sorted(c for c in commands.values() if isinstance(c, str)) == [
        "api-server",
        "celery worker --queues default,avsim_cpu,avsim_gpu",
        "dag-processor",
        "scheduler",
        "triggerer",
    ]
    assert {"postgres", "redis", "s3", "airflow-init"} <= set(cfg["services"])
    env = env_of(cfg["services"]["airflow-scheduler"])
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://redis:")
    assert "@postgres:" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://airflow-api-server:8080/execution/"


def test_every_component_shares_the_same_keys_and_settings() -> None:
    cfg = compose()
    envs = {name: env_of(svc) for name, svc in airflow_services(cfg).items()}
    shared = {
        "AIRFLOW__CORE__FERNET_KEY": "AIRFLOW_FERNET_KEY",
        "AIRFLOW__API_AUTH__JWT_SECRET": "AIRFLOW_JWT_SECRET",
        "AIRFLOW__API__SECRET_KEY": "AIRFLOW_API_SECRET_KEY",
    }
    for key, variable in shared.items():
        assert {env.get(key) for env in envs.values()} == {SECRETS[variable]}, key
    airflow_keys = [{k: v for k, v in env.items() if k.startswith("AIRFLOW")} for env in envs.values()]
    assert all(keys == airflow_keys[0] for keys in airflow_keys), "components disagree on Airflow settings"


def test_airflow_settings_name_real_options() -> None:
    from airflow.configuration import conf

    described = conf.configuration_description
    env = env_of(compose()["services"]["airflow-scheduler"])
    for key in env:
        m = re.fullmatch(r"AIRFLOW__(\w+?)__(\w+)", key)
        if not m:
            continue
        section, option = m.group(1).lower(), m.group(2).lower()
        if section == "avsim":
            continue  # checked against the provider's own options below
        assert option in described.get(section, {}).get("options", {}), (
            f"{key}: [{section}] {option} is not an Airflow option"
        )


def _settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """The provider's own reading of [avsim] (load_settings) with exactly these AIRFLOW__AVSIM__ values."""
    from avsim.settings import load_settings

    for key in [k for k in os.environ if k.startswith("AIRFLOW__AVSIM__")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        if key.startswith("AIRFLOW__AVSIM__"):
            monkeypatch.setenv(key, value)
    return load_settings()


def test_avsim_settings_name_real_options_and_are_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    env = env_of(compose()["services"]["airflow-scheduler"])
    named = {k.removeprefix("AIRFLOW__AVSIM__").lower() for k in env if k.startswith("AIRFLOW__AVSIM__")}
    unknown = sorted(named - set(OPTIONS))
    assert not unknown, f"AIRFLOW__AVSIM__ names no option of provider/avsim/settings.py: {unknown}"
    settings = _settings_from(env, monkeypatch)  # raises ConfigError on a bad value
    assert settings.backend == "local"
    assert settings.artifact_root == env["AIRFLOW__AVSIM__ARTIFACT_ROOT"]
    assert settings.shard_size == int(env["AIRFLOW__AVSIM__SHARD_SIZE"])
    assert "{iso_week}" in settings.default_manifest


def test_the_commented_kubernetes_block_is_a_working_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    block = dict(re.findall(r"^\s*#\s*(AIRFLOW__AVSIM__\w+):\s*(\S+)\s*$", COMPOSE.read_text(), flags=re.M))
    assert {
        "AIRFLOW__AVSIM__BACKEND",
        "AIRFLOW__AVSIM__KUBERNETES_CONN_ID",
        "AIRFLOW__AVSIM__KUBERNETES_NAMESPACE",
    } <= set(block)
    if "kubernetes" not in BACKENDS:
        pytest.skip("this provider version has no kubernetes backend yet")
    assert block["AIRFLOW__AVSIM__BACKEND"] == "kubernetes"
    unknown = sorted(k for k in block if k.removeprefix("AIRFLOW__AVSIM__").lower() not in OPTIONS)
    assert not unknown, f"the commented kubernetes block names unknown [avsim] options: {unknown}"
    env = {**env_of(compose()["services"]["airflow-scheduler"]), **block}
    settings = _settings_from(env, monkeypatch)
    assert settings.backend == "kubernetes"
    k8s = getattr(settings, "kubernetes", None)
    if k8s is not None:
        assert k8s.conn_id == block["AIRFLOW__AVSIM__KUBERNETES_CONN_ID"]
        assert k8s.namespace == block["AIRFLOW__AVSIM__KUBERNETES_NAMESPACE"]


def test_max_map_length_holds_a_shard_and_the_shards_of_a_big_week() -> None:
    env = env_of(compose()["services"]["airflow-scheduler"])
    limit = int(env["AIRFLOW__CORE__MAX_MAP_LENGTH"])
    shard_size = int(env["AIRFLOW__AVSIM__SHARD_SIZE"])
    assert limit > 1024, "the default [core] max_map_length is 1024; raise it"
    assert shard_size <= limit  # the DAG factory refuses the DAGs otherwise
    assert math.ceil(100_000 / shard_size) <= limit  # the parent maps over shards; 10x today's week


def test_dags_and_plugins_are_mounted_where_airflow_reads_them() -> None:
    cfg = compose()
    for name, svc in airflow_services(cfg).items():
        env = env_of(svc)
        dags = env.get("AIRFLOW__CORE__DAGS_FOLDER", "/opt/airflow/dags")
        plugins = env.get("AIRFLOW__CORE__PLUGINS_FOLDER", "/opt/airflow/plugins")
        mounts = {v.split(":")[1]: v.split(":")[0] for v in svc["volumes"]}
        assert mounts.get(dags) == "./dags", name
        assert mounts.get(plugins) == "./plugins", name
    assert (ROOT / "dags" / "avsim_weekly.py").exists() and (ROOT / "plugins").is_dir()


def _one_shot(cfg: dict[str, Any]) -> set[str]:
    """Services others wait for to exit 0 (service_completed_successfully)."""
    return {
        dep
        for svc in cfg["services"].values()
        for dep, cond in (svc.get("depends_on") or {}).items()
        if cond.get("condition") == "service_completed_successfully"
    }


def test_every_service_has_a_healthcheck_and_waits_for_healthy_dependencies() -> None:
    cfg = compose()
    one_shot = _one_shot(cfg)
    assert one_shot == {"airflow-init"}
    assert cfg["services"]["airflow-init"]["restart"] == "no"
    for name, svc in cfg["services"].items():
        if name in one_shot:
            continue
        check = svc.get("healthcheck") or {}
        assert check.get("test") and not check.get("disable"), f"{name} has no healthcheck"
        assert check["test"][0] in ("CMD", "CMD-SHELL"), name
    for name, svc in cfg["services"].items():
        deps = svc.get("depends_on") or {}
        assert isinstance(deps, dict), (
            f"{name}: depends_on without conditions starts before dependencies are up"
        )
        for dep, cond in deps.items():
            expected = "service_completed_successfully" if dep in one_shot else "service_healthy"
            assert cond == {"condition": expected}, (name, dep)
    for name, svc in airflow_services(cfg).items():
        if name not in one_shot:
            assert svc["depends_on"].get("airflow-init") == {"condition": "service_completed_successfully"}, (
                name
            )


def test_workers_scale_out() -> None:
    cfg = compose()
    assert not [n for n, s in cfg["services"].items() if "container_name" in s], (
        "container_name blocks --scale"
    )
    worker = cfg["services"]["airflow-worker"]
    assert "ports" not in worker, "a published port would collide between scaled workers"
    assert worker["command"].split(" --queues ")[0] == "celery worker"
    # On one host every worker takes the default queue and both phase queues.
    env = env_of(worker)
    queues = set(worker["command"].split(" --queues ")[1].split(","))
    assert queues == {"default", env["AIRFLOW__AVSIM__GPU_QUEUE"], env["AIRFLOW__AVSIM__CPU_QUEUE"]}


def test_artifact_root_and_logs_use_the_s3_connection_the_stack_defines() -> None:
    env = env_of(compose()["services"]["airflow-worker"])
    conn = json.loads(env["AIRFLOW_CONN_AVSIM_S3"])
    assert conn["conn_type"] == "aws"
    assert conn["login"] and conn["password"] == SECRETS["AVSIM_S3_SECRET_KEY"]
    assert conn["extra"]["endpoint_url"] == "http://s3:9000"
    cfg = compose()
    minio = env_of(cfg["services"]["s3"])
    assert (minio["MINIO_ROOT_USER"], minio["MINIO_ROOT_PASSWORD"]) == (conn["login"], conn["password"])
    root = env["AIRFLOW__AVSIM__ARTIFACT_ROOT"]
    assert root.startswith("s3://avsim_s3@") and env["AIRFLOW__LOGGING__REMOTE_LOG_CONN_ID"] == "avsim_s3"
    bucket = root.removeprefix("s3://avsim_s3@").split("/")[0]
    assert env["AIRFLOW__LOGGING__REMOTE_BASE_LOG_FOLDER"].startswith(f"s3://{bucket}/")


def _ensure_module() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("ensure_artifact_store", ENSURE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_init_creates_the_bucket_through_the_compose_connection(
    s3_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The init service's artifact-store step, run as the container runs it, against a real S3 API."""
    import boto3

    airflow_env = env_of(compose()["services"]["airflow-init"])
    conn = json.loads(airflow_env["AIRFLOW_CONN_AVSIM_S3"])
    conn["extra"]["endpoint_url"] = s3_server  # the one thing that differs from the container: the host
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}  # only the connection counts
    env.update(
        {k: v for k, v in airflow_env.items() if k.startswith(("AIRFLOW__LOGGING__", "AIRFLOW__AVSIM__"))}
    )
    env["AIRFLOW_CONN_AVSIM_S3"] = json.dumps(conn)
    env["AIRFLOW_HOME"] = str(tmp_path)
    first = subprocess.run(
        [sys.executable, str(ENSURE)], env=env, capture_output=True, text=True, timeout=300
    )
    assert first.returncode == 0, first.stderr
    bucket = airflow_env["AIRFLOW__AVSIM__ARTIFACT_ROOT"].split("@", 1)[1].split("/")[0]
    assert f"bucket {bucket} (connection avsim_s3): created" in first.stdout
    assert "wrote, read and deleted" in first.stdout
    s3 = boto3.client(
        "s3",
        endpoint_url=s3_server,
        aws_access_key_id="x",
        aws_secret_access_key="x",
        region_name="us-east-1",
    )
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount") == 0, "the probe object was left behind"

    # In this process (the step's functions, same connection): a second start finds the bucket, and a
    # store that does not answer fails the init with the reason and what to check.
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        if key.startswith(("AIRFLOW__AVSIM__", "AIRFLOW_CONN_")):
            monkeypatch.setenv(key, value)
    ensure = _ensure_module()
    assert ensure.ensure_bucket("avsim_s3", bucket) is False
    conn["extra"].update(endpoint_url="http://127.0.0.1:9", config_kwargs={"retries": {"max_attempts": 1}})
    monkeypatch.setenv("AIRFLOW_CONN_AVSIM_S3", json.dumps(conn))  # nothing listens on port 9
    assert ensure.main() == 1
    err = capsys.readouterr().err
    assert "is not usable" in err and "AIRFLOW_CONN_AVSIM_S3" in err


def test_init_script_runs_the_steps_in_order_with_real_commands() -> None:
    script = INIT.read_text()
    steps = [
        "airflow db migrate",
        "airflow users create",
        "avsim service-role sync",
        "--role avsim-service",
        "avsim pools sync",
        'python "${here}/ensure_artifact_store.py"',
    ]
    positions = [script.index(step) for step in steps]
    assert positions == sorted(positions)
    cfg = compose()
    assert cfg["services"]["airflow-init"]["command"] == ["bash", "/opt/avsim/docker/airflow-init.sh"]
    assert "set -euo pipefail" in script
    done = subprocess.run(["bash", "-n", str(INIT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_init_runs_an_avsim_command_that_exists() -> None:
    from typer.testing import CliRunner

    from avsim.cli import app

    groups = {getattr(g, "name", None) for g in app.registered_groups}
    if "pools" not in groups:
        pytest.skip("`avsim pools sync` is not in the CLI yet (added with the capacity file, issue 5)")
    done = CliRunner().invoke(app, ["pools", "sync", "--help"])
    assert done.exit_code == 0, done.output
    assert (ROOT / "dags" / "avsim_capacity.yaml").exists(), (
        "airflow-init syncs pools from dags/avsim_capacity.yaml"
    )


# ------------------------------------------------------------------------------ the image


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_image_matches_pyprojects_airflow_and_python() -> None:
    dockerfile = DOCKERFILE.read_text()
    m = re.search(
        r"^FROM apache/airflow:(?P<airflow>[\d.]+)-python(?P<python>\d+\.\d+)\s*$", dockerfile, re.M
    )
    assert m, "docker/Dockerfile must build FROM apache/airflow:<version>-python<x.y>"
    project = _pyproject()
    constraints = (ROOT / ".ci" / "constraints.txt").read_text()
    pinned = re.search(r"^apache-airflow==([\d.]+)$", constraints, re.M)
    assert pinned and m["airflow"] == pinned[1]
    assert f'"apache-airflow=={pinned[1]}"' in dockerfile  # pip may not move Airflow
    assert "apache-airflow>=3.3.0,<3.4" in project["project"]["dependencies"]
    assert f"--python-version {m['python']}" in constraints  # the pins CI tested were solved for it
    assert project["tool"]["mypy"]["python_version"] == m["python"]
    lowest = re.fullmatch(r">=(\d+\.\d+)", project["project"]["requires-python"])
    assert lowest and tuple(map(int, m["python"].split("."))) >= tuple(map(int, lowest[1].split(".")))
    assert "--constraint /opt/avsim/constraints.txt" in dockerfile
    assert re.search(r"^COPY .*\.ci/constraints\.txt /opt/avsim/constraints\.txt$", dockerfile, re.M)


def test_build_context_lets_in_exactly_what_the_dockerfile_copies() -> None:
    ignore = (ROOT / "docker" / "Dockerfile.dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert "*" in ignore, "start from nothing: .venv and .git must stay out of the context"
    sources = []
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY "):
            parts = [p for p in line.split()[1:] if not p.startswith("--")]
            sources += parts[:-1]
    assert sources
    for src in sources:
        assert src.rstrip("/") in allowed, f"{src} is copied but not let into the build context"
        assert (ROOT / src).exists(), src
    cfg = compose()
    for svc in airflow_services(cfg).values():
        assert svc["build"]["context"] == "."
