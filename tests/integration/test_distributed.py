"""The production topology for real, short: docker-compose.yml's deployment on the distributed stack.

The stack (:mod:`tests.support.distributed`): PostgreSQL, redis-server as the Celery broker, the S3
server as artifact store and remote task-log store, the FAB auth manager, scheduler, dag-processor,
triggerer, api-server and two Celery workers (``gpu-worker`` takes only the GPU phase queue,
``worker`` compose's queues), each in its own scratch directory, with compose's settings.

* Every running component's environment holds compose's settings (localized), nothing else changed.
* avsim's service account (made by ``docker/airflow-init.sh``, role ``avsim-service``) can make
  exactly the REST calls avsim makes: each permission of the role is needed by one of them, and it
  is refused anything else tried here.
* A 10-case week (no canary) with a case whose ``evaluate`` crashes until a marker object exists:
  ``gpu-worker`` is killed with ``-9`` (its whole process tree) while it runs phases; the deadline
  tracker, finding the week late, raises the GPU spot pool through the REST API as the service
  account. The week ends failed (that case needs attention); after the fix an engineer (role User)
  clears the weekly run's failed task instances, and the shards task repairs its shard run in
  place through the REST API, as the service account. Then: every case passed, every phase
  committed once, the killed tries' attempts recorded lost and retried on ``worker``, every task
  ran on a worker of its queue, the task logs read from S3 as the viewer (the dead worker's too),
  the avsim page and extra links open for the viewer and refuse without a login.

Mocked: nothing (the phases are the fake simulator's real processes).
"""

from __future__ import annotations

import datetime as dt
import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from tests.support.airflow_run import query, wait_for_run
from tests.support.distributed import (
    ADMIN,
    ENGINEER,
    WORKERS,
    DistributedStack,
)
from tests.support.distributed_checks import (
    attempt_keys,
    call,
    check_pages_for_the_viewer,
    check_retried_elsewhere,
    check_routing,
    check_task_logs,
    kill_worker_holding_phases,
    request,
    service_calls,
    week_stack,
)
from tests.support.stacks import fast_retries

from avsim.artifacts import RunLayout, run_key_for
from avsim.ledger.store import Ledger
from avsim.manifest.sample import sample_manifest
from avsim.service_role import AVSIM_DAG_IDS, service_permissions

pytestmark = [pytest.mark.integration, pytest.mark.distributed]

CASES = 10
MAX_GPU_SLOTS = 8
CAPACITY = (4, 2, 6)  # spot GPUs, on-demand GPUs, CPU slots


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DistributedStack]:
    with week_stack(tmp_path_factory.mktemp("distributed"), CAPACITY, MAX_GPU_SLOTS) as s:
        yield s


