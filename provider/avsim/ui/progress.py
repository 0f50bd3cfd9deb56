"""A weekly run's progress from the Airflow metadata database, aggregated in SQL.

The week's phases are the mapped task instances of its shard runs, one map index per case; a GPU
phase's spot task and on-demand twin count as one phase of a case. A phase's class comes from the task
instance's state and its XComs (else from the ledger, when listed). Every query groups by shard run, so
:class:`DigestCache` keeps finished shard runs' figures and only active ones are aggregated per request.
docs/design.md, "The avsim pages".
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Float, Integer, String, case, cast, func, literal, null, or_, select, text, union_all
from sqlalchemy.orm import Session

from avsim import airflow_internals
from avsim.contracts import OUTCOME_XCOM_KEY
from avsim.phases.contract import CASE_PRECEDENCE, NOT_RUN, PHASES_GIVING, RESULTS, Outcome, values
from avsim.phases.contract import FAILURE_ORDER as FAILURE_ORDER_OF_CONTRACT

#: Task-instance states after which a phase will not run again unless cleared.
TERMINAL = ("success", "failed", "upstream_failed", "skipped", "removed")
#: States of a phase that is being worked on.
ACTIVE = ("running", "queued", "up_for_retry", "up_for_reschedule", "deferred", "restarting")
#: A failed phase task that published no outcome (its worker died before it could).
FAILED = "failed"
#: The page's classes of a phase that is not over: being worked on, not started yet, and one whose
#: tasks were all skipped (a GPU phase's unused twin).
RUNNING, WAITING, SKIPPED = "running", "waiting", "skipped"
#: How a case takes its class on this page, generated from the one precedence
#: (:data:`avsim.phases.contract.CASE_PRECEDENCE`): (case class, the phase classes that give it),
#: most specific first. Two page-only phase classes join it: ``failed`` (a failed phase whose class
#: was not recorded) ranks just above an infrastructure failure, and a phase whose tasks were all
#: skipped did not run, which makes its case an infrastructure failure.
CASE_RULES: tuple[tuple[str, tuple[str, ...]], ...] = tuple(
    rule
    for cls in CASE_PRECEDENCE
    for rule in (
        ((FAILED, (FAILED,)), (cls.value, (*PHASES_GIVING[cls], SKIPPED)))
        if cls is Outcome.INFRA_FAILED
        else ((cls.value, PHASES_GIVING[cls]),)
    )
)
#: Case classes, most specific first; ``failed`` is a failed phase whose class was not recorded.
CASE_CLASSES = tuple(cls for cls, _phases in CASE_RULES)
#: Order of listed failures: what needs an engineer first (:data:`avsim.phases.contract.FAILURE_ORDER`,
#: with an unrecorded failure just above an infrastructure failure).
FAILURE_ORDER = tuple(
    c
    for o in FAILURE_ORDER_OF_CONTRACT
    for c in ((FAILED, o.value) if o is Outcome.INFRA_FAILED else (o.value,))
)
#: XCom key of the outcome a phase attempt ended with (pushed by the phase operator).
OUTCOME_XCOM = OUTCOME_XCOM_KEY
#: A task's class -> rank; a phase of a case takes the class of highest rank among its tasks
#: (a result beats work in progress, which beats a failure, which beats a skipped task); failures
#: rank among themselves as cases do.
RANK = {
    Outcome.SCENARIO_FAILED.value: 91,
    Outcome.PASSED.value: 90,
    RUNNING: 80,
    **{c: 76 - i for i, c in enumerate(c for c in CASE_CLASSES if c not in values(RESULTS))},
    Outcome.UPSTREAM_FAILED.value: 60,
    WAITING: 50,
    NOT_RUN: 30,
    SKIPPED: 20,
}
#: Phase classes of a phase that is over.
_ENDED = tuple(c for c in RANK if c not in (RUNNING, WAITING))
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
    DagRun = airflow_internals.models()["DagRun"]

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


def _xcom_of(shard_dag_id: str, row: Any, keys: Sequence[str], field: str) -> Any:
    """``value[field]`` of the first of ``keys`` (in key order) a phase task instance has as XCom.

    A correlated subquery: one probe of the XCom index per task instance, whatever the size of
    the XCom table and whatever the planner estimates (a join invited whole-table scans).
    """
    X = airflow_internals.models()["XComModel"]

    return (
        select(X.value[field].as_string())
        .where(
            X.dag_id == shard_dag_id,
            X.task_id == row.task_id,
            X.run_id == row.run_id,
            X.map_index == row.map_index,
            X.key.in_(list(keys)),
        )
        .order_by(X.key)
        .limit(1)
        .scalar_subquery()
    )


def _phase_tis(shard_dag_id: str, run_ids: Sequence[str], task_ids: Sequence[str]) -> Any:
    """One row per phase task instance of ``run_ids``: its family, phase and class (``cls``)."""
    TI = airflow_internals.models()["TaskInstance"]

    from avsim.plan.model import ON_DEMAND_SUFFIX

    # "avsim_outcome" sorts before "return_value": the recorded outcome wins over the returned one.
    outcome = _xcom_of(shard_dag_id, TI, (OUTCOME_XCOM, "return_value"), "outcome")
    recorded = _xcom_of(shard_dag_id, TI, (OUTCOME_XCOM,), "outcome")
    cls = case(
        # Airflow's task-instance states (left) to the page's classes (right, from the vocabulary).
        (TI.state == "success", func.coalesce(outcome, literal(Outcome.PASSED.value))),
        (TI.state == "failed", func.coalesce(recorded, literal(FAILED))),
        (TI.state == "upstream_failed", literal(Outcome.UPSTREAM_FAILED.value)),
        (TI.state == "skipped", literal(SKIPPED)),
        (TI.state == "removed", literal(NOT_RUN)),
        (TI.state.in_(ACTIVE), literal(RUNNING)),
        else_=literal(WAITING),
    )
    family = {t: t.split(".", 1)[0] for t in task_ids}
    phase = {t: t.split(".", 1)[1].removesuffix(ON_DEMAND_SUFFIX) for t in task_ids}
    return select(
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
    ).where(TI.dag_id == shard_dag_id, TI.run_id.in_(list(run_ids)), TI.map_index >= 0)


def _no_jit(session: Session) -> None:
    """Turn PostgreSQL's JIT compilation off for the rest of this request's transaction.

    The correlated XCom lookups make the planner's cost estimate of the page's statement large
    enough for JIT (``jit_above_cost``), whose compilation took longer than the statement's whole
    execution (measured: 85 of 147 ms at 10,000 cases; ``docs/performance.md``).
    """
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SET LOCAL jit = off"))


def _flag(condition: Any) -> Any:
    return func.max(case((condition, 1), else_=0))


def _rank_in(column: Any, classes: Iterable[str]) -> Any:
    return column.in_([RANK[c] for c in classes])


def _phase_task_ids(session: Session, shard_dag_id: str, run_ids: Sequence[str]) -> list[str]:
    """The phase tasks (``<family>.<phase>``) the runs have mapped task instances of."""
    TI = airflow_internals.models()["TaskInstance"]
    found = session.scalars(
        select(TI.task_id)
        .where(TI.dag_id == shard_dag_id, TI.run_id.in_(list(run_ids)), TI.map_index >= 0)
        .distinct()
    ).all()
    return sorted(t for t in found if "." in t)


def _per_phase(t: Any) -> Any:
    """One row per phase of a case: the class of its highest-ranked task, its tasks' seconds."""
    rank = case(RANK, value=t.c.cls, else_=literal(0))
    return (
        select(
            t.c.run_id.label("run_id"),
            t.c.family.label("family"),
            t.c.map_index.label("map_index"),
            t.c.phase.label("phase"),
            func.max(rank).label("rank"),
            func.sum(t.c.duration).label("seconds"),
        )
        .group_by(t.c.run_id, t.c.family, t.c.map_index, t.c.phase)
        .cte("per_phase")
    )


