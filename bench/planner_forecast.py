"""Does the capacity planner forecast a real week on this machine? Its makespan against a real run.

On a real stack (scheduler, dag-processor, triggerer, api-server, LocalExecutor, SQLite; the demo's
pools at ``--gpus``/``--cpus``, ``[avsim] shard_size`` and W set as the stack sets them) two weeks of
fast fake phases run one after the other, admitted by cases in flight (the shipped default: ``prepare``
derives the target from the pools and cuts shard runs of about a third of it, at most
``--shard-size``; W = 6 caps the active shard runs), or with ``--window`` through the window of whole
shard runs of ``--shard-size`` (W = 2), as before issue 29:

1. **calibration**: a week of ``--calibrate-cases`` cases (seed ``--calibrate-seed``). From
   Airflow's task instances (``queued_dttm``, ``end_date``, pool) and the ledger (attempt
   ``started_at``/``ended_at``, the fake phases' work) the bench measures the per-phase overhead,
   the time between an upstream phase's end and this phase's end that is not its work, in two parts:
   the *latency* (upstream task instance's end -> this one queued; only phases that did not wait for
   their pool: it was not full when the upstream ended and no other task of it was queued first,
   since the planner simulates that wait itself) and the part *in the slot* (queued -> ended, minus
   the work: the task process, parsing, the ledger, the fake phase's process, the commit), which
   holds the phase's pool slots. Also the shard start (from the moment a shard run may start to its
   first phase queued, less the latency) and the run-level phases' start (the last shard's last
   phase -> ``weekly_summary`` queued). Under admission a shard run may start at the earliest moment,
   no earlier than the previous shard's, at which the unfinished cases of the earlier shard runs
   leave room for its cases under the target (:func:`admission_moments`, from the real case ends),
   so the shard start holds the admission trigger's wait; under the window, the weekly run's start
   for the first W and the end of the shard run whose window slot it takes for the others.
2. **validation**: a different week (``--cases`` cases, seed ``--seed``: another size and mix),
   forecast by :func:`avsim.planner.simulate` with the calibrated overhead and shard start (and,
   under admission, the target and S that :func:`week_admission` derives as ``prepare`` does; the
   bench prints them beside the ones ``prepare`` put in the run descriptor), then run. The ratio compares the forecast with the real span the planner's makespan stands for: from
   the weekly run's start to the end of its last run-level phase (``weekly_summary``). The whole
   run (to the end of ``report``) is printed beside it.
3. **production**: the sample week (``--production-cases``, 280 GPUs, 200 CPUs, ``shard_size``
   250, W = 6, admitted as the stack admits) forecast with and without the calibrated overhead: 30-minute phases do not notice seconds.

The forecast uses the fake phases' durations (estimates x ``--time-scale``). Nothing is asserted;
the last line is machine-readable. ``--save FILE`` keeps the measured weeks, ``--from FILE``
forecasts again from them without a stack.

    python bench/planner_forecast.py [--quick] [--window] [--cases 30] [--calibrate-cases 20] [--gpus 2] [--cpus 4]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PARENT = "avsim_weekly"
SHARD = f"{PARENT}_shard"
RUN_PHASE_GROUP = "run_phases"


def week_manifest(cases: int, seed: int, time_scale: float) -> dict[str, Any]:
    """A sample week with no canary stage and no scenario failures (a week the planner sees whole)."""
    from avsim.manifest.sample import sample_manifest

    return sample_manifest(
        cases, seed=seed, time_scale=time_scale, scenario_fail_rate=0.0, canary={"min_cases": cases}
    )


# -- measuring one real week ---------------------------------------------------------------------


def _ts(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return float(value.timestamp())


def run_week(stack: Any, doc: dict[str, Any], run_id: str, timeout: float) -> dict[str, Any]:
    """Trigger the week, wait for it, and return what the forecast is compared with (epoch seconds)."""
    import sqlalchemy

    from avsim.artifacts import RUN_LEVEL_CASE, RunLayout, run_key_for
    from avsim.ledger.store import Ledger

    path = stack.home / f"{run_id}.json"
    path.write_text(json.dumps(doc))
    load_before = os.getloadavg()[0]
    stack.airflow(
        "dags", "trigger", PARENT, "--run-id", run_id, "--conf", json.dumps({"manifest": str(path)})
    )
    engine = sqlalchemy.create_engine(stack.conn)
    q = sqlalchemy.text
    limit = time.monotonic() + timeout
    while True:
        with engine.connect() as c:
            state = c.execute(
                q("SELECT state FROM dag_run WHERE dag_id = :d AND run_id = :r"), {"d": PARENT, "r": run_id}
            ).scalar()
        if state in ("success", "failed"):
            break
        if time.monotonic() > limit:
            raise TimeoutError(f"{run_id} did not finish in {timeout:.0f}s")
        time.sleep(2)
    with engine.connect() as c:
        parent = c.execute(
            q("SELECT start_date, end_date FROM dag_run WHERE dag_id = :d AND run_id = :r"),
            {"d": PARENT, "r": run_id},
        ).one()
        tis = c.execute(
            q(
                "SELECT dag_id, run_id, task_id, map_index, rendered_map_index, state, pool, pool_slots, queued_dttm, start_date, "
                "end_date FROM task_instance WHERE (dag_id = :d AND run_id = :r) OR (dag_id = :s AND run_id LIKE :p)"
            ),
            {"d": PARENT, "r": run_id, "s": SHARD, "p": f"{run_id}__%"},
        ).all()
        pools: dict[str, int] = dict(c.execute(q("SELECT pool, slots FROM slot_pool")).all())
        shard_runs = c.execute(
            q("SELECT run_id, queued_at, start_date FROM dag_run WHERE dag_id = :s AND run_id LIKE :p"),
            {"s": SHARD, "p": f"{run_id}__%"},
        ).all()
        value = c.execute(
            q(
                "SELECT value FROM xcom WHERE dag_id = :d AND run_id = :r AND task_id = 'prepare' "
                "AND key = 'run'"
            ),
            {"d": PARENT, "r": run_id},
        ).scalar()
    descriptor = value if isinstance(value, dict) else json.loads(value) if value else {}
    admission = descriptor.get("admission") or {}
    ledger = Ledger(RunLayout(f"file://{stack.home / 'artifacts'}", run_key_for(PARENT, run_id)))
    attempts = []
    cases = [(case["id"], doc["graphs"][case["graph"]]["phases"]) for case in doc["cases"]]
    cases.append((RUN_LEVEL_CASE, doc["run_phases"]))
    for case_id, phases in cases:
        for phase in phases:
            for a in ledger.attempts(case_id, phase):
                attempts.append(
                    {
                        "case": case_id,
                        "phase": phase,
                        "attempt": a.attempt,
                        "outcome": a.outcome.value if a.outcome else None,
                        "started": _ts(a.started_at),
                        "ended": _ts(a.ended_at) if a.ended_at else None,
                        "task_id": a.task_id,
                    }
                )
    return {
        "run_id": run_id,
        "state": state,
        "load": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "start": _ts(parent.start_date),
        "end": _ts(parent.end_date),
        "pools": pools,
        # What prepare derived (None under the window) and cut the week into.
        "admission_target": admission.get("target"),
        "shard_size": descriptor.get("shard_size"),
        "shard_runs": {
            r.run_id: {"created": _ts(r.queued_at), "start": _ts(r.start_date)} for r in shard_runs
        },
        "task_instances": [
            {
                "dag_id": t.dag_id,
                "run_id": t.run_id,
                "task_id": t.task_id,
                "map_index": t.map_index,
                "case": t.rendered_map_index,
                "state": t.state,
                "pool": t.pool,
                "pool_slots": t.pool_slots,
                "queued": _ts(t.queued_dttm),
                "start": _ts(t.start_date),
                "end": _ts(t.end_date),
            }
            for t in tis
        ],
        "attempts": attempts,
    }


# -- what a week's records say (pure) --------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    #: Per-phase overhead: ``latency + in_slot``.
    phase_overhead_seconds: float
    #: Upstream task instance's end -> this one queued (phases whose pool had a free slot then).
    latency_seconds: float
    latency_measured: int
    #: Queued -> ended, beyond the phase's work: the task process, parsing, the ledger, the commit.
    in_slot_seconds: float
    #: Parts of ``in_slot``: queued -> attempt start (task process, parse, claim), attempt beyond its
    #: work (the phase's own process starting), attempt end -> task end (commit, XCom).
    before_attempt_seconds: float
    attempt_extra_seconds: float
    after_attempt_seconds: float
    phases_measured: int
    #: From the moment a shard run may start (the weekly run's start for the first W; the end of the
    #: last phase of the shard run whose slot it takes) to its first phase queued, minus the latency
    #: the simulation adds to that phase.
    shard_start_seconds: float
    shard_starts: tuple[float, ...]
    #: The same from the last shard run's last phase to the run-level phases.
    run_phases_start_seconds: float
    #: Per shard run (seconds from the week's start): (name, may start, created, first phase queued).
    timeline: tuple[tuple[str, float, float | None, float], ...] = ()


def _waited_for_pool(tis: list[dict[str, Any]], size: int, ready: float, own: dict[str, Any]) -> bool:
    """Whether ``own`` waited for a slot of its pool after ``ready``: the pool was full then, or
    another task of the pool was queued between ``ready`` and ``own`` (it took the free slot)."""
    used = 0
    for t in tis:
        if t is own or t["pool"] != own["pool"] or t["queued"] is None or t["end"] is None:
            continue
        if ready <= t["queued"] < own["queued"]:
            return True
        if t["queued"] <= ready < t["end"]:
            used += t["pool_slots"] or 1
    return used + (own["pool_slots"] or 1) > size


def calibrate(
    week: dict[str, Any],
    doc: dict[str, Any],
    time_scale: float,
    max_active_shards: int,
    admission: bool = True,
) -> Calibration:
    """The per-phase overhead and the shard start of one real week (see the module's docstring)."""
    work = {
        (g, p): spec["estimated_duration_seconds"] * time_scale
        for g, graph in doc["graphs"].items()
        for p, spec in graph["phases"].items()
    }
    graph_of = {c["id"]: c["graph"] for c in doc["cases"]}
    attempt = {
        (a["case"], a["phase"]): a
        for a in week["attempts"]
        if a["attempt"] == 1 and a["ended"] is not None and a["outcome"] == "passed"
    }
    # A phase's task instance: its map index is labelled with the case id, its task id ends with
    # the phase (a GPU phase's on-demand twin, skipped here, ends with "_on_demand").
    phase_tis = [
        t
        for t in week["task_instances"]
        if t["dag_id"] == SHARD and t["map_index"] >= 0 and t["state"] == "success"
    ]
    ti_of = {(t["case"], t["task_id"].rsplit(".", 1)[-1]): t for t in phase_tis}
    latency, in_slot, before, extra, after = [], [], [], [], []
    for (case, phase), t in ti_of.items():
        a = attempt.get((case, phase))
        if case not in graph_of or a is None or t["queued"] is None:
            continue
        g = graph_of[case]
        in_slot.append(t["end"] - t["queued"] - work[(g, phase)])
        before.append(a["started"] - t["queued"])
        extra.append(a["ended"] - a["started"] - work[(g, phase)])
        after.append(t["end"] - a["ended"])
        ups = doc["graphs"][g]["phases"][phase].get("depends_on", [])
        if not ups or any((case, u) not in ti_of for u in ups):
            continue
        ready = max(ti_of[(case, u)]["end"] for u in ups)
        if not _waited_for_pool(phase_tis, week["pools"].get(t["pool"], 0), ready, t):
            latency.append(t["queued"] - ready)
    lat = statistics.fmean(latency) if latency else 0.0
    # Shard starts: from the moment each shard run may start (the window's or admission's) to its
    # first phase queued, less the latency the simulation adds to that phase.
    ends: dict[str, float] = {}
    firsts: dict[str, float] = {}
    case_ends: dict[str, dict[str, float]] = {}
    for t in phase_tis:
        run = t["run_id"]
        ends[run] = max(ends.get(run, 0.0), t["end"])
        firsts[run] = min(firsts.get(run, math.inf), t["queued"])
        of_run = case_ends.setdefault(run, {})
        of_run[t["case"]] = max(of_run.get(t["case"], 0.0), t["end"])
    runs = sorted(firsts, key=_shard_order)
    freed = sorted(ends.values())
    target = week.get("admission_target") if admission else None
    if target:
        moments = admission_moments(
            runs, {r: list(case_ends[r].values()) for r in runs}, week["start"], target, max_active_shards
        )
    else:
        moments = {
            run: week["start"] if k < max_active_shards else freed[k - max_active_shards]
            for k, run in enumerate(sorted(firsts))
        }
    starts = [firsts[run] - moments[run] - lat for run in runs]
    created = week.get("shard_runs", {})
    timeline = tuple(
        (
            run.rsplit("__", 1)[-1],
            round(moments[run] - week["start"], 1),
            round(created[run]["created"] - week["start"], 1) if run in created else None,
            round(firsts[run] - week["start"], 1),
        )
        for run in runs
    )
    run_level = [
        t
        for t in week["task_instances"]
        if t["dag_id"] == PARENT and t["task_id"].startswith(f"{RUN_PHASE_GROUP}.") and t["queued"]
    ]
    run_start = min(t["queued"] for t in run_level) - freed[-1] - lat if run_level and freed else 0.0
    slot = statistics.fmean(in_slot) if in_slot else 0.0
    return Calibration(
        phase_overhead_seconds=lat + slot,
        latency_seconds=lat,
        latency_measured=len(latency),
        in_slot_seconds=slot,
        before_attempt_seconds=statistics.fmean(before) if before else 0.0,
        attempt_extra_seconds=statistics.fmean(extra) if extra else 0.0,
        after_attempt_seconds=statistics.fmean(after) if after else 0.0,
        phases_measured=len(in_slot),
        shard_start_seconds=statistics.fmean(starts) if starts else 0.0,
        shard_starts=tuple(round(s, 1) for s in starts),
        run_phases_start_seconds=run_start,
        timeline=timeline,
    )


def _shard_order(run_id: str) -> tuple[int, int]:
    """Shard runs in the order the week admits them: the canary (``R__canary``) first, then
    ``R__shard_<k>`` by k."""
    tail = run_id.rsplit("__", 1)[-1]
    if tail.startswith("shard_") and tail[6:].isdigit():
        return (1, int(tail[6:]))
    return (0, 0)


def admission_moments(
    runs: list[str], case_ends: dict[str, list[float]], since: float, target: int, max_active_shards: int
) -> dict[str, float]:
    """When admission by cases in flight lets each shard run start (epoch seconds), from the real
    case ends: shard runs in order (``runs``, the canary first: it starts with the week, ``since``),
    each at the earliest moment t, no earlier than the previous one's, at which the unfinished cases
    of the earlier shard runs plus its own fit under ``target`` (or none is unfinished) and fewer
    than W earlier shard runs are unfinished (a case's end: its last phase task instance's end).
    What the simulation does with ``SimOptions.cases_in_flight``; the real shard run starts later by
    the admission trigger's poll and the shard run's start, which the shard start measures."""
    moments: dict[str, float] = {}
    earlier: list[float] = []  # case ends of the shard runs admitted so far
    run_ends: list[float] = []
    last = since
    for run in runs:
        size = len(case_ends[run])
        if _shard_order(run)[0] == 0:
            t = since
        else:
            t = last
            for candidate in [last, *sorted(e for e in earlier if e > last)]:
                t = candidate
                unfinished = sum(1 for e in earlier if e > t)
                active = sum(1 for e in run_ends if e > t)
                if (unfinished == 0 or unfinished + size <= target) and active < max_active_shards:
                    break
        moments[run] = last = t
        earlier.extend(case_ends[run])
        run_ends.append(max(case_ends[run], default=t))
    return moments


def real_spans(week: dict[str, Any]) -> tuple[float, float]:
    """(weekly run start -> end of its last run-level phase, weekly run start -> its end), seconds."""
    run_level = [
        t["end"]
        for t in week["task_instances"]
        if t["dag_id"] == PARENT and t["task_id"].startswith(f"{RUN_PHASE_GROUP}.") and t["end"] is not None
    ]
    return max(run_level) - week["start"], week["end"] - week["start"]


# -- the forecast -------------------------------------------------------------------------------


def week_admission(doc: dict[str, Any], args: argparse.Namespace) -> tuple[int, int]:
    """The target of cases in flight and the shard size S ``prepare`` derives for this week on the
    bench's pools (avsim.dagbuild.prepare.week_admission): Little's law over the manifest's unscaled
    estimates, no overhead (it is scale-free), at least the cases the scheduler carries comfortably at
    the shipped ``[avsim] scheduler_ms_per_task_instance``, and S from the cases outside the canary."""
    from avsim.manifest.validation import validate_manifest
    from avsim.plan.admission import admission_shard_size
    from avsim.plan.canary import canary_size
    from avsim.plan.inflight import Pools, comfortable_cases, target_cases_in_flight
    from avsim.planner import workload_from_manifest
    from avsim.settings import AvsimSettings

    manifest = validate_manifest(doc)
    load = workload_from_manifest(manifest).case_load()
    floor = comfortable_cases(load, AvsimSettings().scheduler_ms_per_task_instance)
    target = target_cases_in_flight(load, Pools(spot_gpus=args.gpus, cpus=args.cpus), floor=floor)
    canary = manifest.run.canary
    cases = len(manifest.cases)
    outside = cases - (canary_size(cases, canary.share, canary.min_cases) if canary.enabled else 0)
    return target, admission_shard_size(outside, target, args.shard_size)


def forecast(doc: dict[str, Any], args: argparse.Namespace, cal: Calibration | None) -> float:
    """The planner's makespan of ``doc`` on the bench's stack: admitted by cases in flight as
    ``prepare`` admits it (or through the window with ``--window``), with ``cal``'s overhead."""
    from avsim.manifest.validation import validate_manifest
    from avsim.planner import Capacity, SimOptions, simulate, workload_from_manifest

    w = workload_from_manifest(validate_manifest(doc)).scaled(args.time_scale)
    cap = Capacity(gpus=args.gpus, cpus=args.cpus, on_demand_gpus=max(1, args.gpus // 4))
    target, size = (None, args.shard_size) if args.window else week_admission(doc, args)
    opts = SimOptions(
        shard_size=size,
        max_active_shards=args.max_active_shards,
        cases_in_flight=target,
        # The shard DAG's max_active_tasks (dagbuild/shard_dag.py), from [avsim] shard_size.
        max_active_tasks_per_shard=max(16, 2 * args.shard_size),
        parallelism=args.parallelism,
        phase_overhead_seconds=cal.phase_overhead_seconds if cal else 0.0,
        phase_overhead_in_slot_seconds=cal.in_slot_seconds if cal else None,
        shard_start_seconds=cal.shard_start_seconds if cal else 0.0,
        run_phases_start_seconds=cal.run_phases_start_seconds if cal else 0.0,
    )
    return simulate(w, cap, opts).makespan_seconds


def production(cases: int, overhead: float, in_slot: float, window: bool) -> tuple[float, float]:
    """The sample week at production capacity and shape (admitted by cases in flight as prepare
    derives it, or the window): makespan without, and with, the overhead."""
    from avsim.manifest.sample import sample_manifest
    from avsim.manifest.validation import validate_manifest
    from avsim.planner import Capacity, SimOptions, simulate, workload_from_manifest
    from avsim.planner.inflight import admission_options

    w = workload_from_manifest(validate_manifest(sample_manifest(cases)))
    cap = Capacity(gpus=280, cpus=200)
    opts = SimOptions(shard_size=250, max_active_shards=6)
    if not window:  # the target from the estimates alone, as prepare derives it
        opts = admission_options(w, cap, opts, 0, max_active_shards=6)
    base = simulate(w, cap, opts).makespan_seconds
    loaded = replace(opts, phase_overhead_seconds=overhead, phase_overhead_in_slot_seconds=in_slot)
    return base, simulate(w, cap, loaded).makespan_seconds


def measure(args: argparse.Namespace, docs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    from avsim.devstack.demo import checkout_folder, demo_pools, wait_for_dag
    from avsim.devstack.stack import LocalStack

    weeks = {}
    with tempfile.TemporaryDirectory(prefix="avsim-bench-forecast-") as tmp:
        stack = LocalStack(
            home=Path(tmp) / "airflow",
            dags_folder=checkout_folder("dags"),
            plugins_folder=checkout_folder("plugins"),
            parallelism=args.parallelism,
            extra_env={
                "AIRFLOW__AVSIM__SHARD_SIZE": str(args.shard_size),
                "AIRFLOW__AVSIM__MAX_ACTIVE_SHARDS": str(args.max_active_shards),
                "AIRFLOW__AVSIM__SHARD_POLL_SECONDS": "2",
                "AIRFLOW__AVSIM__ADMISSION": "window" if args.window else "cases_in_flight",
            },
        )
        try:
            stack.claim()
            stack.migrate()
            stack.set_pools(demo_pools(args.gpus, args.cpus))
            stack.start()
            wait_for_dag(stack, PARENT)
            wait_for_dag(stack, SHARD)
            # The first week on a fresh stack pays one-time costs (first parses of the shard DAG by
            # the workers, cold caches): its shard starts ran 1.4 to 2 x the next week's. A small week
            # first, not measured, keeps that out of the calibration.
            t0 = time.monotonic()
            run_week(stack, week_manifest(2, 1, args.time_scale), "bench__forecast_warmup", args.timeout)
            print(f"warm-up week: 2 cases in {time.monotonic() - t0:.0f} s", flush=True)
            for name, doc in docs.items():
                t0 = time.monotonic()
                weeks[name] = run_week(stack, doc, f"bench__forecast_{name}", args.timeout)
                print(
                    f"{name} week: {len(doc['cases'])} cases, {weeks[name]['state']} in "
                    f"{time.monotonic() - t0:.0f} s",
                    flush=True,
                )
        finally:
            stack.stop()
            stack.release()
    return weeks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller weeks (under 10 minutes on 2 cores)")
    ap.add_argument("--calibrate-cases", type=int, default=20)
    ap.add_argument("--calibrate-seed", type=int, default=11)
    ap.add_argument("--cases", type=int, default=40)
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--gpus", type=int, default=2, help="GPU spot pool slots")
    ap.add_argument("--cpus", type=int, default=4, help="CPU pool slots")
    ap.add_argument("--shard-size", type=int, default=10)
    ap.add_argument(
        "--max-active-shards",
        type=int,
        help="W (default: 6, the shipped default, admitting by cases in flight; 2 with --window)",
    )
    ap.add_argument(
        "--window",
        action="store_true",
        help="run the weeks with [avsim] admission = window (whole shard runs of S, W at once), as before issue 29",
    )
    ap.add_argument("--parallelism", type=int, default=16)
    ap.add_argument("--time-scale", type=float, default=0.002, help="fake seconds per planned second")
    ap.add_argument("--production-cases", type=int, default=10_000)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--save", type=Path, help="write the measured weeks here (JSON)")
    ap.add_argument("--from", dest="source", type=Path, help="forecast from weeks saved by --save")
    args = ap.parse_args()
    from bytecode import ensure_bytecode

    ensure_bytecode()  # measure what a deployment pays (bench/bytecode.py)
    if args.quick:
        args.calibrate_cases, args.cases, args.production_cases = 12, 20, 2_000
    if args.max_active_shards is None:
        args.max_active_shards = 2 if args.window else 6

    if args.source:
        saved = json.loads(args.source.read_text())
        docs, weeks = saved["docs"], saved["weeks"]
        for key, value in saved["args"].items():
            setattr(args, key, value)
    else:
        docs = {
            "calibration": week_manifest(args.calibrate_cases, args.calibrate_seed, args.time_scale),
            "validation": week_manifest(args.cases, args.seed, args.time_scale),
        }
        weeks = measure(args, docs)
        if args.save:
            keep = (
                "calibrate_cases",
                "cases",
                "gpus",
                "cpus",
                "shard_size",
                "max_active_shards",
                "parallelism",
                "time_scale",
                "window",
            )
            args.save.write_text(
                json.dumps({"args": {k: getattr(args, k) for k in keep}, "docs": docs, "weeks": weeks})
            )

    admitting = not args.window
    cal = calibrate(
        weeks["calibration"], docs["calibration"], args.time_scale, args.max_active_shards, admitting
    )
    print(
        f"stack: {args.gpus} spot GPUs, {args.cpus} CPU slots, [avsim] shard_size = {args.shard_size}, "
        f"W = {args.max_active_shards}, parallelism {args.parallelism}, time scale {args.time_scale:g}, "
        + ("admission by cases in flight" if admitting else "the window of whole shard runs")
    )
    if admitting:
        for name in ("calibration", "validation"):
            target, size = week_admission(docs[name], args)
            real = (weeks[name].get("admission_target"), weeks[name].get("shard_size"))
            same = "equal to" if (target, size) == real else "DIFFERENT FROM"
            print(
                f"{name} week: bench's target {target} cases in flight, S = {size}; {same} prepare's "
                f"(target {real[0]}, S = {real[1]})"
            )
    print(
        f"calibration ({args.calibrate_cases} cases): per-phase overhead {cal.phase_overhead_seconds:.2f} s = "
        f"latency {cal.latency_seconds:.2f} s (upstream end -> queued, {cal.latency_measured} phases whose pool "
        f"had a free slot) + in slot {cal.in_slot_seconds:.2f} s ({cal.phases_measured} phases: queued -> "
        f"attempt start {cal.before_attempt_seconds:.2f}, attempt beyond its work {cal.attempt_extra_seconds:.2f}, "
        f"attempt end -> task end {cal.after_attempt_seconds:.2f}); shard start {cal.shard_start_seconds:.1f} s "
        f"{list(cal.shard_starts)}; run-level phases' start {cal.run_phases_start_seconds:.1f} s"
    )
    for name in ("calibration", "validation"):
        before, after = weeks[name].get("load", ["?", "?"])
        print(f"{name} week: load average (1 min) {before} when triggered, {after} when done (2 cores)")
        timeline = calibrate(
            weeks[name], docs[name], args.time_scale, args.max_active_shards, admitting
        ).timeline
        print(
            f"{name} week, per shard run (s from the week's start): may start / created / first phase "
            "queued: "
            + ", ".join(f"{n} {m:g}/{c if c is None else f'{c:g}'}/{f:g}" for n, m, c, f in timeline)
        )
    print(
        "| week | cases | forecast without overhead | forecast with overhead | real (to last run-level phase) "
        "| forecast / real | real whole run (to report) |"
    )
    print("|---|---|---|---|---|---|---|")
    ratio = 0.0
    for name in ("calibration", "validation"):
        bare = forecast(docs[name], args, None)
        fc = forecast(docs[name], args, cal)
        span, whole = real_spans(weeks[name])
        print(
            f"| {name} | {len(docs[name]['cases'])} | {bare:.1f} s | {fc:.1f} s | {span:.1f} s | "
            f"{fc / span:.3f} | {whole:.1f} s |"
        )
        ratio = fc / span
    # The other way round, for the spread: calibrated on the validation week, the calibration week.
    back = calibrate(
        weeks["validation"], docs["validation"], args.time_scale, args.max_active_shards, admitting
    )
    span = real_spans(weeks["calibration"])[0]
    print(
        f"reverse: calibrated on the validation week (overhead {back.phase_overhead_seconds:.2f} s, in slot "
        f"{back.in_slot_seconds:.2f} s, shard start {back.shard_start_seconds:.1f} s), the calibration week "
        f"forecast / real = {forecast(docs['calibration'], args, back) / span:.3f}"
    )
    base, loaded = production(
        args.production_cases, cal.phase_overhead_seconds, cal.in_slot_seconds, args.window
    )
    shape = "S = 250, W = 6" if args.window else "admission, [avsim] shard_size = 250, W = 6"
    print(
        f"production ({args.production_cases:,} cases, 280 GPUs, 200 CPUs, {shape}): "
        f"{base / 3600:.3f} h without the overhead, {loaded / 3600:.3f} h with "
        f"{cal.phase_overhead_seconds:.2f} s per phase: ratio {loaded / base:.4f}"
    )
    print(f"planner_forecast: forecast_vs_real={ratio:.3f}")


if __name__ == "__main__":
    main()
