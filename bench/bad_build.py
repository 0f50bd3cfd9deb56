"""GPU-hours a bad simulator build burns before the week stops, as a share of the week's planned GPU-hours.

A 10,000-case sample week runs on the real Airflow components (scheduler, dag-processor, triggerer,
api-server, LocalExecutor, SQLite) with a build that crashes every case in its first phase. The canary
(1 % of the cases, at least 20) runs first at the top priority; the canary gate fails once more than
its threshold of canary cases crashed, and the build's circuit breaker fails the phases not yet
started; when the gate fails it opens the breaker, so no canary attempt starts after the decision.
The run ends failed without starting the rest of the week. GPU-seconds are read from the ledger
(every attempt of a GPU phase: its duration times its GPUs, scaled back from the fake phases'
``--time-scale``) and divided by the plan's GPU-seconds (``manifest/plan.json``).

Two builds are measured in the same run, each its own week:

* ``first phase``: the crash is in every case's first phase (prepare, on a CPU): the literal case;
* ``first GPU phase``: the build passes prepare and crashes in simulate/perceive, the first phase that
  holds a GPU: the costly case, where every crash burns GPU time.

It ends with ``bad_build: spent_vs_planned=R after_decision_share=R`` (the worse of the two builds).

    python bench/bad_build.py [--cases 10000] [--time-scale 0.0005] [--gpus 32]
    python bench/bad_build.py --quick      # 300 cases, GPU spot pool of 8 slots
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PARENT = "avsim_weekly"


def bad_manifest(cases: int, time_scale: float, where: str, seed: int) -> dict[str, Any]:
    from avsim.manifest.sample import sample_manifest

    doc = sample_manifest(cases, seed=seed, time_scale=time_scale, scenario_fail_rate=0.0)
    for graph in doc["graphs"].values():
        for name, phase in graph["phases"].items():
            first_gpu = phase["resources"]["class"] == "gpu" and not any(
                graph["phases"][d]["resources"]["class"] == "gpu" for d in phase.get("depends_on", [])
            )
            if (where == "first phase" and not phase.get("depends_on")) or (
                where == "first GPU phase" and first_gpu and name != "render"
            ):
                phase["args"] += ["--crash-rate", "1"]
    return doc


def measure(
    stack: Any, doc: dict[str, Any], run_id: str, time_scale: float, timeout: float
) -> dict[str, Any]:
    from avsim.artifacts import RunLayout, run_key_for
    from avsim.ledger.store import Ledger
    from avsim.storage import read_json

    path = stack.home / f"{run_id}.json"
    path.write_text(json.dumps(doc))
    t0 = time.monotonic()
    stack.airflow(
        "dags", "trigger", PARENT, "--run-id", run_id, "--conf", json.dumps({"manifest": str(path)})
    )
    state = wait(stack, run_id, timeout)
    wall = time.monotonic() - t0
    layout = RunLayout(f"file://{stack.home / 'artifacts'}", run_key_for(PARENT, run_id))
    planned = read_json(layout.plan_uri)
    ledger = Ledger(layout)
    gate = read_json(layout.canary_gate)
    # The gate's decision: its record's last write (it is written on every look until decided).
    decided = dt.datetime.fromisoformat(gate["updated_at"]) if gate.get("state") == "failed" else None
    gpu_seconds = after_decision = 0.0
    attempts = launched = blocked = 0
    for case in doc["cases"]:
        for phase in doc["graphs"][case["graph"]]["phases"]:
            for a in ledger.attempts(case["id"], phase):
                attempts += 1
                if a.detail == "breaker_open":
                    blocked += 1
                    continue
                launched += 1
                if a.gpus:
                    spent = a.duration_seconds * a.gpus / time_scale
                    gpu_seconds += spent
                    if decided is not None and dt.datetime.fromisoformat(a.started_at) >= decided:
                        after_decision += spent
    shard_runs = stack_query(
        stack, f"SELECT count(*) FROM dag_run WHERE dag_id = '{PARENT}_shard' AND run_id LIKE '{run_id}__%'"
    )
    return {
        "run_state": state,
        "wall_seconds": round(wall, 1),
        "planned_gpu_hours": planned["gpu_seconds"] / 3600,
        "spent_gpu_hours": gpu_seconds / 3600,
        "ratio": gpu_seconds / planned["gpu_seconds"],
        # Of the GPU time the bad build got, the share its attempts started after the gate decided.
        "after_decision": after_decision / gpu_seconds if gpu_seconds else 0.0,
        "attempts_launched": launched,
        "attempts_refused_by_breaker": blocked,
        "canary_gate": gate.get("state"),
        "canary_cases": gate.get("cases"),
        "shard_runs_started": shard_runs,
    }


def stack_query(stack: Any, sql: str) -> Any:
    import sqlalchemy

    with sqlalchemy.create_engine(stack.conn).connect() as c:
        return c.execute(sqlalchemy.text(sql)).scalar()


def wait(stack: Any, run_id: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = stack_query(
            stack, f"SELECT state FROM dag_run WHERE dag_id = '{PARENT}' AND run_id = '{run_id}'"
        )
        if state in ("success", "failed"):
            return str(state)
        time.sleep(2)
    raise TimeoutError(f"{run_id} did not finish in {timeout:.0f}s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--time-scale", type=float, default=0.0005, help="fake seconds per planned second")
    ap.add_argument("--gpus", type=int, default=32, help="GPU spot pool slots")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--quick", action="store_true", help="300 cases, 8 GPU slots (unless given)")
    args = ap.parse_args()
    if args.quick:
        args.cases = 300 if args.cases == ap.get_default("cases") else args.cases
        args.gpus = 8 if args.gpus == ap.get_default("gpus") else args.gpus

    from avsim.devstack.demo import checkout_folder, demo_pools, wait_for_dag
    from avsim.devstack.stack import LocalStack

    results = {}
    with tempfile.TemporaryDirectory(prefix="avsim-bench-badbuild-") as tmp:
        stack = LocalStack(
            home=Path(tmp) / "airflow",
            dags_folder=checkout_folder("dags"),
            plugins_folder=checkout_folder("plugins"),
            extra_env={"AIRFLOW__AVSIM__SHARD_POLL_SECONDS": "2", "AIRFLOW__CORE__MAX_MAP_LENGTH": "10000"},
        )
        try:
            stack.migrate()
            stack.set_pools(demo_pools(gpus=args.gpus, cpus=2 * args.gpus))
            stack.start()
            wait_for_dag(stack, PARENT)
            wait_for_dag(stack, f"{PARENT}_shard")
            for n, where in enumerate(("first phase", "first GPU phase")):
                doc = bad_manifest(args.cases, args.time_scale, where, seed=100 + n)
                results[where] = measure(stack, doc, f"bench__badbuild_{n}", args.time_scale, args.timeout)
        finally:
            stack.stop()
    print(f"a {args.cases}-case week on a build that crashes every case; GPU spot pool of {args.gpus} slots")
    print(
        "| crash in | planned GPU-h | spent GPU-h | spent / planned | spent after the gate decided | attempts "
        "launched | refused by breaker | canary gate | shard runs | weekly run |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for where, r in results.items():
        print(
            f"| {where} | {r['planned_gpu_hours']:.0f} | {r['spent_gpu_hours']:.2f} | {r['ratio']:.3%} | "
            f"{r['after_decision']:.1%} | {r['attempts_launched']} | {r['attempts_refused_by_breaker']} | "
            f"{r['canary_gate']} ({r['canary_cases']} cases) | {r['shard_runs_started']} | {r['run_state']} |"
        )
    worst = max(r["ratio"] for r in results.values())
    late = max(r["after_decision"] for r in results.values())
    print(f"worst spent / planned: {worst:.3%} (target <= 0.5 %)")
    print(f"bad_build: spent_vs_planned={worst:.5f} after_decision_share={late:.4f}")


if __name__ == "__main__":
    main()
