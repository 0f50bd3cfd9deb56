"""A weekly run's progress from the Airflow metadata database, aggregated in SQL.

The week's phases are the mapped task instances (``map_index >= 0``) of its shard runs
(``<run id>__shard_<k>`` and ``<run id>__canary`` of ``<dag id>_shard``): task id
``<family>.<phase>``, one map index per case, ``rendered_map_index`` the case id. A GPU phase has
two tasks, the spot task and its on-demand twin ``<family>.<phase>_on_demand`` (one of them ends
skipped); the page counts the *phase of a case*, whichever of its tasks did the work.

A phase's outcome class comes from the task instance's state and its XComs: the phase operator's
return value (``{"outcome": ...}``, pushed when the phase produced output) and ``avsim_outcome``
(pushed on every ended attempt, also a failed one). A failed task instance without either is
counted as ``failed`` (class not recorded) and its class is looked up in the ledger when listed.

Every query groups by shard run, so a shard run's figures can be reused while it stays finished:
:class:`DigestCache` keeps them keyed by the run's state, end date and clear count (what a clear
or rerun changes), for at most :data:`CACHE_SECONDS`. Only active shard runs (at most
``max_active_shards``) are aggregated on each request, so the cost does not grow with the week.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import and_, case, func, literal, or_, select
from sqlalchemy.orm import Session

#: Task-instance states after which a phase will not run again unless cleared.
TERMINAL = ("success", "failed", "upstream_failed", "skipped", "removed")
#: States of a phase that is being worked on.
ACTIVE = ("running", "queued", "up_for_retry", "up_for_reschedule", "deferred", "restarting")
#: Case classes, most specific first (as :func:`avsim.ledger.store.case_outcome` ranks them);
#: ``failed`` is a failed phase whose class was not recorded.
CASE_CLASSES = ("bad_input", "bad_build", "preempted", "failed", "infra_failed", "scenario_failed", "passed")
#: Phase classes that make a case fail for infrastructure when no more specific class applies.
_BLOCKED = ("infra_failed", "upstream_failed", "not_run")
#: Order of listed failures: what needs an engineer first.
FAILURE_ORDER = ("bad_build", "bad_input", "failed", "infra_failed", "preempted", "scenario_failed")
#: XCom key of the outcome a phase attempt ended with (pushed by the phase operator).
OUTCOME_XCOM = "avsim_outcome"
#: A task's class -> rank; a phase of a case takes the class of highest rank among its tasks
#: (a result beats work in progress, which beats a failure, which beats a skipped task).
RANK = {
    "scenario_failed": 91,
    "passed": 90,
    "running": 80,
    "bad_input": 76,
    "bad_build": 75,
    "preempted": 74,
    "failed": 73,
    "infra_failed": 72,
    "upstream_failed": 60,
    "waiting": 50,
    "not_run": 30,
    "skipped": 20,
}
#: Phase classes of a phase that is over.
_ENDED = tuple(c for c in RANK if c not in ("running", "waiting"))
CACHE_SECONDS = 300.0


@dataclass(frozen=True)
class ShardRun:
    run_id: str
    kind: str  # "shard" | "canary"
    index: int | None
    state: str | None
    start_date: dt.datetime | None
    end_date: dt.datetime | None
    clear_number: int

    @property
    def finished(self) -> bool:
        return self.state in ("success", "failed") and self.end_date is not None

    @property
    def version(self) -> tuple[Any, ...]:
        return (self.state, self.end_date, self.clear_number)


@dataclass
class Digest:
    """The aggregated figures of one shard run."""

    #: (phase, class) -> (phases of cases, seconds of their tasks)
    phases: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)
    #: (status, class) -> cases
    cases: dict[tuple[str, str], int] = field(default_factory=dict)
    #: pool -> GPU-seconds of ended tries (the current try and earlier ones)
    gpu_seconds: dict[str, float] = field(default_factory=dict)
    #: failed or scenario-failed phases: dicts (run_id, task_id, map_index, case_id, ...)
    failures: list[dict[str, Any]] = field(default_factory=list)
    #: whether failures without a recorded class were looked up in the ledger
    resolved: bool = False


class DigestCache:
    """Digests of finished shard runs, keyed by run id and version, in this process only."""

    def __init__(self, ttl: float = CACHE_SECONDS) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._items: dict[tuple[str, str], tuple[tuple[Any, ...], float, Digest]] = {}

    def get(self, dag_id: str, run: ShardRun) -> Digest | None:
        with self._lock:
            hit = self._items.get((dag_id, run.run_id))
        if hit and hit[0] == run.version and time.monotonic() - hit[1] < self.ttl:
            return hit[2]
        return None

    def put(self, dag_id: str, run: ShardRun, digest: Digest) -> None:
        if run.finished:
            with self._lock:
                self._items[(dag_id, run.run_id)] = (run.version, time.monotonic(), digest)
                if len(self._items) > 5000:  # many weeks' shards: drop the oldest
                    for key in sorted(self._items, key=lambda k: self._items[k][1])[:1000]:
                        del self._items[key]


def shard_runs(session: Session, shard_dag_id: str, run_id: str) -> list[ShardRun]:
    """The shard runs (and canary run) the weekly run ``run_id`` started."""
    from airflow.models.dagrun import DagRun

    prefix = f"{run_id}__"
    rows = session.execute(
        select(DagRun.run_id, DagRun.state, DagRun.start_date, DagRun.end_date, DagRun.clear_number).where(
            DagRun.dag_id == shard_dag_id, DagRun.run_id.startswith(prefix, autoescape=True)
        )
    ).all()
    out = []
    for rid, state, start, end, clears in rows:
        rest = str(rid)[len(prefix) :]
        if rest == "canary":
            kind, index = "canary", None
        elif rest.startswith("shard_") and rest[6:].isdigit():
            kind, index = "shard", int(rest[6:])
        else:
            continue
        out.append(ShardRun(str(rid), kind, index, state, start, end, int(clears or 0)))
    return sorted(out, key=lambda r: (r.kind != "canary", r.index or 0))


def _phase_tis(shard_dag_id: str, run_ids: Sequence[str], task_ids: Sequence[str]) -> Any:
    """One row per phase task instance of ``run_ids``: its family, phase, class (``cls``) and rank."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.models.xcom import XComModel as X

    from avsim.plan.model import ON_DEMAND_SUFFIX

    # The two XComs of each phase task instance of these runs, one row per task instance. The
    # filter on dag_run_id (the XCom primary key's first column) reads only these runs' XComs.
    runs = select(DagRun.id).where(DagRun.dag_id == shard_dag_id, DagRun.run_id.in_(list(run_ids)))
    outcome = X.value["outcome"].as_string()
    xcoms = (
        select(
            X.run_id.label("run_id"),
            X.task_id.label("task_id"),
            X.map_index.label("map_index"),
            func.max(case((X.key == OUTCOME_XCOM, outcome))).label("recorded"),
            func.max(case((X.key == "return_value", outcome))).label("returned"),
            func.max(case((X.key == OUTCOME_XCOM, X.value["reason"].as_string()))).label("reason"),
        )
        .where(X.dag_run_id.in_(runs), X.key.in_((OUTCOME_XCOM, "return_value")), X.map_index >= 0)
        .group_by(X.run_id, X.task_id, X.map_index)
        .subquery("phase_xcom")
    )
    cls = case(
        (TI.state == "success", func.coalesce(xcoms.c.recorded, xcoms.c.returned, literal("passed"))),
        (TI.state == "failed", func.coalesce(xcoms.c.recorded, literal("failed"))),
        (TI.state == "upstream_failed", literal("upstream_failed")),
        (TI.state == "skipped", literal("skipped")),
        (TI.state == "removed", literal("not_run")),
        (TI.state.in_(ACTIVE), literal("running")),
        else_=literal("waiting"),
    )
    family = {t: t.split(".", 1)[0] for t in task_ids}
    phase = {t: t.split(".", 1)[1].removesuffix(ON_DEMAND_SUFFIX) for t in task_ids}
    return (
        select(
            TI.run_id.label("run_id"),
            TI.task_id.label("task_id"),
            case(family, value=TI.task_id, else_=literal("")).label("family"),
            case(phase, value=TI.task_id, else_=TI.task_id).label("phase"),
            TI.map_index.label("map_index"),
            TI.__table__.c.rendered_map_index.label("case_id"),
            TI.state.label("state"),
            TI.try_number.label("try_number"),
            TI.end_date.label("end_date"),
            TI.duration.label("duration"),
            TI.pool.label("pool"),
            TI.pool_slots.label("pool_slots"),
            cls.label("cls"),
            case(RANK, value=cls, else_=literal(0)).label("rank"),
            xcoms.c.reason.label("reason"),
        )
        .select_from(TI)
        .outerjoin(
            xcoms,
            and_(
                xcoms.c.run_id == TI.run_id,
                xcoms.c.task_id == TI.task_id,
                xcoms.c.map_index == TI.map_index,
            ),
        )
        .where(TI.dag_id == shard_dag_id, TI.run_id.in_(list(run_ids)), TI.map_index >= 0)
        .subquery("phase_ti")
    )


