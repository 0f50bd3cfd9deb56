"""avsim's metrics, emitted through Airflow's metrics layer (StatsD, Datadog or OpenTelemetry).

Each call emits a tagged name and a dotted one, as Airflow does, and no function here ever raises (a
metric never fails the task, trigger or request that emits it). :func:`_stats` takes the task SDK's
stats object when it is initialized, else the core one, else initializes the SDK's from ``[metrics]``.
The names, their types and dimensions: docs/operations.md, "Metrics".
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

PHASE_OUTCOME = "avsim.phase.outcome"
GPU_SECONDS = "avsim.gpu_seconds"
PREEMPTION = "avsim.preemption"
BREAKER_TRIP = "avsim.breaker.trip"
CANARY_DECISION = "avsim.canary.decision"
SECONDS_LATE = "avsim.deadline.seconds_late"
GPUS_NEEDED = "avsim.capacity.gpus_needed"
TRIAGE_VERDICT = "avsim.triage.verdict"

_SEGMENT = re.compile(r"[^A-Za-z0-9_-]")
_SEGMENT_TAG = re.compile(r"[^A-Za-z0-9_.-]")


def _segment(value: object) -> str:
    """One segment of a dotted name: StatsD-safe (no dots, colons, pipes), never empty."""
    text = _SEGMENT.sub("_", str(value if value is not None else ""))[:60]
    return text or "unknown"


def _tag(value: object) -> str:
    """A tag value: Airflow's stat-name characters only (InfluxDB-style tags become part of the name)."""
    return _SEGMENT_TAG.sub("_", str(value if value is not None else ""))[:120] or "unknown"


def _stats() -> Any:
    """The stats module this process should emit through (see the module doc)."""
    from avsim.airflow_internals import stats_module
    from avsim.settings import airflow_config

    legacy = airflow_config("metrics", "legacy_names_on", "True").strip().lower()
    return stats_module(legacy in ("t", "true", "1", "yes", "on"))


def _emit(kind: str, name: str, dotted: tuple[object, ...], value: float, tags: Mapping[str, object]) -> None:
    try:
        stats = _stats()
        clean = {k: _tag(v) for k, v in tags.items()}
        names = [name]
        if dotted:
            names.append(".".join([name, *(_segment(d) for d in dotted)]))
        for stat in names:
            if kind == "incr":
                stats.incr(stat, count=value, tags=clean)
            else:
                stats.gauge(stat, value, tags=clean)
    except Exception:  # a metric never fails its caller
        log.debug("avsim metric %s not emitted", name, exc_info=True)


def _number(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def phase_outcome(phase: str, outcome: str, resource_class: str, node_class: str) -> None:
    """One phase attempt ended with ``outcome`` (``passed``, ``scenario_failed``, ``infra_failed``...).

    ``resource_class``: ``gpu`` or ``cpu``; ``node_class``: ``spot``, ``on_demand`` or ``local``.
    """
    dims = {"phase": phase, "outcome": getattr(outcome, "value", outcome)}
    dims |= {"resource_class": resource_class, "node_class": node_class}
    _emit("incr", PHASE_OUTCOME, tuple(dims.values()), 1, dims)


def gpu_seconds(phase: str, seconds: float, node_class: str) -> None:
    """GPU-seconds an attempt used (its GPUs times its wall seconds), counted when it ends."""
    value = _number(seconds)
    if value is None or value < 0:
        return
    dims = {"phase": phase, "node_class": node_class}
    _emit("incr", GPU_SECONDS, tuple(dims.values()), round(value, 3), dims)


def preemption(phase: str, node_class: str) -> None:
    """A phase attempt lost its node (spot reclaim, eviction)."""
    dims = {"phase": phase, "node_class": node_class}
    _emit("incr", PREEMPTION, tuple(dims.values()), 1, dims)


def breaker_trip(build_id: str, digest: str) -> None:
    """The circuit breaker of a simulator build opened."""
    _emit("incr", BREAKER_TRIP, (), 1, {"build_id": build_id, "digest": digest})


def canary_decision(build_id: str, passed: bool) -> None:
    """The canary gate of a run decided: the week goes on (passed) or stops (failed)."""
    result = "passed" if passed else "failed"
    _emit("incr", CANARY_DECISION, (result,), 1, {"build_id": build_id, "result": result})


def finish_estimate(seconds_late: float) -> None:
    """The newest finish estimate minus the deadline, in seconds (negative: ahead of the deadline)."""
    value = _number(seconds_late)
    if value is not None:
        _emit("gauge", SECONDS_LATE, (), round(value, 3), {})


def gpus_needed(n: int | float) -> None:
    """How many GPUs the run needs to meet its deadline (a fraction is rounded up)."""
    value = _number(n)
    if value is not None:
        _emit("gauge", GPUS_NEEDED, (), math.ceil(value), {})


def triage_verdicts(counts: Mapping[str, int]) -> None:
    """A week's triage ended: how many newly failing cases got each verdict."""
    for verdict, n in counts.items():
        value = _number(n)
        if value and value > 0:
            _emit("incr", TRIAGE_VERDICT, (verdict,), int(value), {"verdict": verdict})
