"""Where a run's triage document lives: ``runs/<run key>/report/triage.json``, beside the report.

Written whole by the triage task (atomically on ``file://``), read by the report, the page and
``avsim triage``.
"""

from __future__ import annotations

from pydantic import ValidationError

from avsim.artifacts import RunLayout
from avsim.errors import AvsimError
from avsim.storage import exists, read_json, write_json
from avsim.triage.model import TriageReport

TRIAGE_FILE = "triage.json"


def triage_uri(layout: RunLayout) -> str:
    return f"{layout.report_dir}/{TRIAGE_FILE}"


def write_triage(layout: RunLayout, report: TriageReport) -> str:
    """Write the run's triage document; returns its URI."""
    uri = triage_uri(layout)
    write_json(uri, report.model_dump(mode="json", by_alias=True))
    return uri


def read_triage(layout: RunLayout) -> TriageReport:
    """The run's triage document; an :class:`AvsimError` saying what to do when it is missing or damaged."""
    uri = triage_uri(layout)
    if not exists(uri):
        raise AvsimError(
            f"run {layout.run_key!r} has no triage document ({uri}): its weekly run writes it once the "
            "week's cases have run once and the newly failing ones were rerun"
        )
    try:
        return TriageReport.model_validate(read_json(uri))
    except ValueError as exc:  # not JSON, or not a triage document
        first = exc.errors()[0] if isinstance(exc, ValidationError) else None
        where = ".".join(str(p) for p in first["loc"]) if first else ""
        what = f"{where}: {first['msg']}" if first else str(exc)
        raise AvsimError(f"{uri} is not a triage document ({what}); rerun the week's triage") from None
