"""The trigger a ``shards`` (or ``canary``) task waits on: its shard run's end.

:class:`ShardRunTrigger` is Airflow's ``DagStateTrigger`` (the standard provider's wait for a DAG
run to reach a state) that never fires within ``min_wait_seconds`` of its start. A shard run that
ends within seconds of the wait (a repaired shard whose few failed cases rerun quickly, a small
shard) would otherwise resume the task before Airflow's scheduler has seen the exit of the try
that deferred, and Airflow 3.3.2 then fails the task instance
(:mod:`avsim.resume`). It is the only wait of a ``shards``
task: :class:`avsim.operators.shard.ShardRunOperator` creates a new shard run itself and defers on it,
rather than letting Airflow's task runner defer on a plain DagStateTrigger. Its arguments are
DagStateTrigger's plus that bound; its classpath comes from ``__module__``/``__qualname__``.
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