def _per_case(per_phase: Any) -> Any:
    """One row per case: its status and class."""
    r = per_phase.c.rank
    ended = func.sum(case((_rank_in(r, _ENDED), 1), else_=0))
    return (
        select(
            per_phase.c.run_id.label("run_id"),
            case(
                (ended == func.count(), literal("done")),
                (or_(_flag(r == RANK[RUNNING]) == 1, ended > 0), literal(RUNNING)),
                else_=literal(WAITING),
            ).label("status"),
            case(
                *(
                    (_flag(_rank_in(r, phases)) == 1, literal(cls))
                    for cls, phases in CASE_RULES
                    if cls != Outcome.PASSED.value
                ),
                else_=literal(Outcome.PASSED.value),
            ).label("cls"),
        )
        .group_by(per_phase.c.run_id, per_phase.c.family, per_phase.c.map_index)
        .subquery("per_case")
    )


def _digest_statement(shard_dag_id: str, t: Any, gpu_pools: Sequence[str]) -> Any:
    """Phases by class, cases by status and class, GPU-seconds by pool, and the failed (or
    scenario-failed) phase tasks to list: one statement, so the runs' task instances are read once.
    PostgreSQL needs the types of the NULL columns of the aggregate rows spelled out."""
    per_phase = _per_phase(t)
    per_case = _per_case(per_phase)
    gpu = case((t.c.pool.in_(list(gpu_pools)), t.c.duration * t.c.pool_slots), else_=0.0)
    none: dict[str, Any] = {
        "task_id": cast(null(), String),
        "map_index": cast(null(), Integer),
        "case_id": cast(null(), String),
        "state": cast(null(), String),
        "try_number": cast(null(), Integer),
        "end_date": cast(null(), t.c.end_date.type),
        "reason": cast(null(), String),
    }

    def aggregate(kind: str, run_id: Any, a: Any, b: Any, n: Any, x: Any) -> list[Any]:
        cols = [literal(kind).label("kind"), run_id.label("run_id"), a.label("a"), b.label("b")]
        return [*cols, n.label("n"), cast(x, Float).label("x"), *(v.label(k) for k, v in none.items())]

    pp, pc = per_phase.c, per_case.c
    return union_all(
        select(
            *aggregate(
                "phase", pp.run_id, pp.phase, cast(pp.rank, String), func.count(), func.sum(pp.seconds)
            )
        ).group_by(pp.run_id, pp.phase, pp.rank),
        select(*aggregate("case", pc.run_id, pc.status, pc.cls, func.count(), literal(0.0))).group_by(
            pc.run_id, pc.status, pc.cls
        ),
        select(*aggregate("gpu", t.c.run_id, t.c.pool, literal(""), func.count(), func.sum(gpu))).group_by(
            t.c.run_id, t.c.pool
        ),
        select(
            literal("failure"),
            t.c.run_id,
            t.c.phase,
            t.c.cls,
            cast(literal(1), Integer),
            cast(literal(0.0), Float),
            t.c.task_id,
            t.c.map_index,
            t.c.case_id,
            t.c.state,
            t.c.try_number,
            t.c.end_date,
            _xcom_of(shard_dag_id, t.c, (OUTCOME_XCOM,), "reason"),
        ).where(or_(t.c.state == "failed", t.c.cls == Outcome.SCENARIO_FAILED.value)),
    )


