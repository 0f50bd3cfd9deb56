"""The trigger a ``shards`` task defers on until its shard run fits among the week's cases in flight.

The counts come from a fake :class:`avsim.plan.week_counts.WeekCounts` (the honest boundary: the
execution API the triggerer reads through), set on the trigger's ``counts`` cached property; the
counting (:func:`avsim.plan.week_counts.read_in_flight`) and the decision (:func:`avsim.plan.admission.admit`)
are the real ones.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any

from avsim.plan.week_counts import SHARD_FIRST_TASK, SHARD_LAST_TASK, WeekShape
from avsim.triggers.admission import ShardAdmissionTrigger

RUN = "r1"
WEEK = WeekShape(
    dag_id="avsim_weekly",
    run_id=RUN,
    shard_dag_id="avsim_weekly_shard",
    shards_task_id="shards",
    shard_count=3,
    shard_size=10,
    cases=30,
    case_ends=(("standard.report",),),
)


class FakeCounts:
    """Shard runs 1 and 2 exist (20 cases); ``finished`` of their cases have ended and ``per_poll`` more
    end at every count; the ``shards`` task instances of the weekly run are in ``shards``. ``fails``: whether each
    count in turn raises (as the supervisor's call does when the API server is unreachable)."""

    def __init__(
        self,
        *,
        finished: int = 0,
        per_poll: int = 0,
        shards: dict[str, Any] | None = None,
        fails: list[bool] | None = None,
        runs: tuple[int, ...] = (1, 2),
    ) -> None:
        self.finished = finished
        self.per_poll = per_poll
        self.shards = shards or {"shards_0": "running", "shards_1": "running", "shards_2": "deferred"}
        self.fails = list(fails or ())
        self.failed = 0
        self.runs = runs
        self.counts = 0

    def task_states(
        self, *, dag_id: str, run_ids: list[str], task_ids: list[str]
    ) -> dict[str, dict[str, Any]]:
        if task_ids == [SHARD_FIRST_TASK, SHARD_LAST_TASK]:  # the first read of each count
            if self.fails and self.fails.pop(0):
                self.failed += 1
                raise ConnectionError("execution API unreachable")
            assert dag_id == WEEK.shard_dag_id
            return {
                r: {SHARD_FIRST_TASK: "success", SHARD_LAST_TASK: None}
                for r in map(WEEK.run_id_of, self.runs)
                if r in run_ids
            }
        if task_ids == ["standard.report"]:  # the cases' ends: the first ``finished`` have ended
            assert dag_id == WEEK.shard_dag_id
            self.counts += 1
            ended = self.finished
            self.finished += self.per_poll
            out: dict[str, dict[str, Any]] = {}
            for run_id in run_ids:
                out[run_id] = {
                    f"standard.report_{i}": "success" if i < ended else None for i in range(WEEK.shard_size)
                }
                ended = max(0, ended - WEEK.shard_size)
            return out
        assert (dag_id, run_ids, task_ids) == (WEEK.dag_id, [RUN], [WEEK.shards_task_id])
        return {RUN: dict(self.shards)}


def _trigger(fake: FakeCounts, **kwargs: Any) -> ShardAdmissionTrigger:
    args: dict[str, Any] = {
        "week": WEEK.to_json(),
        "shard": 3,
        "target": 25,
        "poll_interval": 0.01,
        "min_wait_seconds": 0,
        **kwargs,
    }
    trigger = ShardAdmissionTrigger(**args)
    trigger.__dict__["counts"] = fake
    return trigger


def _first_event(trigger: ShardAdmissionTrigger) -> dict[str, Any]:
    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(asyncio.wait_for(first(), timeout=30))


def test_serialize() -> None:
    trigger = ShardAdmissionTrigger(
        week=WEEK.to_json(),
        shard=3,
        target=25,
        poll_interval=5,
        recheck_seconds=60,
        max_failed_polls=4,
        outage_seconds=120,
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "avsim.triggers.admission.ShardAdmissionTrigger"
    assert json.loads(json.dumps(kwargs)) == kwargs  # JSON-friendly: the triggerer stores it in the database
    again = ShardAdmissionTrigger(**kwargs)
    assert again.serialize() == (classpath, kwargs)
    assert WeekShape.from_json(again.week) == WEEK
    assert (again.shard, again.target, again.recheck_seconds, again.max_failed_polls) == (3, 25, 60.0, 4)
    assert again.outage_seconds == 120.0


def test_admitted_when_finished_cases_make_room() -> None:
    # 20 cases in flight, target 20: shard 3 starts once one has ended; 2 end per count.
    fake = FakeCounts(per_poll=2)
    event = _first_event(_trigger(fake, target=20))
    assert event["status"] == "admitted"
    assert fake.counts == 2  # 0 ended: waits; 2 ended: 18 < 20
    assert (event["unfinished"], event["target"]) == (18, 20)
    assert "18 cases in flight < target 20" in event["reason"]


def test_an_earlier_shard_waiting_goes_first_then_this_one_is_admitted() -> None:
    # Shard run 1's cases have all ended; shard 2 has neither its run nor an ended task. Its 10 cases
    # count as started: with a target of 10 shard 3 waits its turn; with 25 both fit and it starts now.
    fake = FakeCounts(finished=20, runs=(1,), shards={"shards_0": "running", "shards_1": "deferred"})
    event = _first_event(_trigger(fake, recheck_seconds=0.2, target=10))
    assert event["status"] == "recheck"
    assert "shard 2 has not started yet" in event["reason"]
    assert _first_event(_trigger(fake, target=25))["status"] == "admitted"
    fake.runs = (1, 2)  # shard 2 started its run
    assert _first_event(_trigger(fake, target=10))["status"] == "admitted"


def test_recheck_after_recheck_seconds_without_room() -> None:
    fake = FakeCounts()
    began = time.monotonic()
    event = _first_event(_trigger(fake, recheck_seconds=0.1, target=18))
    assert time.monotonic() - began >= 0.1
    assert event["status"] == "recheck"
    assert (event["unfinished"], event["target"]) == (20, 18)
    assert "waiting for 3 to finish" in event["reason"]
    assert fake.counts > 1  # it polled while it waited


def test_failing_counts_end_in_an_error_event_not_an_exception() -> None:
    fake = FakeCounts(finished=20, fails=[True] * 100)
    event = _first_event(_trigger(fake, max_failed_polls=3, outage_seconds=0))
    assert event["status"] == "error"
    assert "3 counts failed" in event["message"] and "ConnectionError" in event["message"]
    assert fake.failed == 3 and fake.counts == 0


def test_an_api_outage_shorter_than_outage_seconds_is_waited_out() -> None:
    # An API server restarting: 40 counts in a row fail (many more than max_failed_polls), then it answers.
    fake = FakeCounts(finished=20, fails=[True] * 40)
    event = _first_event(_trigger(fake, max_failed_polls=3, outage_seconds=60))
    assert event["status"] == "admitted"
    assert fake.failed == 40


def test_an_outage_fails_only_after_outage_seconds() -> None:
    fake = FakeCounts(finished=20, fails=[True] * 10_000)
    began = time.monotonic()
    event = _first_event(_trigger(fake, max_failed_polls=3, outage_seconds=0.5))
    assert event["status"] == "error" and "over" in event["message"]
    assert time.monotonic() - began >= 0.5


def test_a_count_that_succeeds_resets_the_failures() -> None:
    # Six failures in all, never three in a row: it keeps counting until room appears.
    fake = FakeCounts(per_poll=2, fails=[True, True, False, True, True, False, True, True])
    event = _first_event(_trigger(fake, max_failed_polls=3, target=15))
    assert event["status"] == "admitted"
    assert fake.failed == 6 and fake.counts == 4  # 0, 2, 4 ended: waits; 6 ended: 14 < 15


def test_a_bad_week_document_is_an_error_event() -> None:
    event = _first_event(_trigger(FakeCounts(), week={"dag_id": "avsim_weekly", "nope": 1}))
    assert event["status"] == "error" and "TypeError" in event["message"]
    event = _first_event(_trigger(FakeCounts(), week={**WEEK.to_json(), "case_ends": 7}))
    assert event["status"] == "error"


def test_no_event_sooner_than_the_minimum_wait() -> None:
    fake = FakeCounts(finished=20)  # room at once
    began = time.monotonic()
    event = _first_event(_trigger(fake, min_wait_seconds=0.3))
    assert event["status"] == "admitted" and fake.counts == 1
    assert time.monotonic() - began >= 0.3


def test_a_window_week_admits_by_shard_runs_in_progress_not_by_cases() -> None:
    """``[avsim] admission = window``: the ``shard_start`` tasks are not capped by W any more, so the
    trigger holds shard 3 while W shard runs are in progress, and admits it when one has ended."""
    window = dataclasses.replace(WEEK, window=2)
    fake = FakeCounts()  # shard runs 1 and 2 in progress
    trigger = _trigger(fake, week=window.to_json(), recheck_seconds=0.2)
    event = _first_event(trigger)
    assert event["status"] == "recheck" and "2 shard runs in progress, W = 2" in event["reason"]
    assert fake.counts == 0, "the window counts shard runs, never cases"
    # Shard run 1 out of the count (as one whose summarize ended), its start done: one place.
    fake.runs, fake.shards = (2,), {"shards_0": "success", "shards_1": "success", "shards_2": "deferred"}
    event = _first_event(_trigger(fake, week=window.to_json()))
    assert event["status"] == "admitted" and "1 shard runs in progress < W = 2" in event["reason"]


# -- admitted, the trigger starts the shard run itself and ends the task ------------------------------

IMAGE = "registry.local/sim@sha256:" + "e" * 64


class FakeApi:
    """The REST API the trigger creates the shard run through (the boundary mocked:
    :class:`avsim.hooks.airflow_api.AirflowApiHook`); ``error`` makes every call fail."""

    def __init__(self, error: Exception | None = None, exists: bool = False) -> None:
        self.error, self.exists = error, exists
        self.created: list[tuple[str, str, dict[str, Any]]] = []

    def create_dag_run(self, dag_id: str, dag_run_id: str, **kwargs: Any) -> bool:
        if self.error is not None:
            raise self.error
        self.created.append((dag_id, dag_run_id, kwargs))
        return not self.exists


def _start(root: Any) -> dict[str, Any]:
    return {
        "dag_id": "avsim_weekly_shard",
        "run_id": "r1__shard_0003",
        "conf": {"shard": 3},
        "logical_date": "2026-12-07T06:00:00.000003+00:00",
        "note": None,
        "api_conn_id": "avsim_airflow_api",
        "artifact_root": f"file://{root}",
        "image": IMAGE,
    }


def _end_event(trigger: ShardAdmissionTrigger) -> Any:
    async def first() -> Any:
        async for event in trigger.run():
            return event
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(asyncio.wait_for(first(), timeout=30))


def test_admitted_it_creates_the_shard_run_and_ends_the_task_without_the_resume_bound(tmp_path: Any) -> None:
    """No worker resumes the task: the run is created from the triggerer and the task ends successful
    with the link's XCom, at once (the resume bound guards only a task that resumes in a worker)."""
    from airflow.triggers.base import TaskSuccessEvent

    trigger = _trigger(FakeCounts(finished=20), min_wait_seconds=5, start=_start(tmp_path))
    api = trigger.__dict__["api"] = FakeApi()
    began = time.monotonic()
    event = _end_event(trigger)
    assert time.monotonic() - began < 5
    assert isinstance(event, TaskSuccessEvent)
    assert event.xcoms == {"trigger_run_id": "r1__shard_0003", "return_value": "r1__shard_0003"}
    [(dag_id, run_id, kwargs)] = api.created
    assert (dag_id, run_id, kwargs["conf"]) == ("avsim_weekly_shard", "r1__shard_0003", {"shard": 3})
    assert kwargs["logical_date"] == "2026-12-07T06:00:00.000003+00:00"
    # Created by another try meanwhile: the task ends all the same.
    trigger = _trigger(FakeCounts(finished=20), start=_start(tmp_path))
    trigger.__dict__["api"] = FakeApi(exists=True)
    assert isinstance(_end_event(trigger), TaskSuccessEvent)


def test_an_open_breaker_or_a_failing_api_leaves_the_start_to_the_task(tmp_path: Any) -> None:
    """The task resumes (after the bound), decides again and says why: the breaker refuses the run,
    or the task creates it through the execution API."""
    from avsim.hooks.airflow_api import AirflowApiError
    from avsim.ledger.breaker import Breaker, image_digest

    trigger = _trigger(FakeCounts(finished=20), start=_start(tmp_path))
    api = trigger.__dict__["api"] = FakeApi(error=AirflowApiError("POST answered HTTP 503", status=503))
    assert dict(_end_event(trigger).payload)["status"] == "admitted"
    assert Breaker(f"file://{tmp_path}", image_digest(IMAGE)).trip("canary gate: 20 of 20 crashed")
    trigger = _trigger(FakeCounts(finished=20), start=_start(tmp_path))
    api = trigger.__dict__["api"] = FakeApi()
    assert dict(_end_event(trigger).payload)["status"] == "admitted"
    assert api.created == []


def test_serialize_carries_the_run_to_start(tmp_path: Any) -> None:
    trigger = _trigger(FakeCounts(), start=_start(tmp_path))
    _, kwargs = trigger.serialize()
    assert json.loads(json.dumps(kwargs)) == kwargs
    assert ShardAdmissionTrigger(**kwargs).start == _start(tmp_path)
