"""Partial faults of a real cluster injected into weeks on the production topology.

:class:`FaultStack` is the distributed stack (:mod:`tests.support.distributed`: CeleryExecutor on Redis,
PostgreSQL, the S3 API, FAB) on the Kubernetes backend against the loopback Kubernetes API of
:mod:`tests.support.kube_api` (pods and Leases are API objects, their containers processes here), with
two triggerers and an HTTP proxy in front of the S3 API that can answer errors. Components that exit
are started again after a few seconds, as compose's ``restart: unless-stopped`` does.

:func:`run_week` runs one week while it injects the faults it is given (:data:`FAULTS`), and audits it
(:class:`WeekFaults`). ``bench/faults.py`` prints the figures; ``tests/integration/test_faults.py``
asserts them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tests.support.airflow_run import query
from tests.support.distributed import ADMIN, BIN, DistributedStack, client_environment
from tests.support.distributed_checks import SHARD_DAG, call
from tests.support.postgres import postgres_cluster, stop_server_for
from tests.support.store_proxy import StoreProxy

from avsim.devstack.stack import free_port

#: The faults, in the order a week of all of them injects them.
FAULTS = ("worker", "triggerer", "object_store", "database", "api_server", "hung_gpu")
NAMESPACE = "avsim"
#: Settings of the fault stack beyond the distributed stack's, and why.
FAULT_SETTINGS: dict[str, tuple[str, str]] = {
    "AIRFLOW__AVSIM__BACKEND": ("kubernetes", "phases run as pods of the loopback Kubernetes API"),
    "AIRFLOW__AVSIM__KUBERNETES_NAMESPACE": (NAMESPACE, "the pods' namespace"),
    "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": (
        "120",
        "tries the killed worker had taken from the broker are queued again after 2 minutes, not 10",
    ),
    "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": (
        "20",
        "a frozen triggerer's triggers move to the other after 20 s without its heartbeat (30 s default)",
    ),
}
#: How long each fault lasts (seconds), as the issue states them.
API_STOP_SECONDS, DATABASE_STOP_SECONDS, STORE_ERROR_SECONDS = 120.0, 30.0, 60.0
#: The lease of a phase: a hung GPU attempt is found when it expires.
LEASE_SECONDS = 20.0
#: The share of GPU attempts (first attempts of simulate) that hang.
HUNG_SHARE = 0.05


@dataclass
class FaultStack(DistributedStack):
    #: The loopback Kubernetes API the phases' pods run on (set before :meth:`start`).
    kube: Any = None
    proxy_port: int = field(default_factory=free_port)
    #: Components not to start again when they exit (stopped on purpose).
    held: set[str] = field(default_factory=set)
    #: The pod deletions the Kubernetes API received (:class:`DeletionLog`).
    deletions: Any = None

    def __post_init__(self) -> None:
        super().__post_init__()
        # The components reach the S3 API through the proxy; the stack's own client (the bucket, the
        # checks) through it too, except the readiness check of the server itself.
        self.loopback = replace(self.loopback, s3=f"127.0.0.1:{self.proxy_port}")
        self.proxy = StoreProxy(self.proxy_port, self.s3_port)
        self.ports["triggerer-2-logs"] = free_port()
        self._supervising = threading.Event()

    @property
    def s3_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def pod_env(self) -> dict[str, str]:
        """What a phase's container gets besides its pod spec: a worker's environment (the store)."""
        return super().component_env("worker")

    def component_env(self, name: str) -> dict[str, str]:
        env = super().component_env(name)
        env.update({k: v for k, (v, _why) in FAULT_SETTINGS.items()})
        if self.kube is not None:
            kubeconfig = self.kube.write_kubeconfig(self.base / "kubeconfig", namespace=NAMESPACE)
            env.update(self.kube.airflow_conn_env("kubernetes_default", kubeconfig, namespace=NAMESPACE))
        if name == "triggerer-2":
            env["AIRFLOW__LOGGING__TRIGGERER_LOG_SERVER_PORT"] = str(self.ports["triggerer-2-logs"])
        return env

    def start_component(self, name: str) -> None:
        if name.startswith("triggerer"):
            self._spawn(name, [str(BIN / "airflow"), "triggerer"], self.component_env(name))
            return
        super().start_component(name)

    def start(self, workers: Any = None) -> None:
        self.proxy.start()
        super().start(workers)
        self.start_component("triggerer-2")
        self._supervising.set()
        threading.Thread(target=self._supervise, daemon=True).start()

    def _supervise(self) -> None:
        """compose's ``restart: unless-stopped``: a component that exited starts again 5 s later."""
        while self._supervising.is_set():
            for name, proc in list(self.procs.items()):
                if name in ("redis", "s3") or name in self.held or proc.poll() is None:
                    continue
                time.sleep(5)
                if self._supervising.is_set() and name not in self.held:
                    self.start_component(name)
            time.sleep(1)

    def stop(self) -> None:
        self._supervising.clear()
        super().stop()
        self.proxy.stop()

    def signal(self, name: str, sig: int) -> None:
        os.killpg(self.procs[name].pid, sig)


