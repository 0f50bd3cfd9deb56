"""A real week with stragglers against the same week without: what hung phases cost the week.

Two weekly runs of the same sample cases on one stack (the real scheduler, dag-processor, triggerer
and api-server, LocalExecutor, PostgreSQL): the clean week, then the week where 5 % of the cases'
``simulate`` first attempts hang (no progress, no heartbeat) until their lease expires, then pass on
their retry. Both admit by cases in flight with ``[avsim] cases_in_flight`` set so that admission
binds. From the first shard run's creation until the last one's, while cases wait to start, the
cases in flight are sampled every 2 s from the metadata database: unfinished (a shard run's cases
from its creation until each ends; admission itself lets a case whose report holds its slot make
room, so that the next shard run lands as it ends) and as expanded in the scheduler.

It ends with ``stragglers_real: makespan_vs_clean=R inflight_min_vs_target=R`` (the straggler
week's makespan over the clean week's, and its fewest cases in flight while cases waited over the
target; goals <= 1.15 and >= 0.8), and the mean of the expanded cases over the target.

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
    """A week's cases in flight every :data:`SAMPLE_SECONDS`, while some of its shard runs are still to be
    created (cases wait to start), two ways: unfinished (the cases of its shard runs in progress, from
    creation until ``summarize`` ends, less those whose ``report`` ended), and as the scheduler holds them (the expanded cases
    of running shard runs whose ``report`` has not ended)."""

    def __init__(self, conn: str, run_id: str, run: dict[str, Any]) -> None:
        import sqlalchemy

        self.engine = sqlalchemy.create_engine(conn)
        self.run_id, self.shard_count = run_id, int(run["shard_count"])
        self.cases = int(run["case_count"]) - int(run.get("canary_count") or 0)
        self.shard_size = int(run["shard_size"])
        self.samples: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from sqlalchemy import bindparam, text

        from avsim.plan.admission import shard_case_count

        runs = text(
            "SELECT dr.run_id, (SELECT count(*) FROM task_instance s WHERE s.dag_id = dr.dag_id "
            "AND s.run_id = dr.run_id AND s.task_id = 'summarize' AND s.state IN :ended) "
            "FROM dag_run dr WHERE dr.dag_id = :d AND dr.run_id LIKE :p"
        ).bindparams(bindparam("ended", expanding=True))
        reports = text(
            "SELECT ti.run_id, count(*) FILTER (WHERE ti.state IN :ended), "
            "count(*) FILTER (WHERE ti.state IS NULL OR ti.state NOT IN :ended) "
            "FROM task_instance ti WHERE ti.dag_id = :d AND ti.run_id LIKE :p "
            "AND ti.task_id LIKE '%.report' AND ti.map_index >= 0 GROUP BY ti.run_id"
        ).bindparams(bindparam("ended", expanding=True))
        params = {"d": SHARD, "p": f"{self.run_id}__shard_%", "ended": list(ENDED)}
        while not self._stop.wait(SAMPLE_SECONDS):
            with contextlib.suppress(Exception), self.engine.connect() as c:  # a missed sample is no harm
                found = {str(r): int(done) for r, done in c.execute(runs, params)}
                if not found or len(found) >= self.shard_count:
                    continue  # admission has not begun, or every case has started: nothing waits
                ended = {str(r): (int(e), int(o)) for r, e, o in c.execute(reports, params)}
                active = [r for r, done in found.items() if not done]
                admitted = sum(
                    shard_case_count(int(r.rpartition("_")[2]), self.cases, self.shard_size) for r in active
                )
                finished = sum(ended.get(r, (0, 0))[0] for r in active)
                expanded = sum(ended.get(r, (0, 0))[1] for r in active)
                self.samples.append((admitted - finished, expanded))

    def close(self) -> list[tuple[int, int]]:
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


def run_week(
    stack: Any, run_id: str, doc: dict[str, Any], timeout: float
) -> tuple[float, list[tuple[int, int]], int]:
    """(seconds from the run's start to its end, in-flight samples while cases waited, its target)."""
    from tests.support.airflow_run import query, run_descriptor, trigger, wait_for_run

    manifest = stack.home / f"{run_id}.json"
    manifest.write_text(json.dumps(doc))
    trigger(stack, PARENT, run_id, {"manifest": str(manifest)})
    while not query(stack, "SELECT 1 FROM xcom WHERE run_id = :r AND key = 'run'", r=run_id):
        time.sleep(1)
    run = run_descriptor(stack, run_id)
    sampler = InFlightSampler(stack.conn, run_id, run)
    try:
        state = wait_for_run(stack, PARENT, run_id, timeout=timeout)
    finally:
        samples = sampler.close()
    if state != "success":
        raise SystemExit(f"{run_id} ended {state}")
    print_timeline(stack, run_id)
    [(start, end)] = query(
        stack,
        "SELECT start_date, end_date FROM dag_run WHERE dag_id = :d AND run_id = :r",
        d=PARENT,
        r=run_id,
    )
    return (end - start).total_seconds(), samples, int(run["admission"]["target"])


def print_timeline(stack: Any, run_id: str) -> None:
    """Per shard, seconds from the weekly run's start: its shard run's creation and end, and when its
    ``shard_start`` task last began and ended (a start that waited in the triggerer ends without a
    worker: its last try begins when it was first scheduled)."""
    from tests.support.airflow_run import query

    [(began,)] = query(
        stack, "SELECT start_date FROM dag_run WHERE dag_id = :d AND run_id = :r", d=PARENT, r=run_id
    )
    runs = query(
        stack,
        "SELECT run_id, start_date, end_date FROM dag_run WHERE dag_id = :d AND run_id LIKE :p ORDER BY run_id",
        d=SHARD,
        p=f"{run_id}__shard_%",
    )
    starts = dict(
        (int(i), (a, b))
        for i, a, b in query(
            stack,
            "SELECT map_index, start_date, end_date FROM task_instance WHERE dag_id = :d AND run_id = :r "
            "AND task_id = 'shard_start'",
            d=PARENT,
            r=run_id,
        )
    )

    def at(t: Any) -> str:
        return "-" if t is None else f"{(t - began).total_seconds():.0f}"

    cells = []
    for rid, a, b in runs:
        k = int(rid.rpartition("_")[2])
        s0, s1 = starts.get(k - 1, (None, None))
        cells.append(f"{k}:start {at(s0)}-{at(s1)} run {at(a)}-{at(b)}")
    print(f"   timeline of {run_id} (s): " + "; ".join(cells), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="120 cases, target 30 (unless given)")
    ap.add_argument("--cases", type=int, default=None, help="default 400 (120 with --quick)")
    ap.add_argument("--target", type=int, default=None, help="default 60 (30 with --quick)")
    ap.add_argument("--lease-seconds", type=float, default=20.0)
    ap.add_argument("--time-scale", type=float, default=0.002)
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--keep", type=Path, default=None, help="keep the stacks' files (logs) in this directory")
    args = ap.parse_args()
    args.cases = args.cases or (120 if args.quick else 400)
    args.target = args.target or (30 if args.quick else 60)
    t0 = time.time()
    with (
        (
            contextlib.nullcontext(str(args.keep))
            if args.keep
            else tempfile.TemporaryDirectory(prefix="avsim-stragglers-")
        ) as tmp,
        stack_for(Path(tmp), args) as stack,
    ):
        clean_doc = week_manifest(args.cases, args.time_scale, args.lease_seconds, 0.0)
        clean, _, _ = run_week(stack, "bench__clean", clean_doc, args.timeout)
        print(f"clean week: {args.cases} cases in {clean:.0f} s", flush=True)
        hung_doc = week_manifest(args.cases, args.time_scale, args.lease_seconds, HUNG_SHARE)
        hung = sum(1 for c in hung_doc["cases"] if "fakesim" in c["parameters"])
        seconds, samples, target = run_week(stack, "bench__stragglers", hung_doc, args.timeout)
        counted = [a for a, _ in samples] or [target]
        held = [e for _, e in samples] or [target]
        print(
            f"straggler week: {hung} simulate first attempts hang until their {args.lease_seconds:g} s lease; "
            f"{seconds:.0f} s; while cases waited ({len(samples)} samples), unfinished cases in flight: "
            f"min {min(counted)}, mean {sum(counted) / len(counted):.0f}; expanded in the "
            f"scheduler: min {min(held)}, mean {sum(held) / len(held):.0f}; of target {target}",
            flush=True,
        )
    print(f"({time.time() - t0:.0f} s in all)")
    print(
        f"stragglers_real: makespan_vs_clean={seconds / clean:.3f} "
        f"inflight_min_vs_target={min(counted) / target:.3f} "
        f"expanded_mean_vs_target={sum(held) / len(held) / target:.3f}"
    )


if __name__ == "__main__":
    main()
