"""A user's kill of a deferred Kubernetes phase, against the loopback Kubernetes API.

The phase starts through the real operator (``KubernetesPhaseOperator.execute`` up to its deferral:
the attempt claimed in a ``file://`` ledger, its pod and Lease created over HTTP, the pod a real
process run by the loopback API's kubelet). Its trigger is then rebuilt from its serialized form and
run by Airflow 3.3.2's own ``TriggerRunner`` (``run_trigger``), and killed the way the triggerer
kills it when a user marks the task failed or success, or clears it: the trigger's id is queued on
``to_cancel`` and ``cancel_triggers`` cancels its task with the user-action message, after which
``run_trigger`` calls ``on_kill``. A triggerer that shuts down cancels without that message.

The boundary: the triggerer's supervisor, which answers the trigger's ``GetTaskStates`` request from
the metadata database, is a stand-in that answers with the state the scenario puts the task instance
in (``failed`` after a mark-failed; ``deferred`` when the trigger was handed to another triggerer).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.kube_api import FakeKubeAPI
from tests.support.kube_api.phases import phase_kube_api
from tests.support.kube_phase_start import (
    DAG_ID,
    MAP_INDEX,
    NAMESPACE,
    RUN_ID,
    TASK_ID,
    ledger_of,
    names,
    next_try_settles_the_killed_attempt,
    prepared_week,
    running,
    start_phase,
)

from avsim.kube import pod_spec
from avsim.triggers.pod_watch import NamespaceWatch


class Supervisor:
    """The triggerer's supervisor as a trigger's comms reach it: it answers ``GetTaskStates`` (from the
    metadata database in a triggerer; here with the state the scenario set) and records the question."""

    def __init__(self, state: str) -> None:
        self.state = state
        self.asked: list[Any] = []

    def send(self, msg: Any) -> Any:
        from airflow.sdk.execution_time.comms import GetTaskStates, TaskStatesResult

        assert isinstance(msg, GetTaskStates), msg
        self.asked.append(msg)
        [task_id], [run_id] = msg.task_ids or [], msg.run_ids or []
        # The execution API's key: the task id, with _<map index> for a mapped task instance.
        key = task_id if msg.map_index is None or msg.map_index < 0 else f"{task_id}_{msg.map_index}"
        return TaskStatesResult(task_states={run_id: {key: self.state}})


class Triggerer:
    """Airflow's ``TriggerRunner`` in this event loop: its own ``run_trigger`` runs the trigger, its own
    ``cancel_triggers`` delivers a user's kill."""

    def __init__(self) -> None:
        from airflow.jobs.triggerer_job_runner import TriggerRunner

        self.runner = TriggerRunner()

    def start(self, trigger: Any, try_number: int = 1, trigger_id: int = 1) -> Any:
        """What ``TriggerRunner.create_triggers`` does with a trigger row: rebuild the trigger from its
        classpath and kwargs, give it its task instance, and run it."""
        from airflow.executors.workloads.task import TaskInstanceDTO
        from airflow.sdk.module_loading import import_string

        classpath, kwargs = trigger.serialize()
        fresh = import_string(classpath)(**json.loads(json.dumps(kwargs)))
        fresh.task_instance = TaskInstanceDTO(
            id=uuid.uuid4(),
            dag_id=DAG_ID,
            task_id=TASK_ID,
            run_id=RUN_ID,
            map_index=MAP_INDEX,
            try_number=try_number,
            dag_version_id=uuid.uuid4(),
            pool_slots=1,
            priority_weight=1,
        )
        fresh.trigger_id, fresh.triggerer_job_id, fresh.timeout_after = trigger_id, 1, None
        self.runner.triggers[trigger_id] = {
            "task": asyncio.create_task(self.runner.run_trigger(trigger_id, fresh, None, None)),
            "is_watcher": False,
            "name": f"{DAG_ID}/{RUN_ID}/{TASK_ID}/{MAP_INDEX}/{try_number} (ID {trigger_id})",
            "events": 0,
        }
        return fresh

    async def user_kill(self, trigger_id: int = 1) -> None:
        """Mark failed / mark success / clear: the trigger's row is gone, the supervisor sends its id in
        ``to_cancel``, and the runner cancels it with the user-action message."""
        self.runner.to_cancel.append(trigger_id)
        await self.runner.cancel_triggers()
        await self._finished(trigger_id)

    async def shut_down(self, trigger_id: int = 1) -> None:
        """The triggerer stops (a restart, a deploy): its tasks are cancelled without that message."""
        self.runner.triggers[trigger_id]["task"].cancel("EOF - shutting down")
        await self._finished(trigger_id)

    async def _finished(self, trigger_id: int) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(self.runner.triggers[trigger_id]["task"], 60)


