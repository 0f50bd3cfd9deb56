"""Admission by cases in flight on the real scheduler, dag-processor, triggerer and api-server (PostgreSQL).

Weeks with the shipped admission (``[avsim] cases_in_flight`` 0: the target derived from the pools,
which ``prepare`` reads through the REST API) and W = 6, on a scheduler declared slow (1 s per task
instance: it carries one case comfortably) so that the pools set the target. The old
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
from avsim.plan.admission import admission_shard_size
from avsim.plan.inflight import Pools, target_cases_in_flight
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
        extra_env={"AIRFLOW__AVSIM__SCHEDULER_MS_PER_TASK_INSTANCE": "1000"},
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

    # Each shard run's creation, and when each of its cases began ending (its report took its CPU slot,
    # which is when admission counts it as ending) and ended (every family ends on report).
    runs = dict(
        query(
            stack,
            "SELECT run_id, queued_at FROM dag_run WHERE dag_id = 'avsim_weekly_shard' AND run_id LIKE :p",
            p=f"{run_id}__shard_%",
        )
    )
    assert len(runs) == -(-CASES // shard_size)
    ends: dict[str, list[Any]] = {r: [] for r in runs}
    ending: dict[str, list[Any]] = {r: [] for r in runs}
    for r, queued, end in query(
        stack,
        "SELECT run_id, queued_dttm, end_date FROM task_instance WHERE dag_id = 'avsim_weekly_shard' "
        "AND run_id LIKE :p AND task_id LIKE '%.report' AND map_index >= 0 AND state = 'success'",
        p=f"{run_id}__shard_%",
    ):
        ends[r].append(end)
        ending[r].append(queued or end)
    assert sum(len(v) for v in ends.values()) == CASES
    overlapping = early = 0
    for r, created in runs.items():
        before = [other for other, at in runs.items() if at < created]
        in_flight = sum(1 for other in before for at in ending[other] if at > created)
        # Admitted only while fewer than the target were unfinished (a case whose report held its slot
        # counting as ending): never more than a shard above it.
        assert in_flight < target, (r, in_flight, target)
        early += sum(
            1
            for other in before
            for at, end in zip(ending[other], ends[other], strict=True)
            if at < created < end
        )
        overlapping += any(max(ends[other]) > created for other in before)
    assert overlapping, "every shard run started after the earlier ones ended: whole runs, not cases"
    print(f"\ncases whose report still ran when a later shard run was created: {early}")
    assert early, "no shard run was created while the cases it replaced were in their reports"
    # Room comes from cases that end, not from shard runs that end: some shard run was created while
    # the shard runs before it still in progress held the target or more (their finished cases counted).
    ended_at = dict(
        query(
            stack,
            "SELECT run_id, end_date FROM dag_run WHERE dag_id = 'avsim_weekly_shard' AND run_id LIKE :p",
            p=f"{run_id}__shard_%",
        )
    )
    held = {
        r: sum(len(ends[o]) for o, at in runs.items() if at < created and ended_at[o] > created)
        for r, created in runs.items()
    }
    assert max(held.values()) >= target, (held, target)

    # Some shards waited for room, deferred on the admission trigger, and were admitted later.
    logs = "\n".join(
        p.read_text(errors="replace")
        for p in Path(stack.home, "logs").rglob("*.log")
        if "task_id=shard_start" in str(p) and f"run_id={run_id}" in str(p)
    )
    assert "waiting for room" in logs
    # Admitted, the trigger created the shard run itself and ended the task (no worker resumed it).
    assert any(
        "avsim.triggers.admission.ShardAdmissionTrigger" in line and "created" in line
        for line in logs.splitlines()
    ), "no shard run was created by its admission trigger"


def _runs_in_progress(stack: LocalStack, run_id: str) -> list[tuple[Any, Any]]:
    """(created, ended) of each shard run of the week."""
    return list(
        query(
            stack,
            "SELECT queued_at, end_date FROM dag_run WHERE dag_id = 'avsim_weekly_shard' AND run_id LIKE :p",
            p=f"{run_id}__shard_%",
        )
    )


@pytest.mark.long  # its own stack and a week held by hung phases, about 4 minutes on 2 cores
def test_stragglers_holding_w_shard_runs_do_not_keep_the_next_from_starting(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """W = 2 and a target of every case (30): the first GPU case of each of the week's 3 shard runs
    hangs in simulate until its 60 s lease expires, so each shard run is held by one straggler. The
    mapped ``shards`` task held one of W slots per shard run until the run ended, so the third shard
    run waited for a straggler whatever the room; now only the starts are capped and all three run
    at once."""
    doc = sample_manifest(
        30, time_scale=0.00002, scenario_fail_rate=0.0, crash_rate=0.0, canary={"enabled": False}, seed=37
    )
    for graph in doc["graphs"].values():
        for phase in graph["phases"].values():
            phase.update(heartbeat_seconds=1, lease_seconds=60)
    size = admission_shard_size(30, 30, 250)
    assert size == 10
    for first in range(0, 30, size):
        case = next(
            c for c in doc["cases"][first : first + size] if c["graph"] in ("standard", "with_render")
        )
        case["parameters"]["fakesim"] = {"simulate": "hang_once"}
    run_id = "it__stragglers"
    with weekly_stack(
        tmp_path_factory.mktemp("stragglers"), shard_size=250, max_active_shards=2, cases_in_flight=30
    ) as stack:
        manifest_path = stack.home / "stragglers.json"
        manifest_path.write_text(json.dumps(doc))
        trigger(stack, "avsim_weekly", run_id, {"manifest": str(manifest_path)})
        assert wait_for_run(stack, "avsim_weekly", run_id, timeout=1200) == "success"
        assert run_descriptor(stack, run_id)["shard_size"] == size
        runs = sorted(_runs_in_progress(stack, run_id))
    assert len(runs) == 3
    most = max(sum(1 for c, e in runs if c <= at < e) for at, _ in runs)
    assert most == 3, f"at most {most} shard runs in progress at once while stragglers held them (W = 2)"
    # The third started beside the first two, not after a straggler's lease.
    assert (runs[2][0] - runs[0][0]).total_seconds() < 45, runs
