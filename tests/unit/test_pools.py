"""``avsim pools sync``: a strict capacity file, and pools written to a real Airflow metadata database."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy
import yaml

from avsim.pools import CapacityError, desired_pools, load_capacity, parse_capacity
from avsim.settings import AvsimSettings

ROOT = Path(__file__).resolve().parents[2]
GOOD = {
    "apiVersion": "avsim/v1",
    "kind": "Capacity",
    "gpu_spot": {"gpus": 24},
    "gpu_on_demand": {"gpus": 4},
    "cpu": {"slots": 40},
}


def _problems(doc: object) -> list[str]:
    with pytest.raises(CapacityError) as err:
        parse_capacity(doc, "cap.yaml")
    return [str(p) for p in err.value.problems]


def test_the_example_capacity_file_is_valid() -> None:
    cap = load_capacity(ROOT / "dags" / "avsim_capacity.yaml")
    specs = desired_pools(cap, AvsimSettings())
    assert [(s.name, s.slots, s.include_deferred) for s in specs] == [
        ("avsim_gpu_spot", 240, True),
        ("avsim_gpu_on_demand", 40, True),
        ("avsim_cpu", 400, True),
    ]


def test_pool_names_come_from_settings() -> None:
    settings = AvsimSettings(gpu_spot_pool="g_spot", gpu_on_demand_pool="g_od", cpu_pool="c")
    doc = {**GOOD, "cpu": {"slots": 40, "description": "CPU phases of the weekly run"}}
    specs = desired_pools(parse_capacity(doc), settings)
    assert [(s.name, s.slots) for s in specs] == [("g_spot", 24), ("g_od", 4), ("c", 40)]
    assert specs[2].description == "CPU phases of the weekly run"


def test_every_problem_is_named_by_its_field() -> None:
    doc = {
        "apiVersion": "avsim/v2",
        "kind": "Capacity",
        "gpu_spot": {"gpus": "24"},
        "gpu_on_demand": {"gpus": -1, "gpu": 3},
        "cpus": {"slots": 40},
    }
    assert sorted(_problems(doc)) == sorted(
        [
            "apiVersion: must be 'avsim/v1', got 'avsim/v2'",
            "gpu_spot.gpus: must be a whole number, got '24'",
            "gpu_on_demand.gpus: must be between 0 and 1000000, got -1",
            "gpu_on_demand.gpu: unknown field; known: description, gpus",
            "cpu: required; add it (see dags/avsim_capacity.yaml)",
            "cpus: unknown field; known: apiVersion, cpu, gpu_on_demand, gpu_spot, kind",
        ]
    )


def test_a_float_is_not_a_slot_count_and_a_list_is_not_a_file() -> None:
    assert _problems({**GOOD, "cpu": {"slots": 40.0}}) == ["cpu.slots: must be a whole number, got 40.0"]
    assert _problems([GOOD]) == ["must be a mapping, got list"]


def test_unreadable_and_broken_files_say_so(tmp_path: Path) -> None:
    with pytest.raises(CapacityError, match=r"(?s)nope.yaml was rejected.*cannot be read: No such file"):
        load_capacity(tmp_path / "nope.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("gpu_spot: [\n")
    with pytest.raises(CapacityError, match="is not valid YAML"):
        load_capacity(broken)


# ------------------------------------------------------------------ against a real metadata database


@pytest.fixture(scope="module")
def airflow_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A migrated SQLite metadata database of its own; yields the environment that points at it."""
    home = tmp_path_factory.mktemp("pools-airflow")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }
    airflow = str(Path(sys.executable).with_name("airflow"))
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=600)
    yield env


def _avsim(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "avsim.cli", "pools", "sync", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _pools(env: dict[str, str]) -> dict[str, tuple[int, bool, str]]:
    engine = sqlalchemy.create_engine(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    with engine.connect() as c:
        rows = c.execute(sqlalchemy.text("SELECT pool, slots, include_deferred, description FROM slot_pool"))
        return {r[0]: (r[1], bool(r[2]), r[3]) for r in rows}


def test_sync_creates_updates_and_is_idempotent(airflow_db: dict[str, str], tmp_path: Path) -> None:
    env = airflow_db
    engine = sqlalchemy.create_engine(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    with engine.begin() as c:  # a pool someone made by hand, deferred tasks not counted
        c.execute(
            sqlalchemy.text(
                "INSERT INTO slot_pool (pool, slots, description, include_deferred) "
                "VALUES ('avsim_cpu', 8, 'by hand', false)"
            )
        )
    cap = tmp_path / "cap.yaml"
    cap.write_text(yaml.safe_dump(GOOD))

    dry = _avsim(env, str(cap), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "(dry run) created avsim_gpu_spot: slots 24" in dry.stdout
    assert "avsim_gpu_spot" not in _pools(env), "a dry run changes nothing"

    first = _avsim(env, str(cap))
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    assert lines[0].startswith("created avsim_gpu_spot: slots 24, description ")
    assert lines[1].startswith("created avsim_gpu_on_demand: slots 4")
    assert lines[2] == (
        "updated avsim_cpu: slots 8 -> 40, description 'by hand' -> 'avsim CPU phases (one slot per phase)', "
        "include_deferred False -> True"
    )
    pools = _pools(env)
    assert {k: v[:2] for k, v in pools.items() if k.startswith("avsim_")} == {
        "avsim_gpu_spot": (24, True),
        "avsim_gpu_on_demand": (4, True),
        "avsim_cpu": (40, True),
    }
    assert pools["default_pool"][0] == 128, "pools not in the file are left alone"

    again = _avsim(env, str(cap))
    assert again.stdout.splitlines() == [
        "unchanged avsim_gpu_spot",
        "unchanged avsim_gpu_on_demand",
        "unchanged avsim_cpu",
    ]

    cap.write_text(yaml.safe_dump({**GOOD, "gpu_spot": {"gpus": 32}}))
    grown = _avsim(env, str(cap))
    assert grown.stdout.splitlines()[0] == "updated avsim_gpu_spot: slots 24 -> 32"
    assert _pools(env)["avsim_gpu_spot"][0] == 32


def test_sync_refuses_a_bad_file_and_changes_nothing(airflow_db: dict[str, str], tmp_path: Path) -> None:
    before = _pools(airflow_db)
    cap = tmp_path / "bad.yaml"
    cap.write_text(yaml.safe_dump({**GOOD, "gpu_spot": {"gpus": "many"}}))
    done = _avsim(airflow_db, str(cap))
    assert done.returncode == 1
    assert "gpu_spot.gpus: must be a whole number, got 'many'" in done.stderr
    assert _pools(airflow_db) == before
