"""The avsim FastAPI app, mounted at ``/avsim`` on the Airflow API server by the plugin.

Every route requires an authenticated Airflow user (``requires_authenticated``: a JWT in the
``Authorization`` header or the UI's session cookie; a forged or expired token is refused).

Pages (HTML):
  ``/``                                              weekly runs and reports
  ``/dags/{dag_id}/runs/{run_id}``                   the weekly-run page (a shard run's shows its week)
  ``/dags/{dag_id}/runs/{run_id}/tasks/{task_id}/mapped/{map_index}``  -> the case page of that phase
  ``/runs/{run_key}/cases/{case_id}``                one case: phases, attempts, outcomes, artifacts
  ``/runs/{run_key}/report/``                        the weekly report (and its files)
  ``/runs/{run_key}/files/{path}``                   a run's artifact file or folder
API (JSON):
  ``/api/runs/{dag_id}/{run_id}/progress?offset=&limit=``  the weekly-run page's data
  ``/api/runs/{run_key}/cases/{case_id}``            the case page's data
  ``/runs``                                          run keys that have a report
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from sqlalchemy.orm import Session

from avsim import airflow_internals, urls
from avsim.contracts import PREPARE_TASK_ID, RUN_XCOM_KEY
from avsim.ui import files, pages
from avsim.ui.progress import DigestCache
from avsim.ui.timeline import TimelineCache

# Bounds of every value a request names (issue 28): a bad one is a 422 naming the parameter, never
# a database error or a traceback (a NUL character or an integer past int32 would reach PostgreSQL).
_PRINTABLE = r"^[^\x00-\x1f\x7f]+$"
#: Airflow's ids (dag_id, run_id, task_id) are at most 250 characters (ID_LEN).
AirflowId = Annotated[str, PathParam(min_length=1, max_length=250, pattern=_PRINTABLE)]
#: A run key (``<dag_id>__<run_id>``, made path-safe) and a case id; files.check_* refine them.
RunKey = Annotated[str, PathParam(min_length=1, max_length=512, pattern=_PRINTABLE)]
CaseId = Annotated[str, PathParam(min_length=1, max_length=250, pattern=_PRINTABLE)]
#: A file's path inside a run's artifacts (files.resolve refuses what leaves the run).
FilePath = Annotated[str, PathParam(max_length=4096, pattern=r"^[^\x00-\x1f\x7f]*$")]
INT32_MAX = 2**31 - 1
MapIndex = Annotated[int, PathParam(ge=-1, le=INT32_MAX)]


def _authenticated() -> Any:
    return airflow_internals.requires_authenticated()()


def db_session() -> Iterator[Session]:
    """A metadata-database session for one request (the API server's own engine)."""

    with airflow_internals.create_session(scoped=False) as session:
        yield session


DbSession = Annotated[Session, Depends(db_session)]


def _settings() -> Any:
    from avsim.settings import load_settings

    return load_settings()


def _base(request: Request) -> str:
    """The path the API server is served under (``[api] base_url``'s path, usually empty)."""
    root = str(request.scope.get("root_path") or "")
    return root[: -len(urls.MOUNT)] if root.endswith(urls.MOUNT) else root


def _refused(exc: files.RefusedPath) -> HTTPException:
    return HTTPException(400, str(exc))


def create_app() -> FastAPI:
    app = FastAPI(title="avsim", description="avsim weekly runs: progress, cases, artifacts, reports")
    auth = _authenticated()
    app.state.auth_dependency = auth
    guarded = [Depends(auth)]
    cache = DigestCache()
    timelines = TimelineCache()

    def root() -> str:
        return str(_settings().resolved_artifact_root)

    def _week(session: Session, dag_id: str, run_id: str) -> Any:
        from avsim.ui.week import resolve_week

        ref = resolve_week(session, dag_id, run_id, root())
        if ref is None:
            raise HTTPException(404, f"no avsim weekly run {run_id!r} of {dag_id!r} in the metadata database")
        return ref

    @app.get("/runs", dependencies=guarded)
    def list_reports() -> list[str]:
        from avsim.storage import path

        base = path(f"{root().rstrip('/')}/runs")
        if not base.exists():
            return []
        return sorted(p.name for p in base.iterdir() if (p / "report" / "report.json").exists())

    @app.get("/", dependencies=guarded, response_class=HTMLResponse)
    def index(request: Request, session: DbSession) -> str:
        DagRun = airflow_internals.models()["DagRun"]
        XComModel = airflow_internals.models()["XComModel"]
        from sqlalchemy import select

        base = _base(request)
        # Weekly runs are the runs whose prepare task recorded a run descriptor.
        runs = session.execute(
            select(DagRun.dag_id, DagRun.run_id, DagRun.state, DagRun.start_date)
            .join(XComModel, XComModel.dag_run_id == DagRun.id)
            .where(XComModel.task_id == PREPARE_TASK_ID, XComModel.key == RUN_XCOM_KEY)
            .order_by(DagRun.run_after.desc())
            .limit(200)
        ).all()
        rows = [
            {
                "dag_id": d,
                "run_id": r,
                "state": s,
                "start_date": st.isoformat() if st else None,
                "page": urls.progress_page(d, r, base),
            }
            for d, r, s, st in runs
        ]
        reports = [{"run_key": k, "url": urls.report_page(k, base)} for k in list_reports()]
        return pages.index_page(rows, reports)

    @app.get("/api/runs/{dag_id}/{run_id}/progress", dependencies=guarded)
    def progress(
        request: Request,
        session: DbSession,
        dag_id: AirflowId,
        run_id: AirflowId,
        offset: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
    ) -> dict[str, Any]:
        from avsim.ui.week import week_progress

        ref = _week(session, dag_id, run_id)
        s = _settings()
        return week_progress(
            session,
            ref,
            gpu_pools=(s.gpu_spot_pool, s.gpu_on_demand_pool),
            base=_base(request),
            cache=cache,
            offset=offset,
            limit=limit,
            timelines=timelines,
        )

    @app.get("/dags/{dag_id}/runs/{run_id}", dependencies=guarded, response_class=HTMLResponse)
    def progress_page(request: Request, session: DbSession, dag_id: AirflowId, run_id: AirflowId) -> str:
        ref = _week(session, dag_id, run_id)
        return pages.progress_page(
            ref.dag_id, ref.run_id, urls.progress_api(ref.dag_id, ref.run_id, _base(request))
        )

    @app.get("/dags/{dag_id}/runs/{run_id}/report", dependencies=guarded)
    def report_of_run(
        request: Request, session: DbSession, dag_id: AirflowId, run_id: AirflowId
    ) -> RedirectResponse:
        ref = _week(session, dag_id, run_id)
        return RedirectResponse(urls.report_page(ref.run_key, _base(request)), status_code=307)

    @app.get(
        "/dags/{dag_id}/runs/{run_id}/tasks/{task_id}/mapped/{map_index}",
        dependencies=guarded,
        response_model=None,
    )
    def case_of_task(
        request: Request,
        session: DbSession,
        dag_id: AirflowId,
        run_id: AirflowId,
        task_id: AirflowId,
        map_index: MapIndex,
    ) -> RedirectResponse | HTMLResponse:
        TI = airflow_internals.models()["TaskInstance"]
        from sqlalchemy import select

        case_id = session.execute(
            select(TI.__table__.c.rendered_map_index).where(
                TI.dag_id == dag_id, TI.run_id == run_id, TI.task_id == task_id, TI.map_index == map_index
            )
        ).scalar_one_or_none()
        if not case_id or "." not in task_id:
            return HTMLResponse(
                pages.listing_page("not an avsim phase of a case", None, []).replace(
                    "Empty.", "This task instance is not an avsim phase with a case (yet)."
                ),
                status_code=404,
            )
        ref = _week(session, dag_id, run_id)
        return RedirectResponse(urls.case_page(ref.run_key, str(case_id), _base(request)), status_code=307)

    def _case_doc(
        request: Request, session: DbSession, run_key: str, case_id: str
    ) -> tuple[dict[str, Any], Any]:
        from avsim.artifacts import RunLayout
        from avsim.ui.case import case_detail, task_instances, weekly_run_of

        try:
            files.check_run_key(run_key)
            files.check_segment(case_id, "case id")
        except files.RefusedPath as exc:
            raise _refused(exc) from None
        week = weekly_run_of(session, run_key)
        tis = task_instances(session, *week, case_id) if week else []
        doc = case_detail(RunLayout(root(), run_key), case_id, tis, _base(request))
        return doc, week

    @app.get("/api/runs/{run_key}/cases/{case_id}", dependencies=guarded)
    def case_api(request: Request, session: DbSession, run_key: RunKey, case_id: CaseId) -> dict[str, Any]:
        doc, _week_of_case = _case_doc(request, session, run_key, case_id)
        if not doc["phases"]:
            raise HTTPException(404, f"nothing recorded for case {case_id!r} of run {run_key!r}")
        return doc

    @app.get("/runs/{run_key}/cases/{case_id}", dependencies=guarded, response_class=HTMLResponse)
    def case_page(request: Request, session: DbSession, run_key: RunKey, case_id: CaseId) -> HTMLResponse:
        doc, week = _case_doc(request, session, run_key, case_id)
        link = urls.progress_page(week[0], week[1], _base(request)) if week else None
        status = 200 if doc["phases"] else 404
        return HTMLResponse(pages.case_page(doc, link), status_code=status)

    @app.get("/runs/{run_key}/report", dependencies=guarded)
    def report_redirect(request: Request, run_key: RunKey) -> RedirectResponse:
        return RedirectResponse(urls.report_page(run_key, _base(request)), status_code=307)

    @app.get("/runs/{run_key}/report/{name:path}", dependencies=guarded, response_model=None)
    def report_file(request: Request, run_key: RunKey, name: FilePath) -> Response:
        if not name:
            name = "report.html"
        try:
            target = files.resolve(root(), run_key, f"report/{name}")
        except files.RefusedPath as exc:
            raise _refused(exc) from None
        if not target.exists():
            raise HTTPException(
                404, f"no report for run {run_key!r} yet" if name == "report.html" else "not found"
            )
        return _file_response(target, name)

    @app.get("/runs/{run_key}/files/{path:path}", dependencies=guarded, response_model=None)
    def run_file(request: Request, run_key: RunKey, path: FilePath) -> Response:
        try:
            target = files.resolve(root(), run_key, path)
        except files.RefusedPath as exc:
            raise _refused(exc) from None
        if target.is_dir():
            if path and not path.endswith("/"):
                return RedirectResponse(urls.run_file(run_key, path + "/", _base(request)), status_code=307)
            base = _base(request)
            entries = [
                (
                    e.name,
                    urls.run_file(run_key, f"{path}{e.name}" + ("/" if e.is_dir else ""), base),
                    e.size,
                    e.is_dir,
                )
                for e in files.listing(target)
            ]
            parent = path.rstrip("/").rpartition("/")[0]
            up = urls.run_file(run_key, f"{parent}/" if parent else "/", base) if path else None
            return HTMLResponse(pages.listing_page(f"{run_key}/{path}", up, entries), headers=files.INERT)
        if not target.exists():
            raise HTTPException(404, f"no artifact {path!r} in run {run_key!r}")
        return _file_response(target, target.name)

    return app


def _file_response(target: Any, name: str) -> StreamingResponse:
    kind = files.media_type(name)
    headers = {**files.INERT, "Content-Disposition": files.disposition(name, kind)}
    return StreamingResponse(files.stream(target), media_type=kind, headers=headers)
