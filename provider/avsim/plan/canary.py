"""The canary: the small share of a week's cases that runs first, to catch a bad build early.

:func:`select_canary` picks the cases: ``max(min_cases, ceil(share x cases))``, spread over the
graph families in proportion to their size (at least one case of each family while there are
enough), each family's cases taken in an order fixed by a hash of their id, so the same manifest
always gives the same canary. A week no larger than ``min_cases`` has no canary stage: the whole
week is then as small as a canary and runs at once.

:func:`gate_decision` is the canary gate's rule, on the canary's first attempts (attempt 1 of
each of its phases, as the ledger records them): a canary case *failed* when one of its phases'
first attempts is evidence of a bad build (a crash, an OOM, a lost heartbeat, an image that does
not pull). The gate fails as soon as failed cases exceed ``max_failure_rate`` of the canary (it
cannot recover below), and passes when the canary shard run has finished under the threshold.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from avsim.phases.contract import Outcome

PASSED = "passed"
FAILED = "failed"
WAITING = "waiting"


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
    first_attempts: Mapping[str, Iterable[Mapping[str, Any]]],
    *,
    threshold: float,
    canary_done: bool,
    build: str,
) -> GateDecision:
    """Decide the gate from each canary case's first-attempt records (``{"outcome", "detail", ...}``).

    ``first_attempts`` maps every canary case id to the ended first attempts of its phases seen so far.
    """
    cases = len(first_attempts)
    failures: dict[str, int] = {}
    failed_cases = finished = 0
    for records in first_attempts.values():
        recs = list(records)
        if recs:
            finished += 1
        bad = [r for r in recs if _counts_against_build(r.get("outcome"))]
        if bad:
            failed_cases += 1
            for r in bad:
                key = str(r.get("detail") or r.get("outcome"))
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


def _counts_against_build(outcome: Any) -> bool:
    try:
        return Outcome(str(outcome)).counts_against_build
    except ValueError:
        return False
