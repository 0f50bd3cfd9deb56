"""The end of an attempt is fenced: only the attempt that still owns its phase records its end, counts it
in the metrics and the build's breaker, and commits it; a pass whose declared outputs are missing is
never committed nor cached (issue 31, items 5 and 6).

The same real prepared run on a ``file://`` ledger as ``test_lifecycle.py``, with a real breaker
and cache. The trigger's side is :mod:`avsim.triggers.pass_commit` as ``PassCommitTrigger.end_here``
calls it. The boundary: Airflow's task instance is ``tests.support.lifecycle``'s stand-in, and the
stats backend is a recorder (``avsim.metrics._emit``), since a StatsD client would send the counts
nowhere we can read.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from tests.support.lifecycle import Phase, TaskInstance, Week, phase_task, prepared_week

from avsim import metrics
from avsim.attempt import PhaseAttempt
from avsim.contracts import PassCommit
from avsim.errors import AvsimError
from avsim.ledger.records import AttemptRecord, OutcomeRecord
from avsim.operators import exceptions as exc
from avsim.phases.contract import RESULT_FILE, AttemptResult, Outcome
from avsim.phases.policy import Role
from avsim.triggers.pass_commit import commit_passed

PASSED = AttemptResult(Outcome.PASSED, 0, "", "", "pod-1")


@pytest.fixture
def week(tmp_path: Path) -> Week:
    """A prepared week on a file:// ledger: (run descriptor, a case, the ledger)."""
    return prepared_week(tmp_path)


def write_outputs(attempt: PhaseAttempt, *, artifacts: tuple[str, ...] = ("trace.json",)) -> None:
    """What a phase that honours the contract leaves under its OUTPUT_URI."""
    out = Path(attempt.output_uri.removeprefix("file://"))
    out.mkdir(parents=True, exist_ok=True)
    for name in artifacts:
        (out / name).write_text("{}")
    doc = {"outcome": "passed", "metrics": {"m": 1}, "artifacts": list(artifacts)}
    (out / RESULT_FILE).write_text(json.dumps(doc))


@pytest.fixture
def emitted(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[object, ...], float]]:
    seen: list[tuple[str, tuple[object, ...], float]] = []
    monkeypatch.setattr(
        metrics, "_emit", lambda kind, name, dotted, value, tags: seen.append((name, dotted, value))
    )
    return seen


def begin(task: Phase, try_number: int) -> tuple[TaskInstance, PhaseAttempt]:
    ti = TaskInstance(task.task_id, try_number=try_number, max_tries=task.retries)
    attempt = task.lifecycle.begin_attempt({"ti": ti})
    assert isinstance(attempt, PhaseAttempt), attempt
    return ti, attempt


def plan_of(task: Phase, ti: TaskInstance, attempt: PhaseAttempt) -> PassCommit:
    return task.lifecycle.pass_commit({"ti": ti}, attempt, dt.datetime.now(dt.UTC) - dt.timedelta(seconds=10))


def gpu_seconds(seen: list[tuple[str, tuple[object, ...], float]]) -> list[float]:
    return [value for name, _, value in seen if name == metrics.GPU_SECONDS]


# -- item 5: side effects after the fence ----------------------------------------------------------------
def test_two_triggers_committing_one_passed_attempt_count_it_once(week: Any, emitted: list[Any]) -> None:
    """HA failover: two triggerers run the same trigger, and both see the pod pass. The attempt is
    recorded, counted in GPU-seconds and in the build's breaker window once, and both end the task with
    the same committed result."""
    task = phase_task(week, "simulate", Role.SPOT, 1)
    task.inputs = {"prepare": "file:///upstream/prepare/attempt-1"}  # its upstream's committed output
    ti, attempt = begin(task, 1)
    assert attempt.runtime.gpus >= 1
    write_outputs(attempt)
    plan = plan_of(task, ti, attempt)
    first = commit_passed(plan, PASSED)
    second = commit_passed(plan, PASSED)
    assert first == second and (first["outcome"], first["attempt"]) == ("passed", 1)
    assert task.lifecycle.service.books.breaker.state().finished == 1
    assert len(gpu_seconds(emitted)) == 1
    [rec] = week[2].attempts(week[1]["case_id"], "simulate")
    assert (rec.state, rec.outcome) == ("ended", Outcome.PASSED)