@pytest.fixture
def kube(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKubeAPI]:
    with phase_kube_api(tmp_path, monkeypatch, NAMESPACE) as api:
        yield api


@pytest.fixture
def shard_phase(tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A week whose prepare phase works for 3 minutes: it runs when the user kills it."""
    return prepared_week(tmp_path, 1.0)


async def close_watches() -> None:
    for w in list(NamespaceWatch._shared.values()):
        await w.close()
    NamespaceWatch._shared.clear()


def scenario(kube: FakeKubeAPI, trigger: Any, act: Any) -> tuple[Triggerer, Any]:
    """Run ``trigger`` in the triggerer until its pod runs and the trigger waits on it, then ``act``."""
    triggerer = Triggerer()

    async def main() -> Any:
        try:
            running_trigger = triggerer.start(trigger)
            await asyncio.to_thread(kube.wait_for_pod, trigger.pod_name, NAMESPACE, phase="Running")
            await asyncio.sleep(1.0)  # the trigger has seen it through the shared watch
            assert not triggerer.runner.triggers[1]["task"].done()
            await act(triggerer)
            return running_trigger
        finally:
            await close_watches()

    return triggerer, asyncio.run(asyncio.wait_for(main(), 120))


def test_a_users_kill_deletes_the_pod_and_its_lease_and_commits_nothing(
    kube: FakeKubeAPI,
    shard_phase: tuple[dict[str, Any], dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Mark failed while the pod runs: within the pod's grace period its pod, its Lease and its process
    are gone; the ledger has no outcome for the phase and the attempt is still ``started``; the try a
    clear starts records it as lost (``infra_failed``/``abandoned``) and runs attempt 2."""
    from airflow.sdk.execution_time import task_runner

    supervisor = Supervisor("failed")
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", supervisor, raising=False)
    run, case = shard_phase
    trigger = start_phase(run, case, try_number=1)
    kube.wait_for_pod(trigger.pod_name, NAMESPACE, phase="Running")
    pid = kube.process_of(trigger.pod_name, NAMESPACE)
    assert running(pid) and {trigger.pod_name} == names(kube, "leases")
    killed_at: list[float] = []

    async def kill(triggerer: Triggerer) -> None:
        killed_at.append(time.monotonic())
        await triggerer.user_kill()

    triggerer, _ = scenario(kube, trigger, kill)
    assert triggerer.runner.triggers[1]["events"] == 0  # no event: nothing resumes the task
    kube.wait_for_pod(trigger.pod_name, NAMESPACE, gone=True, timeout=pod_spec.DEFAULT_GRACE_SECONDS)
    took = time.monotonic() - killed_at[0]
    assert trigger.pod_name not in names(kube, "leases")
    assert not running(pid), "the pod's process outlived its pod"
    assert took < pod_spec.DEFAULT_GRACE_SECONDS, took
    [asked] = supervisor.asked  # on_kill asked whether the task instance had left deferred
    assert (asked.dag_id, asked.task_ids, asked.run_ids, asked.map_index) == (DAG_ID, [TASK_ID], [RUN_ID], 0)

    ledger = ledger_of(run)
    assert ledger.outcome(case["case_id"], "prepare") is None
    [attempt] = ledger.attempts(case["case_id"], "prepare")
    assert (attempt.attempt, attempt.state, attempt.outcome) == (1, "started", None)

    # A clear's next try: the killed attempt is settled as lost, a new attempt gets its own pod.
    next_try_settles_the_killed_attempt(kube, run, case, ledger)


def hand_off_leaves_the_pod(
    kube: FakeKubeAPI, run: dict[str, Any], case: dict[str, Any], supervisor: Supervisor
) -> tuple[Any, int | None]:
    """Start a phase, cancel its trigger as a triggerer does on a hand-off (the user-action message),
    and check that its pod, Lease and process stay; returns the trigger and the pod's process id."""
    trigger = start_phase(run, case, try_number=1)
    kube.wait_for_pod(trigger.pod_name, NAMESPACE, phase="Running")
    pid = kube.process_of(trigger.pod_name, NAMESPACE)

    async def hand_off(triggerer: Triggerer) -> None:
        await triggerer.user_kill()

    scenario(kube, trigger, hand_off)
    assert len(supervisor.asked) == 1  # on_kill ran, and asked (or tried to)
    time.sleep(1.0)
    assert names(kube, "pods") == {trigger.pod_name} == names(kube, "leases")
    assert running(pid)
    assert kube.call_count(verb="delete") == 0
    return trigger, pid


def test_a_trigger_handed_to_another_triggerer_leaves_the_pod_running(
    kube: FakeKubeAPI,
    shard_phase: tuple[dict[str, Any], dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Airflow 3.3.2 also cancels with the user-action message a trigger that left this triggerer for
    another one (this one missed its heartbeats; apache/airflow#73454): the task instance is still
    deferred, the other triggerer watches the same pod, and the pod and Lease stay. A triggerer that
    shuts down does not call on_kill at all: the pod stays too."""
    from airflow.sdk.execution_time import task_runner

    supervisor = Supervisor("deferred")
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", supervisor, raising=False)
    run, case = shard_phase
    trigger, pid = hand_off_leaves_the_pod(kube, run, case, supervisor)

    async def shut_down(triggerer: Triggerer) -> None:
        await triggerer.shut_down()

    scenario(kube, trigger, shut_down)
    assert len(supervisor.asked) == 1  # no on_kill
    assert names(kube, "pods") == {trigger.pod_name} == names(kube, "leases")
    assert running(pid)
    assert ledger_of(run).outcome(case["case_id"], "prepare") is None


class UnreachableSupervisor(Supervisor):
    """A triggerer that missed its heartbeats (its database or API answers nothing): the state read fails."""

    def send(self, msg: Any) -> Any:
        from airflow.sdk.execution_time.comms import GetTaskStates

        if not isinstance(msg, GetTaskStates):
            return None  # what else the trigger's process sends (masked secrets) is not the boundary here
        self.asked.append(msg)
        raise ConnectionError("the metadata database is not answering")


def test_a_hand_off_whose_state_cannot_be_read_leaves_the_pod_running(
    kube: FakeKubeAPI,
    shard_phase: tuple[dict[str, Any], dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A triggerer failover: the unhealthy triggerer's triggers are cancelled with the user-action
    message, and the state read that tells a kill from a hand-off fails there. Unknown is not a kill:
    the pod of the live attempt (watched by its new triggerer) stays, with its Lease and process."""
    from airflow.sdk.execution_time import task_runner

    supervisor = UnreachableSupervisor("deferred")
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", supervisor, raising=False)
    hand_off_leaves_the_pod(kube, *shard_phase, supervisor)


def test_a_kill_while_the_trigger_commits_a_pass_deletes_nothing_more(
    kube: FakeKubeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pod passed and the trigger is committing it when the kill arrives (the artifact store answers
    slowly: the real commit runs 2 s late): the commit and the pod's deletion finish (the pass is real),
    on_kill waits for them and does nothing more, and no event is fired (the task is the user's now)."""
    from airflow.sdk.execution_time import task_runner

    from avsim.phases.contract import Outcome
    from avsim.triggers import pass_commit

    supervisor = Supervisor("failed")
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", supervisor, raising=False)
    real_commit = pass_commit.commit_passed
    committing = threading.Event()

    def slow_commit(plan: Any, result: Any) -> Any:
        committing.set()
        time.sleep(2.0)
        return real_commit(plan, result)

    monkeypatch.setattr(pass_commit, "commit_passed", slow_commit)
    run, case = prepared_week(tmp_path, 0.001)  # a prepare of 0.18 s: it passes at once
    trigger = start_phase(run, case, try_number=1)
    triggerer = Triggerer()
    left: list[set[str]] = []

    async def main() -> None:
        try:
            triggerer.start(trigger)
            assert await asyncio.to_thread(committing.wait, 30), "the trigger never committed"
            await triggerer.user_kill()
            left.append(names(kube, "pods") | names(kube, "leases"))  # as on_kill returned
        finally:
            await close_watches()

    asyncio.run(asyncio.wait_for(main(), 120))
    assert triggerer.runner.triggers[1]["events"] == 0
    committed = ledger_of(run).outcome(case["case_id"], "prepare")
    assert committed is not None and (committed.attempt, committed.outcome) == (1, Outcome.PASSED)
    assert left == [set()], left
    assert supervisor.asked == []  # on_kill found the trigger's own end and stopped there
