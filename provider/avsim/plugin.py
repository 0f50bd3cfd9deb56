"""The avsim Airflow plugin: what avsim adds to the Airflow API server and UI."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from avsim.priority import STRATEGIES
from avsim.ui.reports import create_app


class AvsimPlugin(AirflowPlugin):
    name = "avsim"
    fastapi_apps = [{"app": create_app(), "url_prefix": "/avsim", "name": "avsim reports"}]
    external_views = [
        {
            "name": "avsim reports",
            "href": "/avsim/",
            "destination": "nav",
            "category": "browse",
            "url_route": "avsim-reports",
        }
    ]
    # Phase tasks use these as weight_rule; DAG serialization refuses an unregistered strategy.
    priority_weight_strategies = list(STRATEGIES)
