"""The sync path of a Kubernetes phase (no trigger): its lease watchdog and its kill path, over the
pods hook.

The boundary is the Kubernetes API: a stand-in of :class:`avsim.hooks.kubernetes.PhasePodsHook`
answers with the pod and Lease JSON the API would hold and records the deletes; the watchdog's
thread, the classification (:mod:`avsim.kube.pods`) and the clock are real.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from avsim.artifacts import RunLayout
from avsim.attempt import PhaseAttempt, PhaseRuntime
from avsim.contracts.case import CaseEntry
from avsim.manifest.sample import sample_manifest
from avsim.manifest.validation import validate_manifest
from avsim.operators.exceptions import PhaseKilled
from avsim.operators.kube_sync import SyncPodPath
from avsim.phases.contract import Detail, Outcome

NS, NAME = "sims", "avsim-case-1-prepare-a1-0123456789"
LOG = logging.getLogger("test.kube_sync")


def _at(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat().replace("+00:00", "Z")


def running_pod(started: float, **meta: Any) -> dict[str, Any]:
    state = {"running": {"startedAt": _at(started)}}
    return {
        "metadata": {"name": NAME, "namespace": NS, **meta},
        "status": {
            "phase": "Running",
            "conditions": [],
            "containerStatuses": [{"name": "base", "state": state}],
        },
    }


class Hook:
    """The API as the hook answers it: the pod, its Lease, and the deletes made."""

    def __init__(self, pod: dict[str, Any] | None, lease: dict[str, Any] | None = None) -> None:
        self.pod, self.lease = pod, lease
        self.deleted: list[tuple[str, str, int | None]] = []

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.pod

    def read_lease(self, namespace: str, name: str) -> dict[str, Any]:
        return self.lease or {}

    def delete_pod_and_lease(self, namespace: str, name: str, grace: int | None = None) -> list[str]:
        self.deleted.append((namespace, name, grace))
        return []


def attempt(lease_seconds: float) -> PhaseAttempt:
    doc = sample_manifest(1, iso_week="2026-W49")
    doc["graphs"]["standard"]["phases"]["prepare"]["lease_seconds"] = lease_seconds
    m = validate_manifest(doc)
    spec = m.graphs["standard"].phases["prepare"].model_dump(mode="json", by_alias=True)
    return PhaseAttempt(
        layout=RunLayout("file:///tmp/avsim-x", "avsim_weekly__x"),
        case=CaseEntry.model_validate({"case_id": m.cases[0].id, "seed": 1}),
        phase="prepare",
        attempt=1,
        runtime=PhaseRuntime.from_spec(spec),
        build_id="b",
        image="img",
        node_class="cpu",
    )


def watch(hook: Hook, a: PhaseAttempt, seconds: float = 3.0) -> SyncPodPath:
    sync = SyncPodPath(hook, node_class="cpu", check_interval=0.05, log=LOG)  # type: ignore[arg-type]
    pod = SimpleNamespace(metadata=SimpleNamespace(namespace=NS, name=NAME))
    stop = sync.start_watchdog(a, lambda: pod)
    deadline = time.monotonic() + seconds
    while sync.ended is None and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    return sync


def test_a_stale_lease_ends_the_pod_as_lease_expired_and_force_deletes_it() -> None:
    now = time.time()
    hook = Hook(running_pod(now - 600), {"spec": {"renewTime": _at(now - 300)}})
    sync = watch(hook, attempt(lease_seconds=180))
    assert sync.ended is not None
    assert (sync.ended.outcome, sync.ended.detail) == (Outcome.INFRA_FAILED, Detail.LEASE_EXPIRED)
    assert hook.deleted == [(NS, NAME, 0)]


def test_a_fresh_lease_a_terminating_pod_or_no_lease_setting_end_nothing() -> None:
    now = time.time()
    fresh = Hook(running_pod(now - 600), {"spec": {"renewTime": _at(now - 5)}})
    assert watch(fresh, attempt(lease_seconds=180), seconds=0.5).ended is None and fresh.deleted == []
    going = Hook(
        running_pod(now - 600, deletionTimestamp=_at(now - 1)), {"spec": {"renewTime": _at(now - 300)}}
    )
    assert watch(going, attempt(lease_seconds=180), seconds=0.5).ended is None and going.deleted == []
    off = Hook(running_pod(now - 600), {"spec": {"renewTime": _at(now - 300)}})
    assert watch(off, attempt(lease_seconds=0), seconds=0.5).ended is None and off.deleted == []


def test_a_pod_on_a_lost_node_ends_as_node_lost_whatever_its_lease() -> None:
    from avsim.kube.pods import TERMINATING_BOUND_SECONDS

    now = time.time()
    gone_at = now - TERMINATING_BOUND_SECONDS - 5
    pod = running_pod(gone_at - 100, deletionTimestamp=_at(gone_at), deletionGracePeriodSeconds=0)
    pod["status"]["conditions"] = [{"type": "Ready", "status": "False", "lastTransitionTime": _at(gone_at)}]
    hook = Hook(pod)
    sync = watch(hook, attempt(lease_seconds=0))
    assert sync.ended is not None and (sync.ended.outcome, sync.ended.detail) == (
        Outcome.INFRA_FAILED,
        Detail.NODE_LOST,
    )
    assert hook.deleted == [(NS, NAME, 0)]


def test_a_kill_flags_the_task_deletes_the_pod_with_its_grace_and_raises_nothing_recorded() -> None:
    hook = Hook(None)
    killed = threading.Event()
    sync = SyncPodPath(hook, node_class="cpu", check_interval=1, log=LOG, killed=killed)  # type: ignore[arg-type]
    sync.kill(SimpleNamespace(metadata=SimpleNamespace(namespace=NS, name=NAME)), 30)
    assert killed.is_set() and hook.deleted == [(NS, NAME, 30)]
    with pytest.raises(PhaseKilled, match=f"was killed \\(pod {NAME}\\): nothing recorded"):
        sync.raise_killed(NS, NAME, 30, "phase 'prepare' of case 'c1' (attempt 1)")
    assert hook.deleted == [(NS, NAME, 30), (NS, NAME, 30)]
