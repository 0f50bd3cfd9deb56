"""The routes named by a run key: a case of the run, its report, its artifact files, the reports' list.

A run key is served when the metadata database has the weekly run whose prepare recorded it (404
otherwise), to a user who may read that weekly run's DAG (403 otherwise, before any file is read).
"""

from __future__ import annotations

import threading
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from sqlalchemy.orm import Session

from avsim import urls
from avsim.ui import files, pages
from avsim.ui.access import Reader, ReaderDep
from avsim.ui.deps import CaseId, DbSession, FilePath, RunKey, artifact_root, base, caches, refused


class RunOwners:
    """The weekly run (DAG id, run id) of each run key, from the metadata database; a key's weekly run
    never changes, so what was found is kept."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[str, str]] = {}
        self._lock = threading.Lock()

    def all(self, session: Session) -> dict[str, tuple[str, str]]:
        from avsim.ui.case import weekly_runs_by_key

        found = weekly_runs_by_key(session)
        with self._lock:
            self._known.update(found)
            return dict(self._known)

    def of(self, session: Session, run_key: str) -> tuple[str, str] | None:
        with self._lock:
            known = self._known.get(run_key)
        return known if known is not None else self.all(session).get(run_key)

    def require(self, session: Session, reader: Reader, run_key: str) -> tuple[str, str]:
        """The weekly run of ``run_key``: 400 for a key that is no path segment, 404 for one no weekly
        run recorded, 403 for a user who may not read its DAG."""
        try:
            files.check_run_key(run_key)
        except files.RefusedPath as exc:
            raise refused(exc) from None
        week = self.of(session, run_key)
        if week is None:
            raise HTTPException(404, f"no avsim run {run_key!r} in the metadata database")
        reader.require(week[0])
        return week


def readable_reports(session: Session, reader: Reader, owners: RunOwners) -> list[str]:
    """Run keys with a report in the artifact store whose weekly run the user may read."""
    from avsim.storage import path

    found = path(f"{artifact_root().rstrip('/')}/runs")
    if not found.exists():
        return []
    weeks = owners.all(session)
    readable = reader.readable(dag for dag, _run in weeks.values())
    return sorted(
        p.name
        for p in found.iterdir()
        if p.name in weeks and weeks[p.name][0] in readable and (p / "report" / "report.json").exists()
    )


api = APIRouter()


@api.get("/runs")
def list_reports(request: Request, session: DbSession, reader: ReaderDep) -> list[str]:
    return readable_reports(session, reader, caches(request).owners)


def _case_doc(request: Request, session: Session, reader: Reader, run_key: str, case_id: str) -> Any:
    from avsim.artifacts import RunLayout
    from avsim.ui.case import case_detail, task_instances

    owners: RunOwners = caches(request).owners
    week = owners.require(session, reader, run_key)
    try:
        files.check_segment(case_id, "case id")
    except files.RefusedPath as exc:
        raise refused(exc) from None
    tis = task_instances(session, *week, case_id)
    return case_detail(RunLayout(artifact_root(), run_key), case_id, tis, base(request)), week


@api.get("/api/runs/{run_key}/cases/{case_id}")
def case_api(
    request: Request, session: DbSession, reader: ReaderDep, run_key: RunKey, case_id: CaseId
) -> dict[str, Any]:
    doc, _week = _case_doc(request, session, reader, run_key, case_id)
    if not doc["phases"]:
        raise HTTPException(404, f"nothing recorded for case {case_id!r} of run {run_key!r}")
    return dict(doc)


@api.get("/runs/{run_key}/cases/{case_id}", response_class=HTMLResponse)
def case_page(
    request: Request, session: DbSession, reader: ReaderDep, run_key: RunKey, case_id: CaseId
) -> HTMLResponse:
    doc, week = _case_doc(request, session, reader, run_key, case_id)
    link = urls.progress_page(week[0], week[1], base(request))
    return HTMLResponse(pages.case_page(doc, link), status_code=200 if doc["phases"] else 404)


@api.get("/runs/{run_key}/report")
def report_redirect(
    request: Request, session: DbSession, reader: ReaderDep, run_key: RunKey
) -> RedirectResponse:
    caches(request).owners.require(session, reader, run_key)
    return RedirectResponse(urls.report_page(run_key, base(request)), status_code=307)


@api.get("/runs/{run_key}/report/{name:path}", response_model=None)
def report_file(
    request: Request, session: DbSession, reader: ReaderDep, run_key: RunKey, name: FilePath
) -> Response:
    caches(request).owners.require(session, reader, run_key)
    name = name or "report.html"
    target = _resolve(run_key, f"report/{name}")
    if not target.exists():
        raise HTTPException(
            404, f"no report for run {run_key!r} yet" if name == "report.html" else "not found"
        )
    return _file_response(target, name)


@api.get("/runs/{run_key}/files/{path:path}", response_model=None)
def run_file(
    request: Request, session: DbSession, reader: ReaderDep, run_key: RunKey, path: FilePath
) -> Response:
    caches(request).owners.require(session, reader, run_key)
    target = _resolve(run_key, path)
    if target.is_dir():
        return _folder(request, run_key, path)
    if not target.exists():
        raise HTTPException(404, f"no artifact {path!r} in run {run_key!r}")
    return _file_response(target, target.name)


def _resolve(run_key: str, relpath: str) -> Any:
    try:
        return files.resolve(artifact_root(), run_key, relpath)
    except files.RefusedPath as exc:
        raise refused(exc) from None


def _folder(request: Request, run_key: str, path: str) -> Response:
    at = base(request)
    if path and not path.endswith("/"):
        return RedirectResponse(urls.run_file(run_key, path + "/", at), status_code=307)
    entries = [
        (e.name, urls.run_file(run_key, f"{path}{e.name}" + ("/" if e.is_dir else ""), at), e.size, e.is_dir)
        for e in files.listing(_resolve(run_key, path))
    ]
    parent = path.rstrip("/").rpartition("/")[0]
    up = urls.run_file(run_key, f"{parent}/" if parent else "/", at) if path else None
    return HTMLResponse(pages.listing_page(f"{run_key}/{path}", up, entries), headers=files.INERT)


def _file_response(target: Any, name: str) -> StreamingResponse:
    kind = files.media_type(name)
    headers = {**files.INERT, "Content-Disposition": files.disposition(name, kind)}
    return StreamingResponse(files.stream(target), media_type=kind, headers=headers)
