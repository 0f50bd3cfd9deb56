"""One stack, weeks triggered on it one after the other, and what each week measured.

``bench/whole_week.py``'s parts: :func:`week_stack` starts a stack (scheduler, dag-processor,
triggerer, api-server, LocalExecutor, a private PostgreSQL database) with a StatsD sink for the
scheduler's loop; :func:`run_week` triggers one weekly run on it, waits for it (sampling the
unfinished task instances of its shard runs every few seconds) and measures it (:class:`Week`).
Weeks of one stack have run ids of their own and are measured by run id, so several can share a
stack, one after the other.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import statistics
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduler_scale import StatsdSink

ROOT = Path(__file__).resolve().parents[1]
PARENT, SHARD = "avsim_weekly", "avsim_weekly_shard"
#: The scheduler's own StatsD timings that can tell which part of a long loop took the time.
SCHEDULER_PARTS = ("scheduler.critical_section", "scheduler.executor_heartbeat", "dagrun.dependency-check")
#: Task-instance states the scheduler still considers in each loop (and NULL: not scheduled yet).
UNFINISHED = ("scheduled", "queued", "running", "deferred", "up_for_retry", "up_for_reschedule")
SAMPLE_SECONDS = 3.0


@dataclass
class Week:
    config: str
    cases: int
    seconds: float  # trigger -> report end
    state: str
    shards: int
    phases: int
    phase_seconds: float  # first phase start -> last phase end
    first4_phases: int
    first4_seconds: float
    loops: list[float]
    unfinished: list[int] = field(default_factory=list)  # sampled unfinished shard-run TIs
    twins: list[int] = field(default_factory=list)  # of them, the on-demand twins (same samples)
    sizes: dict[str, Any] = field(default_factory=dict)
    longest: list[tuple[float, float, str]] = field(default_factory=list)  # (s after trigger, ms, parts)

    @property
    def rate(self) -> float:
        return self.phases / self.phase_seconds if self.phase_seconds > 0 else float("nan")

    @property
    def first4_rate(self) -> float:
        return self.first4_phases / self.first4_seconds if self.first4_seconds > 0 else float("nan")

    @property
    def max_loop(self) -> float:
        return max(self.loops) if self.loops else float("nan")

    @property
    def median_loop(self) -> float:
        return statistics.median(self.loops) if self.loops else float("nan")

    @property
    def p95_loop(self) -> float:
        return statistics.quantiles(self.loops, n=20)[-1] if len(self.loops) > 1 else float("nan")

    @property
    def peak_unfinished(self) -> int:
        return max(self.unfinished, default=0)

    @property
    def twin_share(self) -> float:
        """The twins' share of the unfinished task instances the loop carried, time-averaged over the samples."""
        return sum(self.twins) / sum(self.unfinished) if sum(self.unfinished) else math.nan


def _epoch(value: Any) -> float:
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return float(value.timestamp())


@contextlib.contextmanager
def bench_stack(
    base: Path, env: Mapping[str, str], *, parallelism: int = 16, gpus: int = 8, cpus: int = 16
) -> Iterator[Any]:
    """A started stack on its own PostgreSQL with the weekly DAGs loaded; ``env``: its extra settings."""
    from tests.support.postgres import postgres_cluster

    from avsim.devstack.demo import demo_pools, wait_for_dag
    from avsim.devstack.stack import LocalStack

    with postgres_cluster() as url:
        stack = LocalStack(
            home=base / "airflow",
            dags_folder=ROOT / "dags",
            plugins_folder=ROOT / "plugins",
            sql_alchemy_conn=url,
            parallelism=parallelism,
            extra_env=dict(env),
        )
        stack.set_pools(demo_pools(gpus=gpus, cpus=cpus))
        stack.start()
        try:
            wait_for_dag(stack, PARENT)
            wait_for_dag(stack, SHARD)
            yield stack
        finally:
            stack.stop()


@contextlib.contextmanager
def week_stack(
    env: Mapping[str, str], args: argparse.Namespace, base: Path
) -> Iterator[tuple[Any, StatsdSink]]:
    """A started stack whose scheduler reports to a StatsD sink; ``env``: the stack's extra settings."""
    sink = StatsdSink()
    statsd = {
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(sink.port),
        "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
    }
    try:
        with bench_stack(
            base,
            {**statsd, **env},
            parallelism=args.parallelism,
            gpus=args.parallelism,
            cpus=args.parallelism,
        ) as stack:
            yield stack, sink
    finally:
        sink.close()


