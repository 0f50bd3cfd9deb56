"""The deadline tracker's trigger: real artifact documents, counts from a scripted source.

The count source is the one stub: in the triggerer it is the execution API behind the trigger
runner's supervisor (``RuntimeTaskInstance.get_ti_count`` / ``get_dr_count``), which needs a
running triggerer and API server. :class:`ScriptedCounts` answers the same questions, checks
they are asked about the right DAG and runs, and moves the week on one pass at a time.
Everything else is real: ``plan.json`` read from and ``deadline/`` documents written to a
``file://`` artifact store, metrics sent as StatsD datagrams to a UDP socket.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from avsim.artifacts import RunLayout
from avsim.deadline.estimate import ACTIVE_STATES, FINISHED_STATES, WAITING_STATES, PhaseProgress
from avsim.deadline.tracking import FINISHED_RUN_STATES, TrackedRun
from avsim.deadline.trigger import DeadlineTrackerTrigger
from avsim.storage import write_json

# The deployed shape: simulate has an on-demand twin, which ends once the phase is done for a case.
PHASES = {
    "standard.prepare": {"upstream": [], "twin": None},
    "standard.simulate": {"upstream": ["standard.prepare"], "twin": "standard.simulate_on_demand"},
    "standard.evaluate": {"upstream": ["standard.simulate"], "twin": None},
    "standard.report": {"upstream": ["standard.evaluate"], "twin": None},
}
SHARDS = 2  # plus the canary's run
RUN_IDS = ["manual_1__canary", "manual_1__shard_0001", "manual_1__shard_0002"]


def _plan_doc(deadline: dt.datetime) -> dict[str, Any]:
    per = {"prepare": (0, 180), "simulate": (1, 1800), "evaluate": (0, 300), "report": (0, 60)}
    return {
        "cases": 100,
        "phases": 400,
        "deadline": deadline.isoformat(),
        "per_phase": {
            f"standard.{p}": {"cases": 100, "gpus": g, "estimated_seconds": s} for p, (g, s) in per.items()
        },
    }


@pytest.fixture
def tracked(tmp_path: Path) -> TrackedRun:
    return TrackedRun(
        artifact_root=f"file://{tmp_path / 'artifacts'}",
        run_key="avsim_weekly__manual_1",
        dag_id="avsim_weekly",
        run_id="manual_1",
        shard_dag_id="avsim_weekly_shard",
        shard_count=SHARDS,
        canary=True,
    )


class ScriptedCounts:
    """The week, pass by pass, as the execution API would count it.

    A pass gives ``runs_finished`` (shard runs), ``window`` ((task instances, finished) of the
    parent's canary and shards tasks) and ``phases``: per phase key a PhaseProgress, where
    ``finished`` is what the phase's finishing task counts (the twin for simulate) and ``active``
    and ``waiting`` are split evenly between a phase's tasks.
    """

    def __init__(self, tracked: TrackedRun, passes: list[Any]) -> None:
        self.tracked = tracked
        self.passes = passes
        self.index = -1

    @property
    def now(self) -> Any:
        return self.passes[min(self.index, len(self.passes) - 1)]

    def dr_count(self, *, dag_id: str, run_ids: list[str], states: list[str]) -> int:
        # Each pass starts with the shard runs: the week moves on here.
        assert (dag_id, run_ids, tuple(states)) == ("avsim_weekly_shard", RUN_IDS, FINISHED_RUN_STATES)
        self.index += 1
        if isinstance(self.now, Exception):
            raise self.now
        return int(self.now.get("runs_finished", 0))

    def ti_count(
        self, *, dag_id: str, run_ids: list[str], task_ids: list[str], states: list[str] | None
    ) -> int:
        if dag_id == "avsim_weekly":
            assert (run_ids, task_ids) == (["manual_1"], ["canary", "shard_start", "shards"])
            total, ended = self.now.get("window", (3, 0))
            assert states is None or tuple(states) == FINISHED_STATES
            return int(total if states is None else ended)
        assert dag_id == "avsim_weekly_shard" and run_ids == RUN_IDS and states is not None
        key = task_ids[0].removesuffix("_on_demand")
        progress: PhaseProgress = self.now["phases"].get(key, PhaseProgress())
        if tuple(states) == FINISHED_STATES:
            # A phase with a twin is counted on each task: the spot task's count is the twin's unless
            # the pass says some spot tasks are running again (``spot_finished``, a repair).
            assert len(task_ids) == 1
            if task_ids[0] == key and PHASES[key]["twin"]:
                return int(self.now.get("spot_finished", {}).get(key, progress.finished))
            return progress.finished
        assert task_ids == [key] + ([PHASES[key]["twin"]] if PHASES[key]["twin"] else [])
        field = {ACTIVE_STATES: "active", WAITING_STATES: "waiting"}[tuple(states)]
        return int(getattr(progress, field))


def _collect(trigger: DeadlineTrackerTrigger, limit: int = 10) -> list[dict[str, Any]]:
    async def run() -> list[dict[str, Any]]:
        events = []
        async for event in trigger.run():
            events.append(event.payload)
            if len(events) >= limit:
                break
        return events

    return asyncio.run(asyncio.wait_for(run(), timeout=60))


def _trigger(tracked: TrackedRun, counts: ScriptedCounts, **kwargs: Any) -> DeadlineTrackerTrigger:
    trigger = DeadlineTrackerTrigger(
        run=tracked.to_json(), phases=PHASES, interval_seconds=0.01, min_wait_seconds=0, **kwargs
    )
    trigger.counts = counts  # the execution API's place (see the module doc)
    return trigger


def _read(uri: str) -> Any:
    return json.loads(Path(uri.removeprefix("file://")).read_text())


MIDWAY = {
    "standard.prepare": PhaseProgress(finished=100),
    "standard.simulate": PhaseProgress(finished=40, active=10, waiting=50),
    "standard.evaluate": PhaseProgress(finished=35, active=2),
    "standard.report": PhaseProgress(finished=30),
}
DONE = {t: PhaseProgress(finished=100) for t in PHASES}


def test_records_every_pass_and_ends_with_the_shard_runs(tracked: TrackedRun) -> None:
    # 99,000 GPU-s on 10 GPUs in use = 9,900 s to go, against a deadline 3 h away: on track.
    write_json(tracked.layout.plan_uri, _plan_doc(dt.datetime.now(dt.UTC) + dt.timedelta(hours=3)))
    counts = ScriptedCounts(
        tracked,
        [
            {"runs_finished": 1, "phases": MIDWAY},
            {"runs_finished": 2, "phases": MIDWAY},
            {"runs_finished": 3, "phases": DONE},
        ],
    )
    events = _collect(_trigger(tracked, counts))
    assert [e["status"] for e in events] == ["done"]
    assert events[0]["estimate"]["cases_left"] == 0
    latest = _read(tracked.layout.deadline_latest)
    assert latest["status"] == "done" and latest["shard_runs"] == {"total": 3, "finished": 3}
    assert latest["action"] == "none"
    history = sorted(Path(tracked.layout.deadline_dir.removeprefix("file://"), "history").glob("*.json"))
    assert len(history) == 3
    first = json.loads(history[0].read_text())
    assert first["status"] == "tracking" and not first["late"]
    assert first["remaining_gpu_seconds"] == 99_000 and first["gpus_in_use"] == 10
    assert first["phases"]["standard.simulate"] == {
        "planned": 100,
        "finished": 40,
        "active": 10,
        "waiting": 50,
    }
    assert -10_800 < first["seconds_late"] < -800


def test_the_window_task_ending_also_ends_tracking(tracked: TrackedRun) -> None:
    """A canary gate that stopped the week, or a shard run that could not start, ends the window."""
    write_json(tracked.layout.plan_uri, _plan_doc(dt.datetime.now(dt.UTC) + dt.timedelta(hours=3)))
    counts = ScriptedCounts(
        tracked,
        [
            {"runs_finished": 1, "window": (1, 0), "phases": MIDWAY},  # shards not expanded yet
            {"runs_finished": 1, "window": (2, 2), "phases": MIDWAY},  # gate failed: shards upstream_failed
        ],
    )
    assert [e["status"] for e in _collect(_trigger(tracked, counts))] == ["done"]
    assert counts.index == 1


def test_an_event_found_at_once_fires_no_sooner_than_the_bound(tracked: TrackedRun) -> None:
    """The sensor defers again after acting; an end found on the first pass still waits the bound,
    so the sensor is not resumed before Airflow's scheduler saw its deferring try end."""
    import time

    write_json(tracked.layout.plan_uri, _plan_doc(dt.datetime.now(dt.UTC) + dt.timedelta(hours=3)))
    trigger = _trigger(tracked, ScriptedCounts(tracked, [{"runs_finished": 3, "phases": DONE}]))
    trigger.min_wait_seconds = 0.5
    began = time.monotonic()
    assert [e["status"] for e in _collect(trigger)] == ["done"]
    assert time.monotonic() - began >= 0.5


def test_late_estimate_hands_the_gpus_needed_to_the_sensor(tracked: TrackedRun) -> None:
    write_json(tracked.layout.plan_uri, _plan_doc(dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)))
    late = [{"runs_finished": 0, "phases": MIDWAY}] * 2 + [{"runs_finished": 3, "phases": DONE}]
    events = _collect(_trigger(tracked, ScriptedCounts(tracked, late), act_above_gpus=10))
    assert [e["status"] for e in events] == ["late"]
    assert events[0]["gpus_needed"] == 14  # ceil(99,000 GPU-s / ~7,200 s left)
    assert events[0]["estimate"]["late"] and _read(tracked.layout.deadline_latest)["status"] == "late"
    # Already asked for 14: no new event, the trigger keeps tracking until the week ends.
    again = _collect(_trigger(tracked, ScriptedCounts(tracked, late), act_above_gpus=14))
    assert [e["status"] for e in again] == ["done"]
    # Not configured to act (None): late estimates are recorded only.
    quiet = _collect(_trigger(tracked, ScriptedCounts(tracked, late)))
    assert [e["status"] for e in quiet] == ["done"]


