"""The trigger the ``triage`` task waits on: its triage shard runs' ends, or the week's deadline.

:class:`TriageRunsTrigger` is :class:`~avsim.triggers.shard_run.ShardRunTrigger` over several runs,
bounded by ``until`` (an ISO time): when it passes first, it fires ``("deadline", {...})`` so the
task stops the runs still going and lists their cases as not triaged, instead of holding the report.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import TriggerEvent

from avsim.resume import resume_not_before
from avsim.triggers.shard_run import ShardRunTrigger

DEADLINE_EVENT = "deadline"


def seconds_until(until: str | None, now: dt.datetime | None = None) -> float | None:
    if not until:
        return None
    when = dt.datetime.fromisoformat(until)
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return max(0.0, (when - (now or dt.datetime.now(dt.UTC))).total_seconds())


class TriageRunsTrigger(ShardRunTrigger):
    """Fires when every run reached one of ``states``, or ``("deadline", ...)`` once ``until`` passed."""

    def __init__(self, *args: Any, until: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.until = until

    def serialize(self) -> tuple[str, dict[str, Any]]:
        classpath, kwargs = super().serialize()
        return classpath, {**kwargs, "until": self.until}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        began = time.monotonic()
        left = seconds_until(self.until)
        ended: TriggerEvent | None = None
        try:
            async with asyncio.timeout(left):
                async for event in super().run():
                    ended = event
                    break
        except TimeoutError:
            ended = None
        if ended is None:
            await resume_not_before(began, self.min_wait_seconds)
            ended = TriggerEvent((DEADLINE_EVENT, {"run_ids": list(self.run_ids or ()), "until": self.until}))
        yield ended
