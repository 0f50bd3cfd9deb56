"""The canary gate's trigger: watches the canary's first attempts in the ledger and decides the gate.

It reads, at an interval, the canary cases' phases' first attempts of the gate's round (each phase's
attempt records in order, until one is its evidence: :func:`avsim.plan.canary.attempt_evidence`; a
decided phase is kept), and whether the canary shard run has written its summary this round. It writes
the gate's state to ``canary/gate.json`` (for the report and the UI page) whenever it changes, and
fires one event when the gate is decided (``passed`` / ``failed``) or cannot be (``error``).
Arguments are JSON-friendly; the classpath comes from ``__module__``/``__qualname__``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from avsim.artifacts import RunLayout
from avsim.plan.canary import (
    SKIP,
    TAKE,
    WAITING,
    GateDecision,
    attempt_evidence,
    gate_decision,
    summary_is_current,
)


class CanaryGateTrigger(BaseTrigger):
    """:param canary_cases: canary case id -> its phase names. :param shard: the canary's shard index.
    :param since: when the gate's round began (ISO-8601 UTC; "" for the first round: every attempt
        counts), see :func:`avsim.plan.canary.round_since`.
    """

    def __init__(
        self,
        *,
        artifact_root: str,
        run_key: str,
        canary_cases: dict[str, list[str]],
        threshold: float,
        build: str,
        shard: int = 0,
        poll_interval: float = 30.0,
        image: str = "",
        since: str = "",
    ) -> None:
        super().__init__()
        self.artifact_root = artifact_root
        self.run_key = run_key
        self.canary_cases = {str(k): list(v) for k, v in canary_cases.items()}
        self.threshold = float(threshold)
        self.build = build
        self.shard = int(shard)
        self.poll_interval = float(poll_interval)
        #: The build's image reference: a failed gate opens the breaker of its digest at once.
        self.image = image
        self.since = since
        #: (case, phase) -> the attempt number to read next, until the phase is decided.
        self._next_attempt: dict[tuple[str, str], int] = {}

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "artifact_root": self.artifact_root,
                "run_key": self.run_key,
                "canary_cases": self.canary_cases,
                "threshold": self.threshold,
                "build": self.build,
                "shard": self.shard,
                "poll_interval": self.poll_interval,
                "image": self.image,
                "since": self.since,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        seen: dict[str, dict[str, dict[str, Any]]] = {c: {} for c in self.canary_cases}
        last_state: dict[str, Any] | None = None
        try:
            while True:
                decision = await asyncio.to_thread(self.check, seen)
                state = decision.to_json()
                if state != last_state:
                    await asyncio.to_thread(self.record, decision)
                    last_state = state
                if decision.state != WAITING:
                    yield TriggerEvent({"status": decision.state, **state})
                    return
                await asyncio.sleep(self.poll_interval)
        except Exception as exc:
            yield TriggerEvent({"status": "error", "message": f"{type(exc).__name__}: {exc}"})

    def check(self, seen: dict[str, dict[str, dict[str, Any]]]) -> GateDecision:
        """One look at the ledger (blocking; runs in a thread). ``seen``: the decided phases' evidence."""
        from avsim.ledger.documents import DocumentStore

        docs = DocumentStore()
        layout = RunLayout(self.artifact_root, self.run_key)
        cursor = self._next_attempt
        for case_id, phases in self.canary_cases.items():
            for phase in phases:
                if phase in seen[case_id]:
                    continue
                n = cursor.get((case_id, phase), 1)
                while True:  # the phase's attempts in order, until one is this round's evidence
                    rec = docs.read(layout.attempt_record(case_id, phase, n))
                    step = attempt_evidence(rec, self.since)
                    if step == TAKE and isinstance(rec, dict):
                        seen[case_id][phase] = rec
                    if step != SKIP:
                        break
                    n += 1
                cursor[(case_id, phase)] = n
        done = summary_is_current(docs.read(layout.shard_summary(self.shard)), self.since)
        return gate_decision(
            {c: list(v.values()) for c, v in seen.items()},
            threshold=self.threshold,
            canary_done=done,
            build=self.build,
        )

    def record(self, decision: GateDecision) -> None:
        from avsim.ledger.documents import DocumentStore

        if decision.state == "failed" and self.image:
            # Stop the build at the moment of the decision, not when a worker next runs the sensor:
            # canary attempts not yet started (retries included) then fail fast as bad_build.
            from avsim.ledger.breaker import Breaker, image_digest

            Breaker(self.artifact_root, image_digest(self.image), self.build).trip(
                f"canary gate: {decision.to_json().get('message', 'failed')}"
            )
        layout = RunLayout(self.artifact_root, self.run_key)
        DocumentStore().put(
            layout.canary_gate,
            {
                **decision.to_json(),
                "build_id": self.build,
                "round_since": self.since,
                "updated_at": dt.datetime.now(dt.UTC).isoformat(),
            },
        )
