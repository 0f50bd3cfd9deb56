"""What each kind of fake-simulator phase produces: its artifact, its metrics, its verdict.

Deterministic in the case's seed (every draw comes from :meth:`PhaseEnv.rng`). Kept apart
from :mod:`avsim.devstack.fakesim`, which owns the contract, the work loop and the command line.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from avsim.devstack.fakesim import PhaseEnv

#: Kinds that drive the scenario and so can fail it.
DRIVING_KINDS = ("simulate", "perceive")


def upstream_verdict(docs: Mapping[str, Any]) -> str:
    for doc in docs.values():
        metrics = doc.get("metrics") if isinstance(doc.get("metrics"), dict) else {}
        if doc.get("outcome") == "scenario_failed" or metrics.get("scenario_verdict") == "scenario_failed":
            return "scenario_failed"
    return "passed"


def upstream_metrics(docs: Mapping[str, Any]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for _, doc in sorted(docs.items()):
        metrics = doc.get("metrics")
        if isinstance(metrics, dict):
            merged.update({k: v for k, v in metrics.items() if isinstance(v, int | float | str | bool)})
    return merged


def drive_metrics(rng: random.Random, failed: bool) -> dict[str, Any]:
    if failed:
        return {
            "min_ttc_s": round(rng.uniform(0.0, 0.8), 3),
            "max_decel_mps2": round(rng.uniform(6.5, 9.5), 3),
            "collisions": rng.choice((0, 1, 1)),
            "route_completion": round(rng.uniform(0.3, 0.9), 4),
        }
    return {
        "min_ttc_s": round(rng.uniform(1.5, 8.0), 3),
        "max_decel_mps2": round(rng.uniform(0.8, 4.5), 3),
        "collisions": 0,
        "route_completion": round(rng.uniform(0.97, 1.0), 4),
    }


CHECKS = (  # name, metric, passes when
    ("no_collision", "collisions", lambda v: v == 0),
    ("min_ttc", "min_ttc_s", lambda v: v >= 1.0),
    ("comfortable_braking", "max_decel_mps2", lambda v: v <= 6.0),
    ("route_completed", "route_completion", lambda v: v >= 0.95),
)


def produce(kind: str, env: PhaseEnv, docs: dict[str, Any], failed: bool) -> tuple[str, Any, dict[str, Any]]:
    """(artifact file name, artifact content, metrics) of one kind. Deterministic in the seed."""
    rng = env.rng("metrics")
    if kind == "prepare":
        actors = rng.randint(3, 40)
        scenario = {
            "uri": env.scenario_uri,
            "version": env.scenario_version,
            "seed": env.seed,
            "parameters": env.parameters,
            "actors": actors,
            "map_tiles": rng.randint(4, 64),
        }
        return "scenario.json", scenario, {"actors": actors, "map_tiles": scenario["map_tiles"]}
    if kind in DRIVING_KINDS:
        metrics = drive_metrics(rng, failed)
        if kind == "perceive":
            metrics["detection_recall"] = round(
                rng.uniform(0.55, 0.8) if failed else rng.uniform(0.93, 0.995), 4
            )
            dets = [{"t": round(i * 0.1, 1), "objects": rng.randint(0, 25)} for i in range(36)]
            return "detections.json", {"frames": dets}, metrics
        x = y = 0.0
        steps = []
        for i in range(48):
            v = round(rng.uniform(4.0, 16.0), 3)
            x, y = x + v * 0.1, y + rng.uniform(-0.2, 0.2)
            ttc = metrics["min_ttc_s"] if i == 30 else round(rng.uniform(metrics["min_ttc_s"], 12.0), 3)
            steps.append({"t": round(i * 0.1, 1), "x": round(x, 3), "y": round(y, 3), "v": v, "ttc_s": ttc})
        trace = "".join(json.dumps(s, sort_keys=True) + "\n" for s in steps)
        return "trace.jsonl", trace, metrics
    if kind == "summary":
        return summarize_inputs(docs)
    verdict = "scenario_failed" if failed else upstream_verdict(docs)
    carried = upstream_metrics(docs)
    if kind == "render":
        fps, seconds = 10, rng.uniform(8.0, 30.0)
        frames = int(seconds * fps)
        keyframes = [{"index": i, "t": round(i / fps, 2)} for i in range(0, frames, max(1, frames // 12))]
        doc = {"fps": fps, "frames": frames, "keyframes": keyframes, "verdict": verdict}
        return "frames.json", doc, {"frames": frames, "scenario_verdict": verdict}
    checks = [
        {"name": name, "metric": metric, "value": carried[metric], "passed": bool(ok(carried[metric]))}
        for name, metric, ok in CHECKS
        if isinstance(carried.get(metric), int | float)
    ]
    if any(not c["passed"] for c in checks):
        verdict = "scenario_failed"
    metrics = {**carried, "scenario_verdict": verdict, "checks_failed": sum(not c["passed"] for c in checks)}
    if kind == "evaluate":
        return "metrics.json", {"verdict": verdict, "checks": checks, "metrics": metrics}, metrics
    report = {
        "run_id": env.run_id,
        "case_id": env.case_id,
        "verdict": verdict,
        "metrics": metrics,
        "inputs": sorted(env.inputs.values()),
        "build_id": env.build_id,
        "image": env.image,
    }
    return "case_report.json", report, metrics


def summarize_inputs(docs: Mapping[str, Any]) -> tuple[str, Any, dict[str, Any]]:
    """The run-level summary: its inputs are shard summaries (``cases``) or phase results."""
    by_outcome: dict[str, int] = {}
    by_graph: dict[str, dict[str, int]] = {}
    for doc in docs.values():
        cases = doc.get("cases")
        entries = cases if isinstance(cases, list) else [doc]
        for case in entries:
            if not isinstance(case, dict):
                continue
            outcome, graph = str(case.get("outcome", "unknown")), str(case.get("graph", ""))
            by_outcome[outcome] = by_outcome.get(outcome, 0) + 1
            per = by_graph.setdefault(graph, {})
            per[outcome] = per.get(outcome, 0) + 1
    total = sum(by_outcome.values())
    summary = {"inputs": len(docs), "cases": total, "by_outcome": by_outcome, "by_graph": by_graph}
    return "summary.json", summary, {"cases": total, **by_outcome}