def test_the_components_answer_as_compose_configures_them(stack: DistributedStack) -> None:
    """(Their environments are compose's: tests/unit/test_distributed_settings.py. A running Airflow
    process's /proc environ cannot show it: setproctitle writes the process title over it.)"""
    # The API refuses a call without a login (FAB; no all-admins mode), and lets the admin in.
    assert request(stack, "GET", "/api/v2/dags")[0] == 401
    assert call(stack, "GET", "/api/v2/dags?dag_id_pattern=avsim_weekly", ADMIN)["total_entries"] >= 2
    # compose's scheduler healthcheck.
    port = stack.component_env("scheduler")["AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as resp:
        assert resp.status == 200
    # compose's worker healthcheck asks the broker; here, which queues each worker consumes.
    out = stack.celery("inspect", "active_queues", "--json")
    queues = {
        worker: sorted(q["name"] for q in qs) for worker, qs in json.loads(out.splitlines()[-1]).items()
    }
    assert queues == {f"{name}@avsim": sorted(stack.worker_queues(name)) for name in WORKERS}, queues


# -- the service account's role ------------------------------------------------------------------------
WITHOUT_PASSWORD = "without-one-permission"


def _service_calls(stack: DistributedStack) -> dict[str, tuple[str, str, Any]]:
    """Each REST call avsim makes, on something harmless: name -> (method, path, body)."""
    pool = call(stack, "GET", "/api/v2/pools/avsim_gpu_spot", ADMIN)
    calls: dict[str, tuple[str, str, Any]] = {
        "read pool": ("GET", "/api/v2/pools/avsim_gpu_spot", None),
        "scale pool": (
            "PATCH",
            "/api/v2/pools/avsim_gpu_spot?update_mask=slots",
            {k: pool[k] for k in ("slots", "description", "include_deferred")} | {"pool": "avsim_gpu_spot"},
        ),
    }
    for dag_id in AVSIM_DAG_IDS:
        calls[f"read a task instance of {dag_id}"] = (
            "GET",
            f"/api/v2/dags/{dag_id}/dagRuns/no-such-run/taskInstances/report",
            None,
        )
        calls[f"clear {dag_id}"] = (
            "POST",
            f"/api/v2/dags/{dag_id}/clearTaskInstances",
            {"dag_run_id": "no-such-run", "only_failed": True, "dry_run": True},
        )
    return calls


def test_the_service_account_may_make_avsims_calls_and_nothing_else(stack: DistributedStack) -> None:
    calls = _service_calls(stack)
    service = stack.service_login
    for name, (method, path, body) in calls.items():
        status, raw, _ = request(stack, method, path, login=service, body=body)
        assert status not in (401, 403), (name, status, raw[:200])
    # (It may pause avsim's DAGs: FAB has no permission for clearing that does not also allow that.)
    for method, path, body in (
        ("GET", "/api/v2/connections", None),
        ("GET", "/api/v2/variables", None),
        ("DELETE", "/api/v2/pools/avsim_cpu", None),
        ("POST", "/api/v2/pools", {"name": "mine", "slots": 1}),
        ("POST", "/api/v2/dags/avsim_weekly/dagRuns", {"logical_date": None}),
        ("GET", "/api/v2/dags/not_an_avsim_dag", None),
        ("GET", "/auth/fab/v1/users", None),
    ):
        status, _, _ = request(stack, method, path, login=service, body=body)
        assert status == 403, (method, path, status)

    # Least privilege: a role without any one of its permissions is refused at least one of the calls.
    perms = service_permissions()
    script = f"""
from airflow.providers.fab.auth_manager.cli_commands.utils import get_application_builder
from avsim.service_role import service_permissions, sync_role
perms = service_permissions()
for i, p in enumerate(perms):
    sync_role(f"without-{{i}}", [q for q in perms if q != p])
with get_application_builder() as ab:
    for i in range(len(perms)):
        if not ab.sm.find_user(f"without-{{i}}"):
            ab.sm.add_user(f"without-{{i}}", "w", "o", f"w{{i}}@example.com", ab.sm.find_role(f"without-{{i}}"), {WITHOUT_PASSWORD!r})
"""
    stack.python(script, component="airflow-init")
    for i, missing in enumerate(perms):
        refused = [
            name
            for name, (method, path, body) in calls.items()
            if request(stack, method, path, login=(f"without-{i}", WITHOUT_PASSWORD), body=body)[0] == 403
        ]
        assert refused, f"no call needs {missing}: the role has more than it needs"


# -- the week ----------------------------------------------------------------------------------------
def _week(stack: DistributedStack, run_id: str) -> tuple[dict[str, Any], str, str]:
    """The manifest (in the bucket), its URI, and the URI of the marker that ends the crashes."""
    # The deadline is 42 minutes away. The planned work (the catalog's estimates) of these 10 cases is
    # 17,400 GPU-seconds, 48 minutes on the pools' 6 GPUs, while its longest chain is 39 minutes: at its
    # first pass the tracker finds the week late, and more GPUs able to make it (7), so it raises the
    # spot pool. (With the deadline nearer than the longest chain, more GPUs cannot help and nothing is
    # raised.)
    doc = sample_manifest(
        CASES,
        time_scale=0.004,
        scenario_fail_rate=0.0,
        crash_rate=0.0,
        canary={"enabled": False},
        deadline=dt.datetime.now(dt.UTC) + dt.timedelta(minutes=42),
    )
    fast_retries(doc)
    marker = f"s3://{stack.bucket}/markers/{run_id}.fixed"
    crashing = next(c for c in doc["cases"] if c["graph"] == "standard")
    crashing["parameters"]["fakesim"] = {"evaluate": f"crash_until:{marker}"}
    gpu_seconds = sum(
        p["resources"]["gpus"] * p["estimated_duration_seconds"]
        for c in doc["cases"]
        for p in doc["graphs"][c["graph"]]["phases"].values()
    )
    assert gpu_seconds / (CAPACITY[0] + CAPACITY[1]) > 42 * 60, gpu_seconds  # the premise: late
    return doc, stack.upload(f"manifests/{run_id}.json", doc), marker


def _ledger_checks(
    stack: DistributedStack, run_id: str, doc: dict[str, Any], lost: frozenset[tuple[str, str, int]]
) -> None:
    """Each phase of each case: attempts 1..n all ended, the last one committed, passed; attempts
    recorded lost for some killed tries and for no other; the crashing case's evaluate crashed 3
    times, then passed in the engineer's round."""
    layout = RunLayout(stack.artifact_root, run_key_for("avsim_weekly", run_id))
    ledger = Ledger(layout)
    recorded_lost, claimed = set(), set()
    for case in doc["cases"]:
        cid = str(case["id"])
        for phase in doc["graphs"][case["graph"]]["phases"]:
            attempts, committed = ledger.attempts(cid, phase), ledger.outcome(cid, phase)
            numbers = [a.attempt for a in attempts]
            assert numbers == list(range(1, len(numbers) + 1)) and all(a.ended for a in attempts), (
                cid,
                phase,
            )
            assert committed is not None and committed.attempt == len(numbers), (cid, phase, committed)
            assert committed.outcome.value == "passed", (cid, phase, committed)
            for a in attempts:
                claimed.add((cid, a.task_id, a.try_number))
                if a.detail in ("abandoned", "worker_lost"):
                    recorded_lost.add((cid, a.task_id, a.try_number))
            if phase in ((case.get("parameters") or {}).get("fakesim") or {}):
                assert [(a.outcome and a.outcome.value, a.round_start) for a in attempts] == [
                    ("infra_failed", 1),
                    ("infra_failed", 1),
                    ("infra_failed", 1),
                    ("passed", 4),
                ], attempts
    # Lost attempts belong to killed tries only. A killed try may have none: killed as it began (no
    # attempt yet), or as its phase had just ended (the attempt ended as the phase said).
    assert recorded_lost and recorded_lost <= lost & claimed, (recorded_lost, lost, claimed & lost)


@pytest.mark.long  # 4 to 6 minutes on 2 cores: the lost worker waits out its heartbeat
def test_a_week_survives_a_lost_worker_and_is_repaired_in_place(stack: DistributedStack) -> None:
    run_id = "it__distributed"
    doc, manifest, marker = _week(stack, run_id)
    call(stack, "POST", "/api/v2/dags/avsim_weekly/dagRuns", ADMIN, {
        "dag_run_id": run_id, "logical_date": None, "conf": {"manifest": manifest},
    })  # fmt: skip
    lost_worker = kill_worker_holding_phases(stack, "gpu-worker", run_id, at_least=2)
    killed = lost_worker.tries
    killed_at = time.monotonic()
    assert wait_for_run(stack, "avsim_weekly", run_id, timeout=1200) == "failed"  # type: ignore[arg-type]
    shards = query(
        stack,
        "SELECT map_index, state FROM task_instance WHERE dag_id = 'avsim_weekly' AND run_id = :r "
        "AND task_id = 'shards'",
        r=run_id,
    )
    assert shards == [(0, "failed")]

    # The node pool is fixed; an engineer clears the week's failed task instances, and the shards task
    # repairs its shard run through the REST API as avsim's service account.
    stack.s3().put_object(Bucket=stack.bucket, Key=marker.split("/", 3)[3], Body=b"fixed")
    cleared = call(stack, "POST", "/api/v2/dags/avsim_weekly/clearTaskInstances", ENGINEER, {
        "dag_run_id": run_id, "only_failed": True, "include_downstream": True, "dry_run": False,
    })  # fmt: skip
    assert {t["task_id"] for t in cleared["task_instances"]} == {"shards", "report"}
    assert wait_for_run(stack, "avsim_weekly", run_id, timeout=900) == "success"  # type: ignore[arg-type]
    print(f"\nweek: failed, repaired and passed {time.monotonic() - killed_at:.0f} s after the kill")

    # The lost worker: its tries failed there and ran again on the other worker; their attempts are
    # recorded lost, every phase committed once.
    check_retried_elsewhere(stack, killed, "gpu-worker", "worker")
    _ledger_checks(stack, run_id, doc, attempt_keys(stack, killed))
    report = json.loads(stack.s3().get_object(
        Bucket=stack.bucket, Key=f"{RunLayout(stack.artifact_root, run_key_for('avsim_weekly', run_id)).report_dir.split('/', 3)[3]}/report.json"
    )["Body"].read())  # fmt: skip
    assert report["verdict"]["state"] == "passed" and report["totals"]["passed"] == CASES, report["totals"]

    # Queues: CPU phases and the rest never on the GPU machine's worker.
    routed = check_routing(stack, run_id)
    print(f"tries per worker/queue: {routed}")
    assert (
        routed.get("gpu-worker/avsim_gpu") and routed.get("worker/avsim_cpu") and routed.get("worker/default")
    )

    # Logs from S3, the dead worker's included; pages and links for the viewer.
    logs = check_task_logs(stack, run_id, skip=[*killed, *lost_worker.unlogged], written_by="gpu-worker")
    print(f"task logs read from S3 as the viewer: {logs}")
    assert logs["by_worker"] > 0
    check_pages_for_the_viewer(stack, run_id)

    # avsim's own REST calls, as the service account: the tracker's pool scaling and the repair.
    [(slots,)] = query(stack, "SELECT slots FROM slot_pool WHERE pool = 'avsim_gpu_spot'")
    assert CAPACITY[0] < slots <= MAX_GPU_SLOTS
    made = service_calls(stack)
    print(f"REST calls of the service account (Airflow's audit log): {made}")
    assert made.get("patch_pool") and made.get("post_clear_task_instances"), made