@contextlib.contextmanager
def fault_stack(base: Path, capacity: tuple[int, int, int] = (4, 2, 6)) -> Iterator[FaultStack]:
    """The stack started on a fresh database, the weekly DAGs unpaused; every process stopped after."""
    from tests.support.kube_api import FakeKubeAPI

    from avsim.devstack.demo import wait_for_dag

    options = {"AIRFLOW__AVSIM__CASES_IN_FLIGHT": "750"}
    with postgres_cluster() as url:
        stack = FaultStack(base=base, database_url=url, capacity=capacity, options=options)
        env = {**stack.pod_env(), "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
        with FakeKubeAPI(workdir=base / "pods", env=env) as kube:
            stack.kube = kube
            stack.deletions = DeletionLog(kube)
            try:
                stack.start()
                with client_environment(stack):
                    for dag_id in ("avsim_weekly", SHARD_DAG):
                        wait_for_dag(stack, dag_id)  # type: ignore[arg-type]
                        call(stack, "PATCH", f"/api/v2/dags/{dag_id}", ADMIN, {"is_paused": False})
                    yield stack
            finally:
                stack.stop()


class DeletionLog:
    """Every pod deletion the Kubernetes API received: (time, name, the pod's phase, whether its
    container was still running)."""

    def __init__(self, kube: Any) -> None:
        self.entries: list[tuple[float, str, str, bool]] = []
        verbs = kube.verbs
        original = verbs.delete

        def delete(res: Any, namespace: str, name: str, query_: Any, body: Any) -> Any:
            if getattr(res, "name", "") == "pods":
                with contextlib.suppress(Exception):
                    pod = verbs.store.get(res, namespace, name)
                    running = pod.get("status", {}).get("phase") == "Running" and not pod["metadata"].get(
                        "deletionTimestamp"
                    )
                    self.entries.append((time.time(), name, str(pod.get("status", {}).get("phase")), running))
            return original(res, namespace, name, query_, body)

        verbs.delete = delete


# -- the faults ---------------------------------------------------------------------------------------
@dataclass
class Injected:
    fault: str
    began: float
    ended: float = 0.0
    note: str = ""


def _wait(seconds: float, stop: threading.Event) -> None:
    stop.wait(seconds)


def inject_worker(stack: FaultStack) -> str:
    """A Celery worker killed -9 with its whole tree (its machine lost); compose starts it again."""
    pids = stack.kill_tree("gpu-worker")
    return f"gpu-worker killed ({len(pids)} processes)"


def inject_triggerer(stack: FaultStack, stop: threading.Event) -> str:
    """One triggerer frozen (SIGSTOP) until its triggers move to the other, then resumed."""
    stack.signal("triggerer", signal.SIGSTOP)
    began = time.monotonic()
    moved = False
    try:
        while not stop.is_set() and time.monotonic() - began < 180:
            stop.wait(2)
            if time.monotonic() - began > 25 and not _triggers_of(stack, "triggerer"):
                moved = True
                break
    finally:
        stack.signal("triggerer", signal.SIGCONT)
    return f"triggerer frozen {time.monotonic() - began:.0f}s; its triggers {'moved' if moved else 'did not move'}"


def _triggers_of(stack: FaultStack, hostname: str) -> int:
    rows = query(
        stack,  # type: ignore[arg-type]
        "SELECT count(*) FROM trigger t JOIN job j ON t.triggerer_id = j.id WHERE j.hostname = :h",
        h=hostname,
    )
    return int(rows[0][0]) if rows else 0


def inject_object_store(stack: FaultStack, stop: threading.Event) -> str:
    stack.proxy.failing.set()
    try:
        _wait(STORE_ERROR_SECONDS, stop)
    finally:
        stack.proxy.failing.clear()
    return f"the object store answered 503 to {stack.proxy.refused} requests for {STORE_ERROR_SECONDS:g}s"


def inject_database(stack: FaultStack, stop: threading.Event) -> str:
    stop_server_for(DATABASE_STOP_SECONDS)
    return f"PostgreSQL stopped for {DATABASE_STOP_SECONDS:g}s"


def inject_api_server(stack: FaultStack, stop: threading.Event) -> str:
    stack.signal("api-server", signal.SIGSTOP)
    try:
        _wait(API_STOP_SECONDS, stop)
    finally:
        stack.signal("api-server", signal.SIGCONT)
    return f"the API server frozen for {API_STOP_SECONDS:g}s"


INJECT: dict[str, Callable[[FaultStack, threading.Event], str]] = {
    "worker": lambda stack, stop: inject_worker(stack),
    "triggerer": inject_triggerer,
    "object_store": inject_object_store,
    "database": inject_database,
    "api_server": inject_api_server,
}


def plan_hung_attempts(kube: Any, cases: Sequence[dict[str, Any]], share: float = HUNG_SHARE) -> list[str]:
    """Script a hang of the first attempt of simulate (a GPU phase) for ``share`` of the cases."""
    gpu = [c for c in cases if c["graph"] in ("standard", "with_render")]
    n = max(1, round(share * len(gpu)))
    chosen = [c["id"] for c in gpu[:: max(1, len(gpu) // n)][:n]]
    for case_id in chosen:
        kube.add_fault(
            "hang",
            match={"env": {"CASE_ID": case_id, "PHASE": "simulate", "ATTEMPT": "1"}},
            after_seconds=1.0,
        )
    return chosen


# -- one week ---------------------------------------------------------------------------------------
@dataclass
class WeekFaults:
    """What one week under faults ended as (:func:`run_week`)."""

    run_id: str
    state: str
    seconds: float
    injected: list[Injected]
    cases: int
    case_classes: dict[str, int]
    lost: int
    duplicated: int
    false_bad_build: int
    live_pods_deleted: int
    problems: list[str] = field(default_factory=list)
    #: Every attempt's class and detail ("infra_failed/lease_expired"), counted: what the faults did.
    attempt_classes: dict[str, int] = field(default_factory=dict)

    @property
    def survived(self) -> bool:
        wrong = sum(n for cls, n in self.case_classes.items() if cls not in ("passed", "scenario_failed"))
        return (
            self.state == "success"
            and not wrong
            and not (self.lost or self.duplicated or self.false_bad_build or self.live_pods_deleted)
        )


def week_manifest(cases: int, seed: int = 38) -> dict[str, Any]:
    from avsim.manifest.sample import sample_manifest

    doc = sample_manifest(
        cases,
        time_scale=0.002,
        scenario_fail_rate=0.05,
        deadline=dt.datetime.now(dt.UTC) + dt.timedelta(hours=4),
        seed=seed,
    )
    for graph in doc["graphs"].values():
        for phase in graph["phases"].values():
            phase.update(heartbeat_seconds=1, lease_seconds=LEASE_SECONDS)
    return doc


def run_week(
    stack: FaultStack,
    run_id: str,
    faults: Sequence[str],
    *,
    cases: int = 40,
    first_after: float = 45.0,
    gap: float = 20.0,
    timeout: float = 2400.0,
) -> WeekFaults:
    """Trigger a week of ``cases`` and inject ``faults`` one after another (``first_after`` seconds
    after its trigger, ``gap`` seconds apart) while it runs; wait for it and audit it."""
    from tests.support.airflow_run import wait_for_run

    from avsim.artifacts import RunLayout, run_key_for

    doc = week_manifest(cases)
    hung = plan_hung_attempts(stack.kube, doc["cases"]) if "hung_gpu" in faults else []
    manifest = stack.upload(f"manifests/{run_id}.json", doc)
    layout = RunLayout(stack.artifact_root, run_key_for("avsim_weekly", run_id))
    injected: list[Injected] = []
    if hung:
        injected.append(Injected("hung_gpu", time.time(), note=f"{len(hung)} simulate attempts hang"))
    stop = threading.Event()
    started = time.monotonic()
    call(stack, "POST", "/api/v2/dags/avsim_weekly/dagRuns", ADMIN, {
        "dag_run_id": run_id, "logical_date": None, "conf": {"manifest": manifest},
    })  # fmt: skip

    def injector() -> None:
        stop.wait(first_after)
        for fault in faults:
            if stop.is_set() or fault == "hung_gpu":
                continue
            entry = Injected(fault, time.time())
            entry.note = INJECT[fault](stack, stop)
            entry.ended = time.time()
            injected.append(entry)
            stop.wait(gap)

    thread = threading.Thread(target=injector, daemon=True)
    thread.start()
    try:
        state = _wait_for_week(stack, run_id, timeout, wait_for_run)
    finally:
        stop.set()
        thread.join(timeout=API_STOP_SECONDS + 60)
    seconds = time.monotonic() - started
    return audit(stack, run_id, layout, doc, state, seconds, injected)


def _wait_for_week(stack: FaultStack, run_id: str, timeout: float, wait_for_run: Any) -> str:
    """The week's end state; reads that fail while the database or the API is down are tried again."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return str(
                wait_for_run(stack, "avsim_weekly", run_id, timeout=max(1.0, deadline - time.monotonic()))
            )
        except TimeoutError:
            raise
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(5)


def audit(
    stack: FaultStack,
    run_id: str,
    layout: Any,
    doc: dict[str, Any],
    state: str,
    seconds: float,
    injected: list[Injected],
) -> WeekFaults:
    """The week's figures from its ledger, its breaker and the Kubernetes API's deletions."""
    from avsim.kube import pods
    from avsim.ledger.breaker import Breaker, image_digest
    from avsim.ledger.store import Ledger

    problems: list[str] = []
    ledger = Ledger(layout)
    by_case = {c.case_id: c.outcome for s in ledger.shard_summaries() for c in s.cases}
    classes: dict[str, int] = {}
    for case in doc["cases"]:
        cls = str(getattr(by_case.get(case["id"]), "value", by_case.get(case["id"]) or "missing"))
        classes[cls] = classes.get(cls, 0) + 1
    lost = duplicated = false_bad = 0
    pod_attempts: dict[str, Any] = {}
    attempt_classes: dict[str, int] = {}
    for case in doc["cases"]:
        for phase in doc["graphs"][case["graph"]]["phases"]:
            committed = ledger.outcome(case["id"], phase)
            attempts = ledger.attempts(case["id"], phase)
            for a in attempts:
                pod_attempts[pods.pod_name(layout.run_key, case["id"], phase, a.attempt)] = a
                key = (a.outcome.value if a.outcome else a.state) + (f"/{a.detail}" if a.detail else "")
                attempt_classes[key] = attempt_classes.get(key, 0) + 1
            results = [a for a in attempts if a.outcome is not None and a.outcome.produced_output]
            if (
                committed is None
                and by_case.get(case["id"]) is not None
                and str(getattr(by_case[case["id"]], "value", "")) in ("passed", "scenario_failed")
            ):
                lost += 1
                problems.append(f"{case['id']}.{phase}: no committed outcome")
            if len(results) > 1:
                duplicated += 1
                problems.append(f"{case['id']}.{phase}: {len(results)} attempts ended with a result")
            bad = [a for a in attempts if a.outcome is not None and a.outcome.value == "bad_build"]
            false_bad += len(bad)
    image = doc["run"]["build"]["image"]
    if Breaker(layout.root, image_digest(image)).state().is_open:
        false_bad += 1
        problems.append("the build's breaker is open")
    live = 0
    for _when, name, phase, running in stack.deletions.entries:
        a = pod_attempts.get(name)
        if a is None or not running:
            continue
        # A running pod deleted before its attempt ended, whose attempt then ended as its pod's loss.
        if a.detail in ("vanished", "watch_error", "abandoned"):
            live += 1
            problems.append(f"pod {name} ({phase}) deleted under its live attempt, which ended {a.detail}")
    return WeekFaults(
        run_id=run_id,
        state=state,
        seconds=seconds,
        injected=injected,
        cases=len(doc["cases"]),
        case_classes=classes,
        lost=lost,
        duplicated=duplicated,
        false_bad_build=false_bad,
        live_pods_deleted=live,
        problems=problems,
        attempt_classes=attempt_classes,
    )


def summary_line(weeks: Sequence[WeekFaults]) -> str:
    injected = sum(len(w.injected) for w in weeks)
    survived = sum(len(w.injected) for w in weeks if w.survived)
    return (
        f"faults: injected={injected} survived={survived} lost={sum(w.lost for w in weeks)} "
        f"duplicated={sum(w.duplicated for w in weeks)} false_bad_build={sum(w.false_bad_build for w in weeks)} "
        f"live_pods_deleted={sum(w.live_pods_deleted for w in weeks)}"
    )