class UnfinishedSampler:
    """Counts, every few seconds, the unfinished task instances of a week's running shard runs."""

    def __init__(self, conn: str, run_id: str) -> None:
        import sqlalchemy

        self.engine = sqlalchemy.create_engine(conn)
        self.run_id = run_id
        self.counts: list[int] = []
        #: Of each sample, the on-demand twins (``<phase>_on_demand``: docs/design.md, "Spot, then on-demand").
        self.twins: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from sqlalchemy import bindparam, text

        sql = text(
            "SELECT count(*), count(*) FILTER (WHERE ti.task_id LIKE '%\\_on\\_demand') "
            "FROM task_instance ti JOIN dag_run dr "
            "ON dr.dag_id = ti.dag_id AND dr.run_id = ti.run_id "
            "WHERE ti.dag_id = :d AND ti.run_id LIKE :p AND dr.state = 'running' "
            "AND (ti.state IS NULL OR ti.state IN :states)"
        ).bindparams(bindparam("states", expanding=True))
        params = {"d": SHARD, "p": f"{self.run_id}__%", "states": list(UNFINISHED)}
        while not self._stop.wait(SAMPLE_SECONDS):
            with contextlib.suppress(Exception), self.engine.connect() as c:  # a missed sample is no harm
                total, twins = c.execute(sql, params).one()
                self.counts.append(int(total or 0))
                self.twins.append(int(twins or 0))

    def close(self) -> list[int]:
        self._stop.set()
        self._thread.join(timeout=10)
        self.engine.dispose()
        return self.counts


def run_week(
    stack: Any, sink: StatsdSink, config: str, cases: int, run_id: str, args: argparse.Namespace
) -> Week:
    """Trigger one weekly run of ``cases`` sample cases on ``stack`` and measure it to its report."""
    from tests.support.airflow_run import api, trigger, wait_for_run

    from avsim.manifest.sample import sample_manifest

    manifest = stack.home / f"{run_id}.json"
    manifest.write_text(json.dumps(sample_manifest(cases, time_scale=args.time_scale)))
    t0 = time.time()
    trigger(stack, PARENT, run_id, {"manifest": str(manifest)})
    sampler = UnfinishedSampler(stack.conn, run_id)
    try:
        state = wait_for_run(stack, PARENT, run_id, timeout=args.timeout)
    except TimeoutError:  # measure what the week did by then
        state = f"still running after {args.timeout:.0f} s"
    finally:
        unfinished = sampler.close()
        twins = sampler.twins
    t1 = time.time()
    week = measure(stack, config, cases, run_id, state, t1 - t0, sink.loops(t0, t1))
    week.unfinished = unfinished
    week.twins = twins
    week.sizes.update(page_times(stack, api, run_id))
    week.longest = longest_loops(sink, t0, t1)
    return week


def measure(
    stack: Any, config: str, cases: int, run_id: str, state: str, seconds: float, loops: list[float]
) -> Week:
    from tests.support.airflow_run import query

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
    first4 = (
        query(stack, f"SELECT count(*) {ran} AND end_date <= :e", d=SHARD, p=pattern, e=fourth)[0][0]
        if fourth
        else 0
    )
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
    xcom = query(
        stack,
        "SELECT count(*), coalesce(sum(pg_column_size(value)), 0) FROM xcom WHERE run_id = :r OR run_id LIKE :p",
        r=run_id,
        p=pattern,
    )[0]
    sizes["XCom rows"], sizes["XCom bytes"] = int(xcom[0]), int(xcom[1])
    # The database's whole size: with the weeks triggered before on the same stack.
    sizes["database MB"] = round(query(stack, "SELECT pg_database_size(current_database())")[0][0] / 2**20, 1)
    tables = query(
        stack,
        "SELECT relname, pg_total_relation_size(relid) FROM pg_catalog.pg_statio_user_tables ORDER BY 2 DESC LIMIT 5",
    )
    sizes["largest tables MB"] = {name: round(size / 2**20, 1) for name, size in tables}
    t_first = _epoch(first) if first else 0.0
    return Week(
        config=config,
        cases=cases,
        seconds=seconds,
        state=state,
        shards=len(shard_ends),
        phases=int(phases),
        phase_seconds=_epoch(last) - t_first if first and last else 0.0,
        first4_phases=int(first4),
        first4_seconds=_epoch(fourth) - t_first if first and fourth else 0.0,
        loops=loops,
        sizes=sizes,
    )


def longest_loops(sink: StatsdSink, start: float, end: float, n: int = 5) -> list[tuple[float, float, str]]:
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
        f"{w.cases:6d}-case week, {w.config} ({w.state}): {w.shards} shard runs ended, "
        f"{w.seconds:.0f} s trigger -> report; "
        f"{w.phases} phase task instances in {w.phase_seconds:.0f} s = {w.rate:.2f}/s; "
        f"first 4 shards: {w.first4_phases} in {w.first4_seconds:.0f} s = {w.first4_rate:.2f}/s; "
        f"scheduler loop max {w.max_loop:.0f} ms, p95 {w.p95_loop:.0f} ms, median {w.median_loop:.0f} ms "
        f"({len(w.loops)} loops); unfinished shard-run task instances at most {w.peak_unfinished} "
        f"({len(w.unfinished)} samples every {SAMPLE_SECONDS:.0f} s; on-demand twins {w.twin_share * 100:.1f} % "
        "of them, time-averaged)",
        flush=True,
    )
    for t, ms, parts in w.longest:
        print(
            f"    a loop of {ms:.0f} ms ending {t:.0f} s after the trigger: {parts or 'no part of it reported'}"
        )
    print("    " + json.dumps(w.sizes), flush=True)
