"""The extra link of a phase task instance: its artifacts, in the avsim app.

The phase operators declare it (``operator_extra_links = PHASE_LINKS``) and the plugin registers it,
so it sits below both and below the pages: it imports nothing of ``avsim.ui`` (docs/design.md,
"Layers"), only the URL paths (``avsim.urls``) the pages use too.

Its case's page is the plugin's *avsim case* tab of every task instance (``avsim.plugin``): a tab
costs nothing per task, while Airflow stores each extra link as an XCom when a try ends (one
execution-API call and one XCom row per link and phase execution, 50,000 a week), so a link that
opened the same page as the tab was dropped.

Airflow 3 evaluates ``get_link`` in the worker when the task instance ends (whatever its state)
and stores the URL as an XCom (``_link_<class name>``); the UI reads that XCom. A serialized DAG
keeps only the link's name and that XCom key, never this module's path, so the class name is what
must not change. A link is computed from the operator as it ran: its rendered ``run``
(``run_key``) and ``case`` (``case_id``) and its ``phase``. No other XCom is needed.

The URL is a path on the API server that serves the UI (under ``[api] base_url``'s path, if any),
so it opens in the same deployment whatever its host name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

from airflow.sdk import BaseOperatorLink

from avsim import urls
from avsim.contracts import run_document


def _base_path() -> str:
    from avsim.settings import airflow_config

    try:
        return urlparse(airflow_config("api", "base_url", "")).path.rstrip("/")
    except Exception:  # no config in this process: links relative to the origin
        return ""


def _identity(operator: Any) -> tuple[str, str, str] | None:
    run = run_document(getattr(operator, "run", None))
    case = getattr(operator, "case", None)
    phase = getattr(operator, "phase", None)
    if not (run is not None and isinstance(case, Mapping) and phase):
        return None
    key, case_id = run.get("run_key"), case.get("case_id")
    if not key or case_id is None:
        return None
    return str(key), str(case_id), str(phase)


class AvsimArtifactsLink(BaseOperatorLink):
    """The artifacts of every attempt of this phase of this case."""

    name = "avsim artifacts"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        found = _identity(operator)
        return urls.phase_artifacts(*found, base=_base_path()) if found else ""


#: What a phase operator declares: ``operator_extra_links = PHASE_LINKS``.
PHASE_LINKS = (AvsimArtifactsLink(),)