def test_a_stale_trigger_after_a_newer_try_leaves_the_abandoned_record_and_the_breaker_alone(
    week: Any, emitted: list[Any]
) -> None:
    """Try 1's worker was lost; try 2 recorded its attempt as abandoned and claimed attempt 2. Try 1's
    trigger then sees its pod pass: it must not overwrite the abandoned record, feed the breaker or
    count GPU-seconds, and it commits nothing (its end is handed to a worker, which Airflow refuses)."""
    task = phase_task(week, "prepare", Role.SPOT, 1)
    ti1, attempt1 = begin(task, 1)
    write_outputs(attempt1)
    stale = plan_of(task, ti1, attempt1)
    _, attempt2 = begin(task, 2)
    assert attempt2.attempt == 2
    with pytest.raises(AvsimError, match="attempt 2 is the current one") as raised:
        commit_passed(stale, PASSED)
    assert type(raised.value).__name__ == "AttemptSuperseded"
    case_id = week[1]["case_id"]
    first = week[2].attempts(case_id, "prepare")[0]
    assert (first.outcome, first.detail) == (Outcome.INFRA_FAILED, "abandoned")
    assert week[2].outcome(case_id, "prepare") is None
    assert task.lifecycle.service.books.breaker.state().finished == 0 and gpu_seconds(emitted) == []


def test_a_stale_worker_after_a_newer_try_records_nothing(week: Any, emitted: list[Any]) -> None:
    """The worker's side takes the same fence: a zombie try's failure does not overwrite the record a
    newer try wrote, nor count against the build."""
    task = phase_task(week, "prepare", Role.REGULAR, 0)
    ti1, attempt1 = begin(task, 1)
    begin(task, 2)
    with pytest.raises(AvsimError, match="attempt 2 is the current one"):
        task.lifecycle.end_attempt(
            {"ti": ti1},
            attempt1,
            AttemptResult(Outcome.INFRA_FAILED, 1, "segfault", "crash"),
            dt.datetime.now(dt.UTC),
        )
    first = week[2].attempts(week[1]["case_id"], "prepare")[0]
    assert first.detail == "abandoned"
    assert task.lifecycle.service.books.breaker.state().finished == 0
    assert not [e for e in emitted if e[0] == metrics.PHASE_OUTCOME]


def test_a_worker_resumed_after_its_trigger_committed_returns_the_commit(
    week: Any, emitted: list[Any]
) -> None:
    """The trigger committed the pass, then its triggerer died; the restarted trigger found the pod gone
    and the phase resumed in a worker with a vanished pod. The worker returns the committed result and
    records no infrastructure failure over the pass (no false evidence against the build)."""
    task = phase_task(week, "prepare", Role.REGULAR, 0)
    ti, attempt = begin(task, 1)
    write_outputs(attempt)
    committed = commit_passed(plan_of(task, ti, attempt), PASSED)
    vanished = AttemptResult(Outcome.INFRA_FAILED, None, "pod gone", "vanished", "pod-1")
    assert task.lifecycle.end_attempt({"ti": ti}, attempt, vanished, dt.datetime.now(dt.UTC)) == committed
    [rec] = week[2].attempts(week[1]["case_id"], "prepare")
    assert rec.outcome is Outcome.PASSED
    state = task.lifecycle.service.books.breaker.state()
    assert (state.finished, state.failures) == (1, 0)


def _rec(
    attempt: int, *, state: str = "started", outcome: Outcome | None = None, detail: str = ""
) -> AttemptRecord:
    return AttemptRecord(
        run_key="rk",
        case_id="c",
        phase="p",
        attempt=attempt,
        started_at="",
        ended_at="",
        exit_code=None,
        outcome=outcome,
        reason="",
        output_uri="",
        host="h",
        duration_seconds=0.0,
        state=state,
        detail=detail,
    )


def _committed(attempt: int, outcome: Outcome) -> OutcomeRecord:
    return OutcomeRecord(
        run_key="rk",
        case_id="c",
        phase="p",
        attempt=attempt,
        outcome=outcome,
        output_uri="u",
        committed_at="",
    )


