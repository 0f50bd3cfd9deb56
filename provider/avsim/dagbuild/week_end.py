"""The end of a week: accounting for every shard, the weekly report and the week's verdict.

The Python callables behind the parent run's ``close_week`` and ``report`` tasks (and the report's
refresh by a rerun shard's ``summarize``); plain functions of the run descriptor, so tests call them
without Airflow's scheduler. The verdict's rule is :mod:`avsim.verdict`.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from avsim.contracts import RunDescriptor
from avsim.phases.contract import NOT_RUN
from avsim.plan.shards import ShardPlan
from avsim.storage import exists, read_json
from avsim.verdict import WeekVerdict, week_verdict

log = logging.getLogger(__name__)


def write_week_report(run: dict[str, Any], run_phases: list[str]) -> dict[str, str]:
    """The weekly report from the shard summaries and the run-level phases' outcomes; its URIs."""
    return _write_report(run, run_phases)[0]


def _write_report(run: dict[str, Any], run_phases: list[str]) -> tuple[dict[str, str], WeekVerdict]:
    """The weekly report from the shard summaries and the run-level phases' outcomes."""
    from avsim.ledger.store import Ledger
    from avsim.report.build import build_report, write_report
    from avsim.triage.html import triage_section

    d = RunDescriptor.model_validate(run)
    layout = d.layout
    ledger = Ledger(layout)
    head = read_json(layout.head_uri)
    summaries = ledger.shard_summaries()
    run_phase_outcomes = {}
    for name in run_phases:
        rec = ledger.outcome("_run", name)
        run_phase_outcomes[name] = rec.outcome.value if rec else NOT_RUN
    report = build_report(
        head,
        summaries,
        run_phase_outcomes,
        run_id=d.run_id or d.run_key,
        generated_at=dt.datetime.now(dt.UTC),
        manifest_sha256=d.manifest_sha256 or None,
    )
    verdict = week_verdict(
        summaries,
        not_started=int(report["totals"].get("missing") or 0),
        stopped_because=_why_not_started(run),
    )
    report["verdict"] = verdict.to_json()
    report["repairs"] = ledger.repairs()
    report["triage"] = _triage(layout)
    uris = write_report(layout, report, triage_section(report["triage"]))
    log.info("weekly report: %s", uris)
    return uris, verdict


def _triage(layout: Any) -> dict[str, Any] | None:
    """The week's triage document as data (None before the ``triage`` task wrote it)."""
    from avsim.triage.store import triage_uri

    if not exists(triage_uri(layout)):
        return None
    return dict(read_json(triage_uri(layout)))


def _why_not_started(run: dict[str, Any]) -> str:
    """Why a week left cases unstarted: its build's breaker (which a failed canary gate opens), or not known."""
    from avsim.ledger.breaker import Breaker, image_digest

    d = RunDescriptor.model_validate(run)
    state = Breaker(d.artifact_root, image_digest(d.image)).state()
    if state.is_open:
        return f"the circuit breaker of build {d.build_id} is open: {state.reason}"
    return "their shard runs were not started (the canary gate failed or the run was stopped)"


def close_week(run: dict[str, Any]) -> dict[str, Any]:
    """After the week's shard runs ended: give every shard run that never started a summary saying so.

    A week stopped by the canary gate or an open breaker leaves shards without a summary; the
    run-level phases take every shard's summary as input and the report counts every case, so both
    then tell what ran, what never started, and why. Returns the counts.
    """
    from avsim.ledger.store import Ledger
    from avsim.ledger.summaries import unstarted_shard_summary
    from avsim.plan.shards import CANARY_SHARD

    d = RunDescriptor.model_validate(run)
    layout = d.layout
    ledger = Ledger(layout)
    indices = ([CANARY_SHARD] if d.canary_count else []) + list(range(1, d.shard_count + 1))
    why = ""
    closed = []
    for index in indices:
        if exists(layout.shard_summary(index)):
            continue
        why = why or _why_not_started(run)
        shard = ShardPlan.from_json(read_json(layout.shard_cases(index)))
        cases = [{**c, "graph": fam} for fam, entries in shard.by_family.items() for c in entries]
        ledger.write_shard_summary(unstarted_shard_summary(index, cases, why))
        closed.append(index)
    if closed:
        log.warning("%d shard runs never started (%s): %s", len(closed), why, closed)
    return {"shards": len(indices), "never_started": len(closed), "why": why}


def finish_week(run: dict[str, Any], run_phases: list[str]) -> dict[str, str]:
    """The weekly run's last task: write the report, then fail the run when the week needs attention.

    The report is written either way; the failure names the counts and the shards, or the build that
    stopped the week, so the weekly run's state tells the truth (:mod:`avsim.verdict`).
    """
    uris, verdict = _write_report(run, run_phases)
    d = RunDescriptor.model_validate(run)
    if verdict.needs_attention:
        from avsim.operators.exceptions import WeekNeedsAttention

        raise WeekNeedsAttention(f"week {d.iso_week} (build {d.build_id}): {verdict.line()}")
    log.info("week %s: %s", d.iso_week, verdict.line())
    return uris
