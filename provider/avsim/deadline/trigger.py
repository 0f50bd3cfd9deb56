"""The deadline tracker's trigger: re-estimates the weekly run's finish at an interval, in the triggerer.

Each pass (:func:`avsim.deadline.tracking.track_once`) counts the week's task instances, re-estimates,
records the estimate and emits the metrics. It fires ``done`` when the week's shard runs are finished
(checked every :data:`END_CHECK_SECONDS`), ``late`` with ``gpus_needed`` when acting is configured and
more GPUs are needed than last asked for, and ``error`` (it never raises) when ``plan.json`` is unusable
or ``max_failed_passes`` passes fail in a row. Plain JSON arguments: it survives a triggerer restart.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import AsyncIterator
from functools import cached_property
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from avsim.deadline.tracking import (
    PhaseTasks,
    TaskCounts,
    TrackedRun,
    load_planned_work,
    track_once,
    window_state,
)
from avsim.plan.week_counts import ExecutionApiCounts
from avsim.resume import FALLBACK_SECONDS, resume_not_before

#: Between passes the trigger looks this often whether the week ended (one count of the shard
#: runs), so the tracker, and with it the weekly run, ends with the last shard run rather than
#: up to ``interval_seconds`` after it.
END_CHECK_SECONDS = 15.0


class DeadlineTrackerTrigger(BaseTrigger):
    """Re-estimates a weekly run's finish every ``interval_seconds`` until its shard runs end.

    :param run: the tracked run (:meth:`TrackedRun.to_json`).
    :param phases: the shard DAG's phase tasks by phase key (:func:`~avsim.deadline.tracking.phase_tasks`).
    :param interval_seconds: time between passes.
    :param gpu_capacity: GPUs known to be available (0: only the GPUs in use count).
    :param act_above_gpus: fire ``late`` when the GPUs needed exceed this; None: never (record only).
    :param action: what the tracker last did, for the documents (the UI shows it).
    :param max_failed_passes: consecutive failed passes before the trigger gives up with an error event.
    :param min_wait_seconds: no event fires sooner after the trigger starts: the sensor resumed sooner
        could be failed by Airflow's scheduler (:mod:`avsim.resume`).
    """

    def __init__(
        self,
        *,
        run: dict[str, Any],
        phases: dict[str, dict[str, Any]],
        interval_seconds: float,
        gpu_capacity: int = 0,
        act_above_gpus: int | None = None,
        action: str = "none",
        max_failed_passes: int = 3,
        min_wait_seconds: float = FALLBACK_SECONDS,
    ) -> None:
        super().__init__()
        self.run_info = dict(run)
        self.phases = {k: dict(v) for k, v in phases.items()}
        self.interval_seconds = float(interval_seconds)
        self.gpu_capacity = int(gpu_capacity)
        self.act_above_gpus = act_above_gpus
        self.action = action
        self.max_failed_passes = int(max_failed_passes)
        self.min_wait_seconds = float(min_wait_seconds)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "run": self.run_info,
                "phases": self.phases,
                "interval_seconds": self.interval_seconds,
                "gpu_capacity": self.gpu_capacity,
                "act_above_gpus": self.act_above_gpus,
                "action": self.action,
                "max_failed_passes": self.max_failed_passes,
                "min_wait_seconds": self.min_wait_seconds,
            },
        )

    @cached_property
    def counts(self) -> TaskCounts:
        return ExecutionApiCounts()

    def _error(self, message: str) -> TriggerEvent:
        self.log.error("deadline tracker of %s: %s", self.run_info.get("run_key"), message)
        return TriggerEvent({"status": "error", "message": message})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        began = time.monotonic()
        async for event in self._events():
            await resume_not_before(began, self.min_wait_seconds)
            yield event
            return

    async def _events(self) -> AsyncIterator[TriggerEvent]:
        try:
            tracked = TrackedRun.from_json(self.run_info)
            phases = {k: PhaseTasks.from_json(k, v) for k, v in self.phases.items()}
            planned = await asyncio.to_thread(load_planned_work, tracked, phases)
        except Exception as exc:  # an event, never an exception: the sensor reports it
            yield self._error(f"{type(exc).__name__}: {exc}")
            return
        failures = 0
        while True:
            try:
                found = await asyncio.to_thread(
                    track_once,
                    self.counts,
                    tracked,
                    planned,
                    phases,
                    now=dt.datetime.now(dt.UTC),
                    gpu_capacity=self.gpu_capacity,
                    action=self.action,
                )
            except Exception as exc:
                failures += 1
                self.log.warning(
                    "deadline tracker pass failed (%d of %d allowed in a row): %s",
                    failures,
                    self.max_failed_passes,
                    exc,
                    exc_info=True,
                )
                if failures >= self.max_failed_passes:
                    yield self._error(f"{failures} passes in a row failed; last: {type(exc).__name__}: {exc}")
                    return
                await asyncio.sleep(self.interval_seconds)
                continue
            failures = 0
            est = found.estimate
            if found.done:
                yield TriggerEvent({"status": "done", "estimate": found.document})
                return
            needed = est.gpus_needed
            if (
                self.act_above_gpus is not None
                and est.late
                and needed is not None
                and needed > self.act_above_gpus
            ):
                yield TriggerEvent({"status": "late", "gpus_needed": needed, "estimate": found.document})
                return
            await self._until_next_pass(tracked)

    async def _until_next_pass(self, tracked: TrackedRun) -> None:
        """Sleep ``interval_seconds``, or less when a count finds the week ended."""
        next_pass = time.monotonic() + self.interval_seconds
        while (left := next_pass - time.monotonic()) > 0:
            await asyncio.sleep(min(left, END_CHECK_SECONDS))
            if time.monotonic() >= next_pass:
                return
            try:
                _, done = await asyncio.to_thread(window_state, self.counts, tracked)
            except Exception as exc:  # the next pass counts again and handles failures
                self.log.debug("deadline tracker: end check failed: %s", exc)
                continue
            if done:
                return
