"""The weekly-run page's data: one JSON document from the metadata database and the artifact store.

:func:`week_progress` answers ``GET /avsim/api/runs/{dag_id}/{run_id}/progress``: cases done,
running and waiting, done cases by class, per-phase progress, GPU-hours spent against planned,
finish estimate against deadline, canary and breaker state, and a page of the failed cases with
links to their task instances, case pages and artifacts.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from avsim import airflow_internals, urls
from avsim.artifacts import RUN_LEVEL_CASE, RunLayout, run_key_for
from avsim.contracts import PREPARE_TASK_ID, RUN_XCOM_KEY, RunDescriptor
from avsim.phases.contract import NOT_RUN, RESULTS, Outcome, values
from avsim.ui import ended, run_docs
from avsim.ui.progress import (
    CASE_CLASSES,
    FAILURE_ORDER,
    RUNNING,
    SKIPPED,
    WAITING,
    Digest,
    DigestCache,
    ShardRun,
    digests_for,
    running_gpu_seconds,
    shard_runs,
)
from avsim.verdict import needs_attention

#: Failed cases listed per page, at most.
MAX_LIMIT = 500
_PHASE_ORDER = ("prepare", "simulate", "perceive", "evaluate", "render", "report")


@dataclass(frozen=True)
class WeekRef:
    """A weekly run: its DAG and run id, its shard DAG, its run key and artifact root, and the run
    descriptor its ``prepare`` pushed (None before it did)."""

    dag_id: str
    run_id: str
    run_key: str
    artifact_root: str
    descriptor: RunDescriptor | None

    @property
    def shard_dag_id(self) -> str:
        return f"{self.dag_id}_shard"

    @property
    def layout(self) -> RunLayout:
        return RunLayout(self.artifact_root, self.run_key)


def parent_of(dag_id: str, run_id: str) -> tuple[str, str]:
    """The weekly run of a shard run (a shard's, the canary's or a triage run); else itself."""
    from avsim.artifacts import parent_run

    return parent_run(dag_id, run_id)


def resolve_week(session: Session, dag_id: str, run_id: str, default_root: str) -> WeekRef | None:
    """The weekly run, or None when the metadata database has no such weekly run."""
    DagRun = airflow_internals.models()["DagRun"]
    XComModel = airflow_internals.models()["XComModel"]

    dag_id, run_id = parent_of(dag_id, run_id)
    found = session.execute(
        select(DagRun.id).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)
    ).scalar_one_or_none()
    if found is None:
        return None
    value = session.execute(
        select(XComModel.value).where(
            XComModel.dag_run_id == found, XComModel.task_id == PREPARE_TASK_ID, XComModel.key == RUN_XCOM_KEY
        )
    ).scalar_one_or_none()
    desc = run_docs.run_descriptor(value, f"{dag_id} {run_id}")
    if not value:  # prepare has not pushed one (yet): a weekly run if its DAG has a shard DAG
        DagModel = airflow_internals.models()["DagModel"]

        shard_dag = session.execute(
            select(DagModel.dag_id).where(DagModel.dag_id == f"{dag_id}_shard")
        ).scalar_one_or_none()
        if shard_dag is None:
            return None  # not a weekly run: its DAG has no shard DAG and its prepare recorded nothing
    return WeekRef(
        dag_id=dag_id,
        run_id=run_id,
        run_key=desc.run_key if desc else run_key_for(dag_id, run_id),
        artifact_root=desc.artifact_root if desc else default_root,
        descriptor=desc,
    )


def _run_row(session: Session, ref: WeekRef) -> dict[str, Any]:
    DagRun = airflow_internals.models()["DagRun"]
    TI = airflow_internals.models()["TaskInstance"]

    state, start, end = session.execute(
        select(DagRun.state, DagRun.start_date, DagRun.end_date).where(
            DagRun.dag_id == ref.dag_id, DagRun.run_id == ref.run_id
        )
    ).one()
    tasks: dict[str, Counter[str]] = {}
    for task_id, ti_state, n in session.execute(
        select(TI.task_id, TI.state, func.count())
        .where(TI.dag_id == ref.dag_id, TI.run_id == ref.run_id)
        .group_by(TI.task_id, TI.state)
    ).all():
        tasks.setdefault(str(task_id), Counter())[str(ti_state or "none")] += int(n)
    return {
        "state": state,
        "start_date": _iso(start),
        "end_date": _iso(end),
        "tasks": {k: dict(v) for k, v in sorted(tasks.items())},
    }


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _phase_order(head_graphs: Mapping[str, Any] | None, names: Iterable[str]) -> list[str]:
    order: list[str] = []
    for graph in (head_graphs or {}).values():
        for phase in (graph.get("phases") or {}) if isinstance(graph, Mapping) else {}:
            if phase not in order:
                order.append(phase)
    rank = {p: i for i, p in enumerate(order or _PHASE_ORDER)}
    return sorted(set(names), key=lambda p: (rank.get(p, len(rank)), p))


#: A phase's classes that spent no time of their own: not over, or never ran.
_UNTIMED = (RUNNING, WAITING, Outcome.UPSTREAM_FAILED.value, NOT_RUN, SKIPPED)


def _phases(digests: Iterable[Digest], head_graphs: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    per: dict[str, dict[str, Any]] = {}
    for d in digests:
        for (phase, cls), (n, seconds) in d.phases.items():
            p = per.setdefault(phase, {"total": 0, "by_class": Counter(), "seconds": 0.0, "timed": 0})
            p["total"] += n
            p["by_class"][cls] += n
            if cls not in _UNTIMED:
                p["seconds"] += seconds
                p["timed"] += n
    out = []
    for phase in _phase_order(head_graphs, per):
        p = per[phase]
        by_class: Counter[str] = p["by_class"]
        running, waiting = by_class.get(RUNNING, 0), by_class.get(WAITING, 0)
        out.append(
            {
                "phase": phase,
                "total": p["total"],
                "done": p["total"] - running - waiting,
                "running": running,
                "waiting": waiting,
                "by_class": {k: v for k, v in sorted(by_class.items()) if k not in (RUNNING, WAITING)},
                "mean_seconds": round(p["seconds"] / p["timed"], 1) if p["timed"] else None,
            }
        )
    return out


def _cases(digests: Iterable[Digest], planned: int | None, stopped_because: str = "") -> dict[str, Any]:
    """Cases by status and done cases by class.

    ``attention`` counts the done cases whose class needs an engineer (:func:`avsim.verdict.needs_attention`):
    failed scenarios are results, in ``results`` with the passed cases, never in the red count.
    ``stopped_because``: the week has ended with cases not started (:func:`avsim.ui.ended.stop_reason`);
    they are ``not_started``, not ``waiting``.
    """
    status: Counter[str] = Counter()
    by_class: Counter[str] = Counter()
    for d in digests:
        for (st, cls), n in d.cases.items():
            status[st] += n
            if st == "done":
                by_class[cls] += n
    known = sum(status.values())
    waiting = status["waiting"] + max(0, (planned or 0) - known)
    ordered = {c: by_class[c] for c in CASE_CLASSES if by_class.get(c)}
    results = values(RESULTS)
    return {
        "planned": planned,
        "done": status["done"],
        "running": status["running"],
        "waiting": 0 if stopped_because else waiting,
        "not_started": waiting if stopped_because else 0,
        "stopped_because": stopped_because if waiting else "",
        "attention": sum(n for c, n in by_class.items() if needs_attention(c)),
        "results": {c: by_class.get(c, 0) for c in results},
        "by_class": ordered,
    }


def _shards(runs: Sequence[ShardRun], planned: int | None, ref: WeekRef, base: str) -> dict[str, Any]:
    shards = [r for r in runs if r.kind == "shard"]
    states = Counter(
        "done" if r.state in ("success", "failed") else "running" if r.state == "running" else "queued"
        for r in shards
    )
    total = planned if isinstance(planned, int) else None
    return {
        "planned": total,
        "done": states["done"],
        "running": states["running"],
        "queued": states["queued"],
        "not_started": max(0, total - len(shards)) if total is not None else None,
        "active": [
            {
                "run_id": r.run_id,
                "shard": r.index,
                "state": r.state,
                "url": urls.airflow_run(ref.shard_dag_id, r.run_id, base),
            }
            for r in shards
            if not r.finished
        ],
    }


def _gpu(digests: Iterable[Digest], running: tuple[int, float], plan: Mapping[str, Any]) -> dict[str, Any]:
    by_pool: dict[str, float] = {}
    for d in digests:
        for pool, seconds in d.gpu_seconds.items():
            by_pool[pool] = by_pool.get(pool, 0.0) + seconds
    held, in_flight = running
    spent = sum(by_pool.values()) + in_flight
    planned = plan.get("gpu_seconds") if plan.get("available") else None
    planned_s = float(planned) if isinstance(planned, int | float) else None
    return {
        "spent_hours": round(spent / 3600, 2),
        "ended_hours_by_pool": {k: round(v / 3600, 2) for k, v in sorted(by_pool.items())},
        "running_hours": round(in_flight / 3600, 2),
        "gpus_in_use": held,
        "planned_hours": round(planned_s / 3600, 2) if planned_s is not None else None,
        "spent_of_planned": round(spent / planned_s, 4) if planned_s else None,
    }


def _ledger_outcomes(layout: RunLayout, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Any]:
    """Committed outcome records of a few (case, phase) pairs, read in parallel on object stores."""
    from avsim.ledger.store import Ledger

    if not keys:
        return {}
    ledger = Ledger(layout)

    def read(key: tuple[str, str]) -> Any:
        try:
            return ledger.outcome(*key)
        except Exception:  # an unreadable record: listed without its reason
            return None

    if ledger.is_local:
        found = [read(k) for k in keys]
    else:
        with ThreadPoolExecutor(max_workers=min(16, len(keys)), thread_name_prefix="avsim-ui") as ex:
            found = list(ex.map(read, keys))
    return dict(zip(keys, found, strict=True))


def _failed(
    digests: Mapping[str, Digest], ref: WeekRef, base: str, offset: int, limit: int
) -> dict[str, Any]:
    rank = {c: i for i, c in enumerate(FAILURE_ORDER)}
    rows = [f for d in digests.values() for f in d.failures]
    never = dt.datetime.min.replace(tzinfo=dt.UTC)
    rows.sort(key=lambda f: f["end_date"] or never, reverse=True)
    rows.sort(key=lambda f: rank.get(f["cls"], len(rank)))
    page = rows[offset : offset + limit]
    need = [(str(f["case_id"]), str(f["phase"])) for f in page if not f["reason"] or f["cls"] == "failed"]
    records = _ledger_outcomes(ref.layout, need)
    items = []
    for f in page:
        family, phase = str(f["task_id"]).partition(".")[0], str(f["phase"])
        case_id = str(f["case_id"]) if f["case_id"] is not None else f"map index {f['map_index']}"
        rec = records.get((case_id, phase))
        cls = f["cls"]
        if cls == "failed" and rec is not None:
            cls = rec.outcome.value
        items.append(
            {
                "case_id": case_id,
                "graph": family,
                "phase": phase,
                "task_id": f["task_id"],
                "class": cls,
                "state": f["state"],
                "try_number": f["try_number"],
                "ended_at": _iso(f["end_date"]),
                "reason": f["reason"] or (rec.reason if rec is not None else ""),
                "links": {
                    "task_instance": urls.airflow_task_instance(
                        ref.shard_dag_id, f["run_id"], f["task_id"], f["map_index"], base
                    ),
                    "case": urls.case_page(ref.run_key, case_id, base),
                    "artifacts": urls.phase_artifacts(ref.run_key, case_id, phase, base),
                },
            }
        )
    by_class = Counter(f["cls"] for f in rows)
    return {
        "total": len(rows),
        "by_class": dict(by_class),
        "attention": sum(n for c, n in by_class.items() if needs_attention(c)),
        "offset": offset,
        "limit": limit,
        "items": items,
    }


def _timeline(
    layout: RunLayout, cache: Any, deadline: Any, planned: int | None, now: dt.datetime, ended_at: Any
) -> dict[str, Any]:
    """Progress over time from the ledger (:mod:`avsim.ui.timeline`); not available when unreadable."""
    from avsim.ui.timeline import TimelineCache, timeline_doc

    try:
        found = (cache or TimelineCache(ttl=0)).get(layout, deadline, planned)
    except Exception as exc:  # the ledger unreadable now: the rest of the page still shows
        return {"available": False, "message": f"progress over time not available: {exc}"}
    return {"available": not found.empty, **timeline_doc(found, now=now, ended_at=ended_at)}


def _run_phases(
    layout: RunLayout,
    head_doc: Mapping[str, Any],
    tasks: Mapping[str, Mapping[str, int]],
    cases: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """The run-level phases (the weekly summary): task state and committed outcome (:func:`ended.run_phase_view`)."""
    names = list(head_doc.get("run_phases") or {}) if isinstance(head_doc.get("run_phases"), Mapping) else []
    if not names:
        return []
    records = _ledger_outcomes(layout, [(RUN_LEVEL_CASE, n) for n in names])
    return [
        ended.run_phase_view(
            name,
            tasks.get(f"run_phases.{name}") or {},
            records.get((RUN_LEVEL_CASE, name)),
            cases.get("stopped_because") or "",
            int(cases.get("not_started") or 0),
        )
        for name in names
    ]


def _canary(
    ref: WeekRef, head_doc: Any, plan: Mapping[str, Any], runs: Sequence[ShardRun], base: str
) -> dict[str, Any]:
    """The canary's part of the page: its gate's decision and its shard run."""
    canary = run_docs.canary(ref.layout, head_doc if isinstance(head_doc, Mapping) else None, plan)
    run = next((r for r in runs if r.kind == "canary"), None)
    canary["run"] = (
        {
            "run_id": run.run_id,
            "state": run.state,
            "url": urls.airflow_run(ref.shard_dag_id, run.run_id, base),
        }
        if run
        else None
    )
    return canary


def _planned_cases(head: Mapping[str, Any], plan: Mapping[str, Any], desc: Any) -> int | None:
    """The week's cases: from its head, else its plan, else its run descriptor."""
    found = (head.get("case_count"), plan.get("cases"), desc.case_count if desc else None)
    return next((int(v) for v in found if isinstance(v, int)), None)


