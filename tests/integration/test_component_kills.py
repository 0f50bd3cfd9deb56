"""Component kills: ``kill -9`` the scheduler, the triggerer and a running phase's worker mid-run.

Each kill takes a component's whole process tree (the scheduler with its LocalExecutor workers and
their task processes, as when its container or machine dies), then the component is started again.
The week must finish with no lost phase and never two pods or processes for one attempt.

* Kubernetes backend (the loopback API of ``tests/support/kube_api``: its pods are processes on
  this machine, so both the API's pod objects and the processes can be counted): the scheduler,
  the triggerer and one phase task's worker are killed while pods run. Every pod the API ever
  held is recorded through an in-process watch of its store; afterwards one pod per attempt, one
  process per pod, attempt numbers unique, no pod or Lease left, every phase committed.
* Local backend: the worker of a running ``simulate`` is killed; its phase process must die with
  it (checked on the process table), the next try records the lost attempt as
  ``infra_failed``/``abandoned`` and runs the phase again.

The scheduler notices a dead worker through ``[scheduler] task_instance_heartbeat_timeout``, set
to 30 s here (300 s by default), and a dead scheduler's or triggerer's work is taken over once its
job's heartbeat is older than the health-check thresholds, set to 30 s. Not lower: a scheduler
heartbeats between its loops, which take up to 11 s on 2 loaded cores, and a threshold of 10 s
made the live scheduler declare itself dead and reset its own running tasks again and again.
"""

from __future__ import annotations

import collections
import contextlib
import json
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil
import pytest
from tests.support.airflow_run import query, trigger, wait_for_run
from tests.support.kube_api import FakeKubeAPI
from tests.support.stacks import fast_retries, kubernetes_stack, weekly_stack

from avsim.artifacts import RUN_LEVEL_CASE, RunLayout, run_key_for
from avsim.devstack.stack import LocalStack
from avsim.kube import pods
from avsim.ledger.records import AttemptRecord
from avsim.ledger.store import Ledger
from avsim.manifest.sample import sample_manifest

pytestmark = [pytest.mark.integration, pytest.mark.long]

NS = "avsim"
FAST_RECOVERY = {
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "30",
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "10",
    "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "30",
    "AIRFLOW__AVSIM__DEADLINE_INTERVAL_SECONDS": "5",  # the deadline tracker ends with the week
}
WORKER_TITLE = re.compile(r"airflow worker -- LocalExecutor: ([0-9a-f-]{36})")


# -- processes ---------------------------------------------------------------------------------------
def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kill_tree(root: psutil.Process) -> list[psutil.Process]:
    """SIGKILL a process and every process under it at once, as a container or machine dies."""
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGKILL)
    psutil.wait_procs(procs, timeout=10)
    return procs


def kill_component(stack: LocalStack, name: str) -> float:
    """``kill -9`` a stack component with everything it started; returns when (monotonic)."""
    proc = stack.procs[name]
    kill_tree(psutil.Process(proc.pid))
    proc.wait(timeout=30)
    return time.monotonic()


def wait_until(what: str, predicate: Callable[[], Any], timeout: float, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"{what}: not within {timeout:.0f}s")


@dataclass(frozen=True)
class KilledWorker:
    """The task instance a killed worker was running."""

    ti_id: str
    task_id: str
    case_id: str
    try_number: int
    state: str
    processes: tuple[psutil.Process, ...]


