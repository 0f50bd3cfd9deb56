"""Every deferral of a Kubernetes phase is bounded, and a timed-out one is an infrastructure failure.

The operator is built as in ``tests/unit/kube/test_pod_spec_schemas.py`` (no API); the pod it would
have created is set by hand, and the ledger and the pod deletes are replaced by recorders.
"""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred
from kubernetes.client import models as k8s
from tests.support.kube_settings import KUBE

from avsim.artifacts import RunLayout
from avsim.attempt import PhaseAttempt, PhaseRuntime
from avsim.attempt.books import AttemptBooks
from avsim.contracts.case import CaseEntry
from avsim.kube import pods
from avsim.manifest.sample import sample_manifest
from avsim.manifest.validation import validate_manifest
from avsim.operators.kubernetes import DEFERRAL_MARGIN_SECONDS, KubernetesPhaseOperator
from avsim.operators.lifecycle import PhaseLifecycle
from avsim.phases.contract import Outcome
from avsim.phases.policy import Role

#: The trigger's event for attempt 2 of a phase whose pod passed.
PASSED_EVENT = {
    "status": "ended",
    "attempt": 2,
    "outcome": "passed",
    "exit_code": 0,
    "pod": "p",
    "namespace": "avsim",
}


def phase_spec(lease_seconds: float) -> tuple[Any, dict[str, Any]]:
    doc = sample_manifest(2, iso_week="2026-W49")
    doc["graphs"]["standard"]["phases"]["prepare"]["lease_seconds"] = lease_seconds
    m = validate_manifest(doc)
    return m, m.graphs["standard"].phases["prepare"].model_dump(mode="json", by_alias=True)


def operator(lease_seconds: float) -> tuple[KubernetesPhaseOperator, PhaseAttempt]:
    m, spec = phase_spec(lease_seconds)
    run = {"run_key": "avsim_weekly__x", "artifact_root": "file:///tmp/avsim-x", "image": m.run.build.image}
    case = {"case_id": m.cases[0].id, "seed": m.cases[0].seed}
    op = KubernetesPhaseOperator(
        task_id="standard.prepare", phase="prepare", case=case, run=run, role=Role.REGULAR, kube=KUBE
    )
    op.lifecycle = PhaseLifecycle.of(op)
    attempt = PhaseAttempt(
        layout=RunLayout(run["artifact_root"], run["run_key"]),
        case=CaseEntry.model_validate(case),
        phase="prepare",
        attempt=1,
        runtime=PhaseRuntime.from_spec(spec),
        build_id="b",
        image=run["image"],
        inputs={},
        node_class=op.lifecycle.args.node_class,
    )
    return op, attempt


@pytest.mark.parametrize("lease_seconds", [0, 300])
def test_the_deferral_has_a_timeout_whatever_the_lease(lease_seconds: float) -> None:
    op, attempt = operator(lease_seconds)
    name = pods.pod_name("avsim_weekly__x", attempt.case_id, "prepare", 1)
    op._attempt, op._started = attempt, dt.datetime.now(dt.UTC)
    op.pod = k8s.V1Pod(metadata=k8s.V1ObjectMeta(name=name, namespace="avsim"))
    with pytest.raises(TaskDeferred) as deferred:
        op.invoke_defer_method()
    bound = (
        KUBE.startup_timeout_seconds + attempt.runtime.timeout_seconds + 30 + pods.TERMINATING_BOUND_SECONDS
    )
    trigger: Any = deferred.value.trigger
    assert trigger.deadline_seconds == bound
    assert trigger.lease_seconds == lease_seconds
    assert deferred.value.timeout == dt.timedelta(seconds=bound + DEFERRAL_MARGIN_SECONDS)
    assert deferred.value.kwargs == {"inputs": attempt.inputs, "cache_key": attempt.cache_key}


