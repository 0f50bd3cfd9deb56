"""Kubernetes API calls per running phase-second: avsim's shared-watch trigger vs the stock deferrable
KubernetesPodOperator's trigger, at N concurrent phases, in the same run against the same server.

Both batches run N phase pods on the loopback Kubernetes API of tests/support/kube_api (each pod a
local process that works for ``--seconds``), waited on by N triggers in one asyncio event loop, the
way a triggerer runs them:

* stock: ``KubernetesPodTrigger`` (cncf.kubernetes 10.25.0) with its defaults (2 s poll interval),
  the pods as ``KubernetesPodOperator`` would create them;
* avsim: ``PhasePodTrigger`` on the namespace's shared watch, each pod renewing its heartbeat Lease
  every ``--heartbeat`` seconds through avsim's heartbeat (stdlib HTTP, as in a container) -
  those renewals are API calls too, and are counted.

The triggers run in a child process of their own, as in a triggerer, so that the API server (a
thread of this process, counting every request) and the triggers do not share one interpreter. The
server counts every request from the moment the batch's triggers start waiting until the last one
fires (pod creation, before, is the same for both and is left out). A pod's running phase-seconds
are from its container's start to its end. The stock trigger's achieved poll interval is printed:
when the triggers' process cannot keep up its 2 s, the stock figure is lower than its design. It ends
with ``k8s_api_load: avsim_vs_stock=R avsim_calls_per_phase_second=A stock_calls_per_phase_second=S``.

    python bench/k8s_api_load.py [--phases 200] [--seconds 120] [--heartbeat 30]
    python bench/k8s_api_load.py --quick    # 5 phases of 10 s, heartbeat every 5 s
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NS_STOCK, NS_AVSIM = "stock", "avsim"

WORK = (
    "import os, time\n"
    "hb = None\n"
    "if os.environ.get('AVSIM_LEASE_NAME'):\n"
    "    from avsim.phases.heartbeat import Heartbeat\n"
    "    hb = Heartbeat.from_environ()\n"
    "end = time.time() + float(os.environ['WORK_SECONDS'])\n"
    "while time.time() < end:\n"
    "    if hb: hb.beat()\n"
    "    time.sleep(0.5)\n"
)


def create_pods(
    core: Any, coord: Any, ns: str, n: int, seconds: float, heartbeat: float, leases: bool
) -> list[str]:
    from kubernetes import client

    from avsim.kube.pods import attempt_labels, pod_name

    names = []
    for i in range(n):
        name = pod_name("bench", f"c{i:04d}", "simulate", 1)
        labels = attempt_labels("bench", f"c{i:04d}", "simulate", 1, "gpu-spot")
        env = {"WORK_SECONDS": str(seconds)}
        if leases:
            env.update(
                AVSIM_LEASE_NAME=name, AVSIM_LEASE_NAMESPACE=ns, AVSIM_HEARTBEAT_SECONDS=str(heartbeat)
            )
        core.create_namespaced_pod(
            ns,
            client.V1Pod(
                metadata=client.V1ObjectMeta(name=name, labels=labels),
                spec=client.V1PodSpec(
                    restart_policy="Never",
                    containers=[
                        client.V1Container(
                            name="base",
                            image="reg/sim@sha256:" + "0" * 64,
                            command=[sys.executable, "-c", WORK],
                            env=[client.V1EnvVar(name=k, value=v) for k, v in env.items()],
                        )
                    ],
                ),
            ),
        )
        if leases:
            coord.create_namespaced_lease(
                ns,
                client.V1Lease(
                    metadata=client.V1ObjectMeta(name=name, labels=labels),
                    spec=client.V1LeaseSpec(lease_duration_seconds=int(heartbeat * 4)),
                ),
            )
        names.append(name)
    return names


async def wait_all(triggers: list[Any]) -> list[dict[str, Any]]:
    async def first(t: Any) -> dict[str, Any]:
        async for event in t.run():
            return dict(event.payload)
        raise RuntimeError("no event")

    return list(await asyncio.gather(*(first(t) for t in triggers)))


def stock_triggers(names: list[str]) -> list[Any]:
    from airflow.providers.cncf.kubernetes.triggers.pod import KubernetesPodTrigger

    now = dt.datetime.now(dt.UTC)
    return [
        KubernetesPodTrigger(
            pod_name=n,
            pod_namespace=NS_STOCK,
            trigger_start_time=now,
            base_container_name="base",
            kubernetes_conn_id="kube_bench",
            get_logs=True,
            startup_timeout=600,
            schedule_timeout=600,
        )
        for n in names
    ]


def avsim_triggers(names: list[str], heartbeat: float) -> list[Any]:
    from avsim.triggers.phase_pod import PhasePodTrigger

    started = dt.datetime.now(dt.UTC).isoformat()
    return [
        PhasePodTrigger(
            pod_name=n,
            namespace=NS_AVSIM,
            attempt=1,
            node_class="gpu-spot",
            lease_seconds=heartbeat * 4,
            kubernetes_conn_id="kube_bench",
            started_at=started,
        )
        for n in names
    ]


def running_seconds(kube: Any, ns: str) -> float:
    total = 0.0
    for pod in kube.pods(ns):
        for st in (pod.get("status") or {}).get("containerStatuses") or []:
            term = (st.get("state") or {}).get("terminated") or {}
            if term.get("startedAt") and term.get("finishedAt"):
                a = dt.datetime.fromisoformat(term["startedAt"].replace("Z", "+00:00"))
                b = dt.datetime.fromisoformat(term["finishedAt"].replace("Z", "+00:00"))
                total += (b - a).total_seconds()
    return total


def run_triggers(kind: str, names_file: Path, heartbeat: float) -> None:
    """The child process: wait on the pods with one kind of trigger; print the events as JSON."""
    names = json.loads(names_file.read_text())
    triggers = avsim_triggers(names, heartbeat) if kind == "avsim" else stock_triggers(names)
    t0 = time.monotonic()
    events = asyncio.run(wait_all(triggers))
    print(json.dumps({"events": events, "wall": time.monotonic() - t0}, default=str))


def batch(
    kube: Any, ns: str, n: int, seconds: float, heartbeat: float, tmp: Path, *, ours: bool
) -> dict[str, Any]:
    from kubernetes import client

    core, coord = client.CoreV1Api(), client.CoordinationV1Api()
    names = create_pods(core, coord, ns, n, seconds, heartbeat, leases=ours)
    names_file = tmp / f"{ns}-names.json"
    names_file.write_text(json.dumps(names))
    kube.reset_calls()
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--run-triggers",
            "avsim" if ours else "stock",
            "--names-file",
            str(names_file),
            "--heartbeat",
            str(heartbeat),
        ],
        check=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=os.environ.copy(),
    )
    child = json.loads(out.stdout.strip().splitlines()[-1])
    events, wall = child["events"], child["wall"]
    calls = kube.calls()
    total_calls = sum(calls.values())
    phase_seconds = running_seconds(kube, ns)
    by_kind: dict[str, int] = {}
    for c, k in calls.items():
        key = f"{c.verb} {c.resource}{'/' + c.subresource if c.subresource else ''}{' (watch)' if c.watch else ''}"
        by_kind[key] = by_kind.get(key, 0) + k
    ok = sum(
        1
        for e in events
        if e.get("status") in ("success", "ended") and e.get("outcome", "passed") == "passed"
    )
    gets = sum(k for c, k in calls.items() if c.verb == "get" and c.resource == "pods" and not c.subresource)
    return {
        "phases": n,
        "succeeded": ok,
        "seconds_between_gets_per_pod": round(phase_seconds / gets, 2) if gets else None,
        "wall_seconds": round(wall, 1),
        "running_phase_seconds": round(phase_seconds, 1),
        "api_calls": total_calls,
        "calls_per_phase_second": total_calls / phase_seconds if phase_seconds else float("nan"),
        "calls": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phases", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=120.0, help="work time of each phase")
    ap.add_argument(
        "--heartbeat", type=float, default=60.0, help="avsim's heartbeat interval (the manifest default)"
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="5 phases of 10 s, heartbeat every 5 s")
    ap.add_argument("--run-triggers", choices=("stock", "avsim"), help=argparse.SUPPRESS)
    ap.add_argument("--names-file", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run_triggers:
        run_triggers(args.run_triggers, args.names_file, args.heartbeat)
        return
    if args.quick:
        args.phases, args.seconds, args.heartbeat = 5, 10.0, 5.0

    from kubernetes import config
    from tests.support.kube_api import FakeKubeAPI

    env = dict(os.environ)
    env["PYTHONPATH"] = f"{ROOT / 'provider'}:{env.get('PYTHONPATH', '')}"
    with (
        tempfile.TemporaryDirectory(prefix="avsim-bench-k8s-") as tmp,
        FakeKubeAPI(workdir=Path(tmp) / "pods", env=env) as kube,
    ):
        kubeconfig = kube.write_kubeconfig(Path(tmp) / "kubeconfig")
        os.environ.update(kube.airflow_conn_env("kube_bench", kubeconfig))
        config.load_kube_config(config_file=str(kubeconfig))
        stock = batch(kube, NS_STOCK, args.phases, args.seconds, args.heartbeat, Path(tmp), ours=False)
        ours = batch(kube, NS_AVSIM, args.phases, args.seconds, args.heartbeat, Path(tmp), ours=True)
    ratio = ours["calls_per_phase_second"] / stock["calls_per_phase_second"]
    result = {"stock": stock, "avsim": ours, "ratio": ratio, "target": 0.1}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"{args.phases} concurrent phases of {args.seconds:g} s, avsim heartbeat every {args.heartbeat:g} s"
    )
    for label, r in (("stock KubernetesPodTrigger", stock), ("avsim PhasePodTrigger", ours)):
        print(
            f"  {label:28s} {r['api_calls']:7d} calls / {r['running_phase_seconds']:9.0f} phase-s = "
            f"{r['calls_per_phase_second']:.4f} calls per phase-second ({r['succeeded']}/{r['phases']} ended ok, "
            f"{r['wall_seconds']} s)"
        )
        if r["seconds_between_gets_per_pod"]:
            print(
                f"      one GET of each pod every {r['seconds_between_gets_per_pod']} s of its running time"
            )
        for k, v in list(r["calls"].items())[:6]:
            print(f"      {v:7d}  {k}")
    print(f"ratio avsim / stock: {ratio:.4f}  (target <= 0.1)")
    print(
        f"k8s_api_load: avsim_vs_stock={ratio:.4f} "
        f"avsim_calls_per_phase_second={ours['calls_per_phase_second']:.4f} "
        f"stock_calls_per_phase_second={stock['calls_per_phase_second']:.4f}"
    )


if __name__ == "__main__":
    main()
