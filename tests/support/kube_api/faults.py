"""Scripted faults: rules that pick pods by a predicate and break them the way a cluster does.

A rule is claimed when a matching pod is created (that uses one of its ``times``); it fires
``after_seconds`` after the pod's container starts (``anchor="start"``, the default) or after
the pod is created (``anchor="create"``). ``slow_start`` and ``image_pull_error`` act before
the container starts, so they always count from creation.

Kinds and the status each leaves (what a real cluster reports, see the kubelet sources):

- ``evict``: node-pressure eviction by the kubelet: process SIGKILLed, pod ``Failed`` with
  ``status.reason: Evicted`` and a "The node was low on resource" message, condition
  ``DisruptionTarget`` (reason ``TerminationByKubelet``), container terminated exit 137.
  ``via="api"`` is an API-initiated eviction instead (``kubectl drain``): condition reason
  ``EvictionByEvictionAPI``, then a graceful delete, so the pod disappears.
- ``preempt``: spot reclaim / graceful node shutdown: ``DisruptionTarget``
  (``TerminationByKubelet``), SIGTERM, SIGKILL after ``grace_seconds``; pod ``Failed`` with
  ``reason: Terminated`` (``reason="Shutdown"`` for pre-1.22 kubelets) and message
  "Pod was terminated in response to imminent node shutdown.".
- ``node_loss``: the node vanishes: process killed, pod removed (DELETED, then 404); with
  ``mark_seconds > 0`` it is first marked ``DisruptionTarget`` (``DeletionByTaintManager``)
  and not Ready for that long.
- ``node_lost_stuck``: the node's kubelet dies for good: the process dies with it, nothing reports
  on the pod again (its container still reads as running), the node controller marks it not
  Ready with ``DisruptionTarget`` (``DeletionByTaintManager``) and the taint manager deletes it
  gracefully (``deletionTimestamp`` = now + ``grace_seconds``, default the pod's grace period)
  after ``mark_seconds`` (default 0). With no kubelet to confirm, a graceful delete never
  completes: the pod stays ``Terminating`` until it is force-deleted (grace 0), as on a real
  cluster.
- ``vanish``: pod deleted from the API at once while its process is killed.
- ``oom``: process SIGKILLed, container terminated ``OOMKilled`` exit 137, pod ``Failed``.
- ``image_pull_error``: never starts: waiting ``ErrImagePull`` then, after
  ``backoff_after_seconds``, ``ImagePullBackOff``, messages naming the image.
- ``hang``: process group SIGSTOPped: no progress, no output; pod stays Running until deleted.
- ``slow_start``: Pending (ContainerCreating) for ``after_seconds`` before the container starts.
- ``exit_code``: process killed and the container reported terminated with ``exit_code``.
"""

from __future__ import annotations

import fnmatch
import json
import threading
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FAULT_KINDS = (
    "evict",
    "preempt",
    "node_loss",
    "node_lost_stuck",
    "vanish",
    "oom",
    "image_pull_error",
    "hang",
    "slow_start",
    "exit_code",
)
BEFORE_START_KINDS = frozenset({"image_pull_error", "slow_start"})
_MATCH_KEYS = frozenset({"labels", "env", "name", "namespace", "image"})
_PARAMS: dict[str, frozenset[str]] = {
    "evict": frozenset({"via", "message", "grace_seconds"}),
    "preempt": frozenset({"grace_seconds", "reason", "message"}),
    "node_loss": frozenset({"mark_seconds", "condition_reason"}),
    "node_lost_stuck": frozenset({"mark_seconds", "grace_seconds", "condition_reason"}),
    "vanish": frozenset(),
    "oom": frozenset(),
    "image_pull_error": frozenset({"image", "message", "backoff_after_seconds"}),
    "hang": frozenset(),
    "slow_start": frozenset(),
    "exit_code": frozenset({"exit_code"}),
}


def container_env(pod: Mapping[str, Any]) -> dict[str, str]:
    """Literal ``value`` env entries of the pod's first container (``valueFrom`` is ignored)."""
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return {
        e["name"]: str(e.get("value") or "")
        for e in containers[0].get("env") or []
        if isinstance(e, Mapping) and "name" in e and "valueFrom" not in e
    }