def test_a_missing_plan_is_an_error_event(tracked: TrackedRun) -> None:
    events = _collect(_trigger(tracked, ScriptedCounts(tracked, [])))
    assert len(events) == 1 and events[0]["status"] == "error"
    assert tracked.layout.plan_uri in events[0]["message"]
    assert "prepare task writes it" in events[0]["message"]


def test_a_bad_plan_is_an_error_event(tracked: TrackedRun) -> None:
    doc = _plan_doc(dt.datetime(2026, 12, 6, 18, tzinfo=dt.UTC))
    doc["deadline"] = "sunday evening"
    write_json(tracked.layout.plan_uri, doc)
    [event] = _collect(_trigger(tracked, ScriptedCounts(tracked, [])))
    assert event["status"] == "error" and "deadline: is not an ISO 8601 date-time" in event["message"]


def test_passes_that_keep_failing_end_in_an_error_event(tracked: TrackedRun) -> None:
    write_json(tracked.layout.plan_uri, _plan_doc(dt.datetime.now(dt.UTC) + dt.timedelta(hours=3)))
    broken = ConnectionError("execution API unreachable")
    # One failure is retried; three in a row give up.
    recovers = ScriptedCounts(tracked, [broken, {"runs_finished": 3, "phases": DONE}])
    assert [e["status"] for e in _collect(_trigger(tracked, recovers))] == ["done"]
    gives_up = ScriptedCounts(tracked, [broken])
    [event] = _collect(_trigger(tracked, gives_up, max_failed_passes=3))
    assert event == {
        "status": "error",
        "message": "3 passes in a row failed; last: ConnectionError: execution API unreachable",
    }
    assert gives_up.index == 2


