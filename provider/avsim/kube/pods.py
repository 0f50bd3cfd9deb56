"""Phase pods as plain data: names, labels, selectors, Leases, and how a pod's status is classified.

Everything here works on JSON-shaped dicts (what the API server sends, what a watch event holds)
and imports no Kubernetes client. The trigger and the operator's synchronous path classify a pod
with the same function (:func:`classify_pod`, its table in its docstring), so both agree.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

from avsim.phases.contract import NODE_SPOT, AttemptResult, Detail, Outcome, classify_exit_code
from avsim.phases.heartbeat import lease_age

#: Labels every avsim phase pod carries; the triggerer's shared watch selects on ``MANAGED``.
LABEL_MANAGED = "avsim.io/managed"
LABEL_RUN = "avsim.io/run"
LABEL_CASE = "avsim.io/case"
LABEL_PHASE = "avsim.io/phase"
LABEL_ATTEMPT = "avsim.io/attempt"
LABEL_NODE_CLASS = "avsim.io/node-class"
#: The container that runs the phase.
CONTAINER = "base"

IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
DISRUPTION_REASONS = frozenset(
    {"Evicted", "Preempting", "Shutdown", "Terminated", "NodeShutdown", "NodeLost"}
)
_UNSAFE = re.compile(r"[^a-z0-9-]+")
#: A pod still there this long after its ``deletionTimestamp`` (which already includes the grace
#: period) is on a node whose kubelet is gone: a live kubelet kills the container at the end of the
#: grace period and the pod leaves the API within seconds.
TERMINATING_BOUND_SECONDS = 60.0
#: A running avsim pod (no readiness probe) whose Ready condition has been False this long was marked
#: not ready by the node controller: its node stopped reporting. The taint manager deletes such pods
#: only after 300 s (the default ``node.kubernetes.io/unreachable`` toleration), which then hang in
#: ``Terminating``.
NOT_READY_BOUND_SECONDS = 180.0


def label_value(value: str) -> str:
    """A label value from free text: at most 63 characters, a short hash keeps it unique when cut."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", value).strip("-_.")
    if len(safe) <= 63 and safe == value:
        return safe
    digest = hashlib.sha256(value.encode()).hexdigest()[:8]
    return f"{safe[:54].strip('-_.')}-{digest}"


def pod_name(run_key: str, case_id: str, phase: str, attempt: int) -> str:
    """``avsim-<case>-<phase>-a<n>-<hash>``: DNS-1123, at most 63 characters, unique per attempt."""
    digest = hashlib.sha256(f"{run_key}\0{case_id}\0{phase}\0{attempt}".encode()).hexdigest()[:10]
    stem = _UNSAFE.sub("-", f"{case_id}-{phase}".lower()).strip("-")[:36].strip("-")
    return f"avsim-{stem}-a{attempt}-{digest}"


def attempt_labels(run_key: str, case_id: str, phase: str, attempt: int, node_class: str) -> dict[str, str]:
    return {
        LABEL_MANAGED: "true",
        LABEL_RUN: label_value(run_key),
        LABEL_CASE: label_value(case_id),
        LABEL_PHASE: label_value(phase),
        LABEL_ATTEMPT: str(attempt),
        LABEL_NODE_CLASS: node_class,
    }


