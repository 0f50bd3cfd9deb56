"""Pod status pieces shaped like the kubelet's: conditions, container states, messages."""

from __future__ import annotations

from typing import Any

from .objects import now_rfc3339

Obj = dict[str, Any]

EVICTED_MESSAGE = (
    "The node was low on resource: memory. Threshold quantity: 100Mi, available: 51200Ki. "
    "Container {container} was using 2097152Ki, request is 0, has larger consumption of memory. "
)
SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."
SHUTDOWN_MESSAGE_OLD = "Node is shutting, evicting pods"
EVICTION_API_MESSAGE = "Eviction API: evicting"
TAINT_MESSAGE = "Taint manager: deleting due to NoExecute taint"
DEADLINE_MESSAGE = "Pod was active on the node longer than the specified deadline"
UNKNOWN_CONTAINER_MESSAGE = "The container could not be located when the pod was terminated"


def image_pull_message(image: str) -> str:
    ref = image if "/" in image else f"docker.io/library/{image}"
    return (
        f'rpc error: code = NotFound desc = failed to pull and unpack image "{ref}": '
        f'failed to resolve reference "{ref}": {ref}: not found'
    )


def set_condition(
    status: Obj, ctype: str, value: bool, reason: str | None = None, message: str | None = None
) -> None:
    """Set a condition; its lastTransitionTime moves only when its status changes."""
    conditions: list[Obj] = status.setdefault("conditions", [])
    text = "True" if value else "False"
    for cond in conditions:
        if cond["type"] == ctype:
            if cond["status"] != text:
                cond["lastTransitionTime"] = now_rfc3339()
            cond["status"] = text
            _reason(cond, reason, message)
            return
    cond = {"type": ctype, "status": text, "lastProbeTime": None, "lastTransitionTime": now_rfc3339()}
    _reason(cond, reason, message)
    conditions.append(cond)


def _reason(cond: Obj, reason: str | None, message: str | None) -> None:
    for key, value in (("reason", reason), ("message", message)):
        if value is None:
            cond.pop(key, None)
        else:
            cond[key] = value


_ORDER = [
    "PodReadyToStartContainers",
    "Initialized",
    "Ready",
    "ContainersReady",
    "PodScheduled",
    "DisruptionTarget",
]


def sort_conditions(status: Obj) -> None:
    status.get("conditions", []).sort(key=lambda c: _ORDER.index(c["type"]) if c["type"] in _ORDER else 99)


def container_statuses(
    pod: Obj, state: Obj, *, ready: bool, started: bool, container_id: str | None
) -> list[Obj]:
    """One status per spec container; the first container's state is the one the fake runs,
    the others (sidecars) are reported in the same state (they are not run)."""
    statuses = []
    for container in pod["spec"].get("containers") or []:
        entry: Obj = {
            "name": container["name"],
            "state": state,
            "lastState": {},
            "ready": ready,
            "restartCount": 0,
            "image": container.get("image", ""),
            "imageID": "",
            "started": started,
        }
        if container_id:
            entry["containerID"] = container_id
        statuses.append(entry)
    return statuses


def terminated_state(
    exit_code: int,
    reason: str,
    started_at: str | None,
    message: str | None = None,
    container_id: str | None = None,
) -> Obj:
    term: Obj = {"exitCode": exit_code, "reason": reason}
    if message:
        term["message"] = message
    term["startedAt"] = started_at
    term["finishedAt"] = now_rfc3339()
    if container_id:
        term["containerID"] = container_id
    return {"terminated": term}


def qos_class(pod: Obj) -> str:
    resources = [(c.get("resources") or {}) for c in pod["spec"].get("containers") or []]
    if not any(r.get("requests") or r.get("limits") for r in resources):
        return "BestEffort"
    guaranteed = all(
        r.get("limits")
        and all(r.get("requests", r["limits"]).get(k) == v for k, v in r["limits"].items())
        and {"cpu", "memory"} <= set(r["limits"])
        for r in resources
    )
    return "Guaranteed" if guaranteed else "Burstable"
