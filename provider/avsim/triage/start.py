"""Starting a round of triage once the week's cases have all run once: the ``triage_start`` task.

Reads the week as its report has it, compares it with last week, decides what fits the budget and
the deadline (:mod:`avsim.triage.decide`), writes each triage run's files and records the round in
``report/triage_plan.json``. A second call (a retry, a clear after a repair or a fix) starts only the
cases no earlier round gave a verdict of the build, so nothing already judged is rerun.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from avsim.artifacts import RunLayout
from avsim.contracts import RunDescriptor
from avsim.plan.model import WeeklyPlan
from avsim.settings import TriageSettings
from avsim.storage import exists, read_json, write_json
from avsim.triage import decide
from avsim.triage.runs import (
    TRIAGE_SHARD,
    TriageBook,
    TriageRound,
    TriageRun,
    plan_uri,
    rerun_entries,
    round_runs,
    run_descriptor,
)

log = logging.getLogger(__name__)


def read_book(layout: RunLayout) -> TriageBook | None:
    uri = plan_uri(layout)
    return TriageBook.model_validate(read_json(uri)) if exists(uri) else None


def run_deadline(head: Mapping[str, Any]) -> dt.datetime | None:
    """The run's deadline, from its manifest snapshot's head (None when it has none)."""
    deadline = (head.get("run") or {}).get("deadline")
    if not deadline:
        return None
    when = dt.datetime.fromisoformat(str(deadline).replace("Z", "+00:00"))
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)


def seconds_left(head: Mapping[str, Any], now: dt.datetime) -> float:
    """Seconds from ``now`` to the run's deadline; unbounded when it has none."""
    deadline = run_deadline(head)
    return float("inf") if deadline is None else (deadline - now).total_seconds()


def _audit(
    rows: Sequence[Mapping[str, Any]], head: Mapping[str, Any], week: RunDescriptor, share: float
) -> tuple[list[str], int]:
    """The passed cases the audit reruns (none when no phase of their graph declares a deterministic
    output), and how many passed."""
    graphs = head.get("graphs") or {}

    def declares(graph: str) -> bool:
        phases = (graphs.get(graph) or {}).get("phases") or {}
        return any(p.get("deterministic_outputs") for p in phases.values())

    passed = [
        str(r["case_id"]) for r in rows if r.get("outcome") == "passed" and declares(str(r.get("graph")))
    ]
    return list(decide.audit_sample(passed, week.run_key, share)), len(passed)


def _new_book(week: RunDescriptor, comparison: Mapping[str, Any]) -> TriageBook:
    previous = comparison.get("previous") or {}
    image = str(previous.get("image") or "")
    return TriageBook(
        week_run_key=week.run_key,
        iso_week=week.iso_week,
        build_digest=week.image.rpartition("@")[2],
        previous_run_key=str(previous.get("run_key") or ""),
        previous_build_digest=image.rpartition("@")[2],
        previous_image=image,
    )


def _why_none(week: RunDescriptor, comparison: Mapping[str, Any], canary_stopped: bool) -> str:
    """Why this run triages nothing whatever its cases: a bad build, or a rerun of failed cases."""
    if canary_stopped:
        return decide.nothing_to_triage(comparison, canary_stopped=True)
    if week.rerun_of:
        return f"nothing to triage: this run reruns failed cases of {week.rerun_of}, whose week is triaged"
    return ""


def _fit(
    left: float, wanted: Sequence[Sequence[str]], rows: Sequence[Mapping[str, Any]]
) -> tuple[list[list[str]], float]:
    """Of each list of whole-case reruns in turn (confirmations, then the audit), the cases that fit
    ``left`` GPU-seconds (a case costs what it cost the week), and what is left after them."""
    gpu = {str(r["case_id"]): float(r.get("gpu_seconds") or 0.0) for r in rows}
    kept: list[list[str]] = []
    for cases in wanted:
        kept.append([])
        for case_id in cases:
            if gpu.get(case_id, 0.0) <= left:
                kept[-1].append(case_id)
                left -= gpu.get(case_id, 0.0)
    return kept, left


def newly_passing(comparison: Mapping[str, Any]) -> list[str]:
    """The cases that pass this week and did not last week."""
    return [str(e["case_id"]) for e in comparison.get("newly_passing") or () if e.get("outcome") == "passed"]