def _run_ids(ref: WeekRef, base: str) -> dict[str, Any]:
    url = urls.airflow_run(ref.dag_id, ref.run_id, base)
    return {"dag_id": ref.dag_id, "run_id": ref.run_id, "run_key": ref.run_key, "url": url}


def _links(ref: WeekRef, base: str) -> dict[str, str]:
    return {
        "report": urls.report_page(ref.run_key, base),
        "cases_csv": urls.run_file(ref.run_key, "report/cases.csv", base),
        "artifacts": urls.run_file(ref.run_key, "/", base),
    }


def _deadline(layout: RunLayout, due: Any, row: Mapping[str, Any], over: bool) -> dict[str, Any]:
    deadline = run_docs.deadline(layout, due)
    return ended.ended_deadline(deadline, row["state"], row["end_date"]) if over else deadline


def week_progress(
    session: Session,
    ref: WeekRef,
    *,
    gpu_pools: Sequence[str],
    base: str = "",
    cache: DigestCache | None = None,
    offset: int = 0,
    limit: int = 50,
    now: dt.datetime | None = None,
    timelines: Any = None,
) -> dict[str, Any]:
    """The page's document for the weekly run ``ref`` (see the module doc)."""
    now = now or dt.datetime.now(dt.UTC)
    layout = ref.layout
    desc = ref.descriptor
    head = run_docs.head(layout)
    plan = run_docs.plan(layout)
    head_doc = run_docs.read_doc(layout.head_uri) or {}
    runs = shard_runs(session, ref.shard_dag_id, ref.run_id)
    digests = digests_for(session, ref.shard_dag_id, runs, gpu_pools, cache)
    active = [r.run_id for r in runs if not r.finished]
    running = running_gpu_seconds(session, ref.shard_dag_id, active, gpu_pools, now)
    planned_cases = _planned_cases(head, plan, desc)
    canary = _canary(ref, head_doc, plan, runs, base)
    shard_total = desc.shard_count if desc else None
    row = _run_row(session, ref)
    breaker = run_docs.breaker(ref.artifact_root, head.get("image"), canary.get("digest"))
    over = ended.run_ended(row["state"])
    ended_at = run_docs.parse(row["end_date"]) if over else None
    cases = _cases(digests.values(), planned_cases, ended.stop_reason(row["state"], canary, breaker))
    due = head.get("deadline") or plan.get("deadline")
    deadline = _deadline(layout, due, row, over)
    return {
        "timeline": _timeline(
            layout, timelines, due, planned_cases, now, ended_at or (now if over else None)
        ),
        "schema": "avsim/progress/v1",
        "generated_at": now.isoformat(),
        "run": {**row, **_run_ids(ref, base)},
        "manifest": {**head, "manifest_sha256": desc.manifest_sha256 if desc else None},
        "cases": cases,
        "run_phases": _run_phases(
            layout, head_doc if isinstance(head_doc, Mapping) else {}, row["tasks"], cases
        ),
        "phases": _phases(
            digests.values(), head_doc.get("graphs") if isinstance(head_doc, Mapping) else None
        ),
        "shards": _shards(runs, shard_total if isinstance(shard_total, int) else None, ref, base),
        "gpu": _gpu(digests.values(), running, plan),
        "plan": plan,
        "deadline": deadline,
        "canary": canary,
        "breaker": breaker,
        "repairs": run_docs.repairs(layout),
        "triage": run_docs.triage(layout, base),
        "failed": _failed(digests, ref, base, max(0, offset), max(1, min(limit, MAX_LIMIT))),
        "links": _links(ref, base),
    }
