"""The extra link of a phase task instance: its artifacts, in the avsim app.

The phase operators declare it (``operator_extra_links = PHASE_LINKS``) and the plugin registers it,
so it imports nothing of ``avsim.ui``, only the URL paths (``avsim.urls``). Airflow stores its URL as
an XCom keyed by the class name, which therefore must not change. Why one link, and how Airflow
evaluates it: docs/design.md, "The avsim pages".
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
