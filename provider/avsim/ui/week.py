"""The weekly-run page's data: one JSON document from the metadata database and the artifact store.

:func:`week_progress` answers ``GET /avsim/api/runs/{dag_id}/{run_id}/progress``: cases done,
running and waiting, done cases by class, per-phase progress, GPU-hours spent against planned,
finish estimate against deadline, canary and breaker state, and a page of the failed cases with
links to their task instances, case pages and artifacts.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from avsim import airflow_internals, urls
from avsim.artifacts import RunLayout, parent_run, run_key_for
from avsim.contracts import PREPARE_TASK_ID, RUN_XCOM_KEY, RunDescriptor
from avsim.ui import ended, run_docs
from avsim.ui import week_parts as parts
from avsim.ui.progress import (
    DigestCache,
    ShardRun,
    digests_for,
    running_gpu_seconds,
    shard_runs,
)

#: Failed cases listed per page, at most.
MAX_LIMIT = 500


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


def resolve_week(session: Session, dag_id: str, run_id: str, default_root: str) -> WeekRef | None:
    """The weekly run, or None when the metadata database has no such weekly run."""
    DagRun = airflow_internals.models()["DagRun"]
    XComModel = airflow_internals.models()["XComModel"]

    dag_id, run_id = parent_run(dag_id, run_id)
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
        "start_date": parts.iso(start),
        "end_date": parts.iso(end),
        "tasks": {k: dict(v) for k, v in sorted(tasks.items())},
    }


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
    cases = parts.cases_doc(digests.values(), planned_cases, ended.stop_reason(row["state"], canary, breaker))
    due = head.get("deadline") or plan.get("deadline")
    deadline = _deadline(layout, due, row, over)
    return {
        "timeline": parts.timeline_doc(
            layout, timelines, due, planned_cases, now, ended_at or (now if over else None)
        ),
        "schema": "avsim/progress/v1",
        "generated_at": now.isoformat(),
        "run": {**row, **_run_ids(ref, base)},
        "manifest": {**head, "manifest_sha256": desc.manifest_sha256 if desc else None},
        "cases": cases,
        "run_phases": parts.run_phases_doc(
            layout, head_doc if isinstance(head_doc, Mapping) else {}, row["tasks"], cases
        ),
        "phases": parts.phases_doc(
            digests.values(), head_doc.get("graphs") if isinstance(head_doc, Mapping) else None
        ),
        "shards": parts.shards_doc(runs, shard_total if isinstance(shard_total, int) else None, ref, base),
        "gpu": parts.gpu_doc(digests.values(), running, plan),
        "plan": plan,
        "deadline": deadline,
        "canary": canary,
        "breaker": breaker,
        "repairs": run_docs.repairs(layout),
        "triage": run_docs.triage(layout, base),
        "failed": parts.failed_doc(digests, ref, base, max(0, offset), max(1, min(limit, MAX_LIMIT))),
        "links": _links(ref, base),
    }