def _flag(condition: Any) -> Any:
    return func.max(case((condition, 1), else_=0))


def _rank_in(column: Any, classes: Iterable[str]) -> Any:
    return column.in_([RANK[c] for c in classes])


def compute_digests(
    session: Session, shard_dag_id: str, run_ids: Sequence[str], gpu_pools: Sequence[str]
) -> dict[str, Digest]:
    """The digest of each shard run in ``run_ids``: five aggregate queries for all of them together."""
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.models.taskinstancehistory import TaskInstanceHistory as TIH

    digests = {r: Digest() for r in run_ids}
    if not run_ids:
        return digests
    task_ids = sorted(
        t
        for t in session.scalars(
            select(TI.task_id)
            .where(TI.dag_id == shard_dag_id, TI.run_id.in_(list(run_ids)), TI.map_index >= 0)
            .distinct()
        ).all()
        if "." in t
    )
    if not task_ids:
        return digests
    t = _phase_tis(shard_dag_id, run_ids, task_ids)
    gpu = case((t.c.pool.in_(list(gpu_pools)), t.c.duration * t.c.pool_slots), else_=0.0)

    # One row per phase of a case: the class of its highest-ranked task, its tasks' seconds.
    per_phase = (
        select(
            t.c.run_id.label("run_id"),
            t.c.family.label("family"),
            t.c.map_index.label("map_index"),
            t.c.phase.label("phase"),
            func.max(t.c.rank).label("rank"),
            func.sum(t.c.duration).label("seconds"),
        )
        .group_by(t.c.run_id, t.c.family, t.c.map_index, t.c.phase)
        .subquery("per_phase")
    )
    by_rank = {v: k for k, v in RANK.items()}
    for run_id, phase, rank, n, seconds in session.execute(
        select(
            per_phase.c.run_id,
            per_phase.c.phase,
            per_phase.c.rank,
            func.count(),
            func.sum(per_phase.c.seconds),
        ).group_by(per_phase.c.run_id, per_phase.c.phase, per_phase.c.rank)
    ).all():
        digests[run_id].phases[(phase, by_rank.get(int(rank), "waiting"))] = (int(n), float(seconds or 0))

    # One row per case: its status and class, then counted.
    r = per_phase.c.rank
    ended = func.sum(case((_rank_in(r, _ENDED), 1), else_=0))
    per_case = (
        select(
            per_phase.c.run_id.label("run_id"),
            case(
                (ended == func.count(), literal("done")),
                (or_(_flag(r == RANK["running"]) == 1, ended > 0), literal("running")),
                else_=literal("waiting"),
            ).label("status"),
            case(
                *((_flag(r == RANK[c]) == 1, literal(c)) for c in CASE_CLASSES[:4]),
                (_flag(_rank_in(r, (*_BLOCKED, "skipped"))) == 1, literal("infra_failed")),
                (_flag(r == RANK["scenario_failed"]) == 1, literal("scenario_failed")),
                else_=literal("passed"),
            ).label("cls"),
        )
        .group_by(per_phase.c.run_id, per_phase.c.family, per_phase.c.map_index)
        .subquery("per_case")
    )
    for run_id, status, cls, n in session.execute(
        select(per_case.c.run_id, per_case.c.status, per_case.c.cls, func.count()).group_by(
            per_case.c.run_id, per_case.c.status, per_case.c.cls
        )
    ).all():
        digests[run_id].cases[(status, cls)] = int(n)

    # Failed and scenario-failed phase tasks, to list (bounded by the failures of these runs).
    for row in session.execute(
        select(
            t.c.run_id,
            t.c.task_id,
            t.c.phase,
            t.c.map_index,
            t.c.case_id,
            t.c.state,
            t.c.try_number,
            t.c.end_date,
            t.c.cls,
            t.c.reason,
        ).where(or_(t.c.state == "failed", t.c.cls == "scenario_failed"))
    ).all():
        digests[row.run_id].failures.append(dict(row._mapping))

    # GPU-seconds per pool: the current tries, then earlier tries (task instance history).
    for run_id, pool, gpu_s in session.execute(
        select(t.c.run_id, t.c.pool, func.sum(gpu)).group_by(t.c.run_id, t.c.pool)
    ).all():
        if gpu_s:
            digests[run_id].gpu_seconds[pool] = float(gpu_s)
    for run_id, pool, gpu_s in session.execute(
        select(TIH.run_id, TIH.pool, func.sum(TIH.duration * TIH.pool_slots))
        .where(
            TIH.dag_id == shard_dag_id,
            TIH.run_id.in_(list(run_ids)),
            TIH.map_index >= 0,
            TIH.pool.in_(list(gpu_pools)),
        )
        .group_by(TIH.run_id, TIH.pool)
    ).all():
        d = digests[run_id]
        d.gpu_seconds[pool] = d.gpu_seconds.get(pool, 0.0) + float(gpu_s or 0)
    return digests


