"""Phase pods as data: names, labels, and the classification of every way a pod ends."""

from __future__ import annotations

import re
from typing import Any

from avsim.kube.pods import (
    LABEL_ATTEMPT,
    attempt_labels,
    classify_pod,
    label_value,
    phase_selector,
    pod_name,
)
from avsim.phases.contract import Outcome


def pod(
    phase: str = "Running", *, reason: str = "", conditions: list[dict[str, Any]] | None = None, **state: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": "avsim-c1-simulate-a1-0123456789"},
        "status": {
            "phase": phase,
            "reason": reason,
            "message": "msg",
            "conditions": conditions or [],
            "containerStatuses": [{"name": "base", "image": "reg/sim@sha256:" + "0" * 64, "state": state}],
        },
    }


def terminated(code: int, reason: str = "Error", **kw: Any) -> dict[str, Any]:
    return {"terminated": {"exitCode": code, "reason": reason, **kw}}


def test_names_and_labels_are_valid_kubernetes() -> None:
    name = pod_name(
        "avsim_weekly__manual__2026-12-07T06:00:00+00:00", "Case.With_Odd-ID." * 5, "simulate", 12
    )
    assert len(name) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name)
    assert name != pod_name(
        "avsim_weekly__manual__2026-12-07T06:00:00+00:00", "Case.With_Odd-ID." * 5, "simulate", 13
    )
    labels = attempt_labels("run:key/with+odd chars" * 4, "c1", "simulate", 3, "gpu-spot")
    assert all(
        len(v) <= 63 and re.fullmatch(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]?", v)
        for v in labels.values()
    )
    assert labels[LABEL_ATTEMPT] == "3" and labels["avsim.io/managed"] == "true"
    assert label_value("short") == "short" and label_value("x" * 80) != label_value("x" * 81)
    assert phase_selector("rk", "c1", "simulate") == (
        "avsim.io/managed=true,avsim.io/run=rk,avsim.io/case=c1,avsim.io/phase=simulate"
    )


def classify(p: dict[str, Any] | None, node_class: str = "gpu-spot", **kw: Any) -> tuple[str, str] | None:
    r = classify_pod(p, node_class=node_class, **kw)
    return None if r is None else (r.outcome.value, r.detail)


