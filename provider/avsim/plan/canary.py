"""The canary: the small share of a week's cases that runs first, to catch a bad build early.

:func:`select_canary` picks ``max(min_cases, ceil(share x cases))`` cases spread over the graph
families, in an order fixed by a hash of their ids; :func:`gate_decision` is the gate's rule on the
canary's first attempts of the gate's round (:func:`attempt_evidence`, :func:`round_since`)
(docs/design.md, "A bad build").
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from avsim.contracts.week import ShardSummary
from avsim.ledger.records import AttemptRecord
from avsim.phases.contract import is_build_evidence, says_nothing_of_build

PASSED = "passed"
FAILED = "failed"
WAITING = "waiting"
#: The gate can never decide: the ``canary`` task ended without running the canary this round.
STALLED = "stalled"


def canary_size(cases: int, share: float, min_cases: int) -> int:
    """How many canary cases a week of ``cases`` gets (0: no canary stage)."""
    if cases <= min_cases:
        return 0
    return min(cases, max(min_cases, math.ceil(share * cases)))


def select_canary(
    case_ids: Sequence[str], families: Sequence[str], share: float, min_cases: int
) -> list[int]:
    """Indexes (in manifest order) of the canary cases."""
    n = canary_size(len(case_ids), share, min_cases)
    if not n:
        return []
    by_family: dict[str, list[int]] = {}
    for i, fam in enumerate(families):
        by_family.setdefault(fam, []).append(i)
    # Largest-remainder apportionment, at least one per family while n allows.
    quotas = {f: n * len(ix) / len(case_ids) for f, ix in by_family.items()}
    take = {
        f: min(len(by_family[f]), max(1 if n >= len(by_family) else 0, math.floor(q)))
        for f, q in quotas.items()
    }
    order = sorted(by_family, key=lambda f: quotas[f] - math.floor(quotas[f]), reverse=True)
    while sum(take.values()) < n:
        for f in order:
            if sum(take.values()) >= n:
                break
            if take[f] < len(by_family[f]):
                take[f] += 1
    while sum(take.values()) > n:
        f = max(take, key=lambda f: take[f])
        take[f] -= 1
    chosen: list[int] = []
    for f, ix in by_family.items():
        ranked = sorted(ix, key=lambda i: hashlib.sha256(case_ids[i].encode()).hexdigest())
        chosen.extend(ranked[: take[f]])
    return sorted(chosen)


@dataclass(frozen=True)
class GateDecision:
    state: str  # passed | failed | waiting
    cases: int
    failed_cases: int
    finished_cases: int
    failures: dict[str, int] = field(default_factory=dict)
    threshold: float = 0.0
    message: str = ""

    @property
    def rate(self) -> float:
        return self.failed_cases / self.cases if self.cases else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "cases": self.cases,
            "failed_cases": self.failed_cases,
            "finished": self.finished_cases,
            "failures": dict(self.failures),
            "rate": round(self.rate, 4),
            "threshold": self.threshold,
            "message": self.message,
        }


def gate_decision(
    first_attempts: Mapping[str, Iterable[AttemptRecord]],
    *,
    threshold: float,
    canary_done: bool,
    build: str,
) -> GateDecision:
    """Decide the gate from each canary case's first-attempt records (their outcome and detail).

    ``first_attempts`` maps every canary case id to the ended first attempts of its phases seen so far.
    """
    cases = len(first_attempts)
    failures: dict[str, int] = {}
    failed_cases = finished = 0
    for records in first_attempts.values():
        recs = list(records)
        if recs:
            finished += 1
        bad = [r for r in recs if is_build_evidence(r.outcome, r.detail)]
        if bad:
            failed_cases += 1
            for r in bad:
                key = str(r.detail or (r.outcome.value if r.outcome is not None else ""))
                failures[key] = failures.get(key, 0) + 1
    counts = ", ".join(f"{k} {v}" for k, v in sorted(failures.items())) or "none"
    summary = f"{failed_cases} of {cases} canary cases failed on build {build} (first attempts: {counts})"
    if cases and failed_cases / cases > threshold:
        return GateDecision(
            FAILED,
            cases,
            failed_cases,
            finished,
            failures,
            threshold,
            f"canary gate FAILED: {summary}, above the threshold of {threshold:.0%}; the rest of the week is "
            "not started. Fix the build and start a new run (or rerun with `avsim rerun-failed --build`).",
        )
    if canary_done:
        return GateDecision(
            PASSED,
            cases,
            failed_cases,
            finished,
            failures,
            threshold,
            f"canary gate passed: {summary}, at most {threshold:.0%}",
        )
    return GateDecision(
        WAITING, cases, failed_cases, finished, failures, threshold, f"canary running: {summary}"
    )


#: What the gate does with one attempt record of a canary phase (:func:`attempt_evidence`).
TAKE, SKIP, WAIT = "take", "skip", "wait"

#: States of the parent's ``canary`` task in which it has not (yet) repaired its shard run this round.
_PENDING_TASK_STATES = frozenset(
    {"none", "scheduled", "queued", "running", "deferred", "up_for_retry", "up_for_reschedule", "restarting"}
)


def attempt_evidence(record: AttemptRecord | None, since: str) -> str:
    """Whether a canary phase's attempt record is the gate's evidence (TAKE), says nothing of this
    round (SKIP: look at the phase's next attempt), or has not ended (WAIT).

    ``since``: when the gate's round began (ISO-8601 UTC, "" for every attempt). A preemption or an
    attempt the platform lost says nothing about the build; a failure that ended before the round
    began is the last round's, and the repair runs the phase again.
    """
    if record is None or record.outcome is None or not record.ended:
        return WAIT
    if says_nothing_of_build(record.outcome, record.detail):
        return SKIP
    if since and not record.outcome.produced_output and record.ended_at < since:
        return SKIP
    return TAKE


def summary_is_current(summary: ShardSummary | None, since: str) -> bool:
    """The canary shard run finished this round: its summary exists and was written after ``since``."""
    if summary is None:
        return False
    return not since or summary.written_at >= since


def round_since(
    *,
    gate_try_round: int,
    canary_run_state: str | None,
    canary_task_state: str | None,
    last_repair_at: str,
    now: str,
) -> str:
    """When the canary gate's current round began ("": the first round, every attempt counts).

    ``gate_try_round``: the first try of the gate's round (1 until the gate is cleared).
    ``canary_run_state``: the canary shard run's state; ``canary_task_state``: the parent's ``canary``
    task's; ``last_repair_at``: when the canary shard run was last repaired in place ("" never).

    - A canary shard run still failed while the ``canary`` task is pending (cleared with the gate) is
      about to be repaired: the round begins now, and every failure so far is stale.
    - Otherwise the round began with the canary's last repair in place (a gate cleared alone, with
      nothing rerun, decides on the same evidence as before, and fails again when it failed).
    """
    if gate_try_round <= 1 and not last_repair_at:
        return ""
    task_state = str(canary_task_state or "none").lower()
    if str(canary_run_state or "").lower() == "failed" and task_state in _PENDING_TASK_STATES:
        return now
    return last_repair_at