_FAILURE_FIELDS = ("run_id", "task_id", "map_index", "case_id", "state", "try_number", "end_date", "reason")


def _add_row(d: Digest, row: Any, by_rank: Mapping[int, str]) -> None:
    """One row of :func:`_digest_statement` into its run's digest."""
    if row.kind == "phase":
        d.phases[(row.a, by_rank.get(int(row.b), WAITING))] = (int(row.n), float(row.x or 0))
    elif row.kind == "case":
        d.cases[(row.a, row.b)] = int(row.n)
    elif row.kind == "gpu":
        if row.x:
            d.gpu_seconds[row.a] = float(row.x)
    else:
        d.failures.append({**{k: getattr(row, k) for k in _FAILURE_FIELDS}, "phase": row.a, "cls": row.b})


def _add_history_gpu(
    session: Session,
    digests: dict[str, Digest],
    shard_dag_id: str,
    run_ids: Sequence[str],
    gpu_pools: Sequence[str],
) -> None:
    """GPU-seconds of earlier tries (task instance history), added per pool."""
    TIH = airflow_internals.models()["TaskInstanceHistory"]
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


def compute_digests(
    session: Session, shard_dag_id: str, run_ids: Sequence[str], gpu_pools: Sequence[str]
) -> dict[str, Digest]:
    """The digest of each shard run in ``run_ids``: a few queries for all of them together."""
    digests = {r: Digest() for r in run_ids}
    task_ids = _phase_task_ids(session, shard_dag_id, run_ids) if run_ids else []
    if not task_ids:
        return digests
    _no_jit(session)
    # The CTE is materialized (it is read four times), so each task instance's XComs are probed
    # once; the rank is taken from its class outside it (inside, the planner would inline the
    # class expression, with its XCom lookups, a second time).
    t = _phase_tis(shard_dag_id, run_ids, task_ids).cte("phase_ti")
    by_rank = {v: k for k, v in RANK.items()}
    for row in session.execute(_digest_statement(shard_dag_id, t, gpu_pools)).all():
        _add_row(digests[row.run_id], row, by_rank)
    _add_history_gpu(session, digests, shard_dag_id, run_ids, gpu_pools)
    return digests


def running_gpu_seconds(
    session: Session, shard_dag_id: str, run_ids: Sequence[str], gpu_pools: Sequence[str], now: dt.datetime
) -> tuple[int, float]:
    """(GPUs held, GPU-seconds so far) of the GPU phases running now (rows bounded by the GPUs in use)."""
    TI = airflow_internals.models()["TaskInstance"]

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
