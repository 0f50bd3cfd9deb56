"""A whole week, from trigger to report, on the real scheduler: does anything grow with the week?

Two weeks, each on a stack of its own (scheduler, dag-processor, triggerer, api-server,
LocalExecutor with parallelism 16, the metadata database on a private PostgreSQL cluster), with the
shipped canary (1 % of the cases, at least 20, then the gate) and shard poll, and fast fake phases
(``--time-scale 0.00005``: a 30-minute simulate works 0.09 s). Both weeks hold the same window of
cases in flight, S = 50 and W = 5 (250 cases: the small week fills it, the large one runs 40 shard
runs through it), so that what the comparison shows is what grows with the week and not with the
window. ``--shipped`` runs both with the shipped S and W instead (``[avsim] shard_size`` 250,
``max_active_shards`` 6: 1,500 cases in flight, a window this machine's scheduler cannot carry with
fast phases, see docs/performance.md) and stops a week at ``--timeout`` (30 minutes there),
reporting what it did by then. Each week is triggered as the weekly run and runs until its
``report`` has ended. Measured:

- phase task instances per second over the whole week (every shard run's phase task instances that
  ran, the canary's included: first phase start -> last phase end) and over its first 4 shards (first
  phase start -> the 4th shard run's end, the phase task instances ended by then), as
  ``bench/scheduler_scale.py`` measures them;
- the scheduler's loop (``scheduler.scheduler_loop_duration`` over StatsD on a loopback UDP port),
  longest and median, from the trigger to the report's end, for the large week and a small one;
- at the end: the parent run's task instances and XCom rows (and their bytes), every run's XCom rows,
  the metadata database's size and its largest tables, and the time the weekly-run page's API takes
  to answer (cold, then the median of 10).

Prints both weeks and the ratios whole week / first 4 shards (goal >= 0.9) and longest loop large /
small (goal <= 1.2), then one line::

    whole_week: cases=N throughput_ratio=R loop_ratio=R

    flock /tmp/avsim-heavy.lock .venv/bin/python bench/whole_week.py             # 2,000 and 250 cases
    flock /tmp/avsim-heavy.lock .venv/bin/python bench/whole_week.py --quick     # 200 and 70 cases
    flock /tmp/avsim-heavy.lock .venv/bin/python bench/whole_week.py --shipped   # S = 250, W = 6

``--quick`` keeps the full run's shape at a fifth of its shard size: S = 10, W = 5, a 70-case week
filling the window against a 200-case week of 20 shard runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from scheduler_scale import StatsdSink  # noqa: E402

PARENT, SHARD = "avsim_weekly", "avsim_weekly_shard"
#: The scheduler's own StatsD timings that can tell which part of a long loop took the time.
SCHEDULER_PARTS = ("scheduler.critical_section", "scheduler.executor_heartbeat", "dagrun.dependency-check")


@dataclass
class Week:
    cases: int
    seconds: float  # trigger -> report end
    state: str
    shards: int
    phases: int
    phase_seconds: float  # first phase start -> last phase end
    first4_phases: int
    first4_seconds: float
    loops: list[float]
    sizes: dict[str, Any] = field(default_factory=dict)
    longest: list[tuple[float, float, str]] = field(default_factory=list)  # (s after trigger, ms, parts)

    @property
    def rate(self) -> float:
        return self.phases / self.phase_seconds

    @property
    def first4_rate(self) -> float:
        return self.first4_phases / self.first4_seconds

    @property
    def max_loop(self) -> float:
        return max(self.loops) if self.loops else float("nan")

    @property
    def median_loop(self) -> float:
        return statistics.median(self.loops) if self.loops else float("nan")

    @property
    def p95_loop(self) -> float:
        return statistics.quantiles(self.loops, n=20)[-1] if len(self.loops) > 1 else float("nan")


def _epoch(value: Any) -> float:
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return float(value.timestamp())


def run_week(cases: int, args: argparse.Namespace, base: Path) -> Week:
    from tests.support.airflow_run import api, query, trigger, wait_for_run
    from tests.support.postgres import postgres_cluster

    from avsim.devstack.demo import demo_pools, wait_for_dag
    from avsim.devstack.stack import LocalStack
    from avsim.manifest.sample import sample_manifest

    sink = StatsdSink()
    env = {
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(sink.port),
        "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
    }
    if args.shard_size:
        env["AIRFLOW__AVSIM__SHARD_SIZE"] = str(args.shard_size)
    if args.max_active_shards:
        env["AIRFLOW__AVSIM__MAX_ACTIVE_SHARDS"] = str(args.max_active_shards)
    env.update(dict(kv.split("=", 1) for kv in args.env))
    try:
        with postgres_cluster() as url:
            stack = LocalStack(
                home=base / "airflow",
                dags_folder=ROOT / "dags",
                plugins_folder=ROOT / "plugins",
                sql_alchemy_conn=url,
                parallelism=args.parallelism,
                extra_env=env,
            )
            stack.set_pools(demo_pools(gpus=args.parallelism, cpus=args.parallelism))
            stack.start()
            try:
                wait_for_dag(stack, PARENT)
                wait_for_dag(stack, SHARD)
                manifest = base / "week.json"
                manifest.write_text(json.dumps(sample_manifest(cases, time_scale=args.time_scale)))
                run_id = f"week__{cases}"
                t0 = time.time()
                trigger(stack, PARENT, run_id, {"manifest": str(manifest)})
                try:
                    state = wait_for_run(stack, PARENT, run_id, timeout=args.timeout)
                except TimeoutError:  # measure what the week did by then
                    state = f"still running after {args.timeout:.0f} s"
                t1 = time.time()
                week = measure(stack, query, cases, run_id, state, t1 - t0, sink.loops(t0, t1))
                week.sizes.update(page_times(stack, api, run_id))
                week.longest = longest_loops(sink, t0, t1)
                return week
            finally:
                stack.stop()
    finally:
        sink.close()


def measure(
    stack: Any, query: Any, cases: int, run_id: str, state: str, seconds: float, loops: list[float]
) -> Week:
    pattern = f"{run_id}__%"
    shard_ends = query(
        stack,
        "SELECT run_id, end_date FROM dag_run WHERE dag_id = :d AND run_id LIKE :p AND run_id LIKE '%\\_\\_shard\\_%' "
        "AND end_date IS NOT NULL ORDER BY end_date",
        d=SHARD,
        p=pattern,
    )
    ran = "FROM task_instance WHERE dag_id = :d AND run_id LIKE :p AND map_index >= 0 AND start_date IS NOT NULL AND state != 'skipped'"
    first, last, phases = query(
        stack, f"SELECT min(start_date), max(end_date), count(*) {ran}", d=SHARD, p=pattern
    )[0]
    fourth = shard_ends[min(3, len(shard_ends) - 1)].end_date if shard_ends else last
    first4 = query(stack, f"SELECT count(*) {ran} AND end_date <= :e", d=SHARD, p=pattern, e=fourth)[0][0]
    sizes: dict[str, Any] = {}
    parent = query(
        stack,
        "SELECT (SELECT count(*) FROM task_instance WHERE dag_id = :d AND run_id = :r), "
        "(SELECT count(*) FROM xcom WHERE dag_id = :d AND run_id = :r), "
        "(SELECT coalesce(sum(pg_column_size(value)), 0) FROM xcom WHERE dag_id = :d AND run_id = :r)",
        d=PARENT,
        r=run_id,
    )[0]
    sizes["parent task instances"], sizes["parent XCom rows"], sizes["parent XCom bytes"] = (
        int(x) for x in parent
    )
    xcom = query(stack, "SELECT count(*), coalesce(sum(pg_column_size(value)), 0) FROM xcom")[0]
    sizes["XCom rows"], sizes["XCom bytes"] = int(xcom[0]), int(xcom[1])
    sizes["database MB"] = round(query(stack, "SELECT pg_database_size(current_database())")[0][0] / 2**20, 1)
    tables = query(
        stack,
        "SELECT relname, pg_total_relation_size(relid) FROM pg_catalog.pg_statio_user_tables "
        "ORDER BY 2 DESC LIMIT 5",
    )
    sizes["largest tables MB"] = {name: round(size / 2**20, 1) for name, size in tables}
    t_first, t_last, t_fourth = _epoch(first), _epoch(last), _epoch(fourth)
    return Week(
        cases=cases,
        seconds=seconds,
        state=state,
        shards=len(shard_ends),
        phases=int(phases),
        phase_seconds=t_last - t_first,
        first4_phases=int(first4),
        first4_seconds=t_fourth - t_first,
        loops=loops,
        sizes=sizes,
    )


def longest_loops(sink: Any, start: float, end: float, n: int = 5) -> list[tuple[float, float, str]]:
    """The n longest scheduler loops: when they ended (seconds after the trigger), their length, and
    the scheduler's other timings (SCHEDULER_PARTS) that ended inside them and took a fifth of the
    loop or more (which part of the loop was long)."""
    found = []
    for t, ms in sorted(sink.timed_loops(start, end), key=lambda x: -x[1])[:n]:
        inside = sorted(
            (
                (other_ms, name.removeprefix("airflow."))
                for name, vals in sink.timings.items()
                if name.removeprefix("airflow.").startswith(SCHEDULER_PARTS)
                for other_t, other_ms in vals
                if t - ms / 1000 - 0.2 <= other_t <= t + 0.2 and ms / 5 <= other_ms <= ms * 1.05
            ),
            reverse=True,
        )
        parts = "; ".join(f"{name} {other_ms:.0f}" for other_ms, name in inside[:4])
        found.append((round(t - start, 1), ms, parts))
    return found


def page_times(stack: Any, api: Any, run_id: str) -> dict[str, float]:
    """The weekly-run page's API (first page of failed cases): cold, then the median of 10."""
    path = f"/avsim/api/runs/{PARENT}/{run_id}/progress"
    times = []
    for _ in range(11):
        t = time.perf_counter()
        api(stack, "GET", path)
        times.append((time.perf_counter() - t) * 1000)
    return {"page cold ms": round(times[0], 1), "page median ms": round(statistics.median(times[1:]), 1)}


