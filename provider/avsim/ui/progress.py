"""A weekly run's progress from the Airflow metadata database, aggregated in SQL.

The week's phases are the mapped task instances (``map_index >= 0``) of its shard runs
(``<run id>__shard_<k>`` and ``<run id>__canary`` of ``<dag id>_shard``): task id
``<family>.<phase>``, one map index per case, ``rendered_map_index`` the case id.

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
from sqlalchemy.orm import Session, aliased

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

    #: (task_id, class) -> [count, seconds, gpu_seconds]
    phases: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    #: (status, class) -> cases
    cases: dict[tuple[str, str], int] = field(default_factory=dict)
    #: pool -> GPU-seconds of ended tries (the current try and earlier ones)
    gpu_seconds: dict[str, float] = field(default_factory=dict)
    #: failed or scenario-failed phases: dicts (run_id, task_id, map_index, case_id, ...)
    failures: list[dict[str, Any]] = field(default_factory=list)


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


def _phase_tis(shard_dag_id: str, run_ids: Sequence[str]) -> Any:
    """One row per phase task instance of ``run_ids``, with its outcome class (``cls``)."""
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.models.xcom import XComModel

    rv = aliased(XComModel)
    oc = aliased(XComModel)

    def joined(x: Any, key: str) -> Any:
        return and_(
            x.dag_id == TI.dag_id,
            x.run_id == TI.run_id,
            x.task_id == TI.task_id,
            x.map_index == TI.map_index,
            x.key == key,
        )

    recorded = oc.value["outcome"].as_string()
    returned = rv.value["outcome"].as_string()
    cls = case(
        (TI.state == "success", func.coalesce(recorded, returned, literal("passed"))),
        (TI.state == "failed", func.coalesce(recorded, literal("failed"))),
        (TI.state == "upstream_failed", literal("upstream_failed")),
        (TI.state.in_(("skipped", "removed")), literal("not_run")),
        (TI.state.in_(ACTIVE), literal("running")),
        else_=literal("waiting"),
    )
    return (
        select(
            TI.run_id.label("run_id"),
            TI.task_id.label("task_id"),
            TI.map_index.label("map_index"),
            TI.__table__.c.rendered_map_index.label("case_id"),
            TI.state.label("state"),
            TI.try_number.label("try_number"),
            TI.end_date.label("end_date"),
            TI.duration.label("duration"),
            TI.pool.label("pool"),
            TI.pool_slots.label("pool_slots"),
            cls.label("cls"),
            oc.value["reason"].as_string().label("reason"),
        )
        .select_from(TI)
        .outerjoin(rv, joined(rv, "return_value"))
        .outerjoin(oc, joined(oc, OUTCOME_XCOM))
        .where(TI.dag_id == shard_dag_id, TI.run_id.in_(list(run_ids)), TI.map_index >= 0)
        .subquery("phase_ti")
    )


def _flag(condition: Any) -> Any:
    return func.max(case((condition, 1), else_=0))


def compute_digests(
    session: Session, shard_dag_id: str, run_ids: Sequence[str], gpu_pools: Sequence[str]
) -> dict[str, Digest]:
    """The digest of each shard run in ``run_ids``: four aggregate queries for all of them together."""
    from airflow.models.taskinstancehistory import TaskInstanceHistory as TIH

    digests = {r: Digest() for r in run_ids}
    if not run_ids:
        return digests
    t = _phase_tis(shard_dag_id, run_ids)
    gpu = case((t.c.pool.in_(list(gpu_pools)), t.c.duration * t.c.pool_slots), else_=0.0)

    # Per phase and class: counts, seconds, GPU-seconds of the current tries (and per pool).
    for run_id, task_id, cls, pool, n, seconds, gpu_s in session.execute(
        select(
            t.c.run_id, t.c.task_id, t.c.cls, t.c.pool, func.count(), func.sum(t.c.duration), func.sum(gpu)
        ).group_by(t.c.run_id, t.c.task_id, t.c.cls, t.c.pool)
    ).all():
        d = digests[run_id]
        acc = d.phases.setdefault((task_id, cls), [0, 0.0, 0.0])
        acc[0] += int(n)
        acc[1] += float(seconds or 0)
        acc[2] += float(gpu_s or 0)
        if gpu_s:
            d.gpu_seconds[pool] = d.gpu_seconds.get(pool, 0.0) + float(gpu_s)

    # Per case (shard run, family, map index): its status and class, then counted.
    families = sorted(
        {task.split(".", 1)[0] for d in digests.values() for task, _ in d.phases if "." in task}
    )
    if families:
        family = case(
            *((func.substr(t.c.task_id, 1, len(f) + 1) == f"{f}.", literal(f)) for f in families),
            else_=literal(""),
        )
        per_case = (
            select(
                t.c.run_id.label("run_id"),
                case(
                    (func.sum(case((t.c.state.in_(TERMINAL), 1), else_=0)) == func.count(), literal("done")),
                    (
                        or_(
                            _flag(t.c.state.in_(ACTIVE)) == 1,
                            func.sum(case((t.c.state.in_(TERMINAL), 1), else_=0)) > 0,
                        ),
                        literal("running"),
                    ),
                    else_=literal("waiting"),
                ).label("status"),
                case(
                    *((_flag(t.c.cls == c) == 1, literal(c)) for c in CASE_CLASSES[:4]),
                    (_flag(t.c.cls.in_(_BLOCKED)) == 1, literal("infra_failed")),
                    (_flag(t.c.cls == "scenario_failed") == 1, literal("scenario_failed")),
                    else_=literal("passed"),
                ).label("cls"),
            )
            .group_by(t.c.run_id, family, t.c.map_index)
            .subquery("per_case")
        )
        for run_id, status, cls, n in session.execute(
            select(per_case.c.run_id, per_case.c.status, per_case.c.cls, func.count()).group_by(
                per_case.c.run_id, per_case.c.status, per_case.c.cls
            )
        ).all():
            digests[run_id].cases[(status, cls)] = int(n)

    # Failed and scenario-failed phases, to list (bounded by the failures of these runs).
    for row in session.execute(
        select(
            t.c.run_id,
            t.c.task_id,
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

    # GPU-seconds of earlier tries (task instance history), per pool.
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
