"""Triage on a real week pair: are the planted regressions and flakes classified, within the budget?

One stack (the real scheduler, dag-processor, triggerer and api-server, LocalExecutor, PostgreSQL):
week N of the sample cases on build A, then week N+1 on build B, where 3 standard cases fail their
scenario on B only (``scenario_failed_on:<digest of B>``) and 2 flake (``flake:0.5``, cases chosen so
that they passed in week N, fail in week N+1 and pass on their first rerun of B). Week N+1's
``triage_start`` plans within ``[avsim] triage_gpu_share`` (``--share``) and ``triage`` waits for the
reruns. It ends with ``triage: classified=N correct=N gpu_share=R bound=R delay_of_report_s=R triage_s=R``
(goals: correct = classified = planted, gpu_share <= bound, delay_of_report_s <= triage_s).

    python bench/triage.py --quick      # 200 cases, share 0.1: about 15 minutes
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PARENT, SHARD = "avsim_weekly", "avsim_weekly_shard"
WEEK_A, WEEK_B = "bench__triage_a", "bench__triage_b"
DIGEST_B = "sha256:" + hashlib.sha256(b"avsim-simulator-build:B").hexdigest()
REGRESSIONS, FLAKES = 3, 2


def week_key(run_id: str) -> str:
    from avsim.artifacts import run_key_for

    return run_key_for(PARENT, run_id)


def flake_fits(case: dict[str, Any]) -> bool:
    """``flake:0.5`` passes the case in week N, fails it in week N+1 and passes its first rerun of B."""
    from avsim.artifacts import RunLayout, triage_run_key
    from avsim.devstack.fakesim import flake_draw

    def draw(key: str) -> float:
        out = RunLayout("file:///x", key).attempt_output(case["id"], "simulate", 1)
        return flake_draw(case["seed"], case["id"], "simulate", out)

    b = week_key(WEEK_B)
    return draw(week_key(WEEK_A)) >= 0.5 and draw(b) < 0.5 and draw(triage_run_key(b, "1_this_1")) >= 0.5


def weeks(cases: int, time_scale: float) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """Week N's manifest (build A, last ISO week), week N+1's (build B, this one), and the planted
    cases (case id -> the verdict they must get)."""
    from avsim.manifest.deadline import iso_week_of
    from avsim.manifest.sample import sample_manifest
    from avsim.report.compare import previous_iso_week

    now = dt.datetime.now(dt.UTC)
    this_week = iso_week_of(now)
    last_week = previous_iso_week(this_week)
    assert last_week is not None
    doc_a = sample_manifest(
        cases,
        iso_week=last_week,
        time_scale=time_scale,
        scenario_fail_rate=0.0,
        deadline=now + dt.timedelta(days=1),
    )
    standard = [c for c in doc_a["cases"] if c["graph"] == "standard"]
    planted: dict[str, str] = {}
    step = max(1, len(standard) // REGRESSIONS)
    for c in standard[step // 2 :: step][:REGRESSIONS]:  # spread over the week, not all in its first shard
        planted[c["id"]] = "regression"
        c["parameters"]["fakesim"] = {"simulate": f"scenario_failed_on:{DIGEST_B[:19]}"}
    flakes = [c for c in standard if c["id"] not in planted and flake_fits(c)][-FLAKES:]
    if len(flakes) < FLAKES:
        raise SystemExit(f"only {len(flakes)} standard cases of {cases} have flake draws that fit")
    for c in flakes:
        planted[c["id"]] = "flaky"
        c["parameters"]["fakesim"] = {"simulate": "flake:0.5"}
    doc_b = json.loads(json.dumps(doc_a))
    doc_b["run"]["iso_week"] = this_week
    doc_b["run"]["build"] = {
        "build_id": "build-B",
        "image": f"registry.example.com/avsim/simulator@{DIGEST_B}",
    }
    return doc_a, doc_b, planted


@contextlib.contextmanager
def stack_for(base: Path, args: argparse.Namespace) -> Iterator[Any]:
    from week_runs import bench_stack

    with bench_stack(
        base,
        {
            "AIRFLOW__AVSIM__SHARD_SIZE": str(args.shard_size),
            "AIRFLOW__AVSIM__SHARD_POLL_SECONDS": "2",
            "AIRFLOW__AVSIM__DEADLINE_INTERVAL_SECONDS": "5",
            "AIRFLOW__AVSIM__TRIAGE_GPU_SHARE": str(args.share),
        },
    ) as stack:
        yield stack


def run_week(stack: Any, run_id: str, doc: dict[str, Any], timeout: float) -> Any:
    """Trigger one weekly run and wait for it; its RunLayout."""
    from tests.support.airflow_run import trigger, wait_for_run

    from avsim.artifacts import RunLayout

    manifest = stack.home / f"{run_id}.json"
    manifest.write_text(json.dumps(doc))
    t0 = time.time()
    trigger(stack, PARENT, run_id, {"manifest": str(manifest)})
    state = wait_for_run(stack, PARENT, run_id, timeout=timeout)
    print(f"{run_id}: {len(doc['cases'])} cases, {state} in {time.time() - t0:.0f} s", flush=True)
    if state != "success":
        raise SystemExit(f"{run_id} ended {state}")
    return RunLayout(f"file://{stack.home / 'artifacts'}", week_key(run_id))


def triage_gpu_seconds(layout: Any) -> tuple[float, int]:
    """GPU-seconds the week's triage runs used (their cases' rows), and how many runs there were."""
    from avsim.artifacts import RunLayout
    from avsim.report.build import week_case_rows
    from avsim.triage.start import read_book

    book = read_book(layout)
    runs = book.runs if book else ()
    used = sum(
        float(r["gpu_seconds"]) for run in runs for r in week_case_rows(RunLayout(layout.root, run.run_key))
    )
    return used, len(runs)


def task_times(stack: Any, run_id: str) -> dict[str, tuple[dt.datetime | None, dt.datetime | None]]:
    """(start, end) of each of the week's run-level task instances, from the metadata database."""
    from tests.support.airflow_run import query

    rows = query(
        stack,
        "SELECT task_id, start_date, end_date FROM task_instance WHERE dag_id = :d AND run_id = :r "
        "AND (task_id IN ('close_week', 'triage_start', 'triage', 'report') OR task_id LIKE 'run\\_phases.%')",
        d=PARENT,
        r=run_id,
    )
    return {t: (s, e) for t, s, e in rows}