@pytest.mark.parametrize(
    ("current", "existing", "committed", "expected"),
    [
        (1, _rec(1), None, "owned"),
        (None, None, None, "owned"),
        (1, _rec(1), _committed(1, Outcome.INFRA_FAILED), "owned"),  # a committed failure: replaced later
        (1, _rec(1, state="ended", outcome=Outcome.PASSED), _committed(1, Outcome.PASSED), "committed"),
        (2, _rec(1, state="ended", outcome=Outcome.PASSED), _committed(1, Outcome.PASSED), "committed"),
        (2, _rec(1, state="ended", outcome=Outcome.INFRA_FAILED, detail="abandoned"), None, "superseded"),
        (2, _rec(1), None, "superseded"),
        (1, _rec(1, state="ended", outcome=Outcome.INFRA_FAILED, detail="abandoned"), None, "superseded"),
        (1, _rec(1, state="ended", outcome=Outcome.PASSED), None, "recorded"),
        (1, _rec(1, state="ended", outcome=Outcome.PREEMPTED), None, "superseded"),
    ],
)
def test_the_fence_as_a_table(
    current: int | None, existing: AttemptRecord | None, committed: OutcomeRecord | None, expected: str
) -> None:
    from avsim.ledger.records import Standing, standing

    ending = _rec(1, state="ended", outcome=Outcome.PASSED)
    assert standing(ending, current=current, existing=existing, committed=committed) is Standing(expected)


# -- item 6: a pass must have written what it declares ---------------------------------------------------
@pytest.mark.parametrize("lost", ["result", "artifact"])
def test_a_pass_without_its_declared_outputs_is_an_infrastructure_failure_never_cached(
    week: Any, lost: str
) -> None:
    task = phase_task(week, "prepare", Role.REGULAR, 0)
    ti, attempt = begin(task, 1)
    if lost == "artifact":  # result.json lists a file the phase never wrote
        write_outputs(attempt)
        Path(attempt.output_uri.removeprefix("file://"), "trace.json").unlink()
    with pytest.raises(exc.PhaseInfrastructureError, match="missing_output") as raised:
        task.lifecycle.end_attempt({"ti": ti}, attempt, PASSED, dt.datetime.now(dt.UTC))
    assert raised.value.retry_delay is not None  # retried within the infrastructure budget
    case_id = week[1]["case_id"]
    [rec] = week[2].attempts(case_id, "prepare")
    assert (rec.outcome, rec.detail) == (Outcome.INFRA_FAILED, "missing_output")
    assert week[2].outcome(case_id, "prepare") is None
    assert (
        list(Path(task.lifecycle.service.books.layout.root.removeprefix("file://"), "cache").glob("*.json"))
        == []
    )
    # The retry that writes its outputs commits and is cached.
    ti2, attempt2 = begin(task, 2)
    write_outputs(attempt2)
    out = task.lifecycle.end_attempt({"ti": ti2}, attempt2, PASSED, dt.datetime.now(dt.UTC))
    assert (out["outcome"], out["attempt"]) == ("passed", 2)
    assert (
        len(
            list(
                Path(task.lifecycle.service.books.layout.root.removeprefix("file://"), "cache").glob("*.json")
            )
        )
        == 1
    )


def test_the_trigger_leaves_a_pass_without_outputs_to_the_worker(week: Any) -> None:
    """The trigger commits passes only: one with missing outputs has a decision in it (retry), so it is
    handed to the worker with nothing recorded."""
    task = phase_task(week, "prepare", Role.REGULAR, 0)
    ti, attempt = begin(task, 1)
    with pytest.raises(AvsimError, match=f"missing_output.*{RESULT_FILE}"):
        commit_passed(plan_of(task, ti, attempt), PASSED)
    [rec] = week[2].attempts(week[1]["case_id"], "prepare")
    assert rec.state == "started" and week[2].outcome(week[1]["case_id"], "prepare") is None


