"""How the weekly-run page's API scales with the week: 100 cases against 10,000, in one run.

Builds a metadata database on a private PostgreSQL (``airflow db migrate``), fills it with
weekly runs shaped like real ones (dag_run rows of the parent, its canary shard run and its
shard runs numbered from 1, the last W of them running; one mapped task instance per case and
phase, and an on-demand twin per GPU phase, with pool, GPUs, duration and state; the phase
operator's XComs; the history rows of retried tries) and the artifact store with the run's
documents and the ledger's outcome records, then starts the real API server (with the avsim
plugin) on it and times ``GET /avsim/api/runs/<dag>/<run>/progress`` for each week size, after
checking that its case counts are the week's. Reported per size: median and p95 milliseconds per
request, cold (first request) and warm, and the ratio of the largest week's median to the
smallest one's, measured in the same run.

It ends with ``ui_progress: largest_vs_smallest=R cold_largest_vs_smallest=R median_ms=M``.

    flock /tmp/avsim-heavy.lock python bench/ui_progress.py [--sizes 100,10000] [--requests 30]
    flock /tmp/avsim-heavy.lock python bench/ui_progress.py --quick     # 40 and 400 cases, 5 requests

:func:`build_week` is also what the unit tests of the page use (on SQLite) to build weeks whose
true counts they know.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: phase -> (upstream phases, pool, GPUs, seconds)
PHASES: dict[str, tuple[tuple[str, ...], str, int, float]] = {
    "prepare": ((), "avsim_cpu", 0, 180.0),
    "simulate": (("prepare",), "avsim_gpu_spot", 1, 1800.0),
    "evaluate": (("simulate",), "avsim_cpu", 0, 300.0),
    "render": (("simulate",), "avsim_gpu_spot", 1, 600.0),
    "report": (("evaluate", "render"), "avsim_cpu", 0, 60.0),
}
FAMILIES: dict[str, tuple[str, ...]] = {
    "standard": ("prepare", "simulate", "evaluate", "report"),
    "with_render": ("prepare", "simulate", "evaluate", "render", "report"),
}
NOW = dt.datetime(2026, 12, 9, 12, 0, tzinfo=dt.UTC)


@dataclass
class WeekSpec:
    run_id: str
    cases: int
    dag_id: str = "avsim_weekly"
    shard_size: int = 250
    #: shard runs still running (the last ones created); older ones are finished, later ones not created
    active_shards: int = 4
    #: shards not created yet (their cases wait)
    pending_shards: int = 0
    #: cases of the canary shard run (``<run id>__canary``, the first cases, created first); 0: none
    canary_cases: int = 0
    families: tuple[str, ...] = ("with_render",)
    #: failed phases that pushed their outcome class as the ``avsim_outcome`` XCom
    record_failures: bool = True
    seed: int = 7


@dataclass
class Truth:
    """What the page must show for a built week."""

    status: Counter[str] = field(default_factory=Counter)  # done / running / waiting
    done_by_class: Counter[str] = field(default_factory=Counter)
    phase_classes: dict[str, Counter[str]] = field(default_factory=dict)
    failures: list[tuple[str, str, str]] = field(default_factory=list)  # (case id, phase, class)
    gpu_seconds_ended: float = 0.0
    running_gpus: int = 0
    shards: int = 0


def _case_plan(rnd: random.Random) -> tuple[str, str]:
    """(case class, phase that gives it) for a finished case."""
    x = rnd.random()
    if x < 0.01:
        return "bad_input", "prepare"
    if x < 0.03:
        return "infra_failed", "simulate"
    if x < 0.04:
        return "preempted", "simulate"
    if x < 0.09:
        return "scenario_failed", "simulate"
    return "passed", ""


def _phase_rows(
    family: str, case_class: str, at: str, progress: str, rnd: random.Random
) -> list[tuple[str, str | None, str, int, float | None]]:
    """(phase, state, class, try number, duration) of each phase of one case."""
    rows: list[tuple[str, str | None, str, int, float | None]] = []
    states: dict[str, str | None] = {}
    for phase in FAMILIES[family]:
        ups, _pool, _gpus, seconds = PHASES[phase]
        ups = tuple(u for u in ups if u in FAMILIES[family])
        took = round(seconds * rnd.uniform(0.7, 1.4), 2)
        if progress == "waiting":
            rows.append((phase, None, "waiting", 0, None))
            continue
        if progress == "running":
            if phase == "prepare":
                states[phase] = "success"
                rows.append((phase, "success", "passed", 1, took))
            elif phase == "simulate":
                states[phase] = "running"
                rows.append((phase, "running", "running", 1, None))
            else:
                rows.append((phase, None, "waiting", 0, None))
            continue
        if any(states.get(u) in ("failed", "upstream_failed") for u in ups):
            states[phase] = "upstream_failed"
            rows.append((phase, "upstream_failed", "upstream_failed", 0, None))
        elif phase == at and case_class in ("bad_input", "infra_failed", "preempted"):
            states[phase] = "failed"
            tries = {"bad_input": 1, "infra_failed": 4, "preempted": 3}[case_class]
            rows.append((phase, "failed", case_class, tries, round(took / 10, 2)))
        elif phase == at and case_class == "scenario_failed":
            states[phase] = "success"
            rows.append((phase, "success", "scenario_failed", 1, took))
        else:
            states[phase] = "success"
            rows.append((phase, "success", "passed", 1, took))
    return rows


def _tasks_of(
    family: str, phase: str, state: str | None, cls: str, tries: int, took: float | None
) -> list[tuple[str, str | None, str, int, float | None, str, str]]:
    """The task rows of one phase of a case: a GPU phase is its spot task and its on-demand twin.

    (phase, state, class, try, seconds, task id, pool) per task. The twin skips itself after a spot
    result, does not run after a spot failure, and takes over when the spot task handed over.
    """
    _ups, pool, gpus, _s = PHASES[phase]
    task_id = f"{family}.{phase}"
    if not gpus:
        return [(phase, state, cls, tries, took, task_id, pool)]
    twin = f"{task_id}_on_demand"
    if cls == "preempted":  # preempted on spot until it handed over; the twin failed as well
        return [
            (phase, "skipped", "skipped", tries, took, task_id, pool),
            (phase, "failed", "preempted", 1, took, twin, "avsim_gpu_on_demand"),
        ]
    twin_state = {"success": "skipped", "failed": "upstream_failed", "upstream_failed": "upstream_failed"}
    after = twin_state.get(state or "")
    return [
        (phase, state, cls, tries, took, task_id, pool),
        (phase, after, after or "waiting", 0, None, twin, "avsim_gpu_on_demand"),
    ]


def week_runs(spec: WeekSpec) -> list[tuple[str, range]]:
    """(shard run id, indexes of its cases) in the order the weekly run creates them: the canary
    shard run first (when the week has one), then the shard runs, numbered from 1."""
    from avsim.artifacts import canary_run_id, shard_run_id

    canary = min(spec.cases, spec.canary_cases)
    runs = [(canary_run_id(spec.run_id), range(canary))] if canary else []
    for n, start in enumerate(range(canary, spec.cases, spec.shard_size), start=1):
        runs.append((shard_run_id(spec.run_id, n), range(start, min(spec.cases, start + spec.shard_size))))
    return runs


def build_week(conn: Any, spec: WeekSpec, ledger_root: str | None = None) -> Truth:
    """Insert a weekly run shaped like a real one into the metadata database on ``conn``.

    ``ledger_root``: also write the artifact store's documents (head, plan, outcome records of the
    failed phases) under this ``file://`` root. Returns what the page must show.
    """
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.taskinstancehistory import TaskInstanceHistory
    from airflow.models.xcom import XComModel
    from sqlalchemy import insert, select

    from avsim.artifacts import RunLayout, run_key_for

    truth = Truth()
    shard_dag = f"{spec.dag_id}_shard"
    runs = week_runs(spec)
    n_shards = sum(1 for r, _m in runs if not r.endswith("__canary"))
    created = len(runs) - spec.pending_shards
    first_active = max(0, created - spec.active_shards)
    truth.shards = n_shards
    layout = RunLayout(ledger_root, run_key_for(spec.dag_id, spec.run_id)) if ledger_root else None

    add_dag_rows(conn, {spec.dag_id: ["avsim", "avsim-weekly"], shard_dag: ["avsim", "avsim-shard"]})
    dr = DagRun.__table__
    conn.execute(
        insert(dr),
        [
            {
                "dag_id": spec.dag_id,
                "run_id": spec.run_id,
                "state": "running",
                "run_type": "manual",
                "run_after": NOW - dt.timedelta(days=2),
                "start_date": NOW - dt.timedelta(days=2),
                "end_date": None,
                "clear_number": 0,
            },
            *(
                {
                    "dag_id": shard_dag,
                    "run_id": runs[k][0],
                    "state": "success" if k < first_active else "running",
                    "run_type": "manual",
                    "run_after": NOW - dt.timedelta(days=2, minutes=-k),
                    "start_date": NOW - dt.timedelta(days=2, minutes=-k),
                    "end_date": NOW - dt.timedelta(days=1, minutes=-k) if k < first_active else None,
                    "clear_number": 0,
                }
                for k in range(created)
            ),
        ],
    )
    ids = dict(
        conn.execute(
            select(dr.c.run_id, dr.c.id).where(
                dr.c.dag_id == shard_dag, dr.c.run_id.like(f"{spec.run_id}__%")
            )
        ).all()
    )
    tis: list[dict[str, Any]] = []
    history: list[dict[str, Any]] = []
    xcoms: list[dict[str, Any]] = []
    outcomes: list[tuple[str, str, str]] = []
    # The parent run's prepare task and the run descriptor it pushes (what the page reads first).
    parent_id = conn.execute(
        select(dr.c.id).where(dr.c.dag_id == spec.dag_id, dr.c.run_id == spec.run_id)
    ).scalar_one()
    descriptor = {
        "run_key": run_key_for(spec.dag_id, spec.run_id),
        "artifact_root": ledger_root or "file:///nonexistent",
        "dag_id": spec.dag_id,
        "run_id": spec.run_id,
        "manifest_sha256": "d" * 64,
        "build_id": "sim-2026.50.1",
        "case_count": spec.cases,
        "shard_count": n_shards,
    }
    prepare = _ti_row(
        spec.dag_id,
        spec.run_id,
        "prepare",
        -1,
        "success",
        1,
        NOW - dt.timedelta(days=2),
        2.0,
        "default_pool",
        1,
    )
    parent_rows = [prepare]
    parent_xcoms = [
        {
            "dag_run_id": parent_id,
            "task_id": "prepare",
            "map_index": -1,
            "key": "run",
            "dag_id": spec.dag_id,
            "run_id": spec.run_id,
            "timestamp": NOW,
            "value": descriptor,
        }
    ]
    for k in range(created):
        run_id, members = runs[k]
        map_index: Counter[str] = Counter()
        for j, i in enumerate(members):
            rnd = random.Random(spec.seed * 1_000_003 + i)
            family = spec.families[i % len(spec.families)]
            case_id = f"case-{i:05d}"
            case_class, at = _case_plan(rnd)
            if k < first_active:
                progress = "done"
            else:
                share = j / max(1, len(members))
                progress = "done" if share < 0.5 else "running" if share < 0.7 else "waiting"
            truth.status[progress] += 1
            if progress == "done":
                truth.done_by_class[case_class] += 1
            index = map_index[family]
            map_index[family] += 1
            tasks = []
            for phase_row in _phase_rows(family, case_class, at, progress, rnd):
                truth.phase_classes.setdefault(phase_row[0], Counter())[phase_row[2]] += 1
                tasks += _tasks_of(family, *phase_row)
            for phase, state, cls, tries, took, task_id, pool in tasks:
                gpus = PHASES[phase][2]
                end = NOW - dt.timedelta(hours=rnd.uniform(1, 40)) if took is not None else None
                start = NOW - dt.timedelta(seconds=600) if state == "running" else None
                if took is not None and end is not None:
                    start = end - dt.timedelta(seconds=took)
                    truth.gpu_seconds_ended += took * gpus
                if state == "running" and gpus:
                    truth.running_gpus += gpus
                row = _ti_row(shard_dag, run_id, task_id, index, state, tries, end, took, pool, max(1, gpus))
                row.update(start_date=start, rendered_map_index=case_id if state is not None else None)
                tis.append(row)
                for earlier in range(1, tries):
                    history.append({**tis[-1], "id": uuid.uuid4(), "try_number": earlier, "state": "failed"})
                    history[-1]["task_instance_id"] = history[-1].pop("id")
                    history[-1]["duration"] = took
                    truth.gpu_seconds_ended += (took or 0) * gpus
                key = {"dag_run_id": ids[run_id], "task_id": task_id, "map_index": index}
                where = {"dag_id": shard_dag, "run_id": run_id, "timestamp": end or NOW}
                if state == "success":
                    value = {"case_id": case_id, "phase": phase, "outcome": cls, "attempt": tries}
                    xcoms.append({**key, **where, "key": "return_value", "value": value})
                if state == "failed":
                    truth.failures.append((case_id, phase, cls))
                    outcomes.append((case_id, phase, cls))
                    if spec.record_failures:
                        value = {"outcome": cls, "reason": f"{cls} in {phase}", "attempt": tries}
                        xcoms.append({**key, **where, "key": "avsim_outcome", "value": value})
                if cls == "scenario_failed":
                    truth.failures.append((case_id, phase, cls))
    for table, rows in (
        (TaskInstance.__table__, parent_rows),
        (XComModel.__table__, parent_xcoms),
        (TaskInstance.__table__, tis),
        (TaskInstanceHistory.__table__, history),
        (XComModel.__table__, xcoms),
    ):
        for first in range(0, len(rows), 5000):
            conn.execute(insert(table), rows[first : first + 5000])
    truth.status["waiting"] += sum(len(members) for _run_id, members in runs[created:])
    if layout is not None:
        _write_documents(layout, spec, n_shards, outcomes)
    return truth


def add_dag_rows(conn: Any, tags: dict[str, list[str]], bundle: str = "dags-folder") -> None:
    """The dag, dag_tag and dag_bundle rows the dag-processor writes for these DAGs, where missing:
    the pages serve the runs of DAGs tagged avsim only."""
    from airflow.models.dag import DagModel, DagTag
    from airflow.models.dagbundle import DagBundleModel
    from sqlalchemy import insert, select

    if conn.execute(select(DagBundleModel.name).where(DagBundleModel.name == bundle)).first() is None:
        conn.execute(insert(DagBundleModel.__table__), [{"name": bundle}])
    known = set(conn.scalars(select(DagModel.dag_id).where(DagModel.dag_id.in_(list(tags)))))
    new = {d: names for d, names in tags.items() if d not in known}
    if not new:
        return
    conn.execute(
        insert(DagModel.__table__),
        [
            {
                "dag_id": d,
                "bundle_name": bundle,
                "max_active_tasks": 16,
                "max_consecutive_failed_dag_runs": 0,
                "has_task_concurrency_limits": False,
            }
            for d in new
        ],
    )
    conn.execute(
        insert(DagTag.__table__), [{"dag_id": d, "name": t} for d, names in new.items() for t in names]
    )


def metadata_engine(path: Path) -> Any:
    """A SQLite database with every Airflow table, created from the models (for unit tests)."""
    import sqlalchemy
    from airflow.models import import_all_models
    from airflow.models.base import Base

    import_all_models()
    engine = sqlalchemy.create_engine(f"sqlite:///{path}")
    Base.metadata.create_all(engine)
    return engine


def _ti_row(
    dag_id: str,
    run_id: str,
    task_id: str,
    map_index: int,
    state: str | None,
    tries: int,
    end: dt.datetime | None,
    took: float | None,
    pool: str,
    slots: int,
) -> dict[str, Any]:
    """A task_instance row as the scheduler and workers leave it (every insert uses the same keys)."""
    return {
        "id": uuid.uuid4(),
        "dag_id": dag_id,
        "task_id": task_id,
        "run_id": run_id,
        "map_index": map_index,
        "rendered_map_index": None,
        "state": state,
        "try_number": tries,
        "max_tries": 3,
        "start_date": end - dt.timedelta(seconds=took) if end is not None and took is not None else None,
        "end_date": end,
        "duration": took,
        "pool": pool,
        "pool_slots": slots,
        "queue": "default",
        "priority_weight": 1,
        "operator": "LocalPhaseOperator",
        "span_status": "not_started",
    }


def _write_documents(
    layout: Any, spec: WeekSpec, n_shards: int, outcomes: list[tuple[str, str, str]]
) -> None:
    from avsim.ledger.records import OutcomeRecord
    from avsim.phases.contract import Outcome

    def put(uri: str, doc: Any) -> None:
        p = Path(uri.removeprefix("file://"))
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(doc))

    image = "registry.example.com/avsim/simulator@sha256:" + "c" * 64
    put(
        layout.head_uri,
        {
            "run": {
                "name": "weekly_regression",
                "iso_week": "2026-W50",
                "run_class": "weekly",
                "deadline": "2026-12-13T18:00:00Z",
                "build": {"build_id": "sim-2026.50.1", "image": image},
            },
            "case_count": spec.cases,
        },
    )
    gpu = sum(PHASES[p][2] * PHASES[p][3] for p in FAMILIES["with_render"])
    put(
        layout.plan_uri,
        {
            "cases": spec.cases,
            "phases": spec.cases * 5,
            "gpu_seconds": gpu * spec.cases,
            "cpu_seconds": 540.0 * spec.cases,
            "critical_path_seconds": 2940.0,
            "deadline": "2026-12-13T18:00:00Z",
        },
    )
    for case_id, phase, cls in outcomes:
        value = cls if cls in {o.value for o in Outcome} else "infra_failed"
        rec = OutcomeRecord(
            run_key=layout.run_key,
            case_id=case_id,
            phase=phase,
            attempt=1,
            outcome=Outcome(value),
            output_uri="",
            committed_at=NOW.isoformat(),
            reason=f"{cls} in {phase} (ledger)",
        )
        put(layout.outcome_record(case_id, phase), rec.to_json())
    del n_shards


# -- the benchmark --------------------------------------------------------------------------------
def _token(api: str) -> str:
    import urllib.request

    with urllib.request.urlopen(f"{api}/auth/token", timeout=30) as resp:
        return str(json.loads(resp.read())["access_token"])


def _time_requests(api: str, path: str, n: int) -> tuple[float, list[float], dict[str, Any]]:
    """(cold ms, warm ms of each of ``n`` requests, the last answer)."""
    import urllib.request

    token = _token(api)
    last: dict[str, Any] = {}

    def get() -> float:
        req = urllib.request.Request(f"{api}{path}", headers={"Authorization": f"Bearer {token}"})
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=120) as resp:
            body = resp.read()
        took = (time.perf_counter() - t0) * 1000
        last.update(json.loads(body))
        return took

    cold = get()
    return cold, [get() for _ in range(n)], last


def _check(doc: dict[str, Any], truth: Truth, size: int) -> None:
    """The timed answer is the right one: the page's case counts equal the built week's."""
    cases = doc["cases"]
    got = (cases["done"], cases["running"], cases["waiting"], cases["by_class"])
    want = (truth.status["done"], truth.status["running"], truth.status["waiting"], dict(truth.done_by_class))
    if got != want:
        raise SystemExit(f"week of {size} cases: the page shows {got}, the week holds {want}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", help="week sizes in cases, comma separated (100,10000; 40,400 --quick)")
    parser.add_argument("--requests", type=int, help="timed requests per size after one cold (30; 5 --quick)")
    parser.add_argument("--quick", action="store_true", help="small weeks, few requests")
    parser.add_argument("--shard-size", type=int, default=250, help="S, [avsim] shard_size")
    parser.add_argument("--active-shards", type=int, default=6, help="W, [avsim] max_active_shards")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in (args.sizes or ("40,400" if args.quick else "100,10000")).split(",")]
    requests = args.requests or (5 if args.quick else 30)

    sys.path.insert(0, str(ROOT))
    import sqlalchemy
    from tests.support.postgres import postgres_cluster

    from avsim.devstack.stack import LocalStack

    base = Path(tempfile.mkdtemp(prefix="avsim-bench-ui-"))
    results: dict[int, dict[str, float]] = {}
    with postgres_cluster() as url:
        stack = LocalStack(
            home=base / "airflow",
            dags_folder=base / "dags",
            plugins_folder=ROOT / "plugins",
            sql_alchemy_conn=url,
        )
        (base / "dags").mkdir()
        t0 = time.perf_counter()
        stack.migrate()
        print(f"airflow db migrate: {time.perf_counter() - t0:.1f} s", flush=True)
        engine = sqlalchemy.create_engine(url)
        root = f"file://{stack.home / 'artifacts'}"
        truths: dict[int, Truth] = {}
        for size in sizes:
            t0 = time.perf_counter()
            # As the weekly run cuts it: a canary shard run of 1 % of the cases (at least 20) first,
            # then shard runs of S cases; the last W created are still running.
            canary = min(size, max(20, size // 100))
            shard_size = min(args.shard_size, max(1, size - canary))
            spec = WeekSpec(
                run_id=f"bench_{size}",
                cases=size,
                shard_size=shard_size,
                active_shards=args.active_shards,
                canary_cases=canary,
                families=("standard", "with_render"),
            )
            with engine.begin() as conn:
                truths[size] = build_week(conn, spec, root)
                tis, runs = conn.execute(
                    sqlalchemy.text(
                        "SELECT count(*), count(DISTINCT run_id) FROM task_instance "
                        "WHERE dag_id = 'avsim_weekly_shard' AND run_id LIKE :p"
                    ),
                    {"p": f"bench\\_{size}\\_\\_%"},
                ).one()
            print(
                f"week of {size:,} cases: {runs} shard runs (canary of {canary}, "
                f"{min(args.active_shards, runs)} running), {tis:,} phase task instances "
                f"in {time.perf_counter() - t0:.1f} s"
            )
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text("ANALYZE"))
        stack.start(["api-server"])
        try:
            for size in sizes:
                cold, warm, doc = _time_requests(
                    stack.api_url, f"/avsim/api/runs/avsim_weekly/bench_{size}/progress", requests
                )
                _check(doc, truths[size], size)
                warm.sort()
                results[size] = {
                    "cold_ms": cold,
                    "median_ms": statistics.median(warm),
                    "p95_ms": warm[max(0, int(len(warm) * 0.95) - 1)],
                }
        finally:
            stack.stop()
    smallest, largest = min(sizes), max(sizes)
    print(f"\n{'cases':>8} {'cold ms':>9} {'median ms':>10} {'p95 ms':>8}")
    for size in sizes:
        r = results[size]
        print(f"{size:>8,} {r['cold_ms']:>9.1f} {r['median_ms']:>10.1f} {r['p95_ms']:>8.1f}")
    ratio = results[largest]["median_ms"] / results[smallest]["median_ms"]
    cold_ratio = results[largest]["cold_ms"] / results[smallest]["cold_ms"]
    print(f"\nratio {largest:,} / {smallest:,} cases: median {ratio:.2f}x, cold {cold_ratio:.2f}x")
    print(
        f"ui_progress: largest_vs_smallest={ratio:.3f} cold_largest_vs_smallest={cold_ratio:.3f} "
        f"median_ms={results[largest]['median_ms']:.1f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
