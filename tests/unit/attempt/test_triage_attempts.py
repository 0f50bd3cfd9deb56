"""A triage rerun's attempts (:mod:`avsim.triage`): its fresh phases launch whatever the cache holds,
and a triage run stores nothing in the cache and gives the build's breaker no evidence.

The boundary is the one of ``test_service.py``: the real service over a prepared ``file://`` week;
the task side and the meter are recorders.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from tests.support.lifecycle import prepared_week, wrote_result

from avsim.artifacts import RunLayout
from avsim.attempt.args import PhaseArgs, TryView
from avsim.attempt.service import AttemptService, ResolvedInputs
from avsim.attempt.steps import Done, Launch
from avsim.phases.contract import AttemptResult, Outcome

NO_INPUTS = ResolvedInputs({})


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *a: self.seen.append((name, a))


def _service(run: dict[str, Any], case: dict[str, Any]) -> AttemptService:
    args = PhaseArgs.of(phase="prepare", case=case, run=run, task_id="standard.prepare", retries=2)
    return AttemptService(args, meter=Recorder())


def _copy_head(week_run: dict[str, Any], run: dict[str, Any]) -> None:
    src = RunLayout(week_run["artifact_root"], week_run["run_key"]).head_uri.removeprefix("file://")
    dst = RunLayout(run["artifact_root"], run["run_key"]).head_uri.removeprefix("file://")
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    Path(dst).write_text(Path(src).read_text())


def _ended(svc: AttemptService, outcome: Outcome) -> Any:
    tv = TryView(1, 2, 0)
    begun = svc.begin(tv, NO_INPUTS, Recorder())
    if not isinstance(begun, Launch):
        return begun
    if outcome.produced_output:
        wrote_result(begun.attempt)
    return svc.end(
        tv,
        begun.attempt,
        AttemptResult(outcome, 0 if outcome is Outcome.PASSED else 1),
        dt.datetime.now(dt.UTC),
        Recorder(),
    )


@pytest.fixture
def week(tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    run, case, _ = prepared_week(tmp_path)
    return run, case


def test_a_fresh_phase_launches_though_the_cache_holds_its_result(
    week: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    run, case = week
    first = _ended(_service(run, case), Outcome.PASSED)
    assert isinstance(first, Done)
    rerun = {**run, "run_key": run["run_key"] + "__triage_1_this_1", "triage_of": run["run_key"]}
    _copy_head(run, rerun)
    reused = _service(rerun, case).begin(TryView(1, 2, 0), NO_INPUTS, Recorder())
    assert isinstance(reused, Done) and reused.result.reused  # not fresh: the cached result is reused
    again = {**rerun, "run_key": rerun["run_key"] + "b"}
    _copy_head(run, again)
    fresh = _service(again, {**case, "fresh_phases": ["prepare"]}).begin(
        TryView(1, 2, 0), NO_INPUTS, Recorder()
    )
    assert isinstance(fresh, Launch)


def test_a_triage_run_stores_no_result_and_feeds_no_breaker(
    week: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    run, case = week
    rerun = {**run, "run_key": run["run_key"] + "__triage_1_this_1", "triage_of": run["run_key"]}
    _copy_head(run, rerun)
    svc = _service(rerun, {**case, "fresh_phases": ["prepare"]})
    done = _ended(svc, Outcome.PASSED)
    assert isinstance(done, Done) and done.result.cache_key
    assert svc.books.cache.lookup(done.result.cache_key) is None
    crashed = _service({**rerun, "run_key": rerun["run_key"] + "b"}, {**case, "fresh_phases": ["prepare"]})
    _copy_head(run, {**rerun, "run_key": rerun["run_key"] + "b"})
    _ended(crashed, Outcome.INFRA_FAILED)
    assert svc.books.breaker.state().finished == 0  # neither the pass nor the crash was counted
    # The same pass in the week itself is cached and counted.
    week_svc = _service(run, case)
    assert isinstance(_ended(week_svc, Outcome.PASSED), Done)
    assert week_svc.books.breaker.state().finished == 1
