"""The routes named by a DAG run: the weekly-run page and its data, the two tabs of the Airflow UI
(a run's and a task instance's), the weekly report of a run, and the list of weekly runs.

Each asks, before it reads the run, whether the user may read the runs of the DAG it names (403),
then whether that DAG is avsim's (:mod:`avsim.ui.scope`): the tabs show on every DAG of a
deployment, and on another DAG's run a page says so in a sentence.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from sqlalchemy import select
from sqlalchemy.orm import Session

from avsim import airflow_internals, urls
from avsim.contracts import PREPARE_TASK_ID, RUN_XCOM_KEY
from avsim.ui import pages
from avsim.ui.access import Reader, ReaderDep
from avsim.ui.deps import INT32_MAX, AirflowId, DbSession, MapIndex, artifact_root, base, caches, settings
from avsim.ui.routes_files import readable_reports
from avsim.ui.scope import is_avsim_dag


class NotShown(Exception):
    """The run asked for is not a weekly run of avsim's: the sentence that says why."""


def find_week(session: Session, reader: Reader, dag_id: str, run_id: str) -> Any:
    """The weekly run shown for ``dag_id``/``run_id`` (a shard run shows its week), once the user may
    read both DAGs' runs; :class:`NotShown` when there is none."""
    from avsim.ui.week import resolve_week

    reader.require(dag_id)
    if not is_avsim_dag(session, dag_id):
        raise NotShown(f"The run {run_id} of {dag_id} is not an avsim run: {dag_id} is no DAG of avsim.")
    ref = resolve_week(session, dag_id, run_id, artifact_root())
    if ref is None:
        raise NotShown(f"The run {run_id} of {dag_id} is not an avsim weekly run in the metadata database.")
    reader.require(ref.dag_id)
    return ref


def _notice(exc: NotShown) -> HTMLResponse:
    return HTMLResponse(pages.notice_page("not an avsim run", str(exc)), status_code=404)


def _weekly_runs(session: Session, reader: Reader) -> list[Any]:
    """The weekly runs (runs whose prepare recorded a run descriptor) of the DAGs the user may read."""
    DagRun = airflow_internals.models()["DagRun"]
    XComModel = airflow_internals.models()["XComModel"]

    weekly = (
        select(DagRun.dag_id, DagRun.run_id, DagRun.state, DagRun.start_date)
        .join(XComModel, XComModel.dag_run_id == DagRun.id)
        .where(XComModel.task_id == PREPARE_TASK_ID, XComModel.key == RUN_XCOM_KEY)
    )
    dags = reader.readable(session.scalars(select(weekly.subquery().c.dag_id).distinct()))
    query = weekly.where(DagRun.dag_id.in_(dags)).order_by(DagRun.run_after.desc()).limit(200)
    return list(session.execute(query).all())


api = APIRouter()


@api.get("/", response_class=HTMLResponse)
def index(request: Request, session: DbSession, reader: ReaderDep) -> str:
    at = base(request)
    rows = [
        {
            "dag_id": d,
            "run_id": r,
            "state": s,
            "start_date": st.isoformat() if st else None,
            "page": urls.progress_page(d, r, at),
        }
        for d, r, s, st in _weekly_runs(session, reader)
    ]
    keys = readable_reports(session, reader, caches(request).owners)
    return pages.index_page(rows, [{"run_key": k, "url": urls.report_page(k, at)} for k in keys])


@api.get("/api/runs/{dag_id}/{run_id}/progress")
def progress(
    request: Request,
    session: DbSession,
    reader: ReaderDep,
    dag_id: AirflowId,
    run_id: AirflowId,
    offset: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> dict[str, Any]:
    from avsim.ui.week import week_progress

    try:
        ref = find_week(session, reader, dag_id, run_id)
    except NotShown as exc:
        raise HTTPException(404, str(exc)) from None
    s, kept = settings(), caches(request)
    return week_progress(
        session,
        ref,
        gpu_pools=(s.gpu_spot_pool, s.gpu_on_demand_pool),
        base=base(request),
        cache=kept.digests,
        offset=offset,
        limit=limit,
        timelines=kept.timelines,
    )


@api.get("/dags/{dag_id}/runs/{run_id}", response_class=HTMLResponse)
def progress_page(
    request: Request, session: DbSession, reader: ReaderDep, dag_id: AirflowId, run_id: AirflowId
) -> HTMLResponse:
    try:
        ref = find_week(session, reader, dag_id, run_id)
    except NotShown as exc:
        return _notice(exc)
    api_url = urls.progress_api(ref.dag_id, ref.run_id, base(request))
    return HTMLResponse(pages.progress_page(ref.dag_id, ref.run_id, api_url))


@api.get("/dags/{dag_id}/runs/{run_id}/report", response_model=None)
def report_of_run(
    request: Request, session: DbSession, reader: ReaderDep, dag_id: AirflowId, run_id: AirflowId
) -> RedirectResponse | HTMLResponse:
    try:
        ref = find_week(session, reader, dag_id, run_id)
    except NotShown as exc:
        return _notice(exc)
    return RedirectResponse(urls.report_page(ref.run_key, base(request)), status_code=307)


@api.get("/dags/{dag_id}/runs/{run_id}/tasks/{task_id}/mapped/{map_index}", response_model=None)
def case_of_task(
    request: Request,
    session: DbSession,
    reader: ReaderDep,
    dag_id: AirflowId,
    run_id: AirflowId,
    task_id: AirflowId,
    map_index: MapIndex,
) -> RedirectResponse | HTMLResponse:
    try:
        ref = find_week(session, reader, dag_id, run_id)
    except NotShown as exc:
        return _notice(exc)
    case_id = _case_of(session, dag_id, run_id, task_id, map_index)
    if case_id is None:
        return _notice(NotShown(f"The task {task_id} of {run_id} is not an avsim phase with a case (yet)."))
    return RedirectResponse(urls.case_page(ref.run_key, case_id, base(request)), status_code=307)


def _case_of(session: Session, dag_id: str, run_id: str, task_id: str, map_index: int) -> str | None:
    """The case id a phase's task instance rendered as its map index, if it is a phase of a case."""
    TI = airflow_internals.models()["TaskInstance"]

    if "." not in task_id:
        return None
    case_id = session.execute(
        select(TI.__table__.c.rendered_map_index).where(
            TI.dag_id == dag_id, TI.run_id == run_id, TI.task_id == task_id, TI.map_index == map_index
        )
    ).scalar_one_or_none()
    return str(case_id) if case_id else None