def report(w: Week) -> None:
    print(
        f"{w.cases:6d}-case week ({w.state}): {w.shards} shard runs ended, {w.seconds:.0f} s trigger -> report; "
        f"{w.phases} phase task instances in {w.phase_seconds:.0f} s = {w.rate:.2f}/s; "
        f"first 4 shards: {w.first4_phases} in {w.first4_seconds:.0f} s = {w.first4_rate:.2f}/s; "
        f"scheduler loop max {w.max_loop:.0f} ms, p95 {w.p95_loop:.0f} ms, median {w.median_loop:.0f} ms "
        f"({len(w.loops)} loops)",
        flush=True,
    )
    for t, ms, parts in w.longest:
        print(
            f"    a loop of {ms:.0f} ms ending {t:.0f} s after the trigger: {parts or 'no part of it reported'}"
        )
    print("    " + json.dumps(w.sizes), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--small", type=int, default=250)
    ap.add_argument("--quick", action="store_true", help="200 and 70 cases, S = 10, W = 5")
    ap.add_argument(
        "--shipped", action="store_true", help="the shipped S and W (250, 6), stopped at --timeout"
    )
    ap.add_argument("--shard-size", type=int, default=50, help="S; 0: the shipped [avsim] shard_size")
    ap.add_argument(
        "--max-active-shards", type=int, default=5, help="W; 0: the shipped [avsim] max_active_shards"
    )
    ap.add_argument("--parallelism", type=int, default=16)
    ap.add_argument("--time-scale", type=float, default=0.00005)
    ap.add_argument(
        "--timeout", type=float, default=0, help="seconds a week may take (0: 4 h; 30 min --shipped)"
    )
    ap.add_argument("--env", action="append", default=[], help="extra KEY=VALUE for the stacks (repeatable)")
    args = ap.parse_args()
    from bytecode import ensure_bytecode

    ensure_bytecode()  # measure what a deployment pays (bench/bytecode.py)
    if args.quick:
        args.cases, args.small, args.shard_size, args.max_active_shards = 200, 70, 10, 5
    if args.shipped:
        args.shard_size = args.max_active_shards = 0
    args.timeout = args.timeout or (1800 if args.shipped else 4 * 3600)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the stack and clean up, as Ctrl-C does
    started = time.monotonic()
    weeks = []
    for cases in (args.small, args.cases):
        load = os.getloadavg()[0]
        with tempfile.TemporaryDirectory(prefix=f"avsim-week-{cases}-") as tmp:
            w = run_week(cases, args, Path(tmp))
        weeks.append(w)
        report(w)
        print(f"    (load average {load:.1f} -> {os.getloadavg()[0]:.1f})", flush=True)
    small, large = weeks
    throughput = large.rate / large.first4_rate
    loop = large.max_loop / small.max_loop
    print(f"throughput, whole {large.cases}-case week / its first 4 shards: {throughput:.3f}  (goal >= 0.9)")
    print(f"longest scheduler loop, {large.cases} / {small.cases} cases: {loop:.3f}  (goal <= 1.2)")
    print(
        f"median scheduler loop, {large.cases} / {small.cases} cases: {large.median_loop / small.median_loop:.3f}"
    )
    print(f"({time.monotonic() - started:.0f} s in all)")
    print(f"whole_week: cases={large.cases} throughput_ratio={throughput:.3f} loop_ratio={loop:.3f}")


if __name__ == "__main__":
    main()
