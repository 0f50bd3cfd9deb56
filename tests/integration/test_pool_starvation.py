"""Pools on the real scheduler: one pool's phases must not starve another's (apache/airflow#45636).

The DAGs here have the shard DAG's shape: one mapped task group per case with the deployed
catalog's phases, pools, ``pool_slots`` and priority weights (prepare 10039 > simulate 10036 >
evaluate 10006 > report 10001) and its ``max_active_tasks`` (2 S), with quick Python phases.
Pools come from ``avsim pools sync``: 1 GPU, and a CPU pool (64) that is never the constraint.

How Airflow 3.3.2 picks work (``SchedulerJobRunner._executable_task_instances_to_queued``): one
query takes the scheduled task instances of every run, at most ``max_active_tasks`` rows per run,
leaves out pools that were full when the loop started, orders by priority and keeps the first
LIMIT = min(``[scheduler] max_tis_per_query`` (16), ``[core] parallelism`` - running, free slots
of all pools). It queues what fits and stops at the first batch that queued anything. So while
the higher-priority pool is not full and has a backlog of at least LIMIT ready phases, the other
pool's ready phases are not even looked at, however idle their pool.

- ``test_with_default_limits_ready_gpu_phases_wait_for_the_cpu_backlog``: ``parallelism`` 16
  (below the pools' 65 slots) and ``max_tis_per_query`` 16. A shard's prepares wait for executor
  slots, each loop's LIMIT is filled with prepares, and no simulation starts until every prepare
  has: loops queue CPU phases while a simulation is ready and the GPU idle.
- ``test_with_wide_queries_cpu_phases_finish_while_gpu_phases_wait``: the fix, ``parallelism``
  above the pools' slots and ``max_tis_per_query = 0`` (the query is then bounded by
  ``parallelism``): every loop looks at every ready phase, no loop leaves the GPU idle with a
  simulation ready, and CPU phases finish while GPU phases wait for their one slot.
- ``test_include_deferred_keeps_deferred_phases_in_their_pool``: a deferred phase still holds its
  slot only in a pool with ``include_deferred`` (what ``avsim pools sync`` writes).

Sizes are small on purpose: what matters is a backlog longer than LIMIT (16 rows), not thousands
of task instances, which would make each scheduler loop take a minute here (``docs/design.md``).
"""

from __future__ import annotations

import datetime as dt
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.support.airflow_run import api, query
from tests.support.postgres import postgres_cluster

from avsim.devstack.demo import wait_for_dag
from avsim.devstack.stack import LocalStack

# Long: three stacks of scheduler behaviour, about 2 minutes on 2 cores.
pytestmark = [pytest.mark.integration, pytest.mark.long]

ROOT = Path(__file__).resolve().parents[2]
CASES = 48
EXECUTOR_SLOTS = 16  # [core] parallelism of the failing configuration
GPU_SLOTS = 1
CPU_SLOTS = 64  # never the constraint: more than the executor ever runs, more than a shard's prepares
#: A simulation that ended this close before a loop still held the GPU when that loop started.
LOOP_SLACK = dt.timedelta(seconds=2)

SHARD_SHAPED_DAG = '''
"""{dag_id}: the shard DAG's shape and weights, quick phases (written by test_pool_starvation)."""
import time
from pathlib import Path

from airflow.sdk import DAG, task, task_group

from avsim.dagbuild.factory import load_plan
from avsim.dagbuild.shard_dag import START_DATE
from avsim.settings import AvsimSettings

plan = load_plan(Path({catalog!r}), AvsimSettings(shard_size={cases}))
family = plan.family("standard")


@task
def phase(case, name, seconds):
    time.sleep(seconds)


with DAG(
    dag_id={dag_id!r},
    schedule=None,
    start_date=START_DATE,
    catchup=False,
    max_active_tasks={max_active_tasks},
    is_paused_upon_creation=False,
):

    @task(task_id="cases_standard")
    def cases():
        return [{{"case_id": f"c{{i:04d}}"}} for i in range({cases})]

    @task_group(group_id=family.group_id)
    def group(case):
        made = {{}}
        for p in family.phases:
            made[p.name] = phase.override(
                task_id=p.name,
                pool=p.pool,
                pool_slots=p.pool_slots,
                priority_weight=p.priority_weight,
                weight_rule="absolute",
                retries=0,
            )(case, p.name, {gpu_seconds} if p.gpus else 0.0)
        for p in family.phases:
            for up in p.upstream:
                made[up] >> made[p.name]

    group.expand(case=cases())
'''

