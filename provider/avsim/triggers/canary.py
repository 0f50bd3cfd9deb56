"""The canary gate's trigger: watches the canary's first attempts in the ledger and decides the gate.

It writes the gate's state to ``canary/gate.json`` whenever it changes and fires once the gate is
decided (``passed`` / ``failed``), cannot be (``error``), or never will be (``stalled``: the ``canary``
task ended without running the canary this round). Arguments are JSON-friendly; the rule is
:func:`avsim.plan.canary.gate_decision` (docs/design.md, "A bad build").
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator
from functools import cached_property
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from avsim.artifacts import RunLayout
from avsim.contracts.week import CanaryPlan, ShardSummary
from avsim.ledger.records import AttemptRecord
from avsim.plan.canary import (
    FAILED,
    SKIP,
    STALLED,
    TAKE,
    WAITING,
    GateDecision,
    attempt_evidence,
    gate_decision,
    summary_is_current,
)

#: States of the ``canary`` task in which it will not run the canary again without a user's clear.
CANARY_TASK_ENDED = frozenset({"failed", "upstream_failed", "skipped", "removed"})


class CanaryGateTrigger(BaseTrigger):
    """:param plan: the week's canary plan (:class:`avsim.contracts.week.CanaryPlan`, as JSON): its
        cases and their phases, its shard, the gate's threshold, and the run (artifact root, run key,
        build and image) in its shard run's conf.
    :param since: when the gate's round began (ISO-8601 UTC; "" for the first round: every attempt
        counts), see :func:`avsim.plan.canary.round_since`.
    :param canary_task: the weekly run's ``canary`` task (``dag_id``, ``run_id``, ``task_id``), whose end
        without a current canary summary stalls the gate; empty: not watched.
    """

    def __init__(
        self,
        *,
        plan: dict[str, Any],
        poll_interval: float = 30.0,
        since: str = "",
        canary_task: dict[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.canary_task = dict(canary_task or {})
        #: As given (JSON): parsed where it is read, in :meth:`run`'s error handling.
        self.plan_doc = dict(plan)
        self.poll_interval = float(poll_interval)
        self.since = since
        #: (case, phase) -> the attempt number to read next, until the phase is decided.
        self._next_attempt: dict[tuple[str, str], int] = {}

    @cached_property
    def plan(self) -> CanaryPlan:
        return CanaryPlan.model_validate(self.plan_doc)

    @property
    def canary_cases(self) -> dict[str, tuple[str, ...]]:
        """Canary case id -> its phase names."""
        return self.plan.cases

    @property
    def layout(self) -> RunLayout:
        return self.plan.conf.run.layout

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "plan": self.plan_doc,
                "poll_interval": self.poll_interval,
                "since": self.since,
                "canary_task": self.canary_task,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        last_state: dict[str, Any] | None = None
        try:
            seen: dict[str, dict[str, AttemptRecord]] = {c: {} for c in self.canary_cases}
            while True:
                decision = await asyncio.to_thread(self.check, seen)
                state = decision.to_json()
                if state != last_state:
                    await asyncio.to_thread(self.record, decision)
                    last_state = state
                if decision.state != WAITING:
                    yield TriggerEvent({"status": decision.state, **state})
                    return
                ended = await asyncio.to_thread(self.canary_task_ended)
                if ended:
                    yield TriggerEvent({"status": STALLED, **state, "message": self.stalled_message(ended)})
                    return
                await asyncio.sleep(self.poll_interval)
        except Exception as exc:
            yield TriggerEvent({"status": "error", "message": f"{type(exc).__name__}: {exc}"})

    def check(self, seen: dict[str, dict[str, AttemptRecord]]) -> GateDecision:
        """One look at the ledger (blocking; runs in a thread). ``seen``: the decided phases' evidence."""
        from avsim.ledger.documents import DocumentStore

        docs = DocumentStore()
        layout = self.layout
        cursor = self._next_attempt
        for case_id, phases in self.canary_cases.items():
            for phase in phases:
                if phase in seen[case_id]:
                    continue
                n = cursor.get((case_id, phase), 1)
                while True:  # the phase's attempts in order, until one is this round's evidence
                    doc = docs.read(layout.attempt_record(case_id, phase, n))
                    rec = AttemptRecord.from_json(doc) if isinstance(doc, dict) else None
                    step = attempt_evidence(rec, self.since)
                    if step == TAKE and rec is not None:
                        seen[case_id][phase] = rec
                    if step != SKIP:
                        break
                    n += 1
                cursor[(case_id, phase)] = n
        doc = docs.read(layout.shard_summary(self.plan.shard))
        summary = ShardSummary.model_validate(doc) if doc is not None else None
        return gate_decision(
            {c: list(v.values()) for c, v in seen.items()},
            threshold=self.plan.threshold,
            canary_done=summary_is_current(summary, self.since),
            build=self.plan.conf.run.build_id,
        )

    def canary_task_ended(self) -> str:
        """The ``canary`` task's state when it ended without a success ("" while it may still run the
        canary, or when its state cannot be read: the gate keeps waiting)."""
        if not self.canary_task:
            return ""
        from avsim import airflow_internals

        try:
            state = airflow_internals.task_instance_state(
                airflow_internals.runtime_task_instance(),
                self.canary_task["dag_id"],
                self.canary_task["run_id"],
                self.canary_task["task_id"],
            )
        except Exception as exc:
            self.log.warning("the canary task's state could not be read (%s): the gate waits", exc)
            return ""
        return state if state in CANARY_TASK_ENDED else ""

    def stalled_message(self, state: str) -> str:
        task = self.canary_task.get("task_id", "canary")
        return (
            f"canary gate cannot decide: the {task} task ended {state} without running the canary this round "
            f"(its log says why: a breaker left open, a repair that failed), so no new canary attempt can "
            f"come. Fix that, then clear {task} and canary_gate together (docs/operations.md, runbook 1)"
        )

    def record(self, decision: GateDecision) -> None:
        from avsim.ledger.documents import DocumentStore

        run = self.plan.conf.run
        if decision.state == FAILED and run.image:
            # Stop the build at the moment of the decision, not when a worker next runs the sensor:
            # canary attempts not yet started (retries included) then fail fast as bad_build.
            from avsim.ledger.breaker import Breaker, image_digest

            Breaker(run.artifact_root, image_digest(run.image), run.build_id).trip(
                f"canary gate: {decision.message or FAILED}"
            )
        DocumentStore().put(
            self.layout.canary_gate,
            {
                **decision.to_json(),
                "build_id": run.build_id,
                "round_since": self.since,
                "updated_at": dt.datetime.now(dt.UTC).isoformat(),
            },
        )
