"""A user's kill of a Kubernetes phase that runs in sync mode (not deferred; issue 31, item 4), against
the loopback Kubernetes API.

The real ``KubernetesPhaseOperator`` (``deferrable=False``) runs a prepared week's ``prepare`` phase in
a child Python process (the task process): the attempt is claimed in a ``file://`` ledger, its pod and
Lease are created over HTTP, the pod is a real process run by the loopback API's kubelet, and the task
follows its log as the stock operator does. The task process's SIGTERM handler calls the operator's
``on_kill``, as Airflow 3.3.2's task runner installs it (``task_runner.run``'s ``_on_term``), and the
test sends that SIGTERM, as Airflow's supervisor does when its heartbeat learns that a user marked the
task failed or success, or cleared it. The boundary: Airflow's task instance is a stand-in (try number,
max tries, XComs), as in ``tests/unit/operators/test_phase_kill.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.kube_api import FakeKubeAPI
from tests.support.kube_api.phases import phase_kube_api
from tests.support.kube_phase_start import (
    NAMESPACE,
    PhaseTI,
    ledger_of,
    names,
    next_try_settles_the_killed_attempt,
    prepared_week,
    running,
)

from avsim.kube import pod_spec

TASK_PROCESS = textwrap.dedent(
    """
    import json, signal, sys
    from avsim.operators.kubernetes import KubernetesPhaseOperator
    from avsim.settings import KubernetesSettings

    class TI:
        dag_id, task_id, run_id, map_index, max_tries = "avsim_weekly_shard", "standard.prepare", "manual__w1", 0, 3
        try_number = 1
        def xcom_push(self, key, value): pass
        def xcom_pull(self, *a, **k): return None

    run, case = json.load(open(sys.argv[1]))
    op = KubernetesPhaseOperator(
        task_id="standard.prepare", phase="prepare", case=case, run=run, retries=3,
        kube=KubernetesSettings(conn_id="avsim_kube", namespace="sims", deferrable=False),
    )
    def on_term(signum, frame):  # Airflow's task runner: _on_term -> ti.task.on_kill()
        op.on_kill()
    signal.signal(signal.SIGTERM, on_term)
    dag = type("Dag", (), {"dag_id": TI.dag_id})()
    try:
        print("RESULT", json.dumps(op.execute({"ti": TI(), "run_id": TI.run_id, "dag": dag})), flush=True)
    except BaseException as exc:
        print("RAISED", type(exc).__name__, str(exc)[:300], flush=True)
    """
)


@pytest.fixture
def kube(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKubeAPI]:
    with phase_kube_api(tmp_path, monkeypatch, NAMESPACE) as api:
        yield api


def start_task(tmp_path: Path, run: dict[str, Any], case: dict[str, Any]) -> subprocess.Popen[str]:
    args = tmp_path / "task.json"
    args.write_text(json.dumps([run, case]))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.Popen(
        [sys.executable, "-c", TASK_PROCESS, str(args)], env=env, stdout=subprocess.PIPE, text=True
    )


def test_a_users_kill_of_a_sync_phase_deletes_its_pod_and_lease_and_records_nothing(
    kube: FakeKubeAPI, tmp_path: Path
) -> None:
    """SIGTERM to the task process while its pod runs: within the pod's grace period the pod, its Lease
    and its process are gone; the task ends with PhaseKilled; the ledger has no outcome and the attempt
    is still ``started`` (not an ``infra_failed`` end of the build, which would feed its breaker and be
    committed on a last try); the next try records it as lost (``abandoned``) and runs attempt 2."""
    run, case = prepared_week(tmp_path, 1.0)  # a 3-minute prepare: it runs when the user kills it
    pod = pod_spec_name = None
    task = start_task(tmp_path, run, case)
    try:
        deadline = time.monotonic() + 90
        while not (pods := names(kube, "pods")) and time.monotonic() < deadline:
            time.sleep(0.1)
        [pod_spec_name] = pods
        kube.wait_for_pod(pod_spec_name, NAMESPACE, phase="Running")
        pid = kube.process_of(pod_spec_name, NAMESPACE)
        assert running(pid) and names(kube, "leases") == {pod_spec_name}
        time.sleep(1.0)  # the task follows the pod's log
        task.send_signal(signal.SIGTERM)
        killed = time.monotonic()
        out, _ = task.communicate(timeout=120)
        kube.wait_for_pod(pod_spec_name, NAMESPACE, gone=True, timeout=pod_spec.DEFAULT_GRACE_SECONDS)
        took = time.monotonic() - killed
    finally:
        task.kill()
    pod = pod_spec_name
    assert "RAISED PhaseKilled" in out, out
    assert took < pod_spec.DEFAULT_GRACE_SECONDS, took
    assert names(kube, "leases") == set(), "the attempt's Lease outlived the kill"
    assert not running(pid), "the pod's process outlived its pod"

    ledger = ledger_of(run)
    assert ledger.outcome(case["case_id"], "prepare") is None
    [attempt] = ledger.attempts(case["case_id"], "prepare")
    assert (attempt.attempt, attempt.state, attempt.outcome) == (1, "started", None), attempt

    # The try a clear starts: the killed attempt is settled as lost, a new attempt gets its own pod.
    retry = next_try_settles_the_killed_attempt(kube, run, case, ledger)
    assert retry.pod_name != pod


def test_a_kill_before_the_pod_is_created_launches_nothing(kube: FakeKubeAPI, tmp_path: Path) -> None:
    """The kill reaches ``on_kill`` while the task is still beginning (before its pod exists): no pod
    and no Lease are created, the task ends with PhaseKilled, and its claimed attempt stays ``started``
    for the next try to settle (the stock ``on_kill`` flagged nothing the start looked at: the pod ran)."""
    from avsim.operators.exceptions import PhaseKilled
    from avsim.operators.kubernetes import KubernetesPhaseOperator
    from avsim.settings import KubernetesSettings

    run, case = prepared_week(tmp_path, 0.001)  # a phase of 0.18 s: before the fix it ran to its end
    op = KubernetesPhaseOperator(
        task_id="standard.prepare",
        phase="prepare",
        case=case,
        run=run,
        retries=3,
        kube=KubernetesSettings(conn_id="avsim_kube", namespace=NAMESPACE, deferrable=False),
    )
    op.on_kill()  # as the SIGTERM handler calls it, here before execute reaches the pod
    ti = PhaseTI(1)
    dag = type("Dag", (), {"dag_id": ti.dag_id})()
    with pytest.raises(PhaseKilled, match="was killed"):
        op.execute({"ti": ti, "run_id": ti.run_id, "dag": dag})
    assert kube.call_count(verb="create") == 0
    assert names(kube, "pods") == set() == names(kube, "leases")
    ledger = ledger_of(run)
    assert ledger.outcome(case["case_id"], "prepare") is None
    [attempt] = ledger.attempts(case["case_id"], "prepare")
    assert (attempt.attempt, attempt.state, attempt.outcome) == (1, "started", None), attempt