def test_running_and_pending_pods_are_not_finished() -> None:
    assert classify(pod("Pending", waiting={"reason": "ContainerCreating"})) is None
    assert classify(pod("Running", running={"startedAt": "2026-12-07T10:00:00Z"})) is None
    # A DisruptionTarget on a pod still running: it is being drained; wait for it to stop.
    drain = [{"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}]
    assert classify(pod("Running", conditions=drain, running={})) is None


def test_every_ending_gets_its_class() -> None:
    assert classify(pod("Succeeded", **terminated(0, "Completed"))) == ("passed", "")
    assert classify(pod("Failed", **terminated(3))) == ("scenario_failed", "")
    assert classify(pod("Failed", **terminated(65))) == ("bad_input", "")
    assert classify(pod("Failed", **terminated(1))) == ("infra_failed", "crash")
    assert classify(pod("Failed", **terminated(137, "OOMKilled"))) == ("infra_failed", "oom")
    assert classify(pod("Failed", reason="DeadlineExceeded", **terminated(137))) == (
        "infra_failed",
        "timeout",
    )
    evicted = [
        {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "EvictionByEvictionAPI",
            "message": "Eviction API",
        }
    ]
    assert classify(pod("Failed", conditions=evicted, **terminated(137))) == ("preempted", "evicted")
    assert classify(pod("Failed", reason="Evicted", **terminated(137))) == ("preempted", "evicted")
    shutdown = [{"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}]
    assert classify(pod("Failed", reason="Terminated", conditions=shutdown, **terminated(143))) == (
        "preempted",
        "node_shutdown",
    )
    assert classify(pod("Pending", waiting={"reason": "ImagePullBackOff", "message": "back-off"})) == (
        "bad_build",
        "image_pull",
    )
    assert classify(pod("Pending", waiting={"reason": "ErrImagePull"})) == ("bad_build", "image_pull")
    # Gone from the API: a lost spot node is a preemption; elsewhere an infrastructure failure.
    assert classify(None) == ("preempted", "vanished")
    assert classify(None, node_class="gpu-on-demand") == ("infra_failed", "vanished")
    assert classify(pod("Running", running={}), lease_expired=True, lease_seconds=60) == (
        "infra_failed",
        "lease_expired",
    )


def test_reasons_name_what_happened() -> None:
    r = classify_pod(pod("Failed", **terminated(137, "OOMKilled")), node_class="cpu")
    assert (
        r is not None
        and r.outcome is Outcome.INFRA_FAILED
        and "OOM" in r.reason
        and r.runner.startswith("avsim-c1")
    )
    r = classify_pod(
        pod("Pending", waiting={"reason": "ErrImagePull", "message": "not found"}), node_class="cpu"
    )
    assert r is not None and "ErrImagePull" in r.reason and "sha256:" in r.reason


def _at(seconds: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat().replace("+00:00", "Z")


def stuck(deleted_at: float, **kw: Any) -> dict[str, Any]:
    """A pod its kubelet will never update again: Running, container running, Terminating."""
    taint = [
        {"type": "Ready", "status": "False", "lastTransitionTime": _at(deleted_at)},
        {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"},
    ]
    p = pod("Running", conditions=taint, running={"startedAt": _at(deleted_at - 100)}, **kw)
    p["metadata"]["deletionTimestamp"] = _at(deleted_at)
    p["metadata"]["deletionGracePeriodSeconds"] = 30
    return p


def test_a_pod_stuck_terminating_on_a_lost_node_ends_as_the_node_class_says() -> None:
    from avsim.kube.pods import TERMINATING_BOUND_SECONDS

    t0 = 1_800_000_000.0
    bound = TERMINATING_BOUND_SECONDS
    # Within the bound it may still be a live kubelet finishing the delete: wait.
    assert classify(stuck(t0), now=t0 + bound - 1) is None
    # Without a clock nothing time-based is decided (the function stays pure on the status alone).
    assert classify(stuck(t0)) is None
    # Past it: a lost node, classified like a vanished pod (design.md's table).
    assert classify(stuck(t0), now=t0 + bound + 1) == ("preempted", "node_lost")
    assert classify(stuck(t0), node_class="gpu-on-demand", now=t0 + bound + 1) == (
        "infra_failed",
        "node_lost",
    )
    assert classify(stuck(t0), node_class="cpu", now=t0 + bound + 1) == ("infra_failed", "node_lost")
    r = classify_pod(stuck(t0), node_class="cpu", now=t0 + bound + 1)
    assert r is not None and "Terminating" in r.reason and r.exit_code is None and r.runner
    # A pod that ended before its node went is classified by how it ended.
    ended = stuck(t0)
    ended["status"] = pod("Failed", **terminated(3))["status"]
    assert classify(ended, now=t0 + 10 * bound) == ("scenario_failed", "")


def test_a_running_pod_not_ready_too_long_is_on_an_unreachable_node() -> None:
    from avsim.kube.pods import NOT_READY_BOUND_SECONDS

    t0 = 1_800_000_000.0
    p = stuck(t0)
    del p["metadata"]["deletionTimestamp"]  # marked NotReady, not yet deleted by the taint manager
    assert classify(p, now=t0 + NOT_READY_BOUND_SECONDS - 1) is None
    assert classify(p, now=t0 + NOT_READY_BOUND_SECONDS + 1) == ("preempted", "node_lost")
    # Ready and running: nothing to say, however long it runs.
    p["status"]["conditions"][0]["status"] = "True"
    assert classify(p, now=t0 + 10 * NOT_READY_BOUND_SECONDS) is None
