"""A real week with stragglers against the same week without: what hung phases cost the week.

Two weekly runs of the same sample cases on one stack (the real scheduler, dag-processor, triggerer
and api-server, LocalExecutor, PostgreSQL): the clean week, then the week where 5 % of the cases'
``simulate`` first attempts hang (no progress, no heartbeat) until their lease expires, then pass on
their retry. Both admit by cases in flight with ``[avsim] cases_in_flight`` set so that admission
binds. From the first shard run's creation until the last one's, while cases wait to start, the
unfinished cases are sampled every 2 s from the metadata database (the expanded cases of running
shard runs whose last phase has not ended: a shard run's cases count from its groups' expansion).

It ends with ``stragglers_real: makespan_vs_clean=R inflight_min_vs_target=R`` (the straggler
week's makespan over the clean week's, and its fewest unfinished cases while cases waited over the
target; goals <= 1.15 and >= 0.8).

    python bench/stragglers.py --quick      # 120 cases, target 30, lease 20 s: about 10 minutes
    python bench/stragglers.py              # 400 cases, target 60
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PARENT, SHARD = "avsim_weekly", "avsim_weekly_shard"
ENDED = ("success", "failed", "upstream_failed", "skipped", "removed")
HUNG_SHARE = 0.05
SAMPLE_SECONDS = 2.0


def week_manifest(cases: int, time_scale: float, lease_seconds: float, hung_share: float) -> dict[str, Any]:
    """The sample week with every phase's lease at ``lease_seconds`` and ``hung_share`` of the cases
    (spread evenly over the week) hanging in their first ``simulate`` attempt."""
    from avsim.manifest.sample import sample_manifest

    doc = sample_manifest(
        cases, time_scale=time_scale, scenario_fail_rate=0.0, crash_rate=0.0, canary={"enabled": False}
    )
    for graph in doc["graphs"].values():
        for phase in graph["phases"].values():
            phase.update(heartbeat_seconds=1, lease_seconds=lease_seconds)
    gpu = [c for c in doc["cases"] if c["graph"] in ("standard", "with_render")]
    n = round(hung_share * len(gpu))
    for case in gpu[:: max(1, len(gpu) // n)][:n] if n else []:
        case["parameters"]["fakesim"] = {"simulate": "hang_once"}
    return doc


class InFlightSampler:
    """Unfinished cases of a week's running shard runs, every :data:`SAMPLE_SECONDS`, while some of its
    shard runs are still to be created (cases wait to start)."""

    def __init__(self, conn: str, run_id: str, shard_count: int) -> None:
        import sqlalchemy

        self.engine = sqlalchemy.create_engine(conn)
        self.run_id, self.shard_count = run_id, shard_count
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from sqlalchemy import bindparam, text

        runs = text("SELECT count(*) FROM dag_run WHERE dag_id = :d AND run_id LIKE :p")
        open_cases = text(
            "SELECT count(*) FROM task_instance ti JOIN dag_run dr ON dr.dag_id = ti.dag_id "
            "AND dr.run_id = ti.run_id WHERE ti.dag_id = :d AND ti.run_id LIKE :p AND dr.state = 'running' "
            "AND ti.task_id LIKE '%.report' AND ti.map_index >= 0 "
            "AND (ti.state IS NULL OR ti.state NOT IN :ended)"
        ).bindparams(bindparam("ended", expanding=True))
        params = {"d": SHARD, "p": f"{self.run_id}__shard_%", "ended": list(ENDED)}
        while not self._stop.wait(SAMPLE_SECONDS):
            with contextlib.suppress(Exception), self.engine.connect() as c:  # a missed sample is no harm
                created = int(c.execute(runs, params).scalar() or 0)
                if created == 0 or created >= self.shard_count:
                    continue  # admission has not begun, or every case has started: nothing waits
                self.samples.append(int(c.execute(open_cases, params).scalar() or 0))

    def close(self) -> list[int]:
        self._stop.set()
        self._thread.join(timeout=10)
        self.engine.dispose()
        return self.samples


@contextlib.contextmanager
def stack_for(base: Path, args: argparse.Namespace) -> Iterator[Any]:
    from week_runs import bench_stack

    with bench_stack(
        base,
        {
            "AIRFLOW__AVSIM__CASES_IN_FLIGHT": str(args.target),
            "AIRFLOW__AVSIM__SHARD_POLL_SECONDS": "2",
            "AIRFLOW__AVSIM__DEADLINE_INTERVAL_SECONDS": "5",
        },
    ) as stack:
        yield stack


def run_week(stack: Any, run_id: str, doc: dict[str, Any], timeout: float) -> tuple[float, list[int], int]:
    """(seconds from the run's start to its end, in-flight samples while cases waited, its target)."""
    from tests.support.airflow_run import query, run_descriptor, trigger, wait_for_run

    manifest = stack.home / f"{run_id}.json"
    manifest.write_text(json.dumps(doc))
    trigger(stack, PARENT, run_id, {"manifest": str(manifest)})
    while not query(stack, "SELECT 1 FROM xcom WHERE run_id = :r AND key = 'run'", r=run_id):
        time.sleep(1)
    run = run_descriptor(stack, run_id)
    sampler = InFlightSampler(stack.conn, run_id, int(run["shard_count"]))
    try:
        state = wait_for_run(stack, PARENT, run_id, timeout=timeout)
    finally:
        samples = sampler.close()
    if state != "success":
        raise SystemExit(f"{run_id} ended {state}")
    [(start, end)] = query(
        stack,
        "SELECT start_date, end_date FROM dag_run WHERE dag_id = :d AND run_id = :r",
        d=PARENT,
        r=run_id,
    )
    return (end - start).total_seconds(), samples, int(run["admission"]["target"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="120 cases, target 30 (unless given)")
    ap.add_argument("--cases", type=int, default=None, help="default 400 (120 with --quick)")
    ap.add_argument("--target", type=int, default=None, help="default 60 (30 with --quick)")
    ap.add_argument("--lease-seconds", type=float, default=20.0)
    ap.add_argument("--time-scale", type=float, default=0.002)
    ap.add_argument("--timeout", type=float, default=3600.0)
    args = ap.parse_args()
    args.cases = args.cases or (120 if args.quick else 400)
    args.target = args.target or (30 if args.quick else 60)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="avsim-stragglers-") as tmp, stack_for(Path(tmp), args) as stack:
        clean_doc = week_manifest(args.cases, args.time_scale, args.lease_seconds, 0.0)
        clean, _, _ = run_week(stack, "bench__clean", clean_doc, args.timeout)
        print(f"clean week: {args.cases} cases in {clean:.0f} s", flush=True)
        hung_doc = week_manifest(args.cases, args.time_scale, args.lease_seconds, HUNG_SHARE)
        hung = sum(1 for c in hung_doc["cases"] if "fakesim" in c["parameters"])
        seconds, samples, target = run_week(stack, "bench__stragglers", hung_doc, args.timeout)
        low = min(samples) if samples else target
        print(
            f"straggler week: {hung} simulate first attempts hang until their {args.lease_seconds:g} s lease; "
            f"{seconds:.0f} s; unfinished cases while cases waited: min {low}, "
            f"mean {sum(samples) / max(1, len(samples)):.0f} of target {target} ({len(samples)} samples)",
            flush=True,
        )
    print(f"({time.time() - t0:.0f} s in all)")
    print(
        f"stragglers_real: makespan_vs_clean={seconds / clean:.3f} inflight_min_vs_target={low / target:.3f}"
    )


if __name__ == "__main__":
    main()
