"""A week on the production topology (long tier): 60 cases with the chaos test's faults, a lost worker.

The distributed stack (:mod:`tests.support.distributed`, docker-compose.yml's topology as processes on
loopback: CeleryExecutor on redis-server, artifacts and task logs in S3, FAB, two workers with
nothing shared on disk) runs a 60-case week with the standard fault mix of
``tests/integration/test_chaos.py`` (crashes, preemptions, hangs, scenario failures at the same rates,
the same forced faults, zombie and duplicate reports injected at the ledger), while ``gpu-worker``
is killed with ``-9`` (its whole process tree) as it runs phases, and the deadline tracker, finding
the week late, raises the GPU spot pool through the REST API as avsim's service account.

Checks: the chaos audit (every case in its right class, no phase committed twice, no result lost,
budgets kept, zombie reports refused) with the killed tries' attempts allowed to end lost; the
weekly and shard runs in the states their ledger gives; the killed worker's tries failed there and
ran again on the other worker; every task ran on a worker of its queue; every ended phase try's log
read through the REST API as the viewer, from S3, the dead worker's included; the avsim page and
extra links open for the viewer and refuse without a login; the pool scaling made as the service
account. The figures are printed (``pytest -s``).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator

import pytest
from tests.support.airflow_run import query, wait_for_run
from tests.support.chaos import ChaosRates, ZombieReporter, chaos_manifest
from tests.support.chaos_audit import audit_week
from tests.support.distributed import ADMIN, DistributedStack
from tests.support.distributed_checks import (
    attempt_keys,
    call,
    check_pages_for_the_viewer,
    check_retried_elsewhere,
    check_routing,
    check_task_logs,
    kill_worker_holding_phases,
    save_task_logs,
    service_calls,
    week_stack,
)
from tests.support.verdicts import check_states_match_the_ledger

from avsim.artifacts import RunLayout, run_key_for

# The week alone takes 11 to 15 minutes on 2 cores, over the suite's 900 s per test.
pytestmark = [pytest.mark.integration, pytest.mark.distributed, pytest.mark.long, pytest.mark.timeout(2700)]

CASES = 60
RATES = ChaosRates(crash=0.08, preempt=0.12, hang=0.03, scenario_fail=0.08)  # test_chaos.py's
CAPACITY = (6, 2, 8)
MAX_GPU_SLOTS = 10


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DistributedStack]:
    with week_stack(tmp_path_factory.mktemp("distributed-week"), CAPACITY, MAX_GPU_SLOTS) as s:
        yield s


def test_a_chaotic_week_on_the_production_topology_loses_a_worker_and_keeps_every_promise(
    stack: DistributedStack,
) -> None:
    # A 30-minute simulate runs 3.6 s (long enough to be running when the worker dies); a hang is found
    # when its 8 s lease expires.
    doc = chaos_manifest(
        CASES,
        RATES,
        seed=4242,
        time_scale=0.002,
        heartbeat_seconds=1,
        lease_seconds=8,
        deadline=dt.datetime.now(dt.UTC) + dt.timedelta(hours=2),
    )
    run_id = "it__distributed_week"
    manifest = stack.upload(f"manifests/{run_id}.json", doc)
    layout = RunLayout(stack.artifact_root, run_key_for("avsim_weekly", run_id))
    reporter = ZombieReporter(layout, interval=1.0).start()
    started = time.monotonic()
    try:
        call(stack, "POST", "/api/v2/dags/avsim_weekly/dagRuns", ADMIN, {
            "dag_run_id": run_id, "logical_date": None, "conf": {"manifest": manifest},
        })  # fmt: skip
        lost_worker = kill_worker_holding_phases(stack, "gpu-worker", run_id, at_least=2, timeout=900)
        killed = lost_worker.tries
        state = wait_for_run(stack, "avsim_weekly", run_id, timeout=2400)  # type: ignore[arg-type]
    finally:
        reporter.stop()
    seconds = time.monotonic() - started
    assert state in ("success", "failed")
    verdict = check_states_match_the_ledger(stack, run_id, layout)  # type: ignore[arg-type]
    assert verdict["attention"] > 0 and state == "failed", verdict

    check_retried_elsewhere(stack, killed, "gpu-worker", "worker")
    audit = audit_week(
        stack,  # type: ignore[arg-type]
        run_id,
        layout,
        doc,
        reporter,
        seconds=seconds,
        rates=RATES,
        lost_tries=attempt_keys(stack, killed),
    )
    print("\n" + "\n".join(audit.lines()))
    if not audit.ok:
        saved = save_task_logs(stack, run_id, stack.base / "task-logs")
        print(f"{saved} phase task logs saved in {stack.base / 'task-logs'}")
    assert audit.ok, audit.problems()
    f = audit.figures
    assert 0 < f["lost"] <= len(killed), (f["lost"], killed)
    assert {"infra_failed/crash", "preempted/terminated", "scenario_failed"} <= set(f["attempt_classes"])
    assert {"passed", "scenario_failed", "infra_failed", "preempted", "bad_input"} <= set(f["case_classes"])

    routed = check_routing(stack, run_id)
    logs = check_task_logs(stack, run_id, skip=[*killed, *lost_worker.unlogged], written_by="gpu-worker")
    print(f"tries per worker/queue: {routed}\ntask logs read from S3 as the viewer: {logs}")
    assert routed.get("gpu-worker/avsim_gpu") and logs["by_worker"] > 0
    check_pages_for_the_viewer(stack, run_id)
    made = service_calls(stack)
    print(f"REST calls of the service account (Airflow's audit log): {made}")
    assert made.get("patch_pool"), made
    [(slots,)] = query(stack, "SELECT slots FROM slot_pool WHERE pool = 'avsim_gpu_spot'")
    assert CAPACITY[0] < slots <= MAX_GPU_SLOTS
