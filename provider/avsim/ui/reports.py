"""A FastAPI app, mounted on the Airflow API server by the plugin: weekly reports behind Airflow's login."""

from __future__ import annotations

import html
from typing import Any

from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import HTMLResponse

from avsim.artifacts import RunLayout
from avsim.dagbuild.tasks import run_key_for


def _authenticated() -> Any:
    from airflow.api_fastapi.core_api.security import requires_authenticated

    return requires_authenticated()


def create_app() -> FastAPI:
    app = FastAPI(title="avsim", description="avsim weekly-run reports")
    auth = [Depends(_authenticated())]

    def root() -> str:
        from avsim.settings import load_settings

        return load_settings().resolved_artifact_root

    @app.get("/runs", dependencies=auth)
    def list_runs() -> list[str]:
        from avsim.storage import path

        base = path(f"{root().rstrip('/')}/runs")
        if not base.exists():
            return []
        return sorted(p.name for p in base.iterdir() if (p / "report" / "report.json").exists())

    @app.get("/", dependencies=auth, response_class=HTMLResponse)
    def index() -> str:
        items = "".join(
            f'<li><a href="runs/{html.escape(k)}/report">{html.escape(k)}</a></li>' for k in list_runs()
        )
        return f"<!doctype html><title>avsim reports</title><h1>avsim weekly reports</h1><ul>{items}</ul>"

    @app.get("/runs/{run_key}/report", dependencies=auth, response_class=HTMLResponse)
    def report(run_key: str) -> str:
        from avsim.storage import path

        page = path(f"{RunLayout(root(), run_key).report_dir}/report.html")
        if not page.exists():
            raise HTTPException(404, f"no report for run {run_key!r} yet")
        return str(page.read_text())

    @app.get("/dags/{dag_id}/runs/{run_id}/report", dependencies=auth, response_class=HTMLResponse)
    def report_of_run(dag_id: str, run_id: str) -> str:
        return report(run_key_for(dag_id, run_id))

    return app