def test_a_resumed_phase_rebuilds_its_attempt_without_reading_upstream_xcoms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The deferral carries the attempt's inputs and cache key: the resumed task (a new task process)
    rebuilds the attempt from them, so it makes no execution-API call for its upstream results; a
    deferral made without them (before this version) reads them again."""
    op, _ = operator(0)
    op.upstream_phases = {"prepare": ["standard.prepare"]}
    # The phase's spec from the run's snapshot (which the ledger would read).
    monkeypatch.setattr(AttemptBooks, "runtime_spec", lambda self: phase_spec(0)[1])
    monkeypatch.setattr(op, "_final", lambda result, ns, name: result)
    monkeypatch.setattr(
        PhaseLifecycle,
        "end_attempt",
        lambda self, context, a, result, started: {"attempt": a, "outcome": result.outcome.value},
    )
    monkeypatch.setattr(op, "_result", lambda context, result: result)
    pulled: list[str] = []
    upstream = {
        "case_id": "c",
        "phase": "prepare",
        "outcome": "passed",
        "attempt": 1,
        "output_uri": "file:///o/1",
        "cache_key": "k0",
    }
    ti = SimpleNamespace(
        map_index=0, xcom_pull=lambda task_ids, map_indexes: pulled.append(task_ids) or upstream
    )
    event = dict(PASSED_EVENT)
    inputs = {"prepare": "file:///o/1"}
    done = op.resume_execution(
        "phase_complete", {"event": event, "inputs": inputs, "cache_key": "k1"}, {"ti": ti}
    )
    assert pulled == [] and (done["attempt"].inputs, done["attempt"].cache_key) == (inputs, "k1")
    assert done["attempt"].attempt == 2
    again = op.resume_execution("phase_complete", {"event": event}, {"ti": ti})
    assert pulled == ["standard.prepare"] and again["attempt"].inputs == inputs


class TimedOutTI:
    """The task instance a timed-out deferral resumes in: its try, and the XComs it pushes."""

    task_id, map_index, max_tries = "standard.prepare", 0, 5

    def __init__(self, try_number: int) -> None:
        self.try_number = try_number
        self.pushed: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


def _claimed_by_tries(op: KubernetesPhaseOperator, attempt: PhaseAttempt, tries: list[int]) -> Any:
    """The phase's attempts claimed in a real ``file://`` ledger, one per try in ``tries``."""
    from avsim.ledger.records import AttemptRecord
    from avsim.ledger.store import Ledger

    ledger = Ledger(attempt.layout)
    for t in tries:
        ledger.claim_attempt(
            AttemptRecord(
                run_key=attempt.layout.run_key, case_id=attempt.case_id, phase="prepare", attempt=0,
                started_at="2026-12-01T10:00:00+00:00", ended_at="", exit_code=None, outcome=None,
                reason="", output_uri="", host="h", duration_seconds=0.0, state="started",
                try_number=t, task_id=op.task_id,
            )
        )  # fmt: skip
    return ledger


