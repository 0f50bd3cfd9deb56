"""A user's kill of a running phase (issue 31, item 4) on the real scheduler, through the REST API.

An engineer marks a running phase failed (``PATCH .../taskInstances/{task_id}/{map_index}``,
``new_state: failed``), as the grid's "Mark as failed" does. Whatever the backend, the phase must stop
at once and leave nothing running, and nothing may be committed or held against the build for it:

* Local backend: the phase (``sh`` that starts a child ``sleep`` and execs the fake simulator, so its
  process group has two processes) runs under a LocalExecutor worker. Airflow's supervisor learns of
  the new state at its next heartbeat (409), sends the task process SIGTERM, and the task runner calls
  the operator's ``on_kill``: no process of the phase may be left.
* Kubernetes backend (the loopback API of tests/support/kube_api: pods are processes on this machine):
  the phase is deferred, so the real triggerer cancels its trigger and calls ``on_kill``: the pod, its
  Lease and its process must be gone within the pod's grace period.

In both, the ledger has no outcome for the phase, and the killed attempt is still ``started`` (not
recorded as a crash of the build): the next try a clear starts records it as lost.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from tests.support.airflow_run import api, query, trigger, wait_for_run
from tests.support.stacks import kubernetes_stack, weekly_stack

from avsim.artifacts import RunLayout, run_key_for, shard_run_id
from avsim.devstack.stack import LocalStack
from avsim.kube import pod_spec
from avsim.ledger.store import Ledger
from avsim.manifest.sample import sample_manifest

pytestmark = [pytest.mark.integration]

SHARD_DAG, TASK = "avsim_weekly_shard", "standard.prepare"
#: The killed phase's own arguments: unique on this machine, so its processes can be found.
CHILD_SECONDS, PHASE_SECONDS = "7771", "7772"


def week_with_a_long_prepare(stack: LocalStack, run_id: str) -> tuple[str, RunLayout]:
    """Trigger a one-case week whose prepare phase runs for two hours, in two processes; return the
    case id and the run's layout."""
    doc = sample_manifest(1, time_scale=0.002, scenario_fail_rate=0.0, canary={"enabled": False})
    case = doc["cases"][0]
    assert case["graph"] == "standard"
    prepare = doc["graphs"]["standard"]["phases"]["prepare"]
    fakesim = str(Path(sys.executable).parent / "avsim-fakesim")
    prepare["command"] = ["sh", "-c", f'sleep {CHILD_SECONDS} & exec {fakesim} "$@"', "sh"]
    prepare["args"] = ["prepare", "--duration", PHASE_SECONDS]
    path = stack.home / f"{run_id}.json"
    path.write_text(json.dumps(doc))
    trigger(stack, "avsim_weekly", run_id, {"manifest": str(path)})
    return case["id"], RunLayout(f"file://{stack.home / 'artifacts'}", run_key_for("avsim_weekly", run_id))


