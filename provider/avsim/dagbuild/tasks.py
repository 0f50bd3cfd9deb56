"""The Python callables behind the shard runs' non-phase tasks and triage's start (``prepare``'s are
in :mod:`avsim.dagbuild.prepare`).

Each is a plain function of explicit arguments, so tests call it without Airflow's
scheduler; :mod:`avsim.dagbuild.weekly` wraps them as TaskFlow tasks.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from avsim.contracts import RunDescriptor, ShardConf
from avsim.errors import AvsimError, ManifestError, Problem
from avsim.manifest.source import check_location
from avsim.plan.model import WeeklyPlan
from avsim.plan.shards import ShardPlan
from avsim.settings import AvsimSettings
from avsim.storage import exists, read_json
from avsim.verdict import CASE_OUTCOMES, shard_verdict

log = logging.getLogger(__name__)

__all__ = ["load_shard", "shard_conf", "start_triage", "summarize"]


def load_shard(conf: dict[str, Any], plan: WeeklyPlan) -> dict[str, Any]:
    """A shard run's first task: check its conf and hand each family group its cases."""
    checked = shard_conf(conf)
    shard = ShardPlan.from_json(read_json(checked.run.layout.shard_cases(checked.shard)))
    unknown = set(shard.by_family) - set(plan.family_names)
    if unknown:
        raise AvsimError(
            f"shard {shard.index} has cases of families {sorted(unknown)} that this DAG version does not "
            f"deploy ({', '.join(plan.family_names)}); the graph catalog changed since the week started"
        )
    out: dict[str, Any] = {"run": checked.run.to_json(), "shard": shard.index}
    for fam in plan.families:
        out[f"cases_{fam.name}"] = shard.by_family.get(fam.name, [])
    return out


def shard_conf(conf: Any) -> ShardConf:
    """A shard run's conf, checked: its run descriptor and its shard index.

    Raises :class:`ManifestError` naming each bad field (``conf.run.run_key``, ``conf.shard``...): a
    shard run started by hand with a conf the weekly run did not write, or for a shard it never cut.
    """
    from pydantic import ValidationError

    where = "shard DAG run conf"
    started_by = "shard runs are started by the weekly run (avsim_weekly), which writes their cases first"
    if not isinstance(conf, dict):
        raise ManifestError([Problem("conf", f"must be a mapping; {started_by}")], source=where)
    problems = []  # the two fields every hand-written conf gets wrong, in words; the model checks the rest
    run = conf.get("run")
    keys = ("run_key", "artifact_root")
    if not isinstance(run, dict) or not all(isinstance(run.get(k), str) and run[k].strip() for k in keys):
        problems.append(
            Problem("conf.run", f"missing or incomplete (needs run_key and artifact_root); {started_by}")
        )
    shard = conf.get("shard")
    if not isinstance(shard, int) or isinstance(shard, bool) or shard < 0:
        shown = f"{type(shard).__name__} {shard!r}"[:80]
        problems.append(Problem("conf.shard", f"must be an integer shard index (>= 0), got {shown}"))
    if problems:
        raise ManifestError(problems, source=where)
    try:
        checked = ShardConf.model_validate(conf)
    except ValidationError as exc:
        problems = [
            Problem(
                ".".join(["conf", *(str(p) for p in err["loc"])]),
                f"{err['msg'].lower()} (got {str(err.get('input'))[:60]!r}); {started_by}",
            )
            for err in exc.errors()
        ]
        raise ManifestError(problems, source=where) from None
    run, index = checked.run, checked.shard
    check_location(run.artifact_root, "conf.run.artifact_root")
    if not exists(run.layout.shard_cases(index)):
        raise ManifestError(
            [
                Problem(
                    "conf.shard",
                    f"run {run.run_key!r} has no shard {index} under {run.layout.root}; {started_by}",
                )
            ],
            source=where,
        )
    return checked


def _sweep_leftover_pods(run: RunDescriptor, case_ids: list[str], began: dt.datetime) -> None:
    """On the Kubernetes backend, delete the pods of the shard's cases that no phase task owns any more
    (:mod:`avsim.kube.pod_sweep`: a phase marked failed or success while deferred, before a
    triggerer took its trigger). A failure to sweep is logged: the summary is still written."""
    from avsim.settings import load_settings

    settings = load_settings()
    if settings.backend != "kubernetes":
        return
    from avsim.kube.pod_sweep import sweep_leftover_pods

    try:
        swept = sweep_leftover_pods(settings.kubernetes, run.run_key, case_ids, began)
    except Exception as exc:  # the cluster's API: the summary matters more than the sweep
        log.error("could not sweep the shard's leftover pods (%s): check the namespace by hand", exc)
        return
    if swept:
        log.warning("deleted %d leftover phase pod(s) of this shard: %s", len(swept), ", ".join(swept))