def running_gpu_seconds(
    session: Session, shard_dag_id: str, run_ids: Sequence[str], gpu_pools: Sequence[str], now: dt.datetime
) -> tuple[int, float]:
    """(GPUs held, GPU-seconds so far) of the GPU phases running now (rows bounded by the GPUs in use)."""
    from airflow.models.taskinstance import TaskInstance as TI

    if not run_ids:
        return 0, 0.0
    held, spent = 0, 0.0
    for slots, start in session.execute(
        select(TI.pool_slots, TI.start_date).where(
            TI.dag_id == shard_dag_id,
            TI.run_id.in_(list(run_ids)),
            TI.map_index >= 0,
            TI.state == "running",
            TI.pool.in_(list(gpu_pools)),
        )
    ).all():
        held += int(slots or 0)
        if start is not None:
            start = start if start.tzinfo else start.replace(tzinfo=dt.UTC)
            spent += max(0.0, (now - start).total_seconds()) * int(slots or 0)
    return held, spent


def digests_for(
    session: Session,
    shard_dag_id: str,
    runs: Iterable[ShardRun],
    gpu_pools: Sequence[str],
    cache: DigestCache | None,
) -> dict[str, Digest]:
    """Each run's digest: cached for finished runs whose version did not change, else computed."""
    found: dict[str, Digest] = {}
    todo: list[ShardRun] = []
    for run in runs:
        hit = cache.get(shard_dag_id, run) if cache else None
        if hit is not None:
            found[run.run_id] = hit
        else:
            todo.append(run)
    computed = compute_digests(session, shard_dag_id, [r.run_id for r in todo], gpu_pools)
    for run in todo:
        found[run.run_id] = computed[run.run_id]
        if cache:
            cache.put(shard_dag_id, run, computed[run.run_id])
    return found
