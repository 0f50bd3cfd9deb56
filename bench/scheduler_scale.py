"""Scheduler cost does not grow with the week: a 10,000-case week vs a 1,000-case week.

Both weeks run on the real Airflow components (LocalExecutor, metadata database on a
private PostgreSQL cluster, or SQLite with --sqlite) with fast fake phases. Each run
stops once ``--shards`` shard runs have completed and reports, for the window from the
first phase's start to the last counted shard's end:

- phase task instances finished per second,
- the longest scheduler loop (``scheduler.scheduler_loop_duration``, received over
  StatsD on a loopback UDP port) and its median.

Then it prints the ratios large / small (targets: throughput >= 0.9, longest loop <= 1.2), last as
``scheduler_scale: throughput_ratio=R loop_ratio=R``.

    python bench/scheduler_scale.py [--small 1000] [--large 10000] [--shards 4]
        [--shard-size S] [--max-active-shards W] [--sqlite]
    python bench/scheduler_scale.py --quick      # 40 against 200 cases, 2 shard runs of 20 each
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PARENT, SHARD = "avsim_weekly", "avsim_weekly_shard"


class StatsdSink:
    """Collects StatsD timings sent to a loopback UDP port: name -> [(received_at, ms)]."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]
        self.timings: dict[str, list[tuple[float, float]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65535).decode(errors="replace")
            except TimeoutError:
                continue
            now = time.time()
            for line in data.splitlines():
                name, _, rest = line.partition(":")
                value, _, kind = rest.partition("|")
                if kind.startswith("ms"):
                    with contextlib.suppress(ValueError):
                        self.timings.setdefault(name, []).append((now, float(value)))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()

    def timed_loops(self, start: float, end: float) -> list[tuple[float, float]]:
        """The scheduler's loops that ended between ``start`` and ``end``: (received at, ms)."""
        return [
            (t, ms)
            for name, vals in self.timings.items()
            if name.endswith("scheduler_loop_duration")
            for t, ms in vals
            if start <= t <= end
        ]

    def loops(self, start: float, end: float) -> list[float]:
        return [ms for _, ms in self.timed_loops(start, end)]


@dataclass
class WeekResult:
    cases: int
    phases_finished: int
    seconds: float
    max_loop_ms: float
    median_loop_ms: float
    shards_total: int

    @property
    def rate(self) -> float:
        return self.phases_finished / self.seconds


@contextlib.contextmanager
def database(base: Path, sqlite: bool) -> Iterator[str | None]:
    if sqlite:
        yield None
        return
    from tests.support.postgres import postgres_cluster

    with postgres_cluster(base / "pg") as url:
        yield url


def run_week(cases: int, args: argparse.Namespace, base: Path) -> WeekResult:
    import sqlalchemy
    from sqlalchemy import text

    from avsim.devstack.demo import demo_pools, wait_for_dag
    from avsim.devstack.stack import LocalStack
    from avsim.manifest.sample import sample_manifest

    sink = StatsdSink()
    with database(base, args.sqlite) as url:
        stack = LocalStack(
            home=base / "airflow",
            dags_folder=ROOT / "dags",
            plugins_folder=ROOT / "plugins",
            sql_alchemy_conn=url,
            parallelism=args.parallelism,
            extra_env={
                "AIRFLOW__AVSIM__SHARD_SIZE": str(args.shard_size),
                "AIRFLOW__AVSIM__MAX_ACTIVE_SHARDS": str(args.max_active_shards),
                "AIRFLOW__AVSIM__SHARD_POLL_SECONDS": "2",
                "AIRFLOW__METRICS__STATSD_ON": "True",
                "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
                "AIRFLOW__METRICS__STATSD_PORT": str(sink.port),
                "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
            },
        )
        try:
            stack.migrate()
            stack.set_pools(demo_pools(gpus=args.parallelism, cpus=args.parallelism))
            stack.start()
            wait_for_dag(stack, PARENT)
            manifest = base / "week.json"
            manifest.write_text(
                json.dumps(sample_manifest(cases, time_scale=args.time_scale, crash_rate=0.0))
            )
            run_id = f"bench__{cases}"
            stack.airflow(
                "dags",
                "trigger",
                PARENT,
                "--run-id",
                run_id,
                "--conf",
                json.dumps({"manifest": str(manifest)}),
            )
            engine = sqlalchemy.create_engine(stack.conn)
            pattern = f"{run_id}__shard_%"
            deadline = time.monotonic() + args.timeout
            while True:
                with engine.connect() as c:
                    done = c.execute(
                        text(
                            "SELECT run_id, end_date FROM dag_run WHERE dag_id = :d AND run_id LIKE :p "
                            "AND state IN ('success', 'failed') ORDER BY end_date"
                        ),
                        {"d": SHARD, "p": pattern},
                    ).all()
                    total = c.execute(
                        text("SELECT count(*) FROM dag_run WHERE dag_id = :d AND run_id LIKE :p"),
                        {"d": SHARD, "p": pattern},
                    ).scalar()
                if len(done) >= args.shards:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{cases}-case week: {len(done)} of {args.shards} shards in {args.timeout}s"
                    )
                time.sleep(2)
            with engine.connect() as c:
                first = c.execute(
                    text(
                        "SELECT min(start_date) FROM task_instance WHERE dag_id = :d AND run_id LIKE :p "
                        "AND map_index >= 0"
                    ),
                    {"d": SHARD, "p": pattern},
                ).scalar()
                end = done[args.shards - 1].end_date
                finished = c.execute(
                    text(
                        "SELECT count(*) FROM task_instance WHERE dag_id = :d AND run_id LIKE :p "
                        "AND map_index >= 0 AND end_date <= :e"
                    ),
                    {"d": SHARD, "p": pattern, "e": end},
                ).scalar()
            t0, t1 = _epoch(first), _epoch(end)
            loops = sink.loops(t0, t1)
            return WeekResult(
                cases=cases,
                phases_finished=int(finished or 0),
                seconds=t1 - t0,
                max_loop_ms=max(loops) if loops else float("nan"),
                median_loop_ms=statistics.median(loops) if loops else float("nan"),
                shards_total=int(total or 0),
            )
        finally:
            stack.stop()
            sink.close()