DEFERRED_DAG = '''
"""deferred_pools: deferred phases in a pool that counts them and in one that does not."""
import datetime as dt

from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger
from airflow.sdk import DAG, BaseOperator

from avsim.dagbuild.shard_dag import START_DATE


class HoldSlot(BaseOperator):
    """A phase watched from the triggerer: it holds its node while deferred."""

    def __init__(self, *, seconds, **kwargs):
        super().__init__(**kwargs)
        self.seconds = seconds

    def execute(self, context):
        self.defer(trigger=TimeDeltaTrigger(dt.timedelta(seconds=self.seconds)), method_name="done")

    def done(self, context, event=None):
        return None


with DAG(dag_id="deferred_pools", schedule=None, start_date=START_DATE, catchup=False,
         max_active_tasks=64, is_paused_upon_creation=False):
    HoldSlot.partial(task_id="counted", pool="avsim_gpu_spot", retries=0).expand(seconds=[6] * 8)
    HoldSlot.partial(task_id="uncounted", pool="uncounted_gpus", retries=0).expand(seconds=[6] * 8)
'''


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    base = tmp_path_factory.mktemp("starvation")
    dags = base / "dags"
    dags.mkdir()
    catalog = str(ROOT / "dags" / "avsim_graphs.yaml")
    common = {"catalog": catalog, "cases": CASES, "gpu_seconds": 2.0}
    # As the shard DAG: max_active_tasks = 2 S, more than a shard ever has scheduled at once.
    for dag_id in ("shards_default", "shards_wide"):
        (dags / f"{dag_id}.py").write_text(
            SHARD_SHAPED_DAG.format(dag_id=dag_id, max_active_tasks=2 * CASES, **common)
        )
    (dags / "deferred_pools.py").write_text(DEFERRED_DAG)
    with postgres_cluster() as url:
        s = LocalStack(
            home=base / "airflow",
            dags_folder=dags,
            sql_alchemy_conn=url,
            parallelism=EXECUTOR_SLOTS,
            extra_env={
                "AIRFLOW__SCHEDULER__MAX_TIS_PER_QUERY": "16",
                # Parse each DAG file once: these DAGs do not change during the test.
                "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "3600",
            },
        )
        assert "created avsim_gpu_spot: slots 1" in _sync_pools(s, GPU_SLOTS)
        s.start(["api-server", "dag-processor", "scheduler", "triggerer"])
        try:
            for dag_id in ("shards_default", "shards_wide", "deferred_pools"):
                wait_for_dag(s, dag_id)
            yield s
        finally:
            s.stop()


def _restart_scheduler(stack: LocalStack, parallelism: int, env: dict[str, str]) -> None:
    stack.kill("scheduler", signal.SIGTERM)
    stack.procs.pop("scheduler", None)
    stack.parallelism = parallelism
    stack.extra_env = {**stack.extra_env, **env}
    stack.start(["scheduler"])


def _trigger(stack: LocalStack, dag_id: str, run_id: str) -> None:
    api(stack, "POST", f"/api/v2/dags/{dag_id}/dagRuns", {"dag_run_id": run_id, "logical_date": None})


def _drain(stack: LocalStack, dag_id: str) -> None:
    """Pause the DAG and wait for its queued and running phases to end, so they hold no pool slot."""
    api(stack, "PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": True})

    def idle() -> bool:
        [(busy,)] = query(
            stack,
            "SELECT count(*) FROM task_instance WHERE dag_id = :d AND state IN ('queued', 'running')",
            d=dag_id,
        )
        return busy == 0

    _wait(idle, 300, f"{dag_id}'s phases to end", stack)


