"""Small planner workloads written by hand: a phase spec in one call, a validated manifest of named
graphs and cases, and the three-phase chain several tests plan."""

from __future__ import annotations

from typing import Any

from avsim.manifest.validation import validate_manifest
from avsim.planner import Workload, workload_from_manifest

DIGEST = "0" * 64


def phase(
    kind: str, seconds: float, *after: str, gpus: int = 1, checkpoint: bool = False, **retry: Any
) -> dict:
    return {
        "depends_on": list(after),
        "resources": {"class": kind, "gpus": gpus if kind == "gpu" else 0},
        "estimated_duration_seconds": seconds,
        "timeout_seconds": min(7 * 24 * 3600, seconds * 10),
        "retry": retry,
        "command": ["true"],
        **({"checkpoint": True} if checkpoint else {}),
    }


def workload(
    graphs: dict[str, dict[str, dict]], cases: list[str], run_phases: dict | None = None
) -> Workload:
    doc = {
        "apiVersion": "avsim/v1",
        "run": {
            "name": "t",
            "iso_week": "2026-W02",
            "deadline": "2026-01-11T18:00:00Z",
            "build": {"build_id": "b1", "image": f"registry.example.com/sim@sha256:{DIGEST}"},
        },
        "graphs": {name: {"phases": phases} for name, phases in graphs.items()},
        "cases": [
            {"id": f"c{i:03d}", "graph": g, "scenario": {"uri": "s3://s/x.json", "version": "v1"}, "seed": i}
            for i, g in enumerate(cases)
        ],
        "run_phases": run_phases or {},
    }
    return workload_from_manifest(validate_manifest(doc))


CHAIN = {
    "prepare": phase("cpu", 60),
    "simulate": phase("gpu", 600, "prepare"),
    "report": phase("cpu", 60, "simulate"),
}
