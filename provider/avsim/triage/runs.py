"""Triage's shard runs: which reruns a round starts, on which build, and the files they read.

A round reruns its chosen cases K times on this week's build and K times on last week's, one shard
run per (build, rerun) so each keeps the case's id, seed and inputs; the determinism audit's passed
cases ride in the first run of this build. Each run writes under a run key of its own beside the
week's (:func:`avsim.artifacts.triage_run_key`), so nothing the week committed changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import Field

from avsim.artifacts import RunLayout, triage_run_id, triage_run_key
from avsim.contracts import RunDescriptor, ShardConf
from avsim.triage.decide import Candidate, downstream_of
from avsim.triage.model import BuildSide, CaseTriage, _Model

#: The shard index of a triage run's one shard (its cases file and its summary).
TRIAGE_SHARD = 1
PLAN_FILE = "triage_plan.json"


class TriageRun(_Model):
    """One triage shard run: the build it reruns on, which rerun it is, and its cases."""

    label: str = Field(min_length=1)
    build: BuildSide
    index: int = Field(ge=1)
    image: str = Field(min_length=1)
    run_id: str = Field(min_length=1)
    run_key: str = Field(min_length=1)
    #: The newly failing cases it reruns (from their failing phase), then the audit's passed cases.
    cases: tuple[str, ...] = ()
    audit: tuple[str, ...] = ()
    #: Newly passing cases rerun once to confirm the pass.
    confirm: tuple[str, ...] = ()


class TriageRound(_Model):
    """What one round of triage decided and started (a later round triages cases a repair newly failed)."""

    round: int = Field(ge=1)
    chosen: tuple[Candidate, ...] = ()
    not_triaged: tuple[CaseTriage, ...] = ()
    audit: tuple[str, ...] = ()
    confirm: tuple[str, ...] = ()
    passed_cases: int = Field(default=0, ge=0)
    budget_gpu_seconds: float = Field(default=0.0, ge=0)
    planned_gpu_seconds: float = Field(default=0.0, ge=0)
    runs: tuple[TriageRun, ...] = ()


class TriageBook(_Model):
    """``report/triage_plan.json``: the week's rounds, and what the report says when nothing was triaged."""

    week_run_key: str = Field(min_length=1)
    iso_week: str = ""
    build_digest: str = ""
    previous_run_key: str = ""
    previous_build_digest: str = ""
    previous_image: str = ""
    message: str = ""
    rounds: tuple[TriageRound, ...] = ()

    @property
    def runs(self) -> tuple[TriageRun, ...]:
        return tuple(r for rnd in self.rounds for r in rnd.runs)

    @property
    def planned_cases(self) -> frozenset[str]:
        return frozenset(
            c
            for rnd in self.rounds
            for c in (*(x.case_id for x in rnd.chosen), *(x.case_id for x in rnd.not_triaged))
        )


def plan_uri(layout: RunLayout) -> str:
    return f"{layout.report_dir}/{PLAN_FILE}"


def round_runs(
    week: RunDescriptor,
    round_no: int,
    chosen: Sequence[Candidate],
    audit: Sequence[str],
    reruns: int,
    previous_image: str,
    confirm: Sequence[str] = (),
) -> tuple[TriageRun, ...]:
    """The shard runs of a round: ``reruns`` on this build (the audit and the confirmations in the
    first), as many on last week's (none when its image is unknown)."""
    cases = tuple(c.case_id for c in chosen)
    runs: list[TriageRun] = []
    sides = [(BuildSide.THIS, week.image)] + ([(BuildSide.LAST, previous_image)] if previous_image else [])
    for side, image in sides:
        for n in range(1, reruns + 1):
            first = side is BuildSide.THIS and n == 1
            with_audit = tuple(audit) if first else ()
            with_confirm = tuple(confirm) if first else ()
            if not cases and not with_audit and not with_confirm:
                continue
            label = f"{round_no}_{side.value}_{n}"
            runs.append(
                TriageRun(
                    label=label,
                    build=side,
                    index=n,
                    image=image,
                    run_id=triage_run_id(week.run_id or week.run_key, label),
                    run_key=triage_run_key(week.run_key, label),
                    cases=cases,
                    audit=with_audit,
                    confirm=with_confirm,
                )
            )
    return tuple(runs)


def run_descriptor(week: RunDescriptor, run: TriageRun) -> RunDescriptor:
    """A triage run's descriptor: the week's, on the run's build, under its own key, outside admission."""
    return week.model_copy(
        update={
            "run_key": run.run_key,
            "run_id": run.run_id,
            "image": run.image,
            "triage_of": week.run_key,
            "admission": None,
            "canary_count": 0,
            "shard_count": 1,
            "case_count": len(run.cases) + len(run.audit) + len(run.confirm),
        }
    )


def rerun_entries(
    run: TriageRun,
    entries: Mapping[str, Mapping[str, Any]],
    chosen: Iterable[Candidate],
    family_phases: Mapping[str, Any],
) -> dict[str, list[dict[str, Any]]]:
    """The run's cases file (family -> case entries): each newly failing case fresh from its failing
    phase on, each audited or confirmed case fresh in every phase. ``entries``: case id -> the week's entry;
    ``family_phases``: family name -> its :class:`~avsim.plan.model.FamilyPlan`."""
    failing = {c.case_id: c.failing_phase for c in chosen}
    by_family: dict[str, list[dict[str, Any]]] = {}
    for case_id in dict.fromkeys((*run.cases, *run.audit, *run.confirm)):
        entry = dict(entries[case_id])
        family = family_phases[str(entry.get("family") or entry.get("graph"))]
        fresh = (
            downstream_of(family, failing[case_id])
            if case_id in run.cases
            else tuple(p.name for p in family.phases)
        )
        by_family.setdefault(family.name, []).append({**entry, "fresh_phases": list(fresh)})
    return by_family


def shard_conf(week: RunDescriptor, run: TriageRun) -> dict[str, Any]:
    return ShardConf(run=run_descriptor(week, run), shard=TRIAGE_SHARD).to_json()