def test_serialize_round_trip(tracked: TrackedRun) -> None:
    from airflow.models.trigger import Trigger
    from airflow.sdk._shared.module_loading import import_string

    trigger = DeadlineTrackerTrigger(
        run=tracked.to_json(),
        phases=PHASES,
        interval_seconds=300,
        gpu_capacity=24,
        act_above_gpus=30,
        action="avsim_gpu_spot 8 -> 12",
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "avsim.deadline.trigger.DeadlineTrackerTrigger"
    assert json.loads(json.dumps(kwargs)) == kwargs
    rebuilt = import_string(classpath)(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)
    # As the triggerer stores and reloads it (encrypted kwargs in the trigger table's row).
    row = Trigger.from_object(trigger)
    assert row.classpath == classpath and row.kwargs == kwargs


# ------------------------------------------------------------------------------------------ metrics


class StatsdListener:
    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])

    def lines(self, want: set[str], timeout: float = 10.0) -> list[str]:
        got: list[str] = []
        end = time.monotonic() + timeout
        while not all(any(w in line for line in got) for w in want) and time.monotonic() < end:
            try:
                data, _ = self.sock.recvfrom(65535)
            except TimeoutError:
                continue
            got.extend(line for line in data.decode().splitlines() if ".avsim." in line)
        return got


