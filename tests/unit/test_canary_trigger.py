"""The canary gate's trigger: JSON-friendly arguments, and a failed gate stops the build at once."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from avsim.artifacts import RunLayout
from avsim.ledger.breaker import Breaker
from avsim.ledger.documents import DocumentStore
from avsim.triggers.canary import CanaryGateTrigger

IMAGE = "registry.example.com/sim/av@sha256:" + "c" * 64


def _trigger(root: str, image: str = IMAGE) -> CanaryGateTrigger:
    return CanaryGateTrigger(
        artifact_root=root,
        run_key="avsim_weekly__r1",
        canary_cases={"c1": ["prepare"], "c2": ["prepare"], "c3": ["prepare"]},
        threshold=0.5,
        build="sim-1",
        shard=0,
        poll_interval=0.01,
        image=image,
    )


def test_serialize(tmp_path: Path) -> None:
    trigger = _trigger(f"file://{tmp_path}")
    classpath, kwargs = trigger.serialize()
    assert classpath == "avsim.triggers.canary.CanaryGateTrigger"
    json.dumps(kwargs)  # JSON-friendly: the triggerer stores it in the database
    again = CanaryGateTrigger(**kwargs)
    assert again.serialize() == (classpath, kwargs)


def _first_attempts(root: str, outcomes: dict[str, str]) -> None:
    layout = RunLayout(root, "avsim_weekly__r1")
    docs = DocumentStore()
    for case_id, outcome in outcomes.items():
        docs.put(
            layout.attempt_record(case_id, "prepare", 1),
            {"attempt": 1, "state": "ended", "outcome": outcome, "detail": "crash"},
        )


def _decide(trigger: CanaryGateTrigger) -> dict[str, object]:
    async def first() -> dict[str, object]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("no event")

    return asyncio.run(asyncio.wait_for(first(), timeout=30))


def test_a_failed_gate_opens_the_builds_breaker_when_it_decides(tmp_path: Path) -> None:
    root = f"file://{tmp_path}"
    _first_attempts(root, {"c1": "infra_failed", "c2": "infra_failed", "c3": "passed"})
    event = _decide(_trigger(root))
    assert event["status"] == "failed" and event["failed_cases"] == 2
    state = Breaker(root, "sha256:" + "c" * 64).state()
    assert state.is_open and state.reason.startswith("canary gate: canary gate FAILED: 2 of 3")


def test_a_passing_gate_leaves_the_breaker_closed(tmp_path: Path) -> None:
    root = f"file://{tmp_path}"
    _first_attempts(root, {"c1": "passed", "c2": "scenario_failed", "c3": "infra_failed"})
    DocumentStore().put(RunLayout(root, "avsim_weekly__r1").shard_summary(0), {"shard": 0, "cases": []})
    event = _decide(_trigger(root))
    assert event["status"] == "passed"
    assert not Breaker(root, "sha256:" + "c" * 64).state().is_open
