"""A Kubernetes phase's start, and its trigger's end of a passed attempt, against the loopback API.

A real prepared run on a ``file://`` ledger, the real operator and its hook talking HTTP to the
loopback Kubernetes API (:class:`tests.support.kube_api.FakeKubeAPI`, which counts the requests it
serves). The boundary: Airflow's task instance is a stand-in holding what the operator reads (try
number, identifying labels) and an XCom table that records every push, each of which would be an
execution-API call. The pods are real processes (``avsim-fakesim``, the phase's command) run by the
loopback API's kubelet; the trigger runs in an event loop here, as in a triggerer.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred
from tests.support.kube_api import FakeKubeAPI
from tests.support.kube_api.phases import phase_kube_api

from avsim.dagbuild import tasks
from avsim.dagbuild.factory import load_plan
from avsim.dagbuild.prepare import prepare_week
from avsim.kube import pods
from avsim.manifest.sample import sample_manifest
from avsim.operators.kubernetes import KubernetesPhaseOperator
from avsim.settings import AvsimSettings, KubernetesSettings

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "sims"


class PhaseTI:
    """The task instance's stand-in: identifying labels, try number, and the XComs pushed."""

    dag_id = "avsim_weekly_shard"
    task_id = "standard.prepare"
    run_id = "manual__w1"
    map_index = 0
    max_tries = 3

    def __init__(self, try_number: int) -> None:
        self.try_number = try_number
        self.start_date = dt.datetime.now(dt.UTC)
        self.pushed: list[str] = []

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed.append(key)


@pytest.fixture
def kube(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKubeAPI]:
    with phase_kube_api(tmp_path, monkeypatch, NAMESPACE) as api:
        yield api


@pytest.fixture
def shard_phase(tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the run descriptor, a case) of a prepared week."""
    settings = AvsimSettings(shard_size=4, artifact_root=f"file://{tmp_path / 'artifacts'}")
    plan = load_plan(ROOT / "dags" / "avsim_graphs.yaml", settings)
    path = tmp_path / "week.json"
    path.write_text(json.dumps(sample_manifest(2)))
    prepared = prepare_week(
        source=str(path), plan=plan, settings=settings, dag_id="avsim_weekly", run_id="w1"
    )
    loaded = tasks.load_shard(prepared["shards"][0]["conf"], plan)
    family = next(k for k, v in loaded.items() if k.startswith("cases_") and v)
    return prepared["run"], loaded[family][0]


def phase_op(run: dict[str, Any], case: dict[str, Any]) -> KubernetesPhaseOperator:
    """The case's prepare phase as its DAG file builds it (each task process, the resumed one too)."""
    return KubernetesPhaseOperator(
        task_id="standard.prepare",
        phase="prepare",
        case=case,
        run=run,
        kube=KubernetesSettings(conn_id="avsim_kube", namespace=NAMESPACE),
        retries=3,
    )


def context_of(ti: PhaseTI) -> dict[str, Any]:
    return {"ti": ti, "run_id": ti.run_id, "dag": type("Dag", (), {"dag_id": ti.dag_id})()}


def start_deferred(
    run: dict[str, Any], case: dict[str, Any], try_number: int
) -> tuple[PhaseTI, TaskDeferred]:
    """One try of the case's prepare phase up to its deferral: (the task instance, the deferral)."""
    op = phase_op(run, case)
    ti = PhaseTI(try_number)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context_of(ti))
    return ti, deferred.value


def start(run: dict[str, Any], case: dict[str, Any], try_number: int) -> tuple[PhaseTI, Any]:
    """One try of the case's prepare phase up to its deferral: (the task instance, the trigger)."""
    ti, deferred = start_deferred(run, case, try_number)
    return ti, deferred.trigger


