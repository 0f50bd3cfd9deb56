"""The weekly run's deadline as an Airflow deadline reference (evaluated when the run is created).

Airflow writes a run's ``Deadline`` row in the same transaction that creates the run (in the
scheduler for a scheduled run, in the API server for a triggered one), from the reference and
the alert's interval. Only what the ``dag_run`` row holds is known then: the manifest, which
states the week's deadline, is read later by ``prepare``. Reading it here would put artifact-store
I/O (a manifest of up to 64 MiB, on S3) inside the scheduler's run-creation transaction, so this
reference does not. It takes:

- the run's conf ``deadline`` (ISO 8601 with a time zone) when whoever triggered the run gave
  one: an engineer, or an automation that read the manifest's ``run.deadline`` first;
- otherwise the run's ``run_after`` (Monday 06:00 for the scheduled run, the trigger time for a
  triggered one) plus ``default_after_seconds`` (``[avsim] deadline_default_hours``).

The manifest's own deadline is what the deadline tracker (:mod:`avsim.deadline.sensor`) compares
its estimates with, from ``manifest/plan.json``; the tracker's documents carry both.

Registered by the avsim plugin (``deadline_references``), which the scheduler and API server
need to rebuild it from the serialized DAG.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any

from airflow.sdk.definitions.deadline import BaseDeadlineReference

log = logging.getLogger(__name__)

#: The key of a run's conf that sets its deadline.
CONF_KEY = "deadline"


def parse_conf_deadline(value: object) -> dt.datetime | None:
    """A conf ``deadline``: an ISO 8601 date-time with a time zone; anything else is None."""
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def run_deadline(
    conf: dict[str, Any] | None, run_after: dt.datetime, default_after_seconds: float
) -> dt.datetime:
    """The deadline of a run: its conf ``deadline`` when valid, else ``run_after`` plus the default."""
    raw = (conf or {}).get(CONF_KEY)
    parsed = parse_conf_deadline(raw)
    if raw is not None and parsed is None:
        log.warning(
            "dag run conf %s=%r is not an ISO 8601 date-time with a time zone (e.g. '2026-12-06T18:00:00Z'); "
            "using run_after + %.0f s instead",
            CONF_KEY,
            raw,
            default_after_seconds,
        )
    if parsed is not None:
        return parsed.astimezone(dt.UTC)
    return run_after + dt.timedelta(seconds=default_after_seconds)


@dataclass(frozen=True)
class AvsimRunDeadline(BaseDeadlineReference):
    """The run's conf ``deadline``, else its ``run_after`` plus ``default_after_seconds``."""

    default_after_seconds: float = 156 * 3600.0  # Monday 06:00 -> Sunday 18:00

    #: What Airflow passes to ``_evaluate_with`` (it filters its keyword arguments by this set).
    required_kwargs = frozenset({"dag_id", "run_id"})

    def serialize_reference(self) -> dict[str, Any]:
        return {**super().serialize_reference(), "default_after_seconds": self.default_after_seconds}

    @classmethod
    def deserialize_reference(cls, reference_data: dict[str, Any]) -> AvsimRunDeadline:
        return cls(default_after_seconds=float(reference_data.get("default_after_seconds", 156 * 3600.0)))

    def _evaluate_with(self, *, session: Any, **kwargs: Any) -> dt.datetime | None:
        from airflow.models import DagRun
        from sqlalchemy import select

        row = session.execute(
            select(DagRun.conf, DagRun.run_after).where(
                DagRun.dag_id == kwargs["dag_id"], DagRun.run_id == kwargs["run_id"]
            )
        ).one_or_none()
        if row is None:
            log.warning("no dag run %s/%s to take a deadline from", kwargs["dag_id"], kwargs["run_id"])
            return None
        conf, run_after = row
        return run_deadline(conf if isinstance(conf, dict) else None, run_after, self.default_after_seconds)
