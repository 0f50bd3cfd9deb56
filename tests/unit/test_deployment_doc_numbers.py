"""docs/deployment.md and docker-compose.yml agree: every setting, number, port and path the doc
states about the compose stack is what the compose file (and its capacity file) says, the pools
fit the stack's worker, and ``.env`` stays out of git. Read from the files; nothing is started.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml
from tests.support import compose
from tests.support.deployment_doc import first_run_steps

ROOT = compose.ROOT
DOC = ROOT / "docs" / "deployment.md"
CAPACITY = ROOT / "docker" / "avsim_capacity.yaml"
SECRETS = {
    name: "x"
    for name in (
        "POSTGRES_PASSWORD",
        "AIRFLOW_FERNET_KEY",
        "AIRFLOW_JWT_SECRET",
        "AIRFLOW_API_SECRET_KEY",
        "AVSIM_S3_SECRET_KEY",
        "AVSIM_ADMIN_PASSWORD",
        "AVSIM_SERVICE_PASSWORD",
    )
}


@pytest.fixture(scope="module")
def cfg() -> dict[str, Any]:
    return compose.load(SECRETS)


@pytest.fixture(scope="module")
def doc() -> str:
    return " ".join(DOC.read_text().split())  # one line: a statement may wrap anywhere


@pytest.fixture(scope="module")
def env(cfg: dict[str, Any]) -> dict[str, str]:
    return compose.shared_env(cfg)


def _number(text: str) -> str:
    return text.replace(",", "")


def test_every_setting_the_doc_gives_a_value_is_composes(doc: str, env: dict[str, str]) -> None:
    """`[section] option` (value), the doc's way of stating what the stack sets."""
    stated = re.findall(r"`\[(\w+)\] (\w+)` \(([\w.,]+)\)", doc)
    names = {f"[{s}] {o}" for s, o, _ in stated}
    assert {"[core] parallelism", "[celery] worker_concurrency"} <= names, names
    for section, option, value in stated:
        key = f"AIRFLOW__{section.upper()}__{option.upper()}"
        assert key in env, f"the doc states [{section}] {option} ({value}); compose does not set it"
        assert _number(value) == env[key], f"[{section}] {option}: the doc says {value}, compose {env[key]}"


def test_the_settings_table_states_composes_values(doc: str, env: dict[str, str]) -> None:
    m = re.search(
        r"`\[core\] max_map_length` \| at least `\[avsim\] shard_size` \(the stack: ([\d,]+)\)", doc
    )
    assert m and _number(m[1]) == env["AIRFLOW__CORE__MAX_MAP_LENGTH"]
    m = re.search(r"shard runs of at most (\d+), (\d+) active", doc)
    assert m and (m[1], m[2]) == (env["AIRFLOW__AVSIM__SHARD_SIZE"], env["AIRFLOW__AVSIM__MAX_ACTIVE_SHARDS"])
    m = re.search(r"`\[scheduler\] max_tis_per_query` \| (\d+) \|", doc)
    assert m and m[1] == env["AIRFLOW__SCHEDULER__MAX_TIS_PER_QUERY"]
    assert f"`{env['AIRFLOW__AVSIM__DEFAULT_MANIFEST']}`" in doc
    root = env["AIRFLOW__AVSIM__ARTIFACT_ROOT"]
    for uri in set(re.findall(r"s3://avsim_s3@[\w.-]+", doc)):
        assert root.startswith(uri + "/"), f"{uri}: compose's bucket is {root}"


def test_the_secrets_the_doc_lists_are_the_ones_compose_requires(doc: str) -> None:
    listed = re.search(r"The file refuses to render without its secrets \(([^)]*)\)", doc)
    assert listed, "the doc no longer lists the secrets"
    required = set(re.findall(r"\$\{(\w+):\?", compose.COMPOSE.read_text()))
    assert set(re.findall(r"`(\w+)`", listed[1])) == required == set(SECRETS)