def _sync_pools(stack: LocalStack, gpu_spot: int) -> str:
    capacity = stack.home / "capacity.yaml"
    capacity.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "avsim/v1",
                "kind": "Capacity",
                "gpu_spot": {"gpus": gpu_spot},
                "gpu_on_demand": {"gpus": 1},
                "cpu": {"slots": CPU_SLOTS},
            }
        )
    )
    synced = subprocess.run(
        [sys.executable, "-m", "avsim.cli", "pools", "sync", str(capacity)],
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert synced.returncode == 0, synced.stderr
    return synced.stdout


def _phases(stack: LocalStack, dag_id: str) -> dict[str, list[Any]]:
    rows = query(
        stack,
        "SELECT task_id, map_index, state, scheduled_dttm, queued_dttm, end_date FROM task_instance "
        "WHERE dag_id = :d AND map_index >= 0",
        d=dag_id,
    )
    out: dict[str, list[Any]] = {}
    for r in rows:
        out.setdefault(r.task_id.split(".")[-1], []).append(r)
    return out


#: A phase still to start: ready (scheduled) or waiting for its upstream (no state yet).
WAITING = ("scheduled", None)


def _count(tis: list[Any], *states: str | None) -> int:
    return sum(1 for t in tis if t.state in states)


def _wait(predicate: Any, timeout: float, what: str, stack: LocalStack) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = predicate()
        if got:
            return got
        time.sleep(1)
    log = (stack.home / "logs" / "scheduler.log").read_text()[-3000:]
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{log}")


def _gpu_idle_with_work(phases: dict[str, list[Any]]) -> list[Any]:
    """When a loop queued prepares while a simulation was ready and none held the GPU.

    The loop read the pools' occupancy when it started, which was after the loop before it queued
    anything: a simulation that ended since then (or within LOOP_SLACK) may still have held the GPU
    for it. On loaded cores a loop takes seconds, so the slack alone is not enough."""
    sims = phases.get("simulate", [])
    queued_at = sorted({p.queued_dttm for tis in phases.values() for p in tis if p.queued_dttm})
    out = []
    for t in sorted({p.queued_dttm for p in phases.get("prepare", []) if p.queued_dttm}):
        earlier = [q for q in queued_at if q < t]
        loop_start = min(earlier[-1], t - LOOP_SLACK) if earlier else t - LOOP_SLACK
        ready = any(
            s.scheduled_dttm and s.scheduled_dttm <= t and (s.queued_dttm is None or s.queued_dttm > t)
            for s in sims
        )
        busy = any(
            s.queued_dttm and s.queued_dttm <= t and (s.end_date is None or s.end_date > loop_start)
            for s in sims
        )
        if ready and not busy:
            out.append(t)
    return out


def test_with_default_limits_ready_gpu_phases_wait_for_the_cpu_backlog(stack: LocalStack) -> None:
    _trigger(stack, "shards_default", "backlog")

    def first_simulate_queued() -> Any:
        sims = [t for t in _phases(stack, "shards_default").get("simulate", []) if t.queued_dttm]
        return min(sims, key=lambda t: t.queued_dttm) if sims else None

    first = _wait(first_simulate_queued, 600, "the first simulate to be queued", stack)
    _drain(stack, "shards_default")
    phases = _phases(stack, "shards_default")
    prepares, sims = phases["prepare"], phases["simulate"]
    assert len(prepares) == CASES and all(p.queued_dttm for p in prepares)
    # No simulation started while a prepare waited (the last prepares at most in the same loop) ...
    assert max(p.queued_dttm for p in prepares) <= first.queued_dttm
    # ... though simulations were ready and the GPU pool empty while loops queued prepares.
    starved = _gpu_idle_with_work(phases)
    assert starved, "every loop that queued prepares found the GPU busy or nothing ready for it"
    ready_since = min(s.scheduled_dttm for s in sims if s.scheduled_dttm)
    idle = (first.queued_dttm - ready_since).total_seconds()
    print(
        f"\n[defaults] {len(starved)} loops queued prepares while a simulation was ready and the GPU idle; "
        f"the first ready simulation waited {idle:.1f}s for {CASES} prepares"
    )


def test_with_wide_queries_cpu_phases_finish_while_gpu_phases_wait(stack: LocalStack) -> None:
    _restart_scheduler(stack, 256, {"AIRFLOW__SCHEDULER__MAX_TIS_PER_QUERY": "0"})
    _trigger(stack, "shards_wide", "wide")

    def cpu_done_while_gpu_waits() -> Any:
        phases = _phases(stack, "shards_wide")
        reports_done = _count(phases.get("report", []), "success")
        if reports_done >= 5 and _count(phases.get("simulate", []), *WAITING) >= 10:
            return phases
        return None

    phases = _wait(cpu_done_while_gpu_waits, 600, "5 reports done while 10 simulations wait", stack)
    _drain(stack, "shards_wide")
    assert _gpu_idle_with_work(phases) == []
    sims = phases["simulate"]
    first = min(t.queued_dttm for t in sims if t.queued_dttm)
    ready_since = min(s.scheduled_dttm for s in sims if s.scheduled_dttm)
    print(
        f"\n[wide] the first ready simulation waited {(first - ready_since).total_seconds():.1f}s; "
        f"{_count(phases['evaluate'], 'success')} evaluates and {_count(phases['report'], 'success')} "
        f"reports done while {_count(sims, *WAITING)} simulations wait for the GPU"
    )


def test_include_deferred_keeps_deferred_phases_in_their_pool(stack: LocalStack) -> None:
    stack.set_pools({"uncounted_gpus": (2, "deferred phases not counted")}, include_deferred=False)
    assert _sync_pools(stack, 2).splitlines()[0] == "updated avsim_gpu_spot: slots 1 -> 2"
    [(counted_flag,)] = query(stack, "SELECT include_deferred FROM slot_pool WHERE pool = 'avsim_gpu_spot'")
    assert counted_flag, "avsim pools sync writes include_deferred"
    _trigger(stack, "deferred_pools", "deferred")
    peak = {"counted": 0, "uncounted": 0}
    end = time.monotonic() + 600  # 8 deferrals through 2 slots: minutes on 2 loaded cores
    while time.monotonic() < end:
        rows = query(
            stack,
            "SELECT task_id, state, count(*) FROM task_instance WHERE dag_id = 'deferred_pools' "
            "GROUP BY task_id, state",
        )
        holding = {"counted": 0, "uncounted": 0}
        done = {"counted": 0, "uncounted": 0}
        for task_id, state, n in rows:
            if state in ("queued", "running", "deferred"):
                holding[task_id] += n
            if state == "success":
                done[task_id] += n
        for k in peak:
            peak[k] = max(peak[k], holding[k])
        if done == {"counted": 8, "uncounted": 8}:
            break
        time.sleep(0.5)
    assert done == {"counted": 8, "uncounted": 8}
    assert peak["counted"] <= 2, peak
    assert peak["uncounted"] > 2, peak
    print(f"\n[include_deferred] most phases holding a 2-slot pool at once: {peak}")
