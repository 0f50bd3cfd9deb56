"""Admission by cases in flight on the real scheduler, dag-processor, triggerer and api-server (PostgreSQL).

Weeks with the shipped admission (``[avsim] cases_in_flight`` 0: the target derived from the pools,
which ``prepare`` reads through the REST API) and W = 6, on a scheduler declared slow (100 ms per task
instance) so that the pools, not the cases the scheduler carries comfortably, set the target. The old
window would have started 6 shard runs at once; admission must never hold more unfinished cases than
its target plus a shard run (a shard run starts while fewer than the target are unfinished), must
start shard runs while earlier ones still run, and must have made some shards wait;
and stragglers holding W shard runs must not keep the next ones from starting.
Nothing is mocked: the phases are real processes of the fake simulator.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.support.airflow_run import query, run_descriptor, trigger, wait_for_run
from tests.support.stacks import weekly_stack

from avsim.devstack.stack import LocalStack
from avsim.manifest.models import Manifest
from avsim.manifest.sample import sample_manifest
from avsim.plan.admission import Pools, target_cases_in_flight
from avsim.plan.admit import admission_shard_size
from avsim.planner.workload import workload_from_manifest

pytestmark = pytest.mark.integration

CASES = 20
GPUS, CPUS = 4, 8


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    with weekly_stack(
        tmp_path_factory.mktemp("admission"),
        shard_size=250,
        max_active_shards=6,
        cases_in_flight=0,
        gpus=GPUS,
        cpus=CPUS,
        extra_env={"AIRFLOW__AVSIM__SCHEDULER_MS_PER_TASK_INSTANCE": "100"},
    ) as s:
        yield s


def test_a_week_keeps_its_cases_in_flight_under_the_target_the_pools_give(stack: LocalStack) -> None:
    doc = sample_manifest(
        CASES, time_scale=0.00002, scenario_fail_rate=0.0, crash_rate=0.0, canary={"enabled": False}
    )
    manifest = stack.home / "week.json"
    manifest.write_text(json.dumps(doc))
    run_id = "it__admission"
    trigger(stack, "avsim_weekly", run_id, {"manifest": str(manifest)})
    assert wait_for_run(stack, "avsim_weekly", run_id, timeout=900) == "success"

    # prepare read the pools through the REST API and derived the target from them.
    run = run_descriptor(stack, run_id)
    admission = run["admission"]
    assert (admission["spot_gpus"], admission["cpus"], admission["configured"]) == (GPUS, CPUS, 0)
    load = workload_from_manifest(Manifest.model_validate(doc)).case_load()
    target = target_cases_in_flight(load, Pools(spot_gpus=GPUS, cpus=CPUS))
    assert admission["target"] == target > admission["floor"]
    shard_size = admission_shard_size(CASES, target, 250)
    assert run["shard_size"] == shard_size and shard_size < CASES
    assert target + shard_size < 6 * shard_size, "the old window of W = 6 would have held more"

    # Each shard run's creation and its cases' ends (every family ends on report).
    runs = dict(
        query(
            stack,
            "SELECT run_id, queued_at FROM dag_run WHERE dag_id = 'avsim_weekly_shard' AND run_id LIKE :p",
            p=f"{run_id}__shard_%",
        )
    )
    assert len(runs) == -(-CASES // shard_size)
    ends: dict[str, list[Any]] = {r: [] for r in runs}
    for r, end in query(
        stack,
        "SELECT run_id, end_date FROM task_instance WHERE dag_id = 'avsim_weekly_shard' AND run_id LIKE :p "
        "AND task_id LIKE '%.report' AND map_index >= 0 AND state = 'success'",
        p=f"{run_id}__shard_%",
    ):
        ends[r].append(end)
    assert sum(len(v) for v in ends.values()) == CASES
    overlapping = 0
    for r, created in runs.items():
        before = [other for other, at in runs.items() if at < created]
        in_flight = sum(1 for other in before for end in ends[other] if end > created)
        # Admitted only while fewer than the target were unfinished: never more than a shard above it.
        assert in_flight < target, (r, in_flight, target)
        overlapping += any(max(ends[other]) > created for other in before)
    assert overlapping, "every shard run started after the earlier ones ended: whole runs, not cases"

    # Some shards waited for room, deferred on the admission trigger, and were admitted later.
    logs = "\n".join(
        p.read_text(errors="replace")
        for p in Path(stack.home, "logs").rglob("*.log")
        if "task_id=shard_start" in str(p) and f"run_id={run_id}" in str(p)
    )
    assert "waiting for room" in logs and "admission: admitted" in logs


def _runs_in_progress(stack: LocalStack, run_id: str) -> list[tuple[Any, Any]]:
    """(created, ended) of each shard run of the week."""
    return list(
        query(
            stack,
            "SELECT queued_at, end_date FROM dag_run WHERE dag_id = 'avsim_weekly_shard' AND run_id LIKE :p",
            p=f"{run_id}__shard_%",
        )
    )


@pytest.mark.long  # a 40-case week held by hung phases, a few minutes on 2 cores
def test_stragglers_holding_w_shard_runs_do_not_keep_the_next_from_starting(stack: LocalStack) -> None:
    """The first case of every shard run hangs in simulate until its 20 s lease expires, then passes on
    its retry: every shard run is held by one straggler while its other cases are done. W = 6 capped
    the shard tasks, so no 7th shard run could start while 6 stragglers waited, whatever the room;
    now shard runs start whenever the week's cases in flight leave room."""
    doc = sample_manifest(
        40, time_scale=0.00002, scenario_fail_rate=0.0, crash_rate=0.0, canary={"enabled": False}, seed=37
    )
    for graph in doc["graphs"].values():
        for phase in graph["phases"].values():
            phase.update(heartbeat_seconds=1, lease_seconds=20)
    manifest_path = stack.home / "stragglers.json"
    manifest_path.write_text(json.dumps(doc))  # to read the shard size the week is cut into
    run_id = "it__stragglers"
    load = workload_from_manifest(Manifest.model_validate(doc)).case_load()
    size = admission_shard_size(40, target_cases_in_flight(load, Pools(spot_gpus=GPUS, cpus=CPUS)), 250)
    # The first case with a simulate phase in every shard run hangs once (cases are cut in order).
    for first in range(0, 40, size):
        case = next(
            (c for c in doc["cases"][first : first + size] if c["graph"] in ("standard", "with_render")), None
        )
        if case is not None:
            case["parameters"]["fakesim"] = {"simulate": "hang_once"}
    manifest_path.write_text(json.dumps(doc))
    trigger(stack, "avsim_weekly", run_id, {"manifest": str(manifest_path)})
    assert wait_for_run(stack, "avsim_weekly", run_id, timeout=1200) == "success"
    assert run_descriptor(stack, run_id)["shard_size"] == size

    runs = _runs_in_progress(stack, run_id)
    assert len(runs) == -(-40 // size) > 6
    most = max(sum(1 for c, e in runs if c <= at < e) for at, _ in runs)
    assert most > 6, f"at most {most} shard runs in progress at once while stragglers held them"
