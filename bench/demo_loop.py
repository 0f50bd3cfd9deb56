"""The demo's scheduler loop on SQLite: milliseconds per unfinished task instance, and the GPUs' gaps.

Runs the demo's week (``avsim demo``'s stack: SQLite, LocalExecutor, parallelism of every pool slot, 8
spot GPUs, 16 CPU slots, its ``[avsim]`` settings; the 200 sample cases with compressed time) with the scheduler's
StatsD timings sent to a loopback sink, and samples every second the unfinished task instances of
the running DAG runs (what each loop re-evaluates). Each loop is paired with the sample at its
middle; the least-squares slope of loop milliseconds over task instances is what ``[avsim]
scheduler_ms_per_task_instance`` stands for on the demo's database (3 ms was measured on PostgreSQL).
``--env KEY=VALUE`` adds a setting to the stack (e.g. the measured figure, to run the week with it).

Then, from the metadata database, the week as the weekly-run page plots it: GPUs busy over time,
and the seconds no GPU was busy while cases still waited to start. ``--home DIR`` analyses the
database of a finished demo (``.avsim/demo`` after ``make demo``) without running anything.

    flock /tmp/avsim-heavy.lock .venv/bin/python bench/demo_loop.py            # about 5 minutes
    .venv/bin/python bench/demo_loop.py --home .avsim/demo                     # the last make demo
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

PARENT, SHARD = "avsim_weekly", "avsim_weekly_shard"
UNFINISHED = ("scheduled", "queued", "running", "deferred", "up_for_retry", "up_for_reschedule")


def _ts(value: Any) -> float:
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return float(value.timestamp())


class Sampler:
    """(time, unfinished task instances of running DAG runs) every second."""

    def __init__(self, conn: str) -> None:
        import sqlalchemy

        self.engine = sqlalchemy.create_engine(conn)
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from sqlalchemy import text

        states = ", ".join(f"'{s}'" for s in UNFINISHED)
        sql = text(
            "SELECT count(*) FROM task_instance ti JOIN dag_run dr ON dr.dag_id = ti.dag_id "
            f"AND dr.run_id = ti.run_id WHERE dr.state = 'running' AND (ti.state IS NULL OR ti.state IN ({states}))"
        )
        while not self._stop.wait(1.0):
            with contextlib.suppress(Exception), self.engine.connect() as c:  # a locked read is skipped
                self.samples.append((time.time(), int(c.execute(sql).scalar() or 0)))

    def close(self) -> list[tuple[float, int]]:
        self._stop.set()
        self._thread.join(timeout=10)
        self.engine.dispose()
        return self.samples


def ms_per_task_instance(
    loops: list[tuple[float, float]], samples: list[tuple[float, int]]
) -> dict[str, float]:
    """Each loop (ended at, ms) against the sample nearest its middle: the least-squares line
    ms = a + b x task instances, and the median ms / task instance of loops over 200 of them."""
    pairs = []
    for end, ms in loops:
        mid = end - ms / 2000.0
        t, n = min(samples, key=lambda s: abs(s[0] - mid))
        if abs(t - mid) <= 1.5:
            pairs.append((n, ms))
    xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in pairs) / sxx if sxx else 0.0
    big = [ms / n for n, ms in pairs if n >= 200]
    return {
        "loops": len(pairs),
        "slope_ms": slope,
        "intercept_ms": my - slope * mx,
        "median_ms_over_200": statistics.median(big) if big else 0.0,
        "median_loop_ms": statistics.median(ys) if ys else 0.0,
        "max_loop_ms": max(ys, default=0.0),
        "median_tis": statistics.median(xs) if xs else 0.0,
        "max_tis": max(xs, default=0),
    }


def gpu_gaps(conn: str, run_id: str | None = None) -> dict[str, Any]:
    """The week's GPUs busy per second and the seconds none was busy while cases waited to start
    (a case waits from the week's start until its first phase starts)."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(conn)
    q = sqlalchemy.text
    with engine.connect() as c:
        if run_id is None:
            run_id = (
                c.execute(
                    q("SELECT run_id FROM dag_run WHERE dag_id = :d ORDER BY start_date DESC"), {"d": PARENT}
                )
                .scalars()
                .first()
            )
        start, end = c.execute(
            q("SELECT start_date, end_date FROM dag_run WHERE dag_id = :d AND run_id = :r"),
            {"d": PARENT, "r": run_id},
        ).one()
        tis = c.execute(
            q(
                "SELECT rendered_map_index, pool, pool_slots, state, start_date, end_date FROM task_instance "
                "WHERE dag_id = :s AND run_id LIKE :p AND map_index >= 0 AND start_date IS NOT NULL"
            ),
            {"s": SHARD, "p": f"{run_id}__%"},
        ).all()
        shards = c.execute(
            q(
                "SELECT run_id, queued_at, end_date FROM dag_run WHERE dag_id = :s AND run_id LIKE :p ORDER BY queued_at"
            ),
            {"s": SHARD, "p": f"{run_id}__%"},
        ).all()
    engine.dispose()
    t0, t1 = _ts(start), _ts(end)
    ran = [t for t in tis if t.state in ("success", "failed") and t.end_date is not None]
    gpu = [
        (_ts(t.start_date) - t0, _ts(t.end_date) - t0, t.pool_slots or 1)
        for t in ran
        if t.pool.startswith("avsim_gpu")
    ]
    first_phase: dict[str, float] = {}
    for t in ran:
        s = _ts(t.start_date) - t0
        first_phase[t.rendered_map_index] = min(first_phase.get(t.rendered_map_index, s), s)
    last_case_start = max(first_phase.values())
    seconds = int(t1 - t0) + 1
    busy = [sum(n * max(0.0, min(k + 1, e) - max(k, s)) for s, e, n in gpu) for k in range(seconds)]
    first_gpu = min(s for s, _, _ in gpu)
    waiting = range(int(first_gpu), int(last_case_start))
    return {
        "run_id": run_id,
        "week_seconds": round(t1 - t0, 1),
        "shard_runs": [
            (
                r.run_id.rsplit("__", 1)[-1],
                round(_ts(r.queued_at) - t0, 1),
                round(_ts(r.end_date) - t0, 1) if r.end_date else None,
            )
            for r in shards
        ],
        "phases": len(ran),
        "first_gpu_start": round(first_gpu, 1),
        "last_case_first_phase": round(last_case_start, 1),
        "last_gpu_end": round(max(e for _, e, _ in gpu), 1),
        "last_phase_end": round(max(_ts(t.end_date) - t0 for t in ran), 1),
        "gpu_idle_while_cases_wait": [k for k in waiting if busy[k] < 0.05],
        "gpu_mean_busy_while_cases_wait": round(statistics.fmean(busy[k] for k in waiting), 2)
        if waiting
        else 0.0,
        "gpu_busy_5s": [round(statistics.fmean(busy[k : k + 5]), 1) for k in range(0, seconds, 5)],
    }


def print_gaps(g: dict[str, Any]) -> None:
    idle = g["gpu_idle_while_cases_wait"]
    print(f"week {g['run_id']}: {g['week_seconds']} s trigger -> success, {g['phases']} phases ran")
    print(
        "shard runs (created, ended; s from the week's start): "
        + ", ".join(f"{n} {c}/{e}" for n, c, e in g["shard_runs"])
    )
    print(
        f"first GPU start {g['first_gpu_start']} s, last case's first phase {g['last_case_first_phase']} s, "
        f"last GPU end {g['last_gpu_end']} s, last phase end {g['last_phase_end']} s"
    )
    print(
        f"while cases waited to start: {len(idle)} s with no GPU busy {idle}; mean GPUs busy "
        f"{g['gpu_mean_busy_while_cases_wait']} of 8"
    )
    print("GPUs busy, 5 s means from the week's start: " + " ".join(f"{v:g}" for v in g["gpu_busy_5s"]))


def run(args: argparse.Namespace) -> None:
    from avsim.devstack.demo import demo_pools, demo_stack, wait_for_dag
    from avsim.manifest.sample import sample_manifest
    from scheduler_scale import StatsdSink

    sink = StatsdSink()
    env = {
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(sink.port),
        "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
        **dict(kv.split("=", 1) for kv in args.env),
    }
    with tempfile.TemporaryDirectory(prefix="avsim-bench-demo-") as tmp:
        pools = demo_pools(8, 16)
        stack = demo_stack(Path(tmp) / "demo", args.shard_size, args.max_active_shards, pools, env)
        try:
            stack.claim()
            stack.migrate()
            stack.set_pools(pools)
            stack.start()
            wait_for_dag(stack, PARENT)
            wait_for_dag(stack, SHARD)
            manifest = stack.home / "demo.json"
            manifest.write_text(
                json.dumps(
                    sample_manifest(args.cases, crash_rate=args.crash_rate, compress_retry_delays=True)
                )
            )
            run_id = "bench__demo_loop"
            t0 = time.time()
            stack.airflow(
                "dags",
                "trigger",
                PARENT,
                "--run-id",
                run_id,
                "--conf",
                json.dumps({"manifest": str(manifest)}),
            )
            sampler = Sampler(stack.conn)
            try:
                _wait(stack, run_id, args.timeout)
            finally:
                samples = sampler.close()
            t1 = time.time()
            fit = ms_per_task_instance(sink.timed_loops(t0, t1), samples)
            print(f"settings added: {args.env or 'none'}")
            print(
                f"scheduler loops {fit['loops']}: median {fit['median_loop_ms']:.0f} ms, longest "
                f"{fit['max_loop_ms']:.0f} ms; unfinished task instances median {fit['median_tis']:.0f}, most "
                f"{fit['max_tis']}"
            )
            print(
                f"loop ms = {fit['intercept_ms']:.0f} + {fit['slope_ms']:.2f} x task instances; median ms per "
                f"task instance of loops over 200: {fit['median_ms_over_200']:.2f}"
            )
            print_gaps(gpu_gaps(stack.conn, run_id))
            print(f"demo_loop: ms_per_task_instance={fit['slope_ms']:.2f}")
        finally:
            stack.stop()
            stack.release()
            sink.close()


def _wait(stack: Any, run_id: str, timeout: float) -> None:
    import sqlalchemy

    engine = sqlalchemy.create_engine(stack.conn)
    limit = time.monotonic() + timeout
    try:
        while time.monotonic() < limit:
            with contextlib.suppress(Exception), engine.connect() as c:
                state = c.execute(
                    sqlalchemy.text("SELECT state FROM dag_run WHERE dag_id = :d AND run_id = :r"),
                    {"d": PARENT, "r": run_id},
                ).scalar()
                if state in ("success", "failed"):
                    return
            time.sleep(2)
        raise TimeoutError(f"{run_id} did not finish in {timeout:.0f} s")
    finally:
        engine.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", type=Path, help="analyse this finished demo home's database; run nothing")
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--shard-size", type=int, default=50)
    ap.add_argument("--max-active-shards", type=int, default=2)
    ap.add_argument("--crash-rate", type=float, default=0.02)
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE added to the stack's environment")
    ap.add_argument("--timeout", type=float, default=1200)
    args = ap.parse_args()
    if args.home:
        print_gaps(gpu_gaps(f"sqlite:///{args.home.resolve() / 'airflow.db'}"))
        return
    from bytecode import ensure_bytecode

    ensure_bytecode()  # what make demo runs with (its bytecode target)
    run(args)


if __name__ == "__main__":
    main()