def delays(times: dict[str, tuple[dt.datetime | None, dt.datetime | None]]) -> tuple[float, float]:
    """(report start - the last end of its other upstreams, triage end - triage_start start), seconds."""
    others = [e for t, (_, e) in times.items() if (t == "close_week" or t.startswith("run_phases.")) and e]
    report_start = times["report"][0]
    triage_start, triage_end = times["triage_start"][0], times["triage"][1]
    assert report_start and triage_start and triage_end and others, times
    return (report_start - max(others)).total_seconds(), (triage_end - triage_start).total_seconds()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="200 cases (unless --cases is given)")
    ap.add_argument("--cases", type=int, default=None, help="default 1000 (200 with --quick)")
    ap.add_argument("--share", type=float, default=0.1, help="[avsim] triage_gpu_share: the bound")
    ap.add_argument("--shard-size", type=int, default=25)
    ap.add_argument("--time-scale", type=float, default=0.002)
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument(
        "--keep", type=Path, default=None, help="the stack's folder, kept after (default: a temporary one)"
    )
    args = ap.parse_args()
    args.cases = args.cases or (200 if args.quick else 1000)
    from avsim.storage import read_json
    from avsim.triage.model import TriageReport

    t0 = time.time()
    doc_a, doc_b, planted = weeks(args.cases, args.time_scale)
    print(f"planted: {json.dumps(planted)}; triage_gpu_share {args.share:g}", flush=True)
    with contextlib.ExitStack() as keep:
        base = args.keep or Path(keep.enter_context(tempfile.TemporaryDirectory(prefix="avsim-triage-")))
        stack = keep.enter_context(stack_for(base, args))
        run_week(stack, WEEK_A, doc_a, args.timeout)
        week = run_week(stack, WEEK_B, doc_b, args.timeout)
        triage = TriageReport.model_validate(read_json(f"{week.report_dir}/triage.json"))
        report = read_json(f"{week.report_dir}/report.json")
        used, runs = triage_gpu_seconds(week)
        delay, triage_s = delays(task_times(stack, WEEK_B))
    week_gpu = float(report["gpu_seconds"]["total"])  # the sum of its cases' (cases.csv)
    for c in triage.cases:
        print(
            f"  {c.case_id} ({c.failing_phase}): {c.verdict.value}, planted {planted.get(c.case_id, '-')}; "
            f"reruns {[(r.build.value, r.outcome.value if r.outcome else r.reason) for r in c.reruns]}; {c.reason}"
        )
    missed = sorted(set(planted) - {c.case_id for c in triage.cases})
    classified = sum(1 for c in triage.cases if c.verdict.value != "not_triaged")
    correct = sum(1 for c in triage.cases if planted.get(c.case_id) == c.verdict.value)
    print(
        f"week N+1: {week_gpu:.1f} GPU-s; triage budget {triage.budget_gpu_seconds:.1f}, planned "
        f"{triage.planned_gpu_seconds:.1f}, used {used:.1f} GPU-s in {runs} shard runs; "
        f"audit {len(triage.audit.sampled) if triage.audit else 0} cases; planted but not listed: {missed}"
    )
    print(f"({time.time() - t0:.0f} s in all)")
    print(
        f"triage: classified={classified} correct={correct} gpu_share={used / week_gpu:.4f} "
        f"bound={args.share:g} delay_of_report_s={delay:.1f} triage_s={triage_s:.1f}"
    )


if __name__ == "__main__":
    main()
