"""The trigger a ``shard_start`` task waits on before it starts its shard run: room among the week's cases.

:class:`ShardAdmissionTrigger` counts the week's unfinished cases every ``poll_interval`` seconds
through the execution API (:func:`avsim.plan.week_counts.read_in_flight`). Admitted, it creates the
shard run itself through the REST API and ends the task (no worker resumes); else, or when that fails,
it fires ``admitted``, ``recheck`` after ``recheck_seconds`` without room, or ``error`` once counts have
failed for ``outage_seconds``, never within ``min_wait_seconds`` of its start (docs/design.md,
"Admission by cases in flight (the default)").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, TaskSuccessEvent, TriggerEvent

from avsim.plan.week_counts import ExecutionApiCounts, WeekCounts, WeekShape, decide, read_in_flight
from avsim.resume import FALLBACK_SECONDS, resume_not_before

if TYPE_CHECKING:
    from avsim.hooks.airflow_api import AirflowApiHook

#: A waiting shard derives its target again from the pools this often (seconds).
RECHECK_SECONDS = 300.0
#: How long counts may keep failing (the API server down or restarting) before the trigger gives up.
OUTAGE_SECONDS = 900.0


@dataclass(frozen=True)
class RunToStart:
    """The shard run an admission trigger creates once admitted (JSON in the trigger's arguments)."""

    dag_id: str
    run_id: str
    conf: dict[str, Any]
    #: ISO 8601, or None.
    logical_date: str | None
    note: str | None
    #: The REST API connection (``[avsim] airflow_api_conn_id``).
    api_conn_id: str
    #: Where the build's circuit breaker is read: no run starts while it is open.
    artifact_root: str
    image: str


class ShardAdmissionTrigger(BaseTrigger):
    """Fires when shard ``shard`` of the week ``week`` (:meth:`WeekShape.to_json`) may start under ``target``.

    :param week: the week's shape (:class:`avsim.plan.week_counts.WeekShape`, as JSON).
    :param shard: the shard waiting (numbered from 1).
    :param target: the cases the week keeps in flight.
    :param poll_interval: seconds between counts.
    :param recheck_seconds: after this long without room, fire ``recheck``.
    :param max_failed_polls: at least this many failed counts in a row before an ``error`` event.
    :param outage_seconds: and counts failing for at least this long.
    :param min_wait_seconds: no event that resumes the task sooner after the trigger starts.
    :param start: the shard run to create once admitted (:class:`RunToStart`, as JSON); None: the task
        creates it when it resumes.
    """

    def __init__(
        self,
        *,
        week: dict[str, Any],
        shard: int,
        target: int,
        poll_interval: float,
        recheck_seconds: float = RECHECK_SECONDS,
        max_failed_polls: int = 5,
        min_wait_seconds: float = FALLBACK_SECONDS,
        outage_seconds: float = OUTAGE_SECONDS,
        start: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.week = dict(week)
        self.shard = int(shard)
        self.target = int(target)
        self.poll_interval = float(poll_interval)
        self.recheck_seconds = float(recheck_seconds)
        self.max_failed_polls = int(max_failed_polls)
        self.min_wait_seconds = float(min_wait_seconds)
        self.outage_seconds = float(outage_seconds)
        self.start = dict(start) if start else None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "week": self.week,
                "shard": self.shard,
                "target": self.target,
                "poll_interval": self.poll_interval,
                "recheck_seconds": self.recheck_seconds,
                "max_failed_polls": self.max_failed_polls,
                "min_wait_seconds": self.min_wait_seconds,
                "outage_seconds": self.outage_seconds,
                "start": self.start,
            },
        )

    @cached_property
    def counts(self) -> WeekCounts:
        return ExecutionApiCounts()

    @cached_property
    def api(self) -> AirflowApiHook:
        from avsim.hooks.airflow_api import AirflowApiHook

        assert self.start is not None
        return AirflowApiHook(str(self.start["api_conn_id"]))

    async def run(self) -> AsyncIterator[TriggerEvent]:
        began = time.monotonic()
        async for event in self._events(began):
            if event.payload.get("status") == "admitted" and self.start:
                ended = await self._start_here(RunToStart(**self.start))
                if ended is not None:
                    yield ended
                    return
            await resume_not_before(began, self.min_wait_seconds)
            yield event
            return

    async def _start_here(self, run: RunToStart) -> TaskSuccessEvent | None:
        """Create the admitted shard run and end the task: no worker starts, and no resume bound is
        waited for (a task ended by its trigger is done before its deferring try's exit arrives).
        None when the breaker is open or the API fails: the task resumes, decides again and says why."""
        from avsim.ledger.breaker import Breaker, image_digest

        try:
            breaker = Breaker(run.artifact_root, image_digest(run.image))
            if (await asyncio.to_thread(breaker.state)).is_open:
                return None
            created = await asyncio.to_thread(
                self.api.create_dag_run,
                run.dag_id,
                run.run_id,
                conf=run.conf,
                logical_date=run.logical_date,
                note=run.note,
            )
        except Exception as exc:
            # A service account without "can create" on DAG Runs is refused (HTTP 403): a setting, not a
            # fault (docs/deployment.md, "avsim's service account").
            refused = getattr(exc, "status", None) == 403
            self.log.log(
                logging.INFO if refused else logging.WARNING,
                "shard %d: %s could not be created from the triggerer (%s); the task creates it",
                self.shard,
                run.run_id,
                exc,
            )
            return None
        self.log.info("shard run %s %s", run.run_id, "created" if created else "already there")
        # The "Triggered DAG" link reads the run's id from trigger_run_id, as after the task's own start.
        return TaskSuccessEvent(xcoms={"trigger_run_id": run.run_id, "return_value": run.run_id})

    async def _events(self, began: float) -> AsyncIterator[TriggerEvent]:
        try:
            week = WeekShape.from_json(self.week)
        except Exception as exc:  # an event, never an exception: the task decides
            yield TriggerEvent({"status": "error", "message": f"{type(exc).__name__}: {exc}"})
            return
        failures = 0
        failing_since = 0.0
        while True:
            try:
                found = await asyncio.to_thread(read_in_flight, self.counts, week, self.shard)
            except Exception as exc:
                failures += 1
                failing_since = failing_since or time.monotonic()
                failing_for = time.monotonic() - failing_since
                self.log.warning(
                    "shard %d: counting the week's cases failed (%d in a row, for %.0fs of %gs): %s",
                    self.shard,
                    failures,
                    failing_for,
                    self.outage_seconds,
                    exc,
                )
                if failures >= self.max_failed_polls and failing_for >= self.outage_seconds:
                    yield TriggerEvent(
                        {
                            "status": "error",
                            "message": f"{failures} counts failed over {failing_for:.0f}s; last: "
                            f"{type(exc).__name__}: {exc}",
                        }
                    )
                    return
                await asyncio.sleep(self.poll_interval)
                continue
            failures, failing_since = 0, 0.0
            decision = decide(week, self.shard, found, self.target)
            facts = {"reason": decision.reason, "unfinished": found.unfinished_cases, "target": self.target}
            if decision.admitted:
                yield TriggerEvent({"status": "admitted", **facts})
                return
            if time.monotonic() - began >= self.recheck_seconds:
                yield TriggerEvent({"status": "recheck", **facts})
                return
            self.log.debug("shard %d waits: %s", self.shard, decision.reason)
            await asyncio.sleep(self.poll_interval)