def test_the_services_versions_and_ports_are_composes(doc: str, cfg: dict[str, Any]) -> None:
    services = cfg["services"]
    for name in ("postgres", "redis"):
        m = re.search(rf"\| `{name}` \| `([\w.:/-]+)` \|", doc)
        assert m and services[name]["image"].startswith(m[1] + "-"), (name, m and m[1])
    airflow = re.search(r"^FROM apache/airflow:([\d.]+)-", (ROOT / "docker" / "Dockerfile").read_text(), re.M)
    assert airflow and f"`docker-compose.yml` runs Airflow {airflow[1]}" in doc
    assert "S3 API on `s3:9000`" in doc and "http://s3:9000" in compose.shared_env(cfg)["AWS_ENDPOINT_URL"]
    assert "console on `localhost:9001`" in doc and any(
        str(p).endswith(":9001:9001") for p in services["s3"]["ports"]
    )
    assert "(`localhost:8080`)" in doc and str(services["airflow-api-server"]["ports"][0]).endswith(":8080")
    assert "`:8974/health`" in doc and "8974/health" in " ".join(
        services["airflow-scheduler"]["healthcheck"]["test"]
    )
    m = re.search(r"`stop_grace_period` \((\w+)\) gives a stopping worker five minutes", doc)
    assert m and m[1] == services["airflow-worker"]["stop_grace_period"] == "5m"


def _capacity() -> tuple[int, int, int]:
    c = yaml.safe_load(CAPACITY.read_text())
    return c["gpu_spot"]["gpus"], c["gpu_on_demand"]["gpus"], c["cpu"]["slots"]


def test_the_pools_init_syncs_fit_the_stacks_worker(
    doc: str, cfg: dict[str, Any], env: dict[str, str]
) -> None:
    init = compose.service_env(cfg, "airflow-init")
    mounted = compose.mounts(cfg, "airflow-init")
    assert mounted.get(init["AVSIM_CAPACITY_FILE"]) == CAPACITY, (
        "airflow-init must sync docker/avsim_capacity.yaml"
    )
    for service in cfg["services"]:
        if service.startswith("airflow-"):
            assert compose.mounts(cfg, service).get(init["AVSIM_CAPACITY_FILE"]) == CAPACITY, service
    spot, on_demand, cpu = _capacity()
    slots = int(env["AIRFLOW__CELERY__WORKER_CONCURRENCY"])
    # Every pool full at once still leaves worker slots for avsim's own tasks (prepare, summaries, report).
    assert 0 < spot + on_demand + cpu <= slots - 2
    assert (
        f"{spot} spot GPUs, {on_demand} on-demand GPUs and {cpu} CPU slots, {spot + on_demand + cpu} of its "
        f"{slots} slots" in doc
    )
    for path in re.findall(r"avsim pools sync (\S+?)`", doc):
        assert path == init["AVSIM_CAPACITY_FILE"], f"the doc syncs {path}"


def test_dotenv_is_ignored_by_git() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    for name in (".env", "docker/.env"):
        done = subprocess.run(["git", "check-ignore", "-q", name], cwd=ROOT, capture_output=True, timeout=30)
        assert done.returncode == 0, f"{name} (docker/new-env.sh's secrets) is not ignored"
    assert "ignore" in DOC.read_text() and "`.env`" in DOC.read_text()


def test_the_first_run_unpauses_the_weekly_dag_and_writes_the_manifest_to_the_bucket() -> None:
    commands = [step.command for step in first_run_steps()]
    unpause = commands.index("docker compose exec airflow-scheduler airflow dags unpause avsim_weekly")
    trigger = next(i for i, c in enumerate(commands) if "airflow dags trigger avsim_weekly" in c)
    assert unpause < trigger
    sample = next(c for c in commands if "avsim manifest sample" in c)
    assert re.search(r"--out s3://avsim_s3@", sample), "the manifest goes straight to the bucket"
    assert not [c for c in commands if "python -c" in c or "bash -c" in c]