def lease_body(name: str, namespace: str, labels: Mapping[str, str], lease_seconds: float) -> dict[str, Any]:
    """The attempt's heartbeat Lease (``coordination.k8s.io/v1``), named after its pod; the phase
    renews ``spec.renewTime`` (avsim.phases.heartbeat)."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {"leaseDurationSeconds": int(lease_seconds), "holderIdentity": name},
    }


def phase_selector(run_key: str, case_id: str, phase: str) -> str:
    """Label selector of every pod (every attempt) of one phase of one case."""
    return ",".join(
        f"{k}={v}"
        for k, v in (
            (LABEL_MANAGED, "true"),
            (LABEL_RUN, label_value(run_key)),
            (LABEL_CASE, label_value(case_id)),
            (LABEL_PHASE, label_value(phase)),
        )
    )


def run_selector(run_key: str) -> str:
    """Label selector of every pod of one run (every case, phase and attempt)."""
    return f"{LABEL_MANAGED}=true,{LABEL_RUN}={label_value(run_key)}"


def leftover_pods(
    pods: Iterable[Mapping[str, Any]], case_ids: Iterable[str], created_before: dt.datetime
) -> list[str]:
    """The names of the pods, among a run's ``pods`` (as the API lists them), that a shard run left
    behind: a pod of one of its ``case_ids`` created before ``created_before`` (when the shard's last
    task began: every phase task of the shard had ended by then, so such a pod belongs to no running
    try). A task marked failed or success while its trigger had not been picked up yet leaves one:
    no trigger runs to delete it, and its pod would hold its node until ``activeDeadlineSeconds``.
    A pod created later belongs to a try an engineer started since (a cleared phase), and is kept."""
    wanted = {label_value(c) for c in case_ids}
    # The API keeps whole seconds: a pod stamped in the second the shard's last task began may be newer.
    before = created_before.timestamp() - 1.0
    found = []
    for pod in pods:
        labels = _get(pod, "metadata", "labels") or {}
        created = parse_time(_get(pod, "metadata", "creationTimestamp"))
        if labels.get(LABEL_CASE) in wanted and created is not None and created < before:
            found.append(str(_get(pod, "metadata", "name")))
    return found


def _get(d: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(d, Mapping):
            return None
        d = d.get(p)
    return d


def base_container_status(pod: Mapping[str, Any], container: str = CONTAINER) -> Mapping[str, Any] | None:
    statuses = _get(pod, "status", "containerStatuses") or []
    for s in statuses:
        if isinstance(s, Mapping) and s.get("name") == container:
            return s
    return statuses[0] if statuses and isinstance(statuses[0], Mapping) else None


def is_running(pod: Mapping[str, Any]) -> bool:
    return _get(pod, "status", "phase") == "Running"


def running_since(pod: Mapping[str, Any], container: str = CONTAINER) -> str | None:
    """When the base container started (RFC 3339), if it is running."""
    status = base_container_status(pod, container)
    return _get(status, "state", "running", "startedAt")


def parse_time(value: Any) -> float | None:
    """Seconds since the epoch of an RFC 3339 time from the API (None when absent or unreadable)."""
    if not value:
        return None
    try:
        return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def pod_lease_age(pod: Mapping[str, Any], lease: Mapping[str, Any] | None, now: float) -> float:
    """Seconds since the phase in ``pod`` last renewed its Lease (``spec.renewTime``), or since its
    container started running when it has not renewed since (:func:`avsim.phases.heartbeat.lease_age`)."""
    return lease_age(
        now, renewed=parse_time(_get(lease, "spec", "renewTime")), started=parse_time(running_since(pod))
    )


def is_terminating(pod: Mapping[str, Any]) -> bool:
    """The pod was asked to go (``deletionTimestamp`` set): its heartbeat no longer matters."""
    return bool(_get(pod, "metadata", "deletionTimestamp"))


def lost_node_class(node_class: str) -> Outcome:
    """What a lost node means for a phase (design.md): spot capacity was reclaimed, anything else failed."""
    return Outcome.PREEMPTED if node_class == NODE_SPOT else Outcome.INFRA_FAILED


def node_lost_reason(
    pod: Mapping[str, Any],
    now: float,
    *,
    terminating_bound: float | None = None,
    not_ready_bound: float | None = None,
) -> str:
    """Why this not-yet-ended pod's node is lost ("" when nothing says so), judged at ``now``.

    The pod's own status is all the evidence: reading Nodes would need cluster-wide permissions.
    The bounds default to the module's constants, read at each call.
    """
    if terminating_bound is None:
        terminating_bound = TERMINATING_BOUND_SECONDS
    if not_ready_bound is None:
        not_ready_bound = NOT_READY_BOUND_SECONDS
    deleting = parse_time(_get(pod, "metadata", "deletionTimestamp"))
    if deleting is not None and now - deleting > terminating_bound:
        return (
            f"the pod has been Terminating for {now - deleting:.0f}s past its deletion time "
            f"(bound {terminating_bound:g}s): its node's kubelet is gone, the pod will never be removed"
        )
    ready = next(
        (
            c
            for c in _get(pod, "status", "conditions") or []
            if isinstance(c, Mapping) and c.get("type") == "Ready"
        ),
        None,
    )
    since = parse_time((ready or {}).get("lastTransitionTime"))
    if (
        is_running(pod)
        and running_since(pod)
        and ready is not None
        and str(ready.get("status")) == "False"
        and since is not None
        and now - since > not_ready_bound
    ):
        return (
            f"the pod has been not Ready for {now - since:.0f}s while its container runs "
            f"(bound {not_ready_bound:g}s): its node stopped reporting"
        )
    return ""


def classify_pod(
    pod: Mapping[str, Any] | None,
    *,
    node_class: str,
    container: str = CONTAINER,
    lease_expired: bool = False,
    lease_seconds: float = 0,
    now: float | None = None,
) -> AttemptResult | None:
    """How a phase pod's attempt ended, or None while it is still pending or running.

    ``pod`` is None when the pod is gone from the API (deleted by a node controller, a lost node).
    ``now`` (seconds since the epoch) enables the time-based rule for a lost node; without it a pod
    is judged on its status alone. First match wins:

    ==============================================================  ==================  ============
    pod status                                                      outcome             detail
    ==============================================================  ==================  ============
    gone from the API (404, DELETED event) before it ended          preempted (spot) /  vanished
                                                                    infra_failed
    no heartbeat for longer than the lease                          infra_failed        lease_expired
    not ended, and stuck Terminating (``deletionTimestamp`` more    preempted (spot) /  node_lost
    than ``TERMINATING_BOUND_SECONDS`` ago) or not Ready with its   infra_failed
    container running for more than ``NOT_READY_BOUND_SECONDS``
    (its node's kubelet is gone: nothing will ever update it)
    a container waiting with ErrImagePull, ImagePullBackOff,         bad_build           image_pull
    InvalidImageName
    ``DisruptionTarget`` condition, or status reason Evicted,       preempted           evicted /
    Preempting, Shutdown, Terminated, NodeShutdown, NodeLost                            node_shutdown
    container terminated OOMKilled                                  infra_failed        oom
    status reason DeadlineExceeded (activeDeadlineSeconds)          infra_failed        timeout
    Succeeded                                                       passed              (exit 0)
    container terminated with an exit code                          by the phase contract's exit codes
    ==============================================================  ==================  ============
    """
    if pod is None:
        return AttemptResult(
            lost_node_class(node_class),
            None,
            "the pod disappeared from the API before it ended (its node was lost or reclaimed)",
            Detail.VANISHED,
        )
    name = str(_get(pod, "metadata", "name") or "")
    status = base_container_status(pod, container)
    if lease_expired:
        return AttemptResult(
            Outcome.INFRA_FAILED,
            None,
            f"no heartbeat renewal for more than {lease_seconds:g}s: the phase hung; its pod was deleted",
            Detail.LEASE_EXPIRED,
            name,
        )
    waiting = _get(status, "state", "waiting") or {}
    if waiting.get("reason") in IMAGE_PULL_REASONS:
        image = (status or {}).get("image") or ""
        return AttemptResult(
            Outcome.BAD_BUILD,
            None,
            f"{waiting.get('reason')}: {waiting.get('message') or 'the image cannot be pulled'} ({image})",
            Detail.IMAGE_PULL,
            name,
        )
    phase = _get(pod, "status", "phase")
    pod_reason = str(_get(pod, "status", "reason") or "")
    message = str(_get(pod, "status", "message") or "")
    disruption = next(
        (
            c
            for c in _get(pod, "status", "conditions") or []
            if isinstance(c, Mapping)
            and c.get("type") == "DisruptionTarget"
            and str(c.get("status")) == "True"
        ),
        None,
    )
    terminated = _get(status, "state", Detail.TERMINATED) or {}
    ended = phase in ("Succeeded", "Failed") or bool(terminated)
    if not ended and now is not None:
        lost = node_lost_reason(pod, now)
        if lost:
            return AttemptResult(lost_node_class(node_class), None, lost, Detail.NODE_LOST, name)
    if disruption is not None or pod_reason in DISRUPTION_REASONS:
        if not ended and disruption is not None:
            return None  # being drained: wait for it to stop, then it is a preemption
        why = (disruption or {}).get("reason") or pod_reason
        text = (disruption or {}).get("message") or message or why
        evicted = pod_reason == "Evicted" or why in ("EvictionByEvictionAPI", "PreemptionByScheduler")
        detail: str = Detail.EVICTED if evicted else Detail.NODE_SHUTDOWN
        return AttemptResult(Outcome.PREEMPTED, _exit_code(terminated), f"{why}: {text}", detail, name)
    if not ended:
        return None
    if terminated.get("reason") == "OOMKilled":
        return AttemptResult(
            Outcome.INFRA_FAILED,
            _exit_code(terminated),
            "the container was OOM-killed: raise the phase's memory",
            Detail.OOM,
            name,
        )
    if pod_reason == "DeadlineExceeded":
        return AttemptResult(
            Outcome.INFRA_FAILED, _exit_code(terminated), f"timed out: {message}", Detail.TIMEOUT, name
        )
    if phase == "Succeeded" and not terminated:
        return AttemptResult(Outcome.PASSED, 0, "", "", name)
    code = _exit_code(terminated)
    if code is None:
        return AttemptResult(
            Outcome.INFRA_FAILED,
            None,
            f"the pod failed without an exit code: {pod_reason} {message}".strip(),
            Detail.CRASH,
            name,
        )
    outcome = classify_exit_code(code)
    detail = {Outcome.INFRA_FAILED: Detail.CRASH, Outcome.PREEMPTED: Detail.TERMINATED}.get(outcome) or ""
    reason = str(terminated.get("message") or terminated.get("reason") or "") if code else ""
    return AttemptResult(outcome, code, reason, detail, name)


def _exit_code(terminated: Mapping[str, Any]) -> int | None:
    code = terminated.get("exitCode") if isinstance(terminated, Mapping) else None
    return int(code) if code is not None else None