def running_phase_worker(stack: LocalStack, phase_task: str = "") -> KilledWorker | None:
    """A LocalExecutor worker of this stack's scheduler running a phase task (``phase_task``: the end of
    its task id), with the processes under it; None when there is none at this moment. Only this
    stack's processes are looked at: other runs on the machine are none of our business."""
    try:
        workers = psutil.Process(stack.procs["scheduler"].pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    for proc in workers:
        try:
            m = WORKER_TITLE.search(" ".join(proc.cmdline()))
        except psutil.NoSuchProcess:
            continue
        if not m:
            continue
        rows = query(
            stack,
            "SELECT task_id, rendered_map_index, try_number, state FROM task_instance WHERE id = :i",
            i=m.group(1),
        )
        if not rows:
            continue
        task_id, case_id, tries, state = rows[0]
        if "." not in task_id or state != "running" or not case_id or not task_id.endswith(phase_task):
            continue
        try:
            procs = (proc, *proc.children(recursive=True))
        except psutil.NoSuchProcess:
            continue
        return KilledWorker(m.group(1), task_id, str(case_id), int(tries), state, procs)
    return None


# -- pods ----------------------------------------------------------------------------------------
@dataclass
class PodRecorder:
    """Every pod the fake API held, through an in-process watch of its store (each ADDED event is
    one pod object, whatever its name), and the process that ran each one."""

    kube: FakeKubeAPI
    namespace: str
    added: list[dict[str, Any]] = field(default_factory=list)
    pids: dict[str, set[int]] = field(default_factory=lambda: collections.defaultdict(set))
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> PodRecorder:
        self._watcher = self.kube.store.watch("pods", self.namespace, [], lambda _obj: True, None)
        self._threads = [
            threading.Thread(target=self._events, daemon=True),
            threading.Thread(target=self._processes, daemon=True),
        ]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.kube.store.unwatch(self._watcher)
        for t in self._threads:
            t.join(timeout=10)

    def _events(self) -> None:
        import queue

        while not self._stop.is_set():
            try:
                line = self._watcher.queue.get(timeout=0.2)
            except queue.Empty:
                continue
            if not line:
                return
            event = json.loads(line)
            if event["type"] == "ADDED":
                self.added.append(event["object"])

    def _processes(self) -> None:
        while not self._stop.wait(0.05):
            for rt in self.kube.kubelet.runtimes():
                if rt.proc is not None and rt.namespace == self.namespace:
                    self.pids[rt.uid].add(rt.proc.pid)


def attempt_of(pod: dict[str, Any]) -> tuple[str, str, int]:
    """(case, phase, attempt) from the pod's environment (labels may be shortened)."""
    env = {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0].get("env") or []}
    return env["CASE_ID"], env["PHASE"], int(env["ATTEMPT"])


# -- the Kubernetes backend ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeKubeAPI, LocalStack]]:
    with kubernetes_stack(
        tmp_path_factory.mktemp("kills-k8s"),
        NS,
        FAST_RECOVERY,
        shard_size=4,
        max_active_shards=2,
        gpus=6,
        cpus=8,
    ) as (kube, stack):
        yield kube, stack


def _week(
    stack: LocalStack, name: str, cases: int, time_scale: float, seed: int
) -> tuple[str, Ledger, dict[str, Any]]:
    doc = sample_manifest(
        cases, seed=seed, time_scale=time_scale, scenario_fail_rate=0.0, canary={"enabled": False}
    )
    for graph in fast_retries(doc)["graphs"].values():
        for phase in graph["phases"].values():
            phase.update(heartbeat_seconds=0.5, lease_seconds=6)
    path = stack.home / f"{name}.json"
    path.write_text(json.dumps(doc))
    run_id = f"it__{name}"
    trigger(stack, "avsim_weekly", run_id, {"manifest": str(path)})
    layout = RunLayout(f"file://{stack.home / 'artifacts'}", run_key_for("avsim_weekly", run_id))
    return run_id, Ledger(layout), doc


