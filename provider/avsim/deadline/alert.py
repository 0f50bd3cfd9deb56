"""The weekly DAG's Airflow Deadline Alert and what happens when a run misses its deadline.

:func:`deadline_alert` builds the alert from ``[avsim]``. :func:`on_deadline_missed`, an
:class:`AsyncCallback` run in the triggerer (the run goes on), logs a warning, emits
``avsim.deadline.seconds_late`` (and ``avsim.capacity.gpus_needed`` when known) and records
``deadline/missed.json`` with the tracker's latest estimate. docs/design.md, "The deadline".
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Any

from airflow.sdk.definitions.callback import AsyncCallback
from airflow.sdk.definitions.deadline import DeadlineAlert

from avsim.artifacts import RunLayout
from avsim.deadline.reference import AvsimRunDeadline

log = logging.getLogger(__name__)

ALERT_NAME = "avsim run deadline"


def missed_uri(deadline_dir: str) -> str:
    return f"{deadline_dir}/missed.json"


def deadline_alert(settings: Any, grace: dt.timedelta = dt.timedelta(0)) -> DeadlineAlert:
    """The weekly DAG's ``deadline=``: the run's deadline (see :mod:`avsim.deadline.reference`) plus ``grace``."""
    return DeadlineAlert(
        reference=AvsimRunDeadline(default_after_seconds=settings.deadline.default_hours * 3600.0),
        interval=grace,
        callback=AsyncCallback(on_deadline_missed),
        name=ALERT_NAME,
    )


def _as_datetime(value: object) -> dt.datetime | None:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)
    return None


def record_miss(context: dict[str, Any], artifact_root: str, now: dt.datetime) -> dict[str, Any]:
    """Write ``deadline/missed.json`` for the run in ``context`` and return it (blocking I/O)."""
    from avsim import metrics
    from avsim.artifacts import RunLayout, run_key_for
    from avsim.storage import exists, read_json, write_json

    dag_run = context.get("dag_run") or {}
    dag_id = str(dag_run.get("dag_id"))
    run_id = str(dag_run.get("dag_run_id") or dag_run.get("run_id"))
    deadline = _as_datetime((context.get("deadline") or {}).get("deadline_time"))
    layout = RunLayout(artifact_root, run_key_for(dag_id, run_id))
    latest = read_json(layout.deadline_latest) if exists(layout.deadline_latest) else None
    late_now = (now - deadline).total_seconds() if deadline else None
    estimated_late = (latest or {}).get("seconds_late")
    seconds_late = max(x for x in (late_now, estimated_late, 0.0) if isinstance(x, (int, float)))
    doc = {
        "dag_id": dag_id,
        "run_id": run_id,
        "run_key": layout.run_key,
        "deadline": deadline.isoformat() if deadline else None,
        "missed_at": now.isoformat(),
        "seconds_late": round(seconds_late, 3),
        "run_state": dag_run.get("state"),
        "latest_estimate": latest,
    }
    write_json(missed_uri(layout.deadline_dir), doc)
    metrics.finish_estimate(seconds_late)
    if latest and latest.get("gpus_needed") is not None:
        metrics.gpus_needed(latest["gpus_needed"])
    log.warning(
        "avsim run %s of %s missed its deadline %s (%.0f s late%s); recorded %s",
        run_id,
        dag_id,
        doc["deadline"],
        seconds_late,
        f", tracker: {latest.get('reason')}" if latest else "",
        missed_uri(layout.deadline_dir),
    )
    return doc


async def on_deadline_missed(context: dict[str, Any] | None = None, artifact_root: str | None = None) -> str:
    """The Deadline Alert's callback (runs in the triggerer): log, metrics, ``deadline/missed.json``.

    ``artifact_root`` defaults to ``[avsim] artifact_root`` as the triggerer reads it. Returns one
    line of text: Airflow stores the return value in the ``callback.output`` text column, and a
    value the database cannot store there (a dict) stops the triggerer.
    """
    if artifact_root is None:
        from avsim.settings import load_settings

        artifact_root = load_settings().resolved_artifact_root
    doc = await asyncio.to_thread(record_miss, context or {}, artifact_root, dt.datetime.now(dt.UTC))
    return (
        f"{doc['run_key']} missed its deadline {doc['deadline']} by {doc['seconds_late']:.0f} s; "
        f"recorded {missed_uri(RunLayout(artifact_root, doc['run_key']).deadline_dir)}"
    )