def _summary_cases(shard: ShardPlan, plan: WeeklyPlan) -> list[dict[str, Any]]:
    """The shard's cases as the summary reads them: id, graph, phases and their dependencies."""
    cases = []
    for fam, entries in shard.by_family.items():
        family = plan.family(fam)
        depends_on = {p.name: list(p.upstream) for p in family.phases}
        phases = list(family.phase_names)
        cases += [
            {"case_id": c["case_id"], "graph": fam, "phases": phases, "depends_on": depends_on}
            for c in entries
        ]
    return cases


def summarize(conf: dict[str, Any], plan: WeeklyPlan) -> dict[str, Any]:
    """A shard run's last task (runs whatever happened): write the shard's summary to the ledger.

    A run whose conf ``load_shard`` refused has nothing to summarize: it fails at once, without retries.
    """
    from avsim.ledger.store import Ledger
    from avsim.ledger.summaries import summarize_shard

    began = dt.datetime.now(dt.UTC)
    try:
        checked = shard_conf(conf)
    except ManifestError as exc:
        from avsim.operators.exceptions import RunRejected

        raise RunRejected(str(exc)) from None
    layout = checked.run.layout
    shard = ShardPlan.from_json(read_json(layout.shard_cases(checked.shard)))
    cases = _summary_cases(shard, plan)
    _sweep_leftover_pods(checked.run, [c["case_id"] for c in cases], began)
    ledger = Ledger(layout)
    summary = summarize_shard(ledger, shard.index, cases)
    counts = dict.fromkeys(CASE_OUTCOMES, 0)
    for case in summary.cases:
        counts[case.outcome_name] = counts.get(case.outcome_name, 0) + 1
    verdict = shard_verdict(summary)
    summary = summary.model_copy(
        update={
            "counts": {"cases": len(summary.cases), **counts},
            "verdict": verdict.line(),
            # The canary gate takes a summary written before its round began as the last round's.
            "written_at": dt.datetime.now(dt.UTC).isoformat(),
        }
    )
    ledger.write_shard_summary(summary)
    log.info("shard %d: %s", shard.index, summary.counts)
    if exists(f"{layout.report_dir}/report.json"):
        # The week already has its report, so this is a rerun (an engineer cleared failed phases of
        # this shard): bring the weekly report up to date with it.
        log.info("the week's report exists: refreshing it with shard %d's rerun", shard.index)
        from avsim.dagbuild.week_end import write_week_report

        head = read_json(layout.head_uri)
        write_week_report(checked.run.to_json(), list(head.get("run_phases", {})))
    if verdict.needs_attention:
        # The summary (and the report) are written: the shard run ends failed so the failure shows on
        # the weekly run, and "Clear → Only failed" there reruns these cases (avsim.verdict).
        from avsim.operators.exceptions import ShardNeedsAttention

        raise ShardNeedsAttention(verdict.line())
    log.info("%s", verdict.line())
    return dict(summary.counts)


def start_triage(
    run: dict[str, Any], plan: WeeklyPlan, settings: AvsimSettings, shard_dag_id: str
) -> list[str]:
    """``triage_start``: decide the round (:func:`avsim.triage.start.start_round`) and start its shard
    runs (one already there is left as it is); returns the ids of the triage runs that exist.

    Triage is advice: an error here is logged and recorded in the triage document, and neither fails
    the week nor holds its report through retries."""
    from avsim.airflow_internals import start_dag_run_from_task
    from avsim.triage.runs import shard_conf
    from avsim.triage.start import record_failure, start_round

    week = RunDescriptor.model_validate(run)
    try:
        _, runs = start_round(week, plan, settings.triage)
    except Exception as exc:
        log.exception("triage could not start")
        record_failure(week, f"triage did not start: {exc}"[:500])
        return []
    started: list[str] = []
    for r in runs:
        try:
            created = start_dag_run_from_task(
                shard_dag_id, r.run_id, conf=shard_conf(week, r), note=f"triage of {week.run_key}: {r.label}"
            )
        except Exception as exc:
            log.error("triage run %s could not be started (%s): its cases are not triaged", r.run_id, exc)
            continue
        started.append(r.run_id)
        log.info(
            "triage run %s %s (%s build)", r.run_id, "started" if created else "already there", r.build.value
        )
    return started