def _every_phase_passed(ledger: Ledger, doc: dict[str, Any]) -> dict[tuple[str, str], list[AttemptRecord]]:
    """No lost phase: every phase of every case, and every run-level phase, committed ``passed`` by its
    last claimed attempt, every attempt ended, the only failures the lost ones. Returns the attempts."""
    out = {}
    keys = [(case["id"], phase) for case in doc["cases"] for phase in doc["graphs"][case["graph"]]["phases"]]
    keys += [(RUN_LEVEL_CASE, phase) for phase in doc.get("run_phases", {})]
    for key in keys:
        attempts = ledger.attempts(*key)
        committed = ledger.outcome(*key)
        assert committed is not None and committed.outcome.value == "passed", (
            f"lost phase {key}: committed {committed}; attempts {attempts}"
        )
        numbers = [a.attempt for a in attempts]
        assert numbers == list(range(1, len(numbers) + 1)), (key, numbers)
        assert committed.attempt == numbers[-1] == ledger.current_attempt(*key), (key, committed, numbers)
        for a in attempts:
            assert a.ended, (key, a)
            assert a.outcome is not None
            lost = a.outcome.value == "infra_failed" and a.detail in ("abandoned", "worker_lost")
            assert a.outcome.value == "passed" or lost, (key, a)
        out[key] = attempts
    return out


def test_kill_scheduler_triggerer_and_worker_on_kubernetes(cluster: tuple[FakeKubeAPI, LocalStack]) -> None:
    kube, stack = cluster
    recorder = PodRecorder(kube, NS).start()
    events: list[str] = []
    t0 = time.monotonic()

    def note(what: str) -> None:
        events.append(f"{time.monotonic() - t0:6.1f}s  {what}")

    def running_pods() -> int:
        return sum(1 for p in kube.pods(NS) if (p.get("status") or {}).get("phase") == "Running")

    # 8 cases; a 30-minute simulate runs about 5 s, so pods are running whenever a kill comes.
    run_id, ledger, doc = _week(stack, "kills_k8s", 8, 0.003, seed=31)
    try:
        wait_until("two pods running", lambda: running_pods() >= 2, 300)
        note(f"kill -9 scheduler ({running_pods()} pods running)")
        kill_component(stack, "scheduler")
        time.sleep(3)
        pods_before = len(recorder.added)
        stack.start(["scheduler"])
        note("scheduler started again")
        wait_until(
            "a pod created by the new scheduler's tasks", lambda: len(recorder.added) > pods_before, 300
        )
        note(f"first pod after the scheduler's restart ({len(recorder.added)} pods so far)")

        wait_until("a pod running", lambda: running_pods() >= 1, 300)
        note(f"kill -9 triggerer ({running_pods()} pods running)")
        kill_component(stack, "triggerer")
        time.sleep(3)
        stack.start(["triggerer"])
        note("triggerer started again")

        worker = wait_until("a running phase task's worker", lambda: running_phase_worker(stack), 300, 0.05)
        kill_tree(worker.processes[0])
        note(f"kill -9 the worker of {worker.task_id}[{worker.case_id}] try {worker.try_number}")
        assert wait_for_run(stack, "avsim_weekly", run_id, timeout=900) == "success"
        note("week ended: success")
    finally:
        recorder.stop()
        print("\n" + "\n".join(events))

    attempts = _every_phase_passed(ledger, doc)
    # The killed worker's try: its attempt (if it had claimed one) is recorded as lost, and retried.
    tis = {
        (task, case): tries
        for task, case, tries in query(
            stack,
            "SELECT task_id, rendered_map_index, try_number FROM task_instance WHERE dag_id = 'avsim_weekly_shard' "
            "AND run_id LIKE :p AND map_index >= 0",
            p=f"{run_id}__%",
        )
    }
    assert tis[(worker.task_id, worker.case_id)] > worker.try_number, "the killed try was retried"
    phase = worker.task_id.split(".")[1].removesuffix("_on_demand")
    lost = [a for a in attempts[(worker.case_id, phase)] if a.try_number == worker.try_number]
    assert all(a.detail in ("abandoned", "") for a in lost), lost

    # One pod per attempt, one process per pod, every pod an attempt of the ledger, none left.
    by_attempt = collections.defaultdict(list)
    for pod in recorder.added:
        by_attempt[attempt_of(pod)].append(pod)
    twice = {k: [p["metadata"]["uid"] for p in v] for k, v in by_attempt.items() if len(v) > 1}
    assert not twice, f"attempts with more than one pod: {twice}"
    for (case_id, phase_name, n), (pod,) in by_attempt.items():
        assert pod["metadata"]["name"] == pods.pod_name(ledger.layout.run_key, case_id, phase_name, n)
        recorded = [a for a in attempts[(case_id, phase_name)] if a.attempt == n]
        assert recorded, f"pod {pod['metadata']['name']} has no attempt {n} in the ledger"
    launched = {
        (c, p, a.attempt) for (c, p), runs in attempts.items() for a in runs if a.detail != "abandoned"
    }
    assert launched <= set(by_attempt), f"attempts that ran without a pod: {launched - set(by_attempt)}"
    many = {uid: pids for uid, pids in recorder.pids.items() if len(pids) > 1}
    assert not many, f"pods with more than one process: {many}"
    all_pids = [pid for pids in recorder.pids.values() for pid in pids]
    assert len(all_pids) == len(set(all_pids))
    assert kube.pods(NS) == [] and kube.leases(NS) == [], "every pod and Lease deleted"

    retried = [(t, c, n) for (t, c), n in tis.items() if n > 1]
    abandoned = [
        (c, p, a.attempt) for (c, p), runs in attempts.items() for a in runs if a.detail == "abandoned"
    ]
    print("\n" + "\n".join(events))
    print(
        f"kubernetes kills: {len(doc['cases'])} cases, {sum(len(v) for v in attempts.values())} attempts, "
        f"{len(recorder.added)} pods, {len(all_pids)} pod processes; {len(retried)} task instances retried, "
        f"{len(abandoned)} attempts recorded lost {abandoned}"
    )


