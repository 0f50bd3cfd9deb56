"""docs/install.md, followed literally: the wheel built from this checkout, installed into a fresh
Airflow 3.3 deployment (its own venv, Airflow home and PostgreSQL database), then a 10-case week.

The "existing deployment" is made first, as a team would have it: Airflow with the postgres extra and
the FAB provider under .ci/constraints.txt, the FAB auth manager, LocalExecutor, a migrated database.
Then every ``bash`` block of docs/install.md runs, in order, in one shell, from a copy of this
checkout; the checks read what those blocks print. Then the four components start, with the
environment the blocks left, and the week the last block triggered must succeed.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy
from tests.install.venvs import ROOT, make_venv
from tests.support.postgres import postgres_cluster

from avsim.devstack.stack import free_port

pytestmark = pytest.mark.install
DOC = ROOT / "docs" / "install.md"
COMPONENTS = ("scheduler", "dag-processor", "triggerer", "api-server")
RUN_ID = "avsim-first-week"


def doc_blocks() -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```$", DOC.read_text(), re.M | re.S)


def _checkout(target: Path) -> Path:
    """This checkout's files the wheel is built from (the working tree, not a commit)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "provider", target / "provider", ignore=ignore)
    (target / "dags").mkdir()
    (target / ".ci").mkdir()
    for name in (
        "pyproject.toml",
        "README.md",
        "LICENSE",
        "dags/avsim_graphs.yaml",
        "dags/avsim_capacity.yaml",
        ".ci/constraints.txt",
    ):
        shutil.copy(ROOT / name, target / name)
    return target


def _deployment_env(base: Path, bin_dir: Path, conn: str, port: int) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PYTEST", "VIRTUAL_ENV"))}
    secret = base64.urlsafe_b64encode(os.urandom(32)).decode()
    return {
        **keep,
        "PATH": f"{bin_dir}:{keep.get('PATH', '/usr/bin:/bin')}",
        "AIRFLOW_HOME": str(base / "airflow"),
        "AVSIM_CONFIG": str(base / "config"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": conn,
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager",
        "AIRFLOW__CORE__FERNET_KEY": secret,
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API_AUTH__JWT_SECRET": secret,
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(base / "airflow" / "logs"),
    }


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    base = tmp_path_factory.mktemp("deployment")
    bin_dir = make_venv(
        base / "venv",
        "apache-airflow[postgres]",
        "apache-airflow-providers-fab",
        constraints=ROOT / ".ci" / "constraints.txt",
        seed=True,
    )
    with postgres_cluster(migrated=False) as conn:
        env = _deployment_env(base, bin_dir, conn, free_port())
        (base / "airflow" / "dags").mkdir(parents=True)
        subprocess.run([str(bin_dir / "airflow"), "db", "migrate"], env=env, check=True, capture_output=True)
        yield base, env


def _run_doc(base: Path, env: dict[str, str]) -> tuple[str, dict[str, str]]:
    """Every bash block of the doc in one shell; its output, and the environment it ends with."""
    checkout = _checkout(base / "checkout")
    script = ["set -euo pipefail"]
    for number, block in enumerate(doc_blocks(), 1):
        script += [f"echo '=== block {number}'", block]
    script.append(f"env -0 > {base / 'env-after'}")
    done = subprocess.run(
        ["bash", "-c", "\n".join(script)], cwd=checkout, env=env, capture_output=True, text=True, timeout=1200
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-6000:]
    after = dict(item.split("=", 1) for item in (base / "env-after").read_text().split("\0") if "=" in item)
    return done.stdout, after


def _start(base: Path, env: dict[str, str]) -> dict[str, subprocess.Popen[bytes]]:
    logs = base / "component-logs"
    logs.mkdir(exist_ok=True)
    procs = {}
    for name in COMPONENTS:
        with open(logs / f"{name}.log", "wb") as out:
            procs[name] = subprocess.Popen(
                ["airflow", name], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
    return procs


def _stop(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs.values():
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _run_state(conn: str, timeout: float) -> str | None:
    engine = sqlalchemy.create_engine(conn)
    deadline, state = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        with engine.connect() as c:
            state = c.execute(
                sqlalchemy.text("SELECT state FROM dag_run WHERE dag_id = 'avsim_weekly' AND run_id = :r"),
                {"r": RUN_ID},
            ).scalar()
        if state in ("success", "failed"):
            break
        time.sleep(2)
    return state


def test_the_doc_has_runnable_steps_in_the_order_a_deployment_takes_them() -> None:
    joined = "\n".join(doc_blocks())
    steps = [
        "pip install",
        "AIRFLOW__AVSIM__GRAPH_CATALOG",
        "avsim_dags.py",
        "avsim pools sync",
        "avsim service-role sync",
        "airflow connections add avsim_airflow_api",
        "airflow providers get airflow-provider-avsim",
        "airflow plugins",
        "airflow dags list",
        "airflow dags trigger avsim_weekly",
    ]
    positions = [joined.find(step) for step in steps]
    assert -1 not in positions, [s for s, p in zip(steps, positions, strict=True) if p < 0]
    assert positions == sorted(positions)


def test_following_the_doc_a_fresh_deployment_runs_a_week(deployment: tuple[Path, dict[str, str]]) -> None:
    base, env = deployment
    out, after = _run_doc(base, env)
    blocks = dict(re.findall(r"^=== block (\d+)\n(.*?)(?=^=== block |\Z)", out, re.M | re.S))
    (checks,) = [text for text in blocks.values() if "provider-avsim" in text and "avsim_weekly" in text]
    assert "airflow-provider-avsim" in checks and "0.1.0" in checks, checks
    assert re.search(r"^\s*avsim\b", checks, re.M) or "AvsimPlugin" in checks, "airflow plugins lists avsim"
    listed = set(re.findall(r"^(avsim_(?:weekly|adhoc)(?:_shard)?)\s+\|", checks, re.M))
    assert listed == {"avsim_weekly", "avsim_weekly_shard", "avsim_adhoc", "avsim_adhoc_shard"}
    # The lean install: no Celery, no matplotlib came with the core package.
    python = str(Path(env["PATH"].split(":")[0]) / "python")
    for absent in ("matplotlib", "airflow.providers.celery"):
        probe = subprocess.run([python, "-c", f"import {absent}"], capture_output=True, env=after)
        assert probe.returncode != 0, f"{absent} is installed by the core package"

    procs = _start(base, after)
    try:
        state = _run_state(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], timeout=900)
    finally:
        _stop(procs)
    logs = "".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in (base / "component-logs").iterdir()
    )
    assert state == "success", logs
    reports = list(Path(after["AIRFLOW__AVSIM__ARTIFACT_ROOT"].removeprefix("file://")).rglob("report.json"))
    assert reports, "the week wrote its report"
