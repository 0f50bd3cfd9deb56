"""The trigger a ``shard_start`` task waits on before it starts its shard run: room among the week's cases.

:class:`ShardAdmissionTrigger` counts the week's unfinished cases every ``poll_interval`` seconds
through the execution API (:func:`avsim.plan.week_counts.read_in_flight`) and fires ``admitted`` when
shard k may start (:func:`avsim.plan.admission.admit`), ``recheck`` after ``recheck_seconds`` without room,
or ``error`` once counts have failed for ``outage_seconds``; never within ``min_wait_seconds`` of its
start. Its arguments are plain JSON (docs/design.md, "Admission by cases in flight (the default)").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from functools import cached_property
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from avsim.plan.week_counts import ExecutionApiCounts, WeekCounts, WeekShape, decide, read_in_flight
from avsim.resume import FALLBACK_SECONDS, resume_not_before

#: A waiting shard derives its target again from the pools this often (seconds).
RECHECK_SECONDS = 300.0
#: How long counts may keep failing (the API server down or restarting) before the trigger gives up.
OUTAGE_SECONDS = 900.0


class ShardAdmissionTrigger(BaseTrigger):
    """Fires when shard ``shard`` of the week ``week`` (:meth:`WeekShape.to_json`) may start under ``target``.

    :param week: the week's shape (:class:`avsim.plan.week_counts.WeekShape`, as JSON).
    :param shard: the shard waiting (numbered from 1).
    :param target: the cases the week keeps in flight.
    :param poll_interval: seconds between counts.
    :param recheck_seconds: after this long without room, fire ``recheck``.
    :param max_failed_polls: at least this many failed counts in a row before an ``error`` event.
    :param outage_seconds: and counts failing for at least this long.
    :param min_wait_seconds: no event sooner after the trigger starts.
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
            },
        )

    @cached_property
    def counts(self) -> WeekCounts:
        return ExecutionApiCounts()

    async def run(self) -> AsyncIterator[TriggerEvent]:
        began = time.monotonic()
        async for event in self._events(began):
            await resume_not_before(began, self.min_wait_seconds)
            yield event
            return

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
