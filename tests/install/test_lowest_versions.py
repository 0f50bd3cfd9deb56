"""The lowest supported set: Airflow 3.3.0 and the lowest versions pyproject.toml declares.

A fresh venv from .ci/constraints-lowest.txt (uv's lowest-direct resolution of pyproject.toml with
every extra) runs the tests of what avsim takes from Airflow and the providers, and a 10-case week
on the real scheduler (tests/install/week_check.py). `make test` runs the pinned latest set.
"""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from tests.install.venvs import ROOT, installed_version, make_venv

pytestmark = pytest.mark.install
LOWEST = ROOT / ".ci" / "constraints-lowest.txt"
#: The tests of what avsim takes from Airflow and each provider it uses.
PROVIDER_TESTS = (
    "tests/unit/test_airflow_internals.py",
    "tests/unit/test_airflow_internals_kpo.py",
    "tests/unit/test_dags.py",
    "tests/unit/ledger/test_store.py",
    "tests/unit/deadline/test_actions.py",
    "tests/unit/report/test_build_files.py",
    "tests/unit/test_service_role.py",
    "tests/k8s",
)


def _floors() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found = {}
    for req in project["dependencies"] + [
        r for extra in ("celery", "fab") for r in project["optional-dependencies"][extra]
    ]:
        m = re.match(r"^(apache-airflow[a-z-]*)(?:\[[^]]*\])?>=([\d.]+)", req)
        if m:
            found[m[1]] = m[2]
    return found


@pytest.fixture(scope="module")
def lowest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_venv(
        tmp_path_factory.mktemp("lowest") / "venv",
        "-e",
        ".[postgres,report,celery,fab]",
        "pytest",
        "pytest-timeout",
        "hypothesis",
        "moto[server]",
        "kubernetes-validate",
        constraints=LOWEST,
    )


def test_the_venv_holds_the_lowest_declared_versions(lowest: Path) -> None:
    floors = _floors()
    assert floors["apache-airflow"] == "3.3.0"
    assert {name: installed_version(lowest, name) for name in floors} == floors


def _pytest(bin_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PYTEST"))}
    return subprocess.run(
        [
            str(bin_dir / "python"),
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--disable-warnings",
            "-rf",
            *args,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )


def test_what_avsim_takes_from_airflow_and_the_providers_is_there(lowest: Path) -> None:
    done = _pytest(lowest, *PROVIDER_TESTS)
    assert done.returncode == 0, done.stdout[-6000:]


def test_a_ten_case_week_runs_on_the_lowest_set(lowest: Path) -> None:
    done = _pytest(lowest, "tests/install/week_check.py")
    assert done.returncode == 0, done.stdout[-8000:]