def _two_tries(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> tuple[Any, PhaseAttempt, Any, list[str]]:
    """The operator over a real ledger where tries 1 and 2 claimed attempts 1 and 2; the pods it
    deletes are recorded (the Kubernetes API is the boundary)."""
    op, attempt = operator(0)
    layout = RunLayout(f"file://{tmp_path}", "avsim_weekly__x")
    attempt = attempt.with_attempt(1, layout=layout)
    ledger = _claimed_by_tries(op, attempt, [1, 2])
    # The lifecycle the resumed task builds, over this ledger.
    monkeypatch.setattr(AttemptBooks, "layout", layout)
    monkeypatch.setattr(AttemptBooks, "ledger", ledger)
    monkeypatch.setattr(
        PhaseLifecycle, "attempt_for", lambda self, context, number=0: attempt.with_attempt(number)
    )
    deleted: list[str] = []
    monkeypatch.setattr(op, "_delete", lambda ns, name, grace=None: deleted.append(name))
    return op, attempt, ledger, deleted


def test_a_timed_out_deferral_ends_its_own_attempt_and_then_deletes_its_pod(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """The real ledger and service; the Kubernetes API (the pod deletes) is the recorded boundary."""
    from avsim.operators.exceptions import PhaseRetriable

    op, attempt, ledger, deleted = _two_tries(monkeypatch, tmp_path)
    with pytest.raises(PhaseRetriable, match="timed out"):
        op.resume_execution("__fail__", {"error": "Trigger timeout"}, {"ti": TimedOutTI(2)})
    assert deleted == [pods.pod_name("avsim_weekly__x", attempt.case_id, "prepare", 2)]
    [_, second] = ledger.attempts(attempt.case_id, "prepare")
    assert (second.state, second.outcome, second.detail) == ("ended", Outcome.INFRA_FAILED, "timeout")
    # Any other failure of the trigger stays Airflow's.
    from airflow.sdk.exceptions import TaskDeferralError

    with pytest.raises(TaskDeferralError):
        op.resume_execution("__fail__", {"error": "Trigger failure"}, {})


def test_a_timed_out_deferral_never_deletes_a_newer_tries_pod(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """Try 1 deferred on attempt 1 and timed out after try 2 took the phase over (attempt 2, its pod
    live): the fence refuses try 1's end, and attempt 2's pod is left alone."""
    from avsim.ledger.store import AttemptSuperseded

    op, attempt, ledger, deleted = _two_tries(monkeypatch, tmp_path)
    with pytest.raises(AttemptSuperseded):
        op.resume_execution("__fail__", {"error": "Trigger timeout"}, {"ti": TimedOutTI(1)})
    assert pods.pod_name("avsim_weekly__x", attempt.case_id, "prepare", 2) not in deleted
    assert deleted == []
    [_, second] = ledger.attempts(attempt.case_id, "prepare")
    assert second.state == "started"  # attempt 2 is its try's, untouched


def test_an_on_demand_twin_resumes_with_the_case_its_spot_task_handed_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The twin is built without a case or a run (it takes them from its spot task's hand-over XCom); a
    deferred twin resumes in a new task process, where it must take them again before it rebuilds its
    attempt."""
    from avsim.operators.lifecycle import HANDOVER_XCOM

    spot, attempt = operator(0)
    twin = KubernetesPhaseOperator(
        task_id="standard.simulate_on_demand",
        phase="simulate",
        case=None,
        run=None,
        role=Role.ON_DEMAND,
        gpus=1,
        kube=KUBE,
    )
    pulls: list[tuple[str, str, int]] = []

    def xcom_pull(task_ids: str, key: str, map_indexes: int) -> Any:
        pulls.append((task_ids, key, map_indexes))
        return {"case": dict(spot.case), "run": dict(spot.run)}

    context: Any = {"ti": SimpleNamespace(map_index=4, xcom_pull=xcom_pull)}
    seen: list[tuple[Any, Any]] = []

    def attempt_for(
        life: PhaseLifecycle, context: Any, number: int = 0, resolved: Any = None
    ) -> PhaseAttempt:
        seen.append((life.args.case, life.args.run))
        return attempt.with_attempt(number)

    monkeypatch.setattr(PhaseLifecycle, "attempt_for", attempt_for)
    monkeypatch.setattr(twin, "_final", lambda result, ns, name: result)
    monkeypatch.setattr(
        PhaseLifecycle,
        "end_attempt",
        lambda self, context, a, result, started: {"outcome": result.outcome.value},
    )
    monkeypatch.setattr(twin, "_result", lambda context, result: result)
    event = dict(PASSED_EVENT)
    assert twin.resume_execution("phase_complete", {"event": event}, context) == {"outcome": "passed"}
    assert pulls == [("standard.simulate", HANDOVER_XCOM, 4)]
    assert seen == [(spot.lifecycle.args.case, spot.lifecycle.args.run)]


def _lost_watch(
    monkeypatch: pytest.MonkeyPatch, read: Any, started: dt.datetime
) -> tuple[Any, list[str], list[Any]]:
    """A phase resumed on its trigger's ``error`` event (the watch kept failing), whose direct read of
    the pod is ``read``; the pods it deletes and the attempts it ends."""
    op, attempt = operator(0)
    monkeypatch.setattr(PhaseLifecycle, "attempt_for", lambda self, context, number, resolved=None: attempt)
    deleted: list[str] = []
    ended: list[Any] = []
    monkeypatch.setattr(op, "_delete", lambda ns, name, grace=None: deleted.append(name))
    monkeypatch.setattr(op, "_pass_commit", lambda context: None)
    monkeypatch.setattr(
        PhaseLifecycle, "end_attempt", lambda self, context, a, result, s: ended.append(result) or result
    )
    monkeypatch.setattr(op, "_result", lambda context, result: result)
    op.__dict__["pods_hook"] = SimpleNamespace(read_pod=read, log_tail=lambda *a: "")
    name = pods.pod_name("avsim_weekly__x", attempt.case_id, "prepare", 1)
    event = {
        "status": "error",
        "pod": name,
        "namespace": "avsim",
        "attempt": 1,
        "started_at": started.isoformat(),
        "message": "the watch of avsim keeps failing: connection refused",
    }
    return (lambda: op.phase_complete({"ti": SimpleNamespace(map_index=0)}, event)), deleted, ended


RUNNING_POD = {"metadata": {"name": "p"}, "status": {"phase": "Running"}}


def test_a_pod_still_running_after_the_watch_failed_is_watched_again_not_deleted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """test_faults: during a 120 s API freeze a phase's trigger gave up its watch; the resumed worker read
    the pod Running, ended the attempt watch_error and deleted the live pod. Now it waits again."""

    def unreachable(ns: str, name: str) -> Any:
        raise ConnectionError("the API server does not answer")

    for read in (lambda ns, name: RUNNING_POD, unreachable):
        resume, deleted, ended = _lost_watch(monkeypatch, read, dt.datetime.now(dt.UTC))
        with pytest.raises(TaskDeferred) as deferred:
            resume()
        trigger: Any = deferred.value.trigger
        name = pods.pod_name("avsim_weekly__x", operator(0)[1].case_id, "prepare", 1)
        assert (trigger.pod_name, trigger.attempt, trigger.namespace) == (name, 1, "avsim")
        assert deferred.value.method_name == "phase_complete"
        assert (deleted, ended) == ([], [])


def test_a_lost_watch_past_the_attempts_deadline_ends_it_watch_error(monkeypatch: pytest.MonkeyPatch) -> None:
    long_ago = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    resume, deleted, ended = _lost_watch(monkeypatch, lambda ns, name: RUNNING_POD, long_ago)
    result = resume()
    assert (result.outcome, result.detail) == (Outcome.INFRA_FAILED, "watch_error")
    assert len(deleted) == 1 and len(ended) == 1


def test_a_pod_that_ended_while_the_watch_failed_is_read_and_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    done = {
        "metadata": {"name": "p"},
        "status": {
            "phase": "Succeeded",
            "containerStatuses": [{"name": "base", "state": {"terminated": {"exitCode": 0}}}],
        },
    }
    resume, _, ended = _lost_watch(monkeypatch, lambda ns, name: done, dt.datetime.now(dt.UTC))
    assert resume().outcome is Outcome.PASSED and len(ended) == 1