def plan_round(
    week: RunDescriptor,
    plan: WeeklyPlan,
    settings: TriageSettings,
    rows: Sequence[Mapping[str, Any]],
    comparison: Mapping[str, Any],
    head: Mapping[str, Any],
    book: TriageBook | None,
    *,
    now: dt.datetime,
    canary_stopped: bool,
    retry: frozenset[str] = frozenset(),
) -> tuple[TriageBook, TriageRound | None]:
    """The book with this round added (None: nothing new to triage; the book says why when empty).
    ``retry``: cases an earlier round left without a verdict of the build (environment, not triaged),
    which this round may take again."""
    base = book or _new_book(week, comparison)
    first = not base.rounds
    message = _why_none(week, comparison, canary_stopped)
    new = [c for c in decide.from_comparison(comparison) if c.case_id not in base.planned_cases - retry]
    audit, passed = _audit(rows, head, week, settings.determinism_sample) if first else ([], 0)
    confirm = newly_passing(comparison) if first and settings.confirm_passing else []
    if message or (not new and not audit and not confirm):
        message = message or decide.nothing_to_triage(comparison)
        return (base.model_copy(update={"message": message}) if first else base), None
    k, last = settings.reruns, base.previous_image
    ranked, _ = decide.with_plan(plan, new, k)
    week_gpu = sum(float(r.get("gpu_seconds") or 0.0) for r in rows)
    spent = sum(r.planned_gpu_seconds for r in base.rounds)
    decision = decide.fit_budget(
        ranked,
        decide.measured_costs(plan, rows, ranked, 2 * k if last else k),
        week_gpu_seconds=week_gpu,
        seconds_left=seconds_left(head, now),
        share=max(0.0, settings.gpu_share - (spent / week_gpu if week_gpu else 0.0)),
    )
    (confirmed, kept), left = _fit(
        decision.budget_gpu_seconds - decision.planned_gpu_seconds, [confirm, audit], rows
    )
    number = len(base.rounds) + 1
    rnd = TriageRound(
        round=number,
        chosen=decision.chosen,
        not_triaged=decision.not_triaged,
        audit=tuple(kept),
        confirm=tuple(confirmed),
        passed_cases=passed,
        budget_gpu_seconds=decision.budget_gpu_seconds,
        planned_gpu_seconds=decision.budget_gpu_seconds - left,
        runs=round_runs(week, number, decision.chosen, kept, k, last, confirmed),
    )
    message = decide.nothing_to_triage(comparison) if first else base.message
    return base.model_copy(update={"rounds": (*base.rounds, rnd), "message": message}), rnd


def week_entries(
    layout: RunLayout, rows: Sequence[Mapping[str, Any]], wanted: set[str]
) -> dict[str, dict[str, Any]]:
    """The week's case entries of ``wanted``, from their shards' cases files."""
    shards = sorted(
        {int(r["shard"]) for r in rows if r["case_id"] in wanted and str(r.get("shard", "")).isdigit()}
    )
    found: dict[str, dict[str, Any]] = {}
    for k in shards:
        doc = read_json(layout.shard_cases(k))
        for family, entries in doc["by_family"].items():
            for e in entries:
                if e["case_id"] in wanted:
                    found[e["case_id"]] = {**e, "family": e.get("family") or family}
    return found


def write_round(
    week: RunDescriptor,
    plan: WeeklyPlan,
    rnd: TriageRound,
    rows: Sequence[Mapping[str, Any]],
    head: Mapping[str, Any],
) -> None:
    """Each run's files: the week's manifest head under its own key, and its one shard's cases."""
    layout = week.layout
    wanted = {c for run in rnd.runs for c in (*run.cases, *run.audit, *run.confirm)}
    entries = week_entries(layout, rows, wanted)
    families = {f.name: f for f in plan.families}
    for run in rnd.runs:
        mine = run_descriptor(week, run).layout
        if not exists(mine.head_uri):
            write_json(mine.head_uri, head)
        cases = {"shard": TRIAGE_SHARD, "by_family": rerun_entries(run, entries, rnd.chosen, families)}
        if not exists(mine.shard_cases(TRIAGE_SHARD)):
            write_json(mine.shard_cases(TRIAGE_SHARD), cases)


def record_failure(week: RunDescriptor, message: str) -> None:
    """Say in the book why triage did not start (the ``triage`` task writes it into the document)."""
    try:
        book = read_book(week.layout) or TriageBook(week_run_key=week.run_key)
        write_json(
            plan_uri(week.layout), book.model_copy(update={"message": message}).model_dump(mode="json")
        )
    except Exception as exc:  # the store itself: the triage task says "triage did not start"
        log.error("could not record why triage did not start (%s)", exc)


def _without_a_verdict(layout: RunLayout) -> frozenset[str]:
    """The cases the last triage document left as environment or not triaged (none before it)."""
    from avsim.triage.model import TriageReport, TriageVerdict
    from avsim.triage.store import triage_uri

    if not exists(triage_uri(layout)):
        return frozenset()
    again = {TriageVerdict.ENVIRONMENT, TriageVerdict.NOT_TRIAGED}
    doc = TriageReport.model_validate(read_json(triage_uri(layout)))
    return frozenset(c.case_id for c in doc.cases if c.verdict in again)


def start_round(
    week: RunDescriptor, plan: WeeklyPlan, settings: TriageSettings, *, now: dt.datetime | None = None
) -> tuple[TriageBook, tuple[TriageRun, ...]]:
    """Decide and write a round; returns the book and the runs of the week still to start (a retry
    gets the same runs again: starting one that exists does nothing)."""
    from avsim.ledger.breaker import Breaker, image_digest
    from avsim.report.build import read_text, week_case_rows
    from avsim.report.compare import previous_week

    layout = week.layout
    head = read_json(layout.head_uri)
    rows = week_case_rows(layout, head)
    comparison = previous_week(layout.root, week.iso_week, rows, read_text)
    stopped = Breaker(week.artifact_root, image_digest(week.image)).state().is_open
    retry = _without_a_verdict(layout)
    book, rnd = plan_round(
        week,
        plan,
        settings,
        rows,
        comparison,
        head,
        read_book(layout),
        now=now or dt.datetime.now(dt.UTC),
        canary_stopped=stopped,
        retry=retry,
    )
    if rnd is not None:
        write_round(week, plan, rnd, rows, head)
        log.info(
            "triage round %d: %d cases rerun, %d not triaged, %d audited, in %d shard runs",
            rnd.round,
            len(rnd.chosen),
            len(rnd.not_triaged),
            len(rnd.audit),
            len(rnd.runs),
        )
    write_json(plan_uri(layout), book.model_dump(mode="json"))
    if book.message:
        log.info("%s", book.message)
    return book, book.runs