def _epoch(value: object) -> float:
    import datetime as dt

    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    assert isinstance(value, dt.datetime)
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.timestamp()


def main() -> None:
    from avsim.settings import AvsimSettings

    defaults = AvsimSettings()
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", type=int, default=1000)
    ap.add_argument("--large", type=int, default=10_000)
    ap.add_argument("--shards", type=int, default=4, help="stop each week after this many completed shards")
    ap.add_argument("--shard-size", type=int, default=defaults.shard_size)
    ap.add_argument("--max-active-shards", type=int, default=defaults.max_active_shards)
    ap.add_argument("--parallelism", type=int, default=16)
    ap.add_argument("--time-scale", type=float, default=0.00005)
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--sqlite", action="store_true", help="SQLite instead of a private PostgreSQL cluster")
    ap.add_argument("--quick", action="store_true", help="40 against 200 cases, 2 shard runs of 20")
    args = ap.parse_args()
    if args.quick:
        args.small, args.large, args.shards, args.shard_size, args.max_active_shards = 40, 200, 2, 20, 2
    results = []
    for cases in (args.small, args.large):
        with tempfile.TemporaryDirectory(prefix=f"avsim-bench-{cases}-") as tmp:
            r = run_week(cases, args, Path(tmp))
        results.append(r)
        print(
            f"{r.cases:6d}-case week (shards of <= {args.shard_size}, window {args.max_active_shards}, "
            f"{r.shards_total} shard runs created when stopped): "
            f"{r.phases_finished} phase task instances in {r.seconds:.1f}s = {r.rate:.2f}/s; "
            f"scheduler loop max {r.max_loop_ms:.0f} ms, median {r.median_loop_ms:.0f} ms",
            flush=True,
        )
    small, large = results
    print(f"throughput ratio large/small: {large.rate / small.rate:.3f}  (target >= 0.9)")
    print(f"longest-loop ratio large/small: {large.max_loop_ms / small.max_loop_ms:.3f}  (target <= 1.2)")
    print(
        f"scheduler_scale: throughput_ratio={large.rate / small.rate:.3f} "
        f"loop_ratio={large.max_loop_ms / small.max_loop_ms:.3f}"
    )


if __name__ == "__main__":
    main()
