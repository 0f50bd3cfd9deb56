"""The trigger a ``shards`` (or ``canary``) task waits on: its shard run's end.

:class:`ShardRunTrigger` is Airflow's ``DagStateTrigger`` that never fires within
``min_wait_seconds`` of its start, so a shard run that ends within seconds never resumes the task
before the scheduler has seen the deferring try end (:mod:`avsim.resume`; docs/design.md, "Every
wait is bounded"). Its arguments are DagStateTrigger's plus that bound.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.providers.standard.triggers.external_task import DagStateTrigger
from airflow.triggers.base import TriggerEvent

from avsim.resume import FALLBACK_SECONDS, resume_not_before


class ShardRunTrigger(DagStateTrigger):
    """Fires when the shard run reaches one of ``states``, and not before ``min_wait_seconds``."""

    def __init__(self, *args: Any, min_wait_seconds: float = FALLBACK_SECONDS, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.min_wait_seconds = float(min_wait_seconds)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        _, kwargs = super().serialize()
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {**kwargs, "min_wait_seconds": self.min_wait_seconds},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        began = time.monotonic()
        async for event in super().run():
            await resume_not_before(began, self.min_wait_seconds)
            yield event
            return
