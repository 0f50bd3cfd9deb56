"""The ``triage`` task's trigger: its runs' ends, or the deadline first, never sooner than the resume bound.

The boundary mocked: Airflow's execution API, which DagStateTrigger asks for the runs' states."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from typing import Any

from avsim.triggers.triage import DEADLINE_EVENT, TriageRunsTrigger

RUNS = ["w__triage_1_this_1", "w__triage_1_last_1"]


def _soon(seconds: float) -> str:
    return (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)).isoformat()


class _NeverEnds(TriageRunsTrigger):
    async def validate_count_dags_af_3(self, runs_ids_or_dates_len: int = 0) -> dict[str, str]:
        await asyncio.sleep(3600)
        return {}


class _Ended(TriageRunsTrigger):
    async def validate_count_dags_af_3(self, runs_ids_or_dates_len: int = 0) -> dict[str, str]:
        return dict.fromkeys(RUNS, "success")


async def _first(trigger: TriageRunsTrigger) -> tuple[float, Any]:
    began = time.monotonic()
    async for event in trigger.run():
        return time.monotonic() - began, event.payload
    raise AssertionError("no event")


def _make(cls: type[TriageRunsTrigger], until: str | None, min_wait: float = 0.0) -> TriageRunsTrigger:
    return cls(
        dag_id="avsim_weekly_shard",
        states=["success", "failed"],
        run_ids=RUNS,
        until=until,
        min_wait_seconds=min_wait,
    )


def test_serialize() -> None:
    classpath, kwargs = _make(TriageRunsTrigger, "2026-12-13T16:00:00+00:00").serialize()
    assert classpath == "avsim.triggers.triage.TriageRunsTrigger"
    assert kwargs["until"] == "2026-12-13T16:00:00+00:00" and kwargs["run_ids"] == RUNS
    json.dumps(kwargs)
    assert TriageRunsTrigger(**kwargs).serialize() == (classpath, kwargs)


def test_the_deadline_fires_when_the_runs_have_not_ended() -> None:
    waited, (kind, data) = asyncio.run(_first(_make(_NeverEnds, _soon(0.3))))
    assert kind == DEADLINE_EVENT and data["run_ids"] == RUNS and 0.2 <= waited < 5


def test_runs_that_end_first_are_reported_and_never_before_the_bound() -> None:
    waited, (classpath, data) = asyncio.run(_first(_make(_Ended, _soon(60), min_wait=0.3)))
    assert classpath.endswith("_Ended") and data[RUNS[0]] == "success" and waited >= 0.3
    _, (kind, _) = asyncio.run(_first(_make(_NeverEnds, _soon(0))))
    assert kind == DEADLINE_EVENT
    _, (classpath, _) = asyncio.run(_first(_make(_Ended, None)))  # no deadline: the runs' end alone
    assert classpath.endswith("_Ended")