@dataclass
class FaultRule:
    kind: str
    match: dict[str, Any] = field(default_factory=dict)
    after_seconds: float = 0.0
    times: int | None = 1
    anchor: str = "start"
    params: dict[str, Any] = field(default_factory=dict)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    claimed: list[str] = field(default_factory=list)  # "namespace/name" of the pods it was applied to

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; known: {', '.join(FAULT_KINDS)}")
        unknown = set(self.match) - _MATCH_KEYS
        if unknown:
            raise ValueError(f"fault match keys {sorted(unknown)} unknown; use {sorted(_MATCH_KEYS)}")
        bad = set(self.params) - _PARAMS[self.kind]
        if bad:
            raise ValueError(
                f"fault {self.kind!r} takes no {sorted(bad)}; it takes {sorted(_PARAMS[self.kind])}"
            )
        if self.anchor not in ("start", "create"):
            raise ValueError(f"fault anchor must be 'start' or 'create', not {self.anchor!r}")
        if self.kind in BEFORE_START_KINDS:
            self.anchor = "create"
        if self.times is not None and self.times < 1:
            raise ValueError("fault times must be >= 1 (or None for unlimited)")

    @property
    def exhausted(self) -> bool:
        return self.times is not None and len(self.claimed) >= self.times

    def matches(self, pod: Mapping[str, Any]) -> bool:
        meta = pod.get("metadata") or {}
        if "name" in self.match and not fnmatch.fnmatchcase(meta.get("name", ""), self.match["name"]):
            return False
        if "namespace" in self.match and meta.get("namespace") != self.match["namespace"]:
            return False
        labels = meta.get("labels") or {}
        if any(labels.get(k) != str(v) for k, v in (self.match.get("labels") or {}).items()):
            return False
        if "env" in self.match:
            env = container_env(pod)
            if any(env.get(k) != str(v) for k, v in self.match["env"].items()):
                return False
        if "image" in self.match:
            containers = (pod.get("spec") or {}).get("containers") or [{}]
            if not fnmatch.fnmatchcase(containers[0].get("image") or "", self.match["image"]):
                return False
        return True

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "match": self.match,
            "after_seconds": self.after_seconds,
            "times": self.times,
            "anchor": self.anchor,
            **self.params,
            "claimed": list(self.claimed),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FaultRule:
        data = dict(data)
        data.pop("claimed", None)
        core = {
            k: data.pop(k) for k in ("kind", "match", "after_seconds", "times", "anchor", "id") if k in data
        }
        if "kind" not in core:
            raise ValueError(f"fault rule {data!r} has no 'kind'")
        return cls(**core, params=data)


class FaultBook:
    """The rules in force; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[FaultRule] = []

    def add(self, rule: FaultRule) -> FaultRule:
        with self._lock:
            self._rules.append(rule)
        return rule

    def extend(self, rules: Iterable[FaultRule]) -> list[FaultRule]:
        return [self.add(r) for r in rules]

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def rules(self) -> list[FaultRule]:
        with self._lock:
            return list(self._rules)

    def claim(self, pod: Mapping[str, Any]) -> list[FaultRule]:
        """Rules that apply to a newly created pod; each claim uses one of the rule's times."""
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        with self._lock:
            claimed = []
            for rule in self._rules:
                if not rule.exhausted and rule.matches(pod):
                    rule.claimed.append(key)
                    claimed.append(rule)
            return claimed


def parse_rules(payload: Any) -> list[FaultRule]:
    """Rules from JSON: one rule object, a list of them, or ``{"faults": [...]}``."""
    if isinstance(payload, Mapping) and "faults" in payload:
        payload = payload["faults"]
    if isinstance(payload, Mapping):
        payload = [payload]
    if not isinstance(payload, list):
        raise ValueError("faults JSON must be a rule object, a list of rules or {'faults': [...]}")
    return [FaultRule.from_dict(item) for item in payload]


def load_rules(path: str | Path) -> list[FaultRule]:
    return parse_rules(json.loads(Path(path).read_text()))
