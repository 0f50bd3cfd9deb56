"""Phase task instances per second with one Celery worker and with two, on the distributed stack.

The stack is docker-compose.yml's topology as processes on loopback (tests/support/distributed.py):
PostgreSQL, redis-server, the S3 server, FAB, scheduler, dag-processor, triggerer, api-server, and
Celery workers that each take every queue compose's worker takes, with compose's settings
(16 task slots per worker). Pools are large, so only the workers and the scheduler limit the rate.

Weeks of fast fake phases (no canary, one shard), one after another on the same stack. A worker's
first tries are slow (its 16 pool processes each pay their first imports and clients): measured
on this machine, a week on a fresh worker took 1.6 x as long as the same week on it later. So each
measured week follows a warm-up week of the same size on the same workers: warm-up, one worker;
warm-up, two workers (the second started in between); and a week on one worker again (the second
stopped), so drift over the run shows. For each week: phase task instances finished per second,
from the first phase's start to the last phase's end, a phase task instance's median start -> end,
and the broker's work per phase task instance, from Redis' own counters (``INFO commandstats``):

* Celery task messages published (``LPUSH``): one per try sent to a worker;
* all Redis commands (publish, the workers' polls and acknowledgements, heartbeats).

Prints the ratio two workers / one worker (one-worker rate: the mean of both one-worker weeks) and,
last, one machine-readable line:

    celery_workers: two_vs_one=R round_trips_per_phase=N redis_commands_per_phase=M

    python bench/celery_workers.py [--cases 40] [--quick]

``--quick`` (12 cases a week) finishes in under 10 minutes on 2 cores.
Run it under the shared lock: ``flock /tmp/avsim-heavy.lock .venv/bin/python bench/celery_workers.py``.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="avsim-bench-home-"))

SHARD = "avsim_weekly_shard"


@dataclass(frozen=True)
class Week:
    label: str
    workers: int
    phases: int
    seconds: float
    messages: int
    commands: int
    median_run: float  # a phase task instance's start -> end, median

    @property
    def rate(self) -> float:
        return self.phases / self.seconds

    def line(self) -> str:
        return (
            f"{self.label:<22} {self.workers} worker(s): {self.phases} phase task instances in "
            f"{self.seconds:.1f} s = {self.rate:.2f}/s; per phase: {self.messages / self.phases:.2f} "
            f"Celery messages, {self.commands / self.phases:.1f} Redis commands; a phase task instance's "
            f"start -> end {self.median_run:.1f} s (median)"
        )


def redis_counters(port: int) -> dict[str, int]:
    """Calls per Redis command since the server started (``INFO commandstats``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"INFO commandstats\r\n")
        data = b""
        while True:
            data += sock.recv(65536)
            head, _, rest = data.partition(b"\r\n")
            if head.startswith(b"$") and len(rest) >= int(head[1:]):
                break
    counts = {}
    for line in rest.decode().splitlines():
        if line.startswith("cmdstat_"):
            name, _, stats = line.partition(":")
            fields = dict(kv.split("=") for kv in stats.split(","))
            counts[name.removeprefix("cmdstat_")] = int(fields["calls"])
    return counts


def run_week(stack: Any, run_id: str, cases: int, label: str, workers: int) -> Week:
    from tests.support.airflow_run import query, wait_for_run
    from tests.support.distributed import ADMIN
    from tests.support.distributed_checks import call

    from avsim.manifest.sample import sample_manifest

    doc = sample_manifest(
        cases, time_scale=0.00002, scenario_fail_rate=0.0, crash_rate=0.0, canary={"enabled": False}
    )
    uri = stack.upload(f"manifests/{run_id}.json", doc)
    before = redis_counters(stack.redis_port)
    call(stack, "POST", "/api/v2/dags/avsim_weekly/dagRuns", ADMIN, {
        "dag_run_id": run_id, "logical_date": None, "conf": {"manifest": uri},
    })  # fmt: skip
    state = wait_for_run(stack, "avsim_weekly", run_id, timeout=3600)
    after = redis_counters(stack.redis_port)
    if state != "success":
        raise RuntimeError(f"week {run_id} ended {state}; see {stack.base}/logs")
    [(n, first, last, median_run)] = query(
        stack,
        "SELECT count(*), min(start_date), max(end_date), percentile_cont(0.5) WITHIN GROUP "
        "(ORDER BY extract(epoch FROM end_date - start_date)) FROM task_instance WHERE dag_id = :d "
        "AND position(:p in run_id) = 1 AND map_index >= 0 AND state = 'success'",
        d=SHARD,
        p=f"{run_id}__",
    )
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    return Week(
        label,
        workers,
        int(n),
        (last - first).total_seconds(),
        delta.get("lpush", 0),
        sum(delta.values()),
        float(median_run),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=40, help="cases per measured week")
    parser.add_argument("--quick", action="store_true", help="12 cases a week")
    args = parser.parse_args()
    from bytecode import ensure_bytecode

    ensure_bytecode()  # measure what a deployment pays (bench/bytecode.py)
    cases = 12 if args.quick else args.cases

    from tests.support.distributed import ADMIN, client_environment, distributed_stack
    from tests.support.distributed_checks import call

    from avsim.devstack.demo import wait_for_dag

    started = time.monotonic()
    base = Path(tempfile.mkdtemp(prefix="avsim-bench-celery-"))
    workers = {"worker": None, "worker-2": None}  # both take compose's queues
    weeks: list[Week] = []
    with (
        distributed_stack(base, start_workers=["worker"], capacity=(64, 16, 64), workers=workers) as stack,
        client_environment(stack),
    ):
        for dag_id in ("avsim_weekly", "avsim_weekly_shard"):
            wait_for_dag(stack, dag_id)
            call(stack, "PATCH", f"/api/v2/dags/{dag_id}", ADMIN, {"is_paused": False})
        print(f"stack up in {time.monotonic() - started:.0f} s ({base})", flush=True)
        print(run_week(stack, "bench__warm_one", cases, "warm-up", 1).line(), flush=True)
        weeks.append(run_week(stack, "bench__one", cases, "one worker", 1))
        print(weeks[-1].line(), flush=True)
        stack.start_component("worker-2")
        stack.wait_for_worker("worker-2")
        print(run_week(stack, "bench__warm_two", cases, "warm-up", 2).line(), flush=True)
        weeks.append(run_week(stack, "bench__two", cases, "two workers", 2))
        print(weeks[-1].line(), flush=True)
        stack.kill_tree("worker-2")  # idle between weeks: it held no task
        weeks.append(run_week(stack, "bench__one_again", cases, "one worker again", 1))
        print(weeks[-1].line(), flush=True)
    one = [w.rate for w in weeks if w.workers == 1]
    two = [w.rate for w in weeks if w.workers == 2]
    ratio = two[0] / (sum(one) / len(one))
    measured = list(weeks)
    messages = sum(w.messages for w in measured) / sum(w.phases for w in measured)
    commands = sum(w.commands for w in measured) / sum(w.phases for w in measured)
    load = os.getloadavg()[0]
    print(
        f"two workers / one worker: {ratio:.2f} (phase task instances per second); "
        f"load average {load:.1f}; {time.monotonic() - started:.0f} s in all"
    )
    print(f"celery_workers: two_vs_one={ratio:.2f} round_trips_per_phase={messages:.2f} "
          f"redis_commands_per_phase={commands:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