@pytest.fixture
def statsd(monkeypatch: pytest.MonkeyPatch) -> Iterator[StatsdListener]:
    from airflow.sdk._shared.observability.metrics import stats
    from airflow.sdk.observability.metrics import stats_utils

    listener = StatsdListener()
    for k, v in {
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(listener.port),
        "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
    }.items():
        monkeypatch.setenv(k, v)
    saved = (stats._factory, stats._backend, stats._export_legacy_names)
    stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=True)
    try:
        yield listener
    finally:
        stats._factory, stats._backend, stats._export_legacy_names = saved
        listener.sock.close()


def test_a_late_pass_emits_lateness_and_gpus_needed(tracked: TrackedRun, statsd: StatsdListener) -> None:
    write_json(tracked.layout.plan_uri, _plan_doc(dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)))
    late = [{"runs_finished": 0, "phases": MIDWAY}]
    _collect(_trigger(tracked, ScriptedCounts(tracked, late), act_above_gpus=0))
    lines = statsd.lines({"avsim.deadline.seconds_late:", "avsim.capacity.gpus_needed:"})
    needed = [ln for ln in lines if ln.startswith("airflow.avsim.capacity.gpus_needed:")]
    late_by = [ln for ln in lines if ln.startswith("airflow.avsim.deadline.seconds_late:")]
    assert needed and needed[0].split(":")[1].split("|")[0] == "14"
    assert late_by and 2_000 < float(late_by[0].split(":")[1].split("|")[0]) < 2_800


def test_layout_of_the_documents(tracked: TrackedRun) -> None:
    assert tracked.layout == RunLayout(tracked.artifact_root, "avsim_weekly__manual_1")
    assert tracked.shard_run_ids == RUN_IDS
    assert TrackedRun.from_json(json.loads(json.dumps(tracked.to_json()))) == tracked


def test_phase_tasks_of_the_deployed_plan() -> None:
    from avsim.dagbuild.factory import load_plan
    from avsim.deadline.tracking import phase_tasks
    from avsim.settings import AvsimSettings

    plan = load_plan(Path(__file__).resolve().parents[3] / "dags" / "avsim_graphs.yaml", AvsimSettings())
    phases = phase_tasks(plan)
    assert phases["standard.evaluate"]["upstream"] == ["standard.simulate"]
    assert phases["standard.simulate"]["twin"] == "standard.simulate_on_demand"
    assert phases["standard.prepare"] == {"upstream": [], "twin": None}


def test_a_week_that_ends_between_passes_ends_tracking_without_waiting_the_interval(
    tracked: TrackedRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An hour between passes, but the week's end is seen at the next end check, and one last
    pass records it: the weekly run does not stay running for the rest of the interval."""
    from avsim.deadline import trigger as trigger_module

    monkeypatch.setattr(trigger_module, "END_CHECK_SECONDS", 0.01)
    write_json(tracked.layout.plan_uri, _plan_doc(dt.datetime.now(dt.UTC) + dt.timedelta(hours=3)))
    counts = ScriptedCounts(
        tracked,
        [
            {"runs_finished": 1, "phases": MIDWAY},  # first pass: tracking
            {"runs_finished": 2, "phases": MIDWAY},  # end check: not yet
            {"runs_finished": 3, "phases": DONE},  # end check: the week ended; then the last pass
        ],
    )
    trig = DeadlineTrackerTrigger(
        run=tracked.to_json(), phases=PHASES, interval_seconds=3600, min_wait_seconds=0
    )
    trig.counts = counts
    events = _collect(trig)
    assert [e["status"] for e in events] == ["done"]
    history = sorted(Path(tracked.layout.deadline_dir.removeprefix("file://"), "history").glob("*.json"))
    assert [json.loads(h.read_text())["status"] for h in history] == ["tracking", "done"]


def test_a_case_whose_spot_task_runs_again_beside_a_skipped_twin_is_not_finished(tracked: TrackedRun) -> None:
    """A repair reruns a spot task whose twin stays skipped: the twin's count alone would call the case
    finished, and the estimate would be optimistic during every repair."""
    from avsim.deadline.tracking import PhaseTasks, read_progress

    phases = {k: PhaseTasks.from_json(k, v) for k, v in PHASES.items()}
    repairing = {
        "phases": {"standard.simulate": PhaseProgress(finished=40)},
        "spot_finished": {"standard.simulate": 37},
    }
    counts = ScriptedCounts(tracked, [repairing])
    counts.index = 0
    assert read_progress(counts, tracked, phases)["standard.simulate"].finished == 37
