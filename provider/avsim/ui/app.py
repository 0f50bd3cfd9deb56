"""The avsim FastAPI app, mounted at ``/avsim`` on the Airflow API server by the plugin.

Every route authenticates the request as Airflow's API does (a JWT or the UI's session cookie) and
serves a run only to a user whom Airflow's auth manager lets read that run's DAG's runs
(:mod:`avsim.ui.access`). Pages: the runs, a weekly run, a case, the report and a run's files; JSON: the
weekly-run page's progress and a case page's data. The routes are declared in :func:`create_app`.
"""

from __future__ import annotations

from fastapi import FastAPI

from avsim.ui import routes_files, routes_runs
from avsim.ui.access import request_reader
from avsim.ui.deps import Caches, db_session
from avsim.ui.progress import DigestCache
from avsim.ui.timeline import TimelineCache

__all__ = ["create_app", "db_session"]


def create_app() -> FastAPI:
    app = FastAPI(title="avsim", description="avsim weekly runs: progress, cases, artifacts, reports")
    app.state.avsim = Caches(
        digests=DigestCache(), timelines=TimelineCache(), owners=routes_files.RunOwners()
    )
    # Every route depends on it; tests replace it (app.dependency_overrides) with a Reader of their own.
    app.state.reader_dependency = request_reader
    app.include_router(routes_runs.api)
    app.include_router(routes_files.api)
    return app
