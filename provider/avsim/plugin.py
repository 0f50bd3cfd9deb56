"""The avsim Airflow plugin: what avsim adds to the Airflow API server and UI."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from avsim.deadline.reference import AvsimRunDeadline
from avsim.priority import STRATEGIES
from avsim.ui.app import create_app
from avsim.ui.links import AvsimArtifactsLink, AvsimCaseLink


class AvsimPlugin(AirflowPlugin):
    name = "avsim"
    fastapi_apps = [{"app": create_app(), "url_prefix": "/avsim", "name": "avsim weekly runs"}]
    # The UI replaces {DAG_ID}, {RUN_ID}, {TASK_ID} and {MAP_INDEX} in hrefs of non-nav views.
    external_views = [
        {
            "name": "avsim weekly runs",
            "href": "/avsim/",
            "destination": "nav",
            "category": "browse",
            "url_route": "avsim-reports",
        },
        {
            "name": "avsim progress",
            "href": "/avsim/dags/{DAG_ID}/runs/{RUN_ID}",
            "destination": "dag_run",
            "url_route": "avsim-progress",
        },
        {
            "name": "avsim case",
            "href": "/avsim/dags/{DAG_ID}/runs/{RUN_ID}/tasks/{TASK_ID}/mapped/{MAP_INDEX}",
            "destination": "task_instance",
            "url_route": "avsim-case",
        },
    ]
    # Phase operators declare these (operator_extra_links); registered so the UI knows them.
    operator_extra_links = [AvsimCaseLink(), AvsimArtifactsLink()]
    # Phase tasks use these as weight_rule; DAG serialization refuses an unregistered strategy.
    priority_weight_strategies = list(STRATEGIES)
    # The weekly DAG's Deadline Alert uses it; the scheduler rebuilds it from the serialized DAG.
    deadline_references = [AvsimRunDeadline]