# -- the local backend -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def local_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with weekly_stack(
        tmp_path_factory.mktemp("kills-local"), shard_size=4, max_active_shards=1, extra_env=FAST_RECOVERY
    ) as stack:
        yield stack


def phase_processes(run_key: str, case_id: str, phase: str, attempt: str = "") -> list[psutil.Process]:
    """Live processes of this run whose phase-contract environment names (case, phase[, attempt]),
    wherever they are in the process tree now (a phase whose worker died is re-parented)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if not any("avsim-fakesim" in part for part in (proc.info["cmdline"] or [])[:2]):
            continue
        try:
            env = proc.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        names = (env.get("RUN_ID"), env.get("CASE_ID"), env.get("PHASE"))
        if names == (run_key, case_id, phase) and attempt in ("", env.get("ATTEMPT")) and alive(proc):
            found.append(proc)
    return found


@dataclass(frozen=True)
class LostPhase:
    worker: KilledWorker
    attempt: str
    #: Seconds from the kill until no process of the attempt was alive (None: still alive after the wait).
    died_after: float | None


def kill_worker_mid_phase(stack: LocalStack, ledger: Ledger, *, with_task_process: bool) -> LostPhase:
    """Wait for a running ``simulate`` of this stack, then ``kill -9`` its worker (the LocalExecutor
    worker process, the task's supervisor) and, ``with_task_process``, the task process it forked,
    never the phase itself; then watch for 10 s whether any process of the attempt is left."""
    worker = wait_until(
        "a running simulate's worker", lambda: running_phase_worker(stack, ".simulate"), 300, 0.05
    )

    def under_the_worker() -> list[psutil.Process]:
        # The task process starts the phase after it has parsed the DAG file: look at the worker's
        # tree as it is now, not as it was when the task was found running.
        try:
            mine = {p.pid for p in worker.processes[0].children(recursive=True)}
        except psutil.NoSuchProcess:
            return []
        return [
            p for p in phase_processes(ledger.layout.run_key, worker.case_id, "simulate") if p.pid in mine
        ]

    phase = wait_until("its phase process", under_the_worker, 60, 0.05)[0]
    attempt = phase.environ()["ATTEMPT"]
    supervisor, task_process = worker.processes[0], phase.parent()
    targets = [supervisor, task_process] if with_task_process else [supervisor]
    for proc in targets:
        proc.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    try:
        wait_until(
            "no process of the killed attempt left",
            lambda: (
                not alive(phase)
                and not phase_processes(ledger.layout.run_key, worker.case_id, "simulate", attempt)
            ),
            10,
            0.05,
        )
        died_after: float | None = time.monotonic() - killed_at
    except TimeoutError:
        died_after = None
    return LostPhase(worker, attempt, died_after)


def test_a_killed_workers_phase_dies_with_it_and_is_retried(local_stack: LocalStack) -> None:
    """The worker and its task process die at once (the worker's container, machine or cgroup is
    killed): the phase process follows them (PR_SET_PDEATHSIG), and the next try records the lost
    attempt and runs the phase again."""
    stack = local_stack
    # 3 cases; a 30-minute simulate runs about 7 s.
    run_id, ledger, doc = _week(stack, "kills_local", 3, 0.004, seed=32)
    lost = kill_worker_mid_phase(stack, ledger, with_task_process=True)
    assert lost.died_after is not None, "a process of the killed attempt outlived its worker"

    assert wait_for_run(stack, "avsim_weekly", run_id, timeout=600) == "success"
    w = lost.worker
    attempts = _every_phase_passed(ledger, doc)[(w.case_id, "simulate")]
    assert [(a.outcome.value if a.outcome else "", a.detail, a.try_number) for a in attempts] == [
        ("infra_failed", "abandoned", w.try_number),
        ("passed", "", w.try_number + 1),
    ]
    assert str(attempts[0].attempt) == lost.attempt
    ((tries,),) = query(
        stack,
        "SELECT try_number FROM task_instance WHERE dag_id = 'avsim_weekly_shard' AND run_id LIKE :p "
        "AND task_id = :t AND rendered_map_index = :c",
        p=f"{run_id}__%",
        t=w.task_id,
        c=w.case_id,
    )
    assert tries == w.try_number + 1
    print(
        f"\nlocal worker kill: {w.task_id}[{w.case_id}] try {w.try_number}, attempt {lost.attempt}: no process "
        f"of it left {lost.died_after:.2f}s after the kill; attempts "
        f"{[(a.attempt, a.outcome.value if a.outcome else '', a.detail, a.try_number) for a in attempts]}"
    )


def test_killing_only_the_worker_process_ends_its_phase(local_stack: LocalStack) -> None:
    """``kill -9`` of the LocalExecutor worker process alone (the task's supervisor): its task process
    is orphaned; the phase it watches must not run on unwatched."""
    stack = local_stack
    run_id, ledger, doc = _week(stack, "kills_worker_only", 1, 0.01, seed=33)  # simulate: about 18 s
    lost = kill_worker_mid_phase(stack, ledger, with_task_process=False)
    assert lost.died_after is not None, (
        f"attempt {lost.attempt} of {lost.worker.task_id}[{lost.worker.case_id}] still runs 10 s after "
        "its worker was killed"
    )
    # The orphaned task process saw its worker go, killed the phase and recorded why; the scheduler
    # then found the task instance without a heartbeat and retried it.
    assert wait_for_run(stack, "avsim_weekly", run_id, timeout=600) == "success"
    w = lost.worker
    attempts = _every_phase_passed(ledger, doc)[(w.case_id, "simulate")]
    assert [(a.outcome.value if a.outcome else "", a.detail) for a in attempts] == [
        ("infra_failed", "worker_lost"),
        ("passed", ""),
    ]
    print(
        f"\nworker-only kill: no process of attempt {lost.attempt} left {lost.died_after:.2f}s after the kill"
    )
