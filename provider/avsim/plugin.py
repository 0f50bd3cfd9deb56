"""The avsim Airflow plugin: what avsim adds to the Airflow API server and UI.

Installed with the package, registered once: the provider info declares it, which Airflow reads only
with ``[core] lazy_discover_providers = False``; the ``airflow.plugins`` entry point names
:data:`ENTRY_POINT`, which is the plugin otherwise (the default) and None (skipped) then.
Importing this module stays cheap: every Airflow process loads plugins, and the FastAPI app (about a
CPU-second of the API server's imports) is built when the API server first asks for it.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

from avsim.dagbuild import preload
from avsim.deadline.reference import AvsimRunDeadline
from avsim.links import AvsimArtifactsLink
from avsim.priority import STRATEGIES


class _FastAPIApps:
    """``fastapi_apps``, built on first access (the API server's) and kept."""

    def __init__(self) -> None:
        self._apps: list[dict[str, Any]] | None = None

    def __get__(self, instance: object, owner: type | None = None) -> list[dict[str, Any]]:
        if self._apps is None:
            from avsim.ui.app import create_app

            self._apps = [{"app": create_app(), "url_prefix": "/avsim", "name": "avsim weekly runs"}]
        return self._apps


class AvsimPlugin(AirflowPlugin):
    name = "avsim"
    fastapi_apps = _FastAPIApps()
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
    # Phase operators declare it (operator_extra_links); registered so the UI knows it. A phase's case
    # page is the "avsim case" tab above.
    operator_extra_links = [AvsimArtifactsLink()]
    # Phase tasks use these as weight_rule; DAG serialization refuses an unregistered strategy.
    priority_weight_strategies = list(STRATEGIES)
    # The weekly DAG's Deadline Alert uses it; the scheduler rebuilds it from the serialized DAG.
    deadline_references = [AvsimRunDeadline]
    # The scheduler imports the phase tasks' modules once, before it forks its LocalExecutor workers.
    listeners = [preload]


def __getattr__(name: str) -> Any:
    """``ENTRY_POINT``: the plugin class, or None when the provider info registers it. Airflow's plugin
    manager loads entry points always, the provider info's plugins only when it discovers providers
    eagerly, and refuses a second plugin of one name with an import error."""
    if name == "ENTRY_POINT":
        from airflow import settings

        return AvsimPlugin if settings.LAZY_LOAD_PROVIDERS else None
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
