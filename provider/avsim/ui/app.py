"""The avsim FastAPI app, mounted at ``/avsim`` on the Airflow API server by the plugin.

Every route authenticates the request as Airflow's API does (a JWT in the ``Authorization`` header
or the UI's session cookie; a missing, forged or expired one is refused) and serves a run only to a
user whom Airflow's auth manager lets read that run's DAG's runs (:mod:`avsim.ui.access`; 403).

Pages (HTML):
  ``/``                                              the weekly runs and reports the user may read
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
