"""Triage's decisions, as pure functions: which cases, which verdict, what fits, what the audit reruns.

A case is triaged when it fails its scenario this week and passed last week, matched as the report
matches weeks (:func:`avsim.report.compare.compare_cases`). Its failing phase and downstream rerun
K times on this build and once on last week's; :func:`verdict_of` reads the reruns. The budget
(:func:`fit_budget`) keeps triage under a share of the week's GPU-seconds and inside the deadline.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import Field

from avsim.phases.contract import Outcome
from avsim.plan.model import FamilyPlan, WeeklyPlan
from avsim.report.compare import compare_cases
from avsim.settings import TriageSettings
from avsim.triage.model import (
    BuildSide,
    CaseTriage,
    NewlyFailing,
    OutputDifference,
    Rerun,
    TriageReport,
    TriageVerdict,
    _Model,
)

#: ``[avsim] triage_gpu_share``, ``triage_reruns`` and ``determinism_sample``'s defaults.
GPU_SHARE = TriageSettings().gpu_share
RERUNS = TriageSettings().reruns
AUDIT_SHARE = TriageSettings().determinism_sample
#: The fewest passed cases the determinism audit reruns (all of them when the week has fewer).
AUDIT_MIN = 5


class Candidate(NewlyFailing):
    """A case that newly fails its scenario: what triage reruns, and how it ranks."""

    #: Higher first (the failing phase's weight in the plan: its remaining critical path); None: unknown.
    priority: int | None = None

    def not_triaged(self, reason: str) -> CaseTriage:
        return self.triaged((), TriageVerdict.NOT_TRIAGED, reason)

    def triaged(self, reruns: Sequence[Rerun], verdict: TriageVerdict, reason: str) -> CaseTriage:
        return CaseTriage(
            **self.model_dump(include=set(NewlyFailing.model_fields)),
            reruns=tuple(reruns),
            verdict=verdict,
            reason=reason,
        )


# ----------------------------------------------------------------------------- which cases


def from_comparison(comparison: Mapping[str, Any]) -> tuple[Candidate, ...]:
    """The cases to triage from a comparison (the report's ``comparison`` section or
    :func:`compare_cases`'s result): failed their scenario now, passed last week."""
    return tuple(
        Candidate(
            case_id=str(e["case_id"]),
            previous_case_id=str(e.get("previous_case_id") or ""),
            scenario_uri=str(e.get("scenario_uri") or ""),
            graph=str(e.get("graph") or ""),
            failing_phase=str(e["failing_phase"]),
            priority=None,
        )
        for e in comparison.get("newly_failing") or ()
        if e.get("outcome") == Outcome.SCENARIO_FAILED.value
        and e.get("previous_outcome") == Outcome.PASSED.value
        and e.get("failing_phase")
    )


def newly_failing(
    current: Sequence[Mapping[str, Any]], previous: Sequence[Mapping[str, Any]]
) -> tuple[Candidate, ...]:
    """The cases to triage from this week's and last week's ``cases.csv`` rows."""
    return from_comparison(compare_cases(current, previous))


def nothing_to_triage(comparison: Mapping[str, Any], *, canary_stopped: bool = False) -> str:
    """Why triage has nothing to do this week, in one sentence; "" when it has work."""
    if canary_stopped:
        return "the canary gate stopped this build: a bad build gets no triage"
    if not comparison.get("available"):
        why = str(comparison.get("message") or "no previous week to compare with")
        return f"nothing to triage: {why}"
    if not from_comparison(comparison):
        week = comparison.get("week") or "last week"
        return f"nothing to triage: no case newly fails its scenario against {week}"
    return ""


# ----------------------------------------------------------------------------- the verdict


def _short(digest: str) -> str:
    return digest[:19] if digest.startswith("sha256:") else digest


def _what_went_wrong(rerun: Rerun) -> str:
    side = "this build" if rerun.build is BuildSide.THIS else "last week's build"
    why = f" ({rerun.reason})" if rerun.reason else ""
    if rerun.outcome is None:
        return f"rerun {rerun.index} on {side} could not start{why}"
    return f"rerun {rerun.index} on {side} ended {rerun.outcome.value}{why}"


def verdict_of(reruns: Sequence[Rerun], k: int = RERUNS) -> tuple[TriageVerdict, str]:
    """The verdict of a case from its reruns, and the sentence that justifies it.

    Flaky: a rerun of this build passed, or last week's build fails it too. Regression: at least
    ``k`` reruns of this build failed the scenario, none passed, and last week's build passed it.
    Environment: anything else (reruns that could not start or ended without a result).
    """
    this = [r for r in reruns if r.build is BuildSide.THIS]
    last = [r for r in reruns if r.build is BuildSide.LAST]
    passed = [r for r in this if r.outcome is Outcome.PASSED]
    if passed:
        return TriageVerdict.FLAKY, f"passed on {len(passed)} of {len(this)} reruns of this build"
    if failed_last := [r for r in last if r.outcome is Outcome.SCENARIO_FAILED]:
        digest = _short(failed_last[0].build_digest)
        return TriageVerdict.FLAKY, f"fails its scenario on last week's build ({digest}) too"
    failed = [r for r in this if r.outcome is Outcome.SCENARIO_FAILED]
    last_passed = [r for r in last if r.outcome is Outcome.PASSED]
    if len(failed) >= k and last_passed:
        digest = _short(last_passed[0].build_digest)
        return TriageVerdict.REGRESSION, (
            f"failed its scenario in {len(failed)} of {len(this)} reruns of this build "
            f"and passed on last week's build ({digest})"
        )
    problems = [_what_went_wrong(r) for r in reruns if not r.is_result]
    if len(failed) < k and not any(r.build is BuildSide.THIS and not r.is_result for r in reruns):
        problems.append(f"{len(failed)} of {k} reruns of this build ran")
    if not last:
        problems.append("no rerun on last week's build ran")
    return TriageVerdict.ENVIRONMENT, "; ".join(problems) or "the reruns gave no result"


def triage_case(candidate: Candidate, reruns: Sequence[Rerun], k: int = RERUNS) -> CaseTriage:
    """The case's triage from its reruns (the reruns of other cases are ignored)."""
    own = [r for r in reruns if r.case_id == candidate.case_id]
    verdict, reason = verdict_of(own, k)
    return candidate.triaged(own, verdict, reason)


# ----------------------------------------------------------------------------- the budget


class RerunCost(_Model):
    """What a case's reruns cost: GPU-seconds in all, and the time until the last one ends."""

    gpu_seconds: float = Field(ge=0)
    wall_seconds: float = Field(ge=0)


def downstream_of(family: FamilyPlan, phase: str) -> tuple[str, ...]:
    """``phase`` and every phase after it in ``family``, in the family's (topological) order."""
    family.phase(phase)  # KeyError for a phase the family does not have
    found = {phase}
    for p in family.phases:
        if set(p.upstream) & found:
            found.add(p.name)
    return tuple(p.name for p in family.phases if p.name in found)


def rerun_cost(family: FamilyPlan, phase: str, reruns: int) -> RerunCost:
    """The failing phase and its downstream, ``reruns`` times, from the plan's estimates.

    The reruns of a case run side by side: its wall time is the phase's remaining critical path.
    """
    names = set(downstream_of(family, phase))
    once = sum(p.estimated_seconds * p.gpus for p in family.phases if p.name in names)
    return RerunCost(
        gpu_seconds=once * reruns, wall_seconds=family.phase(phase).remaining_critical_path_seconds
    )


def with_plan(
    plan: WeeklyPlan, candidates: Iterable[Candidate], reruns: int
) -> tuple[list[Candidate], dict[str, RerunCost]]:
    """The candidates ranked by their failing phase's weight in ``plan``, and their rerun costs
    (none for a case whose graph or phase the plan lacks)."""
    ranked: list[Candidate] = []
    costs: dict[str, RerunCost] = {}
    for c in candidates:
        try:
            family = plan.family(c.graph)
            weight = family.phase(c.failing_phase).priority_weight
        except KeyError:
            ranked.append(c)
            continue
        ranked.append(c.model_copy(update={"priority": weight}))
        costs[c.case_id] = rerun_cost(family, c.failing_phase, reruns)
    return ranked, costs


def measured_costs(
    plan: WeeklyPlan, rows: Sequence[Mapping[str, Any]], candidates: Iterable[Candidate], reruns: int
) -> dict[str, RerunCost]:
    """Each candidate's rerun cost from what this week measured: its own phases' durations, and for a
    phase it never ran (downstream of its failure) the median of that phase over the week's cases.
    The same scale as the week's GPU-seconds, whatever the plan's estimates say."""
    import statistics

    seen: dict[tuple[str, str], list[float]] = {}
    mine: dict[str, Mapping[str, Any]] = {}
    for r in rows:
        mine[str(r["case_id"])] = r.get("durations") or {}
        for phase, took in (r.get("durations") or {}).items():
            if took is not None:
                seen.setdefault((str(r.get("graph")), phase), []).append(float(took))
    costs: dict[str, RerunCost] = {}
    for c in candidates:
        try:
            family = plan.family(c.graph)
            names = downstream_of(family, c.failing_phase)
        except KeyError:
            continue
        own = mine.get(c.case_id, {})
        gpu = wall = 0.0
        for name in names:
            took = own.get(name)
            if took is None:
                week = seen.get((c.graph, name))
                took = statistics.median(week) if week else family.phase(name).estimated_seconds
            gpu += float(took) * family.phase(name).gpus
            wall += float(took)
        costs[c.case_id] = RerunCost(gpu_seconds=gpu * reruns, wall_seconds=wall)
    return costs


class BudgetDecision(_Model):
    chosen: tuple[Candidate, ...]
    not_triaged: tuple[CaseTriage, ...]
    budget_gpu_seconds: float
    planned_gpu_seconds: float


def ranked(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Highest priority first (unknown priorities last), then by case id."""
    return sorted(candidates, key=lambda c: (c.priority is None, -(c.priority or 0), c.case_id))


def fit_budget(
    candidates: Iterable[Candidate],
    costs: Mapping[str, RerunCost],
    *,
    week_gpu_seconds: float,
    seconds_left: float,
    share: float = GPU_SHARE,
) -> BudgetDecision:
    """Which cases triage reruns: in rank order, each whose reruns fit what is left of
    ``share`` of the week's GPU-seconds and end before the deadline; the rest not triaged."""
    budget = max(0.0, share * week_gpu_seconds)
    left = budget
    chosen: list[Candidate] = []
    skipped: list[CaseTriage] = []
    for c in ranked(candidates):
        cost = costs.get(c.case_id)
        if share <= 0:
            why = "[avsim] triage_gpu_share is 0: triage is off"
        elif cost is None:
            why = f"the plan has no phase {c.failing_phase!r} in graph {c.graph!r} to estimate its reruns"
        elif cost.wall_seconds > seconds_left:
            why = (
                f"its reruns take about {cost.wall_seconds / 60:.0f} min and "
                f"{max(0.0, seconds_left) / 60:.0f} min are left before the deadline"
            )
        elif cost.gpu_seconds > left + 1e-9:
            why = (
                f"its reruns need {cost.gpu_seconds / 3600:.2f} GPU-hours and {left / 3600:.2f} were left "
                f"of the triage budget ({share:.1%} of the week's {week_gpu_seconds / 3600:.1f} GPU-hours)"
            )
        else:
            chosen.append(c)
            left -= cost.gpu_seconds
            continue
        skipped.append(c.not_triaged(why))
    return BudgetDecision(
        chosen=tuple(chosen),
        not_triaged=tuple(skipped),
        budget_gpu_seconds=budget,
        planned_gpu_seconds=budget - left,
    )


def triage_report(
    run_key: str,
    decision: BudgetDecision,
    reruns: Sequence[Rerun],
    k: int = RERUNS,
    **meta: Any,
) -> TriageReport:
    """The week's triage document: a verdict for each chosen case from its reruns, and the cases
    the budget left out; ``meta`` fills the rest (iso_week, build digests, audit, message)."""
    cases = [triage_case(c, reruns, k) for c in decision.chosen]
    return TriageReport.of(
        run_key,
        [*cases, *decision.not_triaged],
        budget_gpu_seconds=decision.budget_gpu_seconds,
        planned_gpu_seconds=decision.planned_gpu_seconds,
        **meta,
    )


# ----------------------------------------------------------------------------- the audit


def audit_sample(
    passed: Iterable[str], seed: str, share: float = AUDIT_SHARE, minimum: int = AUDIT_MIN
) -> tuple[str, ...]:
    """``share`` of the passed cases (at least ``minimum``, at most all), the same for the same
    ``seed`` (the week's id) and cases in any order; none when ``share`` is 0 (the audit is off)."""
    if share <= 0:
        return ()
    ids = sorted(set(passed))
    count = min(len(ids), max(minimum, math.ceil(share * len(ids))))

    def rank(case_id: str) -> bytes:
        return hashlib.sha256(f"{seed}\0{case_id}".encode()).digest()

    return tuple(sorted(sorted(ids, key=rank)[:count]))


def differing_outputs(
    case_id: str,
    declared: Mapping[str, Sequence[str]],
    first: Mapping[str, Mapping[str, str]],
    again: Mapping[str, Mapping[str, str]],
) -> list[OutputDifference]:
    """The declared deterministic outputs (phase -> paths) whose digests differ between the week's
    attempt (``first``: phase -> path -> digest) and the audit's rerun (``again``), or are missing."""
    found: list[OutputDifference] = []
    for phase in sorted(declared):
        for output in declared[phase]:
            a = first.get(phase, {}).get(output)
            b = again.get(phase, {}).get(output)
            if a is None or b is None or a != b:
                found.append(OutputDifference(case_id=case_id, phase=phase, output=output, first=a, again=b))
    return found
