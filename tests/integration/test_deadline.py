"""The deadline on a real stack: the weekly DAG with its Deadline Alert and its deadline tracker.

PostgreSQL, scheduler, dag-processor, triggerer and API server, the repository's DAGs and plugin:
the weekly DAG carries ``deadline=deadline_alert(settings)`` and ``prepare >> deadline_tracker(...)
>> report``. Phases are the fake simulator's real processes. The tracker acts through the stack's
own REST API.

One weekly run of 8 cases (2 in the canary, 2 shards of 3) with:
- a run conf ``deadline`` 20 seconds away: the run misses it, the scheduler marks the deadline
  missed and the triggerer runs the callback, which records ``deadline/missed.json``;
- a manifest deadline an hour away, while the planned work (the catalog's 30-minute simulations)
  needs more GPUs than the pools hold: the tracker finds the run late and raises the GPU spot
  pool, within ``deadline_max_gpu_slots``.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.support.airflow_run import api, query, wait_for_run
from tests.support.postgres import postgres_cluster
from tests.support.stacks import fast_retry_catalog

from avsim.artifacts import RunLayout, run_key_for
from avsim.devstack.demo import wait_for_dag
from avsim.devstack.stack import LocalStack, free_port
from avsim.manifest.sample import sample_manifest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MAX_GPU_SLOTS = 6


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    base = tmp_path_factory.mktemp("deadline")
    catalog = fast_retry_catalog(base / "graphs.yaml")
    port = free_port()
    with postgres_cluster() as url:
        s = LocalStack(
            home=base / "airflow",
            dags_folder=ROOT / "dags",
            plugins_folder=ROOT / "plugins",
            sql_alchemy_conn=url,
            port=port,
            extra_env={
                "AIRFLOW__AVSIM__SHARD_SIZE": "3",
                "AIRFLOW__AVSIM__MAX_ACTIVE_SHARDS": "2",
                # Admission keeps the window's shape here (shard runs of 3, W binds): the pools the
                # tracker raises would otherwise size the week's shard runs, which this test counts.
                "AIRFLOW__AVSIM__CASES_IN_FLIGHT": "18",
                "AIRFLOW__AVSIM__SHARD_POLL_SECONDS": "1",
                "AIRFLOW__AVSIM__GRAPH_CATALOG": str(catalog),
                "AIRFLOW__AVSIM__DEADLINE_INTERVAL_SECONDS": "5",
                # Parse each DAG file once: these DAGs do not change during the test.
                "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "3600",
                "AIRFLOW__AVSIM__DEADLINE_DEFAULT_HOURS": "30",
                "AIRFLOW__AVSIM__DEADLINE_API_CONN_ID": "airflow_api",
                "AIRFLOW__AVSIM__DEADLINE_MAX_GPU_SLOTS": str(MAX_GPU_SLOTS),
                # The stack runs the simple auth manager with every user an admin: no credentials.
                "AIRFLOW_CONN_AIRFLOW_API": json.dumps(
                    {"conn_type": "http", "host": "127.0.0.1", "port": port}
                ),
            },
        )
        capacity = base / "capacity.yaml"
        capacity.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "avsim/v1",
                    "kind": "Capacity",
                    "gpu_spot": {"gpus": 2},
                    "gpu_on_demand": {"gpus": 1},
                    "cpu": {"slots": 8},
                }
            )
        )
        synced = subprocess.run(
            [sys.executable, "-m", "avsim.cli", "pools", "sync", str(capacity)],
            env=s.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert synced.returncode == 0, synced.stderr
        s.start()
        try:
            wait_for_dag(s, "avsim_weekly")
            wait_for_dag(s, "avsim_weekly_shard")
            yield s
        finally:
            s.stop()


def _read(uri: str) -> Any:
    return json.loads(Path(uri.removeprefix("file://")).read_text())


def _trigger(stack: LocalStack, run_id: str, conf: dict[str, Any]) -> None:
    api(
        stack,
        "POST",
        "/api/v2/dags/avsim_weekly/dagRuns",
        {"dag_run_id": run_id, "logical_date": None, "conf": conf},
    )


def test_a_late_week_is_tracked_scaled_and_alerted(stack: LocalStack) -> None:
    now = dt.datetime.now(dt.UTC)
    doc = sample_manifest(
        8, time_scale=0.00002, scenario_fail_rate=0.0, crash_rate=0.0, deadline=now + dt.timedelta(hours=1)
    )
    doc["run"]["canary"] = {"enabled": True, "share": 0.25, "min_cases": 2}
    manifest = stack.home / "week.json"
    manifest.write_text(json.dumps(doc))
    alert_at = now + dt.timedelta(seconds=20)
    run_id = "it__deadline"
    _trigger(stack, run_id, {"manifest": str(manifest), "deadline": alert_at.isoformat()})
    assert wait_for_run(stack, "avsim_weekly", run_id, timeout=1200) == "success"

    # The Deadline Alert: the deadline came from the run's conf, was missed, and the callback ran.
    [(deadline_time, missed, callback_state)] = query(
        stack,
        "SELECT d.deadline_time, d.missed, c.state FROM deadline d JOIN dag_run r ON r.id = d.dagrun_id "
        "JOIN callback c ON c.id = d.callback_id WHERE r.run_id = :r",
        r=run_id,
    )
    assert abs((deadline_time - alert_at).total_seconds()) < 1
    assert missed and callback_state == "success"
    layout = RunLayout(f"file://{stack.home / 'artifacts'}", run_key_for("avsim_weekly", run_id))
    miss = _read(f"{layout.deadline_dir}/missed.json")
    assert miss["run_id"] == run_id and miss["seconds_late"] > 0
    assert dt.datetime.fromisoformat(miss["deadline"]) == deadline_time

    # The tracker: ran beside the shards, ended with them, recorded every pass.
    [(tracker_state,)] = query(
        stack,
        "SELECT state FROM task_instance WHERE dag_id = 'avsim_weekly' AND run_id = :r AND task_id = 'deadline_tracker'",
        r=run_id,
    )
    assert tracker_state == "success"
    latest = _read(layout.deadline_latest)
    assert latest["status"] == "done" and latest["cases_left"] == 0
    assert latest["shard_runs"] == {"total": 3, "finished": 3}
    assert latest["deadline"] == dt.datetime.fromisoformat(doc["run"]["deadline"]).isoformat()
    history = sorted(Path(layout.deadline_dir.removeprefix("file://"), "history").glob("*.json"))
    assert len(history) >= 2
    first = json.loads(history[0].read_text())
    assert first["late"] and first["gpus_needed"] > 3, first

    # It acted: the spot pool grew toward the GPUs needed, never past its bound.
    actions = sorted(Path(layout.deadline_dir.removeprefix("file://"), "actions").glob("*.json"))
    assert actions, "the tracker found the run late but did not act"
    results = json.loads(actions[0].read_text())["results"]
    assert [(r["action"], r["outcome"], r["before"]) for r in results] == [("pool_slots", "raised", 2)]
    [(slots,)] = query(stack, "SELECT slots FROM slot_pool WHERE pool = 'avsim_gpu_spot'")
    assert 2 < slots <= MAX_GPU_SLOTS and slots == max(
        json.loads(a.read_text())["results"][0]["after"] for a in actions
    )
    assert "avsim_gpu_spot 2 -> " in latest["action"]


def test_without_a_conf_deadline_the_default_applies(stack: LocalStack) -> None:
    run_id = "it__default_deadline"
    _trigger(stack, run_id, {"manifest": str(stack.home / "missing.json")})
    [(deadline_time, run_after)] = query(
        stack,
        "SELECT d.deadline_time, r.run_after FROM deadline d JOIN dag_run r ON r.id = d.dagrun_id WHERE r.run_id = :r",
        r=run_id,
    )
    assert deadline_time - run_after == dt.timedelta(hours=30)
    assert wait_for_run(stack, "avsim_weekly", run_id, timeout=300) == "failed"  # no such manifest