def test_a_first_attempt_creates_its_pod_and_lease_and_defers_with_nothing_else(
    kube: FakeKubeAPI, shard_phase: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    """Attempt 1 has no earlier attempt's pod to look for, and pushes no XCom: the pod's name is the
    attempt's (the ledger's runner), so the stock operator's ``pod_name``/``pod_namespace`` are not sent."""
    run, case = shard_phase
    ti, trigger = start(run, case, try_number=1)
    name = pods.pod_name(run["run_key"], case["case_id"], "prepare", 1)
    assert (trigger.pod_name, trigger.namespace, trigger.attempt) == (name, NAMESPACE, 1)
    assert [p["metadata"]["name"] for p in kube.pods(NAMESPACE)] == [name]
    assert ti.pushed == []
    assert kube.call_count(verb="create", resource="pods") == 1
    assert kube.call_count(verb="create", resource="leases") == 1
    assert kube.call_count(verb="list") == 0, kube.calls()


def test_a_later_attempt_deletes_the_earlier_attempts_pod_first(
    kube: FakeKubeAPI, shard_phase: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    """A retry's attempt 2 lists the phase's pods and deletes attempt 1's before creating its own."""
    run, case = shard_phase
    start(run, case, try_number=1)
    kube.reset_calls()
    _, trigger = start(run, case, try_number=2)
    assert trigger.attempt == 2
    assert kube.call_count(verb="list", resource="pods") == 1
    assert kube.call_count(verb="delete", resource="pods") == 1
    first = pods.pod_name(run["run_key"], case["case_id"], "prepare", 1)
    assert first not in {
        p["metadata"]["name"] for p in kube.pods(NAMESPACE) if not p["metadata"].get("deletionTimestamp")
    }


# -- the trigger ends a passed attempt -------------------------------------------------------------
def fire(trigger: Any) -> Any:
    """The trigger's one event, run as the triggerer runs it (its shared watch closed after)."""
    from avsim.triggers.pod_watch import NamespaceWatch

    trigger.min_wait_seconds, trigger.check_interval = 0.0, 0.2

    async def main() -> Any:
        try:
            async for event in trigger.run():
                return event
            raise AssertionError("no event")
        finally:
            for w in list(NamespaceWatch._shared.values()):
                await w.close()
            NamespaceWatch._shared.clear()

    return asyncio.run(asyncio.wait_for(main(), 60))


def ledger_of(run: dict[str, Any]) -> Any:
    from avsim.contracts import RunDescriptor
    from avsim.ledger.store import Ledger

    return Ledger(RunDescriptor.model_validate(run).layout)


def live(kube: FakeKubeAPI, kind: str) -> list[str]:
    found = kube.pods(NAMESPACE) if kind == "pods" else kube.leases(NAMESPACE)
    return [o["metadata"]["name"] for o in found if not o["metadata"].get("deletionTimestamp")]


def test_a_passed_attempt_is_committed_by_its_trigger_which_ends_the_task(
    kube: FakeKubeAPI, shard_phase: tuple[dict[str, Any], dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pod passes: the trigger records and commits the attempt as the resumed phase would, deletes
    the pod and its Lease, and ends the task instance (TaskSuccessEvent) with the phase's result as its
    return value. Run again (its triggerer died before Airflow took the event; the pod is gone), it ends
    the task with the same commit and commits nothing again."""
    from airflow.triggers.base import TaskSuccessEvent

    from avsim.contracts import PhaseResult
    from avsim.phases.contract import Outcome

    monkeypatch.setattr("avsim.triggers.phase_pod.MISSING_GRACE_SECONDS", 1.0)  # the deleted pod, run again
    run, case = shard_phase
    _, trigger = start(run, case, try_number=1)
    assert trigger.commit is not None and trigger.commit["attempt"] == 1
    event = fire(trigger)
    assert isinstance(event, TaskSuccessEvent), event
    result = PhaseResult.model_validate(event.xcoms["return_value"])
    assert (result.phase, result.outcome, result.attempt) == ("prepare", Outcome.PASSED, 1)
    ledger = ledger_of(run)
    committed = ledger.outcome(case["case_id"], "prepare")
    assert committed is not None and committed.attempt == 1 and committed.output_uri == result.output_uri
    assert committed.cache_key and committed.cache_key == result.cache_key
    [attempt] = ledger.attempts(case["case_id"], "prepare")
    assert (attempt.state, attempt.outcome, attempt.try_number, attempt.runner) == (
        "ended",
        Outcome.PASSED,
        1,
        trigger.pod_name,
    )
    assert live(kube, "pods") == [] and live(kube, "leases") == []

    again = fire(type(trigger)(**trigger.serialize()[1]))
    assert isinstance(again, TaskSuccessEvent) and again.xcoms == event.xcoms
    assert ledger.outcome(case["case_id"], "prepare") == committed
    assert len(ledger.attempts(case["case_id"], "prepare")) == 1


def test_serialize_the_committing_trigger(
    kube: FakeKubeAPI, shard_phase: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    """The trigger a phase defers on carries its PassCommit as JSON, and comes back the same from its
    classpath and arguments (what the triggerer does with it)."""
    from airflow.sdk.module_loading import import_string

    from avsim.contracts import PassCommit

    run, case = shard_phase
    _, trigger = start(run, case, try_number=1)
    classpath, kwargs = trigger.serialize()
    assert classpath == "avsim.triggers.pass_commit.PassCommitTrigger"
    assert json.loads(json.dumps(kwargs)) == kwargs
    again = import_string(classpath)(**kwargs)
    assert again.serialize() == (classpath, kwargs)
    # A trigger a running deployment stored under the old classpath still loads, and is the same trigger.
    stored = import_string("avsim.operators.pass_commit.PassCommitTrigger")(**kwargs)
    assert stored.serialize() == (classpath, kwargs)
    plan = PassCommit.model_validate(kwargs["commit"])
    assert (plan.phase, plan.attempt, plan.try_number, plan.case["case_id"]) == (
        "prepare",
        1,
        1,
        case["case_id"],
    )


def test_an_evicted_attempt_resumes_in_a_worker_with_nothing_committed(
    kube: FakeKubeAPI, shard_phase: tuple[dict[str, Any], dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An evicted pod is the worker's to decide (retry, or hand over on spot nodes): the trigger fires
    the ordinary event and writes nothing."""
    from airflow.triggers.base import TaskSuccessEvent

    monkeypatch.setattr("avsim.triggers.phase_pod.MISSING_GRACE_SECONDS", 1.0)
    run, case = shard_phase
    _, trigger = start(run, case, try_number=1)
    kube.wait_for_pod(trigger.pod_name, NAMESPACE, phase="Running", timeout=30)
    kube.evict_via_api(NAMESPACE, trigger.pod_name, grace=0)
    event = fire(trigger)
    assert not isinstance(event, TaskSuccessEvent)
    # Evicted at once, the pod is gone before the trigger's watch sees it: it vanished, which for a CPU
    # phase is an infrastructure failure (for a spot GPU phase, a preemption).
    assert (event.payload["status"], event.payload["outcome"]) == ("ended", "infra_failed"), event.payload
    ledger = ledger_of(run)
    assert ledger.outcome(case["case_id"], "prepare") is None
    assert [a.state for a in ledger.attempts(case["case_id"], "prepare")] == ["started"]


def test_a_commit_the_trigger_cannot_make_leaves_the_attempt_to_the_worker(
    kube: FakeKubeAPI, shard_phase: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    """The artifact store fails the trigger (the run's snapshot is unreadable): it fires the ordinary
    event, the pod left for the resumed phase to read and delete."""
    from airflow.triggers.base import TaskSuccessEvent

    from avsim.contracts import RunDescriptor

    run, case = shard_phase
    _, trigger = start(run, case, try_number=1)
    head = Path(RunDescriptor.model_validate(run).layout.head_uri.removeprefix("file://"))
    head.rename(head.with_suffix(".moved"))
    event = fire(trigger)
    assert not isinstance(event, TaskSuccessEvent)
    assert (event.payload["status"], event.payload["outcome"]) == ("ended", "passed"), event.payload
    assert trigger.pod_name in live(kube, "pods")
    assert ledger_of(run).outcome(case["case_id"], "prepare") is None


# -- issue 31 items 6 and 7: a pass without outputs, and a commit found after the triggerer died ------------
def test_a_pod_that_passed_without_its_outputs_is_an_infrastructure_failure_never_committed(
    kube: FakeKubeAPI, shard_phase: tuple[dict[str, Any], dict[str, Any]], tmp_path: Path
) -> None:
    """The fake simulator exits 0 but its write never reached the artifact store (``no_output``). The
    trigger does not commit it (it fires the ordinary event), and the resumed phase classes it
    ``infra_failed``/``missing_output``, retried within the infrastructure budget: nothing committed,
    nothing cached, so no clear or rerun can ever reuse it."""
    from airflow.triggers.base import TaskSuccessEvent

    from avsim.operators import exceptions as exc
    from avsim.phases.contract import Outcome

    MISSING_OUTPUT = "missing_output"  # avsim.phases.contract.MISSING_OUTPUT

    run, case = shard_phase
    lost = {**case, "parameters": {**case["parameters"], "fakesim": {"prepare": "no_output"}}}
    ti, deferred = start_deferred(run, lost, try_number=1)
    event = fire(deferred.trigger)
    assert not isinstance(event, TaskSuccessEvent)
    assert (event.payload["status"], event.payload["outcome"]) == ("ended", "passed"), event.payload
    with pytest.raises(exc.PhaseInfrastructureError, match=MISSING_OUTPUT) as raised:
        phase_op(run, lost).resume_execution(
            "phase_complete", {"event": event.payload, **(deferred.kwargs or {})}, context_of(ti)
        )
    assert raised.value.retry_delay is not None
    ledger = ledger_of(run)
    assert ledger.outcome(case["case_id"], "prepare") is None
    [attempt] = ledger.attempts(case["case_id"], "prepare")
    assert (attempt.outcome, attempt.detail) == (Outcome.INFRA_FAILED, MISSING_OUTPUT)
    assert list((tmp_path / "artifacts").glob("cache/*.json")) == []
    assert live(kube, "pods") == []


def _committed_by_the_trigger(
    kube: FakeKubeAPI, run: dict[str, Any], case: dict[str, Any]
) -> tuple[PhaseTI, TaskDeferred, Any]:
    from airflow.triggers.base import TaskSuccessEvent

    ti, deferred = start_deferred(run, case, try_number=1)
    event = fire(deferred.trigger)
    assert isinstance(event, TaskSuccessEvent), event
    return ti, deferred, event.xcoms["return_value"]


def _the_pass_stands(run: dict[str, Any], case: dict[str, Any], value: Any) -> None:
    from avsim.contracts import RunDescriptor
    from avsim.ledger.breaker import Breaker, image_digest
    from avsim.phases.contract import Outcome

    ledger = ledger_of(run)
    committed = ledger.outcome(case["case_id"], "prepare")
    assert committed is not None and committed.attempt == value["attempt"] == 1
    [attempt] = ledger.attempts(case["case_id"], "prepare")
    assert (attempt.outcome, attempt.detail) == (Outcome.PASSED, "")
    descriptor = RunDescriptor.model_validate(run)
    breaker = Breaker(descriptor.layout.root, image_digest(descriptor.image)).state()
    assert breaker.failures == 0  # no false evidence against the build


def test_a_deferral_timeout_after_the_trigger_committed_returns_the_commit(
    kube: FakeKubeAPI, shard_phase: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    """The trigger committed the pass, then its triggerer died before Airflow took the event, and
    Airflow's deferral timeout resumed the task: it returns the committed result and records no
    ``infra_failed``/``timeout`` over the pass."""
    from airflow.sdk.bases.operator import TRIGGER_FAIL_REPR, TriggerFailureReason

    run, case = shard_phase
    ti, _, value = _committed_by_the_trigger(kube, run, case)
    out = phase_op(run, case).resume_execution(
        TRIGGER_FAIL_REPR, {"error": TriggerFailureReason.TRIGGER_TIMEOUT}, context_of(ti)
    )
    assert out == value
    _the_pass_stands(run, case, value)


def test_a_resume_after_a_triggerer_restart_returns_the_commit(
    kube: FakeKubeAPI, shard_phase: tuple[dict[str, Any], dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trigger committed the pass and deleted the pod, then its triggerer died. The restarted trigger
    (here the plain pod trigger, as a phase with pod callbacks defers on) finds the pod gone and fires
    ``vanished``; the resumed phase returns the committed result instead of recording an
    infrastructure failure over it."""
    from avsim.triggers.phase_pod import PhasePodTrigger

    monkeypatch.setattr("avsim.triggers.phase_pod.MISSING_GRACE_SECONDS", 1.0)
    run, case = shard_phase
    ti, deferred, value = _committed_by_the_trigger(kube, run, case)
    kwargs = {k: v for k, v in deferred.trigger.serialize()[1].items() if k != "commit"}
    event = fire(PhasePodTrigger(**kwargs))
    assert (event.payload["outcome"], event.payload["detail"]) == ("infra_failed", "vanished"), event.payload
    out = phase_op(run, case).resume_execution(
        "phase_complete", {"event": event.payload, **(deferred.kwargs or {})}, context_of(ti)
    )
    assert out == value
    _the_pass_stands(run, case, value)