def test_a_local_phase_that_passed_without_its_outputs_is_retried_not_committed(week: Any) -> None:
    """The local backend end to end: a real ``LocalPhaseOperator`` runs the fake simulator, which exits 0
    on attempt 1 without writing anything (``no_output_once``, a lost write). That try fails as an
    infrastructure failure (``missing_output``) with nothing committed or cached; the next try writes its
    outputs and commits."""
    from avsim.operators.phase import LocalPhaseOperator

    run, case, ledger = week
    lost = {**case, "parameters": {**case.get("parameters", {}), "fakesim": {"prepare": "no_output_once"}}}
    op = LocalPhaseOperator(task_id="standard.prepare", phase="prepare", case=lost, run=run, retries=3)
    ti = TaskInstance(op.task_id, try_number=1, max_tries=3)
    with pytest.raises(exc.PhaseInfrastructureError, match=r"missing_output.*result\.json"):
        op.execute({"ti": ti})
    [rec] = ledger.attempts(case["case_id"], "prepare")
    assert (rec.outcome, rec.detail, rec.exit_code) == (Outcome.INFRA_FAILED, "missing_output", 0)
    assert ledger.outcome(case["case_id"], "prepare") is None
    cache = Path(op.lifecycle.service.books.layout.root.removeprefix("file://"), "cache")
    assert list(cache.glob("*.json")) == []
    ti.try_number = 2
    out = op.execute({"ti": ti})
    assert (out["outcome"], out["attempt"]) == ("passed", 2)
    assert len(list(cache.glob("*.json"))) == 1


def _trigger_commits_after_the_next_list(task: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Try 1 of ``task`` begins and defers; the next list of the phase's attempts (a newer try's) is
    followed at once by try 1's trigger really committing its pass. Returns [that commit's result]
    once it happened."""
    ti1, attempt1 = begin(task, 1)
    write_outputs(attempt1)
    plan = plan_of(task, ti1, attempt1)
    listed = task.lifecycle.service.books.ledger.attempts
    raced: list[Any] = []

    def list_then_the_trigger_commits(case_id: str, phase: str) -> list[AttemptRecord]:
        found = listed(case_id, phase)
        if not raced:
            raced.append(commit_passed(plan, PASSED))
        return found

    monkeypatch.setattr(task.lifecycle.service.books.ledger, "attempts", list_then_the_trigger_commits)
    return raced


def test_settling_an_earlier_tries_attempt_leaves_a_pass_its_trigger_recorded_meanwhile(
    week: Any, emitted: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The begin side of the fence. Try 1 deferred; try 2 begins, lists the phase's attempts and finds
    attempt 1 still ``started``. Between that list and its write, try 1's trigger sees the pod pass and
    records and commits it. Try 2 must not overwrite the pass with ``abandoned``, and it counts attempt
    1 in the round's history as passed. The interleaving is forced at the ledger's list (the trigger's
    real commit runs right after try 2's read returns); everything else is the real ledger."""
    task = phase_task(week, "prepare", Role.REGULAR, 0)
    raced = _trigger_commits_after_the_next_list(task, monkeypatch)
    ti2 = TaskInstance(task.task_id, try_number=2, max_tries=task.retries)
    history = task.lifecycle.service.settle_abandoned(
        task.lifecycle.try_view(ti2), task.lifecycle.try_view(ti2).round_start(task.retries)
    )
    monkeypatch.undo()

    case_id = week[1]["case_id"]
    assert raced and raced[0]["outcome"] == "passed"
    [first] = week[2].attempts(case_id, "prepare")
    assert (first.state, first.outcome, first.detail) == ("ended", Outcome.PASSED, ""), first
    committed = week[2].outcome(case_id, "prepare")
    assert committed is not None and (committed.attempt, committed.outcome) == (1, Outcome.PASSED)
    assert history == [Outcome.PASSED]
    assert (
        task.lifecycle.service.books.breaker.state().finished == 1
    )  # the trigger's pass, counted once; no loss over it


def test_a_try_that_settles_a_pass_committed_meanwhile_launches_nothing(
    week: Any, emitted: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same race, through the whole begin: try 2 found no commit, then, while it settled attempt 1,
    try 1's trigger committed its pass. Try 2 returns that result instead of claiming attempt 2."""
    task = phase_task(week, "prepare", Role.REGULAR, 0)
    raced = _trigger_commits_after_the_next_list(task, monkeypatch)
    ti2 = TaskInstance(task.task_id, try_number=2, max_tries=task.retries)
    assert task.lifecycle.begin_attempt({"ti": ti2}) == raced[0]
    assert (
        task.lifecycle.service.books.ledger.current_attempt(week[1]["case_id"], "prepare") == 1
    )  # no attempt 2 claimed
