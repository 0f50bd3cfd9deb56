"""What one phase costs the orchestrator, side by side with Airflow's own floor, in one run on one stack.

One stack (the real scheduler, dag-processor, triggerer and api-server, LocalExecutor, the metadata
database on a private PostgreSQL cluster, the loopback Kubernetes API of ``tests/support/kube_api``)
runs four shard DAGs of the same shape (``bench/phase_overhead_dags.py``): the shipped graph
catalog's families, one mapped task group per family, one task per phase, the same pools, slots,
priorities and trigger rules. Only the phase task differs:

(a) ``empty``        an ``EmptyOperator`` that runs (a no-op ``on_execute_callback``; a bare one is
                     marked success by the scheduler without running): the floor;
(b) ``avsim_local``  avsim's local phases whose command only writes ``result.json`` (a no-op
                     simulator that honours the contract's declared output, so the simulator's own
                     process costs nothing worth counting);
(c) ``stock_kpo``    the stock deferrable ``KubernetesPodOperator``, its pod running ``sleep N``
                     (``--pod-seconds``, 15) against the loopback Kubernetes API;
(d) ``avsim_k8s``    avsim's Kubernetes phases, command ``sleep N`` then the same write, against the
                     same API;
(e) ``deferral``     a task that defers once on a ``TimeDeltaTrigger`` for as long as the pods of (c)
                     and (d) run, then resumes in a worker and returns: what Airflow itself costs for
                     any deferrable task of that length, the floor under (c) and (d);
(f) ``trigger_end``  a task that defers once on a trigger that waits as long and then ends the task
                     itself (``TaskSuccessEvent``): the floor of a deferrable task that never resumes.

Each variant runs one shard run of ``--cases`` cases (the same cases: the avsim runs are prepared by
``avsim.dagbuild.prepare.prepare_week`` from one manifest, whose build image differs per run so no cached
output is reused; the stock DAGs get the same cases by family in their conf), one variant at a time,
``--rounds`` times (the order reversed every other round). Before measuring, one small run of each
variant warms the stack up (first parses, first clients), and the stack's idle CPU rate is measured.

The stack is configured as a Kubernetes deployment is (``[avsim] backend = kubernetes``, or
``--deployment-backend local``): its scheduler imports what a phase task imports, the Kubernetes
operator included, and checks the graph catalog before forking its LocalExecutor workers
(:mod:`avsim.dagbuild.preload`), which (c) benefits from as much as (d).

**CPU seconds per phase task instance.** Every process of the stack is counted, through the
component that started it (``bench/proc_cpu.py``: /proc's utime+stime of live processes and
cutime+cstime of the children they reaped): the scheduler's loop, the LocalExecutor workers (each
the supervisor of the task processes it forks), the task processes (the DAG file's parse, the
operator, whatever it starts; the no-op simulator included, about a millisecond), the dag-processor,
the triggerer (its whole share: the trigger's wait, the pod watch or poll), the api-server (the
execution API every task calls) and PostgreSQL. A pod's own process is run by the loopback API in
this bench's process and is not counted. For one variant's run: the stack's CPU from the trigger to
the run's end (plus a settling pause, so the last task processes are reaped), minus the stack's idle
rate times that window, divided by the phase task instances that ran (a GPU phase's on-demand twin
ends skipped without running and is not counted; the run's ``load_shard``, ``cases_*`` and
``summarize`` are in the total, the same three kinds of task in every variant). The dag-processor
re-parses files every hour here (``min_file_process_interval``), so its periodic parse is not in the
windows; it is a cost per DAG file, not per phase.

**Latency** of a phase: its task instance's start minus the end of its latest upstream phase task
instance that ran, within the case (map index); the median over the run's phases with an upstream.

**Ledger requests per passed phase**, counted in this process (no stack): every phase of one case run
through avsim's lifecycle (``begin_attempt``, a passed ``end_attempt``) against a prepared run in a
``file://`` artifact store, counting what an object store would be asked: GET (a document or file
read), PUT (a write; a compare-and-swap update is a GET and a PUT), LIST, HEAD (exists), and the
XCom reads and writes the lifecycle makes.

Prints a table, the ratios (b)/(a), (d)/(c), (d)/(a), the latency ratio (b)/(a), (e)/(a) and (d)/(e)
(``deferral_floor: deferral_vs_empty=R k8s_vs_deferral=R``), and ends with::

    phase_overhead: local_vs_empty=R k8s_vs_stock=R k8s_vs_empty=R latency_vs_empty=R

    flock /tmp/avsim-heavy.lock .venv/bin/python bench/phase_overhead.py            # 40 cases, 2 rounds
    flock /tmp/avsim-heavy.lock .venv/bin/python bench/phase_overhead.py --quick    # 10 cases, 1 round
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime as dt
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from phase_overhead_dags import DAG_IDS, dependencies, write_dags, write_trigger_module  # noqa: E402
from proc_cpu import delta, tree_cpu  # noqa: E402

NAMESPACE = "bench"
VARIANTS = ("empty", "avsim_local", "stock_kpo", "avsim_k8s", "deferral", "trigger_end")
LABELS = {
    "empty": "(a) EmptyOperator",
    "avsim_local": "(b) avsim local",
    "stock_kpo": "(c) stock deferrable KPO",
    "avsim_k8s": "(d) avsim Kubernetes",
    "deferral": "(e) deferral floor",
    "trigger_end": "(f) trigger-ended floor",
}
#: After a run ends: time for the last task processes to exit and be reaped before the CPU is read.
SETTLE_SECONDS = 4.0


@dataclass
class RunResult:
    variant: str
    run_id: str
    seconds: float
    cpu: dict[str, float]
    phases: int
    tries: int
    failed: int
    latencies: list[float] = field(default_factory=list)

    @property
    def total(self) -> float:
        return sum(self.cpu.values())


# -- the manifest and the runs' confs ------------------------------------------------------------------
#: A phase that does nothing but write the one output the phase contract asks of a result
#: (``result.json``, :func:`avsim.phases.contract.classify_outputs`): a pass without it is retried as a
#: lost write. Shell builtins and one ``mkdir``: the simulator's own cost stays negligible.
NOOP_PHASE = ("sh", "-c", 'd="${OUTPUT_URI#file://}"; mkdir -p "$d" && echo "{}" > "$d/result.json"')


def sleeping_phase(seconds: float) -> tuple[str, ...]:
    """A phase that runs ``seconds`` (a pod's lifetime), then writes its one output as NOOP_PHASE does."""
    return ("sh", "-c", f"sleep {seconds:g}; {NOOP_PHASE[2]}")


def noop_manifest(cases: int, command: tuple[str, ...] = NOOP_PHASE) -> dict[str, Any]:
    """The sample manifest with every phase's command ``command`` and no canary."""
    from avsim.manifest.sample import sample_manifest

    doc = sample_manifest(cases, seed=11, crash_rate=0.0, scenario_fail_rate=0.0, canary={"enabled": False})
    for graph in doc["graphs"].values():
        for phase in graph["phases"].values():
            phase["command"], phase["args"] = list(command), []
    for phase in doc["run_phases"].values():
        phase["command"], phase["args"] = list(command), []
    return doc


def with_build(doc: dict[str, Any], label: str) -> dict[str, Any]:
    """The same cases under a build of their own: no cache hit from another run, a fresh breaker."""
    import hashlib

    out = copy.deepcopy(doc)
    digest = hashlib.sha256(f"bench:{label}".encode()).hexdigest()
    out["run"]["build"] = {
        "build_id": f"bench-{label}",
        "image": f"registry.example.com/avsim/simulator@sha256:{digest}",
    }
    return out


def prepare(
    doc: dict[str, Any], folder: Path, artifact_root: str, prefix: str, run_id: str, shard_size: int
) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """Prepare a run as the weekly run's ``prepare`` does; (the shard run's conf, its cases by family)."""
    from avsim.dagbuild.factory import load_plan
    from avsim.dagbuild.prepare import prepare_week
    from avsim.plan.shards import ShardPlan
    from avsim.settings import AvsimSettings
    from avsim.storage import read_json

    settings = AvsimSettings(artifact_root=artifact_root, shard_size=shard_size)
    plan = load_plan(ROOT / "dags" / "avsim_graphs.yaml", settings)
    path = folder / f"{prefix}-{run_id}.json"
    path.write_text(json.dumps(doc))
    prepared = prepare_week(source=str(path), plan=plan, settings=settings, dag_id=prefix, run_id=run_id)
    if len(prepared["shards"]) != 1:
        raise RuntimeError(f"expected one shard, got {len(prepared['shards'])}")
    conf = prepared["shards"][0]["conf"]
    from avsim.artifacts import RunLayout

    layout = RunLayout(conf["run"]["artifact_root"], conf["run"]["run_key"])
    shard = ShardPlan.from_json(read_json(layout.shard_cases(conf["shard"])))
    return conf, {fam: list(entries) for fam, entries in shard.by_family.items()}


# -- the stack ------------------------------------------------------------------------------------------
@contextlib.contextmanager
def bench_stack(base: Path, args: argparse.Namespace, plan: Any) -> Iterator[tuple[Any, Any, int]]:
    """(the stack, the loopback Kubernetes API, PostgreSQL's postmaster pid), all four DAGs loaded."""
    from tests.support import postgres
    from tests.support.kube_api import FakeKubeAPI

    from avsim.devstack.demo import demo_pools, wait_for_dag
    from avsim.devstack.stack import LocalStack

    dags = base / "dags"
    write_dags(dags, plan, ROOT / "dags" / "avsim_graphs.yaml", NAMESPACE, args.pod_seconds)
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    with FakeKubeAPI(workdir=base / "pods", env=env, record_events=False) as kube:
        kubeconfig = kube.write_kubeconfig(base / "kubeconfig", namespace=NAMESPACE)
        with postgres.postgres_cluster() as url:
            assert postgres._server is not None
            postmaster = int((postgres._server.data / "postmaster.pid").read_text().split()[0])
            stack = LocalStack(
                home=base / "airflow",
                dags_folder=dags,
                plugins_folder=args.plugins_folder,
                sql_alchemy_conn=url,
                parallelism=args.parallelism,
                extra_env={
                    **kube.airflow_conn_env("kubernetes_default", kubeconfig, namespace=NAMESPACE),
                    "AIRFLOW__AVSIM__KUBERNETES_NAMESPACE": NAMESPACE,
                    "AIRFLOW__AVSIM__BACKEND": args.deployment_backend,
                    "AIRFLOW__AVSIM__SHARD_SIZE": str(plan.shard_size),
                    # Parse each DAG file once at start, not every minute: a per-file cost, not a per-phase one.
                    "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "3600",
                    # (f)'s trigger, importable by the triggerer (it imports a trigger by classpath).
                    "PYTHONPATH": os.pathsep.join(
                        p
                        for p in (str(write_trigger_module(base / "pylib")), os.environ.get("PYTHONPATH"))
                        if p
                    ),
                    **dict(kv.split("=", 1) for kv in args.env),
                },
            )
            stack.set_pools(demo_pools(gpus=4 * args.parallelism, cpus=4 * args.parallelism))
            stack.start()
            try:
                for dag_id in DAG_IDS.values():
                    wait_for_dag(stack, dag_id)
                yield stack, kube, postmaster
            finally:
                stack.stop()


def roots(stack: Any, postmaster: int) -> dict[str, int]:
    found = {name: proc.pid for name, proc in stack.procs.items()}
    found["postgres"] = postmaster
    return found


def trigger(stack: Any, dag_id: str, run_id: str, conf: Mapping[str, Any]) -> None:
    from tests.support.airflow_run import api

    api(
        stack,
        "POST",
        f"/api/v2/dags/{dag_id}/dagRuns",
        {"dag_run_id": run_id, "logical_date": None, "conf": conf},
    )


def wait_for_runs(stack: Any, runs: list[tuple[str, str]], timeout: float) -> None:
    from tests.support.airflow_run import query

    deadline = time.monotonic() + timeout
    pending = set(runs)
    while pending:
        for dag_id, run_id in list(pending):
            rows = query(
                stack, "SELECT state FROM dag_run WHERE dag_id = :d AND run_id = :r", d=dag_id, r=run_id
            )
            if rows and rows[0][0] in ("success", "failed"):
                pending.discard((dag_id, run_id))
        if pending and time.monotonic() > deadline:
            raise TimeoutError(f"runs still going after {timeout:.0f}s: {sorted(pending)}")
        time.sleep(1)


def task_rows(stack: Any, dag_id: str, run_id: str) -> list[Any]:
    from tests.support.airflow_run import query

    return query(
        stack,
        "SELECT task_id, map_index, state, start_date, end_date, try_number FROM task_instance "
        "WHERE dag_id = :d AND run_id = :r",
        d=dag_id,
        r=run_id,
    )


def measure_run(
    stack: Any,
    pids: Mapping[str, int],
    variant: str,
    run_id: str,
    conf: Mapping[str, Any],
    deps: Mapping[str, list[str]],
    idle: Mapping[str, float],
    timeout: float,
    profile: Path | None = None,
) -> RunResult:
    dag_id = DAG_IDS[variant]
    with py_spy(pids, profile):
        before, t0 = tree_cpu(pids), time.monotonic()
        trigger(stack, dag_id, run_id, conf)
        wait_for_runs(stack, [(dag_id, run_id)], timeout)
        time.sleep(SETTLE_SECONDS)
        after, t1 = tree_cpu(pids), time.monotonic()
    window = t1 - t0
    cpu = {k: v - idle.get(k, 0.0) * window for k, v in delta(after, before).items()}
    rows = task_rows(stack, dag_id, run_id)
    phases = [r for r in rows if r.map_index >= 0 and r.start_date is not None and r.state != "skipped"]
    by_key = {(r.task_id, r.map_index): r for r in rows}
    latencies = []
    for r in phases:
        ups = [by_key.get((u, r.map_index)) for u in deps.get(r.task_id, [])]
        ends = [u.end_date for u in ups if u is not None and u.end_date is not None and u.state == "success"]
        if ends:
            latencies.append((r.start_date - max(ends)).total_seconds())
    return RunResult(
        variant=variant,
        run_id=run_id,
        seconds=window,
        cpu=cpu,
        phases=len(phases),
        tries=sum(int(r.try_number or 0) for r in phases),
        failed=sum(1 for r in phases if r.state != "success"),
        latencies=latencies,
    )


@contextlib.contextmanager
def py_spy(pids: Mapping[str, int], out: Path | None) -> Iterator[None]:
    """While measuring: py-spy (a dev tool, ``pip install py-spy``) records the scheduler's tree (the
    workers and every task process) and the triggerer's, in py-spy's raw format (collapsed stacks).
    Sampling costs CPU, so a profiled run's figures are not comparable with the others'."""
    if out is None:
        yield
        return
    import subprocess

    spy = str(Path(sys.executable).with_name("py-spy"))
    procs = [
        subprocess.Popen(
            [
                spy,
                "record",
                "--subprocesses",
                "--nonblocking",
                "-r",
                "50",
                "-f",
                "raw",
                "-o",
                f"{out}.{name}.txt",
                "-p",
                str(pids[name]),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name in ("scheduler", "triggerer", "api-server")
    ]
    try:
        yield
    finally:
        for p in procs:
            p.send_signal(signal.SIGINT)
        for p in procs:
            p.wait(timeout=120)


def idle_rate(pids: Mapping[str, int], seconds: float) -> dict[str, float]:
    before, t0 = tree_cpu(pids), time.monotonic()
    time.sleep(seconds)
    after, t1 = tree_cpu(pids), time.monotonic()
    return {k: v / (t1 - t0) for k, v in delta(after, before).items()}


# -- ledger requests per passed phase (in process) ------------------------------------------------------
class _FakeTI:
    """What the lifecycle asks of a task instance: try numbers, the map index and XCom."""

    def __init__(self, xcoms: dict[str, Any], counts: dict[str, int]) -> None:
        self.try_number, self.max_tries, self.map_index = 1, 4, 0
        self.xcoms, self.counts = xcoms, counts

    def xcom_pull(self, task_ids: str, map_indexes: int | None = None, key: str = "return_value") -> Any:
        self.counts["xcom_pull"] = self.counts.get("xcom_pull", 0) + 1
        return self.xcoms.get(task_ids)

    def xcom_push(self, key: str, value: Any) -> None:
        self.counts["xcom_push"] = self.counts.get("xcom_push", 0) + 1


@contextlib.contextmanager
def counting_store(counts: dict[str, int], root: str) -> Iterator[None]:
    """Count, below the ``file://`` artifact root ``root``, what an object store would be asked.

    At the operating system's level, whatever avsim's code does above it: a file opened for reading
    is a GET, one opened for writing a PUT (an atomic write opens a temporary file once), a directory
    listed a LIST, a file's existence checked a HEAD (not the checks ``os.makedirs`` makes: an object
    store has no folders).
    """
    import builtins
    import posixpath

    def bump(kind: str, target: Any) -> None:
        if isinstance(target, (str, os.PathLike)) and os.fspath(target).startswith(root):
            counts[kind] = counts.get(kind, 0) + 1

    original_open, original_scandir, original_listdir = builtins.open, os.scandir, os.listdir
    original_exists = posixpath.exists

    def counted_open(file: Any, mode: str = "r", *a: Any, **kw: Any) -> Any:
        bump("PUT" if any(c in mode for c in "wax") else "GET", file)
        return original_open(file, mode, *a, **kw)

    def counted_scandir(path: Any = ".") -> Any:
        bump("LIST", path)
        return original_scandir(path)

    def counted_listdir(path: Any = ".") -> Any:
        bump("LIST", path)
        return original_listdir(path)

    def counted_exists(path: Any) -> bool:
        if sys._getframe(1).f_code.co_name != "makedirs":
            bump("HEAD", path)
        return original_exists(path)

    builtins.open, os.scandir, os.listdir, posixpath.exists = (  # type: ignore[assignment]
        counted_open,
        counted_scandir,
        counted_listdir,
        counted_exists,
    )
    try:
        yield
    finally:
        builtins.open, os.scandir, os.listdir = original_open, original_scandir, original_listdir
        posixpath.exists = original_exists


def ledger_requests(base: Path) -> dict[str, float]:
    """Object-store requests and XCom calls per passed phase, averaged over one case's phases."""
    from avsim.dagbuild.factory import load_plan
    from avsim.operators.phase import LocalPhaseOperator
    from avsim.phases.contract import RESULT_FILE, AttemptResult, Outcome
    from avsim.settings import AvsimSettings
    from avsim.storage import write_json

    base.mkdir(parents=True)
    conf, by_family = prepare(
        with_build(noop_manifest(1), "ledger"), base, f"file://{base}/artifacts", "bench_ledger", "count", 10
    )
    plan = load_plan(ROOT / "dags" / "avsim_graphs.yaml", AvsimSettings(shard_size=10))
    name, cases = next((f, c) for f, c in by_family.items() if c)
    family = plan.family(name)
    xcoms: dict[str, Any] = {}
    counts: dict[str, int] = {}
    for p in family.phases:
        ups = {
            u: [u, family.phase(u).on_demand_task] if family.phase(u).on_demand_fallback else [u]
            for u in p.upstream
        }
        op = LocalPhaseOperator(
            task_id=p.name, phase=p.name, case=cases[0], run=conf["run"], upstream_phases=ups, gpus=p.gpus
        )
        ctx = {"ti": _FakeTI(xcoms, counts)}
        with counting_store(counts, str(base / "artifacts")):
            begun = op.lifecycle.begin_attempt(ctx)
        if isinstance(begun, dict):
            raise RuntimeError(f"phase {p.name!r} was not launched: {begun}")
        # The phase's own write (NOOP_PHASE's), not the orchestrator's: outside the count.
        write_json(f"{begun.output_uri}/{RESULT_FILE}", {})
        result = AttemptResult(Outcome.PASSED, 0, "", "", "bench")
        with counting_store(counts, str(base / "artifacts")):
            xcoms[p.name] = op.lifecycle.end_attempt(ctx, begun, result, dt.datetime.now(dt.UTC))
    return {k: v / len(family.phases) for k, v in counts.items()}


def print_table(results: list[RunResult]) -> dict[str, tuple[float, float, float]]:
    """Per variant: (CPU-s per phase TI, median latency, wall seconds per phase); prints the table."""
    out = {}
    keys = sorted({k for r in results for k in r.cpu})
    print(
        f"{'variant':26s} {'runs':>4s} {'phase TIs':>9s} {'CPU-s/TI':>8s} {'latency p50':>11s} "
        + " ".join(f"{k[:12]:>12s}" for k in keys)
    )
    for variant in VARIANTS:
        mine = [r for r in results if r.variant == variant]
        if not mine:
            continue
        phases = sum(r.phases for r in mine)
        per_ti = sum(r.total for r in mine) / phases
        lat = (
            statistics.median([x for r in mine for x in r.latencies])
            if any(r.latencies for r in mine)
            else 0.0
        )
        parts = " ".join(f"{sum(r.cpu.get(k, 0.0) for r in mine) / phases:12.3f}" for k in keys)
        failed = sum(r.failed for r in mine)
        extra_tries = sum(r.tries for r in mine) - phases
        print(
            f"{LABELS[variant]:26s} {len(mine):4d} {phases:9d} {per_ti:8.3f} {lat:10.2f}s {parts}"
            + (f"  ({failed} failed, {extra_tries} extra tries)" if failed or extra_tries else "")
        )
        out[variant] = (per_ti, lat, sum(r.seconds for r in mine) / phases)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--cases", type=int, default=40, help="cases per run (one shard run per variant and round)"
    )
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--quick", action="store_true", help="10 cases, 1 round, 20 s idle measurement (unless given)"
    )
    ap.add_argument("--parallelism", type=int, default=16)
    ap.add_argument("--idle-seconds", type=float, default=40.0)
    ap.add_argument(
        "--pod-seconds",
        type=float,
        default=15.0,
        help="how long the Kubernetes variants' pods run (sleep); shorter pods make the stock operator's "
        "resumed try race the try that deferred",
    )
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument(
        "--deployment-backend",
        choices=("kubernetes", "local"),
        default="kubernetes",
        help="the stack's [avsim] backend: with kubernetes (a Kubernetes deployment's setting) the scheduler "
        "preloads the Kubernetes operator before forking its workers, for (c) and (d) alike; (b) is built "
        "for the local backend either way",
    )
    ap.add_argument("--env", action="append", default=[], help="extra KEY=VALUE for the stack (repeatable)")
    ap.add_argument("--plugins-folder", type=Path, default=ROOT / "plugins", help=argparse.SUPPRESS)
    ap.add_argument(
        "--profile",
        type=Path,
        help="record the first round's runs with py-spy to PROFILE.<variant>.<component>.txt (a dev tool)",
    )
    args = ap.parse_args()
    from bytecode import ensure_bytecode

    ensure_bytecode()  # measure what a deployment pays (bench/bytecode.py)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the stack and clean up, as Ctrl-C does
    if args.quick:  # its sizes, unless given
        for name, value in (("cases", 10), ("rounds", 1), ("idle_seconds", 20.0)):
            if getattr(args, name) == ap.get_default(name):
                setattr(args, name, value)
    variants = [v for v in args.variants.split(",") if v]
    started = time.monotonic()
    from avsim.dagbuild.factory import load_plan
    from avsim.settings import AvsimSettings

    plan = load_plan(ROOT / "dags" / "avsim_graphs.yaml", AvsimSettings(shard_size=max(args.cases, 10)))
    deps = dependencies(plan)
    with tempfile.TemporaryDirectory(prefix="avsim-overhead-") as tmp:
        base = Path(tmp)
        requests = ledger_requests(base / "ledger")
        print(
            "ledger requests per passed phase (avsim lifecycle, in process): "
            + ", ".join(f"{k} {v:.2f}" for k, v in sorted(requests.items())),
            flush=True,
        )
        with bench_stack(base, args, plan) as (stack, _kube, postmaster):
            pids = roots(stack, postmaster)
            artifacts = f"file://{stack.home / 'artifacts'}"
            manifests = base / "manifests"
            manifests.mkdir()

            def confs(cases: int, label: str) -> dict[str, Any]:
                """Each variant's conf: the same cases; the avsim runs prepared with their own build."""
                commands = {"avsim_local": NOOP_PHASE, "avsim_k8s": sleeping_phase(args.pod_seconds)}
                out: dict[str, Any] = {}
                by_family: dict[str, list[dict[str, Any]]] = {}
                for variant, prefix in (("avsim_local", "bench_local"), ("avsim_k8s", "bench_k8s")):
                    doc = with_build(noop_manifest(cases, commands[variant]), f"{label}-{variant}")
                    out[variant], by_family = prepare(
                        doc, manifests, artifacts, prefix, label, plan.shard_size
                    )
                stock = {"shard": 0, "cases": by_family}
                out["empty"] = out["stock_kpo"] = out["deferral"] = out["trigger_end"] = stock
                return out

            warm = confs(2, "warmup")
            # The EmptyOperator run at full size: as many tasks at once as a measured run, so every
            # LocalExecutor worker a run needs exists before measuring (with a forkserver they are
            # started on demand, each importing what the forkserver did not preload).
            warm["empty"] = confs(args.cases, "warmup-full")["empty"]
            print(f"warming up: one small run of each variant ({', '.join(variants)})", flush=True)
            for v in variants:
                trigger(stack, DAG_IDS[v], "warmup", warm[v])
            wait_for_runs(stack, [(DAG_IDS[v], "warmup") for v in variants], args.timeout)
            time.sleep(SETTLE_SECONDS)
            idle = idle_rate(pids, args.idle_seconds)
            print(
                f"idle stack: {sum(idle.values()):.3f} CPU-s/s "
                + ", ".join(f"{k} {v:.3f}" for k, v in idle.items()),
                flush=True,
            )
            results: list[RunResult] = []
            for rnd in range(args.rounds):
                label = f"round{rnd}"
                run_confs = confs(args.cases, label)
                order = variants if rnd % 2 == 0 else list(reversed(variants))
                for v in order:
                    load = os.getloadavg()[0]
                    profile = Path(f"{args.profile}.{v}") if args.profile and rnd == 0 else None
                    r = measure_run(stack, pids, v, label, run_confs[v], deps, idle, args.timeout, profile)
                    results.append(r)
                    print(
                        f"  {label} {LABELS[v]:26s} {r.phases} phase TIs in {r.seconds:6.1f}s, "
                        f"{r.total / max(1, r.phases):.3f} CPU-s/TI, latency p50 "
                        f"{statistics.median(r.latencies) if r.latencies else float('nan'):.2f}s "
                        f"(load {load:.1f} -> {os.getloadavg()[0]:.1f})",
                        flush=True,
                    )
    print()
    figures = print_table(results)
    print()
    print(
        "ledger requests per passed phase (avsim lifecycle, in process): "
        + ", ".join(f"{k} {v:.2f}" for k, v in sorted(requests.items()))
    )

    def ratio(a: str, b: str, i: int = 0) -> float:
        if a not in figures or b not in figures or not figures[b][i]:
            return float("nan")
        return figures[a][i] / figures[b][i]

    local_vs_empty = ratio("avsim_local", "empty")
    k8s_vs_stock = ratio("avsim_k8s", "stock_kpo")
    k8s_vs_empty = ratio("avsim_k8s", "empty")
    latency = ratio("avsim_local", "empty", 1)
    deferral_vs_empty = ratio("deferral", "empty")
    k8s_vs_deferral = ratio("avsim_k8s", "deferral")
    trigger_end_vs_empty = ratio("trigger_end", "empty")
    print(f"CPU per phase, avsim local / EmptyOperator:        {local_vs_empty:.3f}  (goal <= 1.5)")
    print(f"CPU per phase, avsim Kubernetes / stock KPO:       {k8s_vs_stock:.3f}  (goal <= 1.0)")
    print(f"CPU per phase, avsim Kubernetes / EmptyOperator:   {k8s_vs_empty:.3f}  (goal <= 3)")
    print(f"phase-to-phase latency, avsim local / EmptyOperator: {latency:.3f}  (goal <= 1.5)")
    print(f"CPU per phase, deferral floor / EmptyOperator:     {deferral_vs_empty:.3f}  (Airflow's own)")
    print(f"CPU per phase, avsim Kubernetes / deferral floor:  {k8s_vs_deferral:.3f}")
    print(f"CPU per phase, trigger-ended floor / EmptyOperator: {trigger_end_vs_empty:.3f}  (Airflow's own)")
    print(f"({time.monotonic() - started:.0f}s in all, {dt.datetime.now(dt.UTC):%H:%M} UTC)")
    print(
        f"deferral_floor: deferral_vs_empty={deferral_vs_empty:.3f} k8s_vs_deferral={k8s_vs_deferral:.3f} "
        f"trigger_end_vs_empty={trigger_end_vs_empty:.3f}"
    )
    print(
        f"phase_overhead: local_vs_empty={local_vs_empty:.3f} k8s_vs_stock={k8s_vs_stock:.3f} "
        f"k8s_vs_empty={k8s_vs_empty:.3f} latency_vs_empty={latency:.3f}"
    )


if __name__ == "__main__":
    main()