def phase_processes() -> list[psutil.Process]:
    """The killed phase's processes (the fake simulator and its child), on the whole machine."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if (cmd[:1] == ["sleep"] and CHILD_SECONDS in cmd) or (
            PHASE_SECONDS in cmd and cmd[:1] != ["sh"] and any("avsim-fakesim" in part for part in cmd)
        ):
            with contextlib.suppress(psutil.NoSuchProcess):
                if proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
    return found


def wait_until(what: str, predicate: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise TimeoutError(f"{what}: not within {timeout:.0f}s")


def ti_state(stack: LocalStack, run_id: str) -> str | None:
    rows = query(
        stack,
        "SELECT state FROM task_instance WHERE dag_id = :d AND run_id = :r AND task_id = :t AND map_index = 0",
        d=SHARD_DAG,
        r=shard_run_id(run_id, 1),
        t=TASK,
    )
    return rows[0][0] if rows else None


def mark_failed(stack: LocalStack, run_id: str) -> float:
    api(
        stack,
        "PATCH",
        f"/api/v2/dags/{SHARD_DAG}/dagRuns/{shard_run_id(run_id, 1)}/taskInstances/{TASK}/0",
        {"new_state": "failed"},
    )
    return time.monotonic()


def check_nothing_held_against_the_build(layout: RunLayout, case_id: str) -> None:
    ledger = Ledger(layout)
    assert ledger.outcome(case_id, "prepare") is None
    [attempt] = ledger.attempts(case_id, "prepare")
    assert (attempt.attempt, attempt.state, attempt.outcome) == (1, "started", None), attempt


@pytest.mark.long  # its own stack, about a minute (the user-kill decisions are unit-tested in tests/k8s)
def test_a_killed_local_phase_leaves_no_process(tmp_path: Path) -> None:
    run_id = "it__kill_local"
    with weekly_stack(tmp_path, shard_size=4, max_active_shards=1) as stack:
        for stale in phase_processes():  # a leftover of an earlier run of this test on this machine
            stale.kill()
        case_id, layout = week_with_a_long_prepare(stack, run_id)
        procs = wait_until("the phase's two processes", lambda: len(phase_processes()) == 2, 300)
        assert procs and ti_state(stack, run_id) == "running"
        pids = {p.pid for p in phase_processes()}
        killed = mark_failed(stack, run_id)
        wait_until("no process of the killed phase", lambda: not phase_processes(), 60)
        took = time.monotonic() - killed
        assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie" for pid in pids)
        # The user's state stands (nothing retries the phase), and the week ends failed: the case needs
        # attention until someone clears it.
        assert wait_for_run(stack, "avsim_weekly", run_id, timeout=600) == "failed"
        assert ti_state(stack, run_id) == "failed"
        check_nothing_held_against_the_build(layout, case_id)
    # Airflow's supervisor heartbeats every [workers] min_heartbeat_interval (5 s): the kill arrives then.
    assert took < 20, took


@pytest.mark.long
def test_a_killed_kubernetes_phase_leaves_no_pod_and_no_lease(tmp_path: Path) -> None:
    namespace = "avsim"
    run_id = "it__kill_k8s"
    with kubernetes_stack(tmp_path, namespace, shard_size=4, max_active_shards=1) as (kube, stack):
        case_id, layout = week_with_a_long_prepare(stack, run_id)

        def watched_pod() -> str | None:
            """The running pod, once its trigger runs in the triggerer (a user takes longer to find it:
            a kill before the triggerer picks the trigger up never reaches on_kill, see the report)."""
            running = [p for p in kube.pods(namespace) if (p.get("status") or {}).get("phase") == "Running"]
            logs = (stack.home / "logs" / f"dag_id={SHARD_DAG}").glob(f"**/task_id={TASK}/**/*.log.trigger.*")
            started = any("starting" in log.read_text() for log in logs)
            if len(running) == 1 and started and ti_state(stack, run_id) == "deferred":
                return str(running[0]["metadata"]["name"])
            return None

        name = wait_until("the phase's pod, watched by its trigger", watched_pod, 300)
        time.sleep(1.0)
        pid = kube.process_of(name, namespace)
        assert pid is not None and [lease["metadata"]["name"] for lease in kube.leases(namespace)] == [name]
        killed = mark_failed(stack, run_id)
        wait_until(
            "the pod and its Lease gone", lambda: not kube.pods(namespace) and not kube.leases(namespace), 60
        )
        took = time.monotonic() - killed
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        assert wait_for_run(stack, "avsim_weekly", run_id, timeout=600) == "failed"
        assert ti_state(stack, run_id) == "failed"
        check_nothing_held_against_the_build(layout, case_id)
        logs = "".join(p.read_text() for p in (stack.home / "logs").glob("**/*.log.trigger.*"))
        assert "the phase was killed by a user" in logs
    # The triggerer sees the trigger's row gone at its next loop (about a second), then deletes the
    # pod with its grace period (the fake simulator ends at SIGTERM).
    assert took < pod_spec.DEFAULT_GRACE_SECONDS, took
